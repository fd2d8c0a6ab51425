"""The backend interface, the host-side row padding every backend shares, and a one-slot cursor.

A call carries B rows, the slots lo .. lo + B - 1 of the static KV buffers. Row b brings tokens[b] to be
written at positions starts[b] .. (consecutive) and wants its last `last[b]` rows back. Rows are
right-padded to a common T by repeating their last token at the following positions (a dummy row, with
no tokens, writes token 0 at starts[b]): every slot at or beyond a row's committed length is scratch,
masked for earlier positions and rewritten before it is read, so pad K/V costs nothing but compute.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class PaddedCall:
    """One call's inputs, laid out for the graph."""
    ids: np.ndarray           # int64 [B, T]
    positions: np.ndarray     # int64 [B, T]
    logit_rows: np.ndarray    # int64 [B, n]: row b's wanted rows are its last last[b] columns
    last: list[int]


_RANGE = np.arange(1 << 16, dtype=np.int64)          # positions and row indices without a new array per call


def pad_call(starts, tokens, last, min_rows: int, ids: np.ndarray, positions: np.ndarray,
             logit_rows: np.ndarray, width: int = 0) -> PaddedCall:
    """Lays a call out in the given scratch (flat int64 buffers, large enough): T = the longest row, n = the most
    rows wanted; a call of at most `width` tokens a row grows to width tokens and width logit rows (one shape for
    every decode call); otherwise, with min_rows 2, its B x T token rows and B x n logit rows are made even (a lone
    token grows to two rows, an odd call by one more column), see ModelBackend.min_rows."""
    b = len(starts)
    t = max(1, max(map(len, tokens)))
    n = max(1, max(last))
    if t <= width:
        t = n = width                 # the one decode shape: its rows are alike in every call, odd or even
    elif min_rows > 1:
        t += (b * t) % 2
        n += (b * n) % 2
    ids, positions, logit_rows = ids[: b * t].reshape(b, t), positions[: b * t].reshape(b, t), logit_rows[: b * n].reshape(b, n)
    for r, (start, row, want) in enumerate(zip(starts, tokens, last)):
        m = len(row)
        ids[r, :m] = row
        ids[r, m:] = row[-1] if m else 0
        np.add(_RANGE[:t], start, out=positions[r])
        first = max(m - max(want, 1), 0)                 # a row that wants nothing still names a real row
        logit_rows[r, : n - want] = first                   # duplicates of the first wanted row, dropped
        logit_rows[r, n - want:] = _RANGE[first: first + want]
    return PaddedCall(ids, positions, logit_rows, list(last))


def scratch_rows(max_batch: int, max_step: int, width: int = 0) -> int:
    """Token rows of the largest call pad_call can lay out: every row at max_step tokens (or the decode width, at
    least 2 for a lone token), plus one column for an odd call made even."""
    return max_batch * (max(max_step, width, 2) + 1)


def decode_width(max_draft: int, role: str) -> int:
    """Tokens a row of every decode call carries on GPU backends (one shape per model): a verify call's
    max_draft + 1 for the target, a draft step's 2 for the draft; never under 2, since a lone token may run as two
    rows (min_rows), and a call wider than the width leaves the one shape (and its CUDA graph: on an H200 a
    target-only run at width 1 with two-row steps ran uncaptured, at half the speed)."""
    return max(max_draft + 1, 2) if role == "target" else 2


def fixed_decode_shape(starts, tokens, last, lo: int, max_batch: int, width: int, pad_start: int):
    """GPU backends, exact by construction: a decode-sized call (T <= width) over slots from 0 grows to all
    max_batch rows, the rows of free slots as dummies written at pad_start (max_seq_len: scratch in every slot),
    so that with pad_call's width every decode call of a model has one shape. -> (starts, tokens, last)."""
    b = len(starts)
    if width and lo == 0 and b < max_batch and max(map(len, tokens)) <= width:
        pad = max_batch - b
        return [*starts, *[pad_start] * pad], [*tokens, *[[]] * pad], [*last, *[0] * pad]
    return starts, tokens, last


class ModelBackend:
    """One model's step graph with KV buffers for max_batch slots, allocated once.

    min_rows: 1, or 2 where rows must come in pairs. Quantized MatMulNBits takes another kernel for one row on
    some CPUs, whose results differ in the last bits from the multi-row kernel, and on some it also computes the
    last row of an odd row count with that kernel (block 128 on an AVX-512 EPYC: a verify call of 3, 5 or 7
    tokens had a last row unlike the same row in an even call). At 2, every call's rows are even: a lone token
    runs with a copy of itself at the next position, an odd call gets one more such column, so a row is the same
    whatever call it is in.
    """

    name = "base"
    max_seq_len: int
    max_batch: int
    max_step: int
    kv_slots: int
    vocab_columns: int
    min_rows: int = 1

    @classmethod
    def check_available(cls, **options) -> None:
        """Raises ImportError (a missing package) or RuntimeError (no device, driver, ...) if it cannot run with
        these constructor options."""

    def run(self, starts, tokens, last, lo: int = 0, want: str = "logits") -> list[np.ndarray]:
        """Rows lo .. lo + len(starts) - 1 -> per row its last last[b] logits [last_b, V] ("logits": views valid
        until the next call) or argmax ids [last_b] ("ids")."""
        raise NotImplementedError

    def move_slot(self, src: int, dst: int, length: int) -> None:
        """Copies the first `length` positions of slot src's K/V into slot dst (compaction when a row leaves)."""
        raise NotImplementedError

    @property
    def kv_slot_bytes(self) -> int:
        raise NotImplementedError

    def _fixed_shape_call(self, starts, tokens, last, lo: int) -> PaddedCall:
        """GPU backends: a call laid out in the host staging buffers (_ids, _positions, _logit_rows), decode-sized
        calls at the one fixed shape (fixed_decode_shape, width); its first len(starts) rows are the caller's."""
        assert 0 <= lo and lo + len(starts) <= self.max_batch, (lo, len(starts), self.max_batch)
        starts, tokens, last = fixed_decode_shape(starts, tokens, last, lo, self.max_batch, self.width, self.max_seq_len)
        call = pad_call(starts, tokens, last, self.min_rows, self._ids, self._positions, self._logit_rows, self.width)
        assert max(starts) + call.ids.shape[1] <= self.kv_slots, (starts, call.ids.shape, self.kv_slots)
        return call


class SlotCursor:
    """One sequence in one slot: a position counter over a backend (tests, export checks, probes)."""

    def __init__(self, backend: ModelBackend, slot: int = 0):
        self.backend, self.slot, self.pos = backend, slot, 0

    def feed(self, tokens, last: int | None = None, want: str = "logits") -> np.ndarray:
        """Appends tokens after `pos` (chunks of max_step) and advances `pos`; -> the last `last` rows of the last
        chunk (default: all of it). Earlier chunks return one row each, unused."""
        tokens = list(tokens)
        if self.pos + len(tokens) > self.backend.max_seq_len:
            raise ValueError(f"{self.pos} + {len(tokens)} tokens exceed max_seq_len {self.backend.max_seq_len}")
        out, at = None, 0
        while at < len(tokens):
            chunk = tokens[at: at + self.backend.max_step]
            at += len(chunk)
            n = (last or len(chunk)) if at >= len(tokens) else 1
            out = self.backend.run([self.pos], [chunk], [n], lo=self.slot, want=want)[0]
            self.pos += len(chunk)
        return out

    def feed_ids(self, tokens, last: int | None = None) -> np.ndarray:
        return self.feed(tokens, last, want="ids")
