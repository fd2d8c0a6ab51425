"""Llama-family decoders (Llama, Mistral, Qwen2, Qwen3, Phi-3, Granite, OLMo 2 and 3, SmolLM3, EXAONE 4, HunYuan):
RMSNorm, RoPE, GQA, SwiGLU, optional q/k/v biases, optional per-head q/k norms (Qwen3, EXAONE 4; HunYuan after RoPE,
with a fixed NTK alpha); Phi-3's fused q/k/v and gate/up weights, LongRoPE and partial rotary dims; Granite's
multipliers; norms after attention and MLP (OLMo, EXAONE 4), OLMo's over whole q and k, OLMo 3's sliding layers with
their own rope; layers without RoPE (SmolLM3, EXAONE 4's full-attention layers)."""

from __future__ import annotations

import numpy as np

from specedge.errors import ExportError
from specedge.models.spec import ModelSpec, rope_from_config, ropes_by_layer_type, rotary_dim_of
from specedge.models.weights import WeightTable


def spec_from_config(cfg: dict, architecture: str) -> ModelSpec:
    heads = cfg["num_attention_heads"]
    hidden = cfg["hidden_size"]
    if cfg.get("hidden_act", "silu") != "silu":
        raise ExportError(f"{architecture}: activation '{cfg.get('hidden_act')}' is not supported (only silu)")
    qkv_bias = architecture == "Qwen2ForCausalLM" or bool(cfg.get("attention_bias", False))
    window, sliding = _sliding(cfg, architecture)
    phi3, granite, olmo3 = (architecture == name for name in ("Phi3ForCausalLM", "GraniteForCausalLM",
                                                                "Olmo3ForCausalLM"))
    olmo, exaone4 = olmo3 or architecture == "Olmo2ForCausalLM", architecture == "Exaone4ForCausalLM"
    hunyuan = architecture == "HunYuanDenseV1ForCausalLM"
    rope, rope_local = ropes_by_layer_type(cfg, architecture) if olmo3 else \
        (rope_from_config(cfg, partial_rotary=phi3), {})
    if hunyuan and rope.get("type") == "dynamic" and rope.get("alpha"):
        # transformers' HunYuan reads a fixed alpha as static NTK scaling, whatever "dynamic" its checkpoints say
        rope = {"type": "ntk_alpha", "theta": rope["theta"], "alpha": rope["alpha"]}
    head_dim = cfg.get("head_dim") or hidden // heads
    return ModelSpec(
        architecture=architecture, family="llama", vocab_rows=cfg["vocab_size"], hidden_size=hidden,
        num_layers=cfg["num_hidden_layers"], num_heads=heads,
        num_kv_heads=cfg.get("num_key_value_heads") or heads,
        head_dim=head_dim, intermediate_size=cfg["intermediate_size"],
        norm_eps=float(cfg["rms_norm_eps"]), max_position_embeddings=cfg.get("max_position_embeddings", 2048),
        tied_embeddings=bool(cfg.get("tie_word_embeddings", False)), qkv_bias=qkv_bias,
        o_bias=architecture != "Qwen2ForCausalLM" and bool(cfg.get("attention_bias", False)),
        mlp_bias=bool(cfg.get("mlp_bias", False)), activation="silu", rope=rope, rope_local=rope_local,
        qk_norm=architecture == "Qwen3ForCausalLM" or exaone4 or hunyuan, qk_norm_after_rope=hunyuan,
        sliding_window=window, sliding_layers=sliding,
        rotary_dim=rotary_dim_of(cfg, head_dim) if phi3 else head_dim, qk_norm_whole=olmo, post_norms=olmo or exaone4,
        **(_granite_scales(cfg) if granite else {}), nope_layers=_nope_layers(cfg, architecture),
    )


