"""TensorRT without TensorRT (experimental path; docs/tensorrt.md): the operator list against exported graphs, the
profiles, `specedge build --tensorrt` and the tensorrt backend against stand-in `tensorrt` and cuda-python modules
(tests/fake_tensorrt.py: host memory as device memory, the step graph run by onnxruntime through the addresses the
backend binds), the manifest record, and every refusal. Nothing here shows anything about TensorRT's own kernels."""

import json
import shutil
import sys

import onnx
import pytest

import fake_tensorrt
import tiny_models as tm
from conftest import TARGET_ROWS, _export, manifest_of, together
from specedge.cli import main
from specedge.engines import trt_ops
from specedge.engines.tensorrt_build import build_tensorrt_engines
from specedge.engines.tensorrt_record import (Profile, compatibility_problem, coverage_gaps, default_profiles,
                                              parse_profiles, select_profile)
from specedge.errors import BundleError, OptionError, SpecedgeError
from specedge.runtime import load
from specedge.runtime.backends import open_backend
from specedge.runtime.manifest import read_manifest

PROMPTS = ["def f(x):", "class LRUCache:\n    def __init__(self):\n", "x" * 70 + " = 1\n"]


@pytest.fixture(scope="module")
def gqa_bundle(workdir):
    return _export(workdir, "trt-gqa", tm.make_model("qwen2", TARGET_ROWS, seed=1), None, tm.byte_tokenizer(),
                   max_seq_len=64)


@pytest.fixture
def bundle(standard_bundles, tmp_path):
    """A private copy of the standard qwen2 pair (builds write into it)."""
    return shutil.copytree(standard_bundles["qwen2"], tmp_path / "bundle")


@pytest.fixture
def fake(monkeypatch):
    return fake_tensorrt.install(monkeypatch)


def _graph(bundle, role="target"):
    return onnx.load(str(bundle / manifest_of(bundle)["models"][role]["file"]), load_external_data=False)


# -- the operator list ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["qwen2", "gpt2"])
def test_standard_graphs_use_only_operators_tensorrt_parses(standard_bundles, name):
    """Every node of a standard bundle's graphs is in TensorRT 10.15's list; TensorScatter's axis is exported as 2,
    which TensorRT documents only as -2: the builder rewrites it (same axis of the 4D cache) before parsing."""
    for role in manifest_of(standard_bundles[name])["models"]:
        model = _graph(standard_bundles[name], role)
        assert trt_ops.unsupported_ops(model) == {}
        assert {n.op_type for n in model.graph.node} >= {"TensorScatter", "MatMul", "Softmax", "ArgMax", "GatherND"}
        assert any("axis 2, TensorRT needs -2" in p for p in trt_ops.restriction_problems(model))
        assert trt_ops.normalize_for_tensorrt(model) == ["TensorScatter axis 2 -> -2"]
        assert trt_ops.restriction_problems(model) == []


def test_int4_and_gqa_graphs_use_operators_tensorrt_lacks(standard_bundles, gqa_bundle):
    int4 = trt_ops.unsupported_ops(_graph(standard_bundles["qwen2-int4"]))
    assert {"com.microsoft.MatMulNBits", "com.microsoft.GatherBlockQuantized"} <= set(int4)
    gqa = trt_ops.unsupported_ops(_graph(gqa_bundle))
    assert {"com.microsoft.GroupQueryAttention", "com.microsoft.RotaryEmbedding"} <= set(gqa)


def test_the_operator_list_names_its_version_and_source():
    assert trt_ops.TENSORRT_VERSION == "10.15" and trt_ops.MIN_TENSORRT == (10, 15)
    assert trt_ops.SOURCE.startswith("https://github.com/onnx/onnx-tensorrt/blob/release/10.15-GA/")
    assert not set(trt_ops.SUPPORTED) & trt_ops.UNSUPPORTED
    assert "TensorScatter" in trt_ops.SUPPORTED and "MatMulInteger" in trt_ops.UNSUPPORTED


