"""`specedge bench`: every policy on the same prompts in one process, interleaved, with full metrics."""

from specedge.bench.runner import BUILTIN_PROMPTS, load_prompts, run_bench

__all__ = ["BUILTIN_PROMPTS", "load_prompts", "run_bench"]
