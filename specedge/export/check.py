"""Checks an exported step graph against the source model run by transformers itself.

The graph is driven the way the runtime drives it, through the runtime's CPU backend: a prefill chunk
into an empty buffer, then multi-token steps into the partly filled buffer. transformers runs the whole
sequence at once; with causal attention its logits at each position must equal ours. A quantized graph
is held to the same tolerance against transformers running the dequantized weights (what the graph
multiplies with), and its cost in accuracy is measured against the unquantized model on a few real
prompts. Also recorded: whether verify rows equal single steps bit for bit (with the single-step padding
the runtime would choose here), whether the ids output is the logits' argmax, and for graphs that run
batches, whether rows of one call equal the same rows run alone.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specedge.errors import ExportError
from specedge.export import reference_model
from specedge.runtime.backends import open_backend
from specedge.runtime.backends.base import SlotCursor
from specedge.runtime.row_check import choose_min_rows, verify_rows_bitwise_equal

# (prefill chunk, then step sizes): a verify-sized step and single-token draft steps
CHECK_STEPS = (7, 5, 1, 3, 1)
PROMPT_TOKENS = 48                    # per check prompt, teacher-forced
# the batch check: per row (prefix length, tokens in the call, rows wanted); one call carries all three
BATCH_ROWS = ((5, 3, 2), (9, 1, 1), (2, 4, 4))


def reference_logits(model, weights, ids: list[int], vocab_size: int, overrides=None) -> np.ndarray:
    """transformers' logits over `ids` (reference_model.py: `model` a skeleton run on `weights`) -> [len, vocab]"""
    return reference_model.logits(model, weights, [ids], vocab_size, overrides)[0]


def random_ids(vocab_size: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size, size=sum(CHECK_STEPS)).tolist()


def _backend(onnx_path: Path, model_entry: dict, max_seq_len: int, max_step: int, max_batch: int = 1):
    return open_backend("cpu", onnx_path, model_entry, max_seq_len, max_batch=max_batch, threads=None,
                        max_step=max_step)


def check_graph(onnx_path: Path, model_entry: dict, reference: np.ndarray, ids: list[int], vocab_size: int,
                max_seq_len: int, reference_name: str = "", role: str = "model") -> dict:
    """Graph logits over CHECK_STEPS vs the reference's for the same ids; the ids output vs the logits' argmax;
    verify rows vs single steps; and, for a graph that runs batches, rows of one call vs the same rows alone.
    Non-finite logits are an ExportError naming `role` (the row probes would refuse them as a bundle's)."""
    batches = model_entry.get("max_batch") is None
    backend = _backend(onnx_path, model_entry, max_seq_len, max(CHECK_STEPS), len(BATCH_ROWS) if batches else 1)
    cursor = SlotCursor(backend)
    ours, at = [], 0
    for n in CHECK_STEPS:
        ours.append(cursor.feed(ids[at: at + n]).copy())
        at += n
    ours = np.concatenate(ours)
    if not np.isfinite(ours).all():
        raise ExportError(f"{role}: the exported graph's logits are not finite (NaN or inf) on the check's ids: the "
                          "source's weights hold NaN or inf, or a float16 graph overflows (--dtype fp32); nothing "
                          "was written")
    cursor.pos = 0
    top = cursor.feed_ids(ids[:CHECK_STEPS[0]]).copy()
    min_rows = choose_min_rows(backend, vocab_size)
    check = {"steps": list(CHECK_STEPS), "max_abs_logit_error": float(np.abs(ours - reference).max()),
             "max_abs_logit": float(np.abs(reference).max()),
             "top1_agreement": float((ours.argmax(-1) == reference.argmax(-1)).mean()),
             "ids_equal_argmax": bool(np.array_equal(top, ours[:CHECK_STEPS[0]].argmax(-1))),
             "min_rows": min_rows,
             "verify_rows_bitwise_equal": verify_rows_bitwise_equal(SlotCursor(backend), ids),
             "reference": f"transformers {_transformers_version()}{reference_name}"}
    if batches:
        check["batch_rows_bitwise_equal"] = batch_rows_bitwise_equal(backend, ids)
    return check


def batch_rows_bitwise_equal(backend, ids: list[int]) -> bool:
    """Rows at different positions and lengths (BATCH_ROWS) in one call give the logits each gives alone.
    The backend needs len(BATCH_ROWS) slots; each slot gets its own prefix first."""
    rows = [(ids[r: r + prefix], ids[r + prefix: r + prefix + n], want)
            for r, (prefix, n, want) in enumerate(BATCH_ROWS)]
    for slot, (prefix, _, _) in enumerate(rows):
        backend.run([0], [prefix], [1], lo=slot)
    starts = [len(prefix) for prefix, _, _ in rows]
    together = [out.copy() for out in backend.run(starts, [tokens for _, tokens, _ in rows],
                                                  [want for *_, want in rows])]
    alone = [backend.run([start], [tokens], [want], lo=slot)[0].copy()
             for slot, (start, (_, tokens, want)) in enumerate(zip(starts, rows))]
    return all(np.array_equal(a, b) for a, b in zip(together, alone))


def source_logits(model, weights, prompts: list[list[int]], vocab_size: int) -> list[np.ndarray]:
    """The source model's logits over each check prompt (its first PROMPT_TOKENS), teacher-forced: taken before
    the graph's session opens, so that the two never share memory."""
    return reference_model.logits(model, weights, [ids[:PROMPT_TOKENS] for ids in prompts], vocab_size)


def prompt_agreement(onnx_path: Path, model_entry: dict, references: list[np.ndarray], prompts: list[list[int]],
                     max_seq_len: int) -> dict:
    """Teacher-forced top-1 agreement and max logit error of the graph vs the source's logits (source_logits)."""
    cursor = SlotCursor(_backend(onnx_path, model_entry, max_seq_len, PROMPT_TOKENS))
    agree = total = 0
    error = 0.0
    for ids, reference in zip(prompts, references):
        ids = ids[:PROMPT_TOKENS]
        cursor.pos = 0
        ours = cursor.feed(ids)
        agree += int((ours.argmax(-1) == reference.argmax(-1)).sum())
        total += len(ids)
        error = max(error, float(np.abs(ours - reference).max()))
    return {"prompts": len(prompts), "positions": total, "top1_agreement": agree / max(total, 1),
            "max_abs_logit_error": error}


def dequantized_overrides(model, weights, quantized: dict, quantization) -> dict:
    """The values a quantized graph multiplies with, as reference_model overrides: parameter name -> () -> float32
    tensor, each dequantized only while its module runs.

    quantized: module name -> (codes, scales, zero points, K) as written into the graph. An embedding or LM head
    quantizes its first vocab_size rows; the rows past them (padding) keep the source's values. A tied head gets
    its own override (the graph's embedding may stay float32).
    """
    import torch
    from transformers.pytorch_utils import Conv1D

    from specedge.export.quantize import dequantize

    def value(name: str, parts) -> object:
        weight = torch.from_numpy(dequantize(*parts, quantization))             # [out, in] as the graph holds it
        module = model.get_submodule(name)
        if isinstance(module, Conv1D):                                          # GPT-2's stores [in, out]
            return weight.T.contiguous()
        if weight.shape[0] < module.weight.shape[0]:                 # a table with padding rows past the vocabulary
            full = weights.tensor(f"{name}.weight")
            full[: weight.shape[0]] = weight
            return full
        return weight

    return {f"{module}.weight": (lambda m=module, parts=parts: value(m, parts)) for module, parts in quantized.items()}


def _transformers_version() -> str:
    import transformers
    return transformers.__version__
