"""The memory-bandwidth bound of plain decoding: weight bytes read per token against measured bandwidth.

A decode step of a batch-1 model reads every weight once (the embedding table only one row per token,
unless it doubles as the fp32 LM head), so no runtime can beat bandwidth / bytes per token. Two
bandwidths are measured on the same buffer: STREAM-style copy (read + write traffic, the usual figure)
and a pure read, which is what a decode step does: the faster of a sum per thread and one matrix-vector
product (numpy's BLAS, its own threads), since a sum alone can be bound by its additions rather than by
memory (8 GB/s a thread on an AVX2 EPYC, where the product reads 18). On a few cores of a large server
the two differ: each core can keep only so many cache misses in flight, and a copy's writes travel
beside its reads, so copy traffic can exceed what the same cores can read.
"""

from __future__ import annotations

import contextlib
import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from specedge.runtime.manifest import DTYPES


def copy_bandwidth(nbytes: int = 512 << 20, repeats: int = 5, threads: int | None = None) -> dict:
    """STREAM-style copy with one numpy copy per thread (numpy releases the GIL) -> bytes moved per second,
    counting read + write: {"best", "median", "threads", "bytes"}; and a read of the same two buffers, the
    faster of one sum per thread and a BLAS matrix-vector product: {"read_best", "read_median", "read_kernel"}."""
    threads = threads or os.cpu_count() or 1
    src = np.ones(max(1, nbytes // 4 // 4096) * 4096, np.float32)      # whole rows of the product below
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts if p.size]
    rates = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats + 1):                               # the first pass faults the pages in
            t = time.perf_counter()
            list(pool.map(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]), bounds))
            rates.append(2 * src.nbytes / (time.perf_counter() - t))
        reads = []
        for _ in range(repeats):
            t = time.perf_counter()
            # both buffers, 2 x nbytes: more than a large server's L3 holds, so little of it is a cache hit
            list(pool.map(lambda b: (np.add.reduce(src[b[0]:b[1]]), np.add.reduce(dst[b[0]:b[1]])), bounds))
            reads.append(2 * src.nbytes / (time.perf_counter() - t))
    ones = np.ones(4096, np.float32)
    products = []
    for _ in range(repeats):
        t = time.perf_counter()
        src.reshape(-1, ones.size) @ ones, dst.reshape(-1, ones.size) @ ones
        products.append(2 * src.nbytes / (time.perf_counter() - t))
    rates, reads, products = sorted(rates[1:]), sorted(reads), sorted(products)
    kernel, best_reads = max(("sum", reads), ("matvec", products), key=lambda pair: pair[1][-1])
    return {"best": rates[-1], "median": rates[len(rates) // 2], "read_best": best_reads[-1],
            "read_median": best_reads[len(best_reads) // 2], "read_kernel": kernel,
            "threads": threads, "bytes": src.nbytes}


BLAS_THREAD_VARIABLES = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


@contextlib.contextmanager
def blas_threads(threads: int | None):
    """The BLAS thread count for child processes started inside (BLAS reads it once, at import); None: unchanged."""
    saved = {name: os.environ.get(name) for name in BLAS_THREAD_VARIABLES}
    if threads:
        os.environ.update({name: str(threads) for name in BLAS_THREAD_VARIABLES})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def copy_bandwidth_in_child(**kwargs) -> dict:
    """copy_bandwidth in a fresh child process, so that its two buffers (1 GiB by default) stay out of the
    peak resident memory that bench reports for the run. With `threads`, the child's BLAS (the matrix-vector read)
    runs that many threads too."""
    import multiprocessing

    with blas_threads(kwargs.get("threads")), multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(copy_bandwidth, kwds=kwargs)


def bytes_per_token(model: dict) -> int:
    """Weight bytes one plain decode step reads: all weights but the rows of a gather-only embedding
    (embedding_bytes: its size as stored; older manifests lack it and hold an fp32 table)."""
    spec = model["spec"]
    embedding = model.get("embedding_bytes") or spec["vocab_size"] * spec["hidden_size"] * 4
    # a quantized model's LM head is a matrix of its own; the embedding table is only gathered from
    gather_only = not spec["tied_embeddings"] or model.get("weights", "float32") not in DTYPES
    return model["weight_bytes"] - (embedding if gather_only else 0)


def bandwidth_bound(model: dict, bandwidth: dict, tok_per_s: float | None = None) -> dict:
    """The read bound (bytes a decode step reads against the read rate measured in the same run); the copy
    rate is kept for reference only: it counts writes a decode step does not do."""
    per_token = bytes_per_token(model)
    bound = bandwidth["read_best"] / per_token
    result = {"read_bytes_per_s": bandwidth["read_best"], "read_bytes_per_s_median": bandwidth["read_median"],
              "read_kernel": bandwidth["read_kernel"], "copy_bytes_per_s": bandwidth["best"],
              "threads": bandwidth["threads"], "bytes_per_token": per_token, "bound_tok_per_s": bound}
    if tok_per_s is not None:
        result["fraction_of_bound"] = tok_per_s / bound
    return result
