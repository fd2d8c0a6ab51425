"""Exported step graphs against transformers' own models, for every supported architecture."""

import json

import numpy as np
import pytest
import torch
import transformers

from conftest import ARCHS, DRAFT_ROWS, TARGET_ROWS
from specedge.runtime.step_model import StepModel


def _reference(folder, ids, vocab):
    model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, :, :vocab].numpy()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("role", ["target", "draft"])
def test_graph_matches_transformers(arch_bundles, workdir, arch, role):
    bundle = arch_bundles[arch]
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry, vocab = manifest["models"][role], manifest["vocab_size"]
    assert manifest["models"][role]["architecture"] == {
        "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM", "mistral": "MistralForCausalLM",
        "gpt2": "GPT2LMHeadModel"}[arch]
    assert entry["export_check"]["max_abs_logit_error"] < 1e-3
    rng = np.random.default_rng(7)
    ids = rng.integers(0, vocab, size=40).tolist()
    reference = _reference(workdir / f"{arch}-bad-{role}", ids, vocab)
    step = StepModel(bundle / entry["file"], entry, manifest["max_seq_len"], vocab, max_step=16)
    # prefill 16, then verify-sized and draft-sized steps into the partly filled buffer
    ours, at = [], 0
    for n in (16, 9, 1, 2, 5, 1, 6):
        ours.append(step.feed(ids[at:at + n]).copy())
        at += n
    np.testing.assert_allclose(np.concatenate(ours), reference, atol=1e-4, rtol=1e-4)


def test_rejected_slots_do_not_leak(arch_bundles):
    """Rewinding pos and writing other tokens gives the same logits as a clean run: stale K/V is masked."""
    bundle = arch_bundles["llama"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = manifest["models"]["target"]
    make = lambda: StepModel(bundle / entry["file"], entry, manifest["max_seq_len"], manifest["vocab_size"], 16)
    dirty, clean = make(), make()
    dirty.feed([1, 2, 3, 4])
    dirty.feed([50, 60, 70, 80, 90])        # a rejected draft run
    dirty.pos = 5                           # keep only token 50
    got = dirty.feed([11, 12]).copy()
    clean.feed([1, 2, 3, 4])
    clean.feed([50, 61, 71])                # 50 computed in a step of the same shape, other company
    clean.pos = 5
    np.testing.assert_array_equal(got, clean.feed([11, 12]))


@pytest.mark.parametrize("arch", ARCHS)
def test_multi_token_rows_equal_single_token_rows(arch_bundles, arch):
    """Exact greedy speculation rests on this: a verify row equals the one-token step's row, bit for bit."""
    bundle = arch_bundles[arch]
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = manifest["models"]["target"]
    make = lambda: StepModel(bundle / entry["file"], entry, manifest["max_seq_len"], manifest["vocab_size"], 16)
    batched, single = make(), make()
    batched.feed([3, 1, 4])
    single.feed([3, 1, 4])
    rows = batched.feed([1, 5, 9, 2, 6]).copy()
    singles = np.stack([single.feed([t])[0].copy() for t in (1, 5, 9, 2, 6)])
    np.testing.assert_array_equal(rows, singles)


def test_padded_rows_are_sliced(arch_bundles):
    manifest = json.loads((arch_bundles["qwen2"] / "manifest.json").read_text())
    assert manifest["vocab_size"] == TARGET_ROWS
    assert manifest["models"]["draft"]["spec"]["vocab_rows"] == DRAFT_ROWS
    assert manifest["models"]["draft"]["spec"]["vocab_size"] == TARGET_ROWS
