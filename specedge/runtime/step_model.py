"""One exported model behind onnxruntime, with its static KV buffers and its position counter.

The buffers are allocated once and bound to the session once (zero-copy OrtValues); each call binds
only preallocated scratch views for ids, positions, logits and (scatter graphs) the new K/V, so a step
allocates no KV memory. `pos` is the number of committed tokens in the buffers: rejecting drafts means
setting it back, nothing else: slots at or beyond `pos` are masked by the graph and overwritten later.

In-place graphs (gqa) write the buffers themselves: their present_* outputs are bound to the past_*
memory, and nothing is copied after a call. Their buffers hold one slot more than max_seq_len (v2: the
graph's throwaway attention row is written after the last position), two for a quantized target whose
single steps may be padded to two rows; the graph's input shape says.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import onnxruntime as ort

from specedge.errors import BundleError


def session_options(threads: int | None) -> ort.SessionOptions:
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or os.cpu_count() or 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return options


class StepModel:
    def __init__(self, path: Path, model: dict, max_seq_len: int, vocab_size: int, max_step: int,
                 threads: int | None = None):
        try:
            self.session = ort.InferenceSession(str(path), session_options(threads), providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own untyped errors for bad files
            raise BundleError(f"{path}: cannot load model ({str(err).splitlines()[0]})") from err
        kv = model["kv"]
        self.num_layers, self.max_seq_len, self.vocab_size = kv["num_layers"], max_seq_len, vocab_size
        self.max_step = max_step
        outputs = {o.name for o in self.session.get_outputs()}
        self.in_place = "present_key.0" in outputs
        inputs = {i.name: i for i in self.session.get_inputs()}
        slots = inputs["past_key.0"].shape[2]
        self.kv_slots = slots if isinstance(slots, int) else max_seq_len
        # v1 in-place graphs have no headroom slot: at position 0 their extra row goes after the call
        self._limit_at_zero = max_seq_len - 1 if self.in_place and self.kv_slots == max_seq_len else None
        kv_shape = (1, kv["num_kv_heads"], self.kv_slots, kv["head_dim"])                 # [B, H_kv, S, D]
        self.keys = [np.zeros(kv_shape, np.float32) for _ in range(self.num_layers)]
        self.values = [np.zeros(kv_shape, np.float32) for _ in range(self.num_layers)]
        self.kv_bytes = 2 * sum(k.nbytes for k in self.keys)
        self.pos = 0
        # scratch, sized for the longest step; a step uses a contiguous prefix of each
        per_token = kv["num_kv_heads"] * kv["head_dim"]
        self._ids = np.zeros(max_step, np.int64)
        self._positions = np.zeros(max_step, np.int64)
        self._logits = np.empty(max_step * vocab_size, np.float32)
        scratch = 0 if self.in_place else max_step * per_token
        self._new_k = [np.empty(scratch, np.float32) for _ in range(self.num_layers)]
        self._new_v = [np.empty(scratch, np.float32) for _ in range(self.num_layers)]
        self._kv_step_shape = (1, kv["num_kv_heads"], -1, kv["head_dim"])
        self._binding = self.session.io_binding()
        self._past = []  # keeps the OrtValues alive
        for i in range(self.num_layers):
            for name, buf in ((f"past_key.{i}", self.keys[i]), (f"past_value.{i}", self.values[i])):
                value = ort.OrtValue.ortvalue_from_numpy(buf)
                self._past.append(value)
                self._binding.bind_ortvalue_input(name, value)
                if self.in_place:
                    self._binding.bind_ortvalue_output(name.replace("past_", "present_"), value)
        # v2 graphs compute logits only for the last num_logits tokens; v1 graphs for all of them
        self.selects_logits = "num_logits" in inputs
        self._num_logits = np.ones(1, np.int64)
        if self.selects_logits:
            self._binding.bind_input("num_logits", "cpu", 0, np.int64, [1], self._num_logits.ctypes.data)
        # quantized targets: single steps as min_rows rows (2 is always exact; row_check.py picks 1 where it is)
        self.pads_rows = "min_rows" in inputs
        self._min_rows = np.full(1, 2, np.int64)
        if self.pads_rows:
            self._binding.bind_input("min_rows", "cpu", 0, np.int64, [1], self._min_rows.ctypes.data)
        self._bound_step = (0, 0)

    @property
    def min_rows(self) -> int:
        return int(self._min_rows[0]) if self.pads_rows else 1

    @min_rows.setter
    def min_rows(self, rows: int) -> None:
        if not self.pads_rows and rows != 1:
            raise ValueError("this graph has no min_rows input")
        self._min_rows[0] = rows

    def _bind_step(self, n: int, rows: int) -> None:
        b = self._binding
        b.bind_input("input_ids", "cpu", 0, np.int64, [1, n], self._ids.ctypes.data)
        b.bind_input("position_ids", "cpu", 0, np.int64, [1, n], self._positions.ctypes.data)
        b.bind_output("logits", "cpu", 0, np.float32, [1, rows, self.vocab_size], self._logits.ctypes.data)
        self._bound_step = (n, rows)
        if self.in_place:
            return
        kv_shape = [1, self._kv_step_shape[1], n, self._kv_step_shape[3]]
        for i in range(self.num_layers):
            b.bind_output(f"key.{i}", "cpu", 0, np.float32, kv_shape, self._new_k[i].ctypes.data)
            b.bind_output(f"value.{i}", "cpu", 0, np.float32, kv_shape, self._new_v[i].ctypes.data)

    def _run(self, tokens, start: int, last: int) -> np.ndarray:
        """Feeds len(tokens) <= max_step tokens at positions start.. -> logits of the last `last` [last, V]
        (a scratch view)."""
        n = len(tokens)
        assert 0 < n <= self.max_step and start + n <= self.max_seq_len and 0 < last <= n, (n, start, last)
        self._ids[:n] = tokens
        self._positions[:n] = np.arange(start, start + n)
        rows = last if self.selects_logits else n
        self._num_logits[0] = rows
        if (n, rows) != self._bound_step:
            self._bind_step(n, rows)
        self.session.run_with_iobinding(self._binding)
        logits = self._logits[: rows * self.vocab_size].reshape(rows, self.vocab_size)
        if self.in_place:
            return logits[rows - last:]
        size = n * self._kv_step_shape[1] * self._kv_step_shape[3]
        for i in range(self.num_layers):
            self.keys[i][:, :, start:start + n] = self._new_k[i][:size].reshape(self._kv_step_shape)
            self.values[i][:, :, start:start + n] = self._new_v[i][:size].reshape(self._kv_step_shape)
        return logits[rows - last:]

    def feed(self, tokens, last: int | None = None) -> np.ndarray:
        """Appends tokens after `pos` (chunked) and advances `pos`.

        Returns the logits of the last `last` tokens (default: all of the last chunk) [last, V], a view
        valid until the next call; `last` may not exceed the last chunk. Earlier chunks get one row.
        """
        tokens = list(tokens)
        if self.pos + len(tokens) > self.max_seq_len:
            raise ValueError(f"{self.pos} + {len(tokens)} tokens exceed max_seq_len {self.max_seq_len}")
        logits, at = None, 0
        while at < len(tokens):
            size = self.max_step
            if self._limit_at_zero and self.pos == 0:
                size = min(size, self._limit_at_zero)
            chunk = tokens[at: at + size]
            at += len(chunk)
            logits = self._run(chunk, self.pos, (last or len(chunk)) if at >= len(tokens) else 1)
            self.pos += len(chunk)
        return logits
