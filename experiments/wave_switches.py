"""When does `adaptive` turn speculation on in waves of a fixed batch size? bench --batch's workload for one policy
alone: the 8 built-in requests in waves of --batch (64 tokens each, greedy), --rounds times, after bench's warm-up
(one wave of 8 at 8 tokens). Prints each wave's wall seconds, decode steps and steps where some row drafted, and
every weighing at the full load that turned speculation on or probed (rows decoding, the k chosen, acceptance
per position, the estimated cost of each k, the rates they give, and the verify widths and draft row counts
measured: those are what it weighed).

    python experiments/wave_switches.py BUNDLE [--batch 4] [--rounds 10]
"""

import argparse

from specedge.bench.batch import run_together
from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load, policies

_next_k = policies.AdaptivePolicy.next_k


def _logged_next_k(self, max_k, batch=1, drafting=None, rows=None, rows_fed=False):
    was_off = self.off
    k = _next_k(self, max_k, batch, drafting, rows, rows_fed)
    if batch > 1 and k > 0 and (was_off or self.probing) and (rows is None or rows >= batch):
        costs = [self.step_cost(j, batch) for j in range(max_k + 1)]
        rates = self._rates(costs, batch) if None not in costs else None
        curve = self.costs.by_batch.get(batch)
        print(f"  weighed B={batch} k={k} probing={self.probing}"
              f" acceptance={[round(a, 2) for a in self.acceptance()[:4]]}"
              f" cost(k)={[round(c, 3) for c in costs[:5]] if rates else costs[:5]}"
              f" rate(k)={[round(r, 1) for r in rates[:5]] if rates else None}"
              f" verify(T)={ {t: round(v, 3) for t, v in curve.seen.items()} if curve else None}"
              f" (T measured steps ago: { {t: self.costs.steps - w for t, w in curve.when.items()} if curve else None})"
              f" draft(rows)={ {r: round(v, 3) for r, v in self.costs.draft.seen.items()} }", flush=True)
    return k


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    policies.AdaptivePolicy.next_k = _logged_next_k
    gen = load(args.bundle, max_batch=max(8, args.batch), prompt_cache=False)
    prompts, options = list(BUILTIN_PROMPTS), {"ignore_eos": True, "policy": "adaptive"}
    run_together(gen, prompts, 8, {**options, "max_new_tokens": 8}, None)
    for r in range(args.rounds):
        for first in range(0, 8, args.batch):
            before = gen.counters["steps"]
            _, wall = run_together(gen, prompts, args.batch, {**options, "max_new_tokens": 64}, None, first)
            steps = list(gen.scheduler.events)[-(gen.counters["steps"] - before):]
            drafted = sum(1 for e in steps if max(e.k) > 0)
            print(f"round {r + 1} wave {first // args.batch + 1}: wall {wall:.2f} s, {len(steps)} steps, "
                  f"{drafted} with drafts", flush=True)


if __name__ == "__main__":
    main()
