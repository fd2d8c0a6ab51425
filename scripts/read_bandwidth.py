"""How fast this machine reads memory, by reader: numpy reductions and a BLAS matrix-vector product over two
512 MiB buffers on 1 and 2 threads, and onnxruntime's fp32 MatMul at one row over a 1.1 GB chain of 20
distinct 1536x8960 layers (GB/s, best and median).   python scripts/read_bandwidth.py"""
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper

NBYTES = 512 << 20
src, dst = np.ones(NBYTES // 4, np.float32), np.ones(NBYTES // 4, np.float32)
ones = np.ones(4096, np.float32)


def rate(read, threads: int, repeats: int = 5) -> tuple[float, float]:
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts]
    rates = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats):
            start = time.perf_counter()
            list(pool.map(lambda b: (read(src[b[0]:b[1]]), read(dst[b[0]:b[1]])), bounds))
            rates.append(2 * NBYTES / (time.perf_counter() - start) / 1e9)
    return max(rates), float(np.median(rates))


readers = {"sum": np.add.reduce, "max": np.max, "matvec (BLAS, its own threads)": lambda a: a.reshape(-1, 4096) @ ones}
for threads in (1, 2):
    for name, read in readers.items():
        best, median = rate(read, threads)
        print(f"{threads} thread(s), {name}: best {best:.1f} GB/s, median {median:.1f}")

K, N, LAYERS = 1536, 8960, 20
rng = np.random.default_rng(0)
nodes, inits, x = [], [], "x"
for i in range(LAYERS):
    inits.append(numpy_helper.from_array((rng.standard_normal((K, N)) * 0.02).astype(np.float32), f"w{i}"))
    nodes += [helper.make_node("MatMul", [x, f"w{i}"], [f"y{i}"]), helper.make_node("Slice", [f"y{i}", "s", "e", "a"], [f"x{i}"])]
    x = f"x{i}"
inits += [numpy_helper.from_array(np.array([v]), n) for n, v in (("s", 0), ("e", K), ("a", 2))]
graph = helper.make_graph(nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, "M", K])],
                          [helper.make_tensor_value_info(x, TensorProto.FLOAT, [1, "M", K])], inits)
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
model.ir_version = 8
for threads in (1, 2):
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    row = rng.standard_normal((1, 1, K)).astype(np.float32)
    for _ in range(2):
        session.run(None, {"x": row})
    times = []
    for _ in range(7):
        start = time.perf_counter()
        session.run(None, {"x": row})
        times.append(time.perf_counter() - start)
    weight_bytes = LAYERS * K * N * 4
    print(f"{threads} thread(s), onnxruntime MatMul, one row: best {weight_bytes / min(times) / 1e9:.1f} GB/s, "
          f"median {weight_bytes / np.median(times) / 1e9:.1f}")
