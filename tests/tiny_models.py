"""Tiny random models and tokenizers made at test time (fixed seeds, no downloads)."""

from __future__ import annotations

from pathlib import Path

import torch
import transformers
from tokenizers import Tokenizer, decoders, models, pre_tokenizers

EOS = "<|endoftext|>"
CHAT_TEMPLATE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def byte_tokenizer(chat: bool = False) -> transformers.PreTrainedTokenizerFast:
    """Byte-level BPE without merges: 256 byte tokens + specials; exercises multi-byte characters."""
    vocab = {c: i for i, c in enumerate(sorted(pre_tokenizers.ByteLevel.alphabet()))}  # alphabet() is unordered
    specials = [EOS] + (["<|im_start|>", "<|im_end|>"] if chat else [])
    for s in specials:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(specials)
    fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)
    if chat:
        fast.chat_template = CHAT_TEMPLATE
    return fast


def word_tokenizer(n_words: int) -> transformers.PreTrainedTokenizerFast:
    """A tiny vocabulary: words w0..w{n-2} and the eos token (for distribution tests)."""
    vocab = {f"w{i}": i for i in range(n_words - 1)}
    vocab[EOS] = n_words - 1
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=EOS))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens([EOS])
    return transformers.PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS)


def make_config(arch: str, vocab_rows: int, layers: int = 2, hidden: int = 64, seed: int = 0):
    """Configs exercising GQA, q/k/v and o biases, tied and untied heads, rope scaling, a head_dim other than
    hidden / heads, per-head q/k norms (qwen3, gemma3), soft-capping (gemma2), sliding windows and a rope per layer
    type (gemma3), fused q/k/v and gate/up weights, LongRoPE and partial rotary dims (phi3), multipliers (granite),
    norms after attention and MLP and over whole q/k projections (olmo2, olmo3), layers without RoPE (smollm3)."""
    common = dict(vocab_size=vocab_rows, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, max_position_embeddings=512)
    if arch == "qwen2":
        return transformers.Qwen2Config(num_key_value_heads=2, tie_word_embeddings=True, rope_theta=10000.0, **common)
    if arch == "llama":
        return transformers.LlamaConfig(num_key_value_heads=2, tie_word_embeddings=False, rope_theta=500000.0,
                                        rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                                      "high_freq_factor": 4.0,
                                                      "original_max_position_embeddings": 64},
                                        **common)
    if arch == "qwen3":
        return transformers.Qwen3Config(num_key_value_heads=2, head_dim=24, tie_word_embeddings=True,
                                        attention_bias=True, rope_theta=1000000.0, **common)
    if arch == "gemma":    # Gemma 1: multi-query attention, norms before attention and MLP only
        return transformers.GemmaConfig(num_key_value_heads=1, head_dim=24, **common)
    if arch == "gemma2":   # window 6: the export check's 17 tokens and the tests' prompts run past it
        return transformers.Gemma2Config(num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=24, sliding_window=6,
                                         attn_logit_softcapping=5.0, final_logit_softcapping=3.0, **common)
    if arch == "gemma3":
        rope = {"full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1e6},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
        return transformers.Gemma3TextConfig(num_key_value_heads=1, head_dim=24, query_pre_attn_scalar=16,
                                             sliding_window=6, layer_types=["sliding_attention", "full_attention"],
                                             rope_parameters=rope, **common)
    if arch == "phi3":     # LongRoPE (short factors within the original 256 positions), half the head turned
        rope = {"rope_type": "longrope", "short_factor": [1.0, 1.3, 1.7, 2.5], "long_factor": [2.0, 3.0, 5.0, 9.0],
                "partial_rotary_factor": 0.5, "original_max_position_embeddings": 256}
        return transformers.Phi3Config(num_key_value_heads=2, original_max_position_embeddings=256, sliding_window=6,
                                       partial_rotary_factor=0.5, rope_parameters=rope, tie_word_embeddings=False,
                                       **common)
    if arch == "granite":  # every multiplier away from 1, biases on q/k/v/o
        return transformers.GraniteConfig(num_key_value_heads=2, attention_bias=True, embedding_multiplier=3.0,
                                          attention_multiplier=0.2, residual_multiplier=0.22, logits_scaling=2.5,
                                          tie_word_embeddings=True, **common)
    if arch == "olmo2":    # norms after attention and MLP, q/k norms over the whole projections
        return transformers.Olmo2Config(num_key_value_heads=2, attention_bias=True, tie_word_embeddings=False,
                                        **common)
    if arch == "olmo3":    # olmo2's layout, sliding layers (window 6) with a rope of their own beside yarn
        rope = {"full_attention": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128,
                                   "rope_theta": 5e5},
                "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}}
        return transformers.Olmo3Config(num_key_value_heads=2, sliding_window=6, rope_parameters=rope,
                                        layer_types=["sliding_attention", "full_attention"], **common)
    if arch == "smollm3":  # the second layer without RoPE; sliding window on the NoPE layers
        return transformers.SmolLM3Config(num_key_value_heads=2, no_rope_layers=[1, 0], use_sliding_window=True,
                                          sliding_window=6, tie_word_embeddings=True, **common)
    if arch == "mistral":
        return transformers.MistralConfig(num_key_value_heads=1, tie_word_embeddings=False, sliding_window=None,
                                          **common)
    if arch == "starcoder2":   # LayerNorms, biases everywhere, a plain GELU MLP, window 6 on every layer
        return transformers.Starcoder2Config(num_key_value_heads=2, sliding_window=6, rope_theta=1e5, **common)
    if arch == "exaone4":  # a sliding layer with rope (window 6), a full layer without; norms after, per-head q/k
        return transformers.Exaone4Config(num_key_value_heads=2, sliding_window=6, sliding_window_pattern=2,
                                          rope_theta=1e4, **common)
    if arch == "hunyuan":  # per-head q/k norms after RoPE; a fixed NTK alpha on the rope base
        return transformers.HunYuanDenseV1Config(num_key_value_heads=2, head_dim=16, attention_bias=True,
                                                 rope_scaling={"type": "dynamic", "alpha": 1000.0, "factor": 1.0},
                                                 tie_word_embeddings=True, **common)
    if arch == "gpt2":
        return transformers.GPT2Config(vocab_size=vocab_rows, n_embd=hidden, n_layer=layers, n_head=4, n_positions=512)
    raise ValueError(arch)


def make_model(arch: str, vocab_rows: int, seed: int, layers: int = 2, hidden: int = 64, init_scale: float = 0.3):
    cfg = make_config(arch, vocab_rows, layers, hidden)
    cfg.initializer_range = init_scale    # larger than the default: peaked, varied greedy output
    cfg.bos_token_id = cfg.eos_token_id = cfg.pad_token_id = min(256, vocab_rows - 1)
    return make_model_from(cfg, seed)


def make_model_from(cfg, seed: int):
    """Random weights for a config (make_config's, perhaps changed), norms and biases varied too."""
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():  # init leaves norms at 1 and biases at 0; vary them so mapping mistakes show
        for name, p in model.named_parameters():
            if "norm" in name or "ln_" in name or name.endswith("bias"):
                p.add_(0.1 * torch.randn_like(p))
    return model.eval()


def perturbed(model, seed: int, noise: float):
    """A copy of `model` with relative Gaussian noise on every weight: a draft that is often right."""
    torch.manual_seed(seed)
    copy = type(model)(model.config)
    copy.load_state_dict(model.state_dict())
    with torch.no_grad():
        for p in copy.parameters():
            p.add_(noise * p.std() * torch.randn_like(p))
    return copy.eval()


def save(model, tokenizer, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder
