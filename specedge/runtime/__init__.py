"""The lean runtime: numpy + onnxruntime + tokenizers; no torch.

    from specedge.runtime import load
    gen = load("BUNDLE")
    result = gen.generate("def fib(n):", max_new_tokens=128, temperature=0.0, k=4)
"""

from specedge.runtime.generator import GenerationOptions, GenerationResult, Generator
from specedge.runtime.stats import GenerationStats


def load(bundle, backend: str = "cpu", threads: int | None = None) -> Generator:
    """Loads a bundle from its manifest alone; `backend` is "cpu" (onnxruntime CPU EP) for now."""
    return Generator(bundle, backend=backend, threads=threads)


__all__ = ["load", "Generator", "GenerationOptions", "GenerationResult", "GenerationStats"]
