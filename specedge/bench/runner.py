"""Runs policies side by side: interleaved across repeats so machine drift hits all alike."""

from __future__ import annotations

import json
import os
import platform
import statistics
from pathlib import Path

from specedge.bench.bandwidth import bandwidth_bound, copy_bandwidth_in_child
from specedge.errors import OptionError
from specedge.prompts import BUILTIN_PROMPTS
from specedge.runtime.memory import memory_report, peak_rss_bytes
from specedge.runtime.stats import GenerationStats

DEFAULT_POLICIES = "target,fixed:1,fixed:2,fixed:4,fixed:8,heuristic,adaptive,adaptive@ngram,adaptive@hybrid"


def config_options(name: str) -> dict:
    """A bench configuration 'POLICY[@DRAFTER]' -> generation options."""
    policy, _, drafter = name.partition("@")
    return {"policy": policy, "drafter": drafter or "model"}


def load_prompts(path: str | None) -> list[dict]:
    if path is None:
        return list(BUILTIN_PROMPTS)
    rows = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise OptionError(f"--prompts {path}: {err.strerror}") from err
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise OptionError(f"--prompts {path}:{n}: not JSON ({err.msg})") from err
        if not isinstance(row, dict) or not isinstance(row.get("prompt"), str):
            raise OptionError(f"--prompts {path}:{n}: each line needs a string field 'prompt'")
        if not row["prompt"] and not row.get("chat") and not row.get("suffix"):   # a chat turn or a fill in the
            raise OptionError(f"--prompts {path}:{n}: the prompt is empty")          # middle still has tokens
        if not isinstance(row.get("chat", False), bool):
            raise OptionError(f"--prompts {path}:{n}: 'chat' must be true or false")
        if row.get("suffix") is not None and (not isinstance(row["suffix"], str) or row.get("chat")):
            raise OptionError(f"--prompts {path}:{n}: 'suffix' (fill in the middle) must be a string, without chat")
        rows.append({"prompt": row["prompt"], "chat": row.get("chat", False), "suffix": row.get("suffix") or None})
    if not rows:
        raise OptionError(f"--prompts {path}: no prompts")
    return rows


def without_chat(prompts: list[dict], chat_template: bool, given: bool) -> tuple[list[dict], str | None]:
    """The prompts a bundle without a chat template can run -> (prompts, a note or None). The built-in set's chat
    prompts are left out (said); a prompts file that asks for chat is a one-line error naming the line."""
    asking = [n for n, row in enumerate(prompts, 1) if row.get("chat")]
    if chat_template or not asking:
        return prompts, None
    if given:
        raise OptionError(f"prompt {asking[0]} asks for chat (\"chat\": true) and this bundle has no chat template")
    kept = [row for row in prompts if not row.get("chat")]
    return kept, f"this bundle has no chat template: the {len(asking)} built-in chat prompt(s) left out"


def check_prompts_fit(gen, prompts: list[dict], max_new_tokens: int) -> str | None:
    """Every prompt encodes and leaves room in the bundle, checked before the first is run (a bundle with a short
    max_seq_len otherwise fails part-way through a benchmark). -> a warning when some prompt leaves room for fewer
    than max_new_tokens (its runs, every policy's alike, stop at the end of the KV buffer), else None."""
    short = []                                                  # (room, prompt number)
    for n, row in enumerate(prompts, 1):
        size = len(gen.encode(row["prompt"], row.get("chat", False), row.get("suffix")))
        if size >= gen.max_seq_len:
            raise OptionError(f"prompt {n} has {size} tokens; the bundle's max_seq_len {gen.max_seq_len} leaves no "
                              "room to generate (pass shorter prompts with --prompts, or export with a longer "
                              "--max-seq-len)")
        room = gen.max_seq_len - size + 1              # the last token generated needs no KV row
        if room < max_new_tokens:
            short.append((room, n))
    if not short:
        return None
    room, n = min(short)
    return (f"{len(short)} of {len(prompts)} prompts leave room for fewer than --max-new-tokens {max_new_tokens} "
            f"(the least: prompt {n}, {room}); their runs stop at the bundle's max_seq_len {gen.max_seq_len}")


def prepare_out(out: Path) -> Path:
    """The results folder, made and checked writable before a benchmark runs, not after."""
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise OptionError(f"--out {out}: {err.strerror or err}") from None
    if not os.access(out, os.W_OK):
        raise OptionError(f"--out {out}: not writable")
    return out


