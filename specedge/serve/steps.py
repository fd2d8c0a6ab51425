"""The server's recent decode steps, numbered: what each step ran (rows, k per row, accepted drafts, draft calls,
catch-up) and what it cost (draft phase, verify phase, time inside model calls), fed on the worker thread once
per step, read by GET /v1/speculation/steps. A client diffs `steps` (the count since start) to take one run
of requests apart: the per-step trace that `specedge bench` gets from the Python API, for a live server.
"""

from __future__ import annotations

import time
from collections import deque

KEPT = 4096                     # as the scheduler's own event ring


def step_view(record, index: int | None = None, ended: float | None = None) -> dict:
    """One StepRecord as JSON (seconds rounded to microseconds), with its number and end (Unix time) when given."""
    numbered = {} if index is None else {"step": index, "ended": round(ended, 6)}
    return {
        **numbered, "batch": record.batch, "k": list(record.k), "accepted": list(record.accepted),
        "draft_calls": record.draft_calls, "catch_up_tokens": record.catch_up_tokens,
        "draft_s": round(record.draft_s, 6), "catch_up_s": round(record.catch_up_s, 6),
        "verify_s": round(record.verify_s, 6), "model_s": round(record.model_s, 6),
        "verify_tokens": record.verify_tokens, "predicted": record.predicted,
    }


class StepLog:
    def __init__(self, kept: int = KEPT):
        self.count = 0
        self._recent: deque = deque(maxlen=kept)       # (index, end time, StepRecord); appended on the worker only

    @property
    def kept(self) -> int:
        return self._recent.maxlen

    def observe_step(self, record) -> None:
        self.count += 1
        self._recent.append((self.count, time.time(), record))

    def snapshot(self, recent: int = 100, after: int = 0) -> dict:
        """The last `recent` steps numbered above `after`, oldest first, and the count since start."""
        rows = [row for row in list(self._recent) if row[0] > after]      # list(): one copy under the GIL
        rows = rows[-recent:] if recent else []
        return {"steps": self.count, "kept": self.kept, "recent": [step_view(r, i, t) for i, t, r in rows]}
