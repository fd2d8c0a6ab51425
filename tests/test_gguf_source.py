"""A GGUF file as the source: a tiny Qwen2 and a tiny Qwen3 written with the gguf package (f32 and Q8_0 tensors)."""

import gguf
import pytest

import tiny_models as tm
from tokenizers import pre_tokenizers
from specedge.export import export_bundle
from specedge.runtime import load

HF_TO_GGUF = {
    "model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
}
LAYER = {
    "input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
}


def _gguf_name(name: str) -> str:
    if name in HF_TO_GGUF:
        return HF_TO_GGUF[name]
    _, _, i, rest = name.split(".", 3)
    return f"blk.{i}.{LAYER[rest]}"


def write_gguf(model, path, quantize: bool, tensors: bool = True):
    cfg = model.config
    w = gguf.GGUFWriter(str(path), cfg.model_type)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    if getattr(cfg, "head_dim", None):
        w.add_key_length(cfg.head_dim)
        w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"] if hasattr(cfg, "rope_parameters") else cfg.rope_theta)
    if hasattr(cfg, "rms_norm_eps"):
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    else:                                                   # LayerNorm models (StarCoder2)
        w.add_layer_norm_eps(cfg.norm_epsilon)
    tokens = [*sorted(pre_tokenizers.ByteLevel.alphabet()), "Ġt", tm.EOS]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types([1] * (len(tokens) - 1) + [3])
    w.add_token_merges(["Ġ t"])
    w.add_eos_token_id(len(tokens) - 1)
    w.add_bos_token_id(len(tokens) - 1)
    for name, tensor in model.state_dict().items() if tensors else ():
        array = tensor.float().numpy()
        if quantize and array.ndim == 2:
            w.add_tensor(_gguf_name(name), gguf.quants.quantize(array, gguf.GGMLQuantizationType.Q8_0),
                         raw_dtype=gguf.GGMLQuantizationType.Q8_0)
        else:
            w.add_tensor(_gguf_name(name), array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


@pytest.fixture(scope="module")
def gguf_models(tmp_path_factory):
    root = tmp_path_factory.mktemp("gguf")
    model = tm.make_model("qwen2", 258, seed=21)
    model.config.tie_word_embeddings = False
    write_gguf(model, root / "tiny-f32.gguf", quantize=False)
    write_gguf(model, root / "tiny-q8.gguf", quantize=True)
    return root


def test_gguf_f32_export_matches_transformers(gguf_models):
    out = export_bundle(str(gguf_models / "tiny-f32.gguf"), str(gguf_models / "tiny-q8.gguf"),
                        gguf_models / "bundle", max_seq_len=64, progress=None)
    gen = load(out)
    for role in ("target", "draft"):
        check = gen.manifest["models"][role]["export_check"]
        assert check["max_abs_logit_error"] < 1e-3 and gen.manifest["models"][role]["source_kind"] == "gguf"
    base = gen.generate("the cat", max_new_tokens=40, k=0, ignore_eos=True)
    spec = gen.generate("the cat", max_new_tokens=40, k=4, ignore_eos=True)
    assert spec.tokens == base.tokens
    assert spec.stats.acceptance_per_position[0] > 0.5       # the Q8_0 draft mostly agrees with its f32 self
    assert gen.manifest["eos_token_ids"] == [257]


def test_gguf_qwen3_export_matches_transformers(tmp_path):
    """Qwen3's per-head q/k norms through the GGUF loader (attn_q_norm / attn_k_norm). transformers' GGUF config
    for qwen3 does not read the head size and takes Qwen3Config's 128, which every Qwen3 dense model has."""
    model = tm.make_model("qwen3", 258, seed=22)
    assert model.config.head_dim == 24                              # the tiny config's; GGUF needs the real 128
    config = model.config
    config.head_dim, config.attention_bias, config.tie_word_embeddings = 128, False, False
    model = tm.make_model_from(config, seed=22)
    write_gguf(model, tmp_path / "q3-f32.gguf", quantize=False)
    write_gguf(model, tmp_path / "q3-q8.gguf", quantize=True)
    gen = load(export_bundle(str(tmp_path / "q3-f32.gguf"), str(tmp_path / "q3-q8.gguf"), tmp_path / "bundle",
                             max_seq_len=64, progress=None))
    for role in ("target", "draft"):
        entry = gen.manifest["models"][role]
        assert entry["architecture"] == "Qwen3ForCausalLM" and entry["spec"]["qk_norm"]
        assert entry["export_check"]["max_abs_logit_error"] < 1e-3
    base = gen.generate("the cat", max_new_tokens=32, k=0, ignore_eos=True)
    assert gen.generate("the cat", max_new_tokens=32, k=4, ignore_eos=True).tokens == base.tokens


@pytest.mark.parametrize("arch,name", [("gemma2", "Gemma2ForCausalLM"), ("phi3", "Phi3ForCausalLM"),
                                       ("starcoder2", "Starcoder2ForCausalLM")])
def test_a_gguf_whose_settings_the_reader_drops_is_refused_before_its_weights_load(tmp_path, arch, name):
    """transformers' GGUF reader drops Gemma 3's rope scaling and the 27B models' query scale, Phi-3's LongRoPE
    factors, partial rotary dims and sliding window, and StarCoder2's rope theta: such a GGUF is one clear error
    (export from the Hugging Face folder), not a bundle checked against the same wrong model."""
    from specedge.errors import ExportError

    write_gguf(tm.make_model(arch, 260, seed=1), tmp_path / "model.gguf", quantize=False, tensors=False)
    with pytest.raises(ExportError, match=f"{name} from a GGUF file is not supported.*Hugging Face folder"):
        export_bundle(str(tmp_path / "model.gguf"), None, tmp_path / "bundle", max_seq_len=64, progress=None)
    assert not (tmp_path / "bundle").exists()
