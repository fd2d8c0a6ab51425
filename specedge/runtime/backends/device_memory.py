"""Copies between host arrays and device pointers, for backends whose buffers live on a device.

onnxruntime allocates the device memory (OrtValues) and binds raw pointers into it, but its Python API copies
only whole OrtValues; a backend needs sub-ranges (one slot's K/V when a sequence moves, the rows of a call's
inputs and outputs). CudaCopies calls the CUDA runtime (libcudart, which onnxruntime-gpu loads) through
ctypes: no torch or CuPy at run time. HostCopies does the same on host memory, so the device code path of a
backend runs, and is tested, on a machine without a GPU.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import os
import sys

import numpy as np

_H2D, _D2H, _D2D = 1, 2, 3                       # cudaMemcpyKind


class HostCopies:
    device_type = "cpu"

    def to_device(self, ptr: int, array: np.ndarray) -> None:
        ctypes.memmove(ptr, array.ctypes.data, array.nbytes)

    def to_host(self, array: np.ndarray, ptr: int) -> None:
        ctypes.memmove(array.ctypes.data, ptr, array.nbytes)

    def on_device(self, dst: int, src: int, nbytes: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def synchronize(self) -> None:
        pass


class CudaCopies(HostCopies):
    device_type = "cuda"

    def __init__(self, device_id: int = 0):
        self.lib = _cudart()
        self.lib.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        self._check(self.lib.cudaSetDevice(device_id), f"cudaSetDevice({device_id})")

    def _check(self, status: int, what: str) -> None:
        if status:
            name = self.lib.cudaGetErrorString
            name.restype = ctypes.c_char_p
            raise RuntimeError(f"{what} failed: {name(status).decode()}")

    def to_device(self, ptr: int, array: np.ndarray) -> None:
        self._check(self.lib.cudaMemcpy(ptr, array.ctypes.data, array.nbytes, _H2D), "copy to the device")

    def to_host(self, array: np.ndarray, ptr: int) -> None:
        self._check(self.lib.cudaMemcpy(array.ctypes.data, ptr, array.nbytes, _D2H), "copy to the host")

    def on_device(self, dst: int, src: int, nbytes: int) -> None:
        self._check(self.lib.cudaMemcpy(dst, src, nbytes, _D2D), "copy on the device")

    def synchronize(self) -> None:
        self._check(self.lib.cudaDeviceSynchronize(), "cudaDeviceSynchronize")


def _cudart():
    """The CUDA runtime library: already loaded by onnxruntime-gpu (its preload_dlls), on the loader's path, or in
    an nvidia-cuda-runtime wheel."""
    names = ["libcudart.so.13", "libcudart.so.12", "libcudart.so"] if sys.platform != "win32" else []
    found = ctypes.util.find_library("cudart")
    if found:
        names.append(found)
    for folder in sys.path:
        names += sorted(glob.glob(os.path.join(folder, "nvidia", "cu*", "lib", "libcudart.so*")))
        names += sorted(glob.glob(os.path.join(folder, "nvidia", "cuda_runtime", "lib", "libcudart.so*")))
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise RuntimeError("the CUDA runtime library (libcudart) was not found; install onnxruntime-gpu with its "
                       "CUDA dependencies (pip install 'specedge[cuda]')")
