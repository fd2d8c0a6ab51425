"""The architecture-independent description of a decoder the step graph needs."""

from __future__ import annotations

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
    activation: str = "silu"
    rope: dict = field(default_factory=dict)   # {"type", "theta", ...}; empty for learned positions
    vocab_size: int = 0        # rows kept in the graph: the bundle vocabulary (padding rows sliced off)

    def __post_init__(self):
        self.vocab_size = self.vocab_size or self.vocab_rows

    def to_json(self) -> dict:
        return asdict(self)


def rope_inv_freq(rope: dict, head_dim: int) -> np.ndarray:
    """Inverse frequencies [head_dim // 2] for the rope settings a config carries."""
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
    raise ExportError(f"rope scaling type '{kind}' is not supported (supported: default, linear, llama3)")


def rope_from_config(cfg: dict) -> dict:
    """Reads rope settings from either the v4 (`rope_theta`, `rope_scaling`) or v5 (`rope_parameters`) keys."""
    params = dict(cfg.get("rope_parameters") or {})
    scaling = cfg.get("rope_scaling") or {}
    params.update({k: v for k, v in scaling.items() if k not in params})
    theta = params.get("rope_theta", cfg.get("rope_theta", 10000.0))
    kind = params.get("rope_type", params.get("type", "default"))
    rope = {"type": kind, "theta": float(theta)}
    for key in ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"):
        if key in params:
            rope[key] = params[key]
    if cfg.get("partial_rotary_factor", 1.0) != 1.0:
        raise ExportError("partial rotary embeddings are not supported")
    return rope
