"""Structured output's cost and speculation under it: chat prompts asking for JSON, with and without a JSON schema
response_format, per policy; tokens/s (prefill included), acceptance, and whether the constrained outputs equal the
target-only constrained ones (greedy).

    python experiments/structured_speed.py BUNDLE [--policies target,fixed:4,adaptive] [--repeat 2]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

from specedge.runtime import load

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "language": {"type": "string"},
    "parameters": {"type": "array", "items": {"type": "string"}}, "returns": {"type": "string"},
    "summary": {"type": "string"}},
    "required": ["name", "language", "parameters", "returns", "summary"], "additionalProperties": False}
PROMPTS = [
    "Describe this function as JSON with keys name, language, parameters, returns, summary:\n\n"
    "def binary_search(items, target):\n    lo, hi = 0, len(items) - 1\n    while lo <= hi:\n"
    "        mid = (lo + hi) // 2\n        if items[mid] == target:\n            return mid\n"
    "        if items[mid] < target:\n            lo = mid + 1\n"
    "        else:\n            hi = mid - 1\n    return -1\n",
    "Describe this function as JSON with keys name, language, parameters, returns, summary:\n\n"
    "function debounce(fn, wait) {\n  let timer;\n  return (...args) => {\n    clearTimeout(timer);\n"
    "    timer = setTimeout(() => fn(...args), wait);\n  };\n}\n",
]
FORMAT = {"type": "json_schema", "json_schema": {"name": "function", "schema": SCHEMA}}


def _is_object(text: str) -> bool:
    """Whether a reply is a JSON object (a free reply may wrap it in a markdown fence)."""
    text = text.replace("<|im_end|>", "").strip().removeprefix("```json").removeprefix("```").removesuffix("```")
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("bundle")
    ap.add_argument("--policies", default="target,fixed:4,adaptive")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    args = ap.parse_args()
    gen = load(args.bundle, prompt_cache=False)
    rows = {}
    for _ in range(args.repeat):
        for constrained in (False, True):
            for policy in args.policies.split(","):
                for i, prompt in enumerate(PROMPTS):
                    extra = {"response_format": FORMAT} if constrained else {}
                    t = time.perf_counter()
                    r = gen.chat([{"role": "user", "content": prompt}], max_new_tokens=args.max_new_tokens,
                                 policy=policy, **extra)
                    seconds = time.perf_counter() - t
                    cell = rows.setdefault((constrained, policy, i), {"tps": [], "tokens": r.tokens, "stats": r.stats})
                    cell["tps"].append(len(r.tokens) / seconds)
    print(f"{'format':8} {'policy':10} {'tok/s':>7} {'vs target':>9} {'acc len':>7} same  valid")
    for constrained in (False, True):
        for policy in args.policies.split(","):
            tps = [statistics.median(rows[(constrained, policy, i)]["tps"]) for i in range(len(PROMPTS))]
            base = [statistics.median(rows[(constrained, "target", i)]["tps"]) for i in range(len(PROMPTS))] \
                if "target" in args.policies.split(",") else tps
            same = all(rows[(constrained, policy, i)]["tokens"] == rows[(constrained, args.policies.split(",")[0], i)]
                       ["tokens"] for i in range(len(PROMPTS)))
            valid = [_is_object(gen.decode(rows[(constrained, policy, i)]["tokens"])) for i in range(len(PROMPTS))]
            acc = statistics.mean(rows[(constrained, policy, i)]["stats"].to_json()["mean_accepted_length"]
                                  for i in range(len(PROMPTS)))
            print(f"{'schema' if constrained else 'free':8} {policy:10} {statistics.mean(tps):7.2f} "
                  f"{statistics.mean(t / b for t, b in zip(tps, base)):8.2f}x {acc:7.2f} {str(same):5} "
                  f"{sum(valid)}/{len(valid)}")


if __name__ == "__main__":
    main()
