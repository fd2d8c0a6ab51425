"""Exported step graphs against transformers' own models, for every supported architecture and both attention
variants, driven through the runtime's CPU backend; and the manifest's record of each graph's I/O."""


import numpy as np
import onnx
import onnxruntime as ort
import pytest
import torch
import transformers

from conftest import ARCHS, DRAFT_ROWS, TARGET_ROWS, cursor_of, manifest_of, open_model
from specedge.runtime.backends.base import SlotCursor
from specedge.runtime.manifest import FORMAT_VERSION, read_manifest

# (variant, arch, role): every architecture in gqa, both roles; standard for grouped and plain multi-head attention
CASES = ([("gqa", arch, role) for arch in ARCHS for role in ("target", "draft")]
         + [("standard", "qwen2", "target"), ("standard", "qwen2", "draft"), ("standard", "gpt2", "target")])


def _bundle(arch_bundles, standard_bundles, variant, arch):
    return (arch_bundles if variant == "gqa" else standard_bundles)[arch]


def _source(workdir, variant, arch, role):
    return workdir / (f"{arch}-bad-{role}" if variant == "gqa" else f"std-{arch}-{role}")


def _reference(folder, ids, vocab):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, :, :vocab].numpy()


@pytest.mark.parametrize("variant,arch,role", CASES)
def test_graph_matches_transformers(arch_bundles, standard_bundles, workdir, variant, arch, role):
    bundle = _bundle(arch_bundles, standard_bundles, variant, arch)
    manifest = manifest_of(bundle)
    entry, vocab = manifest["models"][role], manifest["vocab_size"]
    assert entry["architecture"] == {"qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM",
                                     "mistral": "MistralForCausalLM", "gpt2": "GPT2LMHeadModel",
                                     "qwen3": "Qwen3ForCausalLM", "gemma2": "Gemma2ForCausalLM",
                                     "gemma3": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM",
                                     "granite": "GraniteForCausalLM", "olmo2": "Olmo2ForCausalLM",
                                     "olmo3": "Olmo3ForCausalLM", "smollm3": "SmolLM3ForCausalLM",
                                     "gemma": "GemmaForCausalLM", "starcoder2": "Starcoder2ForCausalLM",
                                     "exaone4": "Exaone4ForCausalLM", "hunyuan": "HunYuanDenseV1ForCausalLM"}[arch]
    assert entry["export_check"]["max_abs_logit_error"] < 1e-3 and entry["export_check"]["ids_equal_argmax"]
    rng = np.random.default_rng(7)
    ids = rng.integers(0, vocab, size=40).tolist()
    reference = _reference(_source(workdir, variant, arch, role), ids, vocab)
    cursor = cursor_of(bundle, role)
    # prefill 16, then verify-sized and draft-sized steps into the partly filled buffer
    ours, at = [], 0
    for n in (16, 9, 1, 2, 5, 1, 6):
        ours.append(cursor.feed(ids[at:at + n]).copy())
        at += n
    np.testing.assert_allclose(np.concatenate(ours), reference, atol=1e-4, rtol=1e-4)
    # a lone token padded to two rows (the runtime's min_rows 2) gives the same rows to rounding
    padded, at = cursor_of(bundle, role, min_rows=2), 0
    rows = []
    for n in (16, 9, 1, 2, 5, 1, 6):
        rows.append(padded.feed(ids[at:at + n]).copy())
        at += n
    np.testing.assert_allclose(np.concatenate(rows), reference, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("variant,arch", [("gqa", "llama"), ("standard", "qwen2")])
def test_rejected_slots_do_not_leak(arch_bundles, standard_bundles, variant, arch):
    """Rewinding pos and writing other tokens gives the same logits as a clean run: stale K/V is masked."""
    bundle = _bundle(arch_bundles, standard_bundles, variant, arch)
    dirty, clean = cursor_of(bundle), cursor_of(bundle)
    dirty.feed([1, 2, 3, 4])
    dirty.feed([50, 60, 70, 80, 90])        # a rejected draft run
    dirty.pos = 5                           # keep only token 50
    got = dirty.feed([11, 12]).copy()
    clean.feed([1, 2, 3, 4])
    clean.feed([50, 61, 71])                # 50 computed in a step of the same shape, other company
    clean.pos = 5
    np.testing.assert_array_equal(got, clean.feed([11, 12]))


@pytest.mark.parametrize("variant,arch", [("gqa", arch) for arch in ARCHS] + [("standard", "qwen2"),
                                                                                ("standard", "gpt2")])
def test_multi_token_rows_equal_single_token_rows(arch_bundles, standard_bundles, variant, arch):
    """Exact greedy speculation rests on this: a verify row equals the one-token step's row, bit for bit."""
    bundle = _bundle(arch_bundles, standard_bundles, variant, arch)
    batched, single = cursor_of(bundle), cursor_of(bundle)
    batched.feed([3, 1, 4])
    single.feed([3, 1, 4])
    rows = batched.feed([1, 5, 9, 2, 6]).copy()
    singles = np.stack([single.feed([t])[0].copy() for t in (1, 5, 9, 2, 6)])
    np.testing.assert_array_equal(rows, singles)


def test_padded_rows_are_sliced(arch_bundles):
    manifest = manifest_of(arch_bundles["qwen2"])
    assert manifest["vocab_size"] == TARGET_ROWS
    assert manifest["models"]["draft"]["spec"]["vocab_rows"] == DRAFT_ROWS
    assert manifest["models"]["draft"]["spec"]["vocab_size"] == TARGET_ROWS


def _declared(values) -> dict:
    types = {onnx.TensorProto.INT64: "int64", onnx.TensorProto.FLOAT: "float32"}
    return {v.name: {"dtype": types[v.type.tensor_type.elem_type],
                     "shape": [d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]} for v in values}


@pytest.mark.parametrize("variant", ["gqa", "standard"])
def test_manifest_records_the_graph_io(arch_bundles, standard_bundles, variant):
    """Format 2: per model the variant, max_batch, kv slots and the I/O exactly as the graph declares it; the
    runtime's reader accepts it."""
    bundle = _bundle(arch_bundles, standard_bundles, variant, "qwen2")
    manifest = read_manifest(bundle, verify_hashes=True)
    assert manifest["format_version"] == FORMAT_VERSION == 3
    assert manifest["dtype"] == "float32" and manifest["engines"] == {}
    size, k = manifest["max_seq_len"], manifest["max_draft"]
    for role, entry in manifest["models"].items():
        kv, io = entry["kv"], entry["io"]
        assert entry["graph_variant"] == {"gqa": "static-kv-gqa-v3", "standard": "static-kv-standard-v1"}[variant]
        assert entry["max_batch"] == {"gqa": 1, "standard": None}[variant]
        assert kv["slots"] == (size + 2 if variant == "gqa" else size + k + 2)
        graph = onnx.load(bundle / entry["file"], load_external_data=False).graph
        assert io["inputs"] == _declared(graph.input) and io["outputs"] == _declared(graph.output)
        buffer = ["batch", kv["num_kv_heads"], kv["slots"], kv["head_dim"]]
        assert io["inputs"]["input_ids"] == io["inputs"]["position_ids"] == {"dtype": "int64",
                                                                            "shape": ["batch", "step"]}
        assert io["inputs"]["logit_rows"] == {"dtype": "int64", "shape": ["batch", "logit_rows"]}
        assert io["outputs"]["logits"] == {"dtype": "float32", "shape": ["batch", "logit_rows", TARGET_ROWS]}
        assert io["outputs"]["ids"] == {"dtype": "int64", "shape": ["batch", "logit_rows"]}
        assert io["kv"] == [[f"past_key.{i}", f"past_value.{i}", f"present_key.{i}", f"present_value.{i}"]
                            for i in range(kv["num_layers"])]
        for past_k, past_v, present_k, present_v in io["kv"]:
            for name, where in ((past_k, "inputs"), (past_v, "inputs"), (present_k, "outputs"),
                                (present_v, "outputs")):
                assert io[where][name] == {"dtype": "float32", "shape": buffer}
        assert set(io["inputs"]) == {"input_ids", "position_ids", "logit_rows"} | {n for layer in io["kv"]
                                                                                   for n in layer[:2]}


@pytest.mark.parametrize("variant", ["gqa", "standard"])
def test_any_logit_rows(arch_bundles, standard_bundles, variant):
    """logit_rows picks any rows, in any order and repeated (the runtime repeats one to give the LM head two
    rows): each returned row is that row of a call that returns all of them; ids are their argmax."""
    bundle = _bundle(arch_bundles, standard_bundles, variant, "qwen2")
    manifest = manifest_of(bundle)
    entry = manifest["models"]["target"]
    session = ort.InferenceSession(str(bundle / entry["file"]), providers=["CPUExecutionProvider"])
    kv = entry["kv"]
    past = np.zeros((1, kv["num_kv_heads"], kv["slots"], kv["head_dim"]), np.float32)
    feeds = {name: past for layer in entry["io"]["kv"] for name in layer[:2]}
    feeds.update(input_ids=np.array([[5, 80, 7, 7, 200]]), position_ids=np.arange(5)[None])

    def run(rows):
        return session.run(["logits", "ids"], {**feeds, "logit_rows": np.array([rows], np.int64)})

    everything, _ = run([0, 1, 2, 3, 4])
    for rows in ([4], [0, 0], [3, 1, 4, 4], [2]):
        logits, ids = run(rows)
        np.testing.assert_allclose(logits[0], everything[0, rows], atol=1e-5, rtol=1e-5)
        np.testing.assert_array_equal(ids[0], logits[0].argmax(-1))


@pytest.mark.parametrize("variant", ["gqa", "standard"])
def test_learned_positions_up_to_the_last_one(workdir, variant):
    """GPT-2 with max_seq_len = its n_positions: pad rows the runtime writes after the last position (beyond the
    position table) are harmless, and the rows up to the last position are transformers'."""
    import tiny_models as tm
    from conftest import _export

    torch.manual_seed(1)
    config = tm.make_config("gpt2", TARGET_ROWS)
    config.n_positions = 32
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    bundle = _export(workdir, f"gpt2-32-{variant}", model, None, tm.byte_tokenizer(), attention=variant,
                     max_seq_len=32, max_draft=4)
    ids = np.random.default_rng(8).integers(0, TARGET_ROWS, size=32).tolist()
    reference = _reference(workdir / f"gpt2-32-{variant}-target", ids, TARGET_ROWS)
    cursor = cursor_of(bundle, max_step=32, min_rows=2)
    first = cursor.feed(ids[:31]).copy()
    last = cursor.feed(ids[31:]).copy()                 # a lone token at the last position, padded to two rows
    np.testing.assert_allclose(np.concatenate([first, last]), reference, atol=1e-4, rtol=1e-4)
    if variant == "standard":                           # right-padded to a verify row's length in one call
        backend = open_model(bundle, max_step=32, max_batch=2)
        SlotCursor(backend, 0).feed(ids[:31])
        SlotCursor(backend, 1).feed(ids[:20])
        rows = backend.run([31, 20], [ids[31:], ids[20:25]], [1, 5])
        np.testing.assert_allclose(rows[0], reference[31:], atol=1e-4, rtol=1e-4)
        np.testing.assert_allclose(rows[1], reference[20:25], atol=1e-4, rtol=1e-4)