# -- profiles ---------------------------------------------------------------------------------------------
def test_default_profiles_cover_every_call_the_runtime_makes(standard_bundles):
    manifest = manifest_of(standard_bundles["qwen2"])                    # max_draft 8
    decode, prefill = default_profiles(manifest, "target", max_batch=4, prefill_chunk=64)
    assert (decode.batch, decode.tokens, decode.logit_rows) == ((1, 4, 4), (1, 9, 10), (1, 9, 10))
    assert (prefill.batch, prefill.tokens, prefill.logit_rows) == ((1, 1, 4), (1, 64, 64), (1, 1, 64))
    assert default_profiles(manifest, "draft", 4, 64)[0].tokens == (1, 2, 10)   # the draft's decode width is 2
    assert coverage_gaps([decode, prefill], 4, 64) == ""
    slots = manifest["models"]["target"]["kv"]["slots"]
    shapes = decode.shapes(manifest["models"]["target"]["io"]["inputs"])
    assert shapes["input_ids"] == ((1, 1), (4, 9), (4, 10)) and shapes["logit_rows"] == ((1, 1), (4, 9), (4, 10))
    assert shapes["past_key.0"] == ((1, 2, slots, 16), (4, 2, slots, 16), (4, 2, slots, 16))
    assert select_profile([decode, prefill], 4, 9, 9) == 0 and select_profile([decode, prefill], 1, 64, 1) == 1
    with pytest.raises(OptionError, match="no TensorRT optimization profile holds a call of 5 rows"):
        select_profile([decode, prefill], 5, 9, 9)


def test_profiles_option(standard_bundles):
    manifest = manifest_of(standard_bundles["qwen2"])
    custom = parse_profiles("decode,long:11-64@32", manifest, "target", 2, 64)
    assert [p.name for p in custom] == ["decode", "long"]
    assert (custom[1].tokens, custom[1].logit_rows, custom[1].batch) == ((11, 32, 64), (1, 1, 64), (1, 2, 2))
    with pytest.raises(OptionError, match="leave calls the runtime makes without a profile .*T=11"):
        parse_profiles("decode", manifest, "target", 2, 64)
    with pytest.raises(OptionError, match="neither a preset"):
        parse_profiles("decode,long:x", manifest, "target", 2, 64)
    with pytest.raises(OptionError, match="min <= opt <= max"):
        Profile("bad", (1, 1, 1), (4, 2, 8), (1, 1, 1))


# -- build ------------------------------------------------------------------------------------------------
def test_build_writes_engines_and_records_them(bundle, fake, capsys):
    assert main(["build", str(bundle), "--tensorrt", "--max-batch", "3"]) == 0
    assert "experimental" in capsys.readouterr().out
    manifest = read_manifest(bundle, verify_hashes=True)                 # engine files listed, sizes and hashes right
    record = manifest["engines"]["tensorrt"]
    assert {k: record[k] for k in ("tensorrt_version", "cuda_version", "cuda_driver_version", "gpu",
                                   "hardware_compatibility_level", "strongly_typed", "max_batch", "max_step",
                                   "experimental")} == {
        "tensorrt_version": "10.15.1.29", "cuda_version": "12.9", "cuda_driver_version": "13.0",
        "gpu": {"name": "Fake H200", "compute_capability": "9.0"}, "hardware_compatibility_level": "none",
        "strongly_typed": True, "max_batch": 3, "max_step": 64, "experimental": True}
    assert record["graph_rewrites"] == ["TensorScatter axis 2 -> -2"]
    for role in ("target", "draft"):
        model = record["models"][role]
        assert model["onnx"] == f"{role}.onnx" and model["onnx_sha256"] == manifest["files"][f"{role}.onnx"]["sha256"]
        assert model["file"].startswith("engines/tensorrt-") and model["file"].endswith(f"/{role}.plan")
        assert manifest["files"][model["file"]] == {"bytes": model["bytes"], "sha256": model["sha256"]}
        assert [p["name"] for p in model["profiles"]] == ["decode", "prefill"]
    assert [b["strongly_typed"] for b in fake.builds] == [True, True]
    decode_shapes = fake.builds[0]["profiles"][0]
    assert decode_shapes["input_ids"] == ((1, 1), (3, 9), (3, 10))
    assert {n for n in decode_shapes} == set(manifest["models"]["target"]["io"]["inputs"])
    assert not list(bundle.glob(".tensorrt-build-*")) and not list(bundle.glob(".manifest*"))


