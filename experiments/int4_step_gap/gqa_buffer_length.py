"""GroupQueryAttention's cost against the KV buffer's length: 28 layers (12 heads, 2 kv heads, head_dim 128),
one new token after 100, past and present bound to one buffer in place, as the runtime binds them.
    python experiments/int4_step_gap/gqa_buffer_length.py"""
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

H, HKV, D, LAYERS, PAST = 12, 2, 128, 28, 100


def build(slots: int):
    """-> (session, binding, the arrays the binding points at: they must outlive it)."""
    info = helper.make_tensor_value_info
    inputs = [info("qkv", TensorProto.FLOAT, [1, 1, (H + 2 * HKV) * D]), info("seqlens", TensorProto.INT32, [1]),
              info("total", TensorProto.INT32, [])]
    nodes, outputs = [], []
    for i in range(LAYERS):
        inputs += [info(f"pk{i}", TensorProto.FLOAT, [1, HKV, slots, D]), info(f"pv{i}", TensorProto.FLOAT, [1, HKV, slots, D])]
        nodes += [helper.make_node("Split", ["qkv", "sizes"], [f"q{i}", f"k{i}", f"v{i}"], axis=-1),
                  helper.make_node("GroupQueryAttention", [f"q{i}", f"k{i}", f"v{i}", f"pk{i}", f"pv{i}", "seqlens", "total"],
                                   [f"o{i}", f"prk{i}", f"prv{i}"], domain="com.microsoft", num_heads=H, kv_num_heads=HKV)]
        outputs += [info(n, TensorProto.FLOAT, [1, HKV, slots, D]) for n in (f"prk{i}", f"prv{i}")]
    nodes.append(helper.make_node("Sum", [f"o{i}" for i in range(LAYERS)], ["out"]))
    outputs.append(info("out", TensorProto.FLOAT, None))
    sizes = numpy_helper.from_array(np.array([H * D, HKV * D, HKV * D], np.int64), "sizes")
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, [sizes]),
                              opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = 2, 3
    s = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    arrays = {"qkv": np.random.default_rng(0).standard_normal((1, 1, (H + 2 * HKV) * D)).astype(np.float32),
              "seqlens": np.array([PAST], np.int32), "total": np.array(PAST + 1, np.int32),
              "out": np.zeros((1, 1, H * D), np.float32),
              "kv": [np.zeros((1, HKV, slots, D), np.float32) for _ in range(2 * LAYERS)]}
    binding = s.io_binding()
    for name in ("qkv", "seqlens", "total"):
        a = arrays[name]
        binding.bind_input(name, "cpu", 0, a.dtype, list(a.shape), a.ctypes.data)
    for i in range(LAYERS):
        for j, (past, present) in enumerate(((f"pk{i}", f"prk{i}"), (f"pv{i}", f"prv{i}"))):
            buf = arrays["kv"][2 * i + j]
            binding.bind_input(past, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
            binding.bind_output(present, "cpu", 0, np.float32, list(buf.shape), buf.ctypes.data)
    binding.bind_output("out", "cpu", 0, np.float32, [1, 1, H * D], arrays["out"].ctypes.data)
    return s, binding, arrays


variants = {slots: build(slots) for slots in (258, 4098)}
times = {slots: [] for slots in variants}
for _ in range(8):
    for slots, (s, binding, _) in variants.items():
        s.run_with_iobinding(binding)
        start = time.perf_counter()
        for _ in range(20):
            s.run_with_iobinding(binding)
        times[slots].append(1e3 * (time.perf_counter() - start) / 20)
for slots, values in times.items():
    print(f"{slots} slots: median {np.median(values):.2f} ms per call ({LAYERS} layers)  {[round(v, 2) for v in values]}")
