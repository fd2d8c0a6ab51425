"""Who drafts: the draft model (batched in runtime/batch_step.py), prompt lookup, or both.

Prompt lookup continues the most recent earlier occurrence of the longest matching suffix of the committed
tokens; it costs no model call. Its proposals are deterministic (q one-hot), which keeps speculative
sampling exact: a draft is accepted with probability p(d), else the token is drawn from p without d.
"hybrid" takes a lookup where the text repeats itself (at least `min_match` tokens) and the model otherwise.
"""

from __future__ import annotations

import numpy as np


def lookup(tokens: list[int], k: int, max_ngram: int = 3, min_ngram: int = 1) -> list[int]:
    seq = np.asarray(tokens, dtype=np.int64)
    for n in range(min(max_ngram, len(seq) - 1), min_ngram - 1, -1):
        windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)      # [L - n, n], excludes the suffix
        hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
        if hits.size:
            start = int(hits[-1]) + n
            return seq[start:start + k].tolist()
    return []


HYBRID_MIN_MATCH = 2


def lookup_for(drafter: str, tokens: list[int], k: int) -> list[int]:
    """The lookup proposals of an "ngram" or "hybrid" drafter ([] when it has none or is a model drafter)."""
    if drafter == "ngram":
        return lookup(tokens, k)
    if drafter == "hybrid":
        return lookup(tokens, k, min_ngram=HYBRID_MIN_MATCH)
    return []


def one_hot(drafts: list[int], vocab_size: int) -> np.ndarray:
    """q of deterministic proposals [n, V]."""
    q = np.zeros((len(drafts), vocab_size))
    q[np.arange(len(drafts)), drafts] = 1.0
    return q
