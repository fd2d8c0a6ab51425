"""Two versions of the code side by side: two running servers on one bundle (A: an older checkout, B: this one),
cells alternating, then each server's decode steps by batch size (`/v1/speculation/steps`).

    git worktree add /tmp/old REF
    (cd /tmp/old && PYTHONPATH=/tmp/old python -m specedge.cli serve BUNDLE --port 8101 --max-batch 16 &)
    python -m specedge.cli serve BUNDLE --port 8102 --max-batch 16 &
    python experiments/serve_code_ab.py http://127.0.0.1:8101/v1 http://127.0.0.1:8102/v1 [--concurrency 2,8,16]
        [--rounds 3] [--out FILE]

Each round runs, at every concurrency, target and adaptive on each server (bench-serve's cell: max(4, 2 x
concurrency) streamed greedy requests, output tokens over wall time), the order reversed every other round.
Prints per-round numbers, medians, each adaptive's per-round ratio to its own server's target cell (two server
processes on one bundle ran the same plain steps 1-2.5% apart, so a ratio across servers measures that too), and
per server and batch size: steps with k > 0 and their tokens/s against the plain steps', catch-up tokens and
seconds.
"""

import argparse
import json
import statistics
from collections import Counter, defaultdict

import httpx

from specedge.bench.batch import parse_batches
from specedge.bench.runner import load_prompts
from specedge.bench.serve import run_bench_serve


def steps_by_batch(url: str) -> dict[int, Counter]:
    steps = httpx.get(url.removesuffix("/v1") + "/v1/speculation/steps", params={"recent": 4096}).json()["recent"]
    by = defaultdict(Counter)
    for s in steps:
        c, spec = by[s["batch"]], any(s["k"])
        kind = "spec" if spec else "plain"
        c[f"{kind}_steps"] += 1
        c[f"{kind}_tokens"] += sum(s["accepted"]) + s["batch"]
        c[f"{kind}_s"] += s["draft_s"] + s["verify_s"]
        c["catch_up_tokens"] += s["catch_up_tokens"]
        c["catch_up_s"] += s["catch_up_s"]
    return by


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--concurrency", default="2,8,16")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args()
    levels, prompts = parse_batches(args.concurrency, "--concurrency"), load_prompts(None)
    cells = [(f"{side} {policy}", url, policy) for side, url in (("A", args.a), ("B", args.b))
             for policy in ("target", "adaptive")]
    for _, url, policy in cells:                               # warm-up, not measured
        run_bench_serve(url, prompts, [policy], [1], max_tokens=8)
    runs = {name: {c: [] for c in levels} for name, _, _ in cells}
    for r in range(args.rounds):
        for c in levels:
            for name, url, policy in cells if r % 2 == 0 else cells[::-1]:
                res = run_bench_serve(url, prompts, [policy], [c], max_tokens=args.tokens, warm_up=False)
                runs[name][c].append(res["runs"][policy][str(c)]["output_tok_per_s"])
            print(f"round {r + 1} concurrency {c}: " + "  ".join(f"{n} {runs[n][c][-1]:.2f}" for n, _, _ in cells),
                  flush=True)
    print("medians (per-round ratio to the same server's target):")
    for c in levels:
        ratio = {n: statistics.median(x / t for x, t in zip(runs[n][c], runs[n[0] + " target"][c])) for n in runs}
        print(f"  concurrency {c}: " + "  ".join(f"{n} {statistics.median(runs[n][c]):.2f} ({ratio[n]:.3f})"
                                                 for n in runs))
    steps = {}
    for side, url in (("A", args.a), ("B", args.b)):
        steps[side] = steps_by_batch(url)
        print(f"server {side}, steps by batch size (A's include its target cells):")
        for b, c in sorted(steps[side].items()):
            spec = f"{c['spec_tokens'] / c['spec_s']:.1f}" if c["spec_s"] else "-"
            plain = f"{c['plain_tokens'] / c['plain_s']:.1f}" if c["plain_s"] else "-"
            print(f"  B {b:2d}: {c['spec_steps']:4d} steps with k > 0 ({spec} tok/s), {c['plain_steps']:4d} plain "
                  f"({plain} tok/s), catch-up {c['catch_up_tokens']} tokens in {c['catch_up_s']:.2f} s")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "runs": runs,
                       "steps": {s: {b: dict(c) for b, c in by.items()} for s, by in steps.items()}}, f, indent=1)


if __name__ == "__main__":
    main()
