"""Bytes a bundle needs in memory: weights and static KV buffers per model, and the process's peak RSS."""

from __future__ import annotations

import resource
import sys


def kv_buffer_bytes(manifest: dict, role: str) -> int:
    """K and V buffers of every layer, [1, H_kv, slots, D] float32 each (slots: max_seq_len, + 1 for gqa v2;
    bundles before v2 record no slots)."""
    kv = manifest["models"][role]["kv"]
    slots = kv.get("slots", manifest["max_seq_len"])
    return 2 * kv["num_layers"] * kv["num_kv_heads"] * slots * kv["head_dim"] * 4


def memory_report(manifest: dict) -> dict:
    """{role: {"weights", "weight_bytes", "kv_bytes"}, "total_bytes"} at the bundle's max_seq_len."""
    report = {role: {"weights": m.get("weights", "float32"), "weight_bytes": m["weight_bytes"],
                     "kv_bytes": kv_buffer_bytes(manifest, role)}
              for role, m in manifest["models"].items()}
    report["total_bytes"] = sum(r["weight_bytes"] + r["kv_bytes"] for r in report.values())
    return report


def peak_rss_bytes() -> int:
    """The process's peak resident memory (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024
