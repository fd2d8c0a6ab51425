import json
import signal
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import tiny_models as tm  # noqa: E402

from specedge.export import export_bundle  # noqa: E402
from specedge.runtime.backends import open_backend  # noqa: E402
from specedge.runtime.backends.base import SlotCursor  # noqa: E402


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler for the test. A run started in the background of a non-interactive shell inherits
    SIGINT ignored, and Python then installs no handler: the Ctrl+C tests failed in such a run of `.ci/run`."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


ARCHS = ("qwen2", "llama", "mistral", "gpt2", "qwen3", "gemma2", "gemma3", "phi3", "granite", "olmo2", "olmo3",
         "smollm3", "gemma", "starcoder2", "exaone4", "hunyuan")
TARGET_ROWS, DRAFT_ROWS = 260, 264   # the draft's padded embedding rows are sliced off at export


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("specedge")


def _export(workdir: Path, name: str, target, draft, tokenizer, **kw) -> Path:
    target_dir = tm.save(target, tokenizer, workdir / f"{name}-target")
    draft_dir = tm.save(draft, tokenizer, workdir / f"{name}-draft") if draft is not None else None
    return export_bundle(str(target_dir), str(draft_dir) if draft_dir else None, workdir / name,
                         **{"max_seq_len": 256, "max_draft": 8, "progress": None, **kw})


@pytest.fixture(scope="session")
def arch_bundles(workdir):
    """Per architecture: a target and an independent random draft (often wrong)."""
    tok = tm.byte_tokenizer()
    return {arch: _export(workdir, f"{arch}-bad", tm.make_model(arch, TARGET_ROWS, seed=1),
                          tm.make_model(arch, DRAFT_ROWS, seed=2), tok) for arch in ARCHS}


@pytest.fixture(scope="session")
def good_bundle(workdir):
    """Qwen2 target and a slightly perturbed copy of it as draft (often right)."""
    target = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    return _export(workdir, "qwen2-good", target, tm.perturbed(target, seed=3, noise=0.01), tm.byte_tokenizer(chat=True))


@pytest.fixture(scope="session")
def word_bundle(workdir):
    """A 12-token vocabulary for distribution tests; draft is a noisier copy (acceptance well below 1)."""
    n = 12
    target = tm.make_model("qwen2", n, seed=5, init_scale=0.5)
    return _export(workdir, "words", target, tm.perturbed(target, seed=6, noise=0.04), tm.word_tokenizer(n),
                   max_seq_len=32, max_draft=4)


@pytest.fixture(scope="session")
def standard_bundles(workdir):
    """attention="standard" (any batch size): qwen2 with a perturbed draft (the same target weights as
    arch_bundles["qwen2"]), gpt2 target-only (plain multi-head attention, the same target weights as
    arch_bundles["gpt2"]), and the qwen2 pair with int4 weights."""
    tok = tm.byte_tokenizer()
    qwen2 = tm.make_model("qwen2", TARGET_ROWS, seed=1)
    qwen2_draft = tm.perturbed(qwen2, seed=3, noise=0.01)
    return {"qwen2": _export(workdir, "std-qwen2", qwen2, qwen2_draft, tok, attention="standard"),
            "gpt2": _export(workdir, "std-gpt2", tm.make_model("gpt2", TARGET_ROWS, seed=1), None, tok,
                            attention="standard"),
            "qwen2-int4": _export(workdir, "std-qwen2-int4", qwen2, qwen2_draft, tok, attention="standard",
                                  quantize="int4")}


def together(gen, requests):
    """Submits every (prompt, options) at once, so the worker admits them into one batch -> results."""
    with gen.scheduler.wake:
        streams = [gen.stream(prompt, **options) for prompt, options in requests]
    return [s.wait() for s in streams]


def manifest_of(bundle: Path) -> dict:
    return json.loads((Path(bundle) / "manifest.json").read_text())


def open_model(bundle: Path, role: str = "target", max_step: int = 16, max_batch: int = 1, min_rows: int = 1):
    """A bundle's model on the CPU backend, as the runtime opens it."""
    manifest = manifest_of(bundle)
    entry = manifest["models"][role]
    backend = open_backend("cpu", Path(bundle) / entry["file"], entry, manifest["max_seq_len"], max_batch=max_batch,
                           max_step=max_step)
    backend.min_rows = min_rows
    return backend


def cursor_of(bundle: Path, role: str = "target", max_step: int = 16, min_rows: int = 1) -> SlotCursor:
    """One sequence in slot 0 of a bundle's model."""
    return SlotCursor(open_model(bundle, role, max_step, min_rows=min_rows))
