"""The two attention variants: gqa (GroupQueryAttention, one row a call) and standard (standard ONNX ops, any
batch); both write K/V in place into the runtime's buffers, and both are exact."""

import numpy as np
import onnx
import onnxruntime as ort
import pytest

import tiny_models as tm
from conftest import TARGET_ROWS, _export, cursor_of, manifest_of, open_model
from specedge.runtime import load
from specedge.runtime.backends.base import SlotCursor
from specedge.runtime.row_check import bundle_rows_bitwise_equal, choose_min_rows


def _bundle(arch_bundles, standard_bundles, variant, arch="qwen2"):
    return (arch_bundles if variant == "gqa" else standard_bundles)[arch]


def _rows_and_singles(bundle, min_rows=1):
    batched, single = cursor_of(bundle, min_rows=min_rows), cursor_of(bundle, min_rows=min_rows)
    batched.feed([3, 1, 4])
    single.feed([3, 1, 4])
    rows = batched.feed([1, 5, 9, 2, 6]).copy()
    return rows, np.stack([single.feed([t])[0].copy() for t in (1, 5, 9, 2, 6)])


def test_manifest_names_the_variant(arch_bundles, standard_bundles):
    gqa = manifest_of(arch_bundles["qwen2"])["models"]["target"]
    standard = manifest_of(standard_bundles["qwen2"])["models"]["target"]
    assert (gqa["graph_variant"], gqa["max_batch"]) == ("static-kv-gqa-v3", 1)
    assert (standard["graph_variant"], standard["max_batch"]) == ("static-kv-standard-v1", None)
    assert "batch_rows_bitwise_equal" not in gqa["export_check"]
    assert standard["export_check"]["batch_rows_bitwise_equal"] is True


@pytest.mark.parametrize("name", ["qwen2", "gpt2", "qwen2-int4"])
def test_standard_graphs_use_standard_ops(standard_bundles, name):
    """ai.onnx opset 24 only, apart from the quantized weights' ops; each present_* is TensorScatter's own output
    (an Identity in between would keep onnxruntime from writing in place)."""
    manifest = manifest_of(standard_bundles[name])
    for entry in manifest["models"].values():
        model = onnx.load(standard_bundles[name] / entry["file"], load_external_data=False)
        assert {(o.domain or "ai.onnx"): o.version for o in model.opset_import}.get("ai.onnx") == 24
        custom = {n.op_type for n in model.graph.node if n.domain not in ("", "ai.onnx")}
        assert custom <= {"MatMulNBits", "GatherBlockQuantized"} and bool(custom) == (entry["weights"] != "float32")
        producers = {out: n.op_type for n in model.graph.node for out in n.output}
        for _, _, present_k, present_v in entry["io"]["kv"]:
            assert producers[present_k] == producers[present_v] == "TensorScatter"


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_variants_agree(arch_bundles, standard_bundles, arch):
    """Same weights, both variants: the same logits to rounding, over prefill and multi-token steps."""
    ids = np.random.default_rng(3).integers(0, 256, size=30).tolist()
    outs = []
    for bundle in (arch_bundles[arch], standard_bundles[arch]):
        cursor, rows, at = cursor_of(bundle), [], 0
        for n in (9, 1, 5, 1, 2, 12):
            rows.append(cursor.feed(ids[at:at + n]).copy())
            at += n
        outs.append(np.concatenate(rows))
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_both_variants_write_the_runtime_buffers_in_place(arch_bundles, standard_bundles):
    """The session writes K/V into the backend's own arrays (present bound to past's memory): equal across the
    variants to rounding, and nothing written beyond the rows of the calls."""
    gqa, standard = open_model(arch_bundles["qwen2"]), open_model(standard_bundles["qwen2"])
    for backend in (gqa, standard):
        cursor = SlotCursor(backend)
        cursor.feed([7, 8, 9, 10])
        cursor.feed([11])
    for layer in (0, gqa.num_layers - 1):
        assert np.abs(standard.values[layer][:, :, :5]).max() > 0
        np.testing.assert_allclose(gqa.keys[layer][:, :, :5], standard.keys[layer][:, :, :5], atol=1e-5)
        np.testing.assert_allclose(gqa.values[layer][:, :, :5], standard.values[layer][:, :, :5], atol=1e-5)
        assert not standard.values[layer][:, :, 5:].any() and not standard.keys[layer][:, :, 5:].any()
        # gqa: slot 5 holds the last call's throwaway attention row; nothing beyond it is written
        assert not gqa.values[layer][:, :, 6:].any()


