"""Every decision of `adaptive` on whether feeding a draft pays, in bench's waves of one batch size.

    python experiments/feed_decisions.py BUNDLE [--batch 2] [--rounds 1] [--tokens 64]

Runs bench's warm-up, then rounds of the 8 built-in requests in waves of --batch with `adaptive` alone, and prints
each `catch_up_pays` call (a joining prompt, a draft that fell behind): tokens behind, tokens to go, the batch size
asked about, how many rows' drafts lack their text, the per-row rates it was weighed on (plain, best, tokens a step at the best k), the fed cost predicted
and the verdict; then each wave's wall time and its steps' k per row (c: a step with a catch-up).
"""

import argparse

from wave_trace import REQUESTS, wave

from specedge.bench.batch import run_together
from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load, policies


def logged(original):
    def catch_up_pays(self, behind, remaining, batch=None, unfed=1):
        verdict = original(self, behind, remaining, batch, unfed)
        rates = self._row_rates(self.last_batch if batch is None else batch)
        shown = "unmeasured" if rates is None else " ".join(f"{x:.3f}" for x in rates)
        cost = self.catch_up(behind)
        print(f"  feed? behind {behind:4d}  to go {remaining:3d}  batch {batch}  unfed {unfed}  off {self.off}  rates {shown}  "
              f"cost {'-' if cost is None else f'{cost:.3f} s'}  -> {verdict}", flush=True)
        return verdict
    return catch_up_pays


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    gen = load(args.bundle, max_batch=max(8, args.batch), prompt_cache=False)
    for p in ("target", "adaptive"):                           # bench's warm-up
        run_together(gen, list(BUILTIN_PROMPTS), REQUESTS, {"max_new_tokens": 8, "ignore_eos": True, "policy": p}, None)
    policies.AdaptivePolicy.catch_up_pays = logged(policies.AdaptivePolicy.catch_up_pays)
    for r in range(args.rounds):
        for first in range(0, REQUESTS, args.batch):
            print(f"round {r + 1}, wave from request {first + 1}:", flush=True)
            sums, steps = wave(gen, "adaptive", args.batch, first, args.tokens)
            ks = " ".join("".join(str(min(k, 9)) for k in s["k"]) + ("c" if s["catch_up_tokens"] else "")
                          for s in steps)
            print(f"  wall {sums['wall_s']:.2f} s, k per row step by step: {ks}", flush=True)


if __name__ == "__main__":
    main()
