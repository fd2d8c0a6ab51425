"""Fill-in-the-middle (an editor's autocomplete) with and without speculation, alternating in one process.

    python experiments/fim_speed.py BUNDLE [--rounds 3] [--max-new-tokens 96]

Three gaps in small Python files; each configuration fills every gap (greedy, until the model ends the middle)
per round, configurations alternating. Prints the median tokens/s (prefill included, as an editor waits for it),
the speedup over the target alone, the mean accepted length, and whether every middle equals the target's.
"""

import argparse
import statistics

from specedge.runtime import load

GAPS = [
    ("def fib(n):\n    ", "\n\nprint([fib(i) for i in range(10)])\n"),
    ("class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n"
     "        self.items.append(item)\n\n    def pop(self):\n", "\n\n    def peek(self):\n        return self.items[-1]\n"),
    ("import json\n\n\ndef load_config(path):\n    ", "\n\n\nconfig = load_config('settings.json')\n"
     "print(config['name'])\n"),
]
CONFIGS = {"target": dict(policy="target"), "adaptive": dict(policy="adaptive"),
           "adaptive@hybrid": dict(policy="adaptive", drafter="hybrid"), "fixed:4": dict(policy="fixed:4")}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=96)
    args = parser.parse_args()
    gen = load(args.bundle, prompt_cache=False)
    gen.generate(GAPS[0][0], suffix=GAPS[0][1], max_new_tokens=4)                  # warm-up
    speed = {name: [] for name in CONFIGS}
    accepted = {name: [] for name in CONFIGS}
    middles = {name: [] for name in CONFIGS}
    for r in range(args.rounds):
        for name in (list(CONFIGS) if r % 2 == 0 else list(CONFIGS)[::-1]):
            runs = [gen.generate(p, suffix=s, max_new_tokens=args.max_new_tokens, **CONFIGS[name]) for p, s in GAPS]
            speed[name].append(sum(x.stats.new_tokens for x in runs) / sum(x.stats.total_s for x in runs))
            accepted[name].append(statistics.mean(x.stats.mean_accepted_length for x in runs))
            middles[name].append([x.tokens for x in runs])
    base = statistics.median(speed["target"])
    print(f"{args.bundle}: {len(GAPS)} gaps, greedy, up to {args.max_new_tokens} tokens, medians of {args.rounds}")
    for name in CONFIGS:
        m = statistics.median(speed[name])
        same = all(x == middles["target"][0] for x in middles[name])
        print(f"{name:<16} {m:6.2f} tok/s  {m / base:5.2f}x  accepted length {statistics.median(accepted[name]):.2f}"
              f"  same middles: {same}")
    print("middles:", [gen.decode(t) for t in middles["target"][0]])


if __name__ == "__main__":
    main()
