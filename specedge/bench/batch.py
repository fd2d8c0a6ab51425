"""`specedge bench --batch 1,2,4,8`: every configuration at every batch size, B requests at once, interleaved.

Every batch size runs the same workload: W requests (the prompt list cycled; W = workload_size(sizes), 8 for
1,2,4,8), submitted in waves of B that run as rows of one batch, each wave once the one before has ended.
Aggregate throughput is all their new tokens over the waves' wall time. (An earlier version ran one wave of the
first B prompts, so B = 1 measured the first prompt alone and B = 4 four different ones: a shorter prompt made
B = 1 look faster than the same requests are.)

Interleaving (`interleave`): "wave" (default) runs every configuration's wave i before any configuration's wave
i + 1, the order reversing from wave to wave, so configurations compared at one size are never more than a few
seconds apart and slow drift of the machine (run to run here as large as the differences looked for) hits all
alike; "cell" runs all of one configuration's waves, then the next's (configurations alternating by repeat).
A shared policy learns only from its own steps, so interleaving feeds no configuration another's measurements.
Medians over repeats are reported, each configuration's per-repeat ratio to the best other one, and its ratio to
every other configuration wave by wave (`paired`: geometric mean of the waves' ratios with a 95% interval; with
"wave" interleaving each pair ran seconds apart, so the machine's drift between pairs cancels).
"""

from __future__ import annotations

import math
import statistics
import time

from specedge.bench.order import against_best, alternating, paired_ratio
from specedge.bench.runner import config_options, machine_info
from specedge.errors import OptionError
from specedge.runtime.memory import memory_report
from specedge.runtime.stats import GenerationStats


def parse_batches(text: str, option: str = "--batch") -> list[int]:
    """'1,2,4' -> [1, 2, 4] (sorted, unique, each >= 1); also bench-serve's --concurrency."""
    try:
        sizes = sorted({int(part) for part in text.split(",")})
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
    gen.clear_prompt_cache()                                   # every request prefills its whole prompt
    t = time.perf_counter()
    with gen.scheduler.wake:                                   # hold the worker until all B are queued
        streams = []
        for j in range(first, first + batch):
            row = prompts[j % len(prompts)]
            streams.append(gen.stream(row["prompt"], chat=row.get("chat", False), suffix=row.get("suffix"), **options,
                                      seed=None if seed is None else seed + j))
    results = [s.wait() for s in streams]
    return results, time.perf_counter() - t


def last_events(gen, steps: int) -> list:
    """The step records of the last `steps` decode steps (the scheduler keeps the most recent EVENTS_KEPT: a
    longer cell keeps its last ones). Counted by the scheduler's step counter, not by the ring's length, which
    stops growing once the ring is full."""
    return list(gen.scheduler.events)[-steps:] if steps > 0 else []


INTERLEAVE = ("wave", "cell")


def _cell() -> dict:
    return {"results": [], "wall_s": 0.0, "events": [], "target_calls": 0, "wave_tok_per_s": []}


def _run_wave(gen, prompts, batch: int, size: int, first: int, options: dict, seed, cell: dict) -> None:
    """One wave of `size` requests from request `first` on, added to a configuration's cell (its results in
    request order, wall time, step records and target calls)."""
    before = gen.counters
    wave, seconds = run_together(gen, prompts, size, options, seed, first)
    after = gen.counters
    cell["results"] += wave
    cell["wall_s"] += seconds
    cell["wave_tok_per_s"].append(sum(res.stats.new_tokens for res in wave) / seconds)
    cell["events"] += last_events(gen, after.get("steps", 0) - before.get("steps", 0))
    cell["target_calls"] += after.get("target_calls", 0) - before.get("target_calls", 0)


def run_batch_bench(gen, prompts: list[dict], configs: list[str], sizes: list[int], max_new_tokens: int = 128,
                    temperature: float = 0.0, seed: int | None = None, repeat: int = 1, progress=None,
                    interleave: str = "wave") -> dict:
    if "target" not in configs:
        configs = ["target"] + configs
    if interleave not in INTERLEAVE:
        raise OptionError(f"interleave must be one of {', '.join(INTERLEAVE)}, got '{interleave}'")
    if max(sizes) > gen.max_batch:
        raise OptionError(f"batch {max(sizes)} exceeds the generator's max_batch {gen.max_batch}")
    for name in configs:
        gen.options(**config_options(name))
    base = dict(max_new_tokens=max_new_tokens, temperature=temperature, ignore_eos=True)
    workload = workload_size(sizes)
    for name in configs:                                       # warm-up, excluded
        run_together(gen, prompts, max(sizes), {**base, **config_options(name), "max_new_tokens": 8}, seed)
    runs = {(b, name): [] for b in sizes for name in configs}
    waves = {b: len(range(0, workload, b)) for b in sizes}
    total = repeat * len(configs) * (sum(waves.values()) if interleave == "wave" else len(sizes))
    done = 0
    for r in range(repeat):
        for b in sizes:
            cells = {name: _cell() for name in configs}
            plan = ([(w, name) for w in range(waves[b]) for name in alternating(configs, r + w)]
                    if interleave == "wave" else
                    [(w, name) for name in alternating(configs, r) for w in range(waves[b])])
            for w, name in plan:
                first = w * b
                _run_wave(gen, prompts, b, min(b, workload - first), first, {**base, **config_options(name)}, seed,
                          cells[name])
                if interleave == "wave" or w == waves[b] - 1:
                    done += 1
                    if progress:
                        progress(done, total, f"repeat {r + 1}/{repeat}, batch {b}, "
                                              + (f"wave {w + 1}/{waves[b]}, {name}" if interleave == "wave" else name))
            for name in configs:
                runs[(b, name)].append(cells[name])
    table = {}
    for b in sizes:
        table[str(b)] = {name: _summary(runs[(b, name)], runs[(b, "target")], temperature == 0.0) for name in configs}
        base_tps = table[str(b)]["target"]["aggregate_tok_per_s"]
        per_repeat = {name: entry["aggregate_tok_per_s_per_repeat"] for name, entry in table[str(b)].items()}
        wave_rates = {name: [x for run in runs[(b, name)] for x in run["wave_tok_per_s"]] for name in configs}
        for name, entry in table[str(b)].items():
            entry["speedup"] = entry["aggregate_tok_per_s"] / base_tps if base_tps else 0.0
            entry.update(against_best(per_repeat, name))
            # wave by wave against every other configuration (pairs side by side only with interleave "wave")
            entry["wave_tok_per_s"] = wave_rates[name]
            entry["paired"] = {other: paired_ratio(wave_rates[name], wave_rates[other])
                               for other in configs if other != name}
    return {"batches": table, "sizes": sizes, "configs": configs, "machine": machine_info(gen),
            "memory": memory_report(gen.manifest, gen.max_batch),
            "bundle": {"path": str(gen.path), "max_draft": gen.max_draft},
            "settings": {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
                         "repeat": repeat, "prompts": len(prompts), "requests_per_batch_size": workload,
                         "interleave": interleave}}


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
