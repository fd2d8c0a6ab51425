"""Weight-only quantization: our packing against onnxruntime's MatMulNBits, and quantized bundles."""

import json

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import tiny_models as tm
from conftest import TARGET_ROWS, _export, cursor_of, open_model
from specedge.errors import ExportError, OptionError
from specedge.export.quantize import Quantization, dequantize, fitting_block_size, parse_quantization, quantize
from specedge.runtime import load
from specedge.runtime.backends.base import SlotCursor
from specedge.runtime.row_check import choose_min_rows, probe_ids, verify_rows_bitwise_equal


def _matmul_nbits(a: np.ndarray, w: np.ndarray, q: Quantization) -> np.ndarray:
    """Runs one MatMulNBits node over a [M, K] with w [N, K] quantized by our code."""
    n, k = w.shape
    codes, scales, zero_points = quantize(w, q)
    inits = [helper.make_tensor(name, dtype, arr.shape, arr.tobytes(), raw=True) for name, dtype, arr in (
        ("codes", TensorProto.UINT8, codes), ("scales", TensorProto.FLOAT, scales),
        ("zp", TensorProto.UINT8, zero_points))]
    node = helper.make_node("MatMulNBits", ["a", "codes", "scales", "zp"], ["y"], domain="com.microsoft",
                            K=k, N=n, bits=q.bits, block_size=q.block_size, accuracy_level=q.accuracy_level)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", TensorProto.FLOAT, ["m", k])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["m", n])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"a": a})[0]


@pytest.mark.parametrize("rounding", ["minmax", "lsq"])
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k,block", [(64, 32), (96, 32), (100, 32), (80, 16), (256, 128)])
def test_packing_matches_matmulnbits(bits, k, block, rounding):
    """96/32 has an odd block count (a half-filled zero-point byte in int4); 100 is not a multiple of 32."""
    rng = np.random.default_rng(bits * 1000 + k)
    w = rng.normal(size=(24, k)).astype(np.float32)
    w[3] = np.abs(w[3])                                 # a row with no negative values: zero point at 0
    w[5] = 0.0                                          # an all-zero row
    a = rng.normal(size=(5, k)).astype(np.float32)
    q = Quantization(bits, block, accuracy_level=0, rounding=rounding)
    w_deq = dequantize(*quantize(w, q), k, q)
    np.testing.assert_allclose(_matmul_nbits(a, w, q), a @ w_deq.T, atol=1e-4, rtol=1e-4)
    assert np.all(w_deq[5] == 0)
    if rounding == "minmax":                            # within half a step of its block (lsq may clip outliers)
        step = (np.maximum(w.max(), 0) - np.minimum(w.min(), 0)) / (2 ** bits - 1)
        assert np.abs(w - w_deq).max() <= step / 2 + 1e-6