def _nope_layers(cfg: dict, architecture: str) -> list[int]:
    """The layers that run without RoPE: SmolLM3's marked 0 in no_rope_layers (every fourth by default);
    EXAONE 4's full-attention layers where it has sliding ones."""
    if architecture == "SmolLM3ForCausalLM":
        return [i for i, use_rope in enumerate(cfg.get("no_rope_layers") or []) if not use_rope]
    if architecture == "Exaone4ForCausalLM" and cfg.get("sliding_window"):
        return [i for i, kind in enumerate(cfg.get("layer_types") or []) if kind != "sliding_attention"]
    return []


def _granite_scales(cfg: dict) -> dict:
    """Granite's four multipliers as spec fields: embeddings, attention scores, residual branches, logits."""
    return {"embed_scale": float(cfg.get("embedding_multiplier", 1.0)),
            "attention_scale": float(cfg.get("attention_multiplier", 1.0)),
            "residual_scale": float(cfg.get("residual_multiplier", 1.0)),
            "logit_divisor": float(cfg.get("logits_scaling", 1.0))}


def _sliding(cfg: dict, architecture: str) -> tuple[int, list[int]]:
    """(window, the layers it applies to) where transformers applies one: Mistral and Phi-3 every layer; Qwen2,
    Qwen3, OLMo 3, SmolLM3 and EXAONE 4 the layers its layer_types say (Qwen: from max_window_layers on, with
    use_sliding_window); (0, []) for none. Llama never does, whatever a converted config.json leaves in
    `sliding_window`."""
    window, types = cfg.get("sliding_window"), cfg.get("layer_types")
    if architecture in ("MistralForCausalLM", "Phi3ForCausalLM"):
        sliding = list(range(cfg["num_hidden_layers"]))
    elif architecture in ("Qwen2ForCausalLM", "Qwen3ForCausalLM", "Olmo3ForCausalLM", "SmolLM3ForCausalLM",
                          "Exaone4ForCausalLM") and isinstance(types, list):
        sliding = [i for i, kind in enumerate(types) if kind == "sliding_attention"]
    else:
        sliding = []
    return (int(window), sliding) if window and sliding else (0, [])


