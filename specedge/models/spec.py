"""The architecture-independent description of a decoder the step graph needs."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import numpy as np

from specedge.errors import ExportError


@dataclass
class ModelSpec:
    architecture: str          # HF `architectures[0]`, e.g. "Qwen2ForCausalLM"
    family: str                # which layer builder: "llama" (RMSNorm, RoPE, SwiGLU) or "gpt2"
    vocab_rows: int            # embedding rows in the source
    hidden_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    max_position_embeddings: int
    tied_embeddings: bool
    qkv_bias: bool = False
    o_bias: bool = False
    mlp_bias: bool = False
    qk_norm: bool = False      # an RMSNorm of each q and k head before RoPE (Qwen3, Gemma 3)
    qk_norm_whole: bool = False     # one RMSNorm over all of q's (k's) projection before RoPE instead (OLMo 2)
    qk_norm_after_rope: bool = False    # the per-head q/k norms come after RoPE, not before (HunYuan)
    post_norms: bool = False   # RMSNorm of the attention's and the MLP's outputs before their residual adds, none
                               # of their inputs (OLMo 2)
    embed_scale: float = 1.0   # embeddings times this (Gemma: sqrt(hidden_size); Granite: embedding_multiplier)
    residual_scale: float = 1.0     # attention and MLP outputs times this before their residual adds (Granite)
    logit_divisor: float = 1.0      # logits divided by this (Granite's logits_scaling)
    attention_scale: float = 0.0    # scores times this; 0: 1 / sqrt(head_dim)
    attn_softcap: float = 0.0  # scores -> cap * tanh(scores / cap) before the mask (Gemma 2); 0: none
    logit_softcap: float = 0.0      # logits likewise (Gemma 2); 0: none
    sliding_window: int = 0    # the sliding layers see the last `sliding_window` positions, their own included
    sliding_layers: list = field(default_factory=list)
    rope_local: dict = field(default_factory=dict)    # the sliding layers' own rope (Gemma 3); empty: `rope`
    nope_layers: list = field(default_factory=list)   # layers whose q and k get no RoPE at all (SmolLM3)
    activation: str = "silu"
    rope: dict = field(default_factory=dict)   # {"type", "theta", ...}; empty for learned positions
    vocab_size: int = 0        # rows kept in the graph: the bundle vocabulary (padding rows sliced off)
    rotary_dim: int = 0        # the leading dims of each q/k head RoPE turns (Phi-4-mini: 3/4 of them); 0: all

    def __post_init__(self):
        self.vocab_size = self.vocab_size or self.vocab_rows
        self.rotary_dim = self.rotary_dim or self.head_dim

    def to_json(self) -> dict:
        return asdict(self)

    @property
    def matrix_input_sizes(self) -> list[int]:
        """The K (input width) of every weight matrix the step graph multiplies with: where quantization blocks
        are cut."""
        return [self.hidden_size, self.num_heads * self.head_dim, self.intermediate_size]


def rope_inv_freq(rope: dict, head_dim: int) -> np.ndarray:
    """Inverse frequencies [head_dim // 2] for the rope settings a config carries (head_dim: the dims it turns)."""
    exponent = np.arange(0, head_dim, 2, dtype=np.int64).astype(np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / (np.float32(rope["theta"]) ** exponent)).astype(np.float32)
    kind = rope.get("type", "default")
    if kind == "default":
        return inv_freq
    if kind == "linear":
        return (inv_freq / np.float32(rope["factor"])).astype(np.float32)
    if kind == "llama3":
        factor = rope["factor"]
        low, high = rope["low_freq_factor"], rope["high_freq_factor"]
        old_len = rope["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * np.pi / inv_freq
        scaled = np.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        return np.where(medium, smoothed, scaled).astype(np.float32)
    if kind == "yarn":
        return _yarn_inv_freq(rope, inv_freq, head_dim)
    if kind == "longrope":
        return _longrope_inv_freq(rope, exponent, head_dim)
    if kind == "ntk_alpha":                 # HunYuan: a fixed NTK alpha stretches the base, whatever the length
        base = rope["theta"] * rope["alpha"] ** (head_dim / (head_dim - 2))
        return (1.0 / (np.float32(base) ** exponent)).astype(np.float32)
    raise ExportError(f"rope scaling type '{kind}' is not supported (supported: default, linear, dynamic within the "
                      "trained length, llama3, yarn, longrope, HunYuan's NTK alpha)")


def _longrope_inv_freq(rope: dict, exponent: np.ndarray, head_dim: int) -> np.ndarray:
    """LongRoPE (Phi-3, Phi-4-mini): each frequency divided by its own factor, from `short_factor`, or `long_factor`
    where the export chose the long set (`long`: a buffer past the original length, see pipeline)."""
    which = "long_factor" if rope.get("long") else "short_factor"
    factors = np.asarray(rope.get(which) or [], dtype=np.float32)
    if factors.shape != (head_dim // 2,):
        raise ExportError(f"longrope {which} has {factors.size} values; the {head_dim} rotary dims need "
                          f"{head_dim // 2}")
    return (np.float32(1) / (factors * (np.float32(rope["theta"]) ** exponent))).astype(np.float32)


def _yarn_inv_freq(rope: dict, inv_freq: np.ndarray, head_dim: int) -> np.ndarray:
    """YaRN (arxiv 2309.00071), as transformers computes it: frequencies that turn fewer than `beta_slow` times over
    the original length are interpolated (divided by factor), those turning more than `beta_fast` times are kept,
    a linear ramp over the dimensions between."""
    theta, factor, original = rope["theta"], rope["factor"], rope["original_max_position_embeddings"]
    beta_fast, beta_slow = rope.get("beta_fast") or 32, rope.get("beta_slow") or 1

    def dimension(rotations: float) -> float:          # the dimension that turns `rotations` times over `original`
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low, high = dimension(beta_fast), dimension(beta_slow)
    if rope.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    high = high + 0.001 if low == high else high
    ramp = np.clip((np.arange(head_dim // 2, dtype=np.float32) - low) / (high - low), 0, 1).astype(np.float32)
    keep = np.float32(1) - ramp                          # 1: extrapolate (keep the frequency), 0: interpolate
    interpolated = (np.float32(1) / (np.float32(factor) / inv_freq)).astype(np.float32)
    return (interpolated * (1 - keep) + inv_freq * keep).astype(np.float32)


def rope_attention_factor(rope: dict) -> float:
    """What cos and sin are multiplied by: 1, YaRN's attention temperature (0.1 ln(factor) + 1 by default) or
    LongRoPE's (sqrt(1 + ln(factor) / ln(original length)) by default), as transformers computes them."""
    if rope.get("type") not in ("yarn", "longrope"):
        return 1.0
    if rope.get("attention_factor") is not None:
        return float(rope["attention_factor"])
    if rope["type"] == "longrope":
        factor, original = rope["factor"], rope["original_max_position_embeddings"]
        return math.sqrt(1 + math.log(factor) / math.log(original)) if factor > 1 else 1.0

    def mscale(scale: float, m: float = 1.0) -> float:
        return 0.1 * m * math.log(scale) + 1.0 if scale > 1 else 1.0

    factor, m, m_all = rope["factor"], rope.get("mscale"), rope.get("mscale_all_dim")
    return mscale(factor, m) / mscale(factor, m_all) if m and m_all else mscale(factor)


def rope_from_config(cfg: dict, partial_rotary: bool = False) -> dict:
    """Reads rope settings from either the v4 (`rope_theta`, `rope_scaling`) or v5 (`rope_parameters`) keys.
    partial_rotary: the architecture turns only part of each head (`rotary_dim_of`); elsewhere a partial factor is
    refused."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params.update({k: v for k, v in scaling.items() if k not in params})
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    rope = {"type": kind, "theta": float(theta)}
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings",
                "beta_fast", "beta_slow", "attention_factor", "mscale", "mscale_all_dim", "truncate",
                "short_factor", "long_factor", "alpha"):
        if params.get(key) is not None:
            rope[key] = params[key]
    if kind == "longrope" and "original_max_position_embeddings" not in rope:
        rope["original_max_position_embeddings"] = cfg.get("original_max_position_embeddings") or \
            cfg["max_position_embeddings"]
    if kind in ("yarn", "longrope") and "factor" not in rope:   # as transformers: the ratio of the lengths
        rope["factor"] = cfg["max_position_embeddings"] / rope["original_max_position_embeddings"]
    if not partial_rotary and _partial_rotary_factor(cfg) != 1.0:
        raise ExportError("partial rotary embeddings are not supported for this architecture")
    return rope


def _partial_rotary_factor(cfg: dict) -> float:
    return float(cfg.get("partial_rotary_factor") or (cfg.get("rope_parameters") or {}).get("partial_rotary_factor")
                 or 1.0)


def rotary_dim_of(cfg: dict, head_dim: int) -> int:
    """The leading dims of each head that RoPE turns: head_dim times `partial_rotary_factor`, as transformers."""
    dim = int(head_dim * _partial_rotary_factor(cfg))
    if dim < 2 or dim % 2 or dim > head_dim:
        raise ExportError(f"partial_rotary_factor {_partial_rotary_factor(cfg)} gives {dim} rotary dims of "
                          f"{head_dim}; an even number from 2 to {head_dim} is needed")
    return dim


def ropes_by_layer_type(cfg: dict, architecture: str) -> tuple[dict, dict]:
    """rope_parameters per layer type (Gemma 3, OLMo 3) -> (the full layers' rope, the sliding layers' rope)."""
    params = cfg.get("rope_parameters") or {}
    if "full_attention" not in params:
        raise ExportError(f"{architecture}: rope_parameters per layer type expected (a config from transformers 5)")
    flat = {key: value for key, value in cfg.items() if key not in ("rope_parameters", "rope_scaling", "rope_theta")}
    return tuple(rope_from_config({**flat, "rope_parameters": params[kind]}) if params.get(kind) else {}
                 for kind in ("full_attention", "sliding_attention"))
