"""Backends: one file per way of running a step graph, behind one interface (base.ModelBackend).

A backend owns a model's session, the memory of its static KV buffers (max_batch slots) and its I/O
scratch; the loop, drafters and scheduler talk only to `run` / `move_slot`. A new backend is a new
module here with a class implementing ModelBackend, and one line in BACKENDS.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from specedge.errors import OptionError

# name -> (module, class, what it needs): imported only when asked for
BACKENDS = {"cpu": ("specedge.runtime.backends.cpu", "CpuBackend", "onnxruntime")}


def available_backends() -> list[str]:
    return [name for name in BACKENDS if backend_problem(name) is None]


def backend_problem(name: str) -> str | None:
    """Why backend `name` cannot run here (None if it can)."""
    module, cls, needs = BACKENDS[name]
    try:
        getattr(importlib.import_module(module), cls).check_available()
    except ImportError as err:
        return f"needs {needs} (missing {err.name})"
    except RuntimeError as err:
        return str(err)
    return None


def open_backend(name: str, path: Path, entry: dict, max_seq_len: int, max_batch: int = 1,
                 threads: int | None = None, max_step: int = 64, **options):
    """The model of one manifest entry (`entry`, file at `path`) on backend `name`."""
    if name not in BACKENDS:
        raise OptionError(f"unknown backend '{name}' (available: {', '.join(available_backends()) or 'none'})")
    problem = backend_problem(name)
    if problem:
        raise OptionError(f"backend '{name}' is not available: {problem} "
                          f"(available: {', '.join(available_backends()) or 'none'})")
    module, cls, _ = BACKENDS[name]
    backend_class = getattr(importlib.import_module(module), cls)
    return backend_class(Path(path), entry, max_seq_len, max_batch=max_batch, threads=threads, max_step=max_step,
                         **options)
