"""Weight-only block quantization into onnxruntime's MatMulNBits layout (com.microsoft).

A weight W [N, K] (out, in) is cut into blocks of `block_size` along K; each block gets a scale and
an integer zero point (float ones, which a GGUF's Q4_K minimums would need, made a 1536 x 8960 MatMulNBits 73x
slower on onnxruntime 1.32's CPU provider: scripts/matmul_nbits_rows.py --float-zero-points). The op computes
A @ ((code - zero_point) * scale)^T. Rounding "minmax" (the default) spreads the levels over the block's range
(which always includes 0); "lsq" starts there and refits scale and zero point by weighted least squares to the
codes, a few rounds, keeping each block's best. On Qwen2.5-Coder 1.5B Q4_K_M (blocks of 32) lsq's weight error is
0.0752 against 0.0827 (experiments/int4_rounding.py); on 4096 tokens of code its top-1 agreement with the
source was 0.906 against 0.899 (sign test p = 0.089) at the same perplexity, and at block 128 its perplexity rose
(docs/int4-rounding.md): hence opt-in.
accuracy_level 4 quantizes the activations to int8 per block inside the op: fastest on CPUs, and its rows do not
depend on how many rows are in the call (measured), which keeps verify rows bitwise equal to single-step rows.
Level 0 computes in float.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import numpy as np

from specedge.errors import ExportError, ExportOptionError

ROWS_PER_CHUNK = 8192                 # dequantize big matrices (the LM head) a slice at a time
ROUNDINGS = ("minmax", "lsq")
LSQ_ROUNDS = 3                        # a 1536 x 8960 Q4_K layer: error 0.0850, 0.0808, 0.0772, 0.0765 (5: 0.0765)
# A draft's rounding changes its speed and acceptance, never the output (the target verifies every token), so its
# default block is the coarsest of these that divides each of its matrices' input sizes (no padded blocks): the
# Qwen2.5-Coder 0.5B int4 draft steps in 0.83x the time at block 128, at the same acceptance (docs/int4-rounding.md)
DRAFT_BLOCK_SIZES = (128, 64, 32)
THREAD_ROWS = 1024                    # rows per task: at K = 8960 a task peaks at ~110 MiB (minmax), ~230 (lsq)
MAX_WORKERS = 4                       # so at most ~0.9 GiB at once, the single 8192-row slice's before threads


@dataclass(frozen=True)
class Quantization:
    bits: int                         # 4 or 8
    block_size: int = 32
    accuracy_level: int = 4
    rounding: str = "minmax"

    def __post_init__(self):
        if self.bits not in (4, 8):
            raise ExportError(f"quantization bits must be 4 or 8, got {self.bits}")
        check_block_size(self.block_size)
        if self.accuracy_level not in range(5):
            raise ExportOptionError(f"--accuracy-level must be 0..4, got {self.accuracy_level}")
        if self.rounding not in ROUNDINGS:
            raise ExportOptionError(f"--rounding must be one of {', '.join(ROUNDINGS)}, got '{self.rounding}'")

    @property
    def name(self) -> str:
        return f"int{self.bits}"

    def to_json(self) -> dict:
        return {"scheme": self.name, "op": "com.microsoft.MatMulNBits", **asdict(self)}


def parse_quantization(name: str | None, block_size: int, accuracy_level: int,
                       rounding: str = "minmax") -> Quantization | None:
    """'none' | 'int4' | 'int8' -> Quantization or None."""
    if name in (None, "none", "fp32", "float32"):
        return None
    if name not in ("int4", "int8"):
        raise ExportError(f"unknown quantization '{name}' (known: none, int4, int8)")
    return Quantization(int(name[3:]), block_size, accuracy_level, rounding)


def check_block_size(block_size: int, option: str = "--block-size") -> None:
    """MatMulNBits takes powers of two from 16; beyond 256 a block spans more than a small model's rows (padded up
    to it: a bundle many times the model) and quantizes no better."""
    if not 16 <= block_size <= 256 or block_size & (block_size - 1):
        raise ExportOptionError(f"{option} must be a power of two from 16 to 256, got {block_size}")


def fitting_block_size(input_sizes: list[int]) -> int:
    """The largest of DRAFT_BLOCK_SIZES dividing every size (32, padded, where none does)."""
    return next((b for b in DRAFT_BLOCK_SIZES if all(k % b == 0 for k in input_sizes)), DRAFT_BLOCK_SIZES[-1])


def quantize(weight: np.ndarray, q: Quantization) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """W [N, K] float -> (codes uint8 [N, blocks, block_size*bits/8], scales float [N*blocks],
    zero points uint8 [N * ceil(blocks*bits/8)]). Slices of rows run on all cores (numpy releases the GIL)."""
    n, k = weight.shape
    blocks = -(-k // q.block_size)
    codes = np.empty((n, blocks, q.block_size * q.bits // 8), np.uint8)
    scales = np.empty((n, blocks), np.float32)
    zero_points = np.empty((n, -(-blocks * q.bits // 8)), np.uint8)

    def run(start):
        rows = slice(start, min(start + THREAD_ROWS, n))
        codes[rows], scales[rows], zero_points[rows] = _quantize_rows(weight[rows], q, blocks)

    starts = range(0, n, THREAD_ROWS)
    if len(starts) == 1:
        run(0)
    else:
        with ThreadPoolExecutor(min(len(starts), _usable_cores(), MAX_WORKERS)) as pool:
            list(pool.map(run, starts))                              # list(): re-raises a worker's exception
    return codes, scales.reshape(-1), zero_points.reshape(-1)


def _usable_cores() -> int:
    """The cores this process may run on (a container's or taskset's limit, where the OS tells it), else all."""
    affinity = getattr(os, "sched_getaffinity", None)                 # Linux; not macOS or Windows
    return len(affinity(0)) if affinity else os.cpu_count() or 1


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
    levels = 2 ** q.bits - 1
    scale, zp = _minmax_fit(x, levels)
    if q.rounding == "lsq":
        scale, zp = _least_squares_fit(x, scale, zp, levels)
    values = _codes(x, scale, zp, levels).astype(np.uint8)
    zp = zp.astype(np.uint8)
    if q.bits == 4:                                                                  # two codes a byte, low first
        values = values[..., 0::2] | (values[..., 1::2] << 4)
        if blocks % 2:
            zp = np.concatenate([zp, np.zeros((n, 1), np.uint8)], axis=1)
        zp = zp[:, 0::2] | (zp[:, 1::2] << 4)
    return values, scale, zp


def _minmax_fit(x: np.ndarray, levels: int) -> tuple[np.ndarray, np.ndarray]:
    """x [n, blocks, block] -> scale, zero point [n, blocks] (float32; the zero point integral): the levels spread
    over the block's range widened to include 0, so 0 is exact."""
    top = np.maximum(x.max(-1), 0.0)
    bottom = np.minimum(x.min(-1), 0.0)
    scale = (top - bottom) / levels
    scale[scale == 0] = 1.0
    return scale, np.clip(np.rint(-bottom / scale), 0, levels)


