"""Prefill speed by chunk size: one model of a bundle prefills the same N tokens in chunks of 64, 128, 256, 512.

    python experiments/prefill_chunk.py BUNDLE [--model target|draft] [--tokens 880] [--rounds 3]

Chunk sizes alternate within every round (drift hits all alike); prints the median prompt tokens per second per
chunk size and the ratio to chunks of 64 (the scheduler's PREFILL_CHUNK).
"""

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from specedge.runtime.backends import open_backend
from specedge.runtime.manifest import read_manifest

CHUNKS = (64, 128, 256, 512)


def prefill(backend, ids: list[int], chunk: int) -> float:
    t = time.perf_counter()
    for at in range(0, len(ids), chunk):
        backend.run([at], [ids[at: at + chunk]], [1], lo=0, want="ids")
    return time.perf_counter() - t


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--model", default="target", choices=["target", "draft"])
    parser.add_argument("--tokens", type=int, default=880)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    manifest = read_manifest(Path(args.bundle))
    entry = manifest["models"][args.model]
    backend = open_backend("cpu", Path(args.bundle) / entry["file"], entry, manifest["max_seq_len"],
                           max_step=max(CHUNKS))
    ids = np.random.default_rng(0).integers(0, manifest["vocab_size"], args.tokens).tolist()
    prefill(backend, ids[:128], 64)                                           # warm-up
    seconds = {c: [] for c in CHUNKS}
    for r in range(args.rounds):
        for c in (CHUNKS if r % 2 == 0 else CHUNKS[::-1]):
            seconds[c].append(prefill(backend, ids, c))
    base = statistics.median(seconds[64])
    print(f"{args.bundle} {args.model}: {args.tokens} tokens, medians of {args.rounds}")
    for c in CHUNKS:
        m = statistics.median(seconds[c])
        print(f"chunk {c:>4}: {m:6.2f} s  {args.tokens / m:7.1f} tok/s  {base / m:5.2f}x chunks of 64")


if __name__ == "__main__":
    main()
