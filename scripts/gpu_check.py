"""The GPU check: exactness first, then timing, on every GPU backend installed. Writes OUT/gpu-check.json after
each stage, so a run cut off still reports what it finished. scripts/gpu-check.sh runs it on the lent machine.

    python scripts/gpu_check.py --out OUT [--device cuda|cpu] [--shapes real|tiny] [--acceptance 0.8,0.7,...]

Stages
  env         onnxruntime version and providers, the GPU (nvidia-smi), which GPU backends are available
  numerics    per dtype (fp32, fp16, bf16): the tiny target's logits on each backend over a prefill and decode
              steps vs transformers in float32 on the CPU, next to torch's own run in that dtype on the same
              device (the yardstick: half precision is held to what half precision gives torch itself)
  exactness   tiny qwen2 target + perturbed draft, standard variant, per dtype (fp32, fp16, bf16) and backend:
              greedy target-only == fixed:3 == adaptive (3 prompts x 2 draft seeds); a batch of 3 == each row alone
              (greedy and seeded sampling); verify rows bitwise equal to single steps (the load-time probe);
              lossless sampling: the distribution of sampled tokens with speculation vs without (chi-square)
  timing_*    the real pair's shapes (Qwen2.5-Coder 1.5B target / 0.5B draft configs, random weights, float16;
              --shapes tiny for a dry run), each sub-stage reported on its own:
              export   the bundle (check=False: the shapes are what matter) and its time
              calls    per-call costs (draft step, verify at T = 1 .. max_draft + 1 unpadded and at the fixed width,
                       prefill chunk) with CUDA graphs on and off, and the speedup they predict with the real pair's
                       per-position acceptance as measured on the CPU (--acceptance; it does not depend on the backend)
              runs     generate tok/s at B = 1: target-only at width 2 (the narrowest one-shape decode) and at the
                       fixed width, fixed:4, adaptive; host share of a step; greedy output identical to target-only
              kernels  CUDA kernels per decode call and their summed time against the call's wall time
              batch    aggregate tok/s at B = 1, 4, 8 under max_batch 8, target / fixed:4 / adaptive
              peer     transformers' own float16 greedy generate of the same target on the same device
`--device cpu` runs everything through the cuda backend's code on the CPU provider: a dry run of this script.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

# per-position acceptance of the real int4 pair on the CPU (docs/speculation-results.md), used to predict speedups
DEFAULT_ACCEPTANCE = "0.80,0.68,0.60,0.55,0.50,0.46,0.43,0.40"
PROMPTS = ["def fibonacci(n):", "class Stack:\n    def __init__(self):\n", "import os\nfor path in "]
QWEN_CODER = {  # Qwen2.5-Coder-1.5B / 0.5B configs (the real pair's shapes)
    "target": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                   num_key_value_heads=2),
    "draft": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2),
}


class Report:
    def __init__(self, out: Path):
        self.path, self.data = out / "gpu-check.json", {"stages": {}}
        out.mkdir(parents=True, exist_ok=True)

    def stage(self, name: str, fn, *args):
        start = time.perf_counter()
        print(f"== {name}", flush=True)
        try:
            result = {"ok": True, **fn(*args)}
        except Exception as err:  # noqa: BLE001 - a failed stage is reported, the next one still runs
            result = {"ok": False, "error": f"{type(err).__name__}: {err}", "traceback": traceback.format_exc()[-3000:]}
            print(result["traceback"], flush=True)
        result["seconds"] = round(time.perf_counter() - start, 1)
        self.data["stages"][name] = result
        self.path.write_text(json.dumps(self.data, indent=2, default=str) + "\n")
        print(json.dumps({k: v for k, v in result.items() if k != "traceback"}, default=str)[:2000], flush=True)
        return result


def env(device: str) -> dict:
    import onnxruntime as ort

    from specedge.runtime.backends import BACKENDS, available_backends, backend_problem
    gpu = subprocess.run(["nvidia-smi", "--query-gpu=name,driver_version,memory.total,compute_cap",
                          "--format=csv,noheader"], capture_output=True, text=True).stdout.strip() \
        if shutil.which("nvidia-smi") else None
    return {"onnxruntime": ort.__version__, "providers": ort.get_available_providers(), "gpu": gpu,
            "device": device, "backends": available_backends(),
            "problems": {name: backend_problem(name) for name in ("cuda", "tensorrt") if name in BACKENDS}}


def _tiny_pair(work: Path, dtype: str, seed: int):
    import tiny_models as tm

    from specedge.export import export_bundle
    tok = tm.byte_tokenizer()
    target = tm.make_model("qwen2", 260, seed=1)
    draft = tm.perturbed(target, seed=seed, noise=0.02)
    t = tm.save(target, tok, work / f"tiny-target-{seed}")
    d = tm.save(draft, tok, work / f"tiny-draft-{seed}")
    return export_bundle(str(t), str(d), work / f"tiny-{dtype}-{seed}", max_seq_len=128, max_draft=4, force=True,
                         progress=None, attention="standard", dtype=dtype)


def _word_pair(work: Path, dtype: str):
    import tiny_models as tm

    from specedge.export import export_bundle
    target = tm.make_model("qwen2", 12, seed=5, init_scale=0.5)
    t = tm.save(target, tm.word_tokenizer(12), work / "word-target")
    d = tm.save(tm.perturbed(target, seed=6, noise=0.04), tm.word_tokenizer(12), work / "word-draft")
    return export_bundle(str(t), str(d), work / f"word-{dtype}", max_seq_len=32, max_draft=4, force=True,
                         progress=None, attention="standard", dtype=dtype)


def _options(device: str, **more) -> dict:
    """Backend options: `device="cpu"` runs the cuda backend's code on the CPU provider (the dry run)."""
    return {"device": "cpu", **more} if device == "cpu" else dict(more)


