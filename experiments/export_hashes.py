"""SHA-256 of the step graphs a checkout exports for tiny models of the older architectures (fp32 gqa, int4
standard, bf16 standard): run in two checkouts and diff the output to show that a change left their bundles alone.

    git worktree add /tmp/old daf108a
    (cd /tmp/old && PYTHONPATH=/tmp/old python /path/to/experiments/export_hashes.py /tmp/old /tmp/h-old) > old.txt
    PYTHONPATH=. python experiments/export_hashes.py . /tmp/h-new > new.txt && diff old.txt new.txt

CHECKOUT: the repository whose specedge and tests/tiny_models.py to use; OUT: a scratch folder (replaced).
"""

import hashlib
import shutil
import sys
from pathlib import Path

ARCHS = ("qwen2", "llama", "qwen3", "gemma2", "gemma3", "gpt2", "mistral")
VARIANTS = ({}, {"attention": "standard", "quantize": "int4"}, {"dtype": "bfloat16", "attention": "standard"})


def main(checkout: str, out: str) -> None:
    sys.path[:0] = [checkout, str(Path(checkout) / "tests")]
    import tiny_models as tm
    from specedge.export import export_bundle

    root = Path(out)
    shutil.rmtree(root, ignore_errors=True)
    for arch in ARCHS:
        src = tm.save(tm.make_model(arch, 260, seed=1), tm.byte_tokenizer(), root / f"src-{arch}")
        for i, options in enumerate(VARIANTS):
            bundle = export_bundle(str(src), None, root / f"{arch}-{i}", max_seq_len=64, max_draft=4, progress=None,
                                   **options)
            for graph in sorted(bundle.glob("*.onnx*")):
                print(arch, options, graph.name, hashlib.sha256(graph.read_bytes()).hexdigest()[:16])


if __name__ == "__main__":
    main(*sys.argv[1:3])
