"""Repetition penalties on the target's (and the draft's) logits, as vLLM applies them: OpenAI's presence and
frequency penalties over the generated tokens, and the multiplicative repetition penalty (CTRL's, llama.cpp's
repeat penalty) over prompt and generated tokens alike; and OpenAI's logit_bias, added before them (vLLM's order).

Under speculation a verify row judges the token after the drafts before it, so row j is penalised as if those
drafts were already generated: the target decides exactly as it would one token at a time (tests check this against
a one-token-at-a-time reference). The draft's rows get the same treatment, so that its drafts are what the target
would pick more often; the lossless rule holds whatever distribution drafts came from.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class Penalties:
    """One request's penalties (it caches its prompt's distinct ids: a 30k-token prompt is not re-read per row)."""
    presence: float = 0.0          # subtracted once from every token already generated
    frequency: float = 0.0         # subtracted per time a token was generated
    repetition: float = 1.0        # > 1: a seen token's positive logit divided, negative multiplied (prompt included)
    bias: tuple = ()               # ((token id, added to its logit), ...): OpenAI's logit_bias, added first (as vLLM)
    _prompt: tuple | None = field(default=None, repr=False)    # (the prompt, its distinct ids as array and set)

    @property
    def active(self) -> bool:
        return self.presence != 0.0 or self.frequency != 0.0 or self.repetition != 1.0 or bool(self.bias)

    def apply(self, logits: np.ndarray, prompt: list[int], generated: list[int], drafts: list[int]) -> np.ndarray:
        """logits [n, V]: row j follows prompt + generated + drafts[:j] -> a penalised float32 copy (only the columns
        of tokens seen are touched: a row of 150k logits is copied, not recomputed)."""
        out = np.array(logits, dtype=np.float32, copy=True)
        vocab = out.shape[-1]
        if self.bias:
            ids, values = zip(*self.bias)
            out[:, list(ids)] += np.asarray(values, dtype=np.float32)
        counts: dict[int, int] = {}
        for t in generated:
            counts[t] = counts.get(t, 0) + 1
        in_prompt, prompt_set = self._distinct(prompt, vocab) if self.repetition != 1.0 else (None, frozenset())
        if in_prompt is not None and in_prompt.size:          # the prompt's tokens, in every row at once
            values = out[:, in_prompt]
            out[:, in_prompt] = np.where(values > 0, values / self.repetition, values * self.repetition)
        for j in range(out.shape[0]):
            if j:
                counts[drafts[j - 1]] = counts.get(drafts[j - 1], 0) + 1
            row = out[j]
            if self.repetition != 1.0:           # generated tokens the prompt did not hold
                hit = np.fromiter((t for t in counts if t < vocab and t not in prompt_set), dtype=np.int64)
                values = row[hit]
                row[hit] = np.where(values > 0, values / self.repetition, values * self.repetition)
            if self.presence or self.frequency:
                ids = np.fromiter((t for t in counts if t < vocab), dtype=np.int64)
                times = np.fromiter((counts[t] for t in counts if t < vocab), dtype=np.float32)
                row[ids] -= self.frequency * times + self.presence
        return out

    def _distinct(self, prompt: list[int], vocab: int) -> tuple[np.ndarray, frozenset]:
        """The prompt's distinct ids within the vocabulary, as an array and a set (built once per prompt)."""
        if self._prompt is None or self._prompt[0] is not prompt:
            ids = np.unique(np.asarray(prompt, dtype=np.int64))
            ids = ids[ids < vocab]
            self._prompt = (prompt, ids, frozenset(ids.tolist()))
        return self._prompt[1], self._prompt[2]


def penalties_of(opts) -> Penalties | None:
    """A request's penalties (GenerationOptions), None when none is set."""
    bias = tuple(sorted((int(t), float(v)) for t, v in (opts.logit_bias or {}).items()))
    penalties = Penalties(opts.presence_penalty, opts.frequency_penalty, opts.repetition_penalty, bias)
    return penalties if penalties.active else None
