"""Export reads a safetensors checkpoint a tensor at a time, and checks the graph against transformers' model run a
module at a time on those tensors (source_weights.py, reference_model.py). What it computes must equal what a
float32 transformers load computes, bit for bit: for every architecture, from bf16 and float32 checkpoints, with
the dequantized weights of a quantized graph, and for checkpoints transformers has to load itself."""

import numpy as np
import pytest
import tiny_models as tm
import torch
import transformers
from conftest import ARCHS
from safetensors.torch import load_file, save_file

from specedge.export import export_bundle, reference_model
from specedge.export.check import dequantized_overrides
from specedge.export.quantize import Quantization, quantize
from specedge.export.source_weights import open_weights
from specedge.export.sources import open_source

IDS = [[5, 17, 200, 3, 99, 42, 7, 128, 250, 1, 64], [9, 8, 7], [100, 101, 102, 103, 104, 105]]


def _saved(tmp_path, arch, dtype):
    model = tm.make_model(arch, 260, seed=3)
    return tm.save(model.to(dtype), tm.byte_tokenizer(), tmp_path / f"{arch}-{str(dtype)[6:]}")


def _float32_load(folder):
    return transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()


def _transformers_logits(model, ids):
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0, :, :260].numpy()


def _opened(folder):
    source = open_source(str(folder))
    model = reference_model.skeleton(source)
    return source, model, open_weights(source, model)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("arch", ARCHS)
def test_the_reference_run_a_module_at_a_time_equals_a_float32_load_bit_for_bit(tmp_path, arch, dtype):
    folder = _saved(tmp_path, arch, dtype)
    _, model, weights = _opened(folder)
    assert weights.how == "read a tensor at a time from 1 safetensors file"
    full = _float32_load(folder)
    state = full.state_dict()
    assert sorted(weights.names) == sorted(state)
    assert all(torch.equal(weights.tensor(name), state[name]) for name in state)
    ours = reference_model.logits(model, weights, IDS, 260)
    assert all(np.array_equal(row, _transformers_logits(full, ids)) for ids, row in zip(IDS, ours))
    assert all(p.device.type == "meta" for p in model.parameters())        # lent weights were given back


def test_the_checkpoint_read_is_the_one_transformers_loads(tmp_path):
    """model.safetensors, else the index's shards; never another .safetensors beside them (Mistral's consolidated
    file, a stale copy): read, it would be the graph's weights and the check's reference both."""
    model = tm.make_model("llama", 260, seed=3)
    sharded = tmp_path / "sharded"
    model.save_pretrained(sharded, max_shard_size="20KB")
    tm.byte_tokenizer().save_pretrained(sharded)
    assert len(list(sharded.glob("model-*.safetensors"))) > 2
    stale = {name: 3 * tensor for name, tensor in model.state_dict().items()}
    save_file(stale, sharded / "consolidated.safetensors", metadata={"format": "pt"})
    weights = _opened(sharded)[2]
    assert weights.how.startswith(f"read a tensor at a time from {len(list(sharded.glob('model-*')))} safetensors")
    full = _float32_load(sharded)
    assert all(torch.equal(weights.tensor(name), tensor) for name, tensor in full.state_dict().items())
    save_file(stale, sharded / "model.safetensors", metadata={"format": "pt"})   # transformers prefers it to the index
    weights = _opened(sharded)[2]
    assert weights.how == "read a tensor at a time from 1 safetensors file"
    assert torch.equal(weights.tensor("model.norm.weight"), _float32_load(sharded).model.norm.weight)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_a_bin_checkpoint_is_read_a_tensor_at_a_time_as_transformers_loads_it(tmp_path, arch, monkeypatch):
    """PyTorch .bin files (one, or shards an index names), memory-mapped: the same float32 tensors as transformers'
    load, so the same graph and check; an export from them never loads the model with transformers."""
    import json

    single, sharded = tmp_path / "single", tmp_path / "sharded"
    tm.save(tm.make_model(arch, 260, seed=3).to(torch.bfloat16), tm.byte_tokenizer(), single)
    stored = load_file(single / "model.safetensors")       # what transformers 5 saves; .bin as older ones did
    (single / "model.safetensors").unlink()
    torch.save(stored, single / "pytorch_model.bin")
    sharded.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        (sharded / name).write_bytes((single / name).read_bytes())
    names, weight_map = sorted(stored), {}
    for i in range(3):
        shard = f"pytorch_model-{i + 1:05d}-of-00003.bin"
        torch.save({n: stored[n] for n in names[i::3]}, sharded / shard)
        weight_map.update({n: shard for n in names[i::3]})
    (sharded / "pytorch_model.bin.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    for folder in (single, sharded):
        _, skeleton, weights = _opened(folder)
        files = len(list(folder.glob("*.bin")))
        assert weights.how == f"read a tensor at a time from {files} .bin file{'s' * (files > 1)} (memory-mapped)"
        state = _float32_load(folder).state_dict()
        assert sorted(weights.names) == sorted(state)
        assert all(torch.equal(weights.tensor(name), state[name]) for name in state)

    def refuse(*args, **kwargs):
        raise AssertionError("from_pretrained loaded the whole model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    lines = []
    export_bundle(str(sharded), None, tmp_path / "b", max_seq_len=64, max_draft=4, progress=lines.append)
    assert any("(memory-mapped)" in line for line in lines)


def test_eos_ids_come_from_where_transformers_takes_them(tmp_path):
    import json

    from specedge.errors import ExportError
    folder = _saved(tmp_path, "qwen2", torch.bfloat16)
    generation = json.loads((folder / "generation_config.json").read_text())
    (folder / "generation_config.json").write_text(json.dumps({**generation, "eos_token_id": [7, 256]}))
    assert open_source(str(folder)).eos_token_ids()[0][:2] == [7, 256]
    (folder / "generation_config.json").unlink()                  # then config.json's generation settings
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "eos_token_id": [9, 256]}))
    assert open_source(str(folder)).eos_token_ids()[0][:2] == [9, 256]
    (folder / "generation_config.json").write_text('{"eos_token_id": 7, "cache_implementation": "nonexistent"}')
    with pytest.raises(ExportError, match="cannot read the generation config of"):
        open_source(str(folder)).eos_token_ids()