def _block_errors(w, q, weighted):
    """[N, blocks] squared error of each block, weighted as the least-squares fit weighs it (or not)."""
    n, k = w.shape
    x = w.reshape(n, k // q.block_size, q.block_size)
    error = np.square(dequantize(*quantize(w, q), k, q).reshape(x.shape) - x)
    if weighted:
        error *= np.sqrt(np.square(x).mean(-1, keepdims=True)) + np.abs(x)
    return error.sum(-1)


@pytest.mark.filterwarnings("error")                    # an all-zero block once divided 0 by 0
@pytest.mark.parametrize("bits", [4, 8])
def test_least_squares_rounding_never_worse_than_minmax_per_block(bits):
    """Each block keeps the best fit it met, starting from min-max's: its weighted error can only fall; overall
    the plain error falls too, on weights shaped like a model's (heavy tails). On a real Q4_K layer the plain
    error fell 9% (experiments/int4_rounding.py)."""
    rng = np.random.default_rng(bits)
    w = (rng.standard_t(5, size=(64, 256)) * 0.02).astype(np.float32)
    w[7, :32] = 0.0                                     # an all-zero block
    w[9, 32:64] = 0.5                                   # one repeated value: no line to fit
    lsq, minmax = Quantization(bits, 32, rounding="lsq"), Quantization(bits, 32, rounding="minmax")
    assert np.all(_block_errors(w, lsq, True) <= _block_errors(w, minmax, True) * (1 + 1e-5) + 1e-12)
    # measured 0.94 / 0.92 (weighted) and 0.96 (plain) of min-max's at int4 / int8
    assert _block_errors(w, lsq, True).sum() < 0.96 * _block_errors(w, minmax, True).sum()
    assert _block_errors(w, lsq, False).sum() < 0.98 * _block_errors(w, minmax, False).sum()
    restored = dequantize(*quantize(w, lsq), 256, lsq)
    assert np.all(restored[7, :32] == 0)
    np.testing.assert_allclose(restored[9, 32:64], 0.5, rtol=1e-6)


@pytest.mark.parametrize("rounding", ["minmax", "lsq"])
def test_quantize_in_row_slices_equals_whole(monkeypatch, rounding):
    """quantize() runs slices of rows on several threads: the result must not depend on the slicing."""
    import specedge.export.quantize as quantize_module

    rng = np.random.default_rng(0)
    w = rng.normal(size=(70, 96)).astype(np.float32)
    q = Quantization(4, 32, rounding=rounding)
    whole = quantize(w, q)
    monkeypatch.setattr(quantize_module, "THREAD_ROWS", 16)
    for together, sliced in zip(whole, quantize(w, q)):
        np.testing.assert_array_equal(together, sliced)


@pytest.mark.parametrize("bits", [4, 8])
def test_accuracy_level_4_rows_do_not_depend_on_the_row_count_from_two_rows_on(bits):
    """What makes a quantized target's verify rows equal its single steps, which the runtime runs as two rows
    (ModelBackend.min_rows): a single row may take another kernel (int4 on an AVX2 EPYC does)."""
    rng = np.random.default_rng(bits)
    w = rng.normal(size=(40, 128)).astype(np.float32)
    a = rng.normal(size=(9, 128)).astype(np.float32)
    q = Quantization(bits, 32, accuracy_level=4)
    together = _matmul_nbits(a, w, q)
    for chunk in (2, 3, 4):
        parts = np.concatenate([_matmul_nbits(a[i:i + chunk], w, q) for i in range(0, 8, chunk)])
        np.testing.assert_array_equal(together[:len(parts)], parts)
    w_deq = dequantize(*quantize(w, q), 128, q)
    np.testing.assert_allclose(together, a @ w_deq.T, atol=0.05 * np.abs(a @ w_deq.T).max())


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("k", [64, 96, 80])
def test_gather_block_quantized_returns_our_dequantized_rows(bits, k):
    """The quantized embedding (StepGraph.embedding): onnxruntime expands our codes to exactly the rows the
    export check's reference gets; 96 has an odd block count, 80 a padded last block."""
    rng = np.random.default_rng(bits + k)
    table = rng.normal(size=(50, k)).astype(np.float32)
    q = Quantization(bits, 32)
    codes, scales, zero_points = quantize(table, q)
    arrays = [("data", TensorProto.UINT8, codes.reshape(50, -1)), ("scales", TensorProto.FLOAT, scales.reshape(50, -1)),
              ("zp", TensorProto.UINT8, zero_points.reshape(50, -1))]
    inits = [helper.make_tensor(name, dtype, arr.shape, arr.tobytes(), raw=True) for name, dtype, arr in arrays]
    node = helper.make_node("GatherBlockQuantized", ["data", "ids", "scales", "zp"], ["y"], domain="com.microsoft",
                            bits=bits, block_size=32, gather_axis=0, quantize_axis=1)
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, "t"])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    model.ir_version = 8
    ids = np.array([[3, 0, 49, 7, 3]], np.int64)
    rows = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(rows[0, :, :k], dequantize(codes, scales, zero_points, k, q)[ids[0]])


def test_a_drafts_default_block_is_the_coarsest_that_fits():
    assert fitting_block_size([896, 896, 4864]) == 128           # Qwen2.5 0.5B
    assert fitting_block_size([576, 576, 1536]) == 64            # SmolLM 135M: no padded blocks
    assert fitting_block_size([96, 96, 256]) == 32
    assert fitting_block_size([80, 80, 200]) == 32               # none fits: 32, the last block padded


