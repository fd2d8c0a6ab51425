"""The bench table (text) and plots (PNG, when matplotlib is installed)."""

from __future__ import annotations

from pathlib import Path


def table(results: dict) -> str:
    width = max([11, *map(len, results["policies"])])            # long names (adaptive:stop@hybrid) stay aligned
    head = (f"{'policy':<{width}} {'tok/s':>7} {'speedup':>8} {'acc len':>8} {'k mean':>7} {'tgt calls/tok':>13} "
            f"{'draft':>6} {'verify':>7} {'other':>6} {'predicted':>9} {'meas/pred':>9} {'same':>5}  "
            "acceptance per position")
    lines = [head, "-" * len(head)]
    for name, p in results["policies"].items():
        split = p["time_split"]
        same = {True: "yes", False: "NO", None: "n/a"}[p["identical_to_target"]]
        per_pos = " ".join(f"{a:.2f}" for a in p["acceptance_per_position"]) or "-"
        predicted = f"{p['predicted_speedup']:8.2f}x" if p.get("predicted_speedup") else f"{'-':>9}"
        ratio = f"{p['measured_vs_predicted']:9.2f}" if p.get("measured_vs_predicted") else f"{'-':>9}"
        lines.append(f"{name:<{width}} {p['tok_per_s']:7.2f} {p['speedup']:7.2f}x {p['mean_accepted_length']:8.2f} "
                     f"{p['k_mean']:7.2f} {p['target_calls_per_token']:13.2f} {100 * split.get('draft', 0):5.1f}% "
                     f"{100 * split.get('verify', 0):6.1f}% {100 * split.get('other', 0):5.1f}% {predicted} {ratio} "
                     f"{same:>5}  {per_pos}")
    memory, rss = results.get("memory"), results.get("machine", {}).get("peak_rss_bytes")
    if memory:
        parts = [f"{role} {m['weights']} weights {m['weight_bytes'] / 2**20:.0f} MiB + KV {m['kv_bytes'] / 2**20:.0f} MiB"
                 for role, m in memory.items() if isinstance(m, dict)]
        lines.append(f"memory: {', '.join(parts)}; peak RSS {rss / 2**30:.2f} GiB" if rss else f"memory: {', '.join(parts)}")
    bound = results.get("bandwidth")
    if bound:
        lines.append(f"bandwidth: read {bound['read_bytes_per_s'] / 1e9:.1f} GB/s ({bound['read_kernel']}, "
                     f"{bound['threads']} threads); target reads {bound['bytes_per_token'] / 2**20:.0f} MiB/token -> "
                     f"bound {bound['bound_tok_per_s']:.2f} tok/s; plain decode at "
                     f"{bound.get('fraction_of_bound', 0):.2f} of it")
    cpu = results.get("machine", {}).get("cpu")
    if cpu:
        machine = results["machine"]
        rows = machine.get("target_min_rows", 1)
        lines.append(f"cpu: {cpu}, {machine['cpus']} logical cpus"
                     + (", target single steps as 2 rows (exact rows on this cpu)" if rows > 1 else "")
                     + ("" if machine.get("target_steps_exact", True) else
                        ", target single steps as 1 row: NOT equal to verify rows on this cpu (--target-rows 1)"))
        if machine.get("backend", "cpu") != "cpu":
            lines.append(f"backend: {machine['backend_detail']}")
    rejected = []
    for name, p in results["policies"].items():
        shown = ", ".join(f"{r['position']}: {r['draft_text']!r} -> {r['target_text']!r} x{r['count']}"
                          for r in p["top_rejections"][:4])
        if shown:
            rejected.append(f"  {name:<{width}} {shown}")
    if rejected:                                   # none under --policies target, or with every draft accepted
        lines += ["", "top rejected draft tokens (position: draft -> target wanted, count)", *rejected]
    return "\n".join(lines)


def _pyplot():
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _save(plt, fig, path: Path, written: list) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    written.append(path)


def _legend(ax) -> None:
    if ax.get_legend_handles_labels()[1]:              # a target-only run draws no labelled series
        ax.legend(fontsize=8)


