"""The exporter (needs the `export` extra: torch, transformers, onnx, gguf)."""

from specedge.export.pipeline import export_bundle

__all__ = ["export_bundle"]