def _codes(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, levels: int) -> np.ndarray:
    return np.clip(np.rint(x / scale[..., None] + zp[..., None]), 0, levels)


def _squared_error(x, scale, zp, codes, weight) -> np.ndarray:
    """-> [n, blocks]: each block's weighted squared error."""
    return (weight * np.square((codes - zp[..., None]) * scale[..., None] - x)).sum(-1)


def _least_squares_fit(x: np.ndarray, scale: np.ndarray, zp: np.ndarray, levels: int):
    """Alternate: codes from (scale, zero point); the line x ~ scale * code + offset fitted to them by least squares;
    the zero point -offset / scale rounded (the op takes integers) and the scale refitted for it. Each value weighs
    the block's RMS plus its own magnitude (llama.cpp's weighting for Q4_K): unweighted, the fit clipped the
    largest values and perplexity rose (docs/int4-rounding.md). Each block keeps the best (scale, zero point) it
    met, so its weighted error never exceeds min-max's. A block of one repeated code has no line: it keeps its scale."""
    weight = np.sqrt(np.square(x).mean(-1, keepdims=True)) + np.abs(x)             # [n, blocks, block]
    count, sum_x = weight.sum(-1), (weight * x).sum(-1)
    codes = _codes(x, scale, zp, levels)
    best_error = _squared_error(x, scale, zp, codes, weight)
    best_scale, best_zp = scale.copy(), zp.copy()
    for _ in range(LSQ_ROUNDS):
        weighted_codes = weight * codes
        sum_c, sum_cc = weighted_codes.sum(-1), (weighted_codes * codes).sum(-1)
        sum_xc = (weighted_codes * x).sum(-1)
        det = count * sum_cc - sum_c * sum_c
        fitted = det > 0                           # false for an all-zero block (no weight) and one repeated code
        slope = np.where(fitted, (count * sum_xc - sum_c * sum_x) / np.where(fitted, det, 1), scale)
        slope = np.where(slope > 0, slope, scale)
        offset = (sum_x - slope * sum_c) / np.where(fitted, count, 1)
        zp = np.where(fitted, np.clip(np.rint(-offset / slope), 0, levels), zp)
        # the best scale for that zero point: sum w x (c - z) / sum w (c - z)^2
        spread = sum_cc - 2 * zp * sum_c + count * zp * zp
        scale = np.where(spread > 0, (sum_xc - zp * sum_x) / np.where(spread > 0, spread, 1), slope)
        scale = np.where(scale > 0, scale, slope).astype(np.float32)
        codes = _codes(x, scale, zp, levels)
        error = _squared_error(x, scale, zp, codes, weight)
        better = error < best_error
        best_error[better], best_scale[better], best_zp[better] = error[better], scale[better], zp[better]
    return best_scale, best_zp