def run_bench(gen, prompts: list[dict], policies: list[str], max_new_tokens: int = 128, temperature: float = 0.0,
              seed: int | None = None, repeat: int = 1, progress=None) -> dict:
    """-> results dict (see README "specedge bench"); `progress(done, total, label)` is called per run."""
    if "target" not in policies:
        policies = ["target"] + policies
    for spec in policies:
        gen.options(**config_options(spec))                    # validates every name before any work
    base = dict(max_new_tokens=max_new_tokens, temperature=temperature, ignore_eos=True)
    bandwidth = [copy_bandwidth_in_child(threads=gen.threads)]        # the read rate the model's own threads reach
    for spec in policies:                                      # warm-up, excluded
        gen.generate(prompts[0]["prompt"], **{**base, "max_new_tokens": 8}, **config_options(spec), seed=seed)
    runs = {spec: [[None] * len(prompts) for _ in range(repeat)] for spec in policies}
    total, done = repeat * len(prompts) * len(policies), 0
    for r in range(repeat):
        for i, row in enumerate(prompts):
            for spec in policies:
                gen.clear_prompt_cache()                       # every run prefills its whole prompt
                result = gen.generate(row["prompt"], chat=row.get("chat", False), suffix=row.get("suffix"),
                                      **config_options(spec),
                                      seed=None if seed is None else seed + i, **base)
                runs[spec][r][i] = result
                done += 1
                if progress:
                    progress(done, total, f"repeat {r + 1}/{repeat}, prompt {i + 1}/{len(prompts)}, {spec}")
    bandwidth.append(copy_bandwidth_in_child(threads=gen.threads))     # before and after: drift shows, the best counts
    greedy = temperature == 0.0
    results = {spec: _aggregate(gen, spec, runs[spec], runs["target"], greedy) for spec in policies}
    target = results["target"]
    for entry in results.values():
        entry["speedup"] = entry["tok_per_s"] / target["tok_per_s"] if target["tok_per_s"] else 0.0
        entry["decode_speedup"] = (entry["decode_tok_per_s"] / target["decode_tok_per_s"]
                                   if target["decode_tok_per_s"] else 0.0)
        entry["predicted_speedup"] = _predicted_speedup(entry, target)
        entry["measured_vs_predicted"] = (entry["speedup"] / entry["predicted_speedup"]
                                          if entry["predicted_speedup"] else None)
    best = max(bandwidth, key=lambda b: b["best"])
    return {"policies": results, "machine": machine_info(gen), "memory": memory_report(gen.manifest),
            "bandwidth": bandwidth_bound(gen.manifest["models"]["target"], best, target["decode_tok_per_s"]),
            "bundle": {"path": str(gen.path), "max_draft": gen.max_draft,
                       "models": {role: m["source"] for role, m in gen.manifest["models"].items()}},
            "settings": {"max_new_tokens": max_new_tokens, "temperature": temperature, "seed": seed,
                         "repeat": repeat, "prompts": len(prompts)}}


def _predicted_speedup(entry: dict, target: dict) -> float | None:
    """Speculation's speedup as the models' costs predict it, from this run's own numbers: a decode step
    costs k drafts + one verify call at the policy's mean costs, a target-only step one plain call, and
    each run's prefill (of both models, for speculation) costs what it measured. Host work outside the
    model calls is not in it, so measured / predicted shows what the loop loses beyond the models."""
    def predicted_tok_per_s(e: dict, step_cost: float) -> float:
        seconds = e["prefill_s"] + e["decode_steps"] * step_cost
        return e["new_tokens"] / seconds if seconds else 0.0

    costs = entry["step_costs"]
    step = costs["draft_per_call"] * costs["drafts_per_step"] + costs["verify_per_call"]
    plain = predicted_tok_per_s(target, target["step_costs"]["verify_per_call"])
    return predicted_tok_per_s(entry, step) / plain if step and plain else None


