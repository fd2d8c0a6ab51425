"""TensorRT engines built into the bundle (`specedge build BUNDLE --tensorrt`), run with device-resident KV.

EXPERIMENTAL: written to TensorRT 10.15's documented Python API and cuda-python, unit-tested against stand-in
modules (tests/fake_tensorrt.py); it has not run on a GPU (docs/tensorrt.md).

Memory (allocated once at load, cuda-python): per layer one device buffer [max_batch, H_kv, slots, D] for K and
one for V in the bundle's dtype, zeroed (stale slots must hold finite numbers); device scratch for the call's
inputs (input_ids, position_ids, logit_rows: int64) and outputs (logits, ids), sized for the largest call; and
pinned host staging that pad_call lays the inputs out in. A call over slots lo .. lo + B - 1 sets the address of
past_key.{i} AND present_key.{i} to K buffer i + lo * slot bytes (the batch axis leads, so the range is contiguous):
TensorRT's KVCacheUpdate layer (what its parser makes of the graph's TensorScatter) writes the new K/V in place and
requires the output to share the cache input's address. Per call only the three small inputs go to the device and
only the ids come back (the logits only when the caller samples), all on one stream.

Execution: set_input_shape / set_tensor_address / execute_async_v3 on the backend's stream. Each call runs in the
first optimization profile (of the engine's, recorded in the manifest) that holds its (B, T, n). Decode calls run at
one shape per model (as the cuda backend: all max_batch rows from slot 0, width = max_draft + 1 tokens for the target,
2 for the draft; exact by construction, one kernel choice), in an execution context of its own whose shapes and
addresses never change: after its first (real) call it is captured once as a CUDA graph and replayed from then on
(cuda_graphs=True). Other shapes (prefill chunks, a draft's catch-up) share one context per profile and rebind when
the shape or slot range changes; they are not captured.

Refused at load, with what differs and the command that fixes it: engines built by another TensorRT version or for
another GPU (manifest record, see specedge/engines/tensorrt_record.py), a max_batch or call length beyond the
engines' profiles, engines built from another step graph, a gqa bundle.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from specedge.engines.tensorrt_record import (REBUILD, Profile, check_record, compatibility_problem, model_record,
                                              select_profile)
from specedge.engines.trt_ops import MIN_TENSORRT
from specedge.errors import BundleError, OptionError
from specedge.runtime.backends.base import ModelBackend, scratch_rows
from specedge.runtime.backends.cuda_python import CudaError, CudaRuntime, stream_handle
from specedge.runtime.manifest import MANIFEST

ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "int32": 4, "int64": 8, "bool": 1}
ID_TYPES = {"int32": np.int32, "int64": np.int64}


def version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in version.split(".")[:2] if p.isdigit())


def version_problem(version: str) -> str | None:
    if version_tuple(version) < MIN_TENSORRT:
        return (f"TensorRT {version} is older than {'.'.join(map(str, MIN_TENSORRT))}, the first whose ONNX parser "
                "reads TensorScatter (KV written in place); pip install 'specedge[tensorrt]'")
    return None


def trt_dtype_names(trt) -> dict:
    """trt.DataType member -> the manifest's dtype names."""
    names = {"FLOAT": "float32", "HALF": "float16", "BF16": "bfloat16", "INT32": "int32", "INT64": "int64",
             "BOOL": "bool"}
    return {getattr(trt.DataType, member): name for member, name in names.items() if hasattr(trt.DataType, member)}


def bundle_root(path: Path, entry: dict) -> Path:
    """The bundle folder of a model file `path` named `entry["file"]` in the manifest."""
    root = Path(path)
    for _ in Path(entry["file"]).parts:
        root = root.parent
    return root


@dataclass
class _Unit:
    """One call shape (lo, B, T, n): the execution context it runs in, its profile, and its CUDA graph once captured."""
    key: tuple
    profile: int
    context: object
    dedicated: bool
    graph: object = None
    graph_exec: object = None


