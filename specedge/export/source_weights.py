"""The source model's tensors, read one at a time: the exporter never holds a whole model in float32.

A safetensors checkpoint whose tensor names and shapes are the model's own (what transformers saves, what the hub
serves for the architectures specedge exports) is read straight from its files a tensor at a time, so export
memory no longer grows with the model: a 7B target no longer needs ~30 GB. A folder with PyTorch .bin files
instead (and no safetensors) is read the same way, its files memory-mapped (torch.load's mmap, weights only).
A GGUF file is dequantized a tensor at a time. Anything else (legacy tensor names, an image-and-text checkpoint,
a .bin in torch's pre-1.6 format, a hub id without safetensors) is loaded by transformers in float32, as before,
and read from that model.

Every tensor is handed out in float32: bf16 and fp16 widen exactly, so the graph's weights and the reference the
graph is checked against equal those of a float32 load bit for bit.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from specedge.errors import ExportError

# what transformers loads from a hub repo: not, say, Mistral's consolidated.safetensors or an adapter beside it
SAFETENSORS_PATTERNS = ["model.safetensors", "model.safetensors.index.json", "model-*-of-*.safetensors"]
BIN_FILE, BIN_INDEX = "pytorch_model.bin", "pytorch_model.bin.index.json"   # transformers' names, when no safetensors


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


@dataclass
class _Stored:
    """What a checkpoint file holds, by the model's tensor names: name -> (shape, () -> torch tensor)."""
    tensors: dict[str, tuple[tuple, Callable[[], object]]]
    how: str
    keep: list
    others_ignored: bool              # tensors the model does not name: ignored (GGUF, as transformers does) or not


def open_weights(source, skeleton) -> SourceWeights:
    """skeleton: the source's model with its parameters on the meta device (reference_model.skeleton)."""
    stored = _gguf_tensors(source, skeleton) if source.kind == "gguf" else \
        _safetensors_tensors(source) or _bin_tensors(source)
    streamed = _streamed(stored, skeleton) if stored else None
    if streamed is not None:
        return streamed
    model = source.load_model()
    state = model.state_dict()        # tied names included, each the same tensor
    return SourceWeights({name: (lambda t=tensor: t.detach()) for name, tensor in state.items()},
                         f"loaded by transformers ({_dtype_name(state)})", keep=[model])


def _streamed(stored: _Stored, skeleton) -> SourceWeights | None:
    """Readers of the stored tensors where every tensor the model has is there under its own name and shape (else
    None: transformers maps and reports what differs). A tied head with no tensor of its own reads the embedding."""
    state = skeleton.state_dict(keep_vars=True)        # parameters on meta (their shapes), buffers real
    params = {id(p): name for name, p in skeleton.named_parameters()}           # a tied tensor: its first name
    readers: dict[str, Callable[[], object]] = {}
    for name, value in state.items():
        key = name if name in stored.tensors else params.get(id(value), name)
        if key in stored.tensors:
            shape, read = stored.tensors[key]
            if tuple(shape) != tuple(value.shape):
                return None
            readers[name] = read
        elif value.device.type == "meta":
            return None               # a parameter the checkpoint lacks (or names otherwise)
        else:
            readers[name] = (lambda t=value: t)                                   # a buffer the model computes
    if not stored.others_ignored and set(stored.tensors) - set(readers):
        return None                   # tensors the model does not name as they are: legacy names
    return SourceWeights(readers, stored.how, keep=stored.keep)


def _safetensors_tensors(source) -> _Stored | None:
    """The checkpoint transformers would load: model.safetensors, else the shards model.safetensors.index.json names
    (not, say, Mistral's consolidated.safetensors or a stale copy beside them)."""
    from safetensors import safe_open

    if source.text_of:
        return None
    folder = Path(source.where) if source.kind == "hf-folder" else _hub_snapshot(source.where)
    index = folder / "model.safetensors.index.json"
    try:
        names = ["model.safetensors"] if (folder / "model.safetensors").exists() else \
            sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else []
        handles = [safe_open(str(folder / name), framework="pt") for name in names]
    except Exception:  # noqa: BLE001 - a corrupt file or index: transformers' load says what is wrong with it
        return None
    if not handles:
        return None
    tensors = {name: (handle.get_slice(name).get_shape(), lambda h=handle, n=name: h.get_tensor(n))
               for handle in handles for name in handle.keys()}  # noqa: SIM118 - safe_open has keys(), no iteration
    count = f"{len(handles)} safetensors file{'s' if len(handles) != 1 else ''}"
    return _Stored(tensors, f"read a tensor at a time from {count}", handles, others_ignored=False)


