"""Warping logits into sampling distributions, and drawing from them reproducibly.

The same `Warp` turns target logits into p and draft logits into q, so speculative sampling is exact
with respect to the warped target distribution (temperature, then top-k, then top-p, as HF does).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specedge.errors import SpecedgeError


@dataclass(frozen=True)
class Warp:
    temperature: float = 0.0   # 0 means greedy
    top_k: int = 0             # 0 means off
    top_p: float = 1.0         # 1 means off

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def probs(self, logits: np.ndarray) -> np.ndarray:
        """logits [N, V] -> probabilities [N, V] (float64 so that p/q ratios are not rounding noise)."""
        x = np.asarray(logits, dtype=np.float64)
        # the largest logit subtracted before dividing: a tiny temperature then sends the others to -inf (exp 0)
        # instead of overflowing every logit to inf (inf - inf is nan)
        with np.errstate(over="ignore", invalid="ignore"):           # inf - inf: NaN, refused below
            x = (x - x.max(axis=-1, keepdims=True)) / self.temperature
        if 0 < self.top_k < x.shape[-1]:
            kth = np.partition(x, -self.top_k, axis=-1)[:, -self.top_k][:, None]
            x = np.where(x >= kth, x, -np.inf)
        x = np.exp(x)
        total = x.sum(axis=-1, keepdims=True)
        if not np.all(np.isfinite(total) & (total > 0)):     # NaN or inf logits: a sample would be noise
            raise SpecedgeError("the model's logits are not finite (NaN or inf) at this step: a float16 graph "
                                "overflows here, or its weights are damaged")
        p = x / total
        if self.top_p < 1.0:
            p = _nucleus(p, self.top_p)
        return p


def _nucleus(p: np.ndarray, top_p: float) -> np.ndarray:
    """Keeps the smallest set of most likely tokens whose mass reaches top_p (at least one), renormalised."""
    order = np.argsort(-p, axis=-1, kind="stable")
    sorted_p = np.take_along_axis(p, order, axis=-1)
    before = np.cumsum(sorted_p, axis=-1) - sorted_p        # mass strictly above each token
    keep_sorted = before < top_p
    keep = np.zeros_like(keep_sorted)
    np.put_along_axis(keep, order, keep_sorted, axis=-1)
    p = np.where(keep, p, 0.0)
    return p / p.sum(axis=-1, keepdims=True)


def draw(p: np.ndarray, rng: np.random.Generator) -> int:
    """One token from a probability row p [V], by inverse CDF (one uniform per draw)."""
    cdf = np.cumsum(p)
    return int(min(np.searchsorted(cdf, rng.random() * cdf[-1], side="right"), len(p) - 1))
