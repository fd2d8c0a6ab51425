"""What one decode step of each bundle's draft (and target) costs, bundles alternating call by call.

    python experiments/draft_step_cost.py BUNDLE_A BUNDLE_B [...] [--rounds 40] [--steps 8]

Whole-run tokens/s of two bundles drift apart with the machine and with where each bundle sits in memory (two
bundles holding the same target measured 6-10% apart: docs/int4-rounding.md); a step of one model against a step of
the other, interleaved, sees the same machine. Each round feeds a 32-token prompt to every model, then runs
`--steps` single-token steps per model in turn (the greedy ids of its own output); prints the median milliseconds
of a step per bundle and model, and the ratio to the first bundle. Targets shared by the bundles are the control:
their ratio should be 1.
"""

import argparse
import statistics
import time

from specedge.runtime import load
from specedge.runtime.backends.base import SlotCursor


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    gens = [load(b) for b in args.bundles]
    roles = [r for r in ("draft", "target") if all(getattr(g, r) is not None for g in gens)]
    times = {(b, r): [] for b in args.bundles for r in roles}
    prompt = list(range(1000, 1032))
    for n in range(args.rounds):
        for role in roles:
            cursors = [SlotCursor(getattr(g, role)) for g in gens]
            last = [int(c.feed_ids(prompt, last=1)[-1]) for c in cursors]
            for _ in range(args.steps):
                order = range(len(gens)) if n % 2 == 0 else reversed(range(len(gens)))
                for i in order:
                    start = time.perf_counter()
                    last[i] = int(cursors[i].feed_ids([last[i]], last=1)[-1])
                    times[(args.bundles[i], role)].append(time.perf_counter() - start)
    for role in roles:
        first = statistics.median(times[(args.bundles[0], role)])
        for bundle in args.bundles:
            median = statistics.median(times[(bundle, role)])
            print(f"{role:<7} {bundle:<40} {1e3 * median:8.2f} ms a step  {median / first:5.3f}x the first")


if __name__ == "__main__":
    main()
