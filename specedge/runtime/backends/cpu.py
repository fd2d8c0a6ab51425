"""onnxruntime's CPU execution provider, with zero-copy KV buffers in host memory.

KV buffers: per layer one numpy array [max_batch, H_kv, slots, D] for K and one for V, allocated at load.
A call over slots lo .. lo + B - 1 binds past_* and present_* to the same OrtValue over that contiguous range
of the buffer (a view: the batch axis leads, so no copy), and the graph writes the new K/V in place. One
IOBinding per slot range keeps those KV bindings; per call only the small inputs and the outputs are rebound,
and only when the call's shape changes. Running B active rows under max_batch N therefore costs what the same
rows cost under max_batch B: the graph only ever sees [B, ...] tensors.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np

from specedge.errors import BundleError, OptionError
from specedge.runtime.backends.base import ModelBackend, pad_call, scratch_rows

log = logging.getLogger("specedge.runtime")

# what onnxruntime 1.32's CPU provider lacks for a half-precision step graph (tried on exported tiny bundles)
CPU_GAPS = {"bfloat16": "onnxruntime's CPU provider has no bfloat16 MatMul"}
ORT_TYPES = {"int64": "tensor(int64)", "float32": "tensor(float)", "float16": "tensor(float16)",
             "bfloat16": "tensor(bfloat16)"}
KV_NUMPY = {"float32": np.float32, "float16": np.float16}      # numpy has no bfloat16


SPINNING = ("always", "in-call", "never")


def spinning_mode(choice: bool | str | None, pair: bool) -> str:
    """load(spinning=...) -> SPINNING: None picks in-call for a pair (two sessions take turns), always for a
    target-only bundle; True / False are always / never."""
    if choice is None:
        return "in-call" if pair else "always"
    if isinstance(choice, bool):
        return "always" if choice else "never"
    if choice not in SPINNING:
        raise OptionError(f"spinning must be None, True, False or one of {', '.join(SPINNING)}, got {choice!r}")
    return choice


def session_options(threads: int | None, profile: str | None = None, spinning: str = "always"):
    """How onnxruntime's intra-op threads wait for work (one of SPINNING, as spinning_mode resolves it):
    always: they spin between the parallel parts of a call and, for a while, after it (the fastest single
    session); in-call: they spin within a call and stop as soon as it returns (session.force_spinning_stop),
    so two sessions taking turns (target and draft) do not steal each other's cores, which on 2 cores made a
    tiny pair's target steps 1.5-2x slower after a draft call; never: they sleep whenever they wait, also
    between the parts of one call (8-15% slower int4 calls than in-call on a 2-core EPYC: docs/runtime-v2.md)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    if spinning == "never":
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    elif spinning == "in-call":
        options.add_session_config_entry("session.force_spinning_stop", "1")
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = threads or os.cpu_count() or 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    if profile:                                   # onnxruntime's own per-node profile (scripts use it)
        options.enable_profiling = True
        options.profile_file_prefix = profile
    return options


def check_io(session, entry: dict, path: Path) -> None:
    """The graph's inputs and outputs must be exactly what the manifest says (names, dtypes, and the sizes both fix:
    the KV buffers are allocated from the manifest's)."""
    for kind, declared, actual in (("input", entry["io"]["inputs"], session.get_inputs()),
                                   ("output", entry["io"]["outputs"], session.get_outputs())):
        found = {value.name: value.type for value in actual}
        if set(found) != set(declared):
            extra, missing = sorted(set(found) - set(declared)), sorted(set(declared) - set(found))
            raise BundleError(f"{path}: the graph's {kind}s differ from the manifest's (graph only: "
                              f"{', '.join(extra[:4]) or '-'}; manifest only: {', '.join(missing[:4]) or '-'}); "
                              "re-export the bundle")
        shapes = {value.name: value.shape for value in actual}
        for name, tensor in declared.items():
            if ORT_TYPES.get(tensor.get("dtype")) != found[name]:
                raise BundleError(f"{path}: {kind} {name} is {found[name]} in the graph but "
                                  f"{tensor.get('dtype')} in the manifest; re-export the bundle")
            shape, graph = tensor.get("shape"), shapes[name]
            if isinstance(shape, list) and isinstance(graph, list) and len(shape) == len(graph) and any(
                    isinstance(a, int) and isinstance(b, int) and a != b for a, b in zip(shape, graph)):
                raise BundleError(f"{path}: {kind} {name} is {graph} in the graph but {shape} in the manifest; "
                                  "re-export the bundle")


def _kv_buffers(path: Path, shape: tuple, layers: int, dtype: np.dtype) -> tuple[list, list]:
    """K and V buffers [N, H_kv, S, D] per layer, zeroed: their pages come as sequences fill them, so more than the
    machine's memory is a warning (fine while the slots' sequences stay short), and only a size that cannot be
    allocated at all a one-line OptionError."""
    need = 2 * layers * int(np.prod(shape)) * dtype.itemsize
    physical = _physical_memory()
    sizes = f"KV buffers for max_batch {shape[0]} take {_size(need)} ({_size(need // shape[0])} a slot)"
    if physical and need > physical:
        log.warning("%s: %s, more than this machine's %s of memory: they fill as sequences grow, and long sequences "
                    "in every slot would run out of it (a lower --max-batch / max_batch avoids that)",
                    path.name, sizes, _size(physical))
    try:
        return [np.zeros(shape, dtype) for _ in range(layers)], [np.zeros(shape, dtype) for _ in range(layers)]
    except MemoryError:
        raise OptionError(f"{path.name}: {sizes}, which could not be allocated; lower --max-batch / max_batch") \
            from None