def test_weights_lent_to_a_module_are_given_back_after_an_error_and_lending_does_not_nest(tmp_path):
    _, model, weights = _opened(_saved(tmp_path, "qwen2", torch.bfloat16))
    with pytest.raises(IndexError), reference_model.weights_while_running(model, weights):
        model(input_ids=torch.tensor([[5000]]))                   # past the embedding: raises mid-forward
    assert all(p.device.type == "meta" for p in model.parameters())
    with reference_model.weights_while_running(model, weights), pytest.raises(RuntimeError, match="already active"):
        with reference_model.weights_while_running(model, weights):
            pass
    assert reference_model.logits(model, weights, IDS[:1], 260)[0].shape == (len(IDS[0]), 260)


@pytest.mark.parametrize("vocab_rows", [250, 260])
@pytest.mark.parametrize("arch", ["qwen2", "gpt2"])
def test_dequantized_overrides_equal_the_dequantized_weights_loaded_into_the_model(tmp_path, arch, vocab_rows):
    """The quantized graph's reference: every weight the graph quantized replaced by its dequantized values,
    here by copying them into a float32 model (GPT-2's Conv1D stores [in, out]; the tied head its own copy; rows
    past a vocabulary smaller than the table keep their values)."""
    folder = _saved(tmp_path, arch, torch.bfloat16)
    _, model, weights = _opened(folder)
    q = Quantization(4, block_size=16)
    embedding = "model.embed_tokens" if arch == "qwen2" else "transformer.wte"
    linear = "model.layers.0.mlp.down_proj" if arch == "qwen2" else "transformer.h.1.mlp.c_fc"
    quantized = {}
    for module, rows in (("lm_head", vocab_rows), (embedding, vocab_rows), (linear, None)):
        weight = weights.array(f"{module}.weight")
        if module == linear and arch == "gpt2":
            weight = weight.T                                              # the graph quantizes [out, in]
        weight = weight[:rows] if rows else weight
        codes, scales, zero_points = quantize(weight, q)
        quantized[module] = (codes, scales, zero_points, weight.shape[1])
    full = _float32_load(folder)
    from specedge.export.quantize import dequantize
    with torch.no_grad():
        full.lm_head.weight = torch.nn.Parameter(full.lm_head.weight.detach().clone())     # untied
        for module, parts in quantized.items():
            values = torch.from_numpy(dequantize(*parts, q))
            target = full.get_submodule(module).weight
            if module == linear and arch == "gpt2":
                values = values.T
            target[: values.shape[0]].copy_(values)
    overrides = dequantized_overrides(model, weights, quantized, q)
    ours = reference_model.logits(model, weights, IDS[:1], 260, overrides)[0]
    assert np.array_equal(ours, _transformers_logits(full, IDS[0]))
    assert not np.array_equal(ours, reference_model.logits(model, weights, IDS[:1], 260)[0])


