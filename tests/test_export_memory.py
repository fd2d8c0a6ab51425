"""Export never holds the source's weights and an onnxruntime session of its graph at once (together they were the
export's peak: 13.87 GiB for the fp32 1.5B target, 8.88 GiB since; docs/export-memory.md), whether the weights are
read a tensor at a time or loaded by transformers."""

import gc
import weakref

import pytest
import tiny_models as tm

import specedge.export.check as check_module
import specedge.export.pipeline as pipeline
from specedge.export import export_bundle, source_weights


@pytest.mark.parametrize("streamed", [True, False])
@pytest.mark.parametrize("quantize", [None, "int4"])
def test_the_source_weights_are_freed_before_onnxruntime_loads_the_graph(tmp_path, monkeypatch, quantize, streamed):
    opened, sessions_opened = [], []

    def tracked_open_weights(source, model):
        weights = source_weights.open_weights(source, model)
        opened.append((weakref.ref(weights), weakref.ref(model)))
        return weights

    open_backend = check_module.open_backend

    def tracked_open(*args, **kwargs):
        gc.collect()
        sessions_opened.append([ref() is not None for refs in opened for ref in refs])
        return open_backend(*args, **kwargs)

    monkeypatch.setattr(pipeline, "open_weights", tracked_open_weights)
    monkeypatch.setattr(check_module, "open_backend", tracked_open)
    if not streamed:
        monkeypatch.setattr(source_weights, "_streamed", lambda files, skeleton: None)
    tok = tm.byte_tokenizer()
    target = tm.save(tm.make_model("qwen2", 260, seed=1), tok, tmp_path / "target")
    draft = tm.save(tm.make_model("qwen2", 260, seed=2), tok, tmp_path / "draft")
    lines = []
    export_bundle(str(target), str(draft), tmp_path / "bundle", max_seq_len=64, progress=lines.append,
                  quantize=quantize)
    assert len(opened) == 2
    how = "read a tensor at a time" if streamed else "loaded by transformers"
    assert sum(how in line for line in lines) == 2
    # every check session (the source comparison, the graph check) opened with no weights or model alive
    assert len(sessions_opened) >= 2 and all(not any(alive) for alive in sessions_opened), sessions_opened
