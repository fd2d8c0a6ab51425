"""Host work per decode step: the step's wall time minus the time inside backend calls, and what the loop
spends outside steps (worker hand-off, text decoding, scheduling), per configuration.

    python scripts/host_work.py BUNDLE [--policies target,fixed:4] [--tokens 64] [--requests 6] [--max-batch 1]

Reads the runtime's own step records (Generator.events), so it measures exactly the loop users run.
On a tiny pair the host share shows; on a real pair it is lost in the model time.
"""

import argparse
import statistics
import sys

from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--policies", default="target,fixed:4")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--max-batch", type=int, default=1)
    args = parser.parse_args(argv)
    gen = load(args.bundle, max_batch=args.max_batch, prompt_cache=False)
    prompts = [row["prompt"] for row in BUILTIN_PROMPTS[:3]]
    for policy in args.policies.split(","):
        gen.generate(prompts[0], max_new_tokens=8, policy=policy)                 # warm-up
        start = len(gen.scheduler.events)
        results = [gen.generate(prompts[i % len(prompts)], max_new_tokens=args.tokens, policy=policy, ignore_eos=True)
                   for i in range(args.requests)]
        events = list(gen.scheduler.events)[start:]
        walls = [e.draft_s + e.verify_s for e in events]
        host = [w - e.model_s for w, e in zip(walls, events)]
        outside = [(r.stats.total_s - r.stats.prefill_s - r.stats.draft_s - r.stats.verify_s) /
                   max(r.stats.n_target_calls, 1) for r in results]
        print(f"{policy:<10} steps {len(events):4d}  step wall {1e3 * statistics.median(walls):7.3f} ms  "
              f"host in step {1e3 * statistics.median(host):6.3f} ms ({100 * sum(host) / sum(walls):4.1f}%)  "
              f"outside steps {1e3 * statistics.median(outside):6.3f} ms/step  "
              f"tok/s {statistics.median(r.stats.tokens_per_s for r in results):8.1f}")
    gen.close()


if __name__ == "__main__":
    main(sys.argv[1:])
