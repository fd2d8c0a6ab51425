"""One client through the server against the Python API on the same requests, alternating, medians of rounds.

    python experiments/serve_vs_api.py BUNDLE [--rounds 3] [--tokens 64] [--policies target,fixed:4,adaptive]
        [--server-args "--threads 2"] [--out FILE]

The server is `specedge serve BUNDLE` in its own process (bench-serve's `served`, max_batch 8, as bench-serve
starts it); the API side is a generator in this process loaded with max_batch 8 too. Each round runs, per
policy, the built-in prompts once through the server at concurrency 1 (`run_bench_serve`: output tokens over
wall time, streamed, greedy, ignore_eos) and once through `run_bench` (tokens over generate time, prefill
included): the same four requests both ways. Both sides stay loaded for the whole run; a pair's onnxruntime
threads spin only within a call, so the idle side does not steal cores.
"""

import argparse
import json
import shlex
import statistics

from specedge.bench.runner import load_prompts, run_bench
from specedge.bench.serve import run_bench_serve, served
from specedge.runtime import load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--policies", default="target,fixed:4,adaptive")
    parser.add_argument("--server-args", default="")
    parser.add_argument("--out")
    args = parser.parse_args()
    policies = args.policies.split(",")
    prompts = load_prompts(None)
    gen = load(args.bundle, max_batch=8, prompt_cache=False)
    server, api = {p: [] for p in policies}, {p: [] for p in policies}
    with served(args.bundle, 8, extra_args=shlex.split(args.server_args)) as (url, _pid):
        for r in range(args.rounds):
            res = run_bench_serve(url, prompts, policies, [1], max_tokens=args.tokens)
            for p in policies:
                server[p].append(res["runs"][p]["1"]["output_tok_per_s"])
            res = run_bench(gen, prompts, policies, max_new_tokens=args.tokens)
            for p in policies:
                api[p].append(res["policies"][p]["tok_per_s"])
            print(f"round {r + 1}: " + ", ".join(f"{p} server {server[p][-1]:.2f} api {api[p][-1]:.2f}"
                                                 for p in policies), flush=True)
    gen.close()
    print("medians (server / api = ratio):")
    for p in policies:
        s, a = statistics.median(server[p]), statistics.median(api[p])
        print(f"  {p}: {s:.2f} / {a:.2f} = {s / a:.3f}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "server": server, "api": api}, f, indent=1)


if __name__ == "__main__":
    main()