def test_bad_quantization_options():
    assert parse_quantization("none", 32, 4) is None
    for args, message in [(("int3", 32, 4), "unknown quantization"), (("int4", 24, 4), "block-size"),
                          (("int4", 8, 4), "block-size"), (("int8", 32, 7), "accuracy-level"),
                          (("int4", 32, 4, "round"), "--rounding must be one of minmax, lsq")]:
        with pytest.raises(ExportError, match=message):
            parse_quantization(*args)


@pytest.fixture(scope="module")
def quantized_bundles(workdir):
    """The same qwen2 target and perturbed draft, exported several ways."""
    target = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    draft = tm.perturbed(target, seed=3, noise=0.01)
    tok = tm.byte_tokenizer()
    return {
        "int4-draft": _export(workdir, "q-int4-draft", target, draft, tok, draft_quantize="int4"),
        "int4-both": _export(workdir, "q-int4-both", target, draft, tok, quantize="int4"),
        "int8-acc0": _export(workdir, "q-int8-acc0", target, draft, tok, quantize="int8", accuracy_level=0,
                             quantize_embeddings=False),
        "int4-embed": _export(workdir, "q-int4-embed", target, draft, tok, quantize="int4", quantize_embeddings=True),
        "int4-lsq": _export(workdir, "q-int4-lsq", target, draft, tok, quantize="int4", rounding="lsq",
                            draft_block_size=32),
        "int8-embed-untied": _export(workdir, "q-int8-embed-untied", tm.make_model("llama", TARGET_ROWS, seed=1),
                                     tm.make_model("llama", TARGET_ROWS, seed=1), tok, draft_quantize="int8",
                                     accuracy_level=0, quantize_embeddings=True),
    }


def _manifest(bundle):
    return json.loads((bundle / "manifest.json").read_text())


def test_manifest_records_quantization_and_its_cost(quantized_bundles):
    models = _manifest(quantized_bundles["int4-draft"])["models"]
    assert models["target"]["weights"] == "float32" and "quantization" not in models["target"]
    assert "vs_source" not in models["target"]["export_check"]
    draft = models["draft"]
    assert draft["weights"] == "int4"
    # embeddings of a quantized model are quantized by default; an fp32 model keeps its table
    # a draft's blocks default to the coarsest of 128, 64, 32 dividing its matrices (64, 64, 128 wide here); the
    # target's to 32
    assert draft["quantization"] == {"scheme": "int4", "op": "com.microsoft.MatMulNBits", "bits": 4,
                                     "block_size": 64, "accuracy_level": 4, "rounding": "minmax", "embedding": True}
    both = _manifest(quantized_bundles["int4-both"])["models"]
    assert (both["target"]["quantization"]["block_size"], both["draft"]["quantization"]["block_size"]) == (32, 64)
    assert draft["embedding_bytes"] < 0.2 * 4 * TARGET_ROWS * 64 == 0.2 * models["target"]["embedding_bytes"]
    lsq = _manifest(quantized_bundles["int4-lsq"])["models"]
    assert all(m["quantization"]["rounding"] == "lsq" for m in lsq.values())
    assert lsq["draft"]["quantization"]["block_size"] == 32                      # draft_block_size given
    # a draft's default tolerance grows with the square root of its block (its numbers change only acceptance)
    for entry, factor in ((draft, 2 ** 0.5), (lsq["draft"], 1.0), (both["target"], 1.0)):
        check = entry["export_check"]
        assert check["tolerance"] == pytest.approx((1e-2 + 0.2 * check["max_abs_logit"]) * factor)
    opted_out = _manifest(quantized_bundles["int8-acc0"])["models"]      # quantize_embeddings=False
    assert all(m["quantization"]["embedding"] is False and m["embedding_bytes"] == 4 * TARGET_ROWS * 64
               for m in opted_out.values())
    # every graph has the same inputs: padding a lone token to two rows is the runtime's (backend.min_rows)
    for bundle in (quantized_bundles["int4-draft"], quantized_bundles["int4-both"]):
        for entry in _manifest(bundle)["models"].values():
            assert set(entry["io"]["inputs"]) == {"input_ids", "position_ids", "logit_rows"} | {
                name for layer in entry["io"]["kv"] for name in layer[:2]}
    cost = draft["export_check"]["vs_source"]
    assert cost["prompts"] >= 3 and cost["positions"] > 20
    assert 0.3 < cost["top1_agreement"] <= 1.0      # a tiny random model: flat logits and cost["max_abs_logit_error"] > 0
    # int4 weights take about a seventh of the fp32 weights' bytes in the quantized matrices
    fp32_target = models["target"]["weight_bytes"]
    assert draft["weight_bytes"] < 0.6 * fp32_target