class TensorRtBackend(ModelBackend):
    name = "tensorrt"

    @classmethod
    def check_available(cls, device_id: int = 0, **_) -> None:
        try:
            import tensorrt as trt
        except OSError as err:                  # the wheel is there, its shared libraries are not (or do not load)
            raise RuntimeError(f"tensorrt is installed but its libraries do not load ({err})") from err
        runtime = CudaRuntime()
        problem = version_problem(trt.__version__)
        if problem:
            raise RuntimeError(problem)
        try:
            count = runtime.device_count()
        except CudaError as err:
            raise RuntimeError(f"no usable CUDA driver or device ({err})") from err
        if count == 0:
            raise RuntimeError("no CUDA device is visible")
        if device_id >= count:
            raise RuntimeError(f"there is no CUDA device {device_id} (devices: 0..{count - 1})")

    def __init__(self, path: Path, entry: dict, max_seq_len: int, max_batch: int = 1, threads: int | None = None,
                 max_step: int = 64, device_id: int = 0, cuda_graphs: bool = True, width: int = 0,
                 profile: str | None = None):
        import tensorrt as trt

        self._trt = trt
        if entry["graph_variant"] != "static-kv-standard-v1":
            raise OptionError(f"the tensorrt backend runs bundles exported with --attention standard; this one's "
                              f"{entry['graph_variant']} graph uses com.microsoft ops TensorRT's parser lacks")
        root = bundle_root(path, entry)
        self.root = root
        try:
            manifest = json.loads((root / MANIFEST).read_text())
        except (OSError, ValueError) as err:
            raise BundleError(f"{root}: cannot read the manifest ({err})") from err
        record = manifest.get("engines", {}).get("tensorrt")
        if not record:
            raise BundleError(f"{root}: the bundle has no TensorRT engines; build them: {REBUILD.format(bundle=root)}")
        check_record(record)
        self.role, model = model_record(record, entry["file"])
        onnx_record = manifest["files"].get(entry["file"], {})
        if model.get("onnx_sha256") != onnx_record.get("sha256"):
            raise BundleError(f"{root}: the {self.role} engine was built from another {entry['file']}; rebuild: "
                              f"{REBUILD.format(bundle=root)}")
        self.cuda = cuda = CudaRuntime()
        self.device_id = device_id
        here = {"tensorrt_version": trt.__version__, "gpu": cuda.device(device_id)}
        problem = compatibility_problem(record, here, bundle=str(root))
        if problem:
            raise BundleError(problem)
        if max_batch > record["max_batch"]:
            raise OptionError(f"the bundle's TensorRT engines take at most {record['max_batch']} concurrent sequences; "
                              f"for max_batch {max_batch} rebuild them: {REBUILD.format(bundle=root)} --max-batch {max_batch}")
        if max_step > record["max_step"]:
            raise OptionError(f"the bundle's TensorRT engines take calls of at most {record['max_step']} tokens, the "
                              f"runtime makes {max_step}; rebuild them: {REBUILD.format(bundle=root)}")
        kv = entry["kv"]
        self.dtype = kv.get("dtype", "float32")
        self.max_seq_len, self.max_batch, self.max_step, self.width = max_seq_len, max_batch, max_step, width
        self.kv_slots, self.num_layers = kv["slots"], kv["num_layers"]
        self.heads, self.head_dim = kv["num_kv_heads"], kv["head_dim"]
        if width and max_seq_len + width > self.kv_slots:
            raise BundleError(f"{path}: {self.kv_slots} KV slots leave no room for decode calls {width} tokens wide")
        self.vocab_columns = entry["spec"]["vocab_size"]
        self.kv_names = entry["io"]["kv"]
        self.profiles = [Profile.from_json(p) for p in model["profiles"]]
        self.cuda_graphs, self.cuda_graph_problem = cuda_graphs, None
        self._buffers: list[int] = []
        self._host: list[int] = []
        self._units: dict[tuple, _Unit] = {}
        self._shared: dict[int, list] = {}                 # profile -> [context, key it is bound for]
        cuda.set_device(device_id)
        self.stream = cuda.stream()
        self._handle = stream_handle(self.stream)
        self.engine = self._load_engine(root / model["file"], model)
        self.id_dtype = self._check_io(entry)
        self._allocate(rows=scratch_rows(max_batch, max_step, width))    # the largest call pad_call lays out

    # -- load -----------------------------------------------------------------------------
    def _load_engine(self, file: Path, model: dict):
        trt = self._trt
        try:
            plan = file.read_bytes()
        except OSError as err:
            raise BundleError(f"{file}: cannot read the TensorRT engine ({err})") from err
        if len(plan) != model["bytes"]:
            raise BundleError(f"{file} is corrupt (size {len(plan)}, expected {model['bytes']})")
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        engine = self._runtime.deserialize_cuda_engine(plan)
        if engine is None:
            raise BundleError(f"{file}: TensorRT {trt.__version__} could not deserialize the engine (see its log "
                              f"above); rebuild: {REBUILD.format(bundle=self.root)}")
        if engine.num_optimization_profiles != len(self.profiles):
            raise BundleError(f"{file}: the engine has {engine.num_optimization_profiles} optimization profiles, the "
                              f"manifest records {len(self.profiles)}; rebuild: {REBUILD.format(bundle=self.root)}")
        return engine

    def _check_io(self, entry: dict):
        """The engine's I/O must be the manifest's (names, dtypes), and each present_* must alias its past_* -> the
        numpy type of the ids output."""
        trt, engine = self._trt, self.engine
        names = trt_dtype_names(trt)
        found = {}
        for i in range(engine.num_io_tensors):
            name = engine.get_tensor_name(i)
            found[name] = (engine.get_tensor_mode(name), names.get(engine.get_tensor_dtype(name), "?"))
        io = entry["io"]
        declared = {**{n: (trt.TensorIOMode.INPUT, t["dtype"]) for n, t in io["inputs"].items()},
                    **{n: (trt.TensorIOMode.OUTPUT, t["dtype"]) for n, t in io["outputs"].items()}}
        if set(found) != set(declared):
            raise BundleError(f"{self.root}: the {self.role} engine's tensors differ from the manifest's (engine only: "
                              f"{', '.join(sorted(set(found) - set(declared))[:4]) or '-'}; manifest only: "
                              f"{', '.join(sorted(set(declared) - set(found))[:4]) or '-'}); rebuild: "
                              f"{REBUILD.format(bundle=self.root)}")
        for name, (mode, dtype) in declared.items():
            got_mode, got = found[name]
            if got_mode != mode:
                raise BundleError(f"{self.root}: {name} is an {'input' if mode == trt.TensorIOMode.INPUT else 'output'} "
                                  "in the manifest but not in the engine; rebuild")
            if got != dtype and not (name == "ids" and got in ID_TYPES):
                raise BundleError(f"{self.root}: {name} is {got} in the {self.role} engine but {dtype} in the "
                                  f"manifest; rebuild: {REBUILD.format(bundle=self.root)}")
        aliased = getattr(engine, "get_aliased_input_tensor", None)
        if aliased is not None:
            for past_k, past_v, present_k, present_v in self.kv_names:
                for past, present in ((past_k, present_k), (past_v, present_v)):
                    if aliased(present) != past:
                        raise BundleError(f"{self.root}: the {self.role} engine does not write {present} in place "
                                          f"(it aliases {aliased(present) or 'no input'}, not {past}): its KV would "
                                          "need a copy per call; this needs TensorRT >= 10.15 (TensorScatter -> "
                                          "KVCacheUpdate)")
        return ID_TYPES[found["ids"][1]]

    def _allocate(self, rows: int) -> None:
        cuda, b = self.cuda, self.max_batch
        self._slot_bytes = self.heads * self.kv_slots * self.head_dim * ITEM_BYTES[self.dtype]
        id_bytes = np.dtype(self.id_dtype).itemsize
        need = 2 * self.num_layers * b * self._slot_bytes + rows * (3 * 8 + id_bytes + 4 * self.vocab_columns)
        try:
            self.keys = [self._malloc(b * self._slot_bytes) for _ in range(self.num_layers)]
            self.values = [self._malloc(b * self._slot_bytes) for _ in range(self.num_layers)]
            self._dev_ids, self._dev_positions, self._dev_logit_rows = (self._malloc(rows * 8) for _ in range(3))
            self._dev_out_ids = self._malloc(rows * id_bytes)
            self._dev_logits = self._malloc(rows * self.vocab_columns * 4)
            self._ids, self._positions, self._logit_rows = (self._pinned(rows, np.int64) for _ in range(3))
            self._out_ids = self._pinned(rows, self.id_dtype)
            self._logits = self._pinned(rows * self.vocab_columns, np.float32)
        except CudaError as err:
            self.close()
            if "memory" in str(err).lower():
                raise OptionError(f"GPU {self.device_id} is out of memory for the {self.role} KV and scratch of "
                                  f"max_batch {b} ({need / 2**30:.2f} GiB besides the engine); lower --max-batch or "
                                  "export with a smaller --max-seq-len") from err
            raise
        self.device_bytes = need + int(getattr(self.engine, "device_memory_size_v2", 0) or 0)
        for buf in (*self.keys, *self.values):
            cuda.memset(buf, 0, b * self._slot_bytes, self.stream)
        cuda.synchronize(self.stream)

    def _malloc(self, nbytes: int) -> int:
        ptr = self.cuda.malloc(nbytes)
        self._buffers.append(ptr)
        return ptr

    def _pinned(self, count: int, dtype) -> np.ndarray:
        ptr, array = self.cuda.host_array(count, dtype)
        self._host.append(ptr)
        return array

    @property
    def kv_slot_bytes(self) -> int:
        return 2 * self.num_layers * self._slot_bytes

    # -- binding --------------------------------------------------------------------------
    def addresses(self, lo: int) -> dict[str, int]:
        """Every I/O tensor's device address for a call over slots lo ..: past and present of a layer the same."""
        out = {"input_ids": self._dev_ids, "position_ids": self._dev_positions, "logit_rows": self._dev_logit_rows,
               "logits": self._dev_logits, "ids": self._dev_out_ids}
        for (past_k, past_v, present_k, present_v), k, v in zip(self.kv_names, self.keys, self.values):
            out[past_k] = out[present_k] = k + lo * self._slot_bytes
            out[past_v] = out[present_v] = v + lo * self._slot_bytes
        return out

    def input_shapes(self, b: int, t: int, n: int) -> dict[str, tuple]:
        shapes = {"input_ids": (b, t), "position_ids": (b, t), "logit_rows": (b, n)}
        for past_k, past_v, _, _ in self.kv_names:
            shapes[past_k] = shapes[past_v] = (b, self.heads, self.kv_slots, self.head_dim)
        return shapes

    def _bind(self, context, key: tuple) -> None:
        lo, b, t, n = key
        for name, shape in self.input_shapes(b, t, n).items():
            if not context.set_input_shape(name, shape):
                raise OptionError(f"TensorRT refused shape {shape} for {name} (outside the engine's profiles; "
                                  f"rebuild: {REBUILD.format(bundle=self.root)})")
        for name, address in self.addresses(lo).items():
            if not context.set_tensor_address(name, address):
                raise BundleError(f"TensorRT refused the address of {name}")

    def _context(self, profile: int):
        context = self.engine.create_execution_context()
        if context is None:
            raise OptionError(f"TensorRT could not create an execution context for the {self.role} engine (out of "
                              "GPU memory?)")
        if not context.set_optimization_profile_async(profile, self._handle):
            raise BundleError(f"TensorRT refused optimization profile {profile} of the {self.role} engine")
        return context

    def _unit(self, key: tuple) -> _Unit:
        unit = self._units.get(key)
        if unit is not None:
            return unit
        lo, b, t, n = key
        profile = select_profile(self.profiles, b, t, n)
        if self.width and t <= self.width and lo == 0 and b == self.max_batch:
            # the decode shape (every row, fixed width): its own context, bound once, captured. Other calls at the
            # width (a short prompt's chunk at its slot) share a context: one per shape would each hold activations
            unit = _Unit(key, profile, self._context(profile), dedicated=True)
            self._bind(unit.context, key)
        else:
            shared = self._shared.get(profile)
            if shared is None:
                shared = self._shared[profile] = [self._context(profile), None]
            unit = _Unit(key, profile, shared[0], dedicated=False)
        self._units[key] = unit
        return unit

    def _execute(self, unit: _Unit) -> None:
        if unit.graph_exec is not None:
            self.cuda.launch(unit.graph_exec, self.stream)
            return
        if not unit.dedicated:
            shared = self._shared[unit.profile]
            if shared[1] != unit.key:                    # rebind only when this context last ran another shape
                self._bind(unit.context, unit.key)
                shared[1] = unit.key
        if not unit.context.execute_async_v3(self._handle):
            raise BundleError(f"TensorRT failed to run the {self.role} engine (call {unit.key}; see its log)")

    def _capture(self, unit: _Unit) -> None:
        """Records the unit's (already run once) execution as a CUDA graph; a capture TensorRT cannot do leaves the
        unit uncaptured and says why (cuda_graph_problem)."""
        cuda = self.cuda
        try:
            cuda.begin_capture(self.stream)
        except CudaError as err:
            self.cuda_graphs, self.cuda_graph_problem = False, str(err)
            return
        ok = unit.context.execute_async_v3(self._handle)
        try:
            graph = cuda.end_capture(self.stream)
        except CudaError as err:
            self.cuda_graphs, self.cuda_graph_problem = False, str(err)
            return
        if not ok or graph is None:
            self.cuda_graphs, self.cuda_graph_problem = False, "execute_async_v3 failed during capture"
            return
        try:
            unit.graph, unit.graph_exec = graph, cuda.instantiate(graph)
        except CudaError as err:
            cuda.destroy_graph(graph, None)
            self.cuda_graphs, self.cuda_graph_problem = False, str(err)

    # -- calls ----------------------------------------------------------------------------
    def run(self, starts, tokens, last, lo: int = 0, want: str = "logits") -> list[np.ndarray]:
        b = len(starts)
        call = self._fixed_shape_call(starts, tokens, last, lo)
        rows, t, n = call.ids.shape[0], call.ids.shape[1], call.logit_rows.shape[1]
        unit = self._unit((lo, rows, t, n))
        cuda, stream = self.cuda, self.stream
        for dev, host, count in ((self._dev_ids, self._ids, rows * t), (self._dev_positions, self._positions, rows * t),
                                 (self._dev_logit_rows, self._logit_rows, rows * n)):
            cuda.copy(dev, host.ctypes.data, count * 8, cuda.H2D, stream)
        self._execute(unit)
        if want == "ids":              # only the caller's b rows come back (they lead; dummy rows follow)
            out = self._out_ids[: b * n]
            cuda.copy(out.ctypes.data, self._dev_out_ids, out.nbytes, cuda.D2H, stream)
        else:
            out = self._logits[: b * n * self.vocab_columns]
            cuda.copy(out.ctypes.data, self._dev_logits, out.nbytes, cuda.D2H, stream)
        cuda.synchronize(stream)
        if unit.dedicated and self.cuda_graphs and unit.graph_exec is None:
            self._capture(unit)
        if want == "ids":
            out = out.reshape(b, n) if out.dtype == np.int64 else out.reshape(b, n).astype(np.int64)
        else:
            out = out.reshape(b, n, self.vocab_columns)
        return [out[r, n - want_r:] if want_r else out[r, :0] for r, want_r in enumerate(call.last[:b])]

    def move_slot(self, src: int, dst: int, length: int) -> None:
        item = ITEM_BYTES[self.dtype]
        pitch = self.kv_slots * self.head_dim * item                       # one head's rows in a slot
        for buf in (*self.keys, *self.values):
            self.cuda.copy_2d(buf + dst * self._slot_bytes, pitch, buf + src * self._slot_bytes, pitch,
                              length * self.head_dim * item, self.heads, self.cuda.D2D, self.stream)
        self.cuda.synchronize(self.stream)

    def close(self) -> None:
        """Frees the device memory, graphs and stream (also at garbage collection)."""
        cuda = getattr(self, "cuda", None)
        if cuda is None:
            return
        for unit in getattr(self, "_units", {}).values():
            if unit.graph is not None:
                cuda.destroy_graph(unit.graph, unit.graph_exec)
                unit.graph = unit.graph_exec = None
        for ptr in getattr(self, "_buffers", []):
            cuda.free(ptr)
        for ptr in getattr(self, "_host", []):
            cuda.free_host(ptr)
        self._buffers, self._host = [], []

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the CUDA module may be gone already
            pass
