"""MatMulNBits variants on this CPU: is one row bitwise equal to the same row in a multi-row call, and what
does a call cost per row count? Decides whether a quantized target's single steps need two rows.

    python scripts/matmul_nbits_rows.py [--variants 4:32:4,4:16:4,4:32:0,4:32:1,4:128:4,8:32:4] [--symmetric]
                                        [--float-zero-points]

A variant is bits:block_size:accuracy_level. Exactness on a 1536x8960 layer (6 rows, each also run
alone); cost on a chain of 20 distinct such layers (~170 MB at int4, beyond L3), median of 9, in ms per
layer for 1, 2, 5 and 8 rows. Needs the machine to itself for the costs. --symmetric also runs each variant
without zero points, --float-zero-points with zero points in the scales' type (what carrying a GGUF's Q4_K
minimums would need; the same values, so the same results).
"""
import argparse
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

from specedge.export.quantize import Quantization, quantize

K, N, LAYERS, ROWS = 1536, 8960, 20, (1, 2, 5, 8)
rng = np.random.default_rng(0)
W = (rng.standard_normal((N, K)) * 0.02).astype(np.float32)


def session(bits: int, block: int, level: int, zero_points_as: str, layers: int) -> ort.InferenceSession:
    """zero_points_as: "uint8" (packed, as exported), "float" (the scales' type) or "none" (symmetric)."""
    codes, scales, zero_points = quantize(W, Quantization(bits=bits, block_size=block, accuracy_level=level))
    if zero_points_as == "float":
        blocks = codes.shape[1]
        packed = zero_points.reshape(N, -1)
        unpacked = np.stack([packed & 0x0F, packed >> 4], axis=-1).reshape(N, -1) if bits == 4 else packed
        zero_points = unpacked[:, :blocks].astype(np.float32).reshape(-1)
    parts = (("w", codes), ("s", scales)) + ((("z", zero_points),) if zero_points_as != "none" else ())
    nodes, inits, x = [], [], "x"
    for i in range(layers):                      # rolled rows: distinct tensors, the same cost
        inits += [numpy_helper.from_array(np.roll(a, i, axis=0), f"{name}{i}") for name, a in parts]
        nodes.append(helper.make_node("MatMulNBits", [x] + [f"{name}{i}" for name, _ in parts], [f"y{i}"],
                                      domain="com.microsoft", K=K, N=N, bits=bits, block_size=block,
                                      accuracy_level=level))
        nodes.append(helper.make_node("Slice", [f"y{i}", "start", "end", "axis"], [f"x{i}"]))
        x = f"x{i}"
    inits += [numpy_helper.from_array(np.array([v]), name) for name, v in (("start", 0), ("end", K), ("axis", 2))]
    graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "M", K])],
                              [helper.make_tensor_value_info(f"y{layers - 1}", TensorProto.FLOAT, [1, "M", N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


def one_row_exact(s: ort.InferenceSession) -> tuple[bool, float]:
    x = rng.standard_normal((1, 6, K)).astype(np.float32)
    together = s.run(None, {"x": x})[0]
    alone = np.concatenate([s.run(None, {"x": x[:, i:i + 1]})[0] for i in range(6)], axis=1)
    return bool(np.array_equal(alone, together)), float(np.abs(alone - together).max())


def costs(s: ort.InferenceSession) -> list[float]:
    out = []
    for rows in ROWS:
        x = (rng.standard_normal((1, rows, K)) * 0.1).astype(np.float32)
        for _ in range(2):
            s.run(None, {"x": x})
        times = []
        for _ in range(9):
            start = time.perf_counter()
            s.run(None, {"x": x})
            times.append(time.perf_counter() - start)
        out.append(1e3 * float(np.median(times)) / LAYERS)
    return out


parser = argparse.ArgumentParser()
parser.add_argument("--variants", default="4:32:4,4:16:4,4:32:0,4:32:1,4:128:4,8:32:4")
parser.add_argument("--symmetric", action="store_true", help="also without zero points")
parser.add_argument("--float-zero-points", action="store_true", help="also with float zero points")
args = parser.parse_args()
kinds = ["uint8"] + ["none"] * args.symmetric + ["float"] * args.float_zero_points
for variant in args.variants.split(","):
    bits, block, level = (int(v) for v in variant.split(":"))
    for kind in kinds:
        exact, diff = one_row_exact(session(bits, block, level, kind, 1))
        per_rows = costs(session(bits, block, level, kind, LAYERS))
        label = {"uint8": "", "none": " symmetric", "float": " float zero points"}[kind]
        print(f"int{bits} block {block:3} level {level}{label}: one row "
              f"{'bitwise equal' if exact else f'differs (max {diff:.1e})'}; ms per layer "
              + " ".join(f"{r} rows {c:.3f}" for r, c in zip(ROWS, per_rows)), flush=True)