def test_accuracy_level_0_matches_the_dequantized_model_tightly(quantized_bundles):
    for role, entry in _manifest(quantized_bundles["int8-acc0"])["models"].items():
        check = entry["export_check"]
        assert check["max_abs_logit_error"] < 1e-3, (role, check)
        assert "dequantized" in check["reference"]
        assert check["vs_source"]["top1_agreement"] > 0.9      # int8 barely moves the argmax


def test_quantized_target_rows_are_bitwise_equal(quantized_bundles):
    check = _manifest(quantized_bundles["int4-both"])["models"]["target"]["export_check"]
    assert check["verify_rows_bitwise_equal"] is True and check["min_rows"] in (1, 2)


def test_quantized_target_single_steps_as_one_or_two_rows(quantized_bundles):
    """min_rows 2 keeps a quantized target's rows exact on every CPU; the runtime takes 1 where that is
    exact too (the probe at load). Either way a single step returns its own token's row, not the copy's."""
    bundle = quantized_bundles["int4-both"]
    manifest = _manifest(bundle)
    backend = open_model(bundle, max_step=8, min_rows=2)
    cursor = SlotCursor(backend)
    assert backend.kv_slots == manifest["max_seq_len"] + 2
    ids = probe_ids(manifest["vocab_size"])
    assert verify_rows_bitwise_equal(cursor, ids)
    rows = {}
    for min_rows in (2, 1):
        backend.min_rows, cursor.pos = min_rows, 0
        cursor.feed(ids[:5])
        rows[min_rows] = np.concatenate([cursor.feed([t]).copy() for t in ids[5:8]])
    np.testing.assert_allclose(rows[1], rows[2], atol=1e-4)
    chosen = choose_min_rows(backend, manifest["vocab_size"])
    assert chosen in (1, 2) and backend.min_rows == chosen and verify_rows_bitwise_equal(SlotCursor(backend), ids)
    assert load(bundle).target_min_rows == chosen
    # the last slot: a padded single step at max_seq_len - 1 writes its copy into the headroom
    backend.min_rows, cursor.pos = 2, manifest["max_seq_len"] - 3
    cursor.feed(ids[:2])
    assert cursor.feed([ids[2]]).shape == (1, manifest["vocab_size"]) and cursor.pos == manifest["max_seq_len"]


def test_target_rows_can_be_forced(quantized_bundles, good_bundle):
    """auto is exact; 2 is exact everywhere; 1 is the one-row kernel, reported as exact only where the probe
    found it so. Any graph can be padded (the runtime pads), an fp32 target too."""
    bundle = quantized_bundles["int4-both"]
    auto = load(bundle)
    assert auto.target_steps_exact and auto.target.min_rows == auto.target_min_rows
    padded = load(bundle, target_rows=2)
    assert (padded.target_min_rows, padded.target.min_rows, padded.target_steps_exact) == (2, 2, True)
    one = load(bundle, target_rows=1)
    assert (one.target_min_rows, one.target.min_rows) == (1, 1)
    assert one.target_steps_exact == (auto.target_min_rows == 1)
    ids = probe_ids(one.vocab_size)
    assert verify_rows_bitwise_equal(SlotCursor(one.target), ids) == one.target_steps_exact
    prompt = ids[:6]
    texts = [g.generate_ids(prompt, max_new_tokens=12, ignore_eos=True, use_draft=False).tokens for g in (padded, one)]
    assert len(texts[0]) == len(texts[1]) == 12
    assert load(good_bundle, target_rows=1).target_min_rows == 1
    assert load(good_bundle, target_rows=2).target.min_rows == 2
    with pytest.raises(OptionError, match="'auto', 1 or 2"):
        load(bundle, target_rows=3)


