"""Rows in pairs (min_rows 2): where the one-row kernel differs, it may also compute the last row of an odd call.

MatMulNBits at block 128 on an AVX-512 EPYC computed rows two at a time and the last row of an odd row count
with its one-row kernel: a verify call of 3, 5 or 7 tokens had a last row unlike the same row in an even call
(0.2-0.5 in the logits), and `adaptive` speculation then left target-only greedy output on 2 of 12 runs. A
stand-in backend with that kernel shows what pad_call and the load probe must do about it on any CPU."""

import numpy as np
import pytest

from specedge.runtime.backends.base import ModelBackend, SlotCursor, pad_call
from specedge.runtime.row_check import choose_min_rows, probe_ids, verify_rows_bitwise_equal

VOCAB = 16


class PairKernelBackend(ModelBackend):
    """Logits of a row depend on its token and position only, except a row computed alone: the last row of a call
    with an odd number of rows gets the one-row kernel's rounding (+1e-6)."""

    name = "pair-kernel"
    lone_row_exact = False          # True: a call of one row is exact, only the odd tail of a longer call is not

    def __init__(self, max_step: int = 16):
        self.max_seq_len, self.max_batch, self.max_step, self.kv_slots = 64, 4, max_step, 66
        self.vocab_columns = VOCAB
        rows = self.max_batch * (max_step + 1)
        self._ids, self._positions, self._logit_rows = (np.zeros(rows, np.int64) for _ in range(3))
        self.calls = []                                     # (B, T) of every call

    def run(self, starts, tokens, last, lo=0, want="logits"):
        call = pad_call(starts, tokens, last, self.min_rows, self._ids, self._positions, self._logit_rows)
        b, t = call.ids.shape
        assert max(starts) + t <= self.kv_slots
        self.calls.append((b, t))
        grid = np.arange(VOCAB, dtype=np.float32)
        logits = np.sin(call.ids[..., None] * 0.37 + call.positions[..., None] * 0.11 + grid).astype(np.float32)
        if (b * t) % 2 and not (self.lone_row_exact and b * t == 1):
            logits[-1, -1] += np.float32(1e-6)              # the one-row kernel: the flat call's last row
        picked = np.take_along_axis(logits, call.logit_rows[..., None], axis=1)
        return [picked[r, picked.shape[1] - w:] for r, w in enumerate(call.last)]


def test_min_rows_2_makes_every_call_even():
    ids = positions = logit_rows = np.zeros(64, np.int64)
    for starts, tokens, last in (([3], [[5]], [1]), ([3], [[5, 6, 7]], [3]), ([0, 4, 9], [[1], [2], [3]], [1, 1, 1]),
                                 ([1, 2, 3], [[1, 2], [3], [4, 5, 6]], [2, 1, 3]), ([0, 1], [[1, 2, 3], [4]], [3, 1])):
        for min_rows in (1, 2):
            call = pad_call(starts, tokens, last, min_rows, ids.copy(), positions.copy(), logit_rows.copy())
            b, t = call.ids.shape
            n = call.logit_rows.shape[1]
            assert t >= max(map(len, tokens)) and n >= max(last)
            if min_rows == 2:
                assert (b * t) % 2 == 0 and (b * n) % 2 == 0, (starts, tokens, call.ids.shape, n)
                assert t <= max(map(len, tokens)) + 1
            else:
                assert t == max(map(len, tokens)) and n == max(last)


def test_pad_columns_repeat_the_last_token_at_the_next_positions():
    call = pad_call([10, 20, 30], [[1, 2, 3], [4], [5, 6]], [3, 1, 2], 2, *(np.zeros(64, np.int64) for _ in range(3)))
    assert call.ids.tolist() == [[1, 2, 3, 3], [4, 4, 4, 4], [5, 6, 6, 6]]
    assert call.positions.tolist() == [[10, 11, 12, 13], [20, 21, 22, 23], [30, 31, 32, 33]]
    rows = call.logit_rows.tolist()                         # the wanted rows last, duplicates of the first in front
    assert rows == [[0, 0, 1, 2], [0, 0, 0, 0], [0, 0, 0, 1]]


@pytest.mark.parametrize("width", [2, 3, 4, 5, 7])
def test_rows_equal_whatever_the_call_with_pairs(width):
    """With min_rows 2 a row is the same in every call: alone, in an odd or even verify call, beside other
    sequences' rows. With min_rows 1 the stand-in's odd calls differ (the defect the pairs remove)."""
    backend = PairKernelBackend()
    assert choose_min_rows(backend, VOCAB) == 2              # the probe sees the lone-row kernel
    ids = np.random.default_rng(width).integers(0, VOCAB, size=16).tolist()
    cursor = SlotCursor(backend)
    cursor.pos = 0
    cursor.feed(ids[:5])
    together = cursor.feed(ids[5: 5 + width]).copy()
    cursor.pos = 5
    alone = np.concatenate([cursor.feed([t]).copy() for t in ids[5: 5 + width]])
    np.testing.assert_array_equal(together, alone)
    batched = backend.run([5, 40, 50], [ids[5: 5 + width], [1], [2, 3]], [width, 1, 2])[0]
    np.testing.assert_array_equal(batched, together)
    backend.min_rows = 1
    cursor.pos = 5
    odd_one_row = cursor.feed(ids[5: 5 + width]).copy()
    assert np.array_equal(odd_one_row, together) == (width % 2 == 0)


def test_the_probe_checks_an_odd_call_too():
    """A backend whose lone rows are exact but whose odd calls are not (only the last row of an odd call with
    more than one row is off) is caught by the probe's odd-sized step, not by the 4-token one."""
    backend = PairKernelBackend()
    backend.lone_row_exact, backend.min_rows = True, 1
    cursor = SlotCursor(backend)
    cursor.feed(probe_ids(VOCAB)[:7])
    four = cursor.feed(probe_ids(VOCAB)[7:11]).copy()
    cursor.pos = 7
    assert np.array_equal(four, np.concatenate([cursor.feed([t]).copy() for t in probe_ids(VOCAB)[7:11]]))
    assert not verify_rows_bitwise_equal(SlotCursor(backend), probe_ids(VOCAB))
    assert choose_min_rows(backend, VOCAB) == 2
    assert verify_rows_bitwise_equal(SlotCursor(backend), probe_ids(VOCAB))
