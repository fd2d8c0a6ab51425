"""`specedge bench-serve`: load on an OpenAI-compatible server with the official `openai` client.

At each concurrency level C (closed loop: C requests in flight, each next one sent when one ends) and for each
policy (a request's `extra_body={"speculation": ...}`), streamed requests measure time to first token, time per
output token after the first (TPOT), inter-token latency (between chunks carrying text) and end-to-end time;
a level reports request throughput, output tokens/s and p50 / p99 of the latencies, plus the mean accepted length
the server reports. Policies alternate within each level (in reverse order on every other repeat), so drift hits
them alike. From a specedge server it also reads each cell's decode steps (GET /v1/speculation/steps) and prices
the steps with k > 0 against plain steps of as many rows from the same level and repeat (`steps_gain`,
bench/step_gain.py): a paired reading the drift between cells does not enter. The client's own CPU time is
reported (client and server share the machine), and the server's when this process started it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from specedge.bench.order import against_best, alternating
from specedge.bench.report import percent_change
from specedge.bench.step_gain import plain_step_s, speculation_effect
from specedge.errors import SpecedgeError

DEFAULT_LEVELS = (1, 2, 4, 8, 16)
DEFAULT_POLICIES = ("target", "fixed:4", "adaptive")


def speculation_body(policy: str):
    """'target' -> "off"; 'fixed:4' -> {"policy": "fixed:4"}; 'adaptive@ngram' -> with a drafter."""
    name, _, drafter = policy.partition("@")
    if name in ("target", "off"):
        return "off"
    return {"policy": name, **({"drafter": drafter} if drafter else {})}


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None, "mean": None}
    arr = np.asarray(values)
    return {"p50": float(np.percentile(arr, 50)), "p99": float(np.percentile(arr, 99)), "mean": float(arr.mean())}


async def _one(client, model: str, prompt: dict, policy: str, max_tokens: int, temperature: float,
               ignore_eos: bool) -> dict:
    extra = {"speculation": speculation_body(policy), "ignore_eos": ignore_eos}
    common = dict(model=model, max_tokens=max_tokens, temperature=temperature, stream=True,
                  stream_options={"include_usage": True}, extra_body=extra)
    start = time.perf_counter()
    times, usage, spec = [], None, None
    if prompt.get("chat"):
        stream = await client.chat.completions.create(messages=[{"role": "user", "content": prompt["prompt"]}],
                                                      **common)
    else:
        fim = {"suffix": prompt["suffix"]} if prompt.get("suffix") else {}      # nothing sent where there is none
        stream = await client.completions.create(prompt=prompt["prompt"], **fim, **common)
    async for chunk in stream:
        if chunk.choices:
            c = chunk.choices[0]
            text = c.delta.content if hasattr(c, "delta") else c.text
            if text:
                times.append(time.perf_counter())
        if chunk.usage is not None:
            usage = chunk.usage
        extra_fields = chunk.model_extra or {}
        if "speculation" in extra_fields:
            spec = extra_fields["speculation"]
    end = time.perf_counter()
    n = usage.completion_tokens if usage else len(times)
    ttft = times[0] - start if times else None
    return {"e2e": end - start, "ttft": ttft, "tokens": n,
            "tpot": (end - times[0]) / (n - 1) if times and n > 1 else None,
            "itl": [b - a for a, b in zip(times, times[1:])], "speculation": spec}


async def _level(client, model, prompts, policy, concurrency, n_requests, max_tokens, temperature, ignore_eos):
    queue = list(range(n_requests))
    results, errors = [], []

    async def worker():
        while queue:
            i = queue.pop(0)
            try:
                results.append(await _one(client, model, prompts[i % len(prompts)], policy, max_tokens, temperature,
                                          ignore_eos))
            except Exception as err:  # noqa: BLE001 - counted and reported, the run goes on
                errors.append(f"{type(err).__name__}: {err}")

    cpu, t0 = time.process_time(), time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu
    tokens = sum(r["tokens"] for r in results)
    specs = [r["speculation"] for r in results if r["speculation"]]
    verify = sum(s["verify_calls"] for s in specs)
    accepted = sum(s["accepted_tokens"] for s in specs)
    drafted = sum(s["drafted_tokens"] for s in specs)
    return {
        "concurrency": concurrency, "requests": len(results), "errors": len(errors), "error_samples": errors[:3],
        "wall_s": wall, "request_throughput": len(results) / wall, "output_tok_per_s": tokens / wall,
        "output_tokens": tokens,
        "ttft_s": _percentiles([r["ttft"] for r in results if r["ttft"] is not None]),
        "tpot_s": _percentiles([r["tpot"] for r in results if r["tpot"] is not None]),
        "itl_s": _percentiles([x for r in results for x in r["itl"]]),
        "e2e_s": _percentiles([r["e2e"] for r in results]),
        "mean_accepted_length": 1.0 + accepted / verify if verify else 1.0,
        "acceptance_rate": accepted / drafted if drafted else 0.0,
        "k_mean": float(np.mean([s["k_mean"] for s in specs])) if specs else 0.0,
        "client_cpu_s": cpu, "client_cpu_share": cpu / wall,
    }


def _cpu_seconds(pid: int | None) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), or None."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def median_entry(entries: list[dict]) -> dict:
    """One (policy, concurrency) cell over repeats: the repeat with the median output tokens/s (the lower middle
    of an even count) stands for the cell, its throughput replaced by the true median; errors are summed over all
    repeats, and each repeat's tokens/s is kept."""
    middle = sorted(entries, key=lambda e: e["output_tok_per_s"])[(len(entries) - 1) // 2]
    tok_per_s = [e["output_tok_per_s"] for e in entries]
    gains = [e.get("steps_gain") for e in entries]
    return {**middle, "output_tok_per_s": float(np.median(tok_per_s)), "output_tok_per_s_per_repeat": tok_per_s,
            "repeats": len(entries), "errors": sum(e["errors"] for e in entries),
            "requests": sum(e["requests"] for e in entries), "steps_gain_per_repeat": gains,
            "steps_gain": float(np.median(gains)) if None not in gains else None}


async def _run(url, api_key, model, prompts, policies, levels, requests_per_level, max_tokens, temperature,
               ignore_eos, server_pid, progress, repeat=1, warm_up=True):
    import httpx
    from openai import APIError, AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key=api_key or "-", max_retries=0, timeout=600.0)
    http = httpx.AsyncClient(headers={"Authorization": f"Bearer {api_key}"} if api_key else {}, timeout=60.0)
    try:
        if model is None:
            try:
                models = await client.models.list()
            except APIError as err:
                raise SpecedgeError(f"cannot list the models of {url}: {err}") from None
            if not models.data:
                raise SpecedgeError(f"{url} serves no model")
            model = models.data[0].id
        for policy in policies if warm_up else ():   # warm-up, not measured (adaptive learns costs here)
            await _level(client, model, prompts, policy, 1, 1, max_tokens, temperature, ignore_eos)
        entries = {(p, c): [] for p in policies for c in levels}
        total, done = repeat * len(levels) * len(policies), 0
        seen = await _steps_after(http, url, 0)                # None: the server keeps no step records
        for r in range(repeat):
            for c in levels:
                n = requests_per_level or max(4, 2 * c)
                cells = {}
                for policy in alternating(policies, r):
                    server_cpu = _cpu_seconds(server_pid)
                    entry = await _level(client, model, prompts, policy, c, n, max_tokens, temperature, ignore_eos)
                    after = _cpu_seconds(server_pid)
                    entry["server_cpu_share"] = (after - server_cpu) / entry["wall_s"] if after is not None else None
                    got = await _steps_after(http, url, seen[0]) if seen else None
                    cells[policy] = got[1] if got and got[0] - seen[0] == len(got[1]) else None   # None: steps lost
                    seen = got
                    entries[(policy, c)].append(entry)
                    done += 1
                    if progress:
                        progress(done, total, f"{f'repeat {r + 1}/{repeat}, ' if repeat > 1 else ''}concurrency {c} "
                                              f"{policy}: {entry['output_tok_per_s']:.2f} tok/s, {entry['errors']} errors")
                _price_steps(cells, {p: entries[(p, c)][-1] for p in policies})
        runs = {p: {str(c): median_entry(entries[(p, c)]) for c in levels} for p in policies}
        for c in levels:
            per_repeat = {p: runs[p][str(c)]["output_tok_per_s_per_repeat"] for p in policies}
            for p in policies:
                runs[p][str(c)].update(against_best(per_repeat, p))
        return model, runs
    finally:
        await client.close()
        await http.aclose()