def plots(results: dict, out: Path) -> list[Path] | None:
    """Writes the PNG plots; None when matplotlib is missing."""
    plt = _pyplot()
    if plt is None:
        return None
    policies = results["policies"]
    written = []

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, p in policies.items():
        if p["acceptance_per_position"]:
            xs = range(1, len(p["acceptance_per_position"]) + 1)
            ax.plot(xs, p["acceptance_per_position"], marker="o", label=name)
    ax.set(xlabel="draft position", ylabel="acceptance rate", ylim=(0, 1.05), title="Acceptance per draft position")
    _legend(ax)
    _save(plt, fig, out / "acceptance_per_position.png", written)

    fig, ax = plt.subplots(figsize=(7, 4))
    names = [n for n, p in policies.items() if p["accepted_length_histogram"]]
    for j, name in enumerate(names):
        hist = policies[name]["accepted_length_histogram"]
        total = sum(hist.values())
        xs = [int(n) + (j - len(names) / 2) * 0.8 / max(len(names), 1) for n in hist]
        ax.bar(xs, [c / total for c in hist.values()], width=0.8 / max(len(names), 1), label=name)
    ax.set(xlabel="tokens committed per verify call", ylabel="share of verify calls",
           title="Accepted lengths")
    _legend(ax)
    _save(plt, fig, out / "accepted_lengths.png", written)

    fig, ax = plt.subplots(figsize=(7, 4))
    for name, p in policies.items():
        if p["k_history_all"]:
            ax.plot(p["k_history_all"], drawstyle="steps-post", label=name)
    ax.set(xlabel="decode step (all requests in order)", ylabel="k", title="k chosen over time")
    _legend(ax)
    _save(plt, fig, out / "k_over_time.png", written)

    fig, ax = plt.subplots(figsize=(7, 4))
    ax.bar(list(policies), [p["tok_per_s"] for p in policies.values()])
    ax.set(ylabel="tokens / s (median over repeats)", title="Throughput per policy")
    ax.tick_params(axis="x", rotation=45)
    _save(plt, fig, out / "tokens_per_s.png", written)
    return written


def percent_change(ratio: float | None) -> str:
    return "" if ratio is None else f"{100 * (ratio - 1):+.1f}%"


def _paired_text(configs: dict, name: str) -> str:
    """'-1.2% (-3.0, +0.6)' against the best other configuration by median throughput, wave by wave."""
    others = [n for n in configs if n != name]
    best = max(others, key=lambda n: configs[n]["aggregate_tok_per_s"]) if others else None
    pair = configs[name].get("paired", {}).get(best)
    if not pair:
        return ""
    if pair["low"] is None:
        return percent_change(pair["ratio"])
    return f"{percent_change(pair['ratio'])} ({100 * (pair['low'] - 1):+.1f}, {100 * (pair['high'] - 1):+.1f})"


def batch_table(results: dict) -> str:
    """One row per (batch, configuration). 'vs best other': the median over repeats of the configuration's
    throughput against the best other configuration's (by median) in the same repeat; 'paired, 95%': against
    that configuration wave by wave, the geometric mean ratio and its 95% interval."""
    head = (f"{'batch':>5} {'config':<16} {'agg tok/s':>9} {'speedup':>8} {'per-seq tok/s':>13} {'acc len':>8} "
            f"{'k mean':>7} {'tgt calls':>9} {'same':>5} {'vs best other':>13} {'paired, 95%':>22}")
    lines = [head, "-" * len(head)]
    for b, configs in results["batches"].items():
        for name, e in configs.items():
            same = {True: "yes", False: "NO", None: "n/a"}[e["identical_to_target"]]
            lines.append(f"{b:>5} {name:<16} {e['aggregate_tok_per_s']:9.2f} {e['speedup']:7.2f}x "
                         f"{e['per_sequence_tok_per_s']:13.2f} {e['mean_accepted_length']:8.2f} {e['k_mean']:7.2f} "
                         f"{e['target_calls']:9.0f} {same:>5} {percent_change(e.get('vs_best_other')):>13} "
                         f"{_paired_text(configs, name):>22}")
    cpu = results.get("machine", {}).get("cpu")
    if cpu:
        lines.append(f"cpu: {cpu}, {results['machine']['cpus']} logical cpus")
    return "\n".join(lines)


def batch_plots(results: dict, out: Path) -> list[Path] | None:
    """Aggregate throughput and k against batch size, one line per configuration."""
    plt = _pyplot()
    if plt is None:
        return None
    written, sizes = [], results["sizes"]
    for key, label, name in (("aggregate_tok_per_s", "aggregate tokens / s", "throughput_vs_batch.png"),
                             ("k_mean", "mean k per step", "k_vs_batch.png")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for config in results["configs"]:
            ax.plot(sizes, [results["batches"][str(b)][config][key] for b in sizes], marker="o", label=config)
        ax.set(xlabel="concurrent sequences (batch)", ylabel=label, xticks=sizes, title=f"{label} against batch size")
        _legend(ax)
        _save(plt, fig, out / name, written)
    return written
