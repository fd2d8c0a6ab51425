"""A lighter draft head (--draft-vocab N): the draft proposes from the N most frequent tokens; output stays exact."""

import json
from collections import Counter

import numpy as np
import pytest
import torch

import test_sampling_lossless as lossless
import tiny_models as tm
from conftest import TARGET_ROWS, _export, cursor_of
from specedge.cli import main
from specedge.errors import ExportError
from specedge.export.draft_vocab import choose_subset, corpus_texts, coverage
from specedge.runtime import load

CORPUS = "def add(a, b):\n    return a + b\n\nfor i in range(10):\n    print(add(i, i))\n" * 20


@pytest.fixture(scope="module")
def pair(workdir):
    """The same good pair exported twice: full draft head, and a 48-token head counted on CORPUS."""
    corpus = workdir / "corpus.txt"
    corpus.write_text(CORPUS)
    target = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    draft = tm.perturbed(target, seed=3, noise=0.01)
    tok = tm.byte_tokenizer()
    return (_export(workdir, "vocab-full", target, draft, tok),
            _export(workdir, "vocab-48", target, draft, tok, draft_vocab=48, draft_vocab_from=str(corpus)))


def test_choose_subset_takes_the_most_frequent():
    counts = Counter({5: 10, 9: 7, 2: 7, 40: 1})
    assert choose_subset(counts, 3, 50, always=[49]).tolist() == [2, 5, 49]        # eos first, then 10, then 7 (tie: id)
    assert choose_subset(counts, 6, 50, always=[]).tolist() == [0, 1, 2, 5, 9, 40]  # unseen fill in id order
    assert coverage(counts, np.array([5, 9])) == pytest.approx(17 / 25)
    with pytest.raises(ExportError, match="between 1 and the vocabulary size 50"):
        choose_subset(counts, 51, 50, always=[])


def test_corpus_texts_reads_files_jsonl_and_folders(tmp_path):
    (tmp_path / "a.py").write_text("x = 1\n")
    (tmp_path / "skip.bin").write_bytes(b"\x00\x01")
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\nnot json\n{"text": "world"}\n')
    assert sorted(corpus_texts(tmp_path)) == ["hello", "world", "x = 1\n"]
    assert corpus_texts(tmp_path / "a.py") == ["x = 1\n"]
    with pytest.raises(ExportError, match="no such file"):
        corpus_texts(tmp_path / "missing")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ExportError, match="no text found"):
        corpus_texts(tmp_path / "empty.txt")


def test_manifest_and_head_columns(pair):
    full, light = pair
    manifest = json.loads((light / "manifest.json").read_text())
    draft = manifest["models"]["draft"]
    ids = json.loads((light / "draft_vocab.json").read_text())
    assert draft["logit_rows"] == 48 == len(ids) == draft["vocab_subset"]["size"]
    assert "draft_vocab.json" in manifest["files"] and ids == sorted(ids)
    assert manifest["eos_token_ids"][0] in ids
    used = set(tm.byte_tokenizer().encode(CORPUS, add_special_tokens=False))
    assert used <= set(ids) and draft["vocab_subset"]["corpus_coverage"] == 1.0
    assert draft["export_check"]["vs_source"]["positions"] > 0
    assert "logit_rows" not in manifest["models"]["target"]
    # the light head's logits are the full head's at those columns
    tokens = tm.byte_tokenizer().encode("def f(a):", add_special_tokens=False)
    logits = cursor_of(light, "draft").feed(tokens).copy()
    assert logits.shape == (len(tokens), 48)
    np.testing.assert_allclose(logits, cursor_of(full, "draft").feed(tokens)[:, ids], atol=1e-5)
    # its ids output names tokens, not columns: the token id of each row's best column
    np.testing.assert_array_equal(cursor_of(light, "draft").feed_ids(tokens), np.asarray(ids)[logits.argmax(-1)])


@pytest.mark.parametrize("k", [2, 4, 8])
def test_greedy_stays_exact_and_drafts_stay_in_the_head(pair, k):
    gen = load(pair[1])
    ids = set(json.loads((pair[1] / "draft_vocab.json").read_text()))
    for prompt in ("def add(a, b):", "héllo ✓"):
        baseline = gen.generate(prompt, max_new_tokens=60, k=0, use_draft=False, ignore_eos=True)
        result = gen.generate(prompt, max_new_tokens=60, k=k, ignore_eos=True)
        assert result.tokens == baseline.tokens and result.stats.n_verify > 0
        assert {draft for (_, draft, _) in result.stats.rejections} <= ids


