"""GPU backends without a GPU: the cuda backend's device code path on the CPU provider (device="cpu"), backend
selection and its errors. Tests marked `gpu` need a CUDA device and are skipped here with the reason."""

import json

import onnxruntime as ort
import pytest

import tiny_models as tm
from conftest import ARCHS, TARGET_ROWS, _export, together
from specedge.cli import main
from specedge.errors import OptionError
from specedge.runtime import load
from specedge.runtime.backends import cuda as cuda_backend
from specedge.runtime.backends import choose_backend

HAS_CUDA = "CUDAExecutionProvider" in ort.get_available_providers()
ON_CPU = {"device": "cpu"}
PROMPTS = ["def f(x):", "class LRUCache:\n    def __init__(self):\n", "x" * 70 + " = 1\n"]


@pytest.fixture(scope="module")
def gpu_bundles(workdir, standard_bundles):
    tok = tm.byte_tokenizer()
    qwen2 = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    return {"fp32": standard_bundles["qwen2"],
            "fp16": _export(workdir, "gpu-fp16", qwen2, tm.perturbed(qwen2, seed=3, noise=0.01), tok,
                            attention="standard", dtype="fp16", max_seq_len=96, max_draft=4),
            "gqa": _export(workdir, "gpu-gqa", qwen2, None, tok, max_seq_len=64)}


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_standard_graphs_hold_no_node_the_cuda_provider_would_run_on_the_cpu(gpu_bundles, dtype):
    """onnxruntime captures CUDA graphs only when every node runs on the CUDA provider. On an H200 two did not:
    a Concat of Shape(logit_rows) (its inputs CPU tensors) and a Tile of booleans (no CUDA kernel for bool).
    Neither may come back: no Shape or Size node, no Tile of booleans, and the logits come straight from a MatMul
    on the transposed head."""
    for role in ("target", "draft"):
        model = _cuda_graph_ready(gpu_bundles[dtype] / f"{role}.onnx")
        producer = {out: n for n in model.graph.node for out in n.output}
        logits = producer["logits"]
        if logits.op_type == "Cast":                       # half precision: float32 logits by a cast
            logits = producer[logits.input[0]]
        assert logits.op_type == "MatMul"


def _cuda_graph_ready(path):
    """Asserts a standard graph holds no Shape or Size node and no Tile of booleans (see above) -> the model."""
    import onnx

    model = onnx.shape_inference.infer_shapes(onnx.load(str(path)))
    types = {v.name: v.type.tensor_type.elem_type for v in (*model.graph.value_info, *model.graph.input)}
    ops = [n.op_type for n in model.graph.node]
    assert "Shape" not in ops and "Size" not in ops
    tiled = [types.get(n.input[0]) for n in model.graph.node if n.op_type == "Tile"]
    assert tiled and onnx.TensorProto.BOOL not in tiled
    return model


@pytest.mark.parametrize("arch", ARCHS)
def test_every_architecture_s_standard_graph_is_as_cuda_graph_ready(workdir, arch):
    """Partial rotary dims, LayerNorms, norms after RoPE, scaled logits...: no architecture brings back a node that
    would keep the cuda backend from capturing its decode calls."""
    bundle = _export(workdir, f"cuda-ready-{arch}", tm.make_model(arch, TARGET_ROWS, seed=1), None,
                     tm.byte_tokenizer(), attention="standard", max_seq_len=64, max_draft=4)
    _cuda_graph_ready(bundle / "target.onnx")


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_the_cuda_code_path_gives_the_cpu_backends_tokens_in_a_batch(gpu_bundles, dtype):
    """Device buffers bound by pointer, inputs copied in, ids copied out, slots compacted by device copies: a batch
    of rows leaving at different steps gets exactly what the cpu backend gives each row alone."""
    bundle = gpu_bundles[dtype]
    solo = load(bundle)
    requests = [(p, dict(max_new_tokens=n, ignore_eos=True, policy="fixed:3")) for p, n in zip(PROMPTS, (10, 30, 20))]
    expected = [solo.generate(p, **o).tokens for p, o in requests]
    gen = load(bundle, backend="cuda", backend_options=ON_CPU, max_batch=3)
    assert [r.tokens for r in together(gen, requests)] == expected
    sampled = dict(max_new_tokens=16, ignore_eos=True, policy="fixed:2", temperature=0.8, seed=11)
    assert gen.generate(PROMPTS[1], **sampled).tokens == solo.generate(PROMPTS[1], **sampled).tokens


def test_every_decode_call_runs_at_one_shape(gpu_bundles):
    """Exact by construction: all max_batch rows, max_draft + 1 tokens (target) or 2 (draft) wide, whatever the batch
    and k; only a joining sequence's prefill chunks, and a draft's catch-up, run at their own slot and shape."""
    gen = load(gpu_bundles["fp32"], backend="cuda", backend_options=ON_CPU, max_batch=3)
    together(gen, [(p, dict(max_new_tokens=12, ignore_eos=True, policy="adaptive")) for p in PROMPTS])
    gen.generate(PROMPTS[0], max_new_tokens=12, ignore_eos=True, policy="target")
    width = gen.max_draft + 1
    for backend, w in ((gen.target, width), (gen.draft, 2)):
        decode = {key for key in backend._bindings if key[0] == 0 and key[2] <= w and key[1] > 1}
        assert decode == {(0, 3, w, w)}, decode


