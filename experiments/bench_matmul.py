"""MatMulNBits vs fp32 MatMul cost per row count for one 1536x8960 layer: python experiments/bench_matmul.py"""
import time, sys, numpy as np, onnxruntime as ort
from onnx import helper as h, TensorProto as TP, numpy_helper as nh

from specedge.export.quantize import Quantization, quantize
K, N = 1536, 8960
rng = np.random.default_rng(0)
W = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)
def sess_nbits(bits, acc):
    q = Quantization(bits=bits, block_size=32, accuracy_level=acc)
    codes, scales, zp = quantize(W, q)
    node = h.make_node("MatMulNBits", ["x", "w", "s", "z"], ["y"], domain="com.microsoft", K=K, N=N, bits=bits, block_size=32, accuracy_level=acc)
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, "M", K])], [h.make_tensor_value_info("y", TP.FLOAT, [1, "M", N])],
                     [nh.from_array(codes, "w"), nh.from_array(scales, "s"), nh.from_array(zp, "z")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17), h.make_opsetid("com.microsoft", 1)]); m.ir_version = 8
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
def sess_fp32():
    node = h.make_node("MatMul", ["x", "w"], ["y"])
    g = h.make_graph([node], "g", [h.make_tensor_value_info("x", TP.FLOAT, [1, "M", K])], [h.make_tensor_value_info("y", TP.FLOAT, [1, "M", N])], [nh.from_array(W.T.copy(), "w")])
    m = h.make_model(g, opset_imports=[h.make_opsetid("", 17)]); m.ir_version = 8
    return ort.InferenceSession(m.SerializeToString(), providers=["CPUExecutionProvider"])
for name, s in [("fp32", sess_fp32()), ("int4 acc4", sess_nbits(4, 4)), ("int4 acc0", sess_nbits(4, 0)), ("int8 acc4", sess_nbits(8, 4))]:
    out = []
    for M in (1, 2, 3, 5, 9):
        x = rng.standard_normal((1, M, K)).astype(np.float32)
        for _ in range(3): s.run(None, {"x": x})
        ts = []
        for _ in range(15):
            t = time.perf_counter(); s.run(None, {"x": x}); ts.append(time.perf_counter() - t)
        out.append(f"M={M}: {1e3*np.median(ts):.2f} ms")
    print(name, " | ".join(out))
