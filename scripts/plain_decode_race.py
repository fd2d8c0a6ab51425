"""The shared loop of compare_genai.py and compare_transformers.py: another engine and specedge decode the
built-in prompts target-only, alternating per prompt so drift hits both alike; prints median tokens/s."""

import statistics
import sys


def race(name: str, theirs, gen, prompts: list[list[int]], n: int, repeat: int) -> None:
    """theirs(ids, n) -> (tokens, seconds); specedge runs gen.generate_ids with eos ignored."""
    rates, same = {name: [], "specedge": []}, []
    for r in range(repeat):
        work = {engine: [0, 0.0] for engine in rates}                       # tokens, seconds
        for ids in prompts:
            their_tokens, seconds = theirs(ids, n)
            ours = gen.generate_ids(ids, max_new_tokens=n, use_draft=False, k=0, ignore_eos=True)
            for engine, tokens, s in ((name, their_tokens, seconds), ("specedge", ours.tokens, ours.stats.total_s)):
                work[engine][0] += len(tokens)
                work[engine][1] += s
            same.append(their_tokens == ours.tokens)
        for engine, (tokens, seconds) in work.items():
            rates[engine].append(tokens / seconds)
        print(f"round {r + 1}/{repeat} done", file=sys.stderr)
    base = statistics.median(rates[name])
    for engine, values in rates.items():
        median = statistics.median(values)
        print(f"{engine:<18} {median:6.2f} tok/s  {median / base:5.2f}x   per round {['%.2f' % v for v in values]}")
    print(f"same tokens on {sum(same)}/{len(same)} prompt runs")
