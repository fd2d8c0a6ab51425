"""GPT-2: learned positions, LayerNorm with bias, fused qkv (Conv1D, stored [in, out]), GELU, tied head."""

from __future__ import annotations

from specedge.errors import ExportError
from specedge.models.spec import ModelSpec
from specedge.models.weights import WeightTable

_ACTIVATIONS = ("gelu_new", "gelu_pytorch_tanh", "gelu")


def spec_from_config(cfg: dict, architecture: str) -> ModelSpec:
    act = cfg.get("activation_function", "gelu_new")
    if act not in _ACTIVATIONS:
        raise ExportError(f"GPT2: activation '{act}' is not supported ({', '.join(_ACTIVATIONS)})")
    for flag in ("scale_attn_by_inverse_layer_idx", "add_cross_attention"):
        if cfg.get(flag):
            raise ExportError(f"GPT2: '{flag}' is not supported")
    if cfg.get("scale_attn_weights", True) is False:
        raise ExportError("GPT2: scale_attn_weights=false is not supported")
    hidden, heads = cfg["n_embd"], cfg["n_head"]
    return ModelSpec(
        architecture=architecture, family="gpt2", vocab_rows=cfg["vocab_size"], hidden_size=hidden,
        num_layers=cfg["n_layer"], num_heads=heads, num_kv_heads=heads, head_dim=hidden // heads,
        intermediate_size=cfg.get("n_inner") or 4 * hidden, norm_eps=float(cfg.get("layer_norm_epsilon", 1e-5)),
        max_position_embeddings=cfg["n_positions"], tied_embeddings=True, qkv_bias=True, o_bias=True,
        mlp_bias=True, activation=act,
    )


def build(graph, spec: ModelSpec, weights: WeightTable) -> None:
    b, e, f = graph.b, spec.hidden_size, spec.intermediate_size

    def conv1d(x: str, prefix: str, n_in: int, n_out: int) -> str:
        """HF's Conv1D keeps weights as (in, out)."""
        weight = weights.take(f"{prefix}.weight", (n_in, n_out))
        return graph.linear(x, prefix, weight.T, weights.take(f"{prefix}.bias", (n_out,)))

    wte_rows = weights.take("transformer.wte.weight", (spec.vocab_rows, e))[: spec.vocab_size]
    tokens, wte = graph.embedding("transformer.wte.weight", wte_rows, graph.ids)
    del wte_rows                                        # read again for the head (not held through the layers)
    wpe = b.weight("transformer.wpe.weight", weights.take("transformer.wpe.weight", (spec.max_position_embeddings, e)))
    positions = graph.positions
    if graph.kv_slots > spec.max_position_embeddings:
        # pad rows the runtime writes after a row's last position may lie beyond the table; their K/V are scratch
        positions = b.op("Min", positions, b.const(spec.max_position_embeddings - 1))
    x = b.op("Add", tokens, b.op("Gather", wpe, positions))                           # [B, T, E]
    for i in range(spec.num_layers):
        p = f"transformer.h.{i}"
        qkv = conv1d(graph.layer_norm(x, f"{p}.ln_1", weights), f"{p}.attn.c_attn", e, 3 * e)
        context = graph.attention(i, qkv)
        x = b.op("Add", x, conv1d(context, f"{p}.attn.c_proj", e, e))
        h = conv1d(graph.layer_norm(x, f"{p}.ln_2", weights), f"{p}.mlp.c_fc", e, f)
        h = graph.gelu(h, exact=spec.activation == "gelu")
        x = b.op("Add", x, conv1d(h, f"{p}.mlp.c_proj", f, e))
    weights.drop("lm_head.weight")
    head = weights.again("transformer.wte.weight", (spec.vocab_rows, e))[: spec.vocab_size]
    graph.logits(graph.layer_norm(x, "transformer.ln_f", weights), head, tied_embedding=wte)
