"""Log probabilities of committed tokens under the target's own distribution (log-softmax of its logits, before
temperature, top-k or top-p, as vLLM reports them by default), with the most likely alternatives.

Speculation does not change them: a verify row is bitwise the row a plain step computes, so a token's logprob is
the same whether it was drafted and accepted, or decoded by the target alone (tested).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MAX_TOP_LOGPROBS = 20          # OpenAI's limit for top_logprobs


@dataclass(frozen=True)
class TokenLogprob:
    token: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()     # the `n` most likely tokens at this position, most likely first

    def to_json(self) -> dict:
        return {"token": self.token, "logprob": self.logprob, "top": [list(pair) for pair in self.top]}


def token_logprobs(logits: np.ndarray, tokens: list[int], top: int) -> list[TokenLogprob]:
    """logits [n, V] (row i: the distribution token i was chosen from), tokens [n] -> one TokenLogprob each.

    The values are those of a float64 log-softmax, bit for bit: each row's normaliser is a float64 sum (exp of the
    row less its peak, which widens the row once), but the log-probabilities themselves, and the top's selection
    (one partition of the float32 rows), touch only the tokens asked for. A prefill chunk that scores a prompt
    passes 64 rows of 151,936 logits; a whole float64 log-softmax, then a sort of it, cost several times this."""
    x = np.asarray(logits[: len(tokens)])
    if x.dtype not in (np.float32, np.float64):
        x = x.astype(np.float32)
    peak = x.max(axis=-1, keepdims=True).astype(np.float64)                       # [n, 1]
    log_z = peak + np.log(np.exp(x - peak).sum(axis=-1, keepdims=True))          # [n, 1], float64
    best = _top_ids(x, top) if top else [()] * len(tokens)
    out = []
    for row, z, token, ids in zip(x, log_z[:, 0], tokens, best):
        logp = {i: float(np.float64(row[i]) - z) for i in (token, *ids)}
        ranked = sorted(ids, key=lambda i: (-logp[i], i))                     # ties: the lower id first, as argmax
        out.append(TokenLogprob(int(token), logp[token], tuple((i, logp[i]) for i in ranked)))
    return out


def _top_ids(x: np.ndarray, top: int) -> list[list[int]]:
    """x [n, V] -> each row's `top` largest ids (ties at the cut: the lower ids), in no particular order."""
    size = x.shape[-1]
    if top >= size:
        return [list(range(size))] * len(x)
    cut = np.partition(x, size - top, axis=-1)[:, size - top]                  # [n]: each row's top-th largest
    out = []
    for row, value in zip(x, cut):
        above = np.flatnonzero(row > value)
        at = np.flatnonzero(row == value)[: top - above.size]
        out.append(above.tolist() + at.tolist())
    return out
