"""What one target call costs by the number of tokens it verifies (T), against a single step: the number that
decides whether speculation can pay on a machine (llama.cpp's counterpart: `llama-bench -p 1,2,4,8 -n 0`).

    python experiments/verify_width.py BUNDLE [--widths 1,2,4,5,8] [--calls 20] [--rounds 3] [--model target]

After a 100-token prefill, the model runs T tokens at positions 100.. (logits of every row, as a verify call
returns them) --calls times, the widths taking turns round by round; prints the median ms per call and its
ratio to T = 1 (single steps as one or two rows, as the load probe chooses: `min_rows`).
"""

import argparse
import statistics
import sys
import time

import numpy as np

from specedge.runtime import load
from specedge.runtime.backends.base import SlotCursor


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--widths", default="1,2,4,5,8")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--model", default="target", choices=["target", "draft"])
    args = parser.parse_args(argv)
    gen = load(args.bundle, prompt_cache=False)                # single steps as one or two rows, as the probe chose
    backend = gen.target if args.model == "target" else gen.draft
    step = SlotCursor(backend)
    widths = [int(w) for w in args.widths.split(",")]
    ids = np.random.default_rng(0).integers(0, gen.vocab_size, size=100 + max(widths)).tolist()
    step.pos = 0
    step.feed(ids[:100], last=1)
    ms = {w: [] for w in widths}
    for _ in range(args.rounds):
        for w in widths:
            t = time.perf_counter()
            for _ in range(args.calls):
                step.pos = 100
                step.feed(ids[100:100 + w], last=w)
            ms[w].append(1e3 * (time.perf_counter() - t) / args.calls)
    one = statistics.median(ms[widths[0]])
    for w in widths:
        med = statistics.median(ms[w])
        print(f"T = {w}: {med:6.1f} ms per call, {med / one:4.2f}x T = {widths[0]}  "
              f"(rounds {[round(v, 1) for v in ms[w]]}; single steps as {backend.min_rows} row(s))")


if __name__ == "__main__":
    main(sys.argv[1:])