def test_tensor_scatter_runs_in_place(standard_bundles, capfd):
    """With present_key.{i} bound to the OrtValue of past_key.{i}, onnxruntime's TensorScatter writes only the new
    rows; bound to other memory it copies the whole buffer first and says so (what this test would see)."""
    manifest = manifest_of(standard_bundles["qwen2"])
    entry = manifest["models"]["target"]
    options = ort.SessionOptions()
    options.log_severity_level = 2
    session = ort.InferenceSession(str(standard_bundles["qwen2"] / entry["file"]), options,
                                   providers=["CPUExecutionProvider"])
    kv = entry["kv"]
    shape = (1, kv["num_kv_heads"], kv["slots"], kv["head_dim"])
    feeds = {"input_ids": np.array([[5, 6, 7]]), "position_ids": np.arange(3)[None], "logit_rows": np.array([[2]])}
    logits = {}
    for shared in (True, False):
        binding, keep = session.io_binding(), []
        for past_k, past_v, present_k, present_v in entry["io"]["kv"]:
            for past, present in ((past_k, present_k), (past_v, present_v)):
                buffer = ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
                other = buffer if shared else ort.OrtValue.ortvalue_from_numpy(np.zeros(shape, np.float32))
                keep += [buffer, other]
                binding.bind_ortvalue_input(past, buffer)
                binding.bind_ortvalue_output(present, other)
        for name, value in feeds.items():
            binding.bind_cpu_input(name, value)
        logits[shared] = np.zeros((1, 1, manifest["vocab_size"]), np.float32)
        binding.bind_ortvalue_output("logits", ort.OrtValue.ortvalue_from_numpy(logits[shared]))
        binding.bind_output("ids")
        capfd.readouterr()
        session.run_with_iobinding(binding)
        err = capfd.readouterr().err
        assert ("in-place optimization not activated" in err) == (not shared), err
        assert np.abs(logits[shared]).max() > 0
        written = keep[1].numpy()                       # layer 0's present_key
        assert np.abs(written[:, :, :3]).max() > 0 and not written[:, :, 3:].any()
        if shared:
            assert keep[0].data_ptr() == keep[1].data_ptr()
    np.testing.assert_array_equal(logits[True], logits[False])


@pytest.mark.parametrize("variant", ["gqa", "standard"])
@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
@pytest.mark.parametrize("min_rows", [1, 2])
def test_verify_rows_equal_single_steps_bitwise(arch_bundles, standard_bundles, variant, arch, min_rows):
    rows, singles = _rows_and_singles(_bundle(arch_bundles, standard_bundles, variant, arch), min_rows)
    np.testing.assert_array_equal(rows, singles)


def test_in_place_attention_needs_its_extra_row(workdir, monkeypatch):
    """Without the extra attention row, a lone GroupQueryAttention row differs in the last bits from the same row
    in a verify call: the extra row is what makes single rows (min_rows 1) exact; the runtime's two-row padding
    repairs it too, which is what the load-time probe then picks."""
    from specedge.export.step_graph import StepGraph

    monkeypatch.setattr(StepGraph, "PAD_ATTENTION_ROWS", False)
    bundle = _export(workdir, "qwen2-no-extra-row", tm.make_model("qwen2", TARGET_ROWS, seed=1), None,
                     tm.byte_tokenizer())
    rows, singles = _rows_and_singles(bundle, min_rows=1)
    assert not np.array_equal(rows, singles)
    assert np.abs(rows - singles).max() < 1e-4
    rows, singles = _rows_and_singles(bundle, min_rows=2)
    np.testing.assert_array_equal(rows, singles)
    # the check that `inspect --verify` runs where a bundle is used finds that two rows are needed
    assert bundle_rows_bitwise_equal(bundle, manifest_of(bundle)) == (True, 2)


