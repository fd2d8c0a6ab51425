"""Half-precision bundles: fp16/bf16 graphs, their dtype audit, the float32 copy that is checked, and which
backends refuse which dtype."""

import json

import numpy as np
import pytest

import tiny_models as tm
from conftest import TARGET_ROWS, _export
from specedge.errors import ExportError, OptionError
from specedge.export.dtype_audit import audit_dtype
from specedge.runtime import load


@pytest.fixture(scope="module")
def half_bundles(workdir):
    tok = tm.byte_tokenizer()
    qwen2 = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    draft = tm.perturbed(qwen2, seed=3, noise=0.01)
    gpt2 = tm.make_model("gpt2", TARGET_ROWS, seed=1)
    small = dict(max_seq_len=64, max_draft=4)
    return {"fp16": _export(workdir, "half-fp16", qwen2, draft, tok, attention="standard", dtype="fp16", **small),
            "bf16": _export(workdir, "half-bf16", gpt2, None, tok, attention="standard", dtype="bf16", **small),
            "fp16-gqa-int4": _export(workdir, "half-fp16-int4", qwen2, draft, tok, dtype="fp16", quantize="int4",
                                     **small),
            "fp32": _export(workdir, "half-fp32", qwen2, draft, tok, attention="standard", **small)}


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


@pytest.mark.parametrize("name,dtype", [("fp16", "float16"), ("bf16", "bfloat16"), ("fp16-gqa-int4", "float16")])
def test_the_manifest_records_the_dtype_and_the_graph_computes_in_it(half_bundles, name, dtype):
    m = _manifest(half_bundles[name])
    assert m["format_version"] == 3 and m["dtype"] == dtype
    for entry in m["models"].values():
        io = entry["io"]
        assert entry["kv"]["dtype"] == dtype
        assert entry["weights"] == ("int4" if "int4" in name else dtype)      # the graph's, not the check copy's
        assert {io["inputs"][kv[0]]["dtype"] for kv in io["kv"]} == {dtype}
        assert {io["outputs"][kv[2]]["dtype"] for kv in io["kv"]} == {dtype}
        assert io["outputs"]["logits"]["dtype"] == "float32" and io["outputs"]["ids"]["dtype"] == "int64"
        check = entry["export_check"]
        audit = check["dtype_audit"]
        assert audit["dtype"] == dtype and audit["half_ops"].get("MatMul", 0) + audit["half_ops"].get(
            "MatMulNBits", 0) + audit["half_ops"].get("Gemm", 0) > 0
        assert "float32 copy" in check["checked_as"]
        assert check["max_abs_logit_error"] <= check["tolerance"]        # the float32 copy against transformers
    assert not any(name.startswith(".float32-check") for name in m["files"])
    assert not (half_bundles[name] / ".float32-check").exists()


def test_inspect_says_what_a_half_bundle_holds_and_how_it_was_checked(half_bundles, capsys):
    from specedge.cli import main

    assert main(["inspect", str(half_bundles["fp16"])]) == 0
    out = capsys.readouterr().out
    assert "weights float16" in out and "embedding float16" in out and "float32" not in out.split("weights")[1][:8]
    assert "(a float32 copy of the graph)" in out and "the float16 graph on the CPU provider: max logit error" in out


def test_half_weights_take_half_the_bytes(half_bundles):
    fp16, fp32 = _manifest(half_bundles["fp16"]), _manifest(half_bundles["fp32"])
    ratio = fp16["models"]["target"]["weight_bytes"] / fp32["models"]["target"]["weight_bytes"]
    assert 0.45 < ratio < 0.55


def test_fp16_runs_on_the_cpu_provider_and_stays_exact(half_bundles):
    """The float16 graph itself was checked on the CPU provider at export; at run time greedy speculation
    equals target-only greedy output, and the KV buffers are float16."""
    m = _manifest(half_bundles["fp16"])
    on_cpu = m["models"]["target"]["export_check"]["float16_on_cpu"]
    assert on_cpu["max_abs_logit_error"] <= on_cpu["tolerance"] and on_cpu["verify_rows_bitwise_equal"]
    gen = load(half_bundles["fp16"], max_batch=2)
    assert gen.target.keys[0].dtype == np.float16
    target = gen.generate("def f(x):", max_new_tokens=24, ignore_eos=True, policy="target")
    spec = gen.generate("def f(x):", max_new_tokens=24, ignore_eos=True, policy="fixed:3")
    assert spec.tokens == target.tokens and spec.stats.n_accepted > 0
    fp32 = load(half_bundles["fp32"]).generate("def f(x):", max_new_tokens=24, ignore_eos=True, policy="target")
    assert np.mean(np.equal(fp32.tokens[:8], target.tokens[:8])) >= 0.5    # the same model, to rounding