def _dtypes(device: str) -> list[str]:
    return ["float32", "float16"] + (["bfloat16"] if device == "cuda" else [])


def numerics(work: Path, device: str, backends: list[str]) -> dict:
    import torch
    torch_device = "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"
    results = {}
    for backend_name in backends:
        options = _options(device)
        for dtype in _dtypes(device):
            try:
                results[f"{backend_name}/{dtype}"] = _numerics_row(work, device, backend_name, dtype, options,
                                                                   torch_device)
            except Exception as err:  # noqa: BLE001 - one dtype failing must not hide the others' results
                results[f"{backend_name}/{dtype}"] = {"ok": False, "error": f"{type(err).__name__}: {err}"[:1500]}
            print(f"{backend_name}/{dtype}", results[f"{backend_name}/{dtype}"], flush=True)
    return {"all_ok": all(r["ok"] for r in results.values()), "results": results}


def _numerics_row(work: Path, device: str, backend_name: str, dtype: str, options: dict, torch_device: str) -> dict:
    import torch
    import transformers

    from specedge.export.check import CHECK_STEPS, random_ids
    from specedge.runtime.backends import open_backend
    from specedge.runtime.backends.base import SlotCursor
    from specedge.runtime.manifest import read_manifest
    bundle = _tiny_pair(work, dtype, 3)
    m = read_manifest(bundle)
    entry, vocab = m["models"]["target"], m["models"]["target"]["spec"]["vocab_size"]
    backend = open_backend(backend_name, bundle / entry["file"], entry, m["max_seq_len"], max_batch=1,
                           max_step=max(CHECK_STEPS), **options)
    cursor, ids, ours, at = SlotCursor(backend), random_ids(vocab, seed=11), [], 0
    for n in CHECK_STEPS:                         # a prefill chunk, then verify- and draft-sized steps
        ours.append(cursor.feed(ids[at: at + n]).copy())
        at += n
    ours = np.concatenate(ours)
    graphs = {"cuda_graphs": getattr(backend, "cuda_graphs", None),
              "cuda_graph_problem": getattr(backend, "cuda_graph_problem", None)}
    del backend
    model = transformers.AutoModelForCausalLM.from_pretrained(work / "tiny-target-3", dtype=torch.float32)
    with torch.no_grad():
        reference = model(torch.tensor([ids[:at]])).logits[0, :, :vocab].numpy()
    model = model.to(torch_device, dtype=getattr(torch, dtype))
    with torch.no_grad():
        same = model(torch.tensor([ids[:at]], device=torch_device)).logits[0, :, :vocab].float().cpu().numpy()
    error, torch_error = float(np.abs(ours - reference).max()), float(np.abs(same - reference).max())
    scale = float(np.abs(reference).max())
    return {"max_abs_logit_error": error, "torch_same_dtype_error": torch_error, "max_abs_logit": scale,
            "top1_agreement": float((ours.argmax(-1) == reference.argmax(-1)).mean()),
            "torch_top1_agreement": float((same.argmax(-1) == reference.argmax(-1)).mean()),
            "torch_device": torch_device,
            # within 4x torch's own error in this dtype, or 1e-4 of the logits' scale (float32's floor)
            "ok": bool(error <= max(4 * torch_error, 1e-4 * scale)), **graphs}


