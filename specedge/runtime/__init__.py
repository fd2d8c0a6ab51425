"""The lean runtime: numpy + onnxruntime + tokenizers; no torch.

    from specedge.runtime import load
    gen = load("BUNDLE")
    result = gen.generate("def fib(n):", max_new_tokens=128, temperature=0.0, k=4)
"""

from specedge.runtime.generator import GenerationOptions, GenerationResult, Generator
from specedge.runtime.stats import GenerationStats


def load(bundle, backend: str = "cpu", threads: int | None = None, target_rows: str | int = "auto") -> Generator:
    """Loads a bundle from its manifest alone; `backend` is "cpu" (onnxruntime CPU EP) for now.
    target_rows: "auto" (exact), or 1 / 2 to force how many rows a single target step runs as."""
    return Generator(bundle, backend=backend, threads=threads, target_rows=target_rows)


__all__ = ["load", "Generator", "GenerationOptions", "GenerationResult", "GenerationStats"]