def test_a_checkpoint_with_tensors_under_other_names_is_loaded_by_transformers_in_float32(tmp_path):
    """An extra tensor the model does not name (old checkpoints saved rope frequencies): transformers loads it, in
    float32 even where config.json says bf16 (its dtype "auto" would round the float32 tensors stored), and the
    export is the same as from the clean checkpoint."""
    import json
    import shutil
    clean = _saved(tmp_path, "llama", torch.float32)
    legacy = tmp_path / "legacy"
    shutil.copytree(clean, legacy)
    tensors = load_file(legacy / "model.safetensors")
    tensors["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.ones(8)
    save_file(tensors, legacy / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((legacy / "config.json").read_text())
    (legacy / "config.json").write_text(json.dumps({**config, "dtype": "bfloat16"}))
    weights = _opened(legacy)[2]
    assert weights.how == "loaded by transformers (float32)"
    streamed = _opened(clean)[2]
    assert all(torch.equal(weights.tensor(n), streamed.tensor(n)) for n in streamed.names)
    lines = []
    bundle = export_bundle(str(legacy), None, tmp_path / "b", max_seq_len=64, max_draft=4, progress=lines.append)
    assert any("loaded by transformers (float32)" in line for line in lines)
    assert (bundle / "manifest.json").exists()


def test_a_streamed_export_never_loads_the_model_with_transformers(tmp_path, monkeypatch):
    folder = _saved(tmp_path, "qwen2", torch.bfloat16)

    def refuse(*args, **kwargs):
        raise AssertionError("from_pretrained loaded the whole model")

    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", refuse)
    lines = []
    export_bundle(str(folder), str(folder), tmp_path / "b", max_seq_len=64, max_draft=4, quantize="int4",
                  progress=lines.append)
    assert sum("read a tensor at a time from 1 safetensors file" in line for line in lines) == 2


def test_a_hub_id_reads_the_safetensors_of_its_snapshot(tmp_path, monkeypatch):
    """No hub here: snapshot_download stands in, returning a folder as the hub cache would."""
    import huggingface_hub

    from specedge.export import source_weights
    folder = _saved(tmp_path, "qwen2", torch.bfloat16)
    asked = []

    def snapshot(repo_id, allow_patterns):
        asked.append((repo_id, allow_patterns))
        return str(folder)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot)
    source = open_source(str(folder))
    source.kind, source.where = "hub", "org/model"
    model = reference_model.skeleton(source)
    assert open_weights(source, model).how.startswith("read a tensor at a time")
    assert asked == [("org/model", source_weights.SAFETENSORS_PATTERNS)]

    def offline(repo_id, allow_patterns):
        raise OSError("no connection to huggingface.co\nmore detail")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", offline)
    with pytest.raises(source_weights.ExportError, match="cannot download the weights of org/model: no connection"):
        open_weights(source, model)


@pytest.mark.parametrize("arch,quantize", [("qwen2", False), ("qwen2", True), ("llama", True), ("qwen3", False)])
def test_a_gguf_file_is_dequantized_a_tensor_at_a_time_as_transformers_loads_it(tmp_path, arch, quantize):
    """transformers' own name map and tensor processor (llama's q/k permutation undone), one tensor at a time:
    every tensor, and the reference's logits, equal transformers' whole-file load bit for bit."""
    from test_gguf_source import write_gguf

    config = tm.make_config(arch, 258)
    config.tie_word_embeddings = False
    if arch == "qwen3":
        config.head_dim, config.attention_bias = 128, False          # what transformers' GGUF config assumes
    if arch == "llama":
        config.num_key_value_heads = config.num_attention_heads // 2
    model = tm.make_model_from(config, seed=5)
    path = tmp_path / f"{arch}.gguf"
    write_gguf(model, path, quantize=quantize)
    _, skeleton, weights = _opened(path)
    assert weights.how == "dequantized a tensor at a time from the GGUF file"
    full = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32)
    state = full.eval().state_dict()
    assert sorted(weights.names) == sorted(state)
    assert all(torch.equal(weights.tensor(name), state[name]) for name in state)
    ours = reference_model.logits(skeleton, weights, IDS[:1], 258)[0]
    assert np.array_equal(ours, _transformers_logits(full, IDS[0])[:, :258])
