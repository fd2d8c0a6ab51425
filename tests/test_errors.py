"""Bad input gets one clear line and a non-zero exit; failed exports leave nothing behind."""

import json
import shutil

import numpy as np
import pytest

import tiny_models as tm
from specedge.cli import main
from specedge.errors import BundleError, ExportError, OptionError
from specedge.export import export_bundle
from specedge.runtime import load


def run_cli(capsys, *args):
    """-> (exit code, the error line); progress lines may precede it, a traceback never."""
    code = main(list(args))
    lines = capsys.readouterr().err.strip().splitlines()
    assert not any("Traceback" in line for line in lines)
    errors = [line for line in lines if line.startswith("specedge: error:")]
    assert len(errors) == (1 if code else 0), lines
    return code, errors[0] if errors else ""


@pytest.mark.parametrize("args,message", [
    (["--k", "-1"], "--k"),
    (["--k", "9"], "max_draft 8"),
    (["--temperature", "-0.5"], "--temperature"),
    (["--top-p", "0"], "--top-p"),
    (["--top-p", "1.5"], "--top-p"),
    (["--top-k", "-2"], "--top-k"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--k", "abc"], "--k"),
    (["--seed", "-1", "--temperature", "0.5"], "--seed"),
    (["--threads", "0"], "--threads"),
    (["--threads", "100000"], "--threads"),                 # onnxruntime would start them all (16 GB, killed)
    (["--drafter", "oracle"], "--drafter"),
    (["--backend", "tpu"], "'tpu' is not one of 'cpu', 'cuda', 'tensorrt', 'auto'"),
    (["--policy", "ngram"], "--drafter ngram"),
    (["--policy", "fixed:x"], "K must be an integer"),
])
def test_invalid_generate_options(capsys, arch_bundles, args, message):
    code, err = run_cli(capsys, "generate", str(arch_bundles["qwen2"]), "--prompt", "x", *args)
    assert code == 2
    assert err.startswith("specedge: error:") and message in err and "\n" not in err and "Traceback" not in err


def test_missing_bundle(capsys, tmp_path):
    code, err = run_cli(capsys, "generate", str(tmp_path / "nope"), "--prompt", "x")
    assert code == 1 and "no such bundle" in err and "\n" not in err


def test_prompt_too_long(capsys, arch_bundles):
    code, err = run_cli(capsys, "generate", str(arch_bundles["qwen2"]), "--prompt", "x" * 300)
    assert code == 1 and "max_seq_len 256" in err and "\n" not in err


@pytest.fixture
def bundle_copy(arch_bundles, tmp_path):
    dst = tmp_path / "copy"
    shutil.copytree(arch_bundles["gpt2"], dst)
    return dst


def test_unknown_format_version(bundle_copy):
    manifest = json.loads((bundle_copy / "manifest.json").read_text())
    manifest["format_version"] = 99
    (bundle_copy / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(BundleError, match="format version 99 is not supported"):
        load(bundle_copy)


def test_corrupt_manifest(bundle_copy):
    (bundle_copy / "manifest.json").write_text("{not json")
    with pytest.raises(BundleError, match="corrupt manifest"):
        load(bundle_copy)


def test_missing_weights(bundle_copy):
    (bundle_copy / "draft.onnx.data").unlink()
    with pytest.raises(BundleError, match="missing file draft.onnx.data"):
        load(bundle_copy)


def test_truncated_weights(bundle_copy):
    path = bundle_copy / "target.onnx.data"
    path.write_bytes(path.read_bytes()[:1000])
    with pytest.raises(BundleError, match="target.onnx.data is corrupt"):
        load(bundle_copy)


@pytest.mark.parametrize("role", ["target", "draft"])
def test_nan_weights_are_refused_at_load(bundle_copy, capsys, role):
    """Weights that load but compute NaN (damaged, or a float16 graph that overflows) gave token 0 forever under
    greedy decoding, with exit 0: the load probe now refuses them, whichever rows it runs."""
    path = bundle_copy / f"{role}.onnx.data"
    path.write_bytes(np.full(path.stat().st_size // 4, np.nan, np.float32).tobytes())
    for rows in ("auto", 2):
        with pytest.raises(BundleError, match=f"^{role}: its logits on a probe prompt are not finite"):
            load(bundle_copy, target_rows=rows)
    code, err = run_cli(capsys, "generate", str(bundle_copy), "--prompt", "hi")
    assert code == 1 and "not finite" in err and "\n" not in err


def test_garbled_graph_same_size(bundle_copy, capsys):
    path = bundle_copy / "target.onnx"
    path.write_bytes(b"\x07" * path.stat().st_size)
    with pytest.raises(BundleError, match="cannot load model"):
        load(bundle_copy)
    code, err = run_cli(capsys, "inspect", str(bundle_copy), "--verify")
    assert code == 1 and "checksum mismatch" in err


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    tok = tm.byte_tokenizer()
    target = tm.save(tm.make_model("qwen2", 260, seed=1), tok, root / "target")
    return root, target


def _assert_nothing_left(parent, name):
    assert not (parent / name).exists()
    assert not [p for p in parent.iterdir() if p.name.startswith(f".{name}.export-")]


def test_failed_check_leaves_no_bundle(sources, tmp_path):
    _, target = sources
    with pytest.raises(ExportError, match="differs from transformers"):
        export_bundle(str(target), str(target), tmp_path / "b", max_seq_len=64, tolerance=-1.0, progress=None)
    _assert_nothing_left(tmp_path, "b")
    with pytest.raises(ExportError, match="differs from transformers"):      # nor the folders made for it
        export_bundle(str(target), None, tmp_path / "new" / "deeper" / "b", max_seq_len=64, tolerance=-1.0,
                      progress=None)
    assert not (tmp_path / "new").exists()


def test_failed_export_keeps_existing_bundle(sources, tmp_path):
    _, target = sources
    out = export_bundle(str(target), None, tmp_path / "b", max_seq_len=64, progress=None)
    before = (out / "manifest.json").read_text()
    with pytest.raises(ExportError):
        export_bundle(str(target), str(target), out, max_seq_len=64, tolerance=-1.0, force=True, progress=None)
    assert (out / "manifest.json").read_text() == before
    assert not [p for p in tmp_path.iterdir() if ".export-" in p.name]


def test_unsupported_architecture(sources, tmp_path):
    root, _ = sources
    folder = tm.save(tm.make_model("qwen2", 260, seed=1), tm.byte_tokenizer(), root / "odd")
    cfg = json.loads((folder / "config.json").read_text())
    cfg["architectures"] = ["FalconForCausalLM"]
    (folder / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ExportError, match="unsupported architecture FalconForCausalLM; supported: LlamaForCausalLM"):
        export_bundle(str(folder), None, tmp_path / "b", max_seq_len=64, progress=None)
    _assert_nothing_left(tmp_path, "b")


def test_vocabulary_mismatch(sources, tmp_path):
    root, target = sources
    other = tm.save(tm.make_model("qwen2", 20, seed=2), tm.word_tokenizer(20), root / "words")
    with pytest.raises(ExportError, match="vocabularies differ"):
        export_bundle(str(target), str(other), tmp_path / "b", max_seq_len=64, progress=None)
    _assert_nothing_left(tmp_path, "b")


def test_export_cli_errors(capsys, sources, tmp_path):
    _, target = sources
    code, err = run_cli(capsys, "export", "--target", str(tmp_path / "missing"), "--draft", "none",
                        "--out", str(tmp_path / "b"))
    assert code == 1 and "no such file or folder" in err and "\n" not in err
    code, err = run_cli(capsys, "export", "--target", str(target), "--draft", "none", "--out", str(tmp_path / "b"),
                        "--max-draft", "0")
    assert code == 2 and "--max-draft" in err
    (tmp_path / "notabundle").mkdir()
    (tmp_path / "notabundle" / "notes.txt").write_text("mine")
    for force in ((), ("--force",)):              # without --force too: no hint to pass the flag that will refuse
        code, err = run_cli(capsys, "export", "--target", str(target), "--draft", "none",
                            "--out", str(tmp_path / "notabundle"), *force)
        assert code == 1 and "not a bundle" in err and "--force" not in err
        assert (tmp_path / "notabundle" / "notes.txt").read_text() == "mine"
    (tmp_path / "abundle").mkdir()
    (tmp_path / "abundle" / "manifest.json").write_text("{}")
    code, err = run_cli(capsys, "export", "--target", str(target), "--draft", "none",
                        "--out", str(tmp_path / "abundle"))
    assert code == 1 and "already holds a bundle (pass --force" in err
    (tmp_path / "link").symlink_to(tmp_path / "abundle")         # found before the export, not after it
    code, err = run_cli(capsys, "export", "--target", str(target), "--draft", "none", "--out", str(tmp_path / "link"),
                        "--force")
    assert code == 1 and "is a symbolic link" in err and (tmp_path / "abundle" / "manifest.json").exists()
    (tmp_path / "afile").write_text("x")
    for out, expected in ((tmp_path / "afile", 2), (tmp_path / "afile" / "sub", 1)):   # no folder can be made there
        code, err = run_cli(capsys, "export", "--target", str(target), "--draft", "none", "--out", str(out))
        assert code == expected and str(tmp_path / "afile") in err and "\n" not in err, err
    assert "a file stands where one of its folders would be" in err                  # not "File exists"
    with pytest.raises(ExportError, match="exists and is not a folder"):
        export_bundle(str(target), None, tmp_path / "afile", progress=None)
    code, err = run_cli(capsys, "export", "--target", str(target), "--draft", "none", "--out", str(tmp_path / "b"),
                        "--quantize", "int4", "--block-size", "24")
    assert code == 2 and "--block-size" in err and "\n" not in err          # a usage error, as click's own
    _assert_nothing_left(tmp_path, "b")
    code, err = run_cli(capsys, "export", "--target", str(target), "--draft", "none", "--out", str(tmp_path / "b"),
                        "--max-seq-len", "1")
    assert code == 2 and "'--max-seq-len': 1 is not in the range x>=32" in err     # as --help says
    with pytest.raises(ExportError, match="--max-seq-len must be at least 32"):
        export_bundle(str(target), None, tmp_path / "b", max_seq_len=16, progress=None)
    for flags, says in [(("--quantize", "int4", "--block-size", "512"), "256"),
                        (("--block-size", "64"), "apply to quantized models"),
                        (("--draft-block-size", "64"), "--draft-block-size applies to a quantized draft"),
                        (("--quantize", "int4", "--draft-block-size", "48"), "--draft-block-size must be a power of two"),
                        (("--quantize", "int4", "--draft-block-size", "64"), "there is none (--draft none)"),
                        (("--accuracy-level", "0"), "apply to quantized models"),
                        (("--rounding", "lsq"), "apply to quantized models"),
                        (("--quantize", "int4", "--rounding", "nearest"), "Invalid value for '--rounding'"),
                        (("--max-draft", "33"), "1<=x<=32"),
                        (("--draft-quantize", "int4"), "--draft-quantize needs a draft model"),
                        (("--tolerance", "nan"), "--tolerance must be a finite number"),
                        (("--tolerance", "inf"), "--tolerance must be a finite number")]:
        code, err = run_cli(capsys, "export", "--target", str(target), "--draft", "none",
                            "--out", str(tmp_path / "b"), *flags)
        assert code == 2 and says in err, (flags, err)
    _assert_nothing_left(tmp_path, "b")


def test_a_source_that_computes_nan_is_an_export_error(tmp_path):
    """The export check's own finite test, before the row probes (which would call it a damaged bundle)."""
    import torch

    model = tm.make_model("qwen2", 260, seed=1)
    with torch.no_grad():
        model.model.layers[0].mlp.down_proj.weight[0, 0] = float("nan")
    source = tm.save(model, tm.byte_tokenizer(), tmp_path / "nan-source")
    with pytest.raises(ExportError, match="^target: the exported graph's logits are not finite"):
        export_bundle(str(source), None, tmp_path / "b", max_seq_len=64, progress=None)
    _assert_nothing_left(tmp_path, "b")


def test_target_only_bundle_refuses_speculation(sources, tmp_path, capsys):
    _, target = sources
    out = export_bundle(str(target), None, tmp_path / "solo", max_seq_len=64, progress=None)
    assert load(out).generate("ab", max_new_tokens=5, k=0).stats.new_tokens >= 1
    assert load(out).generate("ab", max_new_tokens=5).stats.n_drafted == 0      # no k given: target alone
    # the way out, in the terms of whoever asked: the Python API's options, the CLI's flags, the server's fields
    with pytest.raises(OptionError, match=r"no draft model .*use_draft=False.*drafter='ngram'"):
        load(out).generate("ab", max_new_tokens=5, k=4)
    code, err = run_cli(capsys, "generate", str(out), "--prompt", "ab", "--k", "4")
    assert code == 2 and "no draft model" in err and "--policy target" in err and "--drafter ngram" in err
    code, err = run_cli(capsys, "serve", str(out), "--policy", "adaptive", "--drafter", "hybrid")
    assert code == 2 and "drafter 'hybrid' needs one" in err and "--policy target" in err and "_" not in err
    code, err = run_cli(capsys, "bench", str(out), "--policies", "target,fixed:2,fixed:2@hybrid", "--out",
                        str(tmp_path / "bench"))                      # named policies are not dropped silently
    assert code == 2 and "no draft model, which fixed:2, fixed:2@hybrid need" in err, err
    import httpx
    from serve_helpers import MODEL, running

    with running(out, max_batch=1, policy="target") as (srv, _):
        def post(body):
            return httpx.post(srv.url + "/completions", json={"model": MODEL, "prompt": "ab", **body})

        answer = post({"max_tokens": 2, "speculation": {"policy": "adaptive"}})
        error = answer.json()["error"]
        assert answer.status_code == 400 and error["param"] == "speculation", error
        assert '"speculation": "off"' in error["message"] and "--" not in error["message"]
        assert post({"max_tokens": 2}).status_code == 200
    assert main(["generate", str(out), "--prompt", "ab", "--max-new-tokens", "3"]) == 0    # no --k: target alone
    assert "the target runs alone" in capsys.readouterr().err