def test_bf16_is_refused_by_the_cpu_backend_with_the_reason(half_bundles, capsys):
    with pytest.raises(OptionError, match="cannot run bfloat16 bundles .*no bfloat16 MatMul"):
        load(half_bundles["bf16"])
    from specedge.cli import main                   # inspect --verify still checks and describes it

    assert main(["inspect", str(half_bundles["bf16"]), "--verify", "--backend", "cpu"]) == 0
    out = capsys.readouterr().out
    assert "all checksums verified" in out and "target verify rows: not checked on this machine (" in out
    assert "no bfloat16 MatMul" in out


def test_bf16_with_int4_is_refused_at_export(workdir):
    with pytest.raises(ExportError, match="bf16 cannot be combined with --quantize"):
        _export(workdir, "half-bad", tm.make_model("qwen2", TARGET_ROWS, seed=1), None, tm.byte_tokenizer(),
                dtype="bf16", quantize="int4")


def test_an_unknown_dtype_is_refused(workdir):
    with pytest.raises(ExportError, match="--dtype must be one of fp32, fp16, bf16"):
        _export(workdir, "half-bad2", tm.make_model("qwen2", TARGET_ROWS, seed=1), None, tm.byte_tokenizer(),
                dtype="fp8")


def test_the_audit_catches_a_graph_in_the_wrong_dtype(half_bundles):
    with pytest.raises(ExportError, match="not as intended: input past_key.0 is not float16"):
        audit_dtype(half_bundles["fp32"] / "target.onnx", "float16")


def test_an_unchecked_timing_export_says_so_and_runs(workdir):
    """export_bundle(check=False): what scripts/gpu_check.py times (random weights in real shapes) skips the checks
    and the float32 copy, and the manifest says the bundle was not checked."""
    bundle = _export(workdir, "half-unchecked", tm.make_model("qwen2", TARGET_ROWS, seed=1), None,
                     tm.byte_tokenizer(), attention="standard", dtype="fp16", check=False, max_seq_len=64)
    entry = _manifest(bundle)["models"]["target"]
    assert "skipped" in entry["export_check"] and entry["kv"]["dtype"] == "float16"
    assert load(bundle).generate("def f(x):", max_new_tokens=4, ignore_eos=True, k=0).stats.new_tokens == 4


def test_gemma2_exports_in_bfloat16_with_its_soft_caps_in_float32(workdir):
    """The soft-caps' Tanh computes in float32 (as the rest of attention's and the logits' float32 islands). No
    --attention given: bf16 takes the standard graph, the one the backend that runs bf16 (cuda) runs; gqa, which no
    backend would run in bf16, is refused."""
    lines = []
    out = _export(workdir, "gemma2-bf16", tm.make_model("gemma2", TARGET_ROWS, seed=1), None, tm.byte_tokenizer(),
                  dtype="bf16", max_seq_len=64, max_draft=4, progress=lines.append)
    manifest = _manifest(out)
    assert manifest["dtype"] == "bfloat16"
    assert manifest["models"]["target"]["graph_variant"] == "static-kv-standard-v1"
    assert any(line.endswith("attention: standard (a bf16 bundle runs on the cuda backend, which runs standard "
                             "graphs)") for line in lines)
    with pytest.raises(ExportError, match="bf16 bundle runs on the cuda backend only .* drop --attention gqa"):
        _export(workdir, "gemma2-bf16-gqa", tm.make_model("gemma2", TARGET_ROWS, seed=1), None, tm.byte_tokenizer(),
                dtype="bf16", attention="gqa", max_seq_len=64, max_draft=4)


def test_gemma_in_float16_is_refused_before_its_weights_load(workdir):
    with pytest.raises(ExportError, match="overflows float16; export with --dtype bf16"):
        _export(workdir, "gemma3-fp16", tm.make_model("gemma3", TARGET_ROWS, seed=1), None, tm.byte_tokenizer(),
                dtype="fp16", max_seq_len=64, max_draft=4)
