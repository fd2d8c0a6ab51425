"""Configurations run side by side: the order they run in within each repeat, and how they are compared."""

from __future__ import annotations

import math
import statistics


def alternating(names: list[str], repeat_index: int) -> list[str]:
    """In order on even repeats, reversed on odd ones (A B C, C B A, ...): a machine that drifts during a repeat
    then favours no configuration over a pair of repeats (run-to-run drift here is as large as the differences
    the benchmarks look for)."""
    return list(names) if repeat_index % 2 == 0 else list(names)[::-1]


def against_best(per_repeat: dict[str, list[float]], name: str) -> dict:
    """name's throughput against the best other configuration's, repeat by repeat (a repeat's configurations ran
    side by side, so each ratio sees one state of the machine), and the median of those ratios. per_repeat:
    configuration -> throughput per repeat, the repeats in one order for all."""
    others = [n for n in per_repeat if n != name]
    if not others:
        return {}
    best = [max(per_repeat[n][r] for n in others) for r in range(len(per_repeat[name]))]
    # None where every other configuration made nothing (all its requests failed): no ratio to take
    ratios = [mine / top if top > 0 else None for mine, top in zip(per_repeat[name], best)]
    known = [r for r in ratios if r is not None]
    return {"vs_best_other_per_repeat": ratios, "vs_best_other": statistics.median(known) if known else None}


# two-sided 95% quantiles of Student's t by degrees of freedom (1-30); 1.96 beyond
_T95 = [12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042]


def paired_ratio(mine: list[float], other: list[float]) -> dict:
    """Throughputs measured in pairs (pair i of both ran side by side, seconds apart) -> the geometric mean of
    the pairs' ratios and its 95% interval (t on the log ratios): the spread of this machine between pairs
    cancels, what is left is the spread within a pair. One pair gives no interval."""
    logs = [math.log(a / b) for a, b in zip(mine, other) if a > 0 and b > 0]
    if not logs:
        return {}
    mean = statistics.fmean(logs)
    if len(logs) < 2:
        return {"ratio": math.exp(mean), "low": None, "high": None, "pairs": 1}
    half = (_T95[len(logs) - 2] if len(logs) - 1 <= len(_T95) else 1.96) * statistics.stdev(logs) / math.sqrt(len(logs))
    return {"ratio": math.exp(mean), "low": math.exp(mean - half), "high": math.exp(mean + half), "pairs": len(logs)}