def exactness(work: Path, device: str, backends: list[str]) -> dict:
    results = {}
    for backend in backends:
        options = _options(device)
        for dtype in _dtypes(device):
            try:
                results[f"{backend}/{dtype}"] = _exactness_row(work, backend, dtype, options)
            except Exception as err:  # noqa: BLE001 - one dtype failing must not hide the others' results
                results[f"{backend}/{dtype}"] = {"run_ok": False, "error": f"{type(err).__name__}: {err}"[:1500]}
            print(f"{backend}/{dtype}", results[f"{backend}/{dtype}"], flush=True)
    ok = all(v for row in results.values() for k, v in row.items()
             if k.endswith(("_equal", "_solo", "_ok")) and not k.startswith("unpadded"))
    return {"all_exact": ok, "results": results}


def _exactness_row(work: Path, backend: str, dtype: str, options: dict) -> dict:
    from scipy.stats import chi2_contingency

    from specedge.runtime import load
    from specedge.runtime.manifest import read_manifest
    from specedge.runtime.row_check import bundle_rows_bitwise_equal
    row = {}
    for seed in (3, 4):
        bundle = _tiny_pair(work, dtype, seed)
        gen = load(bundle, backend=backend, backend_options=options, max_batch=3)
        greedy = dict(max_new_tokens=32, ignore_eos=True)
        for prompt in PROMPTS:
            target = gen.generate(prompt, policy="target", **greedy).tokens
            for policy in ("fixed:3", "adaptive"):
                same = gen.generate(prompt, policy=policy, **greedy).tokens == target
                row[f"greedy_{policy}_equal"] = row.get(f"greedy_{policy}_equal", True) and same
        with gen.scheduler.wake:
            streams = [gen.stream(p, policy="fixed:3", **greedy) for p in PROMPTS]
        batch = [s.wait().tokens for s in streams]
        row["batch_equal_solo"] = row.get("batch_equal_solo", True) and batch == [
            gen.generate(p, policy="fixed:3", **greedy).tokens for p in PROMPTS]
        sampled = dict(max_new_tokens=16, ignore_eos=True, temperature=0.8, policy="fixed:3")
        with gen.scheduler.wake:
            streams = [gen.stream(p, seed=7 + i, **sampled) for i, p in enumerate(PROMPTS)]
        batch = [s.wait().tokens for s in streams]
        row["seeded_batch_equal_solo"] = row.get("seeded_batch_equal_solo", True) and batch == [
            gen.generate(p, seed=7 + i, **sampled).tokens for i, p in enumerate(PROMPTS)]
        rows_equal, min_rows = bundle_rows_bitwise_equal(bundle, read_manifest(bundle), backend=backend, **options)
        row["verify_rows_bitwise_equal"], row["min_rows"] = rows_equal, min_rows
        # informative: would rows be equal without the fixed width (is the padding what makes it exact here)?
        row["unpadded_rows_bitwise_equal"] = bundle_rows_bitwise_equal(
            bundle, read_manifest(bundle), backend=backend, width=0, **options)[0]
        row["cuda_graphs"] = getattr(gen.target, "cuda_graphs", None)
        row["prompt_cache_exact"] = row.get("prompt_cache_exact", True) and _prompt_cache_exact(gen)
        gen.close()
    gen = load(_word_pair(work, dtype), backend=backend, backend_options=options, max_batch=3)
    counts = []
    for policy in ("target", "fixed:3"):
        hist = [0] * 12
        for i in range(400):
            tokens = gen.generate_ids([0, 1], max_new_tokens=3, ignore_eos=True, temperature=1.0,
                                      seed=1000 * (policy == "target") + i, policy=policy).tokens
            hist[tokens[2]] += 1               # the third token: after one accepted-or-rejected draft
        counts.append(hist)
    gen.close()
    used = [i for i in range(12) if counts[0][i] + counts[1][i]]
    p_value = chi2_contingency([[c[i] for i in used] for c in counts])[1]
    row["lossless_chi2_p"], row["lossless_ok"] = float(p_value), bool(p_value > 1e-3)
    return row


