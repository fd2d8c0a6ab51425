"""What asking for logprobs costs: the same greedy requests without logprobs, with the token's own, and with 5
alternatives, alternating in one process.

    python experiments/logprobs_cost.py BUNDLE [--policy adaptive] [--max-new-tokens 64] [--rounds 3]

Logprobs make the target return logits instead of argmax ids and add a log-softmax per token on the host.
Prints the median tokens/s per setting and the ratio to no logprobs; checks the tokens are the same.
"""

import argparse
import statistics

from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load

SETTINGS = {"none": None, "own": 0, "top 5": 5}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gen = load(args.bundle, prompt_cache=False)
    prompts = [p["prompt"] for p in BUILTIN_PROMPTS[:3]]
    options = dict(max_new_tokens=args.max_new_tokens, ignore_eos=True, policy=args.policy)
    gen.generate(prompts[0], **dict(options, max_new_tokens=8))                     # warm-up
    speed = {name: [] for name in SETTINGS}
    tokens = {name: [] for name in SETTINGS}
    for r in range(args.rounds):
        names = list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]
        for name in names:
            runs = [gen.generate(p, **options, logprobs=SETTINGS[name]) for p in prompts]
            speed[name].append(sum(x.stats.new_tokens for x in runs) / sum(x.stats.total_s for x in runs))
            tokens[name].append([x.tokens for x in runs])
    base = statistics.median(speed["none"])
    print(f"{args.bundle}, {args.policy}, {args.max_new_tokens} tokens x {len(prompts)} prompts, medians of "
          f"{args.rounds}")
    for name in SETTINGS:
        m = statistics.median(speed[name])
        same = all(t == tokens["none"][0] for t in tokens[name])
        print(f"logprobs {name:<6} {m:7.2f} tok/s  {m / base:5.3f}x  same tokens: {same}")


if __name__ == "__main__":
    main()