def test_kv_lives_in_the_bundles_dtype(gpu_bundles):
    fp32 = load(gpu_bundles["fp32"], backend="cuda", backend_options=ON_CPU)
    fp16 = load(gpu_bundles["fp16"], backend="cuda", backend_options=ON_CPU)
    assert fp16.target.dtype == "float16" and fp32.target.dtype == "float32"
    m16, m32 = (json.loads((gpu_bundles[k] / "manifest.json").read_text()) for k in ("fp16", "fp32"))
    slots16, slots32 = m16["models"]["target"]["kv"]["slots"], m32["models"]["target"]["kv"]["slots"]
    assert fp16.kv_slot_bytes["target"] * 2 * slots32 == fp32.kv_slot_bytes["target"] * slots16


def test_a_gqa_bundle_is_refused_by_the_cuda_backend(gpu_bundles):
    with pytest.raises(OptionError, match="runs bundles exported with --attention standard"):
        load(gpu_bundles["gqa"], backend="cuda", backend_options=ON_CPU)


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has a CUDA provider")
def test_cuda_without_onnxruntime_gpu_is_a_one_line_error(gpu_bundles, capsys):
    assert main(["generate", str(gpu_bundles["fp32"]), "--prompt", "x", "--backend", "cuda"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "no CUDA execution provider" in err and "specedge[cuda]" in err


def test_both_onnxruntime_packages_installed_is_detected(monkeypatch):
    class Dist:
        def __init__(self, name, folder="/site"):
            self.metadata, self.folder = {"Name": name}, folder

        def locate_file(self, _):
            return self.folder

    monkeypatch.setattr("importlib.metadata.distributions",
                        lambda: [Dist("onnxruntime"), Dist("onnxruntime_gpu"), Dist("numpy")])
    assert "pip uninstall -y onnxruntime onnxruntime-gpu" in cuda_backend.install_problem()
    monkeypatch.setattr("importlib.metadata.distributions", lambda: [Dist("onnxruntime")])
    assert cuda_backend.install_problem() is None
    # in separate folders (a --target install ahead on PYTHONPATH) neither overwrites the other
    monkeypatch.setattr("importlib.metadata.distributions",
                        lambda: [Dist("onnxruntime", "/usr/lib/site"), Dist("onnxruntime-gpu", "/tmp/site")])
    assert cuda_backend.install_problem() is None


@pytest.mark.skipif(HAS_CUDA, reason="this onnxruntime has a CUDA provider")
def test_auto_says_what_it_picked_and_why(gpu_bundles, workdir, capsys):
    manifest = json.loads((gpu_bundles["fp32"] / "manifest.json").read_text())
    name, why = choose_backend(manifest)
    assert name == "cpu" and "cuda:" in why and "no CUDA execution provider" in why
    assert main(["generate", str(gpu_bundles["fp32"]), "--prompt", "x", "--max-new-tokens", "2",
                 "--backend", "auto"]) == 0
    assert "backend auto: cpu" in capsys.readouterr().err
    bf16 = dict(manifest, dtype="bfloat16")
    with pytest.raises(OptionError, match="no backend can run this bundle here .*bfloat16"):
        choose_backend(bf16)


def test_inspect_verify_reports_row_exactness_for_the_backend(gpu_bundles, capsys, monkeypatch):
    monkeypatch.setattr(cuda_backend.CudaBackend, "check_available", classmethod(lambda cls, **_: None))
    real_init = cuda_backend.CudaBackend.__init__
    monkeypatch.setattr(cuda_backend.CudaBackend, "__init__",
                        lambda self, *a, **k: real_init(self, *a, **{**k, "device": "cpu"}))
    assert main(["inspect", str(gpu_bundles["fp32"]), "--verify", "--backend", "cuda"]) == 0
    assert "bitwise equal to single steps on this machine (cuda): yes" in capsys.readouterr().out


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_CUDA, reason="needs onnxruntime-gpu and a CUDA device (scripts/gpu-check.sh runs these)")
@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_on_a_gpu_greedy_speculation_equals_target_only(gpu_bundles, dtype):
    gen = load(gpu_bundles[dtype], backend="cuda", max_batch=3)
    for prompt in PROMPTS:
        target = gen.generate(prompt, max_new_tokens=24, ignore_eos=True, policy="target").tokens
        assert gen.generate(prompt, max_new_tokens=24, ignore_eos=True, policy="fixed:3").tokens == target
    batch = together(gen, [(p, dict(max_new_tokens=24, ignore_eos=True, policy="fixed:3")) for p in PROMPTS])
    assert [r.tokens for r in batch] == [gen.generate(p, max_new_tokens=24, ignore_eos=True,
                                                         policy="target").tokens for p in PROMPTS]
