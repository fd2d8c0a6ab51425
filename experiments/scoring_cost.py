"""What scoring a prompt costs (`prompt_logprobs`, the server's `echo` with `logprobs`): one prompt prefilled
with one new token, without scores, with each token's own logprob and with 5 alternatives, under the current
log-softmax and under the one before 2026-12-07 (every row widened to float64, the top by a float64
argpartition per row), alternating in one process.

    python experiments/scoring_cost.py BUNDLE [--prompt-tokens 320] [--rounds 3]

Prints the median seconds per setting and the ratio to the unscored prefill; checks the scores agree.
"""

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

import specedge.runtime.scheduler as scheduler
from specedge.runtime import load
from specedge.runtime.logprobs import TokenLogprob, token_logprobs


def before(logits, tokens, top):
    """The log-softmax as it was: every row widened, the top by argpartition on float64 rows."""
    x = np.asarray(logits[: len(tokens)], dtype=np.float64)
    peak = x.max(axis=-1, keepdims=True)
    logp = x - (peak + np.log(np.exp(x - peak).sum(axis=-1, keepdims=True)))
    out = []
    for row, token in zip(logp, tokens):
        best = ()
        if top:
            ids = np.argpartition(-row, top - 1)[:top] if top < row.size else np.arange(row.size)
            best = tuple((i, float(row[i])) for i in sorted(ids.tolist(), key=lambda i: (-row[i], i)))
        out.append(TokenLogprob(int(token), float(row[token]), best))
    return out


SETTINGS = {"unscored": (None, token_logprobs), "own": (0, token_logprobs), "top 5": (5, token_logprobs),
            "own, before": (0, before), "top 5, before": (5, before)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--prompt-tokens", type=int, default=320)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gen = load(args.bundle, prompt_cache=False)
    source = Path(scheduler.__file__).read_text()
    prompt_ids = gen.encode(source)[: args.prompt_tokens]
    options = dict(max_new_tokens=1, policy="target")
    gen.generate_ids(prompt_ids[:64], **options)                                         # warm-up
    seconds = {name: [] for name in SETTINGS}
    scores = {}
    for r in range(args.rounds):
        for name in (list(SETTINGS) if r % 2 == 0 else list(SETTINGS)[::-1]):
            top, function = SETTINGS[name]
            scheduler.token_logprobs = function
            start = time.perf_counter()
            result = gen.generate_ids(prompt_ids, **options, prompt_logprobs=top)
            seconds[name].append(time.perf_counter() - start)
            scores[name] = result.prompt_logprobs
    scheduler.token_logprobs = token_logprobs
    base = statistics.median(seconds["unscored"])
    print(f"{args.bundle}: a {len(prompt_ids)}-token prompt and 1 new token, medians of {args.rounds}")
    for name in SETTINGS:
        m = statistics.median(seconds[name])
        print(f"{name:<14} {m:6.3f} s  {m / base:5.3f}x the unscored prefill")
    same = scores["own"] == scores["own, before"] and scores["top 5"] == scores["top 5, before"]
    print(f"scores identical before and now: {same}")


if __name__ == "__main__":
    main()