def _prompt_cache_exact(gen) -> bool:
    """Whether the prompt cache would be exact on this backend (it is off on GPU backends until shown): forced on,
    follow-ups of each prompt's answer (its K/V from decode calls at the fixed width, a fresh run's from prefill
    chunks), alone and three at once, against the same requests after the cache is cleared."""
    greedy = dict(max_new_tokens=24, ignore_eos=True, policy="fixed:3")
    gen.scheduler.cache.enabled = True
    follow_ups = [gen.encode(p) + gen.generate(p, **greedy).tokens + gen.encode(" and then") for p in PROMPTS]
    cached = [gen.generate_ids(f, **greedy) for f in follow_ups]
    with gen.scheduler.wake:
        streams = [gen.stream_ids(f, **greedy) for f in follow_ups]
    together = [s.wait() for s in streams]
    fresh = []
    for f in follow_ups:
        gen.clear_prompt_cache()
        fresh.append(gen.generate_ids(f, **greedy).tokens)
    gen.scheduler.cache.enabled = False
    used = sum(r.stats.cached_prompt_tokens for r in cached + together) > 0
    return used and [r.tokens for r in cached] == fresh and [r.tokens for r in together] == fresh


def placements(work: Path, out: Path) -> dict:
    """Which nodes onnxruntime places off the CUDA provider (what rules out CUDA graphs): its verbose session log
    for the tiny float16 target, filtered, in OUT/placements.txt."""
    bundle = _tiny_pair(work, "float16", 3)
    code = ("import onnxruntime as o, sys; o.preload_dlls(); so = o.SessionOptions(); so.log_severity_level = 0; "
            "so.log_verbosity_level = 0; o.InferenceSession(sys.argv[1], so, providers=[('CUDAExecutionProvider', "
            "{'enable_cuda_graph': '1'})])")
    run = subprocess.run([sys.executable, "-c", code, str(bundle / "target.onnx")], capture_output=True, text=True)
    text = run.stdout + run.stderr
    lines = text.splitlines()
    first = next((i for i, line in enumerate(lines) if "placed on" in line or "Node placements" in line), len(lines))
    keep = lines[first: first + 200] + [line for line in lines[:first] if any(word in line for word in (
        "Memcpy", "CPUExecutionProvider", "graph capture", "partitioned", "fallback", "not supported"))]
    (out / "placements.txt").write_text("\n".join(keep[:400]) + "\n")
    return {"session_ok": run.returncode == 0, "lines": len(keep), "cpu_lines": [
        line for line in keep if "CPUExecutionProvider" in line or "fallback" in line.lower()][:20]}


