"""Source folders a real user may have that the exporter used to mishandle (an audit with tiny models): a
checkpoint lacking a tensor, corrupt weights, a head size GroupQueryAttention cannot run, chat templates with
transformers' extensions or that do not render, end-of-turn tokens added to the eos ids."""

import json

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


@pytest.mark.parametrize("damage", ["garbage", "wrong shape"])
def test_corrupt_weights_are_one_clear_error(source, tmp_path, damage):
    src = _copy(source, tmp_path, "corrupt")
    if damage == "garbage":
        (src / "model.safetensors").write_bytes(b"\x00" * 100)
    else:
        weights = load_file(src / "model.safetensors")
        weights["model.norm.weight"] = weights["model.norm.weight"][:32].clone()
        save_file(weights, src / "model.safetensors", metadata={"format": "pt"})
    with pytest.raises(ExportError, match="cannot load weights of"):
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


def test_only_special_tokens_are_added_as_end_of_turn():
    """Qwen2.5's vocabulary holds "</s>" as plain text (an HTML tag's end): a bundle that stopped there cut code."""
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    from specedge.export.sources import _eos_ids

    tok = Tokenizer(models.WordLevel(vocab={"a": 0, "</s>": 1, "<|im_end|>": 2, "<eos>": 3}, unk_token="a"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(["<|im_end|>", "<eos>"])
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<eos>")
    assert _eos_ids(None, {}, fast) == ([3, 2], ["<|im_end|> (2)"])


@pytest.mark.parametrize("max_window_layers,refused", [(2, False), (1, True)])
def test_qwen2_sliding_window_counts_only_where_a_layer_uses_it(tmp_path, max_window_layers, refused):
    """use_sliding_window with max_window_layers >= the layer count: every layer attends fully (transformers'
    layer_types), so a max_seq_len beyond the window is fine; with a sliding layer it is refused."""
    import transformers

    settings = {**tm.make_config("qwen2", 260).to_dict(), "use_sliding_window": True, "sliding_window": 32,
                "max_window_layers": max_window_layers, "layer_types": None}
    config = transformers.Qwen2Config(**settings)
    assert ("sliding_attention" in config.layer_types) is refused
    src = tm.save(transformers.Qwen2ForCausalLM(config).eval(), tm.byte_tokenizer(), tmp_path / "swa")
    if refused:
        with pytest.raises(ExportError, match="exceeds the sliding window 32"):
            _export(src, tmp_path / "out")
    else:
        _export(src, tmp_path / "out")
        assert load(tmp_path / "out").generate("ab", max_new_tokens=4, ignore_eos=True).stats.new_tokens == 4


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
