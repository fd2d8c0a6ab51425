"""One batch size's steps against the adaptive policy's cost model: waves of 8 requests at B = 8 (adaptive,
fixed:4, adaptive), each step's verify / draft time and acceptance by k, then the policy's acceptance, its verify
curve at B = 8, its draft curve by rows and its predicted rates for k = 0..8.

    python experiments/batch8_costs.py [BUNDLE]     (default: fp32-int4draft-std, docs/machines.md)

Prints per wave: wall seconds and {k: (steps, median verify ms, median draft ms, mean accepted per row)}.
"""

import statistics
import sys

from specedge.bench.batch import run_together
from specedge.bench.runner import load_prompts
from specedge.runtime import load

B = 8


def main(bundle: str) -> None:
    gen = load(bundle, max_batch=B, prompt_cache=False)
    prompts = load_prompts(None)
    base = dict(max_new_tokens=64, temperature=0.0, ignore_eos=True)
    for name in ("adaptive", "fixed:4", "adaptive"):
        before = len(gen.scheduler.events)
        _, wall = run_together(gen, prompts, B, {**base, "policy": name}, None)
        by_k = {}
        for e in list(gen.scheduler.events)[before:]:
            if e.batch == B:
                by_k.setdefault(max(e.k), []).append(e)
        summary = {k: (len(v), round(statistics.median(x.verify_s for x in v) * 1000),
                       round(statistics.median(x.draft_s for x in v) * 1000),
                       round(statistics.mean(sum(x.accepted) / B for x in v), 2)) for k, v in sorted(by_k.items())}
        print(name, f"wall {wall:.1f} s", summary)
    policy = gen.shared_policy("adaptive")
    costs = [policy.step_cost(k, B) for k in range(policy.max_draft + 1)]
    print("acceptance per position", [round(a, 2) for a in policy.acceptance()])
    print(f"verify curve at B = {B} (ms by T)", {t: round(v * 1000) for t, v in sorted(policy.costs.by_batch[B].seen.items())})
    print("draft step (ms by rows)", {r: round(v * 1000) for r, v in sorted(policy.costs.draft.seen.items())})
    print("step cost (ms by k)", [round(c * 1000) for c in costs])
    print("predicted tok/s by k", [round(r, 1) for r in policy._rates(costs, B)])


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "fp32-int4draft-std")