def _timing_pair(work: Path, shapes: str, dtype: str):
    import tiny_models as tm
    import torch
    import transformers

    from specedge.export import export_bundle
    tok = tm.byte_tokenizer()
    folders = {}
    for role, dims in QWEN_CODER.items():
        if shapes == "tiny":
            dims = dict(hidden_size=128, intermediate_size=256, num_hidden_layers=4 if role == "target" else 2,
                        num_attention_heads=4, num_key_value_heads=2)
        cfg = transformers.Qwen2Config(vocab_size=151936 if shapes == "real" else 260, tie_word_embeddings=True,
                                       max_position_embeddings=4096, **dims)
        cfg.bos_token_id = cfg.eos_token_id = 0
        with torch.device("cuda" if torch.cuda.is_available() else "cpu"):    # random init is faster there
            model = transformers.Qwen2ForCausalLM(cfg).half()      # saved in float16: half the bytes to write
        folders[role] = tm.save(model, tok, work / f"timing-{role}")
        del model
    return export_bundle(str(folders["target"]), str(folders["draft"]), work / f"timing-{dtype}", max_seq_len=1024,
                         max_draft=8, force=True, progress=print, attention="standard", dtype=dtype, check=False)


def _call_costs(backend, widths: list[int], rounds: int = 20) -> dict:
    """Median seconds of one call at B = 1 with T tokens at position 100 (no padding beyond the backend's own)."""
    costs = {}
    for t in widths:
        times = []
        for _ in range(rounds + 3):
            start = time.perf_counter()
            backend.run([100], [[1] * t], [t], want="ids")
            times.append(time.perf_counter() - start)
        costs[t] = statistics.median(times[3:])
    return costs


def timing_export(work: Path, shapes: str) -> dict:
    start = time.perf_counter()
    bundle = _timing_pair(work, shapes, "float16")
    return {"bundle": str(bundle), "shapes": shapes, "dtype": "float16", "export_s": time.perf_counter() - start}


def timing_calls(bundle: Path, device: str, acceptance: list[float]) -> dict:
    """Per-call costs at B = 1, and the speedup they predict at the CPU's acceptance. Widths as the runtime runs
    them: the target at T = 1 (width 1, what target-only decoding would use) and at the fixed verify width, the
    draft at width 2; each with CUDA graphs (on a GPU), the verify width and the draft also without; and the
    target unpadded at every T (no graph: each T is its own shape)."""
    from specedge.runtime.backends import open_backend
    from specedge.runtime.manifest import read_manifest
    m = read_manifest(bundle)
    verify_width = m["max_draft"] + 1
    plan = [("target", 0, True), ("target", 1, True), ("target", verify_width, True), ("draft", 2, True),
            ("target", verify_width, False), ("draft", 2, False)]
    costs = {}
    for role, width, graphs in plan:
        if device != "cuda" and not graphs:
            continue
        entry = m["models"][role]
        model = open_backend("cuda", bundle / entry["file"], entry, m["max_seq_len"], max_batch=1,
                             cuda_graphs=graphs, width=width, **_options(device))
        sizes = list(range(1, verify_width + 1)) if width == 0 else [1] if width == 1 else [1, 2]
        name = f"{role}_width{width}" + ("" if graphs else "_no_graphs")
        costs[name] = {"seconds": _call_costs(model, sizes), "cuda_graphs": model.cuda_graphs,
                       "cuda_graph_problem": model.cuda_graph_problem}
        if width == 0:
            costs["prefill_chunk_64_s"] = _call_costs(model, [64], rounds=5)[64]
            costs["device_bytes_kv_and_scratch"] = model.device_bytes
        del model
    plain = costs["target_width1"]["seconds"][1]
    verify = costs[f"target_width{verify_width}"]["seconds"][1]
    draft = costs["draft_width2"]["seconds"][1]
    predicted = {}
    for k in range(1, m["max_draft"] + 1):
        expected, run = 1.0, 1.0
        for a in acceptance[:k]:
            run *= a
            expected += run
        # a step: k draft calls at width 2 and one verify at the fixed width; target-only: one call at T = 1
        predicted[k] = expected / (k * draft + verify) * plain
    return {"costs": costs, "predicted_speedup_vs_target_t1": predicted,
            "best_predicted": max(predicted.items(), key=lambda kv: kv[1])}


