"""Checks an exported step graph against the source model run by transformers itself.

The graph is driven the way the runtime drives it: a prefill chunk into an empty buffer, then
multi-token steps into the partly filled buffer. transformers runs the whole sequence at once; with
causal attention its logits at each position must equal ours. A quantized graph is held to the same
tolerance against transformers running the dequantized weights (what the graph multiplies with), and
its cost in accuracy is measured against the unquantized model on a few real prompts.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specedge.runtime.row_check import verify_rows_bitwise_equal
from specedge.runtime.step_model import StepModel

# (prefill chunk, then step sizes): a verify-sized step and single-token draft steps
CHECK_STEPS = (7, 5, 1, 3, 1)
PROMPT_TOKENS = 48                    # per check prompt, teacher-forced


def reference_logits(torch_model, ids: list[int], vocab_size: int) -> np.ndarray:
    import torch

    with torch.no_grad():
        return torch_model(torch.tensor([ids])).logits[0, :, :vocab_size].float().numpy()


def random_ids(vocab_size: int, seed: int = 0) -> list[int]:
    return np.random.default_rng(seed).integers(0, vocab_size, size=sum(CHECK_STEPS)).tolist()


def check_graph(onnx_path: Path, model_entry: dict, reference: np.ndarray, ids: list[int], vocab_size: int,
                max_seq_len: int, reference_name: str = "", head_rows: np.ndarray | None = None) -> dict:
    """Graph logits over CHECK_STEPS vs the reference's for the same ids (its head_rows columns when the
    head keeps a subset); and verify rows vs single steps."""
    if head_rows is not None:
        reference = reference[:, head_rows]
    step = StepModel(onnx_path, model_entry, max_seq_len, reference.shape[1], max_step=max(CHECK_STEPS))
    ours, at = [], 0
    for n in CHECK_STEPS:
        ours.append(step.feed(ids[at: at + n]).copy())
        at += n
    ours = np.concatenate(ours)
    return {"steps": list(CHECK_STEPS), "max_abs_logit_error": float(np.abs(ours - reference).max()),
            "max_abs_logit": float(np.abs(reference).max()),
            "top1_agreement": float((ours.argmax(-1) == reference.argmax(-1)).mean()),
            "verify_rows_bitwise_equal": verify_rows_bitwise_equal(step, ids),
            "reference": f"transformers {_transformers_version()}{reference_name}"}


def prompt_agreement(onnx_path: Path, model_entry: dict, torch_model, prompts: list[list[int]], vocab_size: int,
                     max_seq_len: int, head_rows: np.ndarray | None = None) -> dict:
    """Teacher-forced top-1 agreement and max logit error of the graph vs the model, over real prompts.
    A subset head agrees where its best token is the full model's best (the error is over its columns)."""
    columns = head_rows if head_rows is not None else np.arange(vocab_size)
    step = StepModel(onnx_path, model_entry, max_seq_len, len(columns), max_step=PROMPT_TOKENS)
    agree = total = 0
    error = 0.0
    for ids in prompts:
        ids = ids[:PROMPT_TOKENS]
        reference = reference_logits(torch_model, ids, vocab_size)
        step.pos = 0
        ours = step.feed(ids)
        agree += int((columns[ours.argmax(-1)] == reference.argmax(-1)).sum())
        total += len(ids)
        error = max(error, float(np.abs(ours - reference[:, columns]).max()))
    return {"prompts": len(prompts), "positions": total, "top1_agreement": agree / max(total, 1),
            "max_abs_logit_error": error}


def load_dequantized(torch_model, quantized: dict, quantization, vocab_size: int, conv1d: bool,
                     head_rows=None) -> None:
    """Replaces the model's quantized weights by their dequantized values, in place.

    quantized: module name -> (codes, scales, zero points, K) as written into the graph. A tied LM
    head is untied first, as the graph's embedding may stay fp32; a quantized embedding (its first
    vocab_size rows) is written into the module in place. head_rows: the token ids of a lighter
    head's rows (the graph quantized only those; the check compares only their columns).
    """
    import torch

    from specedge.export.quantize import dequantize

    with torch.no_grad():
        for name, (codes, scales, zero_points, k) in quantized.items():
            module = torch_model.get_submodule(name)
            weight = torch.from_numpy(dequantize(codes, scales, zero_points, k, quantization))
            if name == "lm_head":
                full = module.weight.detach().clone().float()
                full[torch.as_tensor(head_rows) if head_rows is not None else slice(0, vocab_size)] = weight
                module.weight = torch.nn.Parameter(full)
            elif isinstance(module, torch.nn.Embedding):
                module.weight[: weight.shape[0]].copy_(weight)
            else:
                module.weight.copy_(weight.T if conv1d else weight)


def _transformers_version() -> str:
    import transformers
    return transformers.__version__