def _aggregate(gen, spec: str, runs, target_runs, greedy: bool) -> dict:
    flat = [res for per_repeat in runs for res in per_repeat]
    every = [res.stats for res in flat]
    total = GenerationStats.combine(every)
    # tokens/s of each repeat over all prompts; the median over repeats
    per_repeat = [sum(r.stats.new_tokens for r in rs) / sum(r.stats.total_s for r in rs) for rs in runs]
    calls = total.n_target_calls
    decode_tokens = total.new_tokens - len(every)              # the first token of each request is prefill's
    split = {"prefill": total.prefill_s, "draft": total.draft_s, "verify": total.verify_s}
    split["other"] = max(0.0, total.total_s - sum(split.values()))
    identical = None
    if greedy:
        identical = all(res.tokens == tgt.tokens for rs, ts in zip(runs, target_runs) for res, tgt in zip(rs, ts))
    decode_s = split["draft"] + split["verify"] + split["other"]
    summary = total.to_json(gen.decode)
    adaptive = spec.startswith("adaptive")
    return {
        "tok_per_s": statistics.median(per_repeat), "tok_per_s_per_repeat": per_repeat,
        "decode_tok_per_s": decode_tokens / decode_s if decode_s else 0.0,
        "new_tokens": total.new_tokens, "decode_steps": calls, "prefill_s": total.prefill_s,
        "step_costs": {"tokens_per_step": decode_tokens / calls if calls else 0.0,
                       "drafts_per_step": total.n_drafted / calls if calls else 0.0,
                       "draft_per_call": total.draft_s / total.n_draft_calls if total.n_draft_calls else 0.0,
                       "verify_per_call": total.verify_s / calls if calls else 0.0},
        "mean_accepted_length": total.mean_accepted_length,
        "acceptance_per_position": total.acceptance_per_position,
        "drafted_per_position": list(total.drafted_at),
        "accepted_length_histogram": {str(n): c for n, c in sorted(total.accepted_lengths.items())},
        "target_calls_per_token": (calls + len(every)) / total.new_tokens if total.new_tokens else 0.0,
        "time_split": {key: value / total.total_s for key, value in split.items()} if total.total_s else {},
        "identical_to_target": identical,
        "k_mean": total.k_mean,
        "k_history": every[0].k_history if adaptive else [],
        "k_history_all": total.k_history if adaptive else [],
        "top_rejections": summary["top_rejections"],
        "requests": [{"repeat": r, "prompt": i, "tokens": res.tokens, "stats": res.stats.to_json(gen.decode)}
                     for r, rs in enumerate(runs) for i, res in enumerate(rs)],
    }


CPU_FEATURES = [("avx2", "AVX2"), ("avx512f", "AVX-512"), ("avx512_vnni", "AVX-512 VNNI"), ("avx_vnni", "AVX-VNNI"),
                ("amx_int8", "AMX-INT8")]


def cpu_description() -> str:
    """The CPU model and the vector extensions that pick onnxruntime's MatMul kernels (AVX2, AVX-512, VNNI,
    AMX): the same bundle's speed differs several-fold between them, so every result names them."""
    try:
        info = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return platform.processor() or platform.machine()
    fields = {}
    for line in info:
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())          # the first CPU's
    model = fields.get("model name") or platform.machine()
    flags = set(fields.get("flags", "").split())
    shown = [name for flag, name in CPU_FEATURES if flag in flags]
    return f"{model} ({', '.join(shown)})" if shown else model


def machine_info(gen) -> dict:
    return {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpu": cpu_description(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "onnxruntime": __import__("onnxruntime").__version__,
            "backend": gen.backend_name,
            "backend_detail": _backend_detail(gen),
            "target_min_rows": gen.target_min_rows,            # single target steps run as this many rows
            "target_steps_exact": gen.target_steps_exact,      # ... and they equal verify rows here, bit for bit
            "peak_rss_bytes": peak_rss_bytes()}


def _backend_detail(gen) -> str:
    """GPU backends: the fixed decode width, CUDA graphs, and whether verify rows equal single steps here."""
    target = gen.target
    if gen.backend_name == "cpu":
        return "cpu"
    graphs = "CUDA graphs" if getattr(target, "cuda_graphs", False) else "no CUDA graphs"
    exact = "verify rows bitwise equal to single steps on this GPU" if gen.target_steps_exact else \
        "verify rows NOT bitwise equal to single steps on this GPU"
    return f"{gen.backend_name}, decode calls {getattr(target, 'width', 0)} tokens wide, {graphs}, {exact}"


def write_results(results: dict, out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / "results.json"
    path.write_text(json.dumps(results, indent=1, ensure_ascii=False) + "\n")
    return path