def test_inspect_shows_the_head(pair, capsys):
    assert main(["inspect", str(pair[1])]) == 0
    assert "LM head: 48 of" in capsys.readouterr().out


def test_sampling_stays_lossless_with_a_subset_head(workdir):
    """The 12-token distribution test with a draft that can propose only 7 of the 12 tokens."""
    n = 12
    target = tm.make_model("qwen2", n, seed=5, init_scale=0.5)
    corpus = workdir / "words.txt"
    corpus.write_text(" ".join(f"w{i}" for i in (0, 1, 2, 3, 4, 5, 0, 1)))
    bundle = _export(workdir, "words-48", target, tm.perturbed(target, seed=6, noise=0.04), tm.word_tokenizer(n),
                     max_seq_len=32, max_draft=4, draft_vocab=7, draft_vocab_from=str(corpus))
    gen = load(bundle)
    assert gen.draft_head_ids.tolist() == [0, 1, 2, 3, 4, 5, 11]
    joint = lossless._exact_joint(gen)
    assert lossless._pvalue(lossless._samples(gen, k=3), joint) > 1e-3
    r = gen.generate_ids(lossless.PROMPT, max_new_tokens=30, seed=1, k=3, ignore_eos=True, **lossless.WARP)
    assert 0.1 < r.stats.n_accepted / r.stats.n_drafted < 0.95


def test_draft_vocab_needs_a_corpus_and_a_draft(tmp_path, capsys):
    code = main(["export", "--target", "t", "--draft", "d", "--out", str(tmp_path / "b"), "--draft-vocab", "100"])
    assert code != 0 and "--draft-vocab needs --draft-vocab-from" in capsys.readouterr().err
    code = main(["export", "--target", "t", "--draft", "none", "--out", str(tmp_path / "b"), "--draft-vocab", "100",
                 "--draft-vocab-from", str(tmp_path)])
    assert code != 0 and "--draft-vocab needs a draft model" in capsys.readouterr().err
    assert not (tmp_path / "b").exists()


def test_a_quantized_draft_with_a_lighter_head(workdir):
    """int4 draft and a 48-token head together: the export check dequantizes only the head's rows, and
    greedy output stays the target's."""
    corpus = workdir / "corpus-q.txt"
    corpus.write_text(CORPUS)
    target = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    bundle = _export(workdir, "vocab-48-int4", target, tm.perturbed(target, seed=3, noise=0.01), tm.byte_tokenizer(),
                     draft_quantize="int4", draft_vocab=48, draft_vocab_from=str(corpus))
    draft = json.loads((bundle / "manifest.json").read_text())["models"]["draft"]
    assert draft["weights"] == "int4" and draft["logit_rows"] == 48
    assert draft["export_check"]["max_abs_logit_error"] <= draft["export_check"]["tolerance"]
    gen = load(bundle)
    baseline = gen.generate("def add(a, b):", max_new_tokens=40, k=0, use_draft=False, ignore_eos=True)
    result = gen.generate("def add(a, b):", max_new_tokens=40, k=4, ignore_eos=True)
    assert result.tokens == baseline.tokens and result.stats.n_verify > 0


def test_ids_take_the_first_column_on_ties(workdir):
    """A head of zeros ties every column: ids is the first one, as numpy's argmax says (onnx ArgMax with
    select_last_index 0), for the full head (token 0) and for a lighter head (its first token id)."""
    corpus = workdir / "corpus-ties.txt"
    corpus.write_text("zzz yyy")
    model = tm.make_model("llama", TARGET_ROWS, seed=1)
    with torch.no_grad():
        model.lm_head.weight.zero_()
    tok = tm.byte_tokenizer()
    bundle = _export(workdir, "zero-head", model, model, tok, draft_vocab=4, draft_vocab_from=str(corpus))
    head = json.loads((bundle / "draft_vocab.json").read_text())
    assert head[0] > 0
    tokens = tok.encode("zzz a", add_special_tokens=False)
    for role, first in (("target", 0), ("draft", head[0])):
        cursor = cursor_of(bundle, role)
        assert not cursor.feed(tokens).any()
        cursor.pos = 0
        assert cursor.feed_ids(tokens).tolist() == [first] * len(tokens)
