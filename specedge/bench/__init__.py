"""`specedge bench`: every policy on the same prompts in one process, interleaved, with full metrics."""

from specedge.bench.batch import parse_batches, run_batch_bench
from specedge.bench.runner import load_prompts, run_bench

__all__ = ["load_prompts", "parse_batches", "run_bench", "run_batch_bench"]
