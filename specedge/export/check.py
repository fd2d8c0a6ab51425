"""Checks an exported step graph against the source model run by transformers itself.

The graph is driven the way the runtime drives it: a prefill chunk into an empty buffer, then
multi-token steps into the partly filled buffer. transformers runs the whole sequence at once; with
causal attention its logits at each position must equal ours.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specedge.runtime.step_model import StepModel

# (prefill chunk, then step sizes): a verify-sized step and single-token draft steps
CHECK_STEPS = (7, 5, 1, 3, 1)


def check_graph(onnx_path: Path, model_entry: dict, torch_model, vocab_size: int, max_seq_len: int,
                seed: int = 0) -> dict:
    import torch

    rng = np.random.default_rng(seed)
    ids = rng.integers(0, vocab_size, size=sum(CHECK_STEPS)).tolist()
    with torch.no_grad():
        reference = torch_model(torch.tensor([ids])).logits[0, :, :vocab_size].float().numpy()
    step = StepModel(onnx_path, model_entry, max_seq_len, vocab_size, max_step=max(CHECK_STEPS))
    ours, at = [], 0
    for n in CHECK_STEPS:
        ours.append(step.feed(ids[at: at + n]).copy())
        at += n
    ours = np.concatenate(ours)
    error = float(np.abs(ours - reference).max())
    scale = float(np.abs(reference).max())
    agree = float((ours.argmax(-1) == reference.argmax(-1)).mean())
    return {"steps": list(CHECK_STEPS), "max_abs_logit_error": error, "max_abs_logit": scale,
            "top1_agreement": agree, "reference": f"transformers {_transformers_version()}"}


def _transformers_version() -> str:
    import transformers
    return transformers.__version__