@pytest.mark.parametrize("variant,arch", [("gqa", "llama"), ("standard", "qwen2"), ("standard", "gpt2")])
def test_single_token_at_position_zero(arch_bundles, standard_bundles, variant, arch):
    """A single first token gets the same row as in a longer first call."""
    bundle = _bundle(arch_bundles, standard_bundles, variant, arch)
    one = cursor_of(bundle).feed([42]).copy()
    two = cursor_of(bundle).feed([42, 43])[:1].copy()
    np.testing.assert_array_equal(one, two)


# per row: (prefix, tokens in the batched call, rows wanted): different starts, lengths and logit rows
BATCH = (([10, 11, 12, 13, 14], [20, 21, 22], 2), (list(range(30, 39)), [40], 1), ([50, 51], [60, 61, 62, 63], 4))


def _prefill(backend, rows):
    for slot, (prefix, _, _) in enumerate(rows):
        backend.run([0], [prefix], [1], lo=slot)


@pytest.mark.parametrize("name", ["qwen2", "gpt2", "qwen2-int4"])
@pytest.mark.parametrize("min_rows", ["probe", 2])
def test_batch_rows_equal_rows_alone(standard_bundles, name, min_rows):
    """B = 3 rows at different positions with different lengths and logit rows in one call: each row's logits and
    ids are bitwise those of the row run alone; a dummy row (no tokens) among them changes nothing. A lone token
    runs as the runtime's probe decides (int4 on CPUs whose one-row MatMulNBits kernel differs: two rows) or as
    two rows."""
    backend = open_model(standard_bundles[name], max_batch=3)
    if min_rows == "probe":
        choose_min_rows(backend, TARGET_ROWS)
    else:
        backend.min_rows = min_rows
    starts = [len(prefix) for prefix, _, _ in BATCH]
    _prefill(backend, BATCH)
    together = [x.copy() for x in backend.run(starts, [t for _, t, _ in BATCH], [w for *_, w in BATCH])]
    ids = [x.copy() for x in backend.run(starts, [t for _, t, _ in BATCH], [w for *_, w in BATCH], want="ids")]
    alone = [backend.run([start], [tokens], [want], lo=slot)[0].copy()
             for slot, (start, (_, tokens, want)) in enumerate(zip(starts, BATCH))]
    for row, (_, tokens, want) in enumerate(BATCH):
        assert together[row].shape == (want, manifest_of(standard_bundles[name])["vocab_size"])
        np.testing.assert_array_equal(together[row], alone[row])
        np.testing.assert_array_equal(ids[row], together[row].argmax(-1))
    dummy = backend.run(starts, [BATCH[0][1], [], BATCH[2][1]], [BATCH[0][2], 0, BATCH[2][2]])
    assert dummy[1].shape[0] == 0
    np.testing.assert_array_equal(dummy[0], alone[0])
    np.testing.assert_array_equal(dummy[2], alone[2])


def test_batch_of_one_sequence_in_any_slot(standard_bundles):
    """Slot 2 of a three-slot backend runs a sequence exactly as slot 0 of a one-slot backend does."""
    bundle = standard_bundles["qwen2"]
    wide, narrow = SlotCursor(open_model(bundle, max_batch=3), slot=2), cursor_of(bundle)
    for chunk in ([1, 2, 3, 4, 5], [6], [7, 8, 9]):
        np.testing.assert_array_equal(wide.feed(chunk), narrow.feed(chunk))


