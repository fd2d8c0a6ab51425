"""Whether a model's verify rows equal its single steps, bit for bit, on this machine.

Export checks this on the machine that exports; a bundle may run elsewhere, and onnxruntime picks
kernels by CPU (MatMulNBits' one-row kernel differs from its multi-row one on an AVX2 EPYC, not on an
AVX-512 Xeon), so the runtime measures at load whether a lone token may run as one row or must be padded
to two (ModelBackend.min_rows); `inspect --verify` checks again where it runs. If rows differ, greedy
speculative output may differ from target-only output at near-ties.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specedge.errors import BundleError
from specedge.runtime.backends import open_backend
from specedge.runtime.backends.base import ModelBackend, SlotCursor, decode_width

ROWS_CHECK = (7, 4)                   # prefix, then a verify-sized step replayed one token at a time
ODD_STEP = 3                          # and an odd-sized one: the last row of an odd call may take the one-row kernel


def verify_rows_bitwise_equal(cursor: SlotCursor, ids: list[int], role: str = "model") -> bool:
    """Feeds ids[:prefix], then the next n tokens in one call, then the same n one by one; the same for the first
    ODD_STEP of them in one call. Non-finite logits are a BundleError naming `role`."""
    prefix, n = ROWS_CHECK
    cursor.pos = 0
    cursor.feed(ids[:prefix])
    together = require_finite(cursor.feed(ids[prefix: prefix + n]).copy(), role)
    cursor.pos = prefix
    odd = cursor.feed(ids[prefix: prefix + ODD_STEP]).copy()
    cursor.pos = prefix
    alone = np.concatenate([cursor.feed([t]).copy() for t in ids[prefix: prefix + n]])
    return bool(np.array_equal(together, alone) and np.array_equal(odd, alone[:ODD_STEP]))


def require_finite(logits: np.ndarray, role: str) -> np.ndarray:
    """Greedy decoding of NaN logits picks token 0 every time and sampling divides by NaN: refuse at load instead."""
    if not np.isfinite(logits).all():
        raise BundleError(f"{role}: its logits on a probe prompt are not finite (NaN or inf): the weights are "
                          "damaged or a float16 graph overflows; re-export the bundle (fp32 if float16)")
    return logits


def check_finite(backend: ModelBackend, vocab_size: int, role: str, slot: int = 0) -> None:
    """Where the rows are not probed (target_rows forced to 2): the probe's first call alone."""
    cursor = SlotCursor(backend, slot)
    require_finite(cursor.feed(probe_ids(vocab_size)), role)


def probe_ids(vocab_size: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size, size=sum(ROWS_CHECK)).tolist()


def choose_min_rows(backend: ModelBackend, vocab_size: int, slot: int = 0, role: str = "model") -> int:
    """1 where a lone row already equals verify rows on this machine (the faster step), else 2. Sets it."""
    backend.min_rows = 1
    if not verify_rows_bitwise_equal(SlotCursor(backend, slot), probe_ids(vocab_size), role):
        backend.min_rows = 2
    return backend.min_rows


def bundle_rows_bitwise_equal(bundle: Path, manifest: dict, role: str = "target", seed: int = 0,
                              backend: str = "cpu", device_id: int = 0, **backend_options) -> tuple[bool, int]:
    """-> (rows equal, min_rows) with the min_rows the runtime would choose here (GPU backends: at the fixed
    decode width the runtime gives them)."""
    entry = manifest["models"][role]
    options = {}
    if backend in ("cuda", "tensorrt"):
        options = {"device_id": device_id, "width": decode_width(manifest["max_draft"], role)}
    model = open_backend(backend, Path(bundle) / entry["file"], entry, manifest["max_seq_len"], max_step=max(ROWS_CHECK),
                         **{**options, **backend_options})
    rows = choose_min_rows(model, manifest["vocab_size"], role=role)
    return verify_rows_bitwise_equal(SlotCursor(model), probe_ids(manifest["vocab_size"], seed), role), rows
