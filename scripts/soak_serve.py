"""Soak test of `specedge serve` (a script, not a CI test): N concurrent streams for some minutes, then checks that
nothing was lost, no request failed, and the server's resident memory stayed flat (mean RSS of the first minute after
--warmup-minutes vs the last minute, within --rss-tolerance: the first minutes grow onnxruntime's arenas to the shapes
the load brings, 2.0 to 4.4 GiB in the first 90 s on the real int4 pair, and are not a leak).

    python scripts/soak_serve.py BUNDLE [--minutes 10] [--streams 16] [--max-tokens 64] [--out soak.json]
    python scripts/soak_serve.py --url http://127.0.0.1:8000/v1 --pid SERVER_PID [...]

With BUNDLE it starts `specedge serve` on a free loopback port (max batch = --streams) and stops it at the end;
with --url it drives a running server (RSS needs its --pid). Policies rotate per request (target, fixed:4,
adaptive) and so do the built-in bench prompts; every request is streamed with a usage chunk and must come back
with exactly --max-tokens tokens (ignore_eos) and [DONE]. Exit status 0 only if every check passed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

from specedge.bench.serve import served, speculation_body
from specedge.prompts import BUILTIN_PROMPTS

POLICIES = ("target", "fixed:4", "adaptive")


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


async def soak(url: str, pid: int | None, minutes: float, streams: int, max_tokens: int, api_key: str | None,
               warmup_minutes: float = 2.0):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url, api_key=api_key or "-", max_retries=0, timeout=300.0)
    model = (await client.models.list()).data[0].id
    end = time.monotonic() + 60 * minutes
    started = time.monotonic()
    counts = {"sent": 0, "ok": 0, "errors": 0, "short": 0}
    errors: list[str] = []
    rss: list[tuple[float, int]] = []
    n = 0

    async def one(i: int) -> None:
        prompt = BUILTIN_PROMPTS[i % len(BUILTIN_PROMPTS)]
        extra = {"speculation": speculation_body(POLICIES[i % len(POLICIES)]), "ignore_eos": True}
        common = dict(model=model, max_tokens=max_tokens, temperature=0, stream=True,
                      stream_options={"include_usage": True}, extra_body=extra)
        counts["sent"] += 1
        try:
            if prompt.get("chat"):
                stream = await client.chat.completions.create(
                    messages=[{"role": "user", "content": prompt["prompt"]}], **common)
            else:
                stream = await client.completions.create(prompt=prompt["prompt"], **common)
            usage = None
            async for chunk in stream:
                usage = chunk.usage or usage
            if usage is None or usage.completion_tokens != max_tokens:
                counts["short"] += 1
                errors.append(f"request {i}: {usage.completion_tokens if usage else 'no usage'} tokens")
            else:
                counts["ok"] += 1
        except Exception as err:  # noqa: BLE001 - counted, reported
            counts["errors"] += 1
            errors.append(f"request {i}: {type(err).__name__}: {err}")

    async def worker() -> None:
        nonlocal n
        while time.monotonic() < end:
            i, n = n, n + 1
            await one(i)

    async def sampler() -> None:
        while time.monotonic() < end:
            if pid is not None and (value := rss_bytes(pid)) is not None:
                rss.append((time.monotonic() - started, value))
            await asyncio.sleep(5)

    await asyncio.gather(sampler(), *(worker() for _ in range(streams)))
    await client.close()
    total = time.monotonic() - started
    warm = 60 * warmup_minutes
    first = [v for t, v in rss if warm <= t < warm + 60]
    last = [v for t, v in rss if t >= max(total - 60, warm + 60)]
    report = {"minutes": minutes, "streams": streams, "max_tokens": max_tokens, "wall_s": total, **counts,
              "error_samples": errors[:10], "warmup_minutes": warmup_minutes, "rss_samples": rss}
    if first and last:
        report["rss_first_minute_bytes"] = sum(first) / len(first)      # the first minute after the warm-up
        report["rss_last_minute_bytes"] = sum(last) / len(last)
        report["rss_change"] = report["rss_last_minute_bytes"] / report["rss_first_minute_bytes"] - 1
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle", nargs="?")
    ap.add_argument("--url")
    ap.add_argument("--pid", type=int, help="the server's process id (RSS), with --url")
    ap.add_argument("--api-key")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--streams", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int)
    ap.add_argument("--rss-tolerance", type=float, default=0.05)
    ap.add_argument("--warmup-minutes", type=float, default=2.0,
                    help="minutes of arena growth left out of the memory comparison")
    ap.add_argument("--out", default="soak.json")
    args = ap.parse_args()
    if (args.bundle is None) == (args.url is None):
        ap.error("give either a BUNDLE to serve or --url of a running server")
    if args.url:
        report = asyncio.run(soak(args.url, args.pid, args.minutes, args.streams, args.max_tokens, args.api_key,
                                  args.warmup_minutes))
    else:
        with served(args.bundle, args.streams, args.threads) as (url, pid):
            report = asyncio.run(soak(url, pid, args.minutes, args.streams, args.max_tokens, args.api_key,
                                      args.warmup_minutes))
    Path(args.out).write_text(json.dumps(report, indent=1) + "\n")
    change = report.get("rss_change")
    flat = change is None or abs(change) <= args.rss_tolerance
    print(f"{report['ok']}/{report['sent']} requests complete, {report['errors']} errors, {report['short']} short; "
          + (f"RSS first minute after warm-up {report['rss_first_minute_bytes'] / 2**20:.1f} MiB, last minute "
             f"{report['rss_last_minute_bytes'] / 2**20:.1f} MiB ({100 * change:+.1f}%)" if change is not None
             else "RSS not measured (needs the server's pid and a minute beyond the warm-up)")
          + f"; wrote {args.out}")
    return 0 if report["ok"] == report["sent"] and flat else 1


if __name__ == "__main__":
    sys.exit(main())