def build(graph, spec: ModelSpec, weights: WeightTable) -> None:
    b, e, d = graph.b, spec.hidden_size, spec.head_dim
    hunyuan = spec.architecture == "HunYuanDenseV1ForCausalLM"
    q_out, kv_out = spec.num_heads * d, spec.num_kv_heads * d

    def part(prefix: str, n_in: int, n_out: int, has_bias: bool) -> tuple:
        bias = weights.take(f"{prefix}.bias", (n_out,)) if has_bias else None
        return prefix, weights.take(f"{prefix}.weight", (n_out, n_in)), bias

    def linear(x: str, prefix: str, n_in: int, n_out: int, has_bias: bool) -> str:
        return graph.linear(x, *part(prefix, n_in, n_out, has_bias))

    def rms_norm(x: str, name: str) -> str:
        return graph.rms_norm(x, name, weights.take(name, (e,)))

    def head_norms(p: str) -> list[tuple[str, np.ndarray]] | None:
        """The RMSNorms of q and of k, [(name, weight)] for q then k: of each head (Qwen3, weight [D]) or of the
        whole projection (OLMo 2, weights [H*D] and [H_kv*D]); HunYuan names them query/key_layernorm."""
        names = [f"{p}.self_attn.{which}" for which in (("query_layernorm.weight", "key_layernorm.weight")
                                                         if hunyuan else ("q_norm.weight", "k_norm.weight"))]
        if spec.qk_norm_whole:
            return [(name, weights.take(name, (n,))) for name, n in zip(names, (q_out, kv_out))]
        return [(name, weights.take(name, (d,))) for name in names] if spec.qk_norm else None

    def scaled(x: str, name: str, factor: float) -> str:
        """x times a Python float, as torch multiplies a tensor by one: in float32, rounded once to the graph's dtype
        (not times the factor rounded to bfloat16 first)."""
        factor = b.const(np.float32(factor), np.float32, name, keep=True)
        return b.from_float32(b.op("Mul", b.to_float32(x), factor))

    def residual_add(x: str, branch: str, norm: str) -> str:
        """x + the branch's output: normed first where the model norms outputs (OLMo 2), scaled (Granite)."""
        if spec.post_norms:
            branch = rms_norm(branch, norm)
        if spec.residual_scale != 1.0:
            branch = scaled(branch, "residual_scale", spec.residual_scale)
        return b.op("Add", x, branch)

    def input_norm(x: str, norm: str) -> str:
        return x if spec.post_norms else rms_norm(x, norm)

    def fused(h: str, name: str, parts: list[tuple[str, int]], has_bias: bool) -> str:
        """One product for several projections of h: Phi-3's checkpoint stores them fused under `name` (rows in
        the order of parts), the others as one module per part."""
        if spec.architecture == "Phi3ForCausalLM":
            return linear(h, name, e, sum(n for _, n in parts), has_bias)
        prefix = name.rsplit(".", 1)[0]
        return graph.fused_linear(h, name, [part(f"{prefix}.{part_name}", e, n, has_bias) for part_name, n in parts])

    embed_rows = weights.take("model.embed_tokens.weight", (spec.vocab_rows, e))[: spec.vocab_size]
    x, embed = graph.embedding("model.embed_tokens.weight", embed_rows, graph.ids)    # [B, T, E]
    del embed_rows
    if spec.embed_scale != 1.0:                                     # Granite's embedding_multiplier
        x = scaled(x, "embed_scale", spec.embed_scale)
    for i in range(spec.num_layers):
        p = f"model.layers.{i}"
        # OLMo 2 norms the attention's output with the norm named post_attention_layernorm (Llama: the MLP's input)
        attention_norm, mlp_norm = ((f"{p}.post_attention_layernorm.weight", f"{p}.post_feedforward_layernorm.weight")
                                    if spec.post_norms else
                                    (f"{p}.input_layernorm.weight", f"{p}.post_attention_layernorm.weight"))
        h = input_norm(x, attention_norm)
        qkv = fused(h, f"{p}.self_attn.qkv_proj", [("q_proj", q_out), ("k_proj", kv_out), ("v_proj", kv_out)],
                    spec.qkv_bias)
        context = graph.attention(i, qkv, head_norms(p))
        x = residual_add(x, linear(context, f"{p}.self_attn.o_proj", q_out, e, spec.o_bias), attention_norm)
        h = input_norm(x, mlp_norm)
        gate_up = fused(h, f"{p}.mlp.gate_up_proj", [("gate_proj", spec.intermediate_size),
                                                      ("up_proj", spec.intermediate_size)], spec.mlp_bias)
        gate, up = graph.split(gate_up, [spec.intermediate_size] * 2)
        act = b.op("Mul", b.op("Mul", gate, b.op("Sigmoid", gate)), up)                  # silu(gate) * up
        x = residual_add(x, linear(act, f"{p}.mlp.down_proj", spec.intermediate_size, e, spec.mlp_bias), mlp_norm)
    lm_head(graph, spec, weights, rms_norm(x, "model.norm.weight"), embed)


def lm_head(graph, spec: ModelSpec, weights: WeightTable, x: str, embed: str | None) -> None:
    """The logits of the final hidden states x: through the embedding where the head is tied to it (lm_head.weight,
    if the checkpoint repeats it, left unused; the embedding's rows read again here rather than held through the
    layers: 2.2 GB for a 7B), else through lm_head.weight (padding rows sliced off)."""
    if spec.tied_embeddings:
        weights.drop("lm_head.weight")
        rows = weights.again("model.embed_tokens.weight", (spec.vocab_rows, spec.hidden_size))[: spec.vocab_size]
        graph.logits(x, rows, tied_embedding=embed)
    else:
        graph.logits(x, weights.take("lm_head.weight", (spec.vocab_rows, spec.hidden_size))[: spec.vocab_size])
