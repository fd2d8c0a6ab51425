"""The lean runtime: numpy + onnxruntime + tokenizers; no torch.

    from specedge.runtime import load
    gen = load("BUNDLE")
    result = gen.generate("def fib(n):", max_new_tokens=128, temperature=0.0, k=4)
"""

from specedge.runtime.generator import Generator
from specedge.runtime.scheduler import QueueFull
from specedge.runtime.sequences import GenerationOptions, GenerationResult
from specedge.runtime.stats import GenerationStats
from specedge.runtime.stream import Stream


def load(bundle, backend: str = "cpu", threads: int | None = None, target_rows: str | int = "auto",
         max_batch: int = 1, max_queue: int = 64, background: bool = False, spinning: bool | None = None) -> Generator:
    """Loads a bundle from its manifest alone onto `backend` ("cpu": onnxruntime's CPU provider).
    max_batch: concurrent sequences (KV slots allocated once); max_queue: requests that may wait beyond them.
    target_rows: "auto" (exact), or 1 / 2 to force how many rows a lone target token runs as.
    background: a worker thread runs the batch (a server) instead of the waiting callers.
    spinning: whether onnxruntime's idle threads spin (cpu backend); None: only for a target-only bundle."""
    return Generator(bundle, backend=backend, threads=threads, target_rows=target_rows, max_batch=max_batch,
                     max_queue=max_queue, background=background, spinning=spinning)


__all__ = ["load", "Generator", "GenerationOptions", "GenerationResult", "GenerationStats", "Stream", "QueueFull"]
