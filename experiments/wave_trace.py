"""One batch size of `specedge bench --batch`, wave by wave, taken apart: where a policy's wave spends its time.

    python experiments/wave_trace.py BUNDLE [--batch 4] [--policies target,adaptive] [--rounds 3] [--tokens 64]

Each round runs the 8 built-in requests (prompts cycled) in waves of --batch, every policy's wave i before any
policy's wave i + 1, the order reversing from wave to wave (as bench's --interleave wave). Per wave: wall seconds,
prefill, the decode steps' draft phase (catch-up included), verify phase, what is left (host work between
steps), page faults of this process (major faults would mean weights read back from disk) and the CPU seconds
of the kernel's kdamond threads (proactive reclaim on this machine), then the sums per policy. --out writes the waves and every decode step (serve.steps.step_view) as JSON.
"""

import argparse
import json
import resource
from pathlib import Path

from concurrent_trace import step_totals

from specedge.bench.batch import last_events, run_together
from specedge.bench.order import alternating
from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load
from specedge.serve.steps import step_view

REQUESTS = 8


def kdamond_cpu_s() -> float:
    """CPU seconds of all kdamond kernel threads so far (0 where there are none)."""
    total = 0.0
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            text = stat.read_text()
        except OSError:
            continue
        if "(kdamond" in text:
            fields = text.rsplit(")", 1)[1].split()
            total += (int(fields[11]) + int(fields[12])) / 100
    return total


def wave(gen, policy: str, batch: int, first: int, tokens: int) -> tuple[dict, list[dict]]:
    """-> (the wave's sums, its decode steps as step_view dicts)"""
    options = dict(max_new_tokens=tokens, temperature=0.0, ignore_eos=True, policy=policy)
    before, usage, kd = gen.counters, resource.getrusage(resource.RUSAGE_SELF), kdamond_cpu_s()
    results, wall = run_together(gen, list(BUILTIN_PROMPTS), batch, options, None, first)
    after, usage_after = gen.counters, resource.getrusage(resource.RUSAGE_SELF)
    steps = [step_view(e) for e in last_events(gen, after["steps"] - before["steps"])]
    totals = step_totals(steps)
    prefill = sum(r.stats.prefill_s for r in results)
    return {"wall_s": wall, "tokens": sum(len(r.tokens) for r in results), "prefill_s": prefill, **totals,
            "other_s": wall - prefill - totals["draft_s"] - totals["verify_s"],
            "major_faults": usage_after.ru_majflt - usage.ru_majflt,
            "minor_faults": usage_after.ru_minflt - usage.ru_minflt, "kdamond_s": kdamond_cpu_s() - kd}, steps


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--policies", default="target,adaptive")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out")
    args = parser.parse_args()
    policies = args.policies.split(",")
    gen = load(args.bundle, max_batch=max(8, args.batch), prompt_cache=False)
    for p in policies:                                         # warm-up, as bench's
        run_together(gen, list(BUILTIN_PROMPTS), REQUESTS, dict(max_new_tokens=8, ignore_eos=True, policy=p), None)
    waves, steps = {p: [] for p in policies}, {p: [] for p in policies}
    for r in range(args.rounds):
        for w, first in enumerate(range(0, REQUESTS, args.batch)):
            for p in alternating(policies, r + w):
                row, wave_steps = wave(gen, p, args.batch, first, args.tokens)
                waves[p].append(row)
                steps[p].append(wave_steps)
                print(f"round {r + 1} wave {w + 1} {p}: {json.dumps({k: round(v, 3) for k, v in row.items()})}",
                      flush=True)
    for p, rows in waves.items():
        print(f"{p} sum: {json.dumps({k: round(sum(x[k] for x in rows), 3) for k in rows[0]})}")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "waves": waves, "steps": steps}))


if __name__ == "__main__":
    main()
