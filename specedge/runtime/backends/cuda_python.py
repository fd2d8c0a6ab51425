"""The CUDA runtime through cuda-python (NVIDIA's bindings), for the tensorrt backend and the engine builder.

TensorRT takes raw device addresses and a stream handle; cuda-python allocates them, copies, and captures CUDA
graphs. Its calls return (error, results...) tuples; CudaRuntime raises CudaError with the error's text instead.
cuda-python >= 12.6 puts the runtime at cuda.bindings.runtime, older releases at cuda.cudart.
Nothing here has run on a GPU yet (docs/tensorrt.md); the tests run it against a stand-in module.
"""

from __future__ import annotations

import ctypes

import numpy as np


class CudaError(RuntimeError):
    pass


def import_cudart():
    """cuda-python's runtime module (ImportError naming cuda-python when it is not installed)."""
    try:
        from cuda.bindings import runtime
        return runtime
    except ImportError:
        pass
    try:
        from cuda import cudart
        return cudart
    except ImportError as err:
        raise ImportError("cuda-python is not installed", name="cuda-python") from err


class CudaRuntime:
    def __init__(self):
        self.rt = rt = import_cudart()
        kinds = rt.cudaMemcpyKind
        self.H2D, self.D2H, self.D2D = (kinds.cudaMemcpyHostToDevice, kinds.cudaMemcpyDeviceToHost,
                                        kinds.cudaMemcpyDeviceToDevice)

    def _call(self, what: str, result):
        err, rest = (result[0], result[1:]) if isinstance(result, tuple) else (result, ())
        if int(err) != 0:
            try:
                text = self.rt.cudaGetErrorString(err)[1]
                text = text.decode() if isinstance(text, bytes) else str(text)
            except Exception:  # the error text is a nicety; the code is what matters
                text = ""
            raise CudaError(f"{what} failed: {getattr(err, 'name', err)}{': ' + text if text else ''}")
        if not rest:
            return None
        return rest[0] if len(rest) == 1 else rest

    # -- devices --------------------------------------------------------------------------
    def device_count(self) -> int:
        return int(self._call("cudaGetDeviceCount", self.rt.cudaGetDeviceCount()))

    def set_device(self, device_id: int) -> None:
        self._call(f"cudaSetDevice({device_id})", self.rt.cudaSetDevice(device_id))

    def device(self, device_id: int) -> dict:
        """{"name", "compute_capability" ("9.0"), "total_bytes"} of a device."""
        prop = self._call(f"cudaGetDeviceProperties({device_id})", self.rt.cudaGetDeviceProperties(device_id))
        name = prop.name
        name = (name.decode(errors="replace") if isinstance(name, (bytes, bytearray)) else str(name)).split("\x00")[0]
        return {"name": name.strip(), "compute_capability": f"{prop.major}.{prop.minor}",
                "total_bytes": int(getattr(prop, "totalGlobalMem", 0))}

    def versions(self) -> tuple[str, str]:
        """(CUDA runtime version, the driver's CUDA version) as 'major.minor'."""
        def text(v: int) -> str:
            return f"{int(v) // 1000}.{int(v) % 1000 // 10}"
        return (text(self._call("cudaRuntimeGetVersion", self.rt.cudaRuntimeGetVersion())),
                text(self._call("cudaDriverGetVersion", self.rt.cudaDriverGetVersion())))

    # -- memory ---------------------------------------------------------------------------
    def malloc(self, nbytes: int) -> int:
        return int(self._call(f"cudaMalloc({nbytes} bytes)", self.rt.cudaMalloc(nbytes)))

    def free(self, ptr: int) -> None:
        self._call("cudaFree", self.rt.cudaFree(ptr))

    def host_array(self, count: int, dtype) -> tuple[int, np.ndarray]:
        """Pinned host memory as a numpy array (staging for asynchronous copies) -> (pointer, array)."""
        dtype = np.dtype(dtype)
        nbytes = max(count, 1) * dtype.itemsize
        ptr = int(self._call(f"cudaMallocHost({nbytes} bytes)", self.rt.cudaMallocHost(nbytes)))
        return ptr, np.frombuffer((ctypes.c_byte * nbytes).from_address(ptr), dtype=dtype)[:count]

    def free_host(self, ptr: int) -> None:
        self._call("cudaFreeHost", self.rt.cudaFreeHost(ptr))

    def memset(self, ptr: int, value: int, nbytes: int, stream) -> None:
        self._call("cudaMemsetAsync", self.rt.cudaMemsetAsync(ptr, value, nbytes, stream))

    def copy(self, dst: int, src: int, nbytes: int, kind, stream) -> None:
        self._call("cudaMemcpyAsync", self.rt.cudaMemcpyAsync(dst, src, nbytes, kind, stream))

    def copy_2d(self, dst: int, dst_pitch: int, src: int, src_pitch: int, width: int, height: int, kind,
                stream) -> None:
        self._call("cudaMemcpy2DAsync", self.rt.cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, width, height,
                                                                   kind, stream))

    # -- streams and graphs ---------------------------------------------------------------
    def stream(self):
        flags = getattr(self.rt, "cudaStreamNonBlocking", 1)
        return self._call("cudaStreamCreateWithFlags", self.rt.cudaStreamCreateWithFlags(flags))

    def synchronize(self, stream) -> None:
        self._call("cudaStreamSynchronize", self.rt.cudaStreamSynchronize(stream))

    def destroy_stream(self, stream) -> None:
        self._call("cudaStreamDestroy", self.rt.cudaStreamDestroy(stream))

    def begin_capture(self, stream) -> None:
        mode = self.rt.cudaStreamCaptureMode.cudaStreamCaptureModeThreadLocal
        self._call("cudaStreamBeginCapture", self.rt.cudaStreamBeginCapture(stream, mode))

    def end_capture(self, stream):
        """-> the captured graph (a graph that failed to capture raises CudaError)."""
        return self._call("cudaStreamEndCapture", self.rt.cudaStreamEndCapture(stream))

    def instantiate(self, graph):
        return self._call("cudaGraphInstantiate", self.rt.cudaGraphInstantiate(graph, 0))

    def launch(self, graph_exec, stream) -> None:
        self._call("cudaGraphLaunch", self.rt.cudaGraphLaunch(graph_exec, stream))

    def destroy_graph(self, graph, graph_exec) -> None:
        if graph_exec is not None:
            self._call("cudaGraphExecDestroy", self.rt.cudaGraphExecDestroy(graph_exec))
        if graph is not None:
            self._call("cudaGraphDestroy", self.rt.cudaGraphDestroy(graph))


def stream_handle(stream) -> int:
    """The integer handle TensorRT's execute_async_v3 / set_optimization_profile_async take."""
    return int(stream)
