"""`specedge bench --batch 1,2,4,8`: every configuration at every batch size, B requests at once, interleaved.

Every batch size runs the same workload: W requests (the prompt list cycled; W = workload_size(sizes), 8 for
1,2,4,8), submitted in waves of B that run as rows of one batch, each wave once the one before has ended.
Aggregate throughput is all their new tokens over the waves' wall time. (An earlier version ran one wave of the
first B prompts, so B = 1 measured the first prompt alone and B = 4 four different ones: a shorter prompt made
B = 1 look faster than the same requests are.) Configurations run alternately within each repeat, in reverse
order on every other repeat, so machine drift hits all alike; medians over repeats are reported.
"""

from __future__ import annotations

import math
import statistics
import time

from specedge.bench.order import alternating
from specedge.bench.runner import config_options, machine_info
from specedge.errors import OptionError
from specedge.runtime.memory import memory_report
from specedge.runtime.stats import GenerationStats


def parse_batches(text: str, option: str = "--batch") -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, unique, each >= 1); also bench-serve's --concurrency."""
    try:
        sizes = sorted({int(part) for part in text.split(",") if part.strip()})
    except ValueError:
        raise OptionError(f"{option}: expected comma-separated integers, got '{text}'") from None
    if not sizes or sizes[0] < 1:
        raise OptionError(f"{option}: sizes must be >= 1, got '{text}'")
    return sizes


MAX_WORKLOAD = 64


def workload_size(sizes: list[int]) -> int:
    """Requests each batch size runs: the least common multiple of the sizes (every wave full) unless that
    exceeds MAX_WORKLOAD, then the largest size (the last wave of a size that does not divide it is partial)."""
    lcm = math.lcm(*sizes)
    return lcm if lcm <= MAX_WORKLOAD else max(sizes)


def run_together(gen, prompts: list[dict], batch: int, options: dict, seed: int | None, first: int = 0):
    """Requests first .. first + batch - 1 (prompts cycled, seeds by request index) submitted at once (the worker
    admits them together) -> (results, wall seconds)."""
    t = time.perf_counter()
    with gen.scheduler.wake:                                   # hold the worker until all B are queued
        streams = []
        for j in range(first, first + batch):
            row = prompts[j % len(prompts)]
            streams.append(gen.stream(row["prompt"], chat=row.get("chat", False), **options,
                                      seed=None if seed is None else seed + j))
    results = [s.wait() for s in streams]
    return results, time.perf_counter() - t


def run_waves(gen, prompts: list[dict], batch: int, workload: int, options: dict, seed: int | None):
    """The workload's requests in waves of `batch` -> (results in request order, wall seconds of all waves)."""
    results, wall = [], 0.0
    for first in range(0, workload, batch):
        wave, seconds = run_together(gen, prompts, min(batch, workload - first), options, seed, first)
        results += wave
        wall += seconds
    return results, wall


def last_events(gen, steps: int) -> list:
    """The step records of the last `steps` decode steps (the scheduler keeps the most recent EVENTS_KEPT: a
    longer cell keeps its last ones). Counted by the scheduler's step counter, not by the ring's length, which
    stops growing once the ring is full."""
    return list(gen.scheduler.events)[-steps:] if steps > 0 else []


def run_batch_bench(gen, prompts: list[dict], configs: list[str], sizes: list[int], max_new_tokens: int = 128,
                    temperature: float = 0.0, seed: int | None = None, repeat: int = 1, progress=None) -> dict:
    if "target" not in configs:
        configs = ["target"] + configs
    if max(sizes) > gen.max_batch:
        raise OptionError(f"batch {max(sizes)} exceeds the generator's max_batch {gen.max_batch}")
    for name in configs:
        gen.options(**config_options(name))
    base = dict(max_new_tokens=max_new_tokens, temperature=temperature, ignore_eos=True)
    workload = workload_size(sizes)
    for name in configs:                                       # warm-up, excluded
        run_together(gen, prompts, max(sizes), {**base, **config_options(name), "max_new_tokens": 8}, seed)
    runs = {(b, name): [] for b in sizes for name in configs}
    total, done = repeat * len(sizes) * len(configs), 0
    for r in range(repeat):
        for b in sizes:
            for name in alternating(configs, r):
                before = gen.counters
                results, wall = run_waves(gen, prompts, b, workload, {**base, **config_options(name)}, seed)
                after = gen.counters
                runs[(b, name)].append({"results": results, "wall_s": wall,
                                        "events": last_events(gen, after.get("steps", 0) - before.get("steps", 0)),
                                        "target_calls": after.get("target_calls", 0) - before.get("target_calls", 0)})
                done += 1
                if progress:
                    progress(done, total, f"repeat {r + 1}/{repeat}, batch {b}, {name}")
    table = {}
    for b in sizes:
        table[str(b)] = {name: _summary(runs[(b, name)], runs[(b, "target")], temperature == 0.0) for name in configs}
        base_tps = table[str(b)]["target"]["aggregate_tok_per_s"]
        for entry in table[str(b)].values():
            entry["speedup"] = entry["aggregate_tok_per_s"] / base_tps if base_tps else 0.0
    return {"batches": table, "sizes": sizes, "configs": configs, "machine": machine_info(gen),
            "memory": memory_report(gen.manifest, gen.max_batch),
            "bundle": {"path": str(gen.path), "max_draft": gen.max_draft},
            "settings": {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
                         "repeat": repeat, "prompts": len(prompts), "requests_per_batch_size": workload}}


def _summary(runs: list[dict], target_runs: list[dict], greedy: bool) -> dict:
    aggregate = [sum(res.stats.new_tokens for res in run["results"]) / run["wall_s"] for run in runs]
    stats = GenerationStats.combine([res.stats for run in runs for res in run["results"]])
    per_sequence = [res.stats.tokens_per_s for run in runs for res in run["results"]]
    ks = [k for run in runs for event in run["events"] for k in [max(event.k, default=0)]]
    identical = None
    if greedy:
        identical = all(a.tokens == t.tokens for run, trun in zip(runs, target_runs)
                        for a, t in zip(run["results"], trun["results"]))
    return {"aggregate_tok_per_s": statistics.median(aggregate), "aggregate_tok_per_s_per_repeat": aggregate,
            "per_sequence_tok_per_s": statistics.median(per_sequence),
            "mean_accepted_length": stats.mean_accepted_length,
            "acceptance_per_position": stats.acceptance_per_position,
            "k_mean": statistics.mean(ks) if ks else 0.0, "k_per_step": ks[:512],
            "target_calls": statistics.median(run["target_calls"] for run in runs),
            "per_request_tokens": [res.tokens for res in runs[0]["results"]],     # the first repeat's, by request
            "identical_to_target": identical}
