"""A conversation about a source file, with and without the prompt cache, side by side in one process.

    python scripts/prompt_cache.py BUNDLE [--repeat 3] [--max-new-tokens 64] [--policy adaptive] [--out F.json]

Turn 1 shows the model a file (the first --context-lines of specedge/runtime/scheduler.py) and asks about it; turns
2 and 3 ask follow-ups, each sending the whole conversation (as a chat app does). Each round runs the conversation
twice, cached and prefilling everything (the cache cleared before each turn), in alternating order; the cache is
cleared before turn 1 either way. Prints, per turn, the median time to first token and to the whole reply, the
prompt tokens and how many came from the cache, and whether the replies were identical (greedy).
"""

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

from specedge.runtime import load

QUESTIONS = ["What does `_admit` do? Answer in two sentences.", "And `_retire`? Two sentences.",
             "Name one risk in this code, in one sentence."]


def conversation(gen, context: str, options: dict, cached: bool) -> list[dict]:
    messages, turns = [], []
    for i, question in enumerate(QUESTIONS):
        content = f"Here is a file:\n```python\n{context}```\n{question}" if i == 0 else question
        messages.append({"role": "user", "content": content})
        if i == 0 or not cached:
            gen.clear_prompt_cache()
        t = time.perf_counter()
        first = None
        stream = gen.stream_chat(messages, **options)
        for piece in stream:
            if piece and first is None:
                first = time.perf_counter() - t
        total = time.perf_counter() - t
        s = stream.result.stats
        turns.append({"ttft_s": first, "total_s": total, "prompt_tokens": s.prompt_tokens,
                      "cached_tokens": s.cached_prompt_tokens, "new_tokens": s.new_tokens,
                      "tokens": stream.result.tokens})
        messages.append({"role": "assistant", "content": stream.result.text})
    return turns


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--policy", default="adaptive")
    parser.add_argument("--context-lines", type=int, default=60)
    parser.add_argument("--out", default=None, help="Also write every round's figures here (JSON).")
    args = parser.parse_args(argv)
    source = Path(__file__).resolve().parents[1] / "specedge" / "runtime" / "scheduler.py"
    context = "".join(source.read_text().splitlines(keepends=True)[: args.context_lines])
    gen = load(args.bundle)
    options = dict(max_new_tokens=args.max_new_tokens, policy=args.policy if gen.draft is not None else "target")
    conversation(gen, context, dict(options, max_new_tokens=4), cached=True)          # warm-up, excluded
    rounds = {True: [], False: []}
    for r in range(args.repeat):
        for cached in ((True, False) if r % 2 == 0 else (False, True)):
            rounds[cached].append(conversation(gen, context, options, cached))
        print(f"round {r + 1}/{args.repeat} done", file=sys.stderr)
    print(f"{args.bundle}, policy {options['policy']}, {args.max_new_tokens} new tokens a turn, "
          f"medians of {args.repeat}")
    print(f"{'turn':>4} {'prompt':>6} {'cached':>6} {'TTFT cached':>11} {'TTFT full':>9} {'ratio':>6} "
          f"{'reply cached':>12} {'reply full':>10} {'same reply':>10}")
    for t in range(len(QUESTIONS)):
        c = [conv[t] for conv in rounds[True]]
        f = [conv[t] for conv in rounds[False]]
        ttft_c, ttft_f = (statistics.median(x["ttft_s"] for x in runs) for runs in (c, f))
        tot_c, tot_f = (statistics.median(x["total_s"] for x in runs) for runs in (c, f))
        same = all(a["tokens"] == b["tokens"] for a, b in zip(c, f))
        print(f"{t + 1:>4} {c[0]['prompt_tokens']:>6} {c[0]['cached_tokens']:>6} {ttft_c:>10.2f}s {ttft_f:>8.2f}s "
              f"{ttft_f / ttft_c:>5.1f}x {tot_c:>11.2f}s {tot_f:>9.2f}s {str(same):>10}")
    if args.out:
        Path(args.out).write_text(json.dumps({"bundle": args.bundle, "options": options, "rounds": {
            "cached": rounds[True], "full": rounds[False]}}, indent=1))
    gen.close()


if __name__ == "__main__":
    main(sys.argv[1:])
