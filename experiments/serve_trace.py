"""What a policy costs under concurrent load through the server: bench-serve's cells against one `specedge serve`
process, each cell's decode steps read back from GET /v1/speculation/steps and taken apart (the HTTP
counterpart of concurrent_trace.py).

    python experiments/serve_trace.py BUNDLE [--concurrency 4[,8,...]] [--policies target,adaptive] [--repeat 3]
        [--tokens 64] [--out trace.json]

A cell is bench-serve's (max(4, 2 x concurrency) streamed greedy requests of the built-in prompts, output tokens
over wall time), run as bench-serve runs them: one unmeasured request per policy, then the cells back to back on
a server with bench-serve's --max-batch (the largest concurrency; before 2026-12-06 every cell here followed a
warm-up request of its own, and the server had --max-batch 8); within each repeat the concurrencies in turn and
at each the policies alternating (reversed on every other repeat). Per cell: steps, rows per step, steps with
k > 0, draft calls, catch-up tokens and seconds, time in the draft and verify phases and inside model calls, the
cell's wall time not spent in decode steps (prefill chunks, HTTP, waiting), and what its steps with k > 0 gained
against plain steps of as many rows, priced by the cell's own plain steps (else by those of the same repeat's
cells at that concurrency): gain_share, a paired estimate the drift between cells does not enter. Medians over
repeats; --out keeps every step.
"""

import argparse
import json
import time

import httpx

from concurrent_trace import report, step_totals   # experiments/ is on sys.path when run as a script
from specedge.bench.order import alternating
from specedge.bench.runner import load_prompts
from specedge.bench.serve import run_bench_serve, served
from specedge.bench.step_gain import plain_step_s, speculation_effect


def steps_after(url: str, after: int) -> tuple[int, list[dict]]:
    got = httpx.get(url + "/speculation/steps", params={"after": after, "recent": 4096}).json()
    return got["steps"], got["recent"]


def summary(steps: list[dict], tok_per_s: float, wall: float) -> dict:
    in_steps = sum(s["draft_s"] + s["verify_s"] for s in steps)
    return {"tok_per_s": tok_per_s, "wall_s": wall, **step_totals(steps), "outside_steps_s": wall - in_steps}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--concurrency", default="4")
    parser.add_argument("--policies", default="target,adaptive")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args()
    policies, prompts = args.policies.split(","), load_prompts(None)
    levels = [int(c) for c in args.concurrency.split(",")]
    names = [f"{p}@{c}" for c in levels for p in policies]
    cells, logs = {n: [] for n in names}, {n: [] for n in names}
    with served(args.bundle, max(levels)) as (url, _):          # --max-batch as bench-serve picks it
        # as bench-serve: one unmeasured request per policy, then the cells back to back (a warm-up request of each
        # cell's own, at concurrency 1, would put the shared policy back at B = 1 before every cell)
        run_bench_serve(url, prompts, policies, [1], requests_per_level=1, max_tokens=args.tokens, warm_up=False)
        seen, _ = steps_after(url, 0)
        for r in range(args.repeat):
            for c in levels:
                for p in alternating(policies, r):
                    res = run_bench_serve(url, prompts, [p], [c], max_tokens=args.tokens, warm_up=False)
                    returned = time.time()
                    entry = res["runs"][p][str(c)]
                    seen, steps = steps_after(url, seen)             # those that ended within the cell's wall time
                    steps = [s for s in steps if s["ended"] >= returned - entry["wall_s"]]
                    cells[f"{p}@{c}"].append(summary(steps, entry["output_tok_per_s"], entry["wall_s"]))
                    logs[f"{p}@{c}"].append(steps)
                pooled = plain_step_s([s for p in policies for s in logs[f"{p}@{c}"][r]])
                for p in policies:
                    cell = cells[f"{p}@{c}"][r]
                    cell.update(speculation_effect(logs[f"{p}@{c}"][r], pooled))
                    print(f"repeat {r + 1} {p}@{c}: {json.dumps({k: round(v, 3) for k, v in cell.items()})}",
                          flush=True)
    report(cells, logs, args)


if __name__ == "__main__":
    main()
