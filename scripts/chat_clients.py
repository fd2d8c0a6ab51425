"""Several chat clients, each holding its own conversation, against `specedge serve` with the prompt cache and
without it (two servers started one after the other on the same bundle), with the official openai client.

    python scripts/chat_clients.py BUNDLE [--clients 3] [--turns 3] [--max-tokens 48] [--max-batch 4]

Client i's first turn shows it a different part of specedge/runtime/scheduler.py (--context-lines lines) and asks
about it; later turns ask follow-ups, each sending the whole conversation. The clients run at once, turn by turn
(all clients' turn t, then turn t + 1), after one warm-up request per server. Prints, per turn, the median time to first token over the clients with
and without the cache, the cached prompt tokens the server reported, and whether every reply was identical
(greedy). Needs the `serve` extra and `openai`.
"""

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

import openai

from specedge.bench.serve import served

QUESTIONS = ["What does this code do? Two sentences.", "Which function here is the most complex? One sentence.",
             "Name one risk in it, in one sentence.", "Suggest a better name for one function."]


async def turn(client, messages: list[dict], max_tokens: int) -> dict:
    t, first, text, usage = time.perf_counter(), None, [], None
    stream = await client.chat.completions.create(model=client.model_id, messages=messages, max_tokens=max_tokens,
                                                  temperature=0, stream=True, stream_options={"include_usage": True})
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            first = first or time.perf_counter() - t
            text.append(chunk.choices[0].delta.content)
        if chunk.usage:
            usage = chunk.usage
    cached = usage.prompt_tokens_details.cached_tokens if usage.prompt_tokens_details else 0
    return {"ttft_s": first, "text": "".join(text), "prompt_tokens": usage.prompt_tokens, "cached_tokens": cached}


async def conversations(url: str, contexts: list[str], turns: int, max_tokens: int) -> list[list[dict]]:
    client = openai.AsyncOpenAI(base_url=url, api_key="-", max_retries=0, timeout=600)
    client.model_id = (await client.models.list()).data[0].id
    await client.completions.create(model=client.model_id, prompt="warm up", max_tokens=4)     # first calls are slow
    histories = [[{"role": "user", "content": f"```python\n{c}```\n{QUESTIONS[0]}"}] for c in contexts]
    out = [[] for _ in contexts]
    for t in range(turns):
        if t:
            for h in histories:
                h.append({"role": "user", "content": QUESTIONS[t % len(QUESTIONS)]})
        results = await asyncio.gather(*(turn(client, h, max_tokens) for h in histories))
        for i, r in enumerate(results):
            out[i].append(r)
            histories[i].append({"role": "assistant", "content": r["text"]})
    await client.close()
    return out


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--turns", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--context-lines", type=int, default=40)
    args = parser.parse_args(argv)
    lines = (Path(__file__).resolve().parents[1] / "specedge" / "runtime" / "scheduler.py").read_text().splitlines(
        keepends=True)
    contexts = ["".join(lines[i * args.context_lines: (i + 1) * args.context_lines]) for i in range(args.clients)]
    runs = {}
    for cache in (False, True):
        extra = ["--prompt-cache"] if cache else []               # served() starts with --no-prompt-cache
        with served(args.bundle, args.max_batch, extra_args=extra) as (url, _):
            runs[cache] = asyncio.run(conversations(url, contexts, args.turns, args.max_tokens))
        print(f"{'with' if cache else 'without'} the cache: done", file=sys.stderr)
    print(f"{args.bundle}: {args.clients} clients at once, {args.turns} turns, {args.max_tokens} tokens a reply, "
          f"--max-batch {args.max_batch}; medians over the clients")
    print(f"{'turn':>4} {'prompt':>7} {'cached':>7} {'TTFT cached':>11} {'TTFT full':>9} {'ratio':>6} {'same':>5}")
    for t in range(args.turns):
        c = [conv[t] for conv in runs[True]]
        f = [conv[t] for conv in runs[False]]
        ttft_c, ttft_f = statistics.median(x["ttft_s"] for x in c), statistics.median(x["ttft_s"] for x in f)
        same = all(a["text"] == b["text"] for a, b in zip(c, f))
        print(f"{t + 1:>4} {statistics.median(x['prompt_tokens'] for x in c):>7.0f} "
              f"{statistics.median(x['cached_tokens'] for x in c):>7.0f} {ttft_c:>10.2f}s {ttft_f:>8.2f}s "
              f"{ttft_f / ttft_c:>5.1f}x {str(same):>5}")


if __name__ == "__main__":
    main(sys.argv[1:])