def _bin_tensors(source) -> _Stored | None:
    """A local folder's PyTorch checkpoint, as transformers picks it where there is no safetensors: pytorch_model.bin,
    else the shards its index names. Each file memory-mapped (weights only: no code in a pickle runs), so a tensor
    is read from the file when asked for, as safetensors' are."""
    import torch

    if source.text_of or source.kind != "hf-folder":
        return None
    folder = Path(source.where)
    index = folder / BIN_INDEX
    try:
        names = [BIN_FILE] if (folder / BIN_FILE).exists() else \
            sorted(set(json.loads(index.read_text())["weight_map"].values())) if index.exists() else []
        states = [torch.load(folder / name, map_location="cpu", mmap=True, weights_only=True) for name in names]
    except Exception:  # noqa: BLE001 - an old (pre-zip) or corrupt file: transformers' load says what it can
        return None
    if not states:
        return None
    tensors = {name: (tuple(tensor.shape), lambda t=tensor: t) for state in states for name, tensor in state.items()}
    count = f"{len(states)} .bin file{'s' if len(states) != 1 else ''}"
    return _Stored(tensors, f"read a tensor at a time from {count} (memory-mapped)", states, others_ignored=False)


def _gguf_tensors(source, skeleton) -> _Stored | None:
    """A GGUF file's tensors, each dequantized when read, named and processed as transformers' GGUF loader does (its
    own name map and tensor processor: llama's q/k permutation undone). Only where that processor works a tensor at a
    time (the others need the whole file at once): None otherwise."""
    import torch
    from gguf import GGUFReader, dequantize
    from transformers.modeling_gguf_pytorch_utils import (
        TENSOR_PROCESSORS,
        LlamaTensorProcessor,
        TensorProcessor,
        get_gguf_hf_weights_map,
        read_field,
    )

    path = str(Path(source.where) / source.extra["gguf_file"])
    try:
        reader = GGUFReader(path)
        architecture = read_field(reader, "general.architecture")[0]
        processor_class = TENSOR_PROCESSORS.get(architecture, TensorProcessor)
        if processor_class not in (TensorProcessor, LlamaTensorProcessor):
            return None
        processor = processor_class(config=source.config)     # the head counts llama's permutation needs
        names = get_gguf_hf_weights_map(skeleton, processor)                     # GGUF name -> the model's
    except Exception:  # noqa: BLE001 - a corrupt file: transformers' load says what is wrong with it
        return None

    def read(tensor):
        weights = processor.process(weights=dequantize(tensor.data, tensor.tensor_type), name=tensor.name).weights
        return torch.from_numpy(np.array(weights))              # a copy: an f32 tensor is a view of the mapped file

    tensors = {names[t.name]: (tuple(int(n) for n in reversed(t.shape)), lambda t=t: read(t))
               for t in reader.tensors if t.name in names}
    return _Stored(tensors, "dequantized a tensor at a time from the GGUF file", [reader], others_ignored=True)


def _hub_snapshot(repo_id: str) -> Path:
    """The folder in the local cache holding the hub checkpoint's safetensors files, downloaded if missing (none if
    it has none: transformers then loads what it has)."""
    from huggingface_hub import snapshot_download

    try:
        return Path(snapshot_download(repo_id, allow_patterns=SAFETENSORS_PATTERNS))
    except Exception as err:  # noqa: BLE001 - network, auth and missing repos all raise their own types
        raise ExportError(f"cannot download the weights of {repo_id}: {str(err).strip().splitlines()[0]}") from err


def _dtype_name(state: dict) -> str:
    dtypes = sorted({str(t.dtype).removeprefix("torch.") for t in state.values() if t.is_floating_point()})
    return ", ".join(dtypes) or "no float tensors"
