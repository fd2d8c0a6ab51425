"""The order in which a benchmark's configurations run within each repeat."""

from __future__ import annotations


def alternating(names: list[str], repeat_index: int) -> list[str]:
    """In order on even repeats, reversed on odd ones (A B C, C B A, ...): a machine that drifts during a repeat
    then favours no configuration over a pair of repeats (run-to-run drift here is as large as the differences
    the benchmarks look for)."""
    return list(names) if repeat_index % 2 == 0 else list(names)[::-1]