@pytest.mark.parametrize("variant", ["gqa", "standard"])
def test_ids_output_is_the_argmax(arch_bundles, standard_bundles, variant):
    bundle = _bundle(arch_bundles, standard_bundles, variant)
    cursor = cursor_of(bundle)
    tokens = np.random.default_rng(4).integers(0, 256, size=12).tolist()
    logits = cursor.feed(tokens).copy()
    cursor.pos = 0
    np.testing.assert_array_equal(cursor.feed_ids(tokens), logits.argmax(-1))
    cursor.pos = 0
    np.testing.assert_array_equal(cursor.feed_ids(tokens, last=3), logits[-3:].argmax(-1))


def test_unknown_attention_variant_is_refused(tmp_path):
    from specedge.errors import ExportError
    from specedge.export import export_bundle

    with pytest.raises(ExportError, match="--attention must be one of gqa, standard, got 'scatter'"):
        export_bundle("unused", None, tmp_path / "b", attention="scatter", progress=None)
    assert not (tmp_path / "b").exists()


@pytest.mark.parametrize("min_rows", [1, 2])
def test_gqa_buffers_have_headroom_and_fill_to_max_seq_len(arch_bundles, min_rows):
    """gqa v3: buffers hold max_seq_len + 2 slots (a runtime pad row and the graph's throwaway row after a call
    ending at the last position); a model fed to exactly max_seq_len gives the rows of the same tokens fed one
    by one."""
    manifest = manifest_of(arch_bundles["qwen2"])
    size = manifest["max_seq_len"]
    assert manifest["models"]["target"]["kv"]["slots"] == size + 2
    ids = np.random.default_rng(5).integers(0, 256, size=size).tolist()
    chunked, single = cursor_of(arch_bundles["qwen2"], min_rows=min_rows), cursor_of(arch_bundles["qwen2"],
                                                                                      min_rows=min_rows)
    assert chunked.backend.keys[0].shape[2] == size + 2
    chunked.feed(ids[:-3])
    single.feed(ids[:-3])
    rows = chunked.feed(ids[-3:]).copy()
    singles = np.stack([single.feed([t])[0].copy() for t in ids[-3:]])
    np.testing.assert_array_equal(rows, singles)
    assert chunked.pos == single.pos == size
    with pytest.raises(ValueError, match="exceed max_seq_len"):
        chunked.feed([1])


def test_standard_buffers_have_headroom_for_padded_rows(standard_bundles):
    """standard: max_seq_len + max_draft + 2 slots. A row at the last position, right-padded to a verify row of
    max_draft + 1 tokens in the same call, and a dummy row at a full row's committed length, both fit; the real
    rows equal the same rows alone."""
    bundle = standard_bundles["qwen2"]
    manifest = manifest_of(bundle)
    size, k = manifest["max_seq_len"], manifest["max_draft"]
    assert manifest["models"]["target"]["kv"]["slots"] == size + k + 2
    backend = open_model(bundle, max_step=64, max_batch=3)
    ids = np.random.default_rng(6).integers(0, 256, size=size).tolist()
    SlotCursor(backend, slot=0).feed(ids[:-1])
    SlotCursor(backend, slot=1).feed(ids[:40])
    SlotCursor(backend, slot=2).feed(ids)
    out = backend.run([size - 1, 40, size], [[ids[-1]], ids[40:41 + k], []], [1, k + 1, 0])
    last, rows = out[0].copy(), out[1].copy()
    np.testing.assert_array_equal(last, backend.run([size - 1], [[ids[-1]]], [1])[0])
    np.testing.assert_array_equal(rows, backend.run([40], [ids[40:41 + k]], [k + 1], lo=1)[0])


@pytest.mark.parametrize("k", [1, 4])
def test_standard_bundles_keep_greedy_exact(standard_bundles, k):
    gen = load(standard_bundles["qwen2"])
    baseline = gen.generate("def f(x):", max_new_tokens=60, k=0, use_draft=False, ignore_eos=True)
    result = gen.generate("def f(x):", max_new_tokens=60, k=k, ignore_eos=True)
    assert result.tokens == baseline.tokens and result.stats.n_verify > 0
