"""The memory-bandwidth bound of plain decoding: weight bytes read per token against measured copy bandwidth.

A decode step of a batch-1 model reads every weight once (the embedding table only one row per token,
unless it doubles as the fp32 LM head), so no runtime can beat bandwidth / bytes per token.
"""

from __future__ import annotations

import os
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np


def copy_bandwidth(nbytes: int = 512 << 20, repeats: int = 5, threads: int | None = None) -> dict:
    """STREAM-style copy with one numpy copy per thread (numpy releases the GIL) -> bytes moved per second,
    counting read + write: {"best", "median", "threads", "bytes"}."""
    threads = threads or os.cpu_count() or 1
    src = np.ones(nbytes // 4, np.float32)
    dst = np.empty_like(src)
    parts = np.array_split(np.arange(src.size), threads)
    bounds = [(int(p[0]), int(p[-1]) + 1) for p in parts if p.size]
    rates = []
    with ThreadPoolExecutor(threads) as pool:
        for _ in range(repeats + 1):                               # the first pass faults the pages in
            t = time.perf_counter()
            list(pool.map(lambda b: np.copyto(dst[b[0]:b[1]], src[b[0]:b[1]]), bounds))
            rates.append(2 * src.nbytes / (time.perf_counter() - t))
    rates = sorted(rates[1:])
    return {"best": rates[-1], "median": rates[len(rates) // 2], "threads": threads, "bytes": src.nbytes}


def bytes_per_token(model: dict) -> int:
    """Weight bytes one plain decode step reads: all weights but the rows of a gather-only embedding."""
    spec = model["spec"]
    embedding = spec["vocab_size"] * spec["hidden_size"] * 4
    gather_only = not spec["tied_embeddings"] or model.get("weights", "float32") != "float32"
    return model["weight_bytes"] - (embedding if gather_only else 0)


def bandwidth_bound(model: dict, bandwidth: dict, tok_per_s: float | None = None) -> dict:
    per_token = bytes_per_token(model)
    bound = bandwidth["best"] / per_token
    result = {"copy_bytes_per_s": bandwidth["best"], "copy_bytes_per_s_median": bandwidth["median"],
              "threads": bandwidth["threads"], "bytes_per_token": per_token, "bound_tok_per_s": bound}
    if tok_per_s is not None:
        result["fraction_of_bound"] = tok_per_s / bound
    return result
