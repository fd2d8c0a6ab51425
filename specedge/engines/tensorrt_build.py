"""`specedge build BUNDLE --tensorrt` (EXPERIMENTAL, not yet run on a GPU): one strongly typed TensorRT engine per
model, built on the GPU that will run it, written into the bundle and recorded in its manifest.

Per model: the step graph (the standard variant: no com.microsoft ops) is checked against TensorRT 10.15's operator
list (trt_ops.py), normalized where TensorRT documents an ONNX attribute more narrowly (TensorScatter's axis as -2),
and parsed from memory with its external weights read beside the .onnx file. The network is STRONGLY_TYPED: every
tensor keeps the graph's type (the bundle's dtype; norms, softmax and logits float32), no precision flags. One
optimization profile per call kind the runtime makes (tensorrt_record.default_profiles, or --profiles): decode (B up
to max_batch, T up to max_draft + 2, tuned for the fixed decode width) and prefill (T up to the prefill chunk).

Writing never leaves a broken bundle: engines are built into a hidden folder inside the bundle, renamed to a fresh
engines/tensorrt-<id>/ folder, and only then is manifest.json replaced, atomically (os.replace of a complete
copy), listing the new files and the record; old engines are deleted after that. A failure before the replace
deletes what it wrote and leaves manifest and old engines as they were.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path

from specedge import __version__
from specedge.engines.tensorrt_record import LEVEL_OPTIONS, LEVELS, RECORD_VERSION, max_step, parse_profiles
from specedge.engines.trt_ops import (TENSORRT_VERSION, normalize_for_tensorrt, refusal, restriction_problems,
                                      unsupported_ops)
from specedge.errors import BundleError, OptionError, SpecedgeError
from specedge.runtime.manifest import MANIFEST, file_record, read_manifest

ENGINE_DIR = "engines"
INSTALL = "pip install 'specedge[tensorrt]'"


def prepare_graph(onnx_path: Path, kv_rank: int = 4) -> tuple[bytes | None, list[str]]:
    """The step graph's proto (weights stay external), checked and normalized for TensorRT -> (serialized proto,
    rewrites). Without the onnx package: (None, []) and the parser reads the file as it is."""
    try:
        import onnx
    except ImportError:
        return None, []
    model = onnx.load(str(onnx_path), load_external_data=False)
    missing = unsupported_ops(model)
    if missing:
        raise BundleError(f"{onnx_path.name}: TensorRT {TENSORRT_VERSION}'s parser lacks "
                          + ", ".join(f"{op} ({why})" for op, why in sorted(missing.items())))
    rewrites = normalize_for_tensorrt(model, kv_rank)
    problems = restriction_problems(model)
    if problems:
        raise BundleError(f"{onnx_path.name}: {'; '.join(problems)}")
    return model.SerializeToString(), rewrites


def _import_tensorrt():
    try:
        import tensorrt as trt

        from specedge.runtime.backends.cuda_python import CudaRuntime
        cuda = CudaRuntime()
    except ImportError as err:
        raise SpecedgeError(f"building TensorRT engines needs TensorRT >= {TENSORRT_VERSION} and cuda-python "
                            f"(missing {err.name}): {INSTALL}") from err
    from specedge.runtime.backends.tensorrt import version_problem
    problem = version_problem(trt.__version__)
    if problem:
        raise SpecedgeError(problem)
    return trt, cuda


def build_engine(trt, onnx_path: Path, proto: bytes | None, inputs: dict, profiles, level: str,
                 workspace_bytes: int | None = None) -> bytes:
    """One serialized engine (plan) of a step graph: strongly typed, one optimization profile per Profile."""
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, logger)
    parsed = parser.parse(proto, str(onnx_path)) if proto is not None else parser.parse_from_file(str(onnx_path))
    if not parsed:
        errors = []
        for i in range(parser.num_errors):
            error = parser.get_error(i)
            op = error.node_operator() if hasattr(error, "node_operator") else ""
            errors.append(f"{op + ': ' if op else ''}{error.desc()}")
        raise SpecedgeError(f"TensorRT's parser rejected {onnx_path.name}: {'; '.join(errors) or 'no reason given'}")
    names = {network.get_input(i).name for i in range(network.num_inputs)}
    if names != set(inputs):
        raise BundleError(f"{onnx_path.name}: the parsed network's inputs ({', '.join(sorted(names))}) differ from "
                          "the manifest's; re-export the bundle")
    config = builder.create_builder_config()
    config.hardware_compatibility_level = getattr(trt.HardwareCompatibilityLevel, LEVELS[level])
    if workspace_bytes:
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, workspace_bytes)
    for profile in profiles:
        optimization = builder.create_optimization_profile()
        for name, (low, opt, high) in profile.shapes(inputs).items():
            optimization.set_shape(name, low, opt, high)
        if config.add_optimization_profile(optimization) < 0:
            raise SpecedgeError(f"TensorRT refused optimization profile {profile.name} of {onnx_path.name}")
    plan = builder.build_serialized_network(network, config)
    if plan is None:
        raise SpecedgeError(f"TensorRT could not build an engine from {onnx_path.name} (see its log above)")
    return bytes(memoryview(plan))


def build_tensorrt_engines(bundle, profiles: str | None = None, max_batch: int = 1, device_id: int = 0,
                           hardware_compatibility: str = "none", workspace_gib: float | None = None,
                           progress=None) -> dict:
    """Builds every model's engine on GPU device_id and records them in the bundle -> the manifest's
    engines["tensorrt"] record (shape: tensorrt_record.py)."""
    from specedge.runtime.scheduler import PREFILL_CHUNK

    say = progress or (lambda _line: None)
    root = Path(bundle)
    manifest = read_manifest(root)
    problem = refusal(manifest)
    if problem:
        raise BundleError(f"{root}: cannot build TensorRT engines: {problem}")
    if not isinstance(max_batch, int) or max_batch < 1:
        raise OptionError(f"--max-batch must be an integer >= 1, got {max_batch!r}")
    level = LEVEL_OPTIONS.get(hardware_compatibility, hardware_compatibility)
    if level not in LEVELS:
        raise OptionError(f"unknown hardware compatibility '{hardware_compatibility}' (known: {', '.join(LEVEL_OPTIONS)})")
    plans = {role: parse_profiles(profiles, manifest, role, max_batch, PREFILL_CHUNK) for role in manifest["models"]}
    graphs = {}
    for role, model in manifest["models"].items():
        graphs[role] = prepare_graph(root / model["file"])
        if graphs[role][0] is None:
            say(f"{role}: onnx is not installed, so the operator check and graph normalization are skipped")
    trt, cuda = _import_tensorrt()
    cuda.set_device(device_id)
    gpu = cuda.device(device_id)
    cuda_version, driver_version = cuda.versions()
    say(f"TensorRT {trt.__version__} on {gpu['name']} (compute capability {gpu['compute_capability']}, CUDA "
        f"{cuda_version}), hardware compatibility {level}")
    work = root / f".tensorrt-build-{uuid.uuid4().hex[:8]}"
    final = root / ENGINE_DIR / f"tensorrt-{uuid.uuid4().hex[:12]}"
    replaced = False
    try:
        work.mkdir()
        models, rewrites = {}, set()
        for role, model in manifest["models"].items():
            proto, changed = graphs[role]
            rewrites.update(changed)
            described = ", ".join(f"{p.name} B{p.batch[0]}-{p.batch[2]} T{p.tokens[0]}-{p.tokens[2]}"
                                  for p in plans[role])
            say(f"{role}: building a strongly typed engine from {model['file']} (profiles: {described})")
            started = time.perf_counter()
            plan = build_engine(trt, root / model["file"], proto, model["io"]["inputs"], plans[role], level,
                                int(workspace_gib * 2**30) if workspace_gib else None)
            (work / f"{role}.plan").write_bytes(plan)
            say(f"{role}: {len(plan) / 2**20:.1f} MiB in {time.perf_counter() - started:.0f}s")
            models[role] = {"onnx": model["file"], "onnx_sha256": manifest["files"][model["file"]]["sha256"],
                            "file": f"{ENGINE_DIR}/{final.name}/{role}.plan",
                            "profiles": [p.to_json() for p in plans[role]]}
        final.parent.mkdir(exist_ok=True)
        work.rename(final)
        for role, entry in models.items():
            entry.update(file_record(root / entry["file"]))
        record = {
            "record_version": RECORD_VERSION, "experimental": True, "tensorrt_version": trt.__version__,
            "cuda_version": cuda_version, "cuda_driver_version": driver_version,
            "gpu": {"name": gpu["name"], "compute_capability": gpu["compute_capability"]},
            "hardware_compatibility_level": level, "strongly_typed": True, "max_batch": max_batch,
            "max_step": max_step(manifest, PREFILL_CHUNK), "graph_rewrites": sorted(rewrites),
            "built": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "specedge_version": __version__,
            "models": models,
        }
        old = manifest.get("engines", {}).get("tensorrt") or {}
        old_files = {m["file"] for m in old.get("models", {}).values() if "file" in m}
        updated = dict(manifest)
        updated["engines"] = {**manifest.get("engines", {}), "tensorrt": record}
        files = {rel: rec for rel, rec in manifest["files"].items() if rel not in old_files}
        files.update({m["file"]: {"bytes": m["bytes"], "sha256": m["sha256"]} for m in models.values()})
        updated["files"] = dict(sorted(files.items()))
        write_manifest_atomically(root, updated)
        replaced = True
    except BaseException:
        if not replaced:
            shutil.rmtree(work, ignore_errors=True)
            shutil.rmtree(final, ignore_errors=True)
        raise
    for rel in old_files:                                # after the replace: the old engines are no longer listed
        folder = (root / rel).parent
        if folder != final and folder.parent == root / ENGINE_DIR:
            shutil.rmtree(folder, ignore_errors=True)
    say(f"wrote {', '.join(m['file'] for m in models.values())} and the manifest's engines record")
    return record


def write_manifest_atomically(root: Path, manifest: dict) -> None:
    """A complete new manifest.json next to the old one, flushed to disk, then renamed over it (atomic on POSIX
    and Windows): a reader sees the old manifest or the new one, never a part."""
    tmp = root / f".{MANIFEST}.{uuid.uuid4().hex[:8]}.tmp"
    try:
        with open(tmp, "w") as f:
            f.write(json.dumps(manifest, indent=2) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, root / MANIFEST)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    try:
        fd = os.open(root, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError:       # directories cannot be opened for fsync everywhere (Windows)
        pass
