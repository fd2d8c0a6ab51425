"""One sequence driven by its caller (the library's default: the waiting caller runs the iterations) against the
same bundle driven by a worker thread (background=True, the server's engine), alternating, in one process.

    python experiments/pump_vs_worker.py BUNDLE [--rounds 3] [--tokens 64] [--policies target,adaptive]

Two generators on one bundle, both max_batch 8; each round runs the built-in prompts once per policy on each
(tokens over each request's generate time, prefill included); which side goes first alternates by round, so an
order effect shows as a per-round swing rather than a bias. A pair's threads spin only within a call, so the
idle generator takes no core. Prints per-round numbers, medians and worker / caller.
"""

import argparse
import statistics
import time

from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load


def run(gen, policy: str, tokens: int) -> float:
    n = seconds = 0.0
    for row in BUILTIN_PROMPTS:
        t = time.perf_counter()
        r = gen.generate(row["prompt"], chat=row.get("chat", False), policy=policy, max_new_tokens=tokens,
                         ignore_eos=True)
        seconds += time.perf_counter() - t
        n += len(r.tokens)
    return n / seconds


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--policies", default="target,adaptive")
    args = parser.parse_args()
    policies = args.policies.split(",")
    sides = {"caller": load(args.bundle, max_batch=8, prompt_cache=False),
             "worker": load(args.bundle, max_batch=8, background=True, prompt_cache=False)}
    for gen in sides.values():
        for p in policies:
            gen.generate(BUILTIN_PROMPTS[0]["prompt"], policy=p, max_new_tokens=8)
    tps = {(s, p): [] for s in sides for p in policies}
    for r in range(args.rounds):
        order = list(sides) if r % 2 == 0 else list(sides)[::-1]
        for p in policies:
            for s in order:
                tps[(s, p)].append(run(sides[s], p, args.tokens))
        print(f"round {r + 1}: " + ", ".join(f"{s} {p} {v[-1]:.2f}" for (s, p), v in tps.items()), flush=True)
    for p in policies:
        c, w = statistics.median(tps[("caller", p)]), statistics.median(tps[("worker", p)])
        print(f"{p}: caller {c:.2f}, worker {w:.2f} tok/s, worker / caller {w / c:.3f}")
    for gen in sides.values():
        gen.close()


if __name__ == "__main__":
    main()
