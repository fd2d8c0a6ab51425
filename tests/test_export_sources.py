"""Source folders a real user may have that the exporter used to mishandle (an audit with tiny models): a
checkpoint lacking a tensor, corrupt weights, a head size GroupQueryAttention cannot run, chat templates with
transformers' extensions or that do not render, end-of-turn tokens added to the eos ids."""

import json
import shutil

import numpy as np

import pytest
from safetensors.torch import load_file, save_file

import tiny_models as tm
from specedge.errors import ExportError
from specedge.export import export_bundle
from specedge.runtime import load


def _export(src, out, **kw):
    lines = []
    try:
        export_bundle(str(src), None, out, max_seq_len=64, max_draft=4, progress=lines.append, **kw)
    finally:
        leftovers = [p.name for p in out.parent.iterdir() if p.name.startswith(f".{out.name}.export-")]
        assert not leftovers
    return lines


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    root = tmp_path_factory.mktemp("sources")
    return tm.save(tm.make_model("llama", 260, seed=1), tm.byte_tokenizer(chat=True), root / "llama")


def _copy(source, tmp_path, name):
    import shutil
    dst = tmp_path / name
    shutil.copytree(source, dst)
    return dst


def test_a_checkpoint_lacking_a_tensor_is_refused_not_filled_with_random_values(source, tmp_path):
    """transformers fills a missing tensor at random and logs it; the check then compared the graph with that
    same random model and passed."""
    src = _copy(source, tmp_path, "missing")
    weights = load_file(src / "model.safetensors")
    weights.pop("model.layers.1.mlp.down_proj.weight")
    save_file(weights, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ExportError, match=r"lacks \(or has the wrong shape for\) model.layers.1.mlp.down_proj.weight"):
        _export(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_what_appears_at_out_during_an_export_is_not_replaced(source, tmp_path):
    """--out is checked again before the bundle moves in: a folder made there meanwhile is kept, and so is a bundle
    written there meanwhile unless --force."""
    out = tmp_path / "out"

    def make_folder(line):
        if line.endswith("hashing files"):
            out.mkdir()
            (out / "precious.txt").write_text("mine")

    with pytest.raises(ExportError, match="exists and is not a bundle"):
        export_bundle(str(source), None, out, max_seq_len=64, max_draft=4, progress=make_folder)
    assert (out / "precious.txt").read_text() == "mine"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.export-")]


def test_force_replaces_a_bundle_and_an_empty_folder_is_taken(source, tmp_path):
    out = tmp_path / "out"
    out.mkdir()                                                             # empty: taken without --force
    _export(source, out)
    assert json.loads((out / "manifest.json").read_text())["max_seq_len"] == 64
    export_bundle(str(source), None, out, max_seq_len=96, max_draft=4, force=True, progress=None)
    assert json.loads((out / "manifest.json").read_text())["max_seq_len"] == 96
    assert [p.name for p in tmp_path.iterdir()] == ["out"]                  # nothing aside or discarded left


def test_an_export_killed_midway_is_cleaned_up_by_the_next(source, tmp_path):
    """SIGKILL or the out-of-memory killer leave the work folder (and, while replacing, the old bundle moved
    aside): the next export to the same --out removes the first and puts the second back."""
    import subprocess
    import sys

    from specedge.export.pipeline import _owner

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    host, pid = _owner().rsplit("-", 1)[0], int(dead.stdout)                 # a process here that has ended
    kept = [tmp_path / f".out.export-elsewhere-{pid}-abc",                  # another host's: its pid means nothing
            tmp_path / f".o[u]t.export-{host}-{pid}-abc"]                    # another --out's (o[u]t is no pattern)
    for folder in [tmp_path / f".out.export-{host}-{pid}-abc", *kept]:
        folder.mkdir()
        (folder / "target.onnx.data").write_bytes(b"x" * 1000)
    export_bundle(str(source), None, tmp_path / "out", max_seq_len=64, max_draft=4, progress=None)
    assert (tmp_path / "out" / "manifest.json").exists()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == sorted(p.name for p in kept)
    for folder in kept:
        shutil.rmtree(folder)
    (tmp_path / "out").rename(tmp_path / f".out.export-{host}-{pid}-replaced")   # killed between the two renames
    lines = _export(source, tmp_path / "other")
    assert not (tmp_path / "out").exists()                                   # another --out: not touched
    with pytest.raises(ExportError, match="already holds a bundle"):          # put back first, then refused at once
        export_bundle(str(source), None, tmp_path / "out", max_seq_len=64, max_draft=4, progress=lines.append)
    assert (tmp_path / "out" / "manifest.json").exists() and any("put back out" in line for line in lines)
    assert not any("writing step graph" in line for line in lines[-3:])


def test_sigterm_ends_an_export_leaving_nothing(source, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    proc = subprocess.Popen([sys.executable, "-m", "specedge.cli", "export", "--target", str(source), "--draft",
                             str(source), "--out", str(tmp_path / "out"), "--max-seq-len", "64"],
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stderr:                                   # mid-export: its work folder exists
        if "writing step graph" in line:
            break
    assert [p for p in tmp_path.iterdir() if p.name.startswith(".out.export-")]
    proc.send_signal(signal.SIGTERM)
    proc.stderr.read()
    assert proc.wait(60) == 128 + signal.SIGTERM
    time.sleep(0.1)
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_with_more_layers_than_its_config_is_refused_not_cut_down(source, tmp_path):
    """A config of 1 layer over 2 layers' weights: transformers loads the first and logs the rest as unexpected; the
    bundle would be a cut-down model that passes its own check."""
    src = _copy(source, tmp_path, "more-layers")
    config = json.loads((src / "config.json").read_text())
    (src / "config.json").write_text(json.dumps({**config, "num_hidden_layers": 1}))
    with pytest.raises(ExportError, match=r"the checkpoint holds model\.layers\.1\..* which the model config\.json "
                                          r"describes has no place for"):
        _export(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_folder_without_tokenizer_files_is_refused(tmp_path):
    """For a Qwen2 config transformers builds a one-token tokenizer from config.json alone; its bundle could not
    encode a prompt."""
    src = tm.save(tm.make_model("qwen2", 260, seed=1), tm.byte_tokenizer(chat=True), tmp_path / "no-tokenizer")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (src / name).unlink(missing_ok=True)
    with pytest.raises(ExportError, match=r"tokenizer has \d+ tokens for 260 embedding rows; is the folder missing "
                                          r"its tokenizer files"):
        _export(src, tmp_path / "out")


@pytest.mark.parametrize("damage", ["garbage", "wrong shape"])
def test_corrupt_weights_are_one_clear_error(source, tmp_path, damage):
    src = _copy(source, tmp_path, "corrupt")
    if damage == "garbage":
        (src / "model.safetensors").write_bytes(b"\x00" * 100)
    else:
        weights = load_file(src / "model.safetensors")
        weights["model.norm.weight"] = weights["model.norm.weight"][:32].clone()
        save_file(weights, src / "model.safetensors", metadata={"format": "pt"})
    says = "cannot load weights of" if damage == "garbage" else "shape is not the one config.json describes"
    with pytest.raises(ExportError, match=says):
        _export(src, tmp_path / "out")


def test_a_head_size_gqa_cannot_run_says_to_use_standard_before_loading(tmp_path):
    config = tm.make_config("llama", 260)
    config.hidden_size, config.num_attention_heads, config.num_key_value_heads = 48, 4, 2     # head_dim 12
    config.head_dim = 12
    model = transformers_model(config)
    src = tm.save(model, tm.byte_tokenizer(), tmp_path / "hd12")
    with pytest.raises(ExportError, match="head_dim 12 is not a multiple of 8.*--attention standard"):
        _export(src, tmp_path / "out")
    _export(src, tmp_path / "std", attention="standard")
    assert load(tmp_path / "std").generate("ab", max_new_tokens=4, ignore_eos=True).stats.new_tokens == 4


def transformers_model(config):
    import torch
    import transformers

    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


def test_chat_templates_with_transformers_extensions_render_and_broken_ones_are_left_out(source, tmp_path):
    marked = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% generation %}{{ m['content'] }}"
              "{% endgeneration %}{% else %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endif %}"
              "{% endfor %}<|im_start|>assistant\n{{ strftime_now('%Y') and '' }}")
    for name, template, kept in (("marked", marked, True), ("broken", "{% frobnicate %}x", False)):
        src = _copy(source, tmp_path, name)
        config = json.loads((src / "tokenizer_config.json").read_text())
        config["chat_template"] = template
        (src / "tokenizer_config.json").write_text(json.dumps(config))
        (src / "chat_template.jinja").unlink(missing_ok=True)
        lines = _export(src, tmp_path / f"out-{name}")
        gen = load(tmp_path / f"out-{name}")
        assert (gen.chat_template is not None) is kept
        if kept:
            assert gen.generate("hi", chat=True, max_new_tokens=2, ignore_eos=True).prompt_tokens > 2
        else:
            assert any("bundle is written without a chat template" in line for line in lines), lines


def test_end_of_turn_tokens_added_to_the_eos_ids_are_said(source, tmp_path):
    lines = _export(source, tmp_path / "out")
    eos = json.loads((tmp_path / "out" / "manifest.json").read_text())["eos_token_ids"]
    said = [line for line in lines if "also stops at" in line]
    assert len(said) == 1 and "<|im_end|>" in said[0] and len(eos) >= 2


def test_generation_ends_at_the_target_s_eos_ids_not_the_draft_s(source, tmp_path):
    """A draft whose config ends at another id (90, "Z" here) does not make the target stop there: the output is
    the target's own, as exported alone."""
    draft = _copy(source, tmp_path, "draft")
    for name in ("config.json", "generation_config.json"):
        config = json.loads((draft / name).read_text())
        (draft / name).write_text(json.dumps({**config, "eos_token_id": 90}))
    lines = []
    export_bundle(str(source), str(draft), tmp_path / "pair", max_seq_len=64, max_draft=4, progress=lines.append)
    _export(source, tmp_path / "alone")
    alone = json.loads((tmp_path / "alone" / "manifest.json").read_text())["eos_token_ids"]
    assert json.loads((tmp_path / "pair" / "manifest.json").read_text())["eos_token_ids"] == alone
    assert 90 not in alone and any("draft: its end ids [90] are not the target's" in line for line in lines)


def test_only_special_tokens_are_added_as_end_of_turn():
    """Qwen2.5's vocabulary holds "</s>" as plain text (an HTML tag's end): a bundle that stopped there cut code."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specedge.export.sources import _eos_ids

    tok = Tokenizer(models.WordLevel(vocab={"a": 0, "</s>": 1, "<|im_end|>": 2, "<eos>": 3, "<|end|>": 4},
                                     unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|im_end|>", "<eos>", "<|end|>"])          # <|end|>: Phi-3's end of turn
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    assert _eos_ids(None, {}, fast) == ([3, 2, 4], ["<|im_end|> (2)", "<|end|> (4)"])


@pytest.mark.parametrize("arch,settings,sliding", [
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 2}, []),      # every layer attends fully
    ("qwen2", {"use_sliding_window": True, "max_window_layers": 1}, [1]),
    ("qwen2", {"use_sliding_window": False, "max_window_layers": 0}, []),
    ("mistral", {}, [0, 1]),
    ("llama", {}, [])])                    # a window a converted config.json left behind: transformers ignores it
def test_sliding_windows_apply_to_the_layers_transformers_applies_them_to(tmp_path, arch, settings, sliding):
    """A window of 6 with max_seq_len 64: the export check (17 tokens) and 40 teacher-forced tokens here compare
    with transformers itself; a sliding layer sees only the last 6 positions."""
    import torch

    from conftest import cursor_of

    base = {**tm.make_config(arch, 260).to_dict(), "sliding_window": 6, "layer_types": None, **settings}
    config = type(tm.make_config(arch, 260))(**base)
    assert [i for i, kind in enumerate(getattr(config, "layer_types", None) or []) if kind == "sliding_attention"] in (
        sliding, [])
    reference = tm.make_model_from(config, seed=3)
    src = tm.save(reference, tm.byte_tokenizer(), tmp_path / "swa")
    for attention in ("gqa", "standard"):
        out = tmp_path / attention
        _export(src, out, attention=attention)
        entry = load(out).manifest["models"]["target"]
        assert entry["spec"]["sliding_layers"] == sliding and entry["spec"]["sliding_window"] == (6 if sliding else 0)
        cursor, ids = cursor_of(out, "target"), list(range(3, 43))
        ours = np.concatenate([cursor.feed(ids[at:at + 8]).copy() for at in range(0, len(ids), 8)])
        with torch.no_grad():
            expected = reference(torch.tensor([ids])).logits[0, :, :ours.shape[1]].numpy()
        np.testing.assert_allclose(ours, expected, atol=2e-4)


@pytest.mark.parametrize("max_seq_len,exported", [(64, True), (1024, False)])
def test_dynamic_rope_exports_within_its_original_length(tmp_path, max_seq_len, exported):
    """transformers' dynamic NTK scaling changes the frequencies only past max_position_embeddings (512 here):
    within it the graph's default rope is the same (the export check compares with transformers itself)."""
    import transformers

    base = tm.make_config("llama", 260).to_dict()
    rope = {"rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}
    config = transformers.LlamaConfig(**{**base, "rope_parameters": rope, "rope_scaling": rope})
    src = tm.save(transformers_model(config), tm.byte_tokenizer(), tmp_path / "dyn")
    out = tmp_path / "out"
    if exported:
        lines = []
        export_bundle(str(src), None, out, max_seq_len=max_seq_len, max_draft=4, progress=lines.append)
        assert any("dynamic rope scaling runs as the default" in line for line in lines)
    else:
        with pytest.raises(ExportError, match="dynamic rope scaling beyond its original 512 positions"):
            export_bundle(str(src), None, out, max_seq_len=max_seq_len, max_draft=4, progress=None)


def test_a_mistyped_path_beside_its_folder_is_not_tried_as_a_hub_id(tmp_path, monkeypatch):
    """'models/qwen-typo' looks like a hub id; with a models/ folder here it is a path, refused at once (offline,
    huggingface_hub would retry for ~25 s first)."""
    (tmp_path / "models").mkdir()
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ExportError, match=r"models/qwen-typo: no such file or folder in models/"):
        _export("models/qwen-typo", tmp_path / "out")


def test_a_hub_id_without_a_network_is_refused_in_seconds(tmp_path, monkeypatch):
    """No retries for ~25 s: one connection tried (here refused at once), and what to do with a cached model."""
    import socket

    def refused(address, timeout):
        assert timeout <= 3
        raise ConnectionRefusedError(111, "Connection refused")

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(socket, "create_connection", refused)
    with pytest.raises(ExportError, match=r"org/model: cannot reach huggingface\.co for this hub id \(Connection "
                                          r"refused\); a model already in the Hugging Face cache exports with "
                                          r"HF_HUB_OFFLINE=1"):
        _export("org/model", tmp_path / "out")


YARN = [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6},  # Qwen2.5
        {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64, "rope_theta": 1e4,
         "beta_fast": 16, "truncate": False},
        {"rope_type": "yarn", "factor": 40.0, "original_max_position_embeddings": 64, "rope_theta": 1e4,
         "mscale": 1.0, "mscale_all_dim": 0.707},
        {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 64, "rope_theta": 1e4,
         "attention_factor": 1.5}]


@pytest.mark.parametrize("rope", YARN)
def test_yarn_frequencies_and_attention_factor_are_transformers_own(rope):
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from specedge.models.spec import rope_attention_factor, rope_from_config, rope_inv_freq

    config = transformers.Qwen2Config(**{**tm.make_config("qwen2", 260).to_dict(), "rope_parameters": rope})
    inv_freq, factor = ROPE_INIT_FUNCTIONS["yarn"](config, "cpu")
    ours = rope_from_config(config.to_dict())
    np.testing.assert_allclose(rope_inv_freq(ours, 16), inv_freq.numpy(), rtol=1e-6, atol=0)
    assert rope_attention_factor(ours) == pytest.approx(factor, rel=1e-12)


@pytest.mark.parametrize("attention", ["gqa", "standard"])
def test_yarn_rope_exports_and_matches_transformers(tmp_path, attention):
    """max_seq_len 256, four times the original 64 positions: the export check compares every graph with
    transformers itself (cos and sin carry YaRN's attention factor)."""
    import transformers

    base = tm.make_config("qwen2", 260).to_dict()
    config = transformers.Qwen2Config(**{**base, "rope_parameters": YARN[1]})
    src = tm.save(tm.make_model_from(config, seed=4), tm.byte_tokenizer(), tmp_path / "yarn")
    export_bundle(str(src), None, tmp_path / "out", max_seq_len=256, max_draft=4, attention=attention,
                  progress=None)
    entry = load(tmp_path / "out").manifest["models"]["target"]
    assert entry["spec"]["rope"]["type"] == "yarn" and entry["export_check"]["max_abs_logit_error"] < 1e-3


def _phi3_config(**rope_changes):
    import transformers

    base = tm.make_config("phi3", 260).to_dict()
    return transformers.Phi3Config(**{**base, "rope_parameters": {**base["rope_parameters"], **rope_changes}})


@pytest.mark.parametrize("rope_changes", [{}, {"attention_factor": 1.3}, {"factor": 8.0}])
@pytest.mark.parametrize("long", [False, True])
def test_longrope_frequencies_and_attention_factor_are_transformers_own(rope_changes, long):
    """Short or long factors over the 8 rotary dims of a 16-dim head (partial_rotary_factor 0.5); the attention factor
    from the lengths' ratio, from `factor` or given."""
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from specedge.models.spec import rope_attention_factor, rope_from_config, rope_inv_freq, rotary_dim_of

    config = _phi3_config(**rope_changes)
    inv_freq, factor = ROPE_INIT_FUNCTIONS["longrope"](config, "cpu", seq_len=257 if long else None)
    ours = {**rope_from_config(config.to_dict(), partial_rotary=True), "long": long}
    assert rotary_dim_of(config.to_dict(), 16) == 8
    np.testing.assert_allclose(rope_inv_freq(ours, 8), inv_freq.numpy(), rtol=1e-6, atol=0)
    assert rope_attention_factor(ours) == pytest.approx(factor, rel=1e-12) and factor != 1.0


def test_partial_rotary_dims_are_refused_where_the_architecture_has_none():
    with pytest.raises(ExportError, match="partial rotary embeddings are not supported for this architecture"):
        from specedge.models import llama
        llama.spec_from_config({**tm.make_config("llama", 260).to_dict(), "partial_rotary_factor": 0.5},
                               "LlamaForCausalLM")


@pytest.mark.parametrize("attention", ["gqa", "standard"])
def test_phi3_longer_than_its_original_length_takes_the_long_factors(tmp_path, capsys, attention):
    """max_seq_len 512 past the original 256: the graph turns every position with LongRoPE's long factors (as
    llama.cpp does for a longer context), and equals transformers' model given those factors; the short ones would
    differ. Within 256 positions (the arch tests) the graph equals transformers' model as it comes."""
    import torch
    import transformers

    from conftest import cursor_of

    src = tm.save(tm.make_model("phi3", 260, seed=4), tm.byte_tokenizer(), tmp_path / "phi3")
    bundle = export_bundle(str(src), None, tmp_path / "out", max_seq_len=512, max_draft=4, attention=attention,
                           progress=None)
    entry = load(bundle).manifest["models"]["target"]
    assert entry["spec"]["rope"]["long"] is True and entry["spec"]["rotary_dim"] == 8
    assert entry["export_check"]["max_abs_logit_error"] < 1e-3
    from specedge.cli import main

    assert main(["inspect", str(bundle)]) == 0
    assert "head_dim 16, rope longrope (long factors), 8 of 16 dims turned" in capsys.readouterr().out
    ids = np.random.default_rng(3).integers(0, 260, size=30).tolist()
    model = transformers.AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32).eval()
    with torch.no_grad():
        short = model(torch.tensor([ids])).logits[0].numpy()
        rotary = model.model.rotary_emb
        long_factors = torch.tensor([2.0, 3.0, 5.0, 9.0])
        long_freq = 1.0 / (long_factors * 10000.0 ** (torch.arange(0, 8, 2, dtype=torch.int64).float() / 8))
        rotary.original_inv_freq.copy_(long_freq)
        rotary.inv_freq.copy_(long_freq)
        reference = model(torch.tensor([ids])).logits[0].numpy()
    cursor = cursor_of(bundle)
    ours = np.concatenate([cursor.feed(ids[:12]).copy(), cursor.feed(ids[12:17]).copy(), cursor.feed(ids[17:]).copy()])
    np.testing.assert_allclose(ours, reference, atol=1e-4, rtol=1e-4)
    assert np.abs(short - reference).max() > 1e-2


