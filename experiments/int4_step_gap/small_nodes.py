"""What small nodes cost: 200 of a kind in a bare chain, and 9 per layer between 28 int4 MatMulNBits
layers (1536 -> 8960, sliced back).   python experiments/int4_step_gap/small_nodes.py"""
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specedge.export.quantize import Quantization, quantize

K, N, LAYERS = 1536, 8960, 28
rng = np.random.default_rng(0)


def small(kind: int, h: str, tag: str) -> tuple[list, str]:
    """One small node (two for the split and pad kinds) on h [1, 1, K] -> (nodes, output)."""
    out = f"e{tag}"
    if kind == 0:
        return [helper.make_node("Add", [h, "one"], [out])], out
    if kind == 1:
        return [helper.make_node("Mul", [h, "one"], [out])], out
    if kind == 2:
        return [helper.make_node("Split", [h], [f"a{tag}", f"b{tag}"], axis=-1, num_outputs=2),
                helper.make_node("Concat", [f"a{tag}", f"b{tag}"], [out], axis=-1)], out
    return [helper.make_node("Concat", [h, h], [f"c{tag}"], axis=1),
            helper.make_node("Slice", [f"c{tag}", "zero", "one_i", "one_i"], [out])], out


def session(nodes: list, x: str, inits: list) -> ort.InferenceSession:
    inits = inits + [numpy_helper.from_array(np.ones((1, 1, K), np.float32), "one")]
    inits += [numpy_helper.from_array(np.array([v]), name) for name, v in (("zero", 0), ("k", K), ("two", 2), ("one_i", 1))]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, K])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 9
    options = ort.SessionOptions()
    options.intra_op_num_threads, options.log_severity_level = 2, 3
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL     # keep every node
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def timed(s: ort.InferenceSession, calls: int) -> float:
    x = (rng.standard_normal((1, 1, K)) * 0.1).astype(np.float32)
    s.run(None, {"x": x})
    start = time.perf_counter()
    for _ in range(calls):
        s.run(None, {"x": x})
    return (time.perf_counter() - start) / calls


for kind, name in enumerate(("Add", "Mul", "Split+Concat", "Concat+Slice")):
    nodes, h = [], "x"
    for i in range(200):
        more, h = small(kind, h, f"{i}")
        nodes += more
    print(f"bare chain, {name}: {1e6 * np.median([timed(session(nodes, h, []), 30)]) / len(nodes):.1f} us per node")

codes, scales, zero_points = quantize((rng.standard_normal((N, K)) * 0.02).astype(np.float32),
                                      Quantization(bits=4, block_size=32, accuracy_level=4))
weights = [numpy_helper.from_array(a, n) for n, a in (("w", codes), ("s", scales), ("z", zero_points))]


def layers(extra: int) -> tuple[ort.InferenceSession, int]:
    nodes, x = [], "x"
    for i in range(LAYERS):
        nodes += [helper.make_node("MatMulNBits", [x, "w", "s", "z"], [f"y{i}"], domain="com.microsoft", K=K, N=N,
                                   bits=4, block_size=32, accuracy_level=4),
                  helper.make_node("Slice", [f"y{i}", "zero", "k", "two"], [f"h{i}"])]
        x = f"h{i}"
        for j in range(extra):
            more, x = small(j % 4, x, f"{i}_{j}")
            nodes += more
    return session(nodes, x, weights), len(nodes)


variants = {extra: layers(extra) for extra in (0, 9)}
times = {extra: [] for extra in variants}
for _ in range(10):
    for extra, (s, _) in variants.items():
        times[extra].append(1e3 * timed(s, 10))
for extra, (_, count) in variants.items():
    print(f"{extra} small nodes per layer ({count} nodes): median {np.median(times[extra]):.2f} ms per run")
extra_nodes = variants[9][1] - variants[0][1]
cost = np.median(times[9]) - np.median(times[0])
print(f"between MatMulNBits layers, {extra_nodes} extra nodes cost {cost:.2f} ms = {1e3 * cost / extra_nodes:.1f} us each")
