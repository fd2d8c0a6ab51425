"""Whether a target's verify rows equal its single steps, bit for bit, on this machine.

Export checks this on the machine that exports; a bundle may run elsewhere, and onnxruntime picks
kernels by CPU (MatMulNBits' one-row kernel is another on AVX2 than on AVX-512), so `inspect --verify`
checks again where it runs. If rows differ, greedy speculative output may differ from target-only
output at near-ties.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specedge.runtime.step_model import StepModel

ROWS_CHECK = (7, 4)                   # prefix, then a verify-sized step replayed one token at a time


def verify_rows_bitwise_equal(step: StepModel, ids: list[int]) -> bool:
    """Feeds ids[:prefix], then the next n tokens in one call, then the same n one by one."""
    prefix, n = ROWS_CHECK
    step.pos = 0
    step.feed(ids[:prefix])
    together = step.feed(ids[prefix: prefix + n]).copy()
    step.pos = prefix
    alone = np.concatenate([step.feed([t]).copy() for t in ids[prefix: prefix + n]])
    return bool(np.array_equal(together, alone))


def bundle_rows_bitwise_equal(bundle: Path, manifest: dict, role: str = "target", seed: int = 0) -> bool:
    entry = manifest["models"][role]
    vocab = entry.get("logit_rows", manifest["vocab_size"])
    step = StepModel(Path(bundle) / entry["file"], entry, manifest["max_seq_len"], vocab, max_step=max(ROWS_CHECK))
    ids = np.random.default_rng(seed).integers(0, manifest["vocab_size"], size=sum(ROWS_CHECK)).tolist()
    return verify_rows_bitwise_equal(step, ids)