def test_hardware_compatibility_option_is_recorded(bundle, fake):
    record = build_tensorrt_engines(bundle, hardware_compatibility="same-compute-capability")
    assert record["hardware_compatibility_level"] == "same_compute_capability"
    assert fake.builds[-1]["level"] == "SAME_COMPUTE_CAPABILITY"


def test_a_failed_build_leaves_the_bundle_as_it_was_and_a_rebuild_replaces_engines(bundle, fake):
    build_tensorrt_engines(bundle)
    before = (bundle / "manifest.json").read_text()
    old_dirs = sorted(p.name for p in (bundle / "engines").iterdir())
    fake.fail_build_for = "draft.onnx"                   # the target builds, then the draft fails
    with pytest.raises(SpecedgeError, match="could not build an engine from draft.onnx"):
        build_tensorrt_engines(bundle)
    assert (bundle / "manifest.json").read_text() == before
    assert sorted(p.name for p in (bundle / "engines").iterdir()) == old_dirs
    assert not list(bundle.glob(".tensorrt-build-*"))
    read_manifest(bundle, verify_hashes=True)
    fake.fail_build_for = None
    record = build_tensorrt_engines(bundle)
    new_dirs = sorted(p.name for p in (bundle / "engines").iterdir())
    assert len(new_dirs) == 1 and new_dirs != old_dirs and record["models"]["target"]["file"].split("/")[1] == new_dirs[0]
    manifest = read_manifest(bundle, verify_hashes=True)
    assert sorted(f for f in manifest["files"] if f.startswith("engines/")) == sorted(
        m["file"] for m in record["models"].values())


