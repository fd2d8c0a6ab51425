"""Acceptance rules: the target decides every token.

Given drafts d[0..k-1] and the target's rows p[0..k] (row i judges d[i]; row k is the bonus row),
each rule returns (n_accepted, next_token): the committed tokens are d[:n_accepted] + [next_token].
"""

from __future__ import annotations

import numpy as np

from specedge.runtime.sampling import draw


def accept_greedy_ids(drafts: list[int], target_ids: np.ndarray) -> tuple[int, int]:
    """Longest prefix where the target's argmax ids [k + 1] equal the drafts, then the target's own token."""
    k = len(drafts)
    mismatch = np.flatnonzero(target_ids[:k] != np.asarray(drafts, dtype=target_ids.dtype))
    n = int(mismatch[0]) if mismatch.size else k
    return n, int(target_ids[n])


def accept_sampled(drafts: list[int], q: np.ndarray, p: np.ndarray, rng: np.random.Generator) -> tuple[int, int]:
    """Lossless speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    q [k, V]: the draft's warped distributions the drafts were drawn from; p [k + 1, V]: the target's.
    Accept d[i] with probability min(1, p_i(d) / q_i(d)); at the first rejection draw from
    norm(max(p_i - q_i, 0)); when all are accepted draw the bonus token from p_k.
    """
    for i, d in enumerate(drafts):
        if rng.random() * q[i, d] < p[i, d]:
            continue
        residual = np.maximum(p[i] - q[i], 0.0)
        if residual.sum() <= 0.0:      # p_i == q_i up to rounding: the rejection was rounding noise
            residual = p[i]
        return i, draw(residual, rng)
    return len(drafts), draw(p[len(drafts)], rng)


def judge(warp, rng: np.random.Generator, drafts: list[int], rows: np.ndarray, q: np.ndarray | None):
    """A row's verdict on its drafts. rows: the target's argmax ids [k + 1] or its logits [k + 1, V] (a prefill's
    last row alone when there are no drafts) -> (n_accepted, next_token, p: the warped target rows when the
    lossless rule ran, else None)."""
    if rows.dtype == np.int64:
        return (*accept_greedy_ids(drafts, rows), None)
    if warp.greedy:
        return (*accept_greedy_ids(drafts, rows.argmax(axis=-1)), None)
    if not drafts:
        return 0, draw(warp.probs(rows[-1:])[0], rng), None
    p = warp.probs(rows)
    return (*accept_sampled(drafts, q, p, rng), p)
