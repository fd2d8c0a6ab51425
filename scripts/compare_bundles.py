"""Bundles side by side in one process (e.g. the same models exported with --attention gqa and standard).

    python scripts/compare_bundles.py BUNDLE_A BUNDLE_B [...] --policies target,heuristic --repeat 3 [--prompts FILE]

Every round runs each bundle's policies once on the built-in prompts, bundles alternating, so machine
drift hits all alike; prints the median tokens/s per bundle and policy, the ratio to the first bundle, the
mean accepted length (tokens a verify call commits) and the mean k of the last round (a policy that learns, such as
adaptive, carries what it learned from round to round). --prompts: a JSONL file as `specedge bench` takes
(default: the built-in prompts).
All bundles stay loaded at once: mind their memory.
"""

import argparse
import statistics
import sys

from specedge.bench import run_bench
from specedge.bench.runner import load_prompts
from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundles", nargs="+")
    parser.add_argument("--policies", default="target,heuristic")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--prompts", help="JSONL prompts file (default: the built-in prompts)")
    args = parser.parse_args(argv)
    policies = args.policies.split(",")
    gens = [load(b) for b in args.bundles]
    tps = {(b, p): [] for b in args.bundles for p in ["target"] + policies}
    prompts = load_prompts(args.prompts) if args.prompts else BUILTIN_PROMPTS
    accepted, k_mean = {}, {}
    identical = {key: True for key in tps}
    for r in range(args.repeat):
        for bundle, gen in zip(args.bundles, gens):
            result = run_bench(gen, prompts, policies, max_new_tokens=args.max_new_tokens)
            for name, entry in result["policies"].items():
                tps[(bundle, name)].append(entry["tok_per_s"])
                accepted[(bundle, name)] = entry["mean_accepted_length"]
                k_mean[(bundle, name)] = entry["k_mean"]
                identical[(bundle, name)] &= entry["identical_to_target"] is True
            print(f"round {r + 1}/{args.repeat}: {bundle} done", file=sys.stderr)
    first = args.bundles[0]
    print(f"{'bundle':<40} {'policy':<11} {'tok/s':>7} {'vs first':>8} {'accepted':>8} {'k mean':>6} "
          f"{'same as its target':>18}")
    for (bundle, name), values in tps.items():
        median = statistics.median(values)
        ratio = median / statistics.median(tps[(first, name)])
        same = "yes" if identical[(bundle, name)] else "NO"
        print(f"{bundle:<40} {name:<11} {median:7.2f} {ratio:7.2f}x {accepted[(bundle, name)]:8.2f} "
              f"{k_mean[(bundle, name)]:6.2f} {same:>18}   "
              f"per round {['%.2f' % v for v in values]}")


if __name__ == "__main__":
    main(sys.argv[1:])
