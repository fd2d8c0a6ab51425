"""Two servers side by side, alternating cells: e.g. a speculative bundle with speculation off against the same
target exported without a draft.

    python experiments/serve_ab.py A_BUNDLE B_BUNDLE [--policy target] [--concurrency 1,2,4] [--rounds 3]
        [--tokens 64] [--out FILE]

Both servers are `specedge serve` processes started as bench-serve starts them (max_batch 8), both up for the
whole run; a pair's onnxruntime threads spin only within a call, so the idle server does not take the cores.
Each round runs every concurrency on A then on B (bench-serve's cell: max(4, 2 x concurrency) streamed greedy
requests of the built-in prompts, output tokens over wall time). Prints per-round numbers, medians and B / A.
"""

import argparse
import json
import statistics

from specedge.bench.batch import parse_batches
from specedge.bench.runner import load_prompts
from specedge.bench.serve import run_bench_serve, served


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("a")
    parser.add_argument("b")
    parser.add_argument("--policy", default="target")
    parser.add_argument("--concurrency", default="1,2,4")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args()
    levels, prompts = parse_batches(args.concurrency, "--concurrency"), load_prompts(None)
    runs = {"a": {c: [] for c in levels}, "b": {c: [] for c in levels}}
    with served(args.a, 8) as (url_a, _), served(args.b, 8) as (url_b, _):
        for url in (url_a, url_b):                     # warm-up, not measured
            run_bench_serve(url, prompts, [args.policy], [1], max_tokens=8)
        for r in range(args.rounds):
            for c in levels:
                for side, url in (("a", url_a), ("b", url_b)):
                    res = run_bench_serve(url, prompts, [args.policy], [c], max_tokens=args.tokens)
                    runs[side][c].append(res["runs"][args.policy][str(c)]["output_tok_per_s"])
                print(f"round {r + 1} concurrency {c}: A {runs['a'][c][-1]:.2f}  B {runs['b'][c][-1]:.2f}", flush=True)
    print(f"medians, {args.policy} (A / B, B / A):")
    for c in levels:
        a, b = statistics.median(runs["a"][c]), statistics.median(runs["b"][c])
        print(f"  concurrency {c}: {a:.2f} / {b:.2f}, {b / a:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "runs": runs}, f, indent=1)


if __name__ == "__main__":
    main()
