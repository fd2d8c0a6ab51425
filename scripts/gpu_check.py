"""The GPU check: exactness first, then timing, on every GPU backend installed. Writes OUT/gpu-check.json after
each stage, so a run cut off still reports what it finished. scripts/gpu-check.sh runs it on the lent machine.

    python scripts/gpu_check.py --out OUT [--device cuda|cpu] [--shapes real|tiny] [--acceptance 0.8,0.7,...]

Stages
  env         onnxruntime version and providers, the GPU (nvidia-smi), which GPU backends are available
  exactness   tiny qwen2 target + perturbed draft, standard variant, per dtype (fp32, fp16, bf16) and backend:
              greedy target-only == fixed:3 == adaptive (3 prompts x 2 draft seeds); a batch of 3 == each row alone
              (greedy and seeded sampling); verify rows bitwise equal to single steps (the load-time probe);
              lossless sampling: the distribution of sampled tokens with speculation vs without (chi-square)
  timing      the real pair's shapes (Qwen2.5-Coder 1.5B target / 0.5B draft configs, random weights; --shapes
              tiny for a dry run): per-call costs (draft step, verify at T = 1 .. max_draft + 1 unpadded and at the
              fixed width, prefill chunk) with CUDA graphs on and off; generate tok/s for target-only at T = 1
              with CUDA graphs (the fastest plain configuration, not a padded one), fixed:4 and adaptive; host time
              outside the provider per step; and the speedup the per-call costs predict with the real pair's
              per-position acceptance as measured on the CPU (--acceptance; it does not depend on the backend)
`--device cpu` runs everything through the cuda backend's code on the CPU provider: a dry run of this script.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
import traceback
from pathlib import Path

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


def exactness(work: Path, device: str, backends: list[str]) -> dict:
    from scipy.stats import chi2_contingency

    from specedge.runtime import load
    from specedge.runtime.manifest import read_manifest
    from specedge.runtime.row_check import bundle_rows_bitwise_equal
    dtypes = ["float32", "float16"] + (["bfloat16"] if device == "cuda" else [])
    results = {}
    for backend in backends:
        options = {"device": "cpu"} if device == "cpu" else {}
        for dtype in dtypes:
            key, row = f"{backend}/{dtype}", {}
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
                rows_equal, min_rows = bundle_rows_bitwise_equal(bundle, read_manifest(bundle), backend=backend,
                                                                 **options)
                row["verify_rows_bitwise_equal"], row["min_rows"] = rows_equal, min_rows
                # informative: would rows be equal without the fixed width (is the padding what makes it exact here)?
                row["unpadded_rows_bitwise_equal"] = bundle_rows_bitwise_equal(
                    bundle, read_manifest(bundle), backend=backend, width=0, **options)[0]
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
            used = [i for i in range(12) if counts[0][i] + counts[1][i]]
            p_value = chi2_contingency([[c[i] for i in used] for c in counts])[1]
            row["lossless_chi2_p"], row["lossless_ok"] = float(p_value), bool(p_value > 1e-3)
            results[key] = row
            print(key, row, flush=True)
    ok = all(v for row in results.values() for k, v in row.items()
             if k.endswith(("_equal", "_solo", "_ok")) and not k.startswith("unpadded"))
    return {"all_exact": ok, "results": results}


def _timing_pair(work: Path, shapes: str, dtype: str):
    import tiny_models as tm
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
        model = transformers.Qwen2ForCausalLM(cfg)
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


def timing(work: Path, device: str, shapes: str, acceptance: list[float]) -> dict:
    from specedge.runtime import load
    from specedge.runtime.backends import open_backend
    from specedge.runtime.manifest import read_manifest
    dtype = "float16"
    bundle = _timing_pair(work, shapes, dtype)
    m = read_manifest(bundle)
    options = {"device": "cpu"} if device == "cpu" else {}
    result = {"shapes": shapes, "dtype": dtype}
    for graphs in (True, False):
        label = "cuda_graphs_on" if graphs and device == "cuda" else ("cuda_graphs_off" if device == "cuda" else "cpu")
        if label in result:
            continue
        costs = {}
        for role, width in (("target", 0), ("draft", 0), ("target", m["max_draft"] + 1)):
            entry = m["models"][role]
            model = open_backend("cuda", bundle / entry["file"], entry, m["max_seq_len"], max_batch=1,
                                 cuda_graphs=graphs, width=width, **options)
            sizes = list(range(1, m["max_draft"] + 2)) if role == "target" and not width else [1, 2]
            name = f"{role}_width{width}" if width else role
            costs[name] = _call_costs(model, sizes)
            if not width and role == "target":
                costs["prefill_chunk_64"] = _call_costs(model, [64], rounds=5)[64]
            costs[f"{name}_cuda_graphs"] = model.cuda_graphs
            costs[f"{name}_cuda_graph_problem"] = model.cuda_graph_problem
            del model
        result[label] = costs
    base = result.get("cuda_graphs_on", result.get("cpu"))
    verify, draft = base["target"], base["draft"][2]
    fixed = base[f"target_width{m['max_draft'] + 1}"][1]
    predicted = {}
    for k in range(1, m["max_draft"] + 1):
        expected, run = 1.0, 1.0
        for a in acceptance[:k]:
            run *= a
            expected += run
        # the runtime's decode calls run at the fixed width: verify costs fixed, drafts k x the width-2 step
        predicted[k] = expected / (k * draft + fixed) * verify[1]
    result["predicted_speedup_vs_target_t1"] = predicted
    result["best_predicted"] = max(predicted.items(), key=lambda kv: kv[1])
    # whole runs: target-only at T = 1 (width 1: the fastest plain configuration), fixed:4 and adaptive
    runs = {}
    for label, policy, width in (("target_t1", "target", 1), ("fixed:4", "fixed:4", None), ("adaptive", "adaptive", None)):
        gen = load(bundle, backend="cuda", backend_options={**options, **({"width": width} if width else {})})
        gen.generate(PROMPTS[0], max_new_tokens=8, ignore_eos=True, policy=policy)
        before = len(gen.events)
        rates = [gen.generate(p, max_new_tokens=64, ignore_eos=True, policy=policy).stats.tokens_per_s for p in PROMPTS]
        events = gen.events[before:]
        wall = sum(e.draft_s + e.verify_s for e in events)
        runs[label] = {"tok_per_s": statistics.median(rates),
                       "host_share_of_step": (wall - sum(e.model_s for e in events)) / wall if wall else None}
        gen.close()
    result["runs"] = runs
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="gpu-check-out")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--shapes", default="real", choices=["real", "tiny"])
    parser.add_argument("--acceptance", default=DEFAULT_ACCEPTANCE)
    parser.add_argument("--skip", default="", help="comma-separated stages to skip")
    args = parser.parse_args(argv)
    out = Path(args.out)
    work = out / "work"
    report = Report(out)
    skip = set(filter(None, args.skip.split(",")))
    found = report.stage("env", env, args.device)
    backends = [b for b in ("cuda", "tensorrt") if b in found.get("backends", [])] if args.device == "cuda" else ["cuda"]
    if "exactness" not in skip:
        report.stage("exactness", exactness, work, args.device, backends)
    if "timing" not in skip:
        report.stage("timing", timing, work, args.device, args.shapes, [float(a) for a in args.acceptance.split(",")])
    shutil.rmtree(work, ignore_errors=True)
    stages = report.data["stages"]
    return 0 if all(s["ok"] for s in stages.values()) and stages.get("exactness", {}).get("all_exact", True) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