def test_gemma3_image_and_text_checkpoint_exports_its_language_model(tmp_path):
    """Gemma 3 from 4B up ships as Gemma3ForConditionalGeneration (a vision tower beside the language model): the
    language model exports alone and its logits on text are the whole model's (checked against it here)."""
    import torch
    import transformers

    from conftest import cursor_of

    text = {**tm.make_config("gemma3", 260).to_dict(), "vocab_size": 260}
    vision = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2, image_size=28,
                  patch_size=14)
    config = transformers.Gemma3Config(text_config=text, vision_config=vision, mm_tokens_per_image=4,
                                       image_token_index=259, boi_token_index=257, eoi_token_index=258)
    torch.manual_seed(5)
    model = transformers.Gemma3ForConditionalGeneration(config).eval()
    src = tm.save(model, tm.byte_tokenizer(), tmp_path / "gemma3-mm")
    _export(src, tmp_path / "out")
    entry = load(tmp_path / "out").manifest["models"]["target"]
    assert entry["architecture"] == "Gemma3ForCausalLM" and entry["export_check"]["max_abs_logit_error"] < 1e-3
    cursor, ids = cursor_of(tmp_path / "out", "target"), list(range(3, 27))
    ours = np.concatenate([cursor.feed(ids[at:at + 8]).copy() for at in range(0, len(ids), 8)])
    with torch.no_grad():
        expected = model(input_ids=torch.tensor([ids])).logits[0, :, :ours.shape[1]].numpy()
    np.testing.assert_allclose(ours, expected, atol=2e-4)


