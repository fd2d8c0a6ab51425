"""onnxruntime's CUDA execution provider: KV buffers on the device, fixed decode shapes, CUDA graphs.

Memory: per layer one device OrtValue [max_batch, H_kv, slots, D] for K and one for V (the bundle's dtype),
allocated and zeroed once at load, plus device scratch for the call's inputs (ids, positions, logit rows) and
outputs (logits, ids). A call binds raw pointers into them: past_* and present_* of a layer to the same address
(the graph writes the new K/V in place), offset to the call's first slot, so a call over slots lo .. lo + B - 1
copies no KV. Per call only the small inputs go to the device, and only the argmax ids come back (greedy); the
logits rows come back only when the caller samples. Copies of sub-ranges go through the CUDA runtime
(device_memory.py), since onnxruntime's Python API copies only whole OrtValues.

Exact by construction: GPU kernels may pick another tiling for another row count, so a token's row in a verify
call could differ in the last bits from the same token run alone, and greedy speculative output from target-only
output at near-ties. Here every decode-sized call (T <= width) runs at one shape: T = width tokens a row
(width = max_draft + 1 for the target, 2 for the draft), width logit rows, and all max_batch rows (the rows of
free slots are dummies written at position max_seq_len and beyond, scratch in every slot). One shape means one
kernel choice, so a row's result depends only on its own tokens, alone or in a batch; and one CUDA graph per
model replays it (`gpu_graph_id`). Prefill chunks run at their own shapes, uncaptured. The load-time row probe
(row_check.py) and `inspect --verify` check the promise on the GPU at hand.

Variant: the standard one (TensorScatter + masked attention, any batch), in any dtype. GroupQueryAttention bundles
are refused: their total_sequence_length input lives in host memory, so the graph would hold a device-to-host
copy (which rules out CUDA graphs), and they run one row per call.
`device="cpu"` runs this same code on the CPU provider with host memory: the tests' way to exercise it here.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from specedge.errors import BundleError, OptionError
from specedge.runtime.backends.base import ModelBackend, scratch_rows
from specedge.runtime.backends.cpu import check_io
from specedge.runtime.backends.device_memory import CudaCopies, HostCopies

ONNX_TYPES = {"float32": 1, "float16": 10, "bfloat16": 16}          # TensorProto data types
ITEM_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2}
ZERO_CHUNK = 1 << 24                                                  # bytes of zeros per copy when clearing KV


def install_problem() -> str | None:
    """onnxruntime and onnxruntime-gpu installed side by side share one `onnxruntime` package folder, and which one
    answers is whichever was installed last: -> the one-line fix, or None."""
    from importlib import metadata

    folders: dict[str, set] = {}                     # only two in one folder overwrite each other
    for dist in metadata.distributions():
        name = (dist.metadata["Name"] or "").lower().replace("_", "-")
        if name in ("onnxruntime", "onnxruntime-gpu"):
            folders.setdefault(str(dist.locate_file("")), set()).add(name)
    if any(names == {"onnxruntime", "onnxruntime-gpu"} for names in folders.values()):
        return ("onnxruntime and onnxruntime-gpu are both installed and overwrite each other; fix: pip uninstall -y "
                "onnxruntime onnxruntime-gpu && pip install 'onnxruntime-gpu>=1.31.1,<1.33'")
    return None


def preload_cuda_libraries(ort) -> None:
    """CUDA and cuDNN from the nvidia-* wheels are on no loader path: onnxruntime-gpu (1.21+) loads them on
    request. Without it the CUDA provider fails to load and onnxruntime would fall back to the CPU."""
    preload = getattr(ort, "preload_dlls", None)
    if preload is not None:
        try:
            preload()
        except Exception:  # noqa: BLE001 - libraries on the system path serve as well; the session check below tells
            pass


class CudaBackend(ModelBackend):
    name = "cuda"

    @classmethod
    def check_available(cls, device: str = "cuda", **_) -> None:
        import onnxruntime as ort

        if device == "cpu":
            return
        problem = install_problem()
        if problem:
            raise RuntimeError(problem)
        if "CUDAExecutionProvider" not in ort.get_available_providers():
            raise RuntimeError(f"onnxruntime {ort.__version__} has no CUDA execution provider (the CPU build is "
                               "installed); pip uninstall -y onnxruntime && pip install 'specedge[cuda]'")
        preload_cuda_libraries(ort)

    def __init__(self, path: Path, entry: dict, max_seq_len: int, max_batch: int = 1, threads: int | None = None,
                 max_step: int = 64, device_id: int = 0, cuda_graphs: bool = True, width: int = 0,
                 device: str = "cuda", profile: str | None = None):
        import onnxruntime as ort

        self._ort = ort
        if entry["graph_variant"] != "static-kv-standard-v1":
            raise OptionError(f"the cuda backend runs bundles exported with --attention standard; this one's "
                              f"{entry['graph_variant']} graph keeps a host-memory length input (no CUDA graphs) "
                              "and one row per call: re-export with --attention standard")
        kv = entry["kv"]
        self.dtype = kv.get("dtype", "float32")
        self.max_seq_len, self.max_batch, self.max_step = max_seq_len, max_batch, max_step
        self.kv_slots, self.num_layers = kv["slots"], kv["num_layers"]
        self.heads, self.head_dim = kv["num_kv_heads"], kv["head_dim"]
        self.width = width
        if width and max_seq_len + width > self.kv_slots:
            raise BundleError(f"{path}: {self.kv_slots} KV slots leave no room for decode calls {width} tokens wide")
        self.vocab_columns = entry["spec"]["vocab_size"]
        self.device, self.device_id = device, device_id
        self.copies = HostCopies() if device == "cpu" else CudaCopies(device_id)
        self.session, self.cuda_graphs, self.cuda_graph_problem = self._session(path, cuda_graphs and device != "cpu",
                                                                                profile)
        check_io(self.session, entry, path)
        self.kv_names = entry["io"]["kv"]
        self._slot_bytes = self.heads * self.kv_slots * self.head_dim * ITEM_BYTES[self.dtype]
        rows = scratch_rows(max_batch, max_step, width)      # the largest call pad_call lays out
        need = 2 * self.num_layers * max_batch * self._slot_bytes + rows * (3 * 8 + 8 + 4 * self.vocab_columns)
        try:
            shape = [max_batch, self.heads, self.kv_slots, self.head_dim]
            self.keys = [self._alloc(shape, ONNX_TYPES[self.dtype]) for _ in range(self.num_layers)]
            self.values = [self._alloc(shape, ONNX_TYPES[self.dtype]) for _ in range(self.num_layers)]
            self._dev_ids, self._dev_positions, self._dev_logit_rows, self._dev_out_ids = (
                self._alloc([rows], np.int64) for _ in range(4))
            self._dev_logits = self._alloc([rows * self.vocab_columns], np.float32)
        except Exception as err:  # onnxruntime's allocator raises its own error types
            if "memory" in str(err).lower() or "allocate" in str(err).lower():
                raise OptionError(f"{device} {device_id} is out of memory for KV and scratch of max_batch {max_batch} "
                                  f"({need / 2**30:.2f} GiB besides the weights); lower --max-batch or export with "
                                  "a smaller --max-seq-len") from err
            raise
        self.device_bytes = need
        for buf in (*self.keys, *self.values):          # zeroed once: stale slots must hold finite numbers
            self._zero(buf.data_ptr(), max_batch * self._slot_bytes)
        # host staging, laid out by pad_call as on the CPU
        self._ids, self._positions, self._logit_rows = (np.zeros(rows, np.int64) for _ in range(3))
        self._logits = np.empty(rows * self.vocab_columns, np.float32)
        self._out_ids = np.empty(rows, np.int64)
        self._bindings: dict[tuple, tuple] = {}          # (lo, B, T, n) -> (binding, run options)

    def _session(self, path: Path, cuda_graphs: bool, profile: str | None):
        """-> (session, CUDA graphs on, why not). A graph that onnxruntime cannot capture (a node it placed on the
        CPU) refuses enable_cuda_graph at session creation: then the session runs without, and says why."""
        ort = self._ort
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.log_severity_level = 3
        if profile:
            options.enable_profiling, options.profile_file_prefix = True, profile
        if self.device == "cpu":
            providers = ["CPUExecutionProvider"]
        else:
            # use_tf32 off: a float32 bundle multiplies in float32, as it does on the CPU (onnxruntime's default
            # rounds float32 matmul inputs to TF32's 10-bit mantissa on Ampere and later)
            providers = [("CUDAExecutionProvider", {"device_id": str(self.device_id), "use_tf32": "0",
                                                    "enable_cuda_graph": "1" if cuda_graphs else "0"})]
        # onnxruntime fuses the float32 RMSNorm of a bfloat16 graph into a SimplifiedLayerNormalization whose
        # mixed types its CUDA kernel lacks (1.31: float, float16 and bfloat16 only alike): keep it unfused there
        disabled = ["SimplifiedLayerNormFusion"] if self.dtype == "bfloat16" else []
        try:
            session = ort.InferenceSession(str(path), options, providers=providers, disabled_optimizers=disabled)
        except Exception as err:  # onnxruntime raises its own untyped errors
            first = str(err).splitlines()[0]
            if cuda_graphs and "graph" in first.lower():
                session, _, _ = self._session(path, False, profile)
                return session, False, first
            raise BundleError(f"{path}: cannot load model on {self.device} ({first})") from err
        if providers[0] != "CPUExecutionProvider" and session.get_providers()[0] != "CUDAExecutionProvider":
            raise OptionError(f"onnxruntime could not start its CUDA provider (CUDA {self.device_id}), and would run "
                               "on the CPU instead; its log says why (often: CUDA 13 or cuDNN 9 libraries missing)")
        return session, cuda_graphs, None

    def _alloc(self, shape, element_type):
        return self._ort.OrtValue.ortvalue_from_shape_and_type(shape, element_type, self.device, self.device_id)

    def _zero(self, ptr: int, nbytes: int) -> None:
        zeros = np.zeros(min(nbytes, ZERO_CHUNK), np.uint8)
        for at in range(0, nbytes, zeros.nbytes):
            chunk = min(zeros.nbytes, nbytes - at)
            self.copies.to_device(ptr + at, zeros[:chunk])

    @property
    def kv_slot_bytes(self) -> int:
        return 2 * self.num_layers * self._slot_bytes

    def _binding(self, key: tuple) -> tuple:
        """The IOBinding of one call shape over slots lo .. lo + B - 1: every input and output bound to a fixed
        address (what a CUDA graph replays), past and present of a layer to the same one."""
        found = self._bindings.get(key)
        if found is not None:
            return found
        lo, b, t, n = key
        dev, dev_id, kv_type = self.device, self.device_id, ONNX_TYPES[self.dtype]
        binding = self.session.io_binding()
        shape = [b, self.heads, self.kv_slots, self.head_dim]
        for (past_k, past_v, present_k, present_v), k, v in zip(self.kv_names, self.keys, self.values):
            for past, present, buf in ((past_k, present_k, k), (past_v, present_v, v)):
                ptr = buf.data_ptr() + lo * self._slot_bytes
                binding.bind_input(past, dev, dev_id, kv_type, shape, ptr)
                binding.bind_output(present, dev, dev_id, kv_type, shape, ptr)
        binding.bind_input("input_ids", dev, dev_id, np.int64, [b, t], self._dev_ids.data_ptr())
        binding.bind_input("position_ids", dev, dev_id, np.int64, [b, t], self._dev_positions.data_ptr())
        binding.bind_input("logit_rows", dev, dev_id, np.int64, [b, n], self._dev_logit_rows.data_ptr())
        binding.bind_output("logits", dev, dev_id, np.float32, [b, n, self.vocab_columns], self._dev_logits.data_ptr())
        binding.bind_output("ids", dev, dev_id, np.int64, [b, n], self._dev_out_ids.data_ptr())
        run_options = self._ort.RunOptions()
        if self.cuda_graphs:        # decode shapes replay a captured graph; prefill shapes run uncaptured (-1)
            graph_id = len([k for k in self._bindings if k[2] <= self.width]) + 1 if t <= self.width else -1
            run_options.add_run_config_entry("gpu_graph_id", str(graph_id))
        found = self._bindings[key] = (binding, run_options)
        return found

    def run(self, starts, tokens, last, lo: int = 0, want: str = "logits") -> list[np.ndarray]:
        b = len(starts)
        call = self._fixed_shape_call(starts, tokens, last, lo)
        rows, t, n = call.ids.shape[0], call.ids.shape[1], call.logit_rows.shape[1]
        binding, run_options = self._binding((lo, rows, t, n))
        self.copies.to_device(self._dev_ids.data_ptr(), self._ids[: rows * t])
        self.copies.to_device(self._dev_positions.data_ptr(), self._positions[: rows * t])
        self.copies.to_device(self._dev_logit_rows.data_ptr(), self._logit_rows[: rows * n])
        self.session.run_with_iobinding(binding, run_options)
        binding.synchronize_outputs()
        # only the caller's b rows come back (they lead; dummy rows follow)
        if want == "ids":
            out = self._out_ids[: b * n]
            self.copies.to_host(out, self._dev_out_ids.data_ptr())
            out = out.reshape(b, n)
        else:
            out = self._logits[: b * n * self.vocab_columns]
            self.copies.to_host(out, self._dev_logits.data_ptr())
            out = out.reshape(b, n, self.vocab_columns)
        return [out[r, n - want_r:] if want_r else out[r, :0] for r, want_r in enumerate(call.last[:b])]

    def move_slot(self, src: int, dst: int, length: int) -> None:
        item = ITEM_BYTES[self.dtype]
        head_bytes = self.kv_slots * self.head_dim * item
        for buf in (*self.keys, *self.values):
            base = buf.data_ptr()
            for h in range(self.heads):
                self.copies.on_device(base + dst * self._slot_bytes + h * head_bytes,
                                      base + src * self._slot_bytes + h * head_bytes, length * self.head_dim * item)
        self.copies.synchronize()
