"""Weight-only block quantization into onnxruntime's MatMulNBits layout (com.microsoft).

A weight W [N, K] (out, in) is cut into blocks of `block_size` along K; each block gets a scale and
a zero point, asymmetric over the block's range (which always includes 0). The op computes
A @ ((code - zero_point) * scale)^T. accuracy_level 4 quantizes the activations to int8 per block
inside the op: fastest on CPUs, and its rows do not depend on how many rows are in the call
(measured), which keeps verify rows bitwise equal to single-step rows. Level 0 computes in float.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from specedge.errors import ExportError, ExportOptionError

ROWS_PER_CHUNK = 8192                 # quantize big matrices (the LM head) a slice at a time


@dataclass(frozen=True)
class Quantization:
    bits: int                         # 4 or 8
    block_size: int = 32
    accuracy_level: int = 4

    def __post_init__(self):
        if self.bits not in (4, 8):
            raise ExportError(f"quantization bits must be 4 or 8, got {self.bits}")
        # MatMulNBits takes powers of two from 16; beyond 256 a block spans more than a small model's rows (padded
        # up to it: a bundle many times the model) and quantizes no better
        if not 16 <= self.block_size <= 256 or self.block_size & (self.block_size - 1):
            raise ExportOptionError(f"--block-size must be a power of two from 16 to 256, got {self.block_size}")
        if self.accuracy_level not in range(5):
            raise ExportOptionError(f"--accuracy-level must be 0..4, got {self.accuracy_level}")

    @property
    def name(self) -> str:
        return f"int{self.bits}"

    def to_json(self) -> dict:
        return {"scheme": self.name, "op": "com.microsoft.MatMulNBits", **asdict(self)}


def parse_quantization(name: str | None, block_size: int, accuracy_level: int) -> Quantization | None:
    """'none' | 'int4' | 'int8' -> Quantization or None."""
    if name in (None, "none", "fp32", "float32"):
        return None
    if name not in ("int4", "int8"):
        raise ExportError(f"unknown quantization '{name}' (known: none, int4, int8)")
    return Quantization(int(name[3:]), block_size, accuracy_level)


def quantize(weight: np.ndarray, q: Quantization) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W [N, K] float -> (codes uint8 [N, blocks, block_size*bits/8], scales float [N*blocks],
    zero points uint8 [N * ceil(blocks*bits/8)])."""
    n, k = weight.shape
    blocks = -(-k // q.block_size)
    codes = np.empty((n, blocks, q.block_size * q.bits // 8), np.uint8)
    scales = np.empty((n, blocks), np.float32)
    zero_points = np.empty((n, -(-blocks * q.bits // 8)), np.uint8)
    for start in range(0, n, ROWS_PER_CHUNK):
        rows = slice(start, min(start + ROWS_PER_CHUNK, n))
        codes[rows], scales[rows], zero_points[rows] = _quantize_rows(weight[rows], q, blocks)
    return codes, scales.reshape(-1), zero_points.reshape(-1)


def dequantize(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, k: int, q: Quantization) -> np.ndarray:
    """The inverse, for checks: -> W' [N, K] float32, what MatMulNBits multiplies with (a slice of rows at a time:
    the temporaries of a whole LM head were three times its float32 size)."""
    n, blocks, _ = codes.shape
    scales, zero_points = scales.reshape(n, blocks), zero_points.reshape(n, -1)
    out = np.empty((n, k), np.float32)
    for start in range(0, n, ROWS_PER_CHUNK):
        rows = slice(start, min(start + ROWS_PER_CHUNK, n))
        out[rows] = _dequantize_rows(codes[rows], scales[rows], zero_points[rows], k, q)
    return out


def _dequantize_rows(codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray, k: int, q: Quantization):
    n, blocks, _ = codes.shape
    if q.bits == 4:
        values = np.stack([codes & 0x0F, codes >> 4], axis=-1).reshape(n, blocks, q.block_size)
        zp = np.stack([zero_points & 0x0F, zero_points >> 4], axis=-1).reshape(n, -1)[:, :blocks]
    else:
        values, zp = codes, zero_points
    w = (values.astype(np.float32) - zp[..., None]) * scales[..., None]
    return w.reshape(n, -1)[:, :k]


def _quantize_rows(w: np.ndarray, q: Quantization, blocks: int):
    n, k = w.shape
    padded = np.zeros((n, blocks * q.block_size), np.float32)
    padded[:, :k] = w
    x = padded.reshape(n, blocks, q.block_size)                                      # [n, blocks, block]
    top = np.maximum(x.max(-1), 0.0)
    bottom = np.minimum(x.min(-1), 0.0)
    levels = 2 ** q.bits - 1
    scale = (top - bottom) / levels
    scale[scale == 0] = 1.0
    zp = np.clip(np.rint(-bottom / scale), 0, levels)
    values = np.clip(np.rint(x / scale[..., None] + zp[..., None]), 0, levels).astype(np.uint8)
    zp = zp.astype(np.uint8)
    if q.bits == 4:                                                                  # two codes a byte, low first
        values = values[..., 0::2] | (values[..., 1::2] << 4)
        if blocks % 2:
            zp = np.concatenate([zp, np.zeros((n, 1), np.uint8)], axis=1)
        zp = zp[:, 0::2] | (zp[:, 1::2] << 4)
    return values, scale, zp