def test_int4_and_gqa_bundles_are_refused_with_what_to_do(standard_bundles, gqa_bundle, fake, capsys):
    with pytest.raises(BundleError, match="int4 .*MatMulNBits.*re-export without --quantize"):
        build_tensorrt_engines(standard_bundles["qwen2-int4"])
    with pytest.raises(BundleError, match="static-kv-gqa-v3 .*re-export with --attention standard"):
        build_tensorrt_engines(gqa_bundle)
    assert main(["build", str(gqa_bundle), "--tensorrt"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "--attention standard" in err
    assert fake.builds == []


def test_build_without_tensorrt_is_a_one_line_error(bundle, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert main(["build", str(bundle), "--tensorrt"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "missing tensorrt" in err and "specedge[tensorrt]" in err
    assert main(["build", str(bundle)]) == 2
    assert "--tensorrt" in capsys.readouterr().err


# -- the backend ------------------------------------------------------------------------------------------
def test_the_tensorrt_backend_gives_the_cpu_backends_tokens(bundle, fake):
    """Engines run through the addresses the backend binds (fake: onnxruntime on host memory): a batch of rows
    leaving at different steps (slot compaction by 2D copies), greedy and seeded sampling, equals the cpu backend's
    tokens for each row alone; decode calls replay one captured CUDA graph per model."""
    build_tensorrt_engines(bundle, max_batch=3)
    solo = load(bundle)
    requests = [(p, dict(max_new_tokens=n, ignore_eos=True, policy="fixed:3")) for p, n in zip(PROMPTS, (10, 30, 20))]
    expected = [solo.generate(p, **o).tokens for p, o in requests]
    gen = load(bundle, backend="tensorrt", max_batch=3)
    assert [r.tokens for r in together(gen, requests)] == expected
    sampled = dict(max_new_tokens=16, ignore_eos=True, policy="fixed:2", temperature=0.8, seed=11)
    assert gen.generate(PROMPTS[1], **sampled).tokens == solo.generate(PROMPTS[1], **sampled).tokens
    for backend, width in ((gen.target, 9), (gen.draft, 2)):
        captured = [u.key for u in backend._units.values() if u.graph_exec is not None]
        assert captured == [(0, 3, width, width)], captured
        assert backend.cuda_graph_problem is None
    assert fake.launches > 0 and fake.captures == 2


def test_binding_aliases_past_and_present_at_the_slot_offset(bundle, fake):
    build_tensorrt_engines(bundle, max_batch=3)
    manifest = manifest_of(bundle)
    entry = manifest["models"]["target"]
    backend = open_backend("tensorrt", bundle / entry["file"], entry, manifest["max_seq_len"], max_batch=3,
                           max_step=64, width=9, cuda_graphs=False)
    backend.run([0], [[5, 6, 7]], [1], lo=1, want="ids")         # slot 1 alone: padded to the decode width
    context = fake.contexts[-1]
    slot = backend.kv_slot_bytes // (2 * backend.num_layers)
    for layer, (past_k, past_v, present_k, present_v) in enumerate(entry["io"]["kv"]):
        assert context.addresses[past_k] == context.addresses[present_k] == backend.keys[layer] + slot
        assert context.addresses[past_v] == context.addresses[present_v] == backend.values[layer] + slot
    assert context.shapes["input_ids"] == (1, 9) and context.shapes["logit_rows"] == (1, 9)
    assert context.shapes["past_key.0"] == (1, 2, entry["kv"]["slots"], 16)
    assert context.addresses["ids"] == backend.addresses(0)["ids"]
    assert context.profile == 0                                            # the decode profile
    backend.run([0], [list(range(40))], [1], lo=0, want="ids")             # beyond max_draft + 2: prefill profile
    assert fake.contexts[-1].profile == 1 and fake.contexts[-1].shapes["input_ids"] == (1, 40)


def test_engines_for_another_gpu_or_tensorrt_version_are_refused(bundle, fake):
    build_tensorrt_engines(bundle)
    fake.gpu_name, fake.major, fake.minor = "Fake L4", 8, 9
    with pytest.raises(BundleError, match=r"built for Fake H200 \(compute capability 9.0\), this machine has Fake L4 "
                                          r"\(compute capability 8.9\).*specedge build .* --tensorrt"):
        load(bundle, backend="tensorrt")
    fake.gpu_name, fake.major, fake.minor = "Fake H200", 9, 0
    sys.modules["tensorrt"].__version__ = "10.16.0.1"         # the stand-in, replaced after this test
    with pytest.raises(BundleError, match="TensorRT 10.15.1.29 built them, this machine has 10.16.0.1"):
        load(bundle, backend="tensorrt")


def test_compatibility_levels():
    record = {"tensorrt_version": "10.15.1.29", "gpu": {"name": "NVIDIA H200", "compute_capability": "9.0"}}
    h100 = {"tensorrt_version": "10.15.1.29", "gpu": {"name": "NVIDIA H100", "compute_capability": "9.0"}}
    l4 = {"tensorrt_version": "10.15.1.29", "gpu": {"name": "NVIDIA L4", "compute_capability": "8.9"}}
    t4 = {"tensorrt_version": "10.15.1.29", "gpu": {"name": "Tesla T4", "compute_capability": "7.5"}}
    same = {"tensorrt_version": "10.15.1.29", "gpu": record["gpu"]}
    assert compatibility_problem({**record, "hardware_compatibility_level": "none"}, same) is None
    assert "NVIDIA H100" in compatibility_problem({**record, "hardware_compatibility_level": "none"}, h100)
    assert compatibility_problem({**record, "hardware_compatibility_level": "same_compute_capability"}, h100) is None
    assert "compute capability 9.0" in compatibility_problem(
        {**record, "hardware_compatibility_level": "same_compute_capability"}, l4)
    assert compatibility_problem({**record, "hardware_compatibility_level": "ampere_plus"}, l4) is None
    assert "Ampere or newer" in compatibility_problem({**record, "hardware_compatibility_level": "ampere_plus"}, t4)


def test_load_refusals(bundle, standard_bundles, gqa_bundle, fake):
    with pytest.raises(BundleError, match="has no TensorRT engines; build them: specedge build .* --tensorrt"):
        load(standard_bundles["qwen2"], backend="tensorrt")
    with pytest.raises(OptionError, match="runs bundles exported with --attention standard"):
        load(gqa_bundle, backend="tensorrt")
    build_tensorrt_engines(bundle, max_batch=1)
    with pytest.raises(OptionError, match="at most 1 concurrent sequences.*--max-batch 2"):
        load(bundle, backend="tensorrt", max_batch=2)
    fake.memory_limit = 4096
    with pytest.raises(OptionError, match="out of memory .*max_batch 1"):
        load(bundle, backend="tensorrt")


def test_tensorrt_unavailable_is_a_one_line_error_naming_what_is_missing(standard_bundles, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "tensorrt", None)
    assert main(["generate", str(standard_bundles["qwen2"]), "--prompt", "x", "--backend", "tensorrt"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "missing tensorrt" in err and "specedge[tensorrt]" in err


def test_tensorrt_without_cuda_python_or_a_device_or_recent_enough(standard_bundles, monkeypatch, capsys):
    state = fake_tensorrt.install(monkeypatch)
    for module in ("cuda", "cuda.bindings", "cuda.bindings.runtime"):
        monkeypatch.setitem(sys.modules, module, None)
    assert main(["generate", str(standard_bundles["qwen2"]), "--prompt", "x", "--backend", "tensorrt"]) == 2
    assert "missing cuda-python" in capsys.readouterr().err
    fake_tensorrt.install(monkeypatch, state)
    state.device_count = 0
    assert main(["generate", str(standard_bundles["qwen2"]), "--prompt", "x", "--backend", "tensorrt"]) == 2
    assert "no CUDA device is visible" in capsys.readouterr().err
    state.device_count = 1
    sys.modules["tensorrt"].__version__ = "10.14.1.48"
    assert main(["generate", str(standard_bundles["qwen2"]), "--prompt", "x", "--backend", "tensorrt"]) == 2
    assert "TensorRT 10.14.1.48 is older than 10.15" in capsys.readouterr().err


def test_inspect_verify_runs_the_row_probe_on_tensorrt(bundle, fake, capsys):
    build_tensorrt_engines(bundle)
    assert main(["inspect", str(bundle), "--verify", "--backend", "tensorrt"]) == 0
    out = capsys.readouterr().out
    assert "all checksums verified" in out and "on this machine (tensorrt): yes" in out
    assert json.loads((bundle / "manifest.json").read_text())["engines"]["tensorrt"]["models"]


def test_a_float16_bundle_builds_and_runs_with_float16_kv(workdir, tmp_path, monkeypatch):
    """The engine's I/O keeps the bundle's dtype (strongly typed): float16 KV buffers, float32 logits."""
    qwen2 = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    source = _export(workdir, "trt-fp16", qwen2, tm.perturbed(qwen2, seed=3, noise=0.01), tm.byte_tokenizer(),
                     attention="standard", dtype="fp16", max_seq_len=96, max_draft=4)
    bundle = shutil.copytree(source, tmp_path / "fp16")
    state = fake_tensorrt.install(monkeypatch)
    build_tensorrt_engines(bundle, max_batch=2)
    gen, cpu = load(bundle, backend="tensorrt", max_batch=2), load(bundle)
    kv = manifest_of(bundle)["models"]["target"]["kv"]
    assert gen.target.dtype == "float16" and kv["dtype"] == "float16"
    assert gen.target.kv_slot_bytes == 2 * kv["num_layers"] * kv["num_kv_heads"] * kv["slots"] * kv["head_dim"] * 2
    options = dict(max_new_tokens=12, ignore_eos=True, policy="fixed:2")
    assert gen.generate(PROMPTS[0], **options).tokens == cpu.generate(PROMPTS[0], **options).tokens
    assert state.builds[0]["strongly_typed"]


def test_cuda_graphs_off_or_refused_run_uncaptured(bundle, fake):
    build_tensorrt_engines(bundle)
    options = dict(max_new_tokens=8, ignore_eos=True, policy="fixed:2")
    expected = load(bundle).generate(PROMPTS[0], **options).tokens
    assert load(bundle, backend="tensorrt", cuda_graphs=False).generate(PROMPTS[0], **options).tokens == expected
    assert fake.captures == 0 and fake.launches == 0
    fake.capture_unsupported = True
    gen = load(bundle, backend="tensorrt")
    assert gen.generate(PROMPTS[0], **options).tokens == expected
    assert not gen.target.cuda_graphs and "cudaStreamBeginCapture failed" in gen.target.cuda_graph_problem
    assert fake.launches == 0
