"""Whether a target's verify rows equal its single steps, bit for bit, on this machine.

Export checks this on the machine that exports; a bundle may run elsewhere, and onnxruntime picks
kernels by CPU (MatMulNBits' one-row kernel differs from its multi-row one on an AVX2 EPYC, not on an
AVX-512 Xeon), so a quantized target's graph takes min_rows (1 or 2) and the runtime measures at load
which one keeps its rows exact here; `inspect --verify` checks again where it runs. If rows differ,
greedy speculative output may differ from target-only output at near-ties.
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


def probe_ids(vocab_size: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size, size=sum(ROWS_CHECK)).tolist()


def choose_min_rows(step: StepModel, vocab_size: int) -> int:
    """For a graph with a min_rows input (a quantized target): 1 where single rows already equal verify rows
    on this machine (the faster step), else 2. Leaves the model empty (pos 0) and set to the choice."""
    if step.pads_rows:
        step.min_rows = 1
        if not verify_rows_bitwise_equal(step, probe_ids(vocab_size)):
            step.min_rows = 2
    step.pos = 0
    return step.min_rows


def bundle_rows_bitwise_equal(bundle: Path, manifest: dict, role: str = "target", seed: int = 0) -> tuple[bool, int]:
    """-> (rows equal, min_rows) with the min_rows the runtime would choose here."""
    entry = manifest["models"][role]
    vocab = entry.get("logit_rows", manifest["vocab_size"])
    step = StepModel(Path(bundle) / entry["file"], entry, manifest["max_seq_len"], vocab, max_step=max(ROWS_CHECK))
    rows = choose_min_rows(step, manifest["vocab_size"])
    return verify_rows_bitwise_equal(step, probe_ids(manifest["vocab_size"], seed)), rows
