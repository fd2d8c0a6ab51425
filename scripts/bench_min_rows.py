"""What running a quantized target's single steps as two rows costs: one session, min_rows 1 and 2 alternating.

    python scripts/bench_min_rows.py BUNDLE [--steps 64] [--rounds 5]

The same target session decodes --steps single tokens (after a short prefill) with min_rows 1, then with
min_rows 2, and so on for --rounds; same weights in the same memory, so only the row count differs.
Prints the median ms per step of each and their ratio. Any target can be padded (the runtime repeats a
lone token at the next position); it matters for quantized targets (MatMulNBits' one-row kernel).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from specedge.runtime.backends import open_backend
from specedge.runtime.backends.base import SlotCursor


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    bundle = Path(args.bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = manifest["models"]["target"]
    backend = open_backend("cpu", bundle / entry["file"], entry, manifest["max_seq_len"], max_step=16)
    step = SlotCursor(backend)
    ids = np.random.default_rng(0).integers(0, manifest["vocab_size"], size=16 + args.steps).tolist()
    per_step = {1: [], 2: []}
    for _ in range(args.rounds):
        for rows in (1, 2):
            backend.min_rows, step.pos = rows, 0
            step.feed(ids[:16], last=1)
            t = time.perf_counter()
            for token in ids[16:]:
                step.feed([token])
            per_step[rows].append(1e3 * (time.perf_counter() - t) / args.steps)
    one, two = statistics.median(per_step[1]), statistics.median(per_step[2])
    print(f"single step, min_rows 1: {one:.1f} ms   min_rows 2: {two:.1f} ms   ratio {two / one:.3f}"
          f"   (medians of {args.rounds} rounds of {args.steps} steps)")
    print("per round:", {rows: [round(v, 1) for v in values] for rows, values in per_step.items()})


if __name__ == "__main__":
    main(sys.argv[1:])
