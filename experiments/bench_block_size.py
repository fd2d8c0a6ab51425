"""MatMulNBits (int4, accuracy level 4) cost per row count and block size, with and without zero points
(asymmetric, as specedge quantizes, or symmetric, as onnxruntime-genai's builder does), with the weights
far beyond L3: a chain of 40 distinct 1536x8960 layers (~350 MB), as a real model streams them.

    python experiments/bench_block_size.py [--blocks 32,64,128] [--symmetric]     # needs the machine to itself
"""
import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specedge.export.quantize import Quantization, quantize

K, N, LAYERS = 1536, 8960, 40
rng = np.random.default_rng(0)
W = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)


def chain(block_size: int, symmetric: bool) -> ort.InferenceSession:
    """LAYERS MatMulNBits nodes, each output cut back to K columns to feed the next. Symmetric: no zero-point
    input (the op's default of 8; only the cost matters here, not the values)."""
    codes, scales, zero_points = quantize(W, Quantization(bits=4, block_size=block_size, accuracy_level=4))
    parts = (("w", codes), ("s", scales)) + ((("z", zero_points),) if not symmetric else ())
    nodes, inits, x = [], [], "x"
    for i in range(LAYERS):                      # rolled rows: distinct tensors, the same cost
        inits += [numpy_helper.from_array(np.roll(a, i, axis=0), f"{name}{i}") for name, a in parts]
        nodes.append(helper.make_node("MatMulNBits", [x] + [f"{name}{i}" for name, _ in parts], [f"y{i}"], domain="com.microsoft",
                                      K=K, N=N, bits=4, block_size=block_size, accuracy_level=4))
        nodes.append(helper.make_node("Slice", [f"y{i}", "start", "end", "axis"], [f"x{i}"]))
        x = f"x{i}"
    inits += [numpy_helper.from_array(np.array([v]), name) for name, v in (("start", 0), ("end", K), ("axis", 2))]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "M", K])],
                              [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, "M", K])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


parser = argparse.ArgumentParser()
parser.add_argument("--blocks", default="32,64,128")
parser.add_argument("--symmetric", action="store_true", help="also measure without zero points")
args = parser.parse_args()
variants = [(int(b), sym) for b in args.blocks.split(",") for sym in ((False, True) if args.symmetric else (False,))]
for block_size, symmetric in variants:
    session = chain(block_size, symmetric)
    costs = []
    for rows in (1, 2, 5):
        x = (rng.standard_normal((1, rows, K)) * 0.1).astype(np.float32)
        for _ in range(3):
            session.run(None, {"x": x})
        times = []
        for _ in range(15):
            start = time.perf_counter()
            session.run(None, {"x": x})
            times.append(time.perf_counter() - start)
        costs.append(f"{rows} rows {1e3 * np.median(times) / LAYERS:.3f} ms/layer")
    print(f"block {block_size}{', no zero points' if symmetric else ''}: " + " | ".join(costs))
    del session
