"""Per-call cost of a pair's sessions under each spinning mode, in one process, modes alternating.

    python experiments/spinning_calls.py BUNDLE [--modes never,in-call] [--repeat 10]

For each mode a Generator over BUNDLE (a pair) is loaded; a 100-token prompt is fed once; then, repeat times,
each mode in turn runs 10 plain target steps (one token) and 5 rounds of 4 draft calls + a 5-token verify.
Prints the median milliseconds of each call kind per mode. Modes whose threads never spin after a call
(never, in-call) can share the process fairly; "always" leaves threads spinning into the next mode's calls:
run it in a process of its own. Backs docs/runtime-v2.md, "A pair's threads spin within a call only".
"""

import argparse
import json
import statistics
import time

from specedge.runtime.backends.base import SlotCursor
from specedge.runtime.generator import Generator

PROMPT = list(range(1000, 1100))


def timed(cursor: SlotCursor, tokens: list[int], pos: int) -> float:
    cursor.pos = pos
    start = time.perf_counter()
    cursor.feed_ids(tokens, last=len(tokens))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--modes", default="never,in-call")
    parser.add_argument("--repeat", type=int, default=10)
    args = parser.parse_args()
    modes = args.modes.split(",")
    cursors = {}
    for mode in modes:
        gen = Generator(args.bundle, spinning=mode)
        target, draft = SlotCursor(gen.target), SlotCursor(gen.draft)
        target.feed(PROMPT)
        draft.feed(PROMPT)
        cursors[mode] = (gen, target, draft)
    times = {mode: {"plain": [], "draft": [], "verify": []} for mode in modes}
    end = len(PROMPT)
    for _ in range(args.repeat):
        for mode in modes:
            _, target, draft = cursors[mode]
            times[mode]["plain"] += [timed(target, [5], end) for _ in range(10)]
            for _ in range(5):
                times[mode]["draft"] += [timed(draft, [5], end + j) for j in range(4)]
                times[mode]["verify"].append(timed(target, [5] * 5, end))
    print(json.dumps({mode: {kind: round(1000 * statistics.median(v), 2) for kind, v in kinds.items()}
                      for mode, kinds in times.items()}))


if __name__ == "__main__":
    main()
