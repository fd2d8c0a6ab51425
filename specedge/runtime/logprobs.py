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
    """logits [n, V] (row i: the distribution token i was chosen from), tokens [n] -> one TokenLogprob each."""
    x = np.asarray(logits[: len(tokens)], dtype=np.float64)
    peak = x.max(axis=-1, keepdims=True)
    logp = x - (peak + np.log(np.exp(x - peak).sum(axis=-1, keepdims=True)))
    out = []
    for row, token in zip(logp, tokens):
        best = ()
        if top:
            ids = np.argpartition(-row, top - 1)[:top] if top < row.size else np.arange(row.size)
            ids = sorted(ids.tolist(), key=lambda i: (-row[i], i))          # ties: the lower id first, as argmax
            best = tuple((i, float(row[i])) for i in ids)
        out.append(TokenLogprob(int(token), float(row[token]), best))
    return out
