"""Shared by the serve tests: a tiny batched bundle with a chat template, and servers on ephemeral ports."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import numpy as np

import tiny_models as tm
from conftest import TARGET_ROWS, _export
from specedge.runtime import load
from specedge.serve import Limits
from specedge.serve.server import ServerThread

MODEL = "tiny"


def serve_bundle(workdir: Path) -> Path:
    """qwen2 target + a perturbed copy as draft (accepts often), --attention standard, a chat template; exported
    once per session (several test modules share it)."""
    path = workdir / "serve-chat"
    if not (path / "manifest.json").exists():
        target = tm.make_model("qwen2", TARGET_ROWS, seed=1)
        _export(workdir, "serve-chat", target, tm.perturbed(target, seed=3, noise=0.01), tm.byte_tokenizer(chat=True),
                attention="standard")
    return path


def slow_down(gen, seconds: float) -> None:
    """Every target call takes `seconds` longer (so that a request is still running when a test acts on it)."""
    run = gen.target.run

    def slow(*args, **kwargs):
        time.sleep(seconds)
        return run(*args, **kwargs)

    gen.target.run = slow


@contextlib.contextmanager
def running(bundle: Path, max_batch: int = 4, max_queue: int = 16, slow: float = 0.0, api_key: str | None = None,
            max_body_bytes: int = 1 << 20, drain_timeout: float = 5.0, **limits):
    gen = load(bundle, max_batch=max_batch, max_queue=max_queue, background=True, threads=1)
    if slow:
        slow_down(gen, slow)
    server = ServerThread(gen, Limits(model=MODEL, **limits), api_key=api_key, max_body_bytes=max_body_bytes,
                          drain_timeout=drain_timeout).start()
    try:
        yield server, gen
    finally:
        server.stop()
        gen.close()


def health(server) -> dict:
    return httpx.get(server.base + "/health").json()


def wait_idle(server, timeout: float = 10.0) -> dict:
    """Polls /health until no request is running or waiting -> the last answer."""
    end = time.monotonic() + timeout
    while True:
        state = health(server)
        if (state["running"] == 0 and state["waiting"] == 0) or time.monotonic() > end:
            return state
        time.sleep(0.02)


def sse_events(lines) -> list:
    """`data: ...` lines of an SSE body -> the decoded objects, with "[DONE]" kept as the string."""
    out = []
    for line in lines:
        if line.startswith("data: "):
            payload = line[len("data: "):]
            out.append(payload if payload == "[DONE]" else json.loads(payload))
    return out


@contextlib.contextmanager
def serve_process(args: list[str], log: Path, env: dict | None = None):
    """`specedge serve ARGS` as its own process (stderr into `log`); killed if the block leaves it running."""
    with open(log, "w") as stderr:
        proc = subprocess.Popen([sys.executable, "-m", "specedge.cli", "serve", *args], stdout=subprocess.DEVNULL,
                                stderr=stderr, env=env or {**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        yield proc
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def script_target(gen, reply: list[int], prompt_tokens: int) -> None:
    """The target predicts `reply` after a prompt of `prompt_tokens` tokens, then eos: its rows at those positions
    are replaced (one-hot logits, or the ids), so that a test can make the server see a given reply."""
    run = gen.target.__dict__.setdefault("unscripted_run", gen.target.run)     # a new script replaces the last
    eos = gen.manifest["eos_token_ids"][0]
    after = {prompt_tokens - 1 + i: t for i, t in enumerate([*reply, eos])}

    def scripted(starts, tokens, last, lo=0, want="logits"):
        out = run(starts, tokens, last, lo, want)
        forced = []
        for b, rows in enumerate(out):
            rows = np.array(rows, copy=True)
            first = starts[b] + len(tokens[b]) - last[b]
            for j in range(last[b]):
                token = after.get(first + j)
                if token is None:
                    continue
                if want == "ids":
                    rows[j] = token
                else:
                    rows[j] = -1e9
                    rows[j, token] = 0.0
            forced.append(rows)
        return forced

    gen.target.run = scripted
