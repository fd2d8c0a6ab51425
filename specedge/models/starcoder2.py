"""StarCoder2 (code models 3B / 7B / 15B): the Llama layout with LayerNorms (weight and bias), biases on every
projection, a plain GELU MLP (c_fc, c_proj) instead of a gated one, and a sliding window on every layer."""

from __future__ import annotations

from specedge.errors import ExportError
from specedge.models.llama import lm_head
from specedge.models.spec import ModelSpec, rope_from_config
from specedge.models.weights import WeightTable

_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu")


def spec_from_config(cfg: dict, architecture: str) -> ModelSpec:
    act = cfg.get("hidden_act", "gelu_pytorch_tanh")
    if act not in _ACTIVATIONS:
        raise ExportError(f"{architecture}: activation '{act}' is not supported ({', '.join(_ACTIVATIONS)})")
    heads, hidden, layers = cfg["num_attention_heads"], cfg["hidden_size"], cfg["num_hidden_layers"]
    bias = bool(cfg.get("use_bias", True))
    window = int(cfg.get("sliding_window") or 0)
    return ModelSpec(
        architecture=architecture, family="starcoder2", vocab_rows=cfg["vocab_size"], hidden_size=hidden,
        num_layers=layers, num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=cfg.get("head_dim") or hidden // heads, intermediate_size=cfg["intermediate_size"],
        norm_eps=float(cfg["norm_epsilon"]),
        max_position_embeddings=cfg.get("max_position_embeddings", 4096),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", True)), qkv_bias=bias, o_bias=bias, mlp_bias=bias,
        activation=act, rope=rope_from_config(cfg), sliding_window=window,
        sliding_layers=list(range(layers)) if window else [],
    )


def build(graph, spec: ModelSpec, weights: WeightTable) -> None:
    b, e, d, f = graph.b, spec.hidden_size, spec.head_dim, spec.intermediate_size
    q_out, kv_out = spec.num_heads * d, spec.num_kv_heads * d

    def part(prefix: str, n_in: int, n_out: int) -> tuple:
        bias = weights.take(f"{prefix}.bias", (n_out,)) if spec.mlp_bias else None
        return prefix, weights.take(f"{prefix}.weight", (n_out, n_in)), bias

    embed_rows = weights.take("model.embed_tokens.weight", (spec.vocab_rows, e))[: spec.vocab_size]
    x, embed = graph.embedding("model.embed_tokens.weight", embed_rows, graph.ids)    # [B, T, E]
    del embed_rows
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        h = graph.layer_norm(x, f"{p}.input_layernorm", weights)
        qkv = graph.fused_linear(h, f"{p}.self_attn.qkv_proj", [part(f"{p}.self_attn.{name}_proj", e, n)
                                                                for name, n in (("q", q_out), ("k", kv_out),
                                                                                ("v", kv_out))])
        context = graph.attention(i, qkv)
        x = b.op("Add", x, graph.linear(context, *part(f"{p}.self_attn.o_proj", q_out, e)))
        h = graph.linear(graph.layer_norm(x, f"{p}.post_attention_layernorm", weights), *part(f"{p}.mlp.c_fc", e, f))
        x = b.op("Add", x, graph.linear(graph.gelu(h, exact=spec.activation == "gelu"), *part(f"{p}.mlp.c_proj", f, e)))
    lm_head(graph, spec, weights, graph.layer_norm(x, "model.norm", weights), embed)
