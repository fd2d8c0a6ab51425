"""Gemma, Gemma 2 and Gemma 3 (text) decoders: the llama layout plus embeddings scaled by sqrt(hidden), RMSNorms that
multiply by 1 + weight, GELU (tanh) gates; from Gemma 2 on a norm after attention and around the MLP, a query scale
of its own, sliding-window layers; Gemma 2 soft-caps attention scores and logits, Gemma 3 norms each q and k head and
gives its sliding layers a rope of their own."""

from __future__ import annotations

import numpy as np

from specedge.errors import ExportError
from specedge.models.llama import lm_head
from specedge.models.spec import ModelSpec, rope_from_config, ropes_by_layer_type
from specedge.models.weights import WeightTable


def spec_from_config(cfg: dict, architecture: str) -> ModelSpec:
    act = cfg.get("hidden_activation") or cfg.get("hidden_act")
    if act != "gelu_pytorch_tanh":
        raise ExportError(f"{architecture}: activation '{act}' is not supported (only gelu_pytorch_tanh)")
    if cfg.get("use_bidirectional_attention"):
        raise ExportError(f"{architecture}: bidirectional attention is not a decoder's (not supported)")
    gemma3 = architecture == "Gemma3ForCausalLM"
    types = cfg.get("layer_types") or []
    window = int(cfg.get("sliding_window") or 0)
    sliding = [i for i, kind in enumerate(types) if kind == "sliding_attention"] if window else []
    rope, rope_local = ropes_by_layer_type(cfg, architecture) if gemma3 else (rope_from_config(cfg), {})
    heads, hidden = cfg["num_attention_heads"], cfg["hidden_size"]
    bias = bool(cfg.get("attention_bias", False))
    return ModelSpec(
        architecture=architecture, family="gemma", vocab_rows=cfg["vocab_size"], hidden_size=hidden,
        num_layers=cfg["num_hidden_layers"], num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads, intermediate_size=cfg["intermediate_size"],
        norm_eps=float(cfg["rms_norm_eps"]), max_position_embeddings=cfg.get("max_position_embeddings", 8192),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)), qkv_bias=bias, o_bias=bias,
        activation=act, rope=rope, rope_local=rope_local, qk_norm=gemma3,
        embed_scale=float(np.sqrt(hidden)),
        attention_scale=float(cfg.get("query_pre_attn_scalar") or cfg.get("head_dim") or hidden // heads) ** -0.5,
        attn_softcap=float(cfg.get("attn_logit_softcapping") or 0.0),
        logit_softcap=float(cfg.get("final_logit_softcapping") or 0.0),
        sliding_window=window if sliding else 0, sliding_layers=sliding,
    )


def build(graph, spec: ModelSpec, weights: WeightTable) -> None:
    b, e, d = graph.b, spec.hidden_size, spec.head_dim
    q_out, kv_out, f = spec.num_heads * d, spec.num_kv_heads * d, spec.intermediate_size

    def part(prefix: str, n_in: int, n_out: int, has_bias: bool = False) -> tuple:
        bias = weights.take(f"{prefix}.bias", (n_out,)) if has_bias else None
        return prefix, weights.take(f"{prefix}.weight", (n_out, n_in)), bias

    def norm_weight(name: str, width: int) -> np.ndarray:
        """Gemma's norms multiply by 1 + weight (added in float32, as transformers does)."""
        return (np.float32(1.0) + weights.take(name, (width,))).astype(np.float32)

    def rms_norm(x: str, name: str) -> str:
        return graph.rms_norm(x, name, norm_weight(name, e))

    def head_norms(p: str) -> list[tuple[str, np.ndarray]] | None:
        names = [f"{p}.self_attn.{which}_norm.weight" for which in ("q", "k")]
        return [(name, norm_weight(name, d)) for name in names] if spec.qk_norm else None

    embed_rows = weights.take("model.embed_tokens.weight", (spec.vocab_rows, e))[: spec.vocab_size]
    x, embed = graph.embedding("model.embed_tokens.weight", embed_rows, graph.ids)    # [B, T, E]
    del embed_rows
    x = b.op("Mul", x, b.weight("embed_scale", np.array(spec.embed_scale, np.float32)))
    first = spec.architecture == "GemmaForCausalLM"      # Gemma 1: norms before attention and MLP only, as Llama
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        h = rms_norm(x, f"{p}.input_layernorm.weight")
        projections = (("q", q_out), ("k", kv_out), ("v", kv_out))
        qkv = graph.fused_linear(h, f"{p}.self_attn.qkv_proj",
                                 [part(f"{p}.self_attn.{name}_proj", e, n, spec.qkv_bias) for name, n in projections])
        context = graph.attention(i, qkv, head_norms(p))
        o = graph.linear(context, *part(f"{p}.self_attn.o_proj", q_out, e, spec.o_bias))
        x = b.op("Add", x, o if first else rms_norm(o, f"{p}.post_attention_layernorm.weight"))
        h = rms_norm(x, f"{p}.{'post_attention' if first else 'pre_feedforward'}_layernorm.weight")
        gate_up = graph.fused_linear(h, f"{p}.mlp.gate_up_proj", [part(f"{p}.mlp.{name}_proj", e, f)
                                                                   for name in ("gate", "up")])
        gate, up = graph.split(gate_up, [f, f])
        down = graph.linear(b.op("Mul", graph.gelu(gate, exact=False), up), *part(f"{p}.mlp.down_proj", f, e))
        x = b.op("Add", x, down if first else rms_norm(down, f"{p}.post_feedforward_layernorm.weight"))
    lm_head(graph, spec, weights, rms_norm(x, "model.norm.weight"), embed)
