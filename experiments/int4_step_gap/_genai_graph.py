"""onnxruntime-genai's decoder graph as a plain session with one new token after `past` positions."""
import json
from pathlib import Path

import numpy as np
import onnxruntime as ort


def genai_step(genai_dir: str, threads: int = 2, past: int = 100, options: ort.SessionOptions | None = None):
    """-> a function that runs one step (logits only)."""
    if options is None:
        options = ort.SessionOptions()
    options.intra_op_num_threads, options.inter_op_num_threads, options.log_severity_level = threads, 1, 3
    session = ort.InferenceSession(str(Path(genai_dir) / "model.onnx"), options, providers=["CPUExecutionProvider"])
    decoder = json.loads((Path(genai_dir) / "genai_config.json").read_text())["model"]["decoder"]
    kv_shape = (1, decoder["num_key_value_heads"], past, decoder["head_size"])
    feeds = {"input_ids": np.array([[5]], np.int64), "attention_mask": np.ones((1, past + 1), np.int64)}
    for i in session.get_inputs():
        if i.name.startswith("past"):
            feeds[i.name] = np.zeros(kv_shape, np.float32)
    return session, lambda: session.run(["logits"], feeds)
