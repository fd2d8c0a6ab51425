"""The two attention variants: in place (GroupQueryAttention, the default) and scatter; both exact."""

import json

import numpy as np
import pytest

import tiny_models as tm
from conftest import TARGET_ROWS, _export
from specedge.runtime import load
from specedge.runtime.row_check import bundle_rows_bitwise_equal
from specedge.runtime.step_model import StepModel


@pytest.fixture(scope="module")
def scatter_bundles(workdir):
    tok = tm.byte_tokenizer()
    return {arch: _export(workdir, f"{arch}-scatter", tm.make_model(arch, TARGET_ROWS, seed=1),
                          tm.make_model(arch, TARGET_ROWS, seed=2), tok, attention="scatter")
            for arch in ("qwen2", "gpt2")}


def _step(bundle, role="target"):
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = manifest["models"][role]
    return StepModel(bundle / entry["file"], entry, manifest["max_seq_len"], manifest["vocab_size"], 16)


def _rows_and_singles(bundle):
    batched, single = _step(bundle), _step(bundle)
    batched.feed([3, 1, 4])
    single.feed([3, 1, 4])
    rows = batched.feed([1, 5, 9, 2, 6]).copy()
    return rows, np.stack([single.feed([t])[0].copy() for t in (1, 5, 9, 2, 6)])


def test_manifest_names_the_variant(arch_bundles, scatter_bundles):
    gqa = json.loads((arch_bundles["qwen2"] / "manifest.json").read_text())["models"]["target"]
    scatter = json.loads((scatter_bundles["qwen2"] / "manifest.json").read_text())["models"]["target"]
    assert gqa["graph_variant"] == "static-kv-gqa-v2" and scatter["graph_variant"] == "static-kv-scatter-v2"
    assert "present_key.0" in gqa["io"]["outputs"] and "key.0" in scatter["io"]["outputs"]
    assert _step(arch_bundles["qwen2"]).in_place and not _step(scatter_bundles["qwen2"]).in_place


@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_variants_agree(arch_bundles, scatter_bundles, arch):
    """Same weights, both variants: the same logits to rounding, over prefill and multi-token steps."""
    ids = np.random.default_rng(3).integers(0, 256, size=30).tolist()
    outs = []
    for bundle in (arch_bundles[arch], scatter_bundles[arch]):
        step, rows, at = _step(bundle), [], 0
        for n in (9, 1, 5, 1, 2, 12):
            rows.append(step.feed(ids[at:at + n]).copy())
            at += n
        outs.append(np.concatenate(rows))
    np.testing.assert_allclose(outs[0], outs[1], atol=1e-5, rtol=1e-5)


def test_in_place_graph_writes_the_buffers_itself(arch_bundles, scatter_bundles):
    """gqa: the session writes K/V into the runtime's buffers (no copy by the runtime); equal to what the
    scatter runtime copies in."""
    gqa, scatter = _step(arch_bundles["qwen2"]), _step(scatter_bundles["qwen2"])
    for step in (gqa, scatter):
        step.feed([7, 8, 9, 10])
        step.feed([11])
    for layer in (0, gqa.num_layers - 1):
        assert np.abs(gqa.values[layer][:, :, :5]).max() > 0
        np.testing.assert_allclose(gqa.keys[layer][:, :, :5], scatter.keys[layer][:, :, :5], atol=1e-5)
        np.testing.assert_allclose(gqa.values[layer][:, :, :5], scatter.values[layer][:, :, :5], atol=1e-5)
        # slot 5 holds the last call's throwaway attention row; nothing beyond it is written
        assert not gqa.values[layer][:, :, 6:].any()


@pytest.mark.parametrize("variant", ["gqa", "scatter"])
def test_verify_rows_equal_single_steps_bitwise(arch_bundles, scatter_bundles, variant):
    bundle = (arch_bundles if variant == "gqa" else scatter_bundles)["gpt2"]
    rows, singles = _rows_and_singles(bundle)
    np.testing.assert_array_equal(rows, singles)


def test_in_place_attention_needs_its_extra_row(workdir, monkeypatch):
    """Without the extra attention row, a one-token GroupQueryAttention row differs in the last bits from
    the same row in a verify call: the extra row is what makes the bitwise test above pass."""
    from specedge.export.step_graph import StepGraph

    monkeypatch.setattr(StepGraph, "PAD_ATTENTION_ROWS", False)
    bundle = _export(workdir, "qwen2-no-extra-row", tm.make_model("qwen2", TARGET_ROWS, seed=1), None,
                     tm.byte_tokenizer())
    rows, singles = _rows_and_singles(bundle)
    assert not np.array_equal(rows, singles)
    assert np.abs(rows - singles).max() < 1e-4
    # and the check that `inspect --verify` runs where a bundle is used catches it
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert bundle_rows_bitwise_equal(bundle, manifest) == (False, 1)


def test_single_token_at_position_zero(arch_bundles):
    """A single first token gets the same row as in a longer first call (the extra row goes after it)."""
    one = _step(arch_bundles["llama"]).feed([42]).copy()
    two = _step(arch_bundles["llama"]).feed([42, 43])[:1].copy()
    np.testing.assert_array_equal(one, two)


@pytest.mark.parametrize("k", [1, 4, 8])
def test_scatter_bundles_keep_greedy_exact(scatter_bundles, k):
    gen = load(scatter_bundles["qwen2"])
    baseline = gen.generate("def f(x):", max_new_tokens=60, k=0, use_draft=False, ignore_eos=True)
    result = gen.generate("def f(x):", max_new_tokens=60, k=k, ignore_eos=True)
    assert result.tokens == baseline.tokens and result.stats.n_verify > 0


def test_unknown_attention_variant_is_refused(tmp_path):
    from specedge.errors import ExportError
    from specedge.export import export_bundle

    with pytest.raises(ExportError, match="--attention must be one of gqa, scatter"):
        export_bundle("unused", None, tmp_path / "b", attention="flash", progress=None)
    assert not (tmp_path / "b").exists()


def test_in_place_buffers_have_a_headroom_slot_and_fill_to_max_seq_len(arch_bundles):
    """gqa v2: buffers hold max_seq_len + 1 slots (the throwaway row of a call ending at the last position
    goes into the extra one); a model fed to exactly max_seq_len gives the rows a scatter-free reference
    gives: the same tokens fed in one chunk and then one by one."""
    manifest = json.loads((arch_bundles["qwen2"] / "manifest.json").read_text())
    size = manifest["max_seq_len"]
    assert manifest["models"]["target"]["kv"]["slots"] == size + 1
    ids = np.random.default_rng(5).integers(0, 256, size=size).tolist()
    chunked, single = _step(arch_bundles["qwen2"]), _step(arch_bundles["qwen2"])
    assert chunked.keys[0].shape[2] == size + 1
    chunked.feed(ids[:-3])
    single.feed(ids[:-3])
    rows = chunked.feed(ids[-3:]).copy()
    singles = np.stack([single.feed([t])[0].copy() for t in ids[-3:]])
    np.testing.assert_array_equal(rows, singles)
    assert chunked.pos == single.pos == size
    with pytest.raises(ValueError, match="exceed max_seq_len"):
        chunked.feed([1])
