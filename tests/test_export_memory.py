"""Export never holds the torch model and an onnxruntime session of its graph at once (together they were the
export's peak: 13.87 GiB for the fp32 1.5B target, 8.88 GiB since; docs/export-memory.md)."""

import gc
import weakref

import pytest
import tiny_models as tm

import specedge.export.check as check_module
from specedge.export import export_bundle
from specedge.export.sources import Source


@pytest.mark.parametrize("quantize", [None, "int4"])
def test_the_torch_model_is_freed_before_onnxruntime_loads_the_graph(tmp_path, monkeypatch, quantize):
    models, sessions_opened = [], []
    load_model = Source.load_model

    def tracked_load(self):
        model = load_model(self)
        models.append(weakref.ref(model))
        return model

    open_backend = check_module.open_backend

    def tracked_open(*args, **kwargs):
        gc.collect()
        sessions_opened.append([ref() is not None for ref in models])
        return open_backend(*args, **kwargs)

    monkeypatch.setattr(Source, "load_model", tracked_load)
    monkeypatch.setattr(check_module, "open_backend", tracked_open)
    tok = tm.byte_tokenizer()
    target = tm.save(tm.make_model("qwen2", 260, seed=1), tok, tmp_path / "target")
    draft = tm.save(tm.make_model("qwen2", 260, seed=2), tok, tmp_path / "draft")
    export_bundle(str(target), str(draft), tmp_path / "bundle", max_seq_len=64, progress=None, quantize=quantize)
    assert len(models) == 2
    # every check session (the source comparison, the graph check) opened with no torch model alive
    assert len(sessions_opened) >= 2 and all(not any(alive) for alive in sessions_opened), sessions_opened
