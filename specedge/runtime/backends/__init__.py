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
BACKENDS = {"cpu": ("specedge.runtime.backends.cpu", "CpuBackend", "onnxruntime"),
            "cuda": ("specedge.runtime.backends.cuda", "CudaBackend", "onnxruntime-gpu"),
            "tensorrt": ("specedge.runtime.backends.tensorrt", "TensorRtBackend", "tensorrt>=10.15 and cuda-python: pip install 'specedge[tensorrt]'")}
AUTO_ORDER = ("tensorrt", "cuda", "cpu")      # `auto` takes the first that is available and can run the bundle


def available_backends() -> list[str]:
    return [name for name in BACKENDS if backend_problem(name) is None]


def backend_problem(name: str, **options) -> str | None:
    """Why backend `name` cannot run here (None if it can)."""
    module, cls, needs = BACKENDS[name]
    try:
        getattr(importlib.import_module(module), cls).check_available(**options)
    except ImportError as err:
        return f"needs {needs} (missing {err.name})"
    except RuntimeError as err:
        return str(err)
    return None


def choose_backend(manifest: dict) -> tuple[str, str]:
    """`--backend auto` -> (backend, why): the first of AUTO_ORDER that is available here and runs this bundle."""
    reasons = []
    for name in AUTO_ORDER:
        if name not in BACKENDS:
            continue
        problem = backend_problem(name) or bundle_problem(name, manifest)
        if problem is None:
            skipped = f" ({'; '.join(reasons)})" if reasons else ""
            return name, f"backend auto: {name}{skipped}"
        reasons.append(f"{name}: {problem}")
    raise OptionError(f"no backend can run this bundle here ({'; '.join(reasons)})")


def bundle_problem(name: str, manifest: dict) -> str | None:
    """Why backend `name` cannot run this bundle (None if it can), from the manifest alone."""
    variants = {m["graph_variant"] for m in manifest["models"].values()}
    if name == "cpu" and manifest["dtype"] == "bfloat16":
        return "the CPU provider has no bfloat16 MatMul"
    if name == "cuda" and variants != {"static-kv-standard-v1"}:
        return "needs a bundle exported with --attention standard"
    if name == "tensorrt":
        record = manifest.get("engines", {}).get("tensorrt")
        if not record:
            return "the bundle has no TensorRT engines (specedge build BUNDLE --tensorrt)"
        return _engines_problem(record)
    return None


def _engines_problem(record: dict) -> str | None:
    """Engines built for another GPU or TensorRT version (checked here so that auto passes over them)."""
    try:
        import tensorrt as trt

        from specedge.engines.tensorrt_record import compatibility_problem
        from specedge.runtime.backends.cuda_python import CudaRuntime
        here = {"tensorrt_version": trt.__version__, "gpu": CudaRuntime().device(0)}
    except Exception as err:  # noqa: BLE001 - whatever stops the query stops tensorrt here
        return f"cannot query the GPU for TensorRT ({err})"
    return compatibility_problem(record, here)


def open_backend(name: str, path: Path, entry: dict, max_seq_len: int, max_batch: int = 1,
                 threads: int | None = None, max_step: int = 64, **options):
    """The model of one manifest entry (`entry`, file at `path`) on backend `name`."""
    if name not in BACKENDS:
        raise OptionError(f"unknown backend '{name}' (available: {', '.join(available_backends()) or 'none'})")
    problem = backend_problem(name, **options)
    if problem:
        raise OptionError(f"backend '{name}' is not available: {problem} "
                          f"(available: {', '.join(available_backends()) or 'none'})")
    module, cls, _ = BACKENDS[name]
    backend_class = getattr(importlib.import_module(module), cls)
    return backend_class(Path(path), entry, max_seq_len, max_batch=max_batch, threads=threads, max_step=max_step,
                         **options)