def _size(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / (1 << 20):.1f} MiB"


def _physical_memory() -> int | None:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):          # not POSIX (Windows): only the allocation says
        return None


class CpuBackend(ModelBackend):
    name = "cpu"

    @classmethod
    def check_available(cls, **_) -> None:
        import onnxruntime as ort

        if "CPUExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError("onnxruntime has no CPU execution provider")

    def __init__(self, path: Path, entry: dict, max_seq_len: int, max_batch: int = 1, threads: int | None = None,
                 max_step: int = 64, profile: str | None = None, spinning: bool | str = "always"):
        import onnxruntime as ort

        self._ort = ort
        kv_dtype = entry["kv"].get("dtype", "float32")
        if kv_dtype not in KV_NUMPY:
            raise OptionError(f"the cpu backend cannot run {kv_dtype} bundles ({CPU_GAPS.get(kv_dtype, '')}); "
                              "export with --dtype fp32 or fp16, or use a GPU backend")
        if entry.get("max_batch") is not None and max_batch > entry["max_batch"]:
            raise OptionError(f"the {entry['graph_variant']} graph runs {entry['max_batch']} row per call; "
                              f"max_batch {max_batch} needs a bundle exported with --attention standard")
        try:
            options = session_options(threads, profile, spinning_mode(spinning, pair=False))
            self.session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
        except Exception as err:  # onnxruntime raises its own untyped errors for bad files
            raise BundleError(f"{path}: cannot load model ({str(err).splitlines()[0]})") from err
        check_io(self.session, entry, path)
        kv = entry["kv"]
        self.max_seq_len, self.max_batch, self.max_step = max_seq_len, max_batch, max_step
        self.kv_slots, self.num_layers = kv["slots"], kv["num_layers"]
        self.vocab_columns = entry["spec"]["vocab_size"]
        self.kv_names = entry["io"]["kv"]                                   # [[past_k, past_v, present_k, present_v]]
        shape = (max_batch, kv["num_kv_heads"], self.kv_slots, kv["head_dim"])       # [N, H_kv, S, D]
        self.keys, self.values = _kv_buffers(path, shape, self.num_layers, np.dtype(KV_NUMPY[kv_dtype]))
        rows = scratch_rows(max_batch, max_step)                            # the largest call pad_call lays out
        self._ids, self._positions, self._logit_rows = (np.zeros(rows, np.int64) for _ in range(3))
        self._logits = np.empty(rows * self.vocab_columns, np.float32)
        self._out_ids = np.empty(rows, np.int64)
        self._bindings: dict[tuple[int, int], list] = {}                    # (lo, B) -> [binding, kv values, shape]

    @property
    def kv_slot_bytes(self) -> int:
        return 2 * sum(k[0].nbytes for k in self.keys)

    def _binding(self, lo: int, b: int) -> list:
        """The IOBinding for slots lo .. lo + b - 1, its KV bound once (past and present: one OrtValue)."""
        entry = self._bindings.get((lo, b))
        if entry is None:
            binding, values = self.session.io_binding(), []
            for (past_k, past_v, present_k, present_v), k, v in zip(self.kv_names, self.keys, self.values):
                for past, present, buf in ((past_k, present_k, k), (past_v, present_v, v)):
                    value = self._ort.OrtValue.ortvalue_from_numpy(buf[lo: lo + b])   # a view: zero-copy
                    values.append(value)                                            # keeps it alive
                    binding.bind_ortvalue_input(past, value)
                    binding.bind_ortvalue_output(present, value)
            entry = self._bindings[(lo, b)] = [binding, values, None]
        return entry

    def run(self, starts, tokens, last, lo: int = 0, want: str = "logits") -> list[np.ndarray]:
        b = len(starts)
        assert 0 <= lo and lo + b <= self.max_batch, (lo, b, self.max_batch)
        call = pad_call(starts, tokens, last, self.min_rows, self._ids, self._positions, self._logit_rows)
        t, n = call.ids.shape[1], call.logit_rows.shape[1]
        assert max(starts) + t <= self.kv_slots, (starts, t, self.kv_slots)
        entry = self._binding(lo, b)
        binding = entry[0]
        if entry[2] != (t, n):                       # rebind the small tensors only when the call's shape changes
            binding.bind_input("input_ids", "cpu", 0, np.int64, [b, t], self._ids.ctypes.data)
            binding.bind_input("position_ids", "cpu", 0, np.int64, [b, t], self._positions.ctypes.data)
            binding.bind_input("logit_rows", "cpu", 0, np.int64, [b, n], self._logit_rows.ctypes.data)
            binding.bind_output("logits", "cpu", 0, np.float32, [b, n, self.vocab_columns], self._logits.ctypes.data)
            binding.bind_output("ids", "cpu", 0, np.int64, [b, n], self._out_ids.ctypes.data)
            entry[2] = (t, n)
        self.session.run_with_iobinding(binding)
        if want == "ids":
            out = self._out_ids[: b * n].reshape(b, n)
        else:
            out = self._logits[: b * n * self.vocab_columns].reshape(b, n, self.vocab_columns)
        return [out[r, n - want_r:] if want_r else out[r, :0] for r, want_r in enumerate(call.last)]

    def move_slot(self, src: int, dst: int, length: int) -> None:
        for buf in (*self.keys, *self.values):
            buf[dst, :, :length] = buf[src, :, :length]
