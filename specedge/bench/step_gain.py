"""What a cell's speculative steps gained against plain steps of as many rows, priced in the same run.

Cells of a load test run one after another, and on a shared machine the same target-only cell moves by 15-33%
between repeats: a ratio of two cells' throughputs measures the machine as much as the policy. The steps of one
cell carry a paired comparison instead: each step with k > 0 committed some tokens for some rows in some seconds,
and the same cell's plain steps (k = 0 for every row) of as many rows say what those tokens would have cost
without speculation, at the same moment on the same machine. Rows the cell never ran plain are priced by the plain
steps of the other cells at that concurrency in the same repeat (a fallback: for fixed:k, and adaptive alone, the
drift between neighbouring cells enters again). What it leaves out: work outside decode steps (prompt prefill, a
prompt fed to the draft) and the batch sizes a policy's prefills leave behind.

Steps are the dicts of GET /v1/speculation/steps (serve/steps.py step_view): batch (decoding rows), k and
accepted per row, draft_s (catch-ups included) and verify_s.
"""

from __future__ import annotations

import statistics


def step_s(step: dict) -> float:
    return step["draft_s"] + step["verify_s"]


def plain_step_s(steps: list[dict]) -> dict[int, float]:
    """Median seconds of a plain step (k = 0 for every row) per decoding rows, over the steps given."""
    by_rows: dict[int, list[float]] = {}
    for s in steps:
        if not max(s["k"], default=0):
            by_rows.setdefault(s["batch"], []).append(step_s(s))
    return {rows: statistics.median(times) for rows, times in by_rows.items()}


def speculation_effect(steps: list[dict], fallback: dict[int, float] | None = None) -> dict:
    """-> gain_s: seconds the steps with k > 0 saved against plain steps of as many rows (negative: lost);
    gain_share: that over the cell's time in decode steps; unpriced_steps: steps with k > 0 at a row count with
    no plain step to price them by (left out)."""
    price = {**(fallback or {}), **plain_step_s(steps)}
    gain, unpriced = 0.0, 0
    for s in steps:
        if not max(s["k"], default=0):
            continue
        if s["batch"] not in price:
            unpriced += 1
            continue
        committed = sum(s["accepted"]) + s["batch"]          # each row: its accepted drafts and one token of its own
        gain += committed / s["batch"] * price[s["batch"]] - step_s(s)
    total = sum(step_s(s) for s in steps)
    return {"gain_s": gain, "gain_share": gain / total if total else 0.0, "unpriced_steps": unpriced}
