"""The asyncio API on a real bundle: `agenerate` against `generate` and the target alone, the same prompt, one
process (tokens must be identical; the speeds are one run each, a sanity check, not a benchmark).

    python experiments/async_equality.py BUNDLE [--max-new-tokens 64]
"""

import argparse
import asyncio
import time

from specedge.runtime import load


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("bundle")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    args = parser.parse_args()
    gen, prompt, n = load(args.bundle), "def quicksort(xs):\n", args.max_new_tokens
    gen.generate(prompt, max_new_tokens=8)                                  # warm-up

    def timed(call):
        start = time.perf_counter()
        result = call()
        return result, n / (time.perf_counter() - start)

    sync, sync_tps = timed(lambda: gen.generate(prompt, max_new_tokens=n, ignore_eos=True, policy="adaptive"))
    alone, alone_tps = timed(lambda: gen.generate(prompt, max_new_tokens=n, ignore_eos=True, use_draft=False, k=0))
    run = asyncio.run
    asynced, async_tps = timed(lambda: run(gen.agenerate(prompt, max_new_tokens=n, ignore_eos=True, policy="adaptive")))
    print(f"tokens identical: {sync.tokens == alone.tokens == asynced.tokens}; tok/s: generate adaptive "
          f"{sync_tps:.1f}, agenerate adaptive {async_tps:.1f}, target alone {alone_tps:.1f}")
    gen.close()


if __name__ == "__main__":
    main()
