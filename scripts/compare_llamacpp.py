"""specedge against llama.cpp's own server (`llama-server`) on the same GGUF pair, one machine, alternating.

    # llama.cpp built from source, CPU only (the steps and version used: docs/peers.md)
    python scripts/compare_llamacpp.py LLAMA_SERVER TARGET.gguf DRAFT.gguf BUNDLE \
        [--repeat 3] [--max-new-tokens 64] [--draft-max 3,8] [--threads 2] [--out results.json]

BUNDLE is specedge's export of the same two GGUF files (`make demo`'s int4 pair: dequantized, then int4 again).
Configurations, each on the built-in bench prompts with the same prompt token ids:
- `llama.cpp target`: llama-server with the target alone;
- `llama.cpp draft N`: llama-server with `-md DRAFT --spec-type draft-simple --spec-draft-n-max N` (one server
  per N; llama.cpp's default N is 3, and its server ignores per-request speculation settings);
- `specedge target` and `specedge adaptive` (and `specedge fixed:4`), the bundle loaded in this process.
Greedy (temperature 0, top_k 1), eos ignored so every run makes exactly --max-new-tokens tokens, no prompt
reuse between requests (`cache_prompt` false, specedge's prompt cache off). Every configuration runs each
prompt in turn before the next prompt starts, the order rotating each round, so drift hits them alike; idle
servers wait without spinning. Tokens/s are wall time around the whole request, prefill included, as in
`specedge bench` (llama.cpp's through HTTP on loopback; its own timings, which leave HTTP out, are in the JSON).
Prints the median over rounds and each configuration's ratio to `llama.cpp target` round by round, the
acceptance, and which runs produced the same tokens as their own engine's target-only run.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

import httpx

from specedge.bench.serve import free_port
from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime import load


class LlamaServer:
    """One llama-server process on loopback; stopped by close()."""

    def __init__(self, binary: str, target: str, draft: str | None, draft_max: int, threads: int, ctx: int,
                 parallel: int = 1):
        self.port = free_port()
        command = [binary, "-m", target, "--host", "127.0.0.1", "--port", str(self.port), "-t", str(threads),
                   "-tb", str(threads), "-c", str(ctx), "-np", str(parallel), "--no-cache-prompt", "--no-webui"]
        if draft:
            command += ["-md", draft, "--spec-type", "draft-simple", "--spec-draft-n-max", str(draft_max)]
        self.log = tempfile.NamedTemporaryFile("w", prefix="llama-server-", suffix=".log", delete=False)
        libraries = os.path.dirname(os.path.abspath(binary))         # a build's shared libraries sit beside it
        paths = [libraries, os.environ.get("LD_LIBRARY_PATH")]
        env = {**os.environ, "LD_LIBRARY_PATH": os.pathsep.join(p for p in paths if p)}
        self.process = subprocess.Popen(command, stdout=self.log, stderr=subprocess.STDOUT, env=env)
        self.url = f"http://127.0.0.1:{self.port}"
        self.client = httpx.Client(base_url=self.url, timeout=600)
        try:
            self._wait_ready(300)
        except BaseException:
            self.close(keep_log=True)
            raise

    def _wait_ready(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"llama-server exited with {self.process.returncode}: see {self.log.name}")
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"llama-server did not become ready in {seconds:.0f} s: see {self.log.name}")

    def generate(self, ids: list[int], n: int) -> dict:
        body = {"prompt": ids, "n_predict": n, "temperature": 0, "top_k": 1, "ignore_eos": True,
                "cache_prompt": False, "return_tokens": True, "stream": False}
        start = time.perf_counter()
        reply = self.client.post("/completion", json=body)
        seconds = time.perf_counter() - start
        reply.raise_for_status()
        data = reply.json()
        timings = data["timings"]
        return {"tokens": data["tokens"], "seconds": seconds,
                "server_seconds": (timings["prompt_ms"] + timings["predicted_ms"]) / 1000,
                "drafted": timings.get("draft_n", 0), "accepted": timings.get("draft_n_accepted", 0)}

    def close(self, keep_log: bool = False) -> None:
        """Stops the server; its log is removed unless it explains a failed start."""
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
        self.client.close()
        self.log.close()
        if not keep_log:
            os.unlink(self.log.name)


def specedge_runner(gen, options: dict):
    def run(ids: list[int], n: int) -> dict:
        result = gen.generate_ids(ids, max_new_tokens=n, ignore_eos=True, **options)
        stats = result.stats
        return {"tokens": result.tokens, "seconds": stats.total_s, "drafted": stats.n_drafted,
                "accepted": stats.n_accepted, "verify_calls": stats.n_verify}
    return run


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("llama_server", help="path of llama.cpp's llama-server binary")
    parser.add_argument("target_gguf")
    parser.add_argument("draft_gguf")
    parser.add_argument("bundle", help="specedge's bundle of the same pair")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--draft-max", default="3,8", help="llama.cpp's --spec-draft-n-max values, one server each")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", help="write every run as JSON here")
    args = parser.parse_args(argv)
    n = args.max_new_tokens
    gen = load(args.bundle, threads=args.threads, prompt_cache=False)
    prompts = [gen.encode(row["prompt"], row.get("chat", False)) for row in BUILTIN_PROMPTS]
    ctx = 2 * (max(map(len, prompts)) + n) + 64
    servers = {}
    try:
        servers["llama.cpp target"] = LlamaServer(args.llama_server, args.target_gguf, None, 0, args.threads, ctx)
        for draft_max in (int(v) for v in args.draft_max.split(",") if v):
            servers[f"llama.cpp draft {draft_max}"] = LlamaServer(args.llama_server, args.target_gguf,
                                                                  args.draft_gguf, draft_max, args.threads, ctx)
        runners = {name: server.generate for name, server in servers.items()}
        runners["specedge target"] = specedge_runner(gen, {"use_draft": False, "k": 0})
        runners["specedge fixed:4"] = specedge_runner(gen, {"policy": "fixed:4"})
        runners["specedge adaptive"] = specedge_runner(gen, {"policy": "adaptive"})
        print(f"threads {args.threads} for every engine; specedge's target single steps as {gen.target_min_rows} "
              f"row(s); {len(prompts)} prompts x {args.repeat} rounds, {n} new tokens", file=sys.stderr)
        for run in runners.values():                                       # warm-up, excluded
            run(prompts[0], 8)
        runs = race(runners, prompts, n, args.repeat)
    finally:
        for server in servers.values():
            server.close()
    report(runs, args.repeat)
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"max_new_tokens": n, "threads": args.threads, "runs": runs}, f, indent=1)


def race(runners: dict, prompts: list[list[int]], n: int, repeat: int) -> dict:
    """{configuration: [[run per prompt] per round]}; each prompt runs on every configuration, rotating order."""
    names = list(runners)
    runs = {name: [] for name in names}
    for r in range(repeat):
        for name in names:
            runs[name].append([])
        for p, ids in enumerate(prompts):
            shift = (r * len(prompts) + p) % len(names)
            for name in names[shift:] + names[:shift]:
                runs[name][r].append(runners[name](ids, n))
        print(f"round {r + 1}/{repeat} done", file=sys.stderr)
    return runs


def report(runs: dict, repeat: int) -> None:
    rate = {name: [sum(len(x["tokens"]) for x in rnd) / sum(x["seconds"] for x in rnd) for rnd in rounds]
            for name, rounds in runs.items()}
    base = "llama.cpp target"
    for name, values in rate.items():
        ratios = [v / b for v, b in zip(values, rate[base])]
        flat = [x for rnd in runs[name] for x in rnd]
        drafted, accepted = sum(x["drafted"] for x in flat), sum(x["accepted"] for x in flat)
        engine_base = "llama.cpp target" if name.startswith("llama") else "specedge target"
        same = sum(x["tokens"] == y["tokens"] for a, b in zip(runs[name], runs[engine_base]) for x, y in zip(a, b))
        accept = f"acceptance {accepted / drafted:.2f} of {drafted}" if drafted else "no drafts"
        print(f"{name:<20} {statistics.median(values):6.2f} tok/s  {statistics.median(ratios):5.2f}x "
              f"(per round {' '.join('%.2f' % v for v in ratios)})  {accept}; "
              f"same tokens as its target alone {same}/{len(flat)}")
    ours, theirs = runs["specedge target"], runs[base]
    same = sum(x["tokens"] == y["tokens"] for a, b in zip(ours, theirs) for x, y in zip(a, b))
    print(f"specedge target and llama.cpp target: same tokens on {same}/{sum(map(len, ours))} runs "
          f"(the weights differ: llama.cpp runs Q4_K_M, the bundle its own quantization)")


if __name__ == "__main__":
    main(sys.argv[1:])
