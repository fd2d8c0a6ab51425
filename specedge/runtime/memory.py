"""Bytes a bundle needs in memory: weights, and static KV buffers per slot (one slot per concurrent sequence)."""

from __future__ import annotations

import resource
import sys


DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}


def kv_slot_bytes(manifest: dict, role: str) -> int:
    """K and V buffers of every layer for one sequence: [H_kv, slots, D] each, in the bundle's dtype (slots:
    max_seq_len plus the variant's headroom for pad rows)."""
    kv = manifest["models"][role]["kv"]
    return 2 * kv["num_layers"] * kv["num_kv_heads"] * kv["slots"] * kv["head_dim"] * DTYPE_BYTES[kv.get("dtype", "float32")]


def memory_report(manifest: dict, max_batch: int = 1) -> dict:
    """{role: {"weights", "weight_bytes", "kv_slot_bytes", "kv_bytes"}, "max_batch", "total_bytes"}: KV for
    max_batch slots at the bundle's max_seq_len."""
    report = {role: {"weights": m.get("weights", "float32"), "weight_bytes": m["weight_bytes"],
                     "kv_slot_bytes": kv_slot_bytes(manifest, role),
                     "kv_bytes": max_batch * kv_slot_bytes(manifest, role)}
              for role, m in manifest["models"].items()}
    report["total_bytes"] = sum(r["weight_bytes"] + r["kv_bytes"] for r in report.values())
    report["max_batch"] = max_batch
    return report


def peak_rss_bytes() -> int:
    """The process's peak resident memory (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