def timing_kernels(bundle: Path, device: str) -> dict:
    """Where a decode call's time goes on the GPU: kernels per call and their summed duration (CUPTI, through
    torch's profiler, which sees every kernel in the process) against the call's wall time, with CUDA graphs off
    (graph replays hide their kernels from the profiler)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from specedge.runtime.backends import open_backend
    from specedge.runtime.manifest import read_manifest
    if device != "cuda" or not torch.cuda.is_available():
        return {"skipped": "needs a GPU"}
    torch.zeros(1, device="cuda")
    m = read_manifest(bundle)
    result = {}
    for role, width in (("target", m["max_draft"] + 1), ("draft", 2)):
        entry = m["models"][role]
        model = open_backend("cuda", bundle / entry["file"], entry, m["max_seq_len"], max_batch=1, cuda_graphs=False,
                             width=width)
        for _ in range(3):
            model.run([100], [[1]], [1], want="ids")
        calls = 10
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            start = time.perf_counter()
            for _ in range(calls):
                model.run([100], [[1]], [1], want="ids")
            wall = (time.perf_counter() - start) / calls
        kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
        busy = sum(e.time_range.elapsed_us() for e in kernels) / calls      # microseconds
        top = {}
        for e in kernels:
            top[e.name[:60]] = top.get(e.name[:60], 0.0) + e.time_range.elapsed_us() / calls
        result[role] = {"kernels_per_call": len(kernels) / calls, "gpu_busy_us_per_call": busy,
                        "wall_us_per_call": wall * 1e6, "layers": entry["kv"]["num_layers"],
                        "top_kernels_us": dict(sorted(top.items(), key=lambda kv: -kv[1])[:8])}
        del model
    return result


def timing_runs(bundle: Path, device: str) -> dict:
    """Whole generations at B = 1: target-only at T = 1 (width 1: the fastest plain configuration), fixed:4 and
    adaptive at the runtime's fixed widths; host time outside the provider per step."""
    from specedge.runtime import load
    runs = {}
    # target_t1: width 2, the narrowest one-shape decode (a lone token may run as two rows: min_rows)
    for label, policy, width in (("target_t1", "target", 2), ("target", "target", None), ("fixed:4", "fixed:4", None),
                                 ("adaptive", "adaptive", None)):
        gen = load(bundle, backend="cuda", backend_options=_options(device, **({"width": width} if width else {})))
        gen.generate(PROMPTS[0], max_new_tokens=8, ignore_eos=True, policy=policy)
        before = len(gen.events)
        results = [gen.generate(p, max_new_tokens=64, ignore_eos=True, policy=policy) for p in PROMPTS]
        events = gen.events[before:]
        wall = sum(e.draft_s + e.verify_s for e in events)
        runs[label] = {"tok_per_s": statistics.median(r.stats.tokens_per_s for r in results),
                       "tokens": [r.tokens for r in results],
                       "host_share_of_step": (wall - sum(e.model_s for e in events)) / wall if wall else None}
        gen.close()
    # against target-only at the same fixed width (the runtime's promise); T = 1 graphs are other kernels, so at
    # near-ties they may pick another token: that is why every decode call runs at one width
    runs["greedy_identical_to_target"] = all(runs[k]["tokens"] == runs["target"]["tokens"]
                                             for k in ("fixed:4", "adaptive"))
    runs["target_t1_identical_to_target"] = runs["target_t1"]["tokens"] == runs["target"]["tokens"]
    for row in runs.values():
        if isinstance(row, dict):
            row.pop("tokens")
    return runs


