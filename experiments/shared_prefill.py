"""Requests sharing a prompt at once (n choices, or clients with one system prompt): the wait-then-copy of
scheduler._waits_for_a_prefill on and off, side by side in one run (interleaved repeats, medians).

    python experiments/shared_prefill.py BUNDLE [--requests 4] [--repeat 3]

BUNDLE: a `standard` bundle (several rows at once). Prints the seconds until every request has its first token
and until all are done, and the prefill chunks run, per setting.
"""

import argparse
import statistics
import time
from pathlib import Path

from specedge.runtime import load
from specedge.runtime.scheduler import Scheduler

PROMPT_FILE = Path(__file__).resolve().parents[1] / "specedge" / "runtime" / "scheduler.py"


def run(gen, prompt: str, requests: int) -> dict:
    gen.clear_prompt_cache()
    chunks = gen.counters.get("prefill_chunks", 0)
    started, firsts = time.perf_counter(), []
    with gen.scheduler.wake:
        streams = [gen.stream(prompt, max_new_tokens=32, ignore_eos=True, policy="adaptive")
                   for _ in range(requests)]
    for stream in streams:
        next(iter(stream))
        firsts.append(time.perf_counter() - started)
    results = [s.wait() for s in streams]
    return {"first_tokens_s": max(firsts), "all_done_s": time.perf_counter() - started,
            "prefill_chunks": gen.counters["prefill_chunks"] - chunks, "tokens": [r.tokens for r in results]}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    gen = load(args.bundle, max_batch=args.requests)
    prompt = PROMPT_FILE.read_text()[:2400]
    print(f"prompt: {len(gen.encode(prompt))} tokens, {args.requests} requests at once")
    original = Scheduler._waits_for_a_prefill
    rows = {"off": [], "on": []}
    for _ in range(args.repeat):
        for setting in ("off", "on"):
            Scheduler._waits_for_a_prefill = original if setting == "on" else (lambda self, seq: False)
            rows[setting].append(run(gen, prompt, args.requests))
    Scheduler._waits_for_a_prefill = original
    assert all(r["tokens"] == rows["off"][0]["tokens"] for r in rows["off"] + rows["on"])      # same output
    for setting, runs in rows.items():
        print(f"{setting:>3}: every first token {statistics.median(r['first_tokens_s'] for r in runs):6.2f} s, "
              f"all done {statistics.median(r['all_done_s'] for r in runs):6.2f} s, "
              f"prefill chunks {statistics.median(r['prefill_chunks'] for r in runs):.0f}")
    on, off = (statistics.median(r["all_done_s"] for r in rows[s]) for s in ("on", "off"))
    print(f"all done: {off / on:.2f}x faster with the wait-then-copy; greedy outputs identical")
    gen.close()


if __name__ == "__main__":
    main()
