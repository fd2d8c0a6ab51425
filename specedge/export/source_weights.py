"""The source model's tensors, read one at a time: the exporter never holds a whole model in float32.

A safetensors checkpoint whose tensor names and shapes are the model's own (what transformers saves, what the hub
serves for the architectures specedge exports) is read straight from its files a tensor at a time, so export
memory no longer grows with the model: a 7B target no longer needs ~30 GB. Anything else (a GGUF file, a .bin
checkpoint, legacy tensor names, an image-and-text checkpoint) is loaded by transformers, in its stored dtype
(GGUF in float32: bf16 would round its dequantized values), and read from that model.

Every tensor is handed out in float32: bf16 and fp16 widen exactly, so the graph's weights and the reference the
graph is checked against equal those of a float32 load bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specedge.errors import ExportError

SAFETENSORS_PATTERNS = ["*.safetensors", "*.safetensors.index.json"]


@dataclass
class SourceWeights:
    """tensor name (the model's own state_dict naming, tied names included) -> float32 tensor, read on demand."""
    readers: dict[str, Callable[[], object]]  # name -> () -> torch tensor in its stored dtype
    how: str                                  # how they are read, said in the export's progress
    keep: list = field(default_factory=list)  # what the readers need alive (open files, a loaded model)

    @property
    def names(self) -> list[str]:
        return list(self.readers)

    def tensor(self, name: str):
        """-> torch float32 tensor (a fresh one: the caller may keep it or let it go)"""
        import torch

        value = self.readers[name]()
        return value.to(torch.float32) if value.dtype != torch.float32 else value.clone()

    def array(self, name: str) -> np.ndarray:
        return self.tensor(name).numpy()


def open_weights(source, skeleton) -> SourceWeights:
    """skeleton: the source's model with its parameters on the meta device (reference_model.skeleton)."""
    files = _safetensors_files(source)
    streamed = _streamed(files, skeleton) if files else None
    if streamed is not None:
        return streamed
    model = source.load_model()
    state = model.state_dict()        # tied names included, each the same tensor
    return SourceWeights({name: (lambda t=tensor: t.detach()) for name, tensor in state.items()},
                         f"loaded by transformers ({_dtype_name(state)})", keep=[model])


def _streamed(files: list[Path], skeleton) -> SourceWeights | None:
    """Readers straight from the files where every tensor the model has is there under its own name and shape, and
    nothing else is (else None: transformers maps and reports what differs)."""
    from safetensors import safe_open

    try:
        handles = [safe_open(str(path), framework="pt") for path in files]
    except Exception:  # noqa: BLE001 - a corrupt file: transformers' load says what is wrong with it
        return None
    where = {name: handle for handle in handles for name in handle.keys()}
    state = skeleton.state_dict(keep_vars=True)        # parameters on meta (their shapes), buffers real
    params = {id(p): name for name, p in skeleton.named_parameters()}           # a tied tensor: its first name
    readers: dict[str, Callable[[], object]] = {}
    for name, value in state.items():
        stored = name if name in where else params.get(id(value), name)
        if stored in where:
            if tuple(where[stored].get_slice(stored).get_shape()) != tuple(value.shape):
                return None
            readers[name] = (lambda h=where[stored], n=stored: h.get_tensor(n))
        elif value.device.type == "meta":
            return None               # a parameter the checkpoint lacks (or names otherwise)
        else:
            readers[name] = (lambda t=value: t)                                   # a buffer the model computes
    if set(where) - set(readers):
        return None                   # tensors the model does not name as they are: legacy names
    count = f"{len(files)} safetensors file{'s' if len(files) != 1 else ''}"
    return SourceWeights(readers, f"read a tensor at a time from {count}", keep=handles)


def _safetensors_files(source) -> list[Path]:
    if source.kind == "gguf" or source.text_of:
        return []
    folder = Path(source.where) if source.kind == "hf-folder" else _hub_snapshot(source.where)
    return sorted(folder.glob("*.safetensors")) if folder else []


def _hub_snapshot(repo_id: str) -> Path | None:
    """The hub checkpoint's safetensors files in the local cache (downloaded if missing): None if it has none."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=SAFETENSORS_PATTERNS))
    except Exception as err:  # noqa: BLE001 - network, auth and missing repos all raise their own types
        raise ExportError(f"cannot download the weights of {repo_id}: {str(err).strip().splitlines()[0]}") from err


def _dtype_name(state: dict) -> str:
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in state.values() if t.is_floating_point()})
    return ", ".join(dtypes) or "no float tensors"
