"""Drafters propose up to k tokens after the committed ones; the target decides.

`propose` returns the drafts and, when sampling, the distributions q they were drawn from ([n, V]);
a deterministic drafter (n-gram lookup) proposes with q one-hot, which keeps speculative sampling
exact: the draft is accepted with probability p(d), else the token is drawn from p without d.
When given `keep`, a drafter also leaves its confidence in each draft in `confidences` (the draft
model's probability of it; none for a lookup) and may stop early when `keep(confidences)` says so: that decision uses only the
draft side, so it changes how many tokens are checked, never which ones the target accepts.
"""

from __future__ import annotations

import numpy as np

from specedge.runtime.sampling import Warp, draw
from specedge.runtime.step_model import StepModel


class ModelDrafter:
    """A draft model with its own static KV buffers; catches up on committed tokens it has not seen.

    With a lighter head (`head_ids` [N], the token of each logit column) it proposes only those tokens
    and its distribution q is zero elsewhere, which keeps sampling exact: the target decides."""

    kind = "model"

    def __init__(self, model: StepModel, head_ids: np.ndarray | None = None, vocab_size: int | None = None):
        self.model, self.head_ids, self.vocab_size = model, head_ids, vocab_size
        self.confidences: list[float] = []

    def start(self, prompt_ids: list[int]) -> None:
        self.model.pos = 0
        self.model.feed(prompt_ids, last=1)

    def propose(self, tokens: list[int], k: int, warp: Warp, rng: np.random.Generator, keep=None):
        dft = self.model
        logits = dft.feed(tokens[dft.pos:], last=1)              # the 1-2 committed tokens it lacks
        drafts, q_rows, self.confidences = [], [], []
        for i in range(k):
            row = logits[-1]
            if warp.greedy:
                column = int(row.argmax())
            else:
                q = warp.probs(logits[-1:])[0]
                column = draw(q, rng)
                q_rows.append(q if self.head_ids is None else self._full_vocab(q))
            drafts.append(column if self.head_ids is None else int(self.head_ids[column]))
            if keep is not None:                                 # a softmax over V: only when asked
                self.confidences.append(float(q[column]) if not warp.greedy
                                        else float(1.0 / np.exp(row - row[column]).sum()))
            if i == k - 1 or (keep is not None and not keep(self.confidences)):
                break
            logits = dft.feed(drafts[-1:])
        return drafts, (np.stack(q_rows) if q_rows else None)

    def _full_vocab(self, q: np.ndarray) -> np.ndarray:
        full = np.zeros(self.vocab_size, q.dtype)                 # [V]: zero outside the head's tokens
        full[self.head_ids] = q
        return full

    def commit(self, n_valid: int) -> None:
        """The first n_valid tokens are committed and in the target's buffer; drop the rest."""
        self.model.pos = min(self.model.pos, n_valid)


class NgramDrafter:
    """Prompt lookup: continue the most recent earlier occurrence of the longest matching suffix."""

    kind = "ngram"

    def __init__(self, vocab_size: int, max_ngram: int = 3, min_ngram: int = 1):
        self.vocab_size, self.max_ngram, self.min_ngram = vocab_size, max_ngram, min_ngram
        self.confidences: list[float] = []

    def start(self, prompt_ids: list[int]) -> None:
        pass

    def lookup(self, tokens: list[int], k: int) -> list[int]:
        seq = np.asarray(tokens, dtype=np.int64)
        for n in range(min(self.max_ngram, len(seq) - 1), self.min_ngram - 1, -1):
            windows = np.lib.stride_tricks.sliding_window_view(seq[:-1], n)      # [L - n, n], excludes the suffix
            hits = np.flatnonzero((windows == seq[-n:]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                return seq[start:start + k].tolist()
        return []

    def propose(self, tokens: list[int], k: int, warp: Warp, rng: np.random.Generator, keep=None):
        drafts = self.lookup(tokens, k)
        self.confidences = []
        if warp.greedy or not drafts:
            return drafts, None
        q = np.zeros((len(drafts), self.vocab_size))
        q[np.arange(len(drafts)), drafts] = 1.0
        return drafts, q

    def commit(self, n_valid: int) -> None:
        pass


class HybridDrafter:
    """n-gram proposals where the committed text repeats itself, the draft model otherwise."""

    kind = "hybrid"

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter, min_match: int = 2):
        self.ngram, self.model = ngram, model
        self.ngram.min_ngram = min_match

    def start(self, prompt_ids: list[int]) -> None:
        self.model.start(prompt_ids)

    @property
    def confidences(self) -> list[float]:
        return self.model.confidences

    def propose(self, tokens, k, warp, rng, keep=None):
        drafts, q = self.ngram.propose(tokens, k, warp, rng)
        if drafts:
            self.model.confidences = []
            return drafts, q
        return self.model.propose(tokens, k, warp, rng, keep)

    def commit(self, n_valid: int) -> None:
        self.model.commit(n_valid)