def timing_batch(bundle: Path, device: str) -> dict:
    """Aggregate tokens/s at B = 1, 4, 8 under max_batch 8 (every decode call at 8 rows: the exactness shape)."""
    from specedge.bench.batch import run_batch_bench
    from specedge.runtime import load
    gen = load(bundle, backend="cuda", max_batch=8, backend_options=_options(device))
    try:
        found = run_batch_bench(gen, [{"prompt": p} for p in PROMPTS], ["target", "fixed:4", "adaptive"], [1, 4, 8],
                                max_new_tokens=64)
    finally:
        gen.close()
    return {"memory": found["memory"], "batches": {b: {name: {k: row[k] for k in (
        "aggregate_tok_per_s", "speedup", "k_mean", "identical_to_target")} for name, row in table.items()}
        for b, table in found["batches"].items()}}


def timing_peer(work: Path, device: str) -> dict:
    """transformers' own greedy generate of the same random target in float16 on the same device: the plain
    framework baseline for target-only tokens/s."""
    import torch
    import transformers
    torch_device = "cuda" if device == "cuda" and torch.cuda.is_available() else "cpu"
    model = transformers.AutoModelForCausalLM.from_pretrained(work / "timing-target", dtype=torch.float16)
    model = model.to(torch_device).eval()
    ids = torch.tensor([[1] * 16], device=torch_device)
    rates = []
    with torch.no_grad():
        for i in range(4):
            start = time.perf_counter()
            out = model.generate(ids, max_new_tokens=64, min_new_tokens=64, do_sample=False, pad_token_id=0)
            if torch_device == "cuda":
                torch.cuda.synchronize()
            if i:                                                  # the first is warm-up
                rates.append((out.shape[1] - ids.shape[1]) / (time.perf_counter() - start))
    return {"transformers": transformers.__version__, "torch": torch.__version__, "device": torch_device,
            "target_tok_per_s": statistics.median(rates)}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-check-out")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shapes", default="real", choices=["real", "tiny"])
    parser.add_argument("--acceptance", default=DEFAULT_ACCEPTANCE)
    parser.add_argument("--skip", default="", help="comma-separated stages to skip")
    args = parser.parse_args(argv)
    out = Path(args.out)
    work = Path(tempfile.mkdtemp(prefix="gpu-check-"))     # bundles stay out of OUT, which comes back
    report = Report(out)
    skip = set(filter(None, args.skip.split(",")))
    found = report.stage("env", env, args.device)
    backends = [b for b in ("cuda", "tensorrt") if b in found.get("backends", [])] if args.device == "cuda" else ["cuda"]
    if not backends:                       # an empty check must not read as a passed one
        backends = ["cuda"]
    if "numerics" not in skip and "exactness" not in skip:
        report.stage("numerics", numerics, work, args.device, backends)
    if "exactness" not in skip:
        if args.device == "cuda":
            report.stage("placements", placements, work, out)
        report.stage("exactness", exactness, work, args.device, backends)
    if "timing" not in skip:
        made = report.stage("timing_export", timing_export, work, args.shapes)
        if made["ok"]:
            bundle = Path(made["bundle"])
            report.stage("timing_calls", timing_calls, bundle, args.device,
                         [float(a) for a in args.acceptance.split(",")])
            report.stage("timing_kernels", timing_kernels, bundle, args.device)
            report.stage("timing_runs", timing_runs, bundle, args.device)
            report.stage("timing_batch", timing_batch, bundle, args.device)
            report.stage("timing_peer", timing_peer, work, args.device)
    shutil.rmtree(work, ignore_errors=True)
    stages = report.data["stages"]
    return 0 if all(s["ok"] for s in stages.values()) and stages.get("exactness", {}).get("all_exact", True) \
        and stages.get("numerics", {}).get("all_ok", True) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
