"""Serving several clients: `specedge serve` against llama.cpp's `llama-server` (continuous batching) on the
same GGUF pair, driven by bench-serve's client (the official openai client, streamed completions).

    python scripts/compare_llamacpp_serve.py LLAMA_SERVER TARGET.gguf DRAFT.gguf BUNDLE \
        [--concurrency 1,2,4,8] [--repeat 2] [--max-tokens 64] [--draft-max 3] [--threads 2] [--out DIR]

BUNDLE must run batches (`--attention standard`). Servers, all started first and idle while another is measured:
- `llama.cpp`: llama-server -np C_MAX (one slot per client), the target alone;
- `llama.cpp draft N`: the same with `-md DRAFT --spec-type draft-simple --spec-draft-n-max N` (0 for none);
- `specedge serve BUNDLE --max-batch C_MAX`, measured with the policies target and adaptive (--policies).
Neither server reuses a prompt's KV between requests (`--no-cache-prompt`, `--no-prompt-cache`). Each repeat
sweeps every server through every concurrency level, servers in turn (reverse order on odd repeats), so drift
hits them alike. Prints output tokens/s per (configuration, concurrency) as the median over repeats, its ratio
to `llama.cpp` (the target alone) repeat by repeat, TTFT and TPOT p50; DIR gets raw.json (every
run_bench_serve result), results.json (the table) and throughput.png.
"""

import argparse
import contextlib
import json
import os
import statistics
import sys
from pathlib import Path

from compare_llamacpp import LlamaServer

from specedge.bench.order import alternating
from specedge.bench.serve import run_bench_serve, served
from specedge.prompts import BUILTIN_PROMPTS


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("llama_server")
    parser.add_argument("target_gguf")
    parser.add_argument("draft_gguf")
    parser.add_argument("bundle")
    parser.add_argument("--concurrency", default="1,2,4,8")
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--draft-max", type=int, default=3, help="llama.cpp's --spec-draft-n-max (0: no such server)")
    parser.add_argument("--policies", default="target,adaptive", help="specedge's, as in bench-serve")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--out", default="compare-llamacpp-serve")
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.concurrency.split(",")]
    policies = args.policies.split(",")
    slots = max(levels)
    ctx = slots * 512                 # per slot: the longest built-in prompt (81 tokens) + max_tokens, with room
    configs: dict[str, tuple[str, list[str]]] = {}
    with contextlib.ExitStack() as stack:
        server = LlamaServer(args.llama_server, args.target_gguf, None, 0, args.threads, ctx, slots)
        stack.callback(server.close)
        configs["llama.cpp"] = (server.url + "/v1", ["target"])
        if args.draft_max:
            server = LlamaServer(args.llama_server, args.target_gguf, args.draft_gguf, args.draft_max,
                                 args.threads, ctx, slots)
            stack.callback(server.close)
            configs[f"llama.cpp draft {args.draft_max}"] = (server.url + "/v1", ["target"])
        url, _pid = stack.enter_context(served(args.bundle, slots, threads=args.threads))
        configs["specedge"] = (url, policies)
        results = {name: [] for name in configs}
        for r in range(args.repeat):
            for name in alternating(list(configs), r):
                base, names = configs[name]
                results[name].append(run_bench_serve(base, BUILTIN_PROMPTS, names, levels, max_tokens=args.max_tokens,
                                                     progress=lambda d, t, m, n=name: print(n, m, file=sys.stderr)))
    report(results, levels, Path(args.out))


def report(results: dict, levels: list[int], out: Path) -> None:
    """{server: [run_bench_serve result per repeat]} -> a table on stdout, results.json and throughput.png."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "raw.json").write_text(json.dumps(results, indent=1))
    rows = {}                                                  # (label, level) -> [repeat's entry]
    for server, repeats in results.items():
        for res in repeats:
            for policy, cells in res["runs"].items():
                label = server if server.startswith("llama") else f"specedge {policy}"
                for c in levels:
                    rows.setdefault((label, c), []).append(cells[str(c)])
    labels = list(dict.fromkeys(label for label, _ in rows))
    print(f"{'configuration':<20} {'C':>3} {'tok/s':>7} {'vs llama.cpp':>12}  per repeat    "
          "TTFT p50  TPOT p50  accepted")
    table = []
    for label in labels:
        for c in levels:
            cells, base = rows[(label, c)], rows[("llama.cpp", c)]
            rate = [e["output_tok_per_s"] for e in cells]
            ratios = [a / b["output_tok_per_s"] for a, b in zip(rate, base)]
            ttft = statistics.median(e["ttft_s"]["p50"] for e in cells)
            tpot = statistics.median(e["tpot_s"]["p50"] for e in cells)
            mal = statistics.median(e["mean_accepted_length"] for e in cells) if label.startswith("specedge") else None
            errors = sum(e["errors"] for e in cells)
            table.append({"configuration": label, "concurrency": c, "output_tok_per_s": statistics.median(rate),
                          "per_repeat": rate, "vs_llamacpp": statistics.median(ratios), "ttft_p50_s": ttft,
                          "tpot_p50_s": tpot, "mean_accepted_length": mal, "errors": errors})
            print(f"{label:<20} {c:>3} {statistics.median(rate):7.2f} {statistics.median(ratios):11.2f}x  "
                  f"{' '.join('%.2f' % v for v in ratios):<12} {ttft:8.3f}s {tpot * 1000:7.1f}ms  "
                  f"{'%.2f' % mal if mal else '-'}{'  ERRORS %d' % errors if errors else ''}")
    (out / "results.json").write_text(json.dumps(table, indent=1))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(6, 4))
    for label in labels:
        ax.plot(levels, [next(t["output_tok_per_s"] for t in table if t["configuration"] == label and
                              t["concurrency"] == c) for c in levels], marker="o", label=label)
    ax.set(xlabel="concurrent clients", ylabel="output tokens / s (median over repeats)", xscale="log", xticks=levels,
           xticklabels=[str(c) for c in levels], title="specedge serve vs llama-server, one machine")
    ax.minorticks_off()
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "throughput.png", dpi=120)
    print(f"wrote {out / 'results.json'} and {out / 'throughput.png'}")


if __name__ == "__main__":
    main(sys.argv[1:])
