"""A request that shares a long system prompt with one already running: its time to first text when the prompt
cache copies the running request's prefix, against the same request prefilling everything.

    python experiments/shared_system_prompt.py BUNDLE        (a `standard` bundle: two requests at once)

Request A (40 lines of specedge/runtime/scheduler.py as the system prompt, a question) starts and runs; request B
(the same system prompt, another question, 8 tokens) arrives while A decodes. Run once with the cache and once
with it off for B; prints B's prompt and cached tokens, time to first text, and its first tokens (the same).
"""

import sys
import time
from pathlib import Path

from specedge.runtime import load


def main(bundle: str) -> None:
    gen = load(bundle, max_batch=2)
    lines = (Path(__file__).resolve().parents[1] / "specedge" / "runtime" / "scheduler.py").read_text()
    system = "You review this code:\n" + "".join(lines.splitlines(keepends=True)[:40])

    def messages(question: str) -> list[dict]:
        return [{"role": "system", "content": system}, {"role": "user", "content": question}]

    gen.chat(messages("warm up"), max_new_tokens=2)
    for shared in (True, False):
        gen.clear_prompt_cache()
        a = gen.stream_chat(messages("What does _admit do?"), max_new_tokens=200, ignore_eos=True)
        next(iter(a))                                  # A has prefilled the system prompt and decodes
        gen.scheduler.cache.enabled = shared           # the experiment's switch for B alone
        t, first = time.perf_counter(), None
        b = gen.stream_chat(messages("And _retire?"), max_new_tokens=8)
        for piece in b:
            if piece and first is None:
                first = time.perf_counter() - t
        gen.scheduler.cache.enabled = True
        a.cancel()
        a.wait()
        s = b.result.stats
        print(f"{'shared' if shared else 'alone '}: B prompt {s.prompt_tokens} tokens, {s.cached_prompt_tokens} from "
              f"the cache, first text after {first:.2f} s, first tokens {b.result.tokens[:6]}")
    gen.close()


if __name__ == "__main__":
    main(sys.argv[1])