@pytest.mark.parametrize("name", ["int4-embed", "int8-embed-untied"])
def test_quantized_embeddings(quantized_bundles, name):
    """Tied (qwen2, int4) and untied (llama, int8 draft at accuracy level 0) tables as GatherBlockQuantized:
    a fraction of the fp32 table, checked against the reference with the same dequantized table (within
    1e-3 at level 0: the reference really gets the quantized table), a target's verify rows still bitwise
    exact; an fp32 model in the same bundle keeps its fp32 table."""
    models = _manifest(quantized_bundles[name])["models"]
    fp32_table = 4 * TARGET_ROWS * 64
    for role, entry in models.items():
        if entry["weights"] == "float32":
            assert entry["embedding_bytes"] == fp32_table and "quantization" not in entry
            continue
        assert entry["quantization"]["embedding"] is True
        assert entry["embedding_bytes"] < (0.2 if entry["weights"] == "int4" else 0.35) * fp32_table
        check = entry["export_check"]
        assert check["max_abs_logit_error"] <= check["tolerance"]
        if entry["quantization"]["accuracy_level"] == 0:
            assert check["max_abs_logit_error"] < 1e-3
        assert check["verify_rows_bitwise_equal"] or role == "draft"       # only a target's single steps are padded
        assert check["vs_source"]["top1_agreement"] > 0.3
        graph = onnx.load(quantized_bundles[name] / entry["file"], load_external_data=False)
        assert {n.op_type for n in graph.graph.node} >= {"GatherBlockQuantized"}
        assert "Gather" not in {n.op_type for n in graph.graph.node}


def test_quantize_embeddings_needs_a_quantized_model(workdir):
    model = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    with pytest.raises(ExportError, match="--quantize-embeddings needs"):
        _export(workdir, "q-embed-fp32", model, None, tm.byte_tokenizer(), quantize_embeddings=True)
    assert not (workdir / "q-embed-fp32").exists()


@pytest.mark.parametrize("name", ["int4-draft", "int4-both", "int8-acc0", "int4-embed", "int8-embed-untied",
                                  "int4-lsq"])
@pytest.mark.parametrize("k", [2, 4, 8])
def test_quantized_greedy_equals_target_greedy(quantized_bundles, name, k):
    gen = load(quantized_bundles[name])
    for prompt in ("def fib(n):", "héllo wörld"):
        baseline = gen.generate(prompt, max_new_tokens=100, k=0, use_draft=False, ignore_eos=True)
        result = gen.generate(prompt, max_new_tokens=100, k=k, ignore_eos=True)
        assert result.tokens == baseline.tokens
        # accepted runs are exercised too (a tiny random int4 draft at its default block of 64: 0.23 at worst)
        assert result.stats.acceptance_per_position[0] > 0.2


def test_fp32_target_under_int4_draft_is_the_fp32_target(quantized_bundles, good_bundle):
    """The draft's precision cannot change the output: same tokens as the all-fp32 bundle's target."""
    reference = load(good_bundle).generate("def fib(n):", max_new_tokens=100, k=0, use_draft=False, ignore_eos=True)
    result = load(quantized_bundles["int4-draft"]).generate("def fib(n):", max_new_tokens=100, k=4, ignore_eos=True)
    assert result.tokens == reference.tokens


def test_logits_only_for_the_last_rows(quantized_bundles):
    bundle = quantized_bundles["int4-draft"]
    full, part = cursor_of(bundle), cursor_of(bundle)
    ids = list(range(10, 30))
    full.feed(ids[:7])
    part.feed(ids[:7], last=1)
    rows = full.feed(ids[7:13]).copy()
    np.testing.assert_array_equal(part.feed(ids[7:13], last=3), rows[-3:])
    # a chunked prefill returns the last row only
    chunked = cursor_of(bundle, max_step=4)
    last = chunked.feed(ids[:13], last=1)
    assert last.shape == (1, _manifest(bundle)["vocab_size"])
    np.testing.assert_allclose(last, rows[-1:], atol=1e-4)
