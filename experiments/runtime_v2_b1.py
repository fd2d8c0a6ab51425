"""Batch-1 speed of runtime v2 against the runtime before it, under max_batch 8 against max_batch 1, and with
onnxruntime's idle threads spinning (the old runtime's setting) against not (runtime v2's default for a pair).

    python experiments/runtime_v2_b1.py --old-src OLD_CHECKOUT --old OLD_BUNDLE --new NEW_GQA_BUNDLE \
        --standard NEW_STANDARD_BUNDLE [--rounds 3] [--tokens 64]

Each measurement is a fresh process (the two runtimes share the package name), rounds alternate between
them so drift hits all alike; a process loads its bundle, warms up, then generates --tokens tokens on each
of the three built-in code prompts with `target` and with `adaptive` and prints tokens/s (tokens over
generate time, prefill included). OLD_CHECKOUT is a checkout of the commit before runtime v2 and
OLD_BUNDLE the same models exported by it (format 1). Prints medians and ratios.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

RUN = r"""
import inspect, json, sys, time
from specedge.runtime import load
prompts = ["def quicksort(arr):\n", "import numpy as np\n\ndef moving_average(x: np.ndarray, window: int) -> np.ndarray:\n",
           "class LRUCache:\n    def __init__(self, capacity: int):\n"]
bundle, tokens, max_batch, spinning = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
options = {} if spinning == "default" else {"spinning": spinning == "on"}
if "prompt_cache" in inspect.signature(load).parameters:       # a checkout from before the cache has none
    options["prompt_cache"] = False
gen = load(bundle, max_batch=max_batch, **options) if max_batch > 1 or options else load(bundle)
out = {}
for policy in ("target", "adaptive"):
    gen.generate(prompts[0], max_new_tokens=8, policy=policy)
    total_tokens = total_s = 0.0
    for p in prompts:
        t = time.perf_counter()
        r = gen.generate(p, max_new_tokens=tokens, policy=policy, ignore_eos=True)
        total_s += time.perf_counter() - t
        total_tokens += len(r.tokens)
    out[policy] = total_tokens / total_s
print(json.dumps(out))
"""


def run(src: str | None, bundle: str, tokens: int, max_batch: int, spinning: str) -> dict:
    env = dict(os.environ)
    if src:
        env["PYTHONPATH"] = src
    proc = subprocess.run([sys.executable, "-c", RUN, bundle, str(tokens), str(max_batch), spinning], env=env,
                          capture_output=True, text=True, cwd="/", check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--old-src", required=True)
    parser.add_argument("--old", required=True)
    parser.add_argument("--new", required=True)
    parser.add_argument("--standard", required=True)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args(argv)
    setups = {"old runtime, gqa v2": (args.old_src, args.old, 1, "default"),
              "new runtime, gqa v3": (None, args.new, 1, "default"),
              "new, gqa v3, spinning on": (None, args.new, 1, "on"),
              "new, standard, max_batch 1": (None, args.standard, 1, "default"),
              "new, standard, max_batch 8": (None, args.standard, 8, "default")}
    results = {name: {"target": [], "adaptive": []} for name in setups}
    for r in range(args.rounds):
        for name, (src, bundle, max_batch, spinning) in setups.items():
            for policy, tps in run(src, bundle, args.tokens, max_batch, spinning).items():
                results[name][policy].append(tps)
            print(f"round {r + 1}: {name}: " + ", ".join(f"{p} {v[-1]:.2f}" for p, v in results[name].items()),
                  file=sys.stderr, flush=True)
    medians = {name: {p: statistics.median(v) for p, v in per.items()} for name, per in results.items()}
    base = medians["old runtime, gqa v2"]
    print(f"{'setup':<28} {'target tok/s':>12} {'vs old':>7} {'adaptive tok/s':>14} {'vs old':>7}")
    for name, m in medians.items():
        print(f"{name:<28} {m['target']:12.2f} {m['target'] / base['target']:7.3f} {m['adaptive']:14.2f} "
              f"{m['adaptive'] / base['adaptive']:7.3f}")
    mb8, mb1 = medians["new, standard, max_batch 8"], medians["new, standard, max_batch 1"]
    print(f"max_batch 8 / max_batch 1 at B = 1: target {mb8['target'] / mb1['target']:.3f}, "
          f"adaptive {mb8['adaptive'] / mb1['adaptive']:.3f}")
    print(json.dumps({"rounds": args.rounds, "tokens": args.tokens, "per_round": results, "medians": medians}))


if __name__ == "__main__":
    main(sys.argv[1:])
