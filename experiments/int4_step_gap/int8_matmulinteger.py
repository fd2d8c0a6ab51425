"""int8 weights through MatMulInteger with per-row activation scales (x -> uint8 around 128 per row,
an int32 product, then row scale x column scale): is one row bitwise equal to the same row in a multi-row
call, and the ms per 1536x8960 layer for 1 / 2 / 5 / 8 rows, over a chain of 20 distinct layers.
B_RANGE 127 is full int8; 63 and 7 avoid the int16 saturation of AVX2's u8 x s8 instruction.
    python experiments/int4_step_gap/int8_matmulinteger.py"""
import time

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

K, N, LAYERS, ROWS = 1536, 8960, 20, (1, 2, 5, 8)
rng = np.random.default_rng(0)


def chain(layers: int, b_range: int) -> ort.InferenceSession:
    constants = {"azp": np.array(128, np.uint8), "start": np.array([0]), "end": np.array([K]), "axis": np.array([2]),
                 "inv127": np.array(1 / 127, np.float32), "f128": np.array(128, np.float32)}
    inits = [numpy_helper.from_array(a, n) for n, a in constants.items()]
    nodes, x = [], "x"
    for i in range(layers):
        inits += [numpy_helper.from_array(rng.integers(-b_range, b_range + 1, size=(K, N), dtype=np.int8), f"b{i}"),
                  numpy_helper.from_array(rng.random(N).astype(np.float32) * 1e-3, f"col{i}")]
        op = lambda kind, ins, out, **kw: helper.make_node(kind, ins, [f"{out}{i}"], **kw)    # noqa: E731
        nodes += [op("Abs", [x], "abs"), op("ReduceMax", [f"abs{i}"], "max", axes=[-1], keepdims=1),
                  op("Mul", [f"max{i}", "inv127"], "row"), op("Div", [x, f"row{i}"], "q"),
                  op("Add", [f"q{i}", "f128"], "qa"), op("Round", [f"qa{i}"], "qr"),
                  op("Cast", [f"qr{i}"], "qu", to=TensorProto.UINT8),
                  op("MatMulInteger", [f"qu{i}", f"b{i}", "azp"], "acc"),
                  op("Cast", [f"acc{i}"], "accf", to=TensorProto.FLOAT), op("Mul", [f"accf{i}", f"row{i}"], "m"),
                  op("Mul", [f"m{i}", f"col{i}"], "y"), op("Slice", [f"y{i}", "start", "end", "axis"], "x")]
        x = f"x{i}"
    graph = helper.make_graph(nodes, "c", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "M", K])],
                              [helper.make_tensor_value_info(f"y{layers - 1}", TensorProto.FLOAT, [1, "M", N])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    options = ort.SessionOptions()
    options.inter_op_num_threads = 1
    return ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])


for b_range in (127, 63, 7):
    one_layer = chain(1, b_range)
    x = rng.standard_normal((1, 8, K)).astype(np.float32)
    together = one_layer.run(None, {"x": x})[0]
    alone = np.concatenate([one_layer.run(None, {"x": x[:, i:i + 1]})[0] for i in range(8)], axis=1)
    s, costs = chain(LAYERS, b_range), []
    for rows in ROWS:
        xr = rng.standard_normal((1, rows, K)).astype(np.float32)
        s.run(None, {"x": xr})
        times = []
        for _ in range(9):
            start = time.perf_counter()
            s.run(None, {"x": xr})
            times.append(time.perf_counter() - start)
        costs.append(1e3 * float(np.median(times)) / LAYERS)
    print(f"weights in [-{b_range}, {b_range}]: one row {'bitwise equal' if np.array_equal(alone, together) else 'differs'}; "
          "ms per layer " + " ".join(f"{r} rows {c:.3f}" for r, c in zip(ROWS, costs))
          + f"; 5 rows / 1 row {costs[2] / costs[0]:.2f}", flush=True)
