"""What a policy costs under concurrent load without the server: C client threads on one background generator
(the server's engine, no HTTP), each running requests one after another, policies alternating within each repeat
(reversed on every other).

    python experiments/concurrent_trace.py BUNDLE [--concurrency 16] [--policies target,adaptive]
        [--repeat 3] [--tokens 64] [--requests 32] [--out trace.json]

A cell is `--requests` requests (the built-in prompts cycled, greedy, ignore_eos) over C threads; it reports
output tokens / wall and takes the cell's step records apart: steps, rows per step, k, draft calls, catch-up
tokens and seconds, prefill chunks, time in the draft phase and the verify phase. Medians over repeats; --out also
keeps every step of every cell (batch, k per row, draft calls, catch-up tokens, draft and verify seconds).
"""

import argparse
import json
import statistics
import threading
import time

from specedge.bench.batch import last_events
from specedge.bench.order import alternating
from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load
from specedge.serve.steps import step_view


def cell(gen, policy: str, concurrency: int, n_requests: int, tokens: int) -> dict:
    todo = list(range(n_requests))
    lock = threading.Lock()
    results = []

    def client():
        while True:
            with lock:
                if not todo:
                    return
                i = todo.pop(0)
            row = BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)]
            r = gen.generate(row["prompt"], chat=row.get("chat", False), policy=policy, max_new_tokens=tokens,
                             ignore_eos=True)
            with lock:
                results.append(r)

    before = gen.counters
    t = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(concurrency)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    wall = time.perf_counter() - t
    after = gen.counters
    steps = [step_view(e) for e in last_events(gen, after.get("steps", 0) - before.get("steps", 0))]
    n_tokens = sum(len(r.tokens) for r in results)
    return steps, {
        "tok_per_s": n_tokens / wall, "wall_s": wall, "tokens": n_tokens, **step_totals(steps),
        "prefill_chunks": after.get("prefill_chunks", 0) - before.get("prefill_chunks", 0),
        "prefill_s": sum(r.stats.prefill_s for r in results),
    }


def step_totals(steps: list[dict]) -> dict:
    """What a cell's steps (step_view dicts) did and cost, summed (serve_trace.py too)."""
    return {
        "steps": len(steps), "rows_mean": statistics.mean(s["batch"] for s in steps) if steps else 0.0,
        "k_pos_steps": sum(1 for s in steps if max(s["k"], default=0)),
        "draft_calls": sum(s["draft_calls"] for s in steps),
        "catch_up_tokens": sum(s["catch_up_tokens"] for s in steps),
        "catch_up_s": sum(s["catch_up_s"] for s in steps), "draft_s": sum(s["draft_s"] for s in steps),
        "verify_s": sum(s["verify_s"] for s in steps), "model_s": sum(s["model_s"] for s in steps),
    }


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--policies", default="target,adaptive")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--max-batch", type=int, default=8)
    parser.add_argument("--out")
    args = parser.parse_args()
    policies = args.policies.split(",")
    gen = load(args.bundle, max_batch=args.max_batch, max_queue=256, background=True, prompt_cache=False)
    for p in policies:                                    # warm-up, as bench-serve's
        cell(gen, p, 1, 1, args.tokens)
    cells, step_logs = {p: [] for p in policies}, {p: [] for p in policies}
    for r in range(args.repeat):
        for p in alternating(policies, r):
            steps, c = cell(gen, p, args.concurrency, args.requests, args.tokens)
            cells[p].append(c)
            step_logs[p].append(steps)
            print(f"repeat {r + 1} {p}: {json.dumps({k: round(v, 3) for k, v in c.items()})}", flush=True)
    gen.close()
    report(cells, step_logs, args)


def report(cells: dict, step_logs: dict, args) -> None:
    """Medians per policy over its cells; with --out, every cell and every step as JSON (serve_trace.py too)."""
    print("medians:")
    for p, runs in cells.items():
        med = {k: statistics.median(c[k] for c in runs) for k in runs[0]}
        print(f"  {p}: {json.dumps({k: round(v, 3) for k, v in med.items()})}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "cells": cells, "steps": step_logs}, f)


if __name__ == "__main__":
    main()
