import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

import tiny_models as tm  # noqa: E402

from specedge.export import export_bundle  # noqa: E402

ARCHS = ("qwen2", "llama", "mistral", "gpt2")
TARGET_ROWS, DRAFT_ROWS = 260, 264   # the draft's padded embedding rows are sliced off at export


@pytest.fixture(scope="session")
def workdir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("specedge")


def _export(workdir: Path, name: str, target, draft, tokenizer, **kw) -> Path:
    target_dir = tm.save(target, tokenizer, workdir / f"{name}-target")
    draft_dir = tm.save(draft, tokenizer, workdir / f"{name}-draft") if draft is not None else None
    return export_bundle(str(target_dir), str(draft_dir) if draft_dir else None, workdir / name,
                         progress=None, **{"max_seq_len": 256, "max_draft": 8, **kw})


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
