"""The lean runtime: numpy + onnxruntime + tokenizers; no torch.

    from specedge.runtime import load
    gen = load("BUNDLE")
    result = gen.generate("def fib(n):", max_new_tokens=128, temperature=0.0, k=4)
"""

from specedge.runtime.generator import Generator
from specedge.runtime.scheduler import QueueFull
from specedge.runtime.sequences import GenerationOptions, GenerationResult
from specedge.runtime.stats import GenerationStats
from specedge.runtime.async_stream import AsyncStream
from specedge.runtime.stream import Stream


def load(bundle, backend: str = "cpu", threads: int | None = None, target_rows: str | int = "auto",
         max_batch: int = 1, max_queue: int = 64, background: bool = False, spinning: bool | str | None = None,
         device_id: int = 0, cuda_graphs: bool = True, backend_options: dict | None = None,
         prompt_cache: bool | None = None) -> Generator:
    """Loads a bundle from its manifest alone onto `backend`: "cpu" (onnxruntime's CPU provider), "cuda"
    (onnxruntime-gpu, device-resident KV), "tensorrt" (engines built into the bundle), or "auto" (the first
    of those available here that runs this bundle; Generator.backend_choice says which and why).
    max_batch: concurrent sequences (KV slots allocated once); max_queue: requests that may wait beyond them.
    target_rows: "auto" (exact), or 1 / 2 to force how many rows a lone target token runs as.
    background: a worker thread runs the batch (a server) instead of the waiting callers.
    spinning: how onnxruntime's threads wait for work (cpu backend): "always" spin (True), "in-call" (spin
    within a call, stop when it returns), "never" (False); None: in-call for a pair, always for a target alone.
    device_id, cuda_graphs: the GPU, and whether decode calls replay CUDA graphs (GPU backends).
    backend_options: further constructor options of the backend (e.g. {"device": "cpu"} runs the cuda
    backend's code on the CPU provider, the tests' way to exercise it without a GPU).
    prompt_cache: a request whose prompt starts with text a free KV slot still holds (the last conversation
    turn, a shared system prompt) prefills only the rest (stats.cached_prompt_tokens says how many). None (the
    default): on where that is exact (the cpu backend, single steps equal to multi-row calls); True where it
    would not be is an OptionError."""
    return Generator(bundle, backend=backend, threads=threads, target_rows=target_rows, max_batch=max_batch,
                     max_queue=max_queue, background=background, spinning=spinning, device_id=device_id,
                     cuda_graphs=cuda_graphs, backend_options=backend_options, prompt_cache=prompt_cache)


__all__ = ["load", "Generator", "GenerationOptions", "GenerationResult", "GenerationStats", "Stream", "AsyncStream",
           "QueueFull"]