def test_a_window_at_least_as_long_as_the_buffer_adds_no_mask_and_yarn_stretches_the_trained_length(tmp_path,
                                                                                                   monkeypatch):
    """Mistral's 4096 window at max_seq_len 64 hides nothing: the graph has no window (no local_window_size, so no
    local-attention kernel on a GPU); Qwen2.5's yarn x4 of 32768 positions: max_seq_len 100000 is no warning."""
    import onnx

    base = tm.make_config("mistral", 260)
    config = type(base)(**{**base.to_dict(), "sliding_window": 4096})
    src = tm.save(tm.make_model_from(config, seed=3), tm.byte_tokenizer(), tmp_path / "wide")
    _export(src, tmp_path / "out")
    graph = onnx.load(str(tmp_path / "out" / "target.onnx"), load_external_data=False)
    windows = [a.i for n in graph.graph.node if n.op_type == "GroupQueryAttention" for a in n.attribute
               if a.name == "local_window_size"]
    assert windows == [-1, -1]

    from specedge.export import pipeline
    rope = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768, "rope_theta": 1e6}
    cfg = {**tm.make_config("qwen2", 260).to_dict(), "rope_parameters": rope, "max_position_embeddings": 32768,
           "architectures": ["Qwen2ForCausalLM"]}
    lines = []
    source = pipeline.Source("yarn", "hf-folder", "", {}, cfg, None)

    def no_weights(source):
        raise ExportError("cannot load weights: none here")

    monkeypatch.setattr(pipeline, "skeleton", no_weights)
    with pytest.raises(ExportError, match="cannot load weights"):   # the warnings came before the weights opened
        pipeline._export_model("target", source, tmp_path, 260, 100_000, 4, None, lines.append, None, [], "gqa")
    assert lines and not any("exceeds" in line for line in lines)


def test_granite_multipliers_stay_float32_in_a_bfloat16_graph(tmp_path):
    """transformers multiplies a bf16 tensor by the Python float 0.22 in float32 and rounds once; the factor rounded
    to bf16 first (0.2197) would shrink every residual branch by 0.1%."""
    import onnx
    from onnx import numpy_helper

    src = tm.save(tm.make_model("granite", 260, seed=4), tm.byte_tokenizer(), tmp_path / "granite")
    bundle = export_bundle(str(src), None, tmp_path / "out", max_seq_len=64, max_draft=4, dtype="bfloat16",
                           attention="standard", progress=None)
    graph = onnx.load(bundle / "target.onnx").graph
    factors = {init.name.split("_")[0]: numpy_helper.to_array(init) for init in graph.initializer
               if init.name.startswith(("residual_scale", "embed_scale"))}
    assert factors["residual"].dtype == np.float32 and factors["residual"] == np.float32(0.22)
    assert factors["embed"] == np.float32(3.0)
    assert np.float32(0.22) != np.float32(0.2197265625)                  # what bf16 would have kept