async def _steps_after(http, url: str, after: int) -> tuple[int, list[dict]] | None:
    """(the server's step count, its step records numbered above `after`) from GET /v1/speculation/steps; None
    where the server has no such endpoint (not specedge) or it failed."""
    import httpx

    try:
        response = await http.get(url.rstrip("/") + "/speculation/steps", params={"after": after, "recent": 4096})
        if response.status_code != 200:
            return None
        body = response.json()
        return body["steps"], body["recent"]
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def _price_steps(cells: dict[str, list[dict] | None], entries: dict[str, dict]) -> None:
    """Each cell's steps_gain (step_gain.speculation_effect's gain_share): its steps with k > 0 against its own plain
    steps, rows it never ran plain priced by the plain steps of the other cells at this concurrency; None where
    the server's steps were not read."""
    pooled = plain_step_s([s for steps in cells.values() if steps for s in steps])
    for policy, entry in entries.items():
        steps = cells.get(policy)
        entry["steps_gain"] = speculation_effect(steps, pooled)["gain_share"] if steps is not None else None


def run_bench_serve(url: str, prompts: list[dict], policies=DEFAULT_POLICIES, levels=DEFAULT_LEVELS,
                    requests_per_level: int | None = None, max_tokens: int = 64, temperature: float = 0.0,
                    ignore_eos: bool = True, api_key: str | None = None, model: str | None = None,
                    server_pid: int | None = None, progress=None, repeat: int = 1, warm_up: bool = True) -> dict:
    """-> results (see the module docstring); url is the server's base URL ending in /v1. repeat > 1 runs every
    (concurrency, policy) cell that many times, interleaved, and reports medians (median_entry). warm_up=False
    skips the unmeasured request per policy (a caller running one cell at a time on a warm server)."""
    model, runs = asyncio.run(_run(url, api_key, model, prompts, list(policies), list(levels), requests_per_level,
                                   max_tokens, temperature, ignore_eos, server_pid, progress, repeat, warm_up))
    return {"url": url, "model": model, "policies": list(policies), "levels": list(levels), "repeat": repeat,
            "max_tokens": max_tokens, "temperature": temperature, "ignore_eos": ignore_eos,
            "prompts": len(prompts), "runs": runs,
            "machine": {"cpu": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                        "python": platform.python_version()}}


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on now (the OS picks it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def served(bundle: str, max_batch: int, threads: int | None = None, extra_args=(), timeout: float = 300.0,
           log_path: Path | None = None):
    """`specedge serve BUNDLE` in a subprocess on a free loopback port -> (base URL, pid); stopped with SIGTERM.
    Its log goes to log_path (default: a temporary file)."""
    import tempfile

    import httpx

    port = free_port()
    cmd = [sys.executable, "-m", "specedge.cli", "serve", str(bundle), "--port", str(port), "--max-batch",
           str(max_batch), "--max-queue", "256", "--no-prompt-cache",      # the same prompts again and again
           *(["--threads", str(threads)] if threads else []), *extra_args]
    log = open(log_path, "w+") if log_path else tempfile.TemporaryFile("w+")
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        end = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                log.seek(0)
                err = log.read().strip().splitlines()
                raise SpecedgeError(f"the server exited: {err[-1] if err else proc.returncode}")
            try:
                if httpx.get(url + "/health", timeout=1.0).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > end:
                raise SpecedgeError(f"the server did not come up within {timeout:g} s")
            time.sleep(0.2)
        yield url + "/v1", proc.pid
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.close()


def table(results: dict) -> str:
    head = (f"{'conc':>4} {'policy':<14} {'req/s':>6} {'out tok/s':>9} {'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'TPOT p50':>9} {'TPOT p99':>9} {'ITL p50':>8} {'ITL p99':>8} {'acc len':>7} {'err':>4} "
            f"{'client cpu':>10} {'vs best':>8} {'steps gain':>10}")
    lines = [head, "-" * len(head)]

    def ms(x):
        return f"{1000 * x:7.1f}ms" if x is not None else f"{'-':>9}"

    for c in results["levels"]:
        for policy in results["policies"]:
            e = results["runs"][policy][str(c)]
            lines.append(f"{c:>4} {policy:<14} {e['request_throughput']:6.2f} {e['output_tok_per_s']:9.2f} "
                         f"{ms(e['ttft_s']['p50'])} {ms(e['ttft_s']['p99'])} {ms(e['tpot_s']['p50'])} "
                         f"{ms(e['tpot_s']['p99'])} {ms(e['itl_s']['p50'])[1:]} {ms(e['itl_s']['p99'])[1:]} "
                         f"{e['mean_accepted_length']:7.2f} {e['errors']:>4} {100 * e['client_cpu_share']:9.1f}% "
                         f"{percent_change(e.get('vs_best_other')):>9} "
                         f"{percent_change(_ratio(e.get('steps_gain'))):>10}")
    return "\n".join(lines)


def _ratio(gain: float | None) -> float | None:
    return None if gain is None else 1.0 + gain


def plots(results: dict, out: Path) -> list[Path] | None:
    """Throughput and TPOT against concurrency, one line per policy; None when matplotlib is missing."""
    from specedge.bench.report import _legend, _pyplot, _save

    plt = _pyplot()
    if plt is None:
        return None
    written, levels = [], results["levels"]
    for key, label, name in (("output_tok_per_s", "output tokens / s", "serve_throughput.png"),
                             ("tpot_s", "time per output token, p50 (ms)", "serve_tpot.png")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for policy in results["policies"]:
            ys = []
            for c in levels:
                value = results["runs"][policy][str(c)][key]
                ys.append(1000 * value["p50"] if isinstance(value, dict) and value["p50"] is not None
                          else value if not isinstance(value, dict) else float("nan"))
            ax.plot(levels, ys, marker="o", label=policy)
        if len(levels) > 1:
            ax.set_xscale("log", base=2)
        ax.set(xlabel="concurrent requests", ylabel=label, title=f"{label} against concurrency")
        ax.set_xticks(levels, [str(c) for c in levels])
        _legend(ax)
        _save(plt, fig, out / name, written)
    return written
