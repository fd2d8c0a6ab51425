"""Stand-ins for `tensorrt` (10.15's Python API) and cuda-python's runtime, for tests on machines without either.

install(monkeypatch) puts them into sys.modules as `tensorrt`, `cuda`, `cuda.bindings` and `cuda.bindings.runtime`.
"Device" memory is host memory (ctypes buffers at their addresses); streams run each operation at once unless they
are capturing, in which case it is recorded into a graph that cudaGraphLaunch replays. The builder checks what the
real one would refuse (ops outside the standard variant, TensorScatter's axis, profiles that miss an input or are out
of order) and serializes a small plan naming the .onnx file; an execution context checks shapes against its profile
and that each present_* has its past_*'s address (KVCacheUpdate's in-place rule), then runs the step graph on
onnxruntime's CPU provider through the addresses it was given. So the backend's binding, padding, aliasing and
read-back logic are exercised end to end; nothing about TensorRT's kernels is.
"""

from __future__ import annotations

import ctypes
import enum
import importlib.machinery
import json
import sys
import types
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort

MAGIC = b"FAKE-TRT-PLAN\n"
ONNX_TYPES = {1: "FLOAT", 10: "HALF", 16: "BF16", 6: "INT32", 7: "INT64", 9: "BOOL"}
NUMPY = {"FLOAT": np.float32, "HALF": np.float16, "INT32": np.int32, "INT64": np.int64, "BOOL": np.bool_}


class State:
    """What the stand-ins share and what tests set or read."""

    def __init__(self):
        self.gpu_name, self.major, self.minor, self.device_count = "Fake H200", 9, 0, 1
        self.memory_limit = None                 # bytes of "device" memory before cudaMalloc fails
        self.allocated = 0
        self.memory: dict[int, ctypes.Array] = {}
        self.sizes: dict[int, int] = {}
        self.streams: dict[int, "Stream"] = {}
        self.fail_build_for: str | None = None   # an .onnx file name whose build returns None
        self.builds: list[dict] = []             # what build_serialized_network saw
        self.contexts: list["Context"] = []
        self.launches = 0                        # cudaGraphLaunch calls
        self.executions = 0                      # graph runs (captured replays included)
        self.captures = 0
        self.capture_unsupported = False         # cudaStreamBeginCapture fails


# -- cuda-python's runtime --------------------------------------------------------------------------------
class Stream:
    def __init__(self, state: State):
        self.handle = 0x5000 + len(state.streams)
        self.capturing: list | None = None
        state.streams[self.handle] = self

    def __int__(self):
        return self.handle

    def do(self, op) -> None:
        if self.capturing is not None:
            self.capturing.append(op)
        else:
            op()


def make_cudart(state: State) -> types.ModuleType:
    rt = types.ModuleType("cuda.bindings.runtime")
    ok = 0
    rt.cudaMemcpyKind = types.SimpleNamespace(cudaMemcpyHostToDevice=1, cudaMemcpyDeviceToHost=2,
                                              cudaMemcpyDeviceToDevice=3)
    rt.cudaStreamCaptureMode = types.SimpleNamespace(cudaStreamCaptureModeGlobal=0,
                                                     cudaStreamCaptureModeThreadLocal=1)
    rt.cudaStreamNonBlocking = 1
    rt.cudaGetErrorString = lambda err: (ok, b"out of memory" if err == 2 else b"fake cuda error")
    rt.cudaGetDeviceCount = lambda: (ok, state.device_count)
    rt.cudaSetDevice = lambda i: (ok,) if i < state.device_count else (101,)

    def properties(i):
        name = state.gpu_name.encode() + b"\x00" * 8
        return ok, types.SimpleNamespace(name=name, major=state.major, minor=state.minor, totalGlobalMem=80 << 30)

    rt.cudaGetDeviceProperties = properties
    rt.cudaRuntimeGetVersion = lambda: (ok, 12090)
    rt.cudaDriverGetVersion = lambda: (ok, 13000)

    def malloc(nbytes):
        if state.memory_limit is not None and state.allocated + nbytes > state.memory_limit:
            return 2, 0                                                    # cudaErrorMemoryAllocation
        buf = ctypes.create_string_buffer(max(nbytes, 1))
        ptr = ctypes.addressof(buf)
        state.memory[ptr], state.sizes[ptr] = buf, nbytes
        state.allocated += nbytes
        return ok, ptr

    def free(ptr):
        state.memory.pop(ptr)
        state.allocated -= state.sizes.pop(ptr)
        return (ok,)

    rt.cudaMalloc, rt.cudaMallocHost, rt.cudaFree, rt.cudaFreeHost = malloc, malloc, free, free

    def stream_of(stream) -> Stream:
        return state.streams[int(stream)]

    def memset(ptr, value, nbytes, stream):
        stream_of(stream).do(lambda: ctypes.memset(ptr, value, nbytes))
        return (ok,)

    def memcpy(dst, src, nbytes, kind, stream):
        stream_of(stream).do(lambda: ctypes.memmove(dst, src, nbytes))
        return (ok,)

    def memcpy_2d(dst, dpitch, src, spitch, width, height, kind, stream):
        def op():
            for row in range(height):
                ctypes.memmove(dst + row * dpitch, src + row * spitch, width)
        stream_of(stream).do(op)
        return (ok,)

    rt.cudaMemsetAsync, rt.cudaMemcpyAsync, rt.cudaMemcpy2DAsync = memset, memcpy, memcpy_2d
    rt.cudaStreamCreateWithFlags = lambda flags: (ok, Stream(state))
    rt.cudaStreamSynchronize = lambda stream: (ok,)
    rt.cudaStreamDestroy = lambda stream: (ok,)

    def begin(stream, mode):
        if state.capture_unsupported:
            return (900,)                                                  # cudaErrorStreamCaptureUnsupported
        stream_of(stream).capturing = []
        return (ok,)

    def end(stream):
        s = stream_of(stream)
        ops, s.capturing = s.capturing, None
        state.captures += 1
        return ok, types.SimpleNamespace(ops=ops)

    def launch(graph_exec, stream):
        state.launches += 1
        stream_of(stream).do(lambda: [op() for op in graph_exec.ops])
        return (ok,)

    rt.cudaStreamBeginCapture, rt.cudaStreamEndCapture = begin, end
    rt.cudaGraphInstantiate = lambda graph, flags: (ok, types.SimpleNamespace(ops=list(graph.ops)))
    rt.cudaGraphLaunch = launch
    rt.cudaGraphExecDestroy = rt.cudaGraphDestroy = lambda g: (ok,)
    return rt


# -- tensorrt ---------------------------------------------------------------------------------------------
def make_tensorrt(state: State) -> types.ModuleType:
    trt = types.ModuleType("tensorrt")
    trt.__version__ = "10.15.1.29"
    trt.DataType = enum.Enum("DataType", "FLOAT HALF BF16 INT32 INT64 BOOL")
    trt.TensorIOMode = enum.Enum("TensorIOMode", "NONE INPUT OUTPUT")
    trt.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", {"STRONGLY_TYPED": 1})
    trt.HardwareCompatibilityLevel = enum.Enum("HardwareCompatibilityLevel", "NONE AMPERE_PLUS SAME_COMPUTE_CAPABILITY")
    trt.MemoryPoolType = enum.Enum("MemoryPoolType", "WORKSPACE")

    class Logger:
        WARNING, ERROR, INFO = 2, 1, 3

        def __init__(self, severity=2):
            self.severity = severity

    class Error:
        def __init__(self, op, text):
            self.op, self.text = op, text

        def desc(self):
            return self.text

        def node_operator(self):
            return self.op

    class Network:
        def __init__(self, flags):
            self.strongly_typed = bool(flags & (1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)))
            self.inputs, self.path = [], None

        @property
        def num_inputs(self):
            return len(self.inputs)

        def get_input(self, i):
            return types.SimpleNamespace(name=self.inputs[i].name)

    class OnnxParser:
        def __init__(self, network, logger):
            self.network, self.errors = network, []

        @property
        def num_errors(self):
            return len(self.errors)

        def get_error(self, i):
            return self.errors[i]

        def parse_from_file(self, path):
            return self.parse(Path(path).read_bytes(), path)

        def parse(self, model, path=None):
            proto = onnx.load_from_string(bytes(model))
            for node in proto.graph.node:
                if node.domain not in ("", "ai.onnx"):
                    self.errors.append(Error(node.op_type, f"no importer for {node.domain}.{node.op_type}"))
                axis = {a.name: a.i for a in node.attribute}.get("axis", -2)
                if node.op_type == "TensorScatter" and axis != -2:
                    self.errors.append(Error(node.op_type, f"axis must be -2, got {axis}"))
            self.network.inputs = list(proto.graph.input)
            self.network.outputs = list(proto.graph.output)
            self.network.path = str(path)
            return not self.errors

    class Profile:
        def __init__(self):
            self.shapes = {}

        def set_shape(self, name, low, opt, high):
            self.shapes[name] = (tuple(low), tuple(opt), tuple(high))

    class Config:
        def __init__(self):
            self.hardware_compatibility_level = trt.HardwareCompatibilityLevel.NONE
            self.profiles, self.pools = [], {}

        def set_memory_pool_limit(self, pool, size):
            self.pools[pool] = size

        def add_optimization_profile(self, profile):
            self.profiles.append(profile)
            return len(self.profiles) - 1

    class Builder:
        def __init__(self, logger):
            self.logger = logger

        def create_network(self, flags=0):
            return Network(flags)

        def create_builder_config(self):
            return Config()

        def create_optimization_profile(self):
            return Profile()

        def build_serialized_network(self, network, config):
            state.builds.append({"path": network.path, "strongly_typed": network.strongly_typed,
                                 "level": config.hardware_compatibility_level.name,
                                 "profiles": [p.shapes for p in config.profiles]})
            if state.fail_build_for and Path(network.path).name == state.fail_build_for:
                return None
            for value in network.inputs:
                dims = [d.dim_value if d.HasField("dim_value") else -1 for d in value.type.tensor_type.shape.dim]
                for profile in config.profiles:
                    low, opt, high = profile.shapes[value.name]          # a missing input: KeyError, as a test failure
                    assert len(low) == len(dims) and all(a <= b <= c for a, b, c in zip(low, opt, high))
                    assert all(d == -1 or a == c == d for d, a, c in zip(dims, low, high)), (value.name, dims, low)
            io = {v.name: ["INPUT", ONNX_TYPES[v.type.tensor_type.elem_type]] for v in network.inputs}
            io.update({v.name: ["OUTPUT", ONNX_TYPES[v.type.tensor_type.elem_type]] for v in network.outputs})
            plan = {"onnx": network.path, "version": trt.__version__, "io": io,
                    "profiles": [{name: list(map(list, s)) for name, s in p.shapes.items()} for p in config.profiles]}
            return MAGIC + json.dumps(plan).encode()

    class Context:
        def __init__(self, engine):
            self.engine, self.profile, self.shapes, self.addresses = engine, 0, {}, {}
            state.contexts.append(self)

        def set_optimization_profile_async(self, index, stream_handle):
            self.profile = index
            return 0 <= index < len(self.engine.profiles)

        def set_input_shape(self, name, shape):
            low, _, high = self.engine.profiles[self.profile][name]
            shape = tuple(shape)
            if len(shape) != len(low) or not all(a <= s <= c for a, s, c in zip(low, shape, high)):
                return False
            self.shapes[name] = shape
            return True

        def set_tensor_address(self, name, address):
            self.addresses[name] = int(address)
            return name in self.engine.io

        def execute_async_v3(self, stream_handle):
            shapes, addresses = dict(self.shapes), dict(self.addresses)      # a captured graph keeps these
            if set(shapes) != {n for n, (mode, _) in self.engine.io.items() if mode == "INPUT"}:
                return False
            if set(addresses) != set(self.engine.io):
                return False
            for name in self.engine.io:
                if name.startswith("present_") and addresses[name] != addresses[name.replace("present_", "past_")]:
                    return False                             # KVCacheUpdate: output and cache share their address
            state.streams[stream_handle].do(lambda: self.engine.run(shapes, addresses))
            return True

    class Engine:
        def __init__(self, plan: dict):
            self.plan, self.io = plan, plan["io"]
            self.profiles = [{name: tuple(map(tuple, s)) for name, s in p.items()} for p in plan["profiles"]]
            self.names = list(self.io)
            self._session = None
            self.device_memory_size_v2 = 1 << 20

        @property
        def num_io_tensors(self):
            return len(self.names)

        @property
        def num_optimization_profiles(self):
            return len(self.profiles)

        def get_tensor_name(self, i):
            return self.names[i]

        def get_tensor_mode(self, name):
            return trt.TensorIOMode[self.io[name][0]]

        def get_tensor_dtype(self, name):
            return trt.DataType[self.io[name][1]]

        def get_tensor_profile_shape(self, name, index):
            return self.profiles[index][name]

        def get_aliased_input_tensor(self, name):
            return name.replace("present_", "past_") if name.startswith("present_") else None

        def create_execution_context(self):
            return Context(self)

        def run(self, shapes: dict, addresses: dict) -> None:
            """The step graph on onnxruntime's CPU provider, reading and writing the bound addresses."""
            if self._session is None:
                self._session = ort.InferenceSession(self.plan["onnx"], providers=["CPUExecutionProvider"])
            b, t = shapes["input_ids"]
            n = shapes["logit_rows"][1]
            vocab = [o for o in self._session.get_outputs() if o.name == "logits"][0].shape[-1]
            binding = self._session.io_binding()
            for name, shape in shapes.items():
                binding.bind_input(name, "cpu", 0, NUMPY[self.io[name][1]], list(shape), addresses[name])
            for name, (mode, dtype) in self.io.items():
                if mode != "OUTPUT":
                    continue
                if name.startswith("present_"):
                    shape = shapes[name.replace("present_", "past_")]
                else:
                    shape = [b, n, vocab] if name == "logits" else [b, n]
                binding.bind_output(name, "cpu", 0, NUMPY[dtype], list(shape), addresses[name])
            self._session.run_with_iobinding(binding)
            state.executions += 1

    class Runtime:
        def __init__(self, logger):
            self.logger = logger

        def deserialize_cuda_engine(self, plan):
            plan = bytes(plan)
            if not plan.startswith(MAGIC):
                return None
            record = json.loads(plan[len(MAGIC):])
            if record["version"] != trt.__version__:
                return None                          # a plan of another TensorRT version does not load
            return Engine(record)

    trt.Logger, trt.Builder, trt.OnnxParser, trt.Runtime = Logger, Builder, OnnxParser, Runtime
    return trt


def install(monkeypatch, state: State | None = None) -> State:
    """Both stand-ins into sys.modules (undone by monkeypatch at the test's end) -> their shared state."""
    state = state or State()
    rt = make_cudart(state)
    bindings = types.ModuleType("cuda.bindings")
    bindings.runtime = rt
    cuda = types.ModuleType("cuda")
    cuda.bindings = bindings
    for name, module in (("tensorrt", make_tensorrt(state)), ("cuda", cuda), ("cuda.bindings", bindings),
                         ("cuda.bindings.runtime", rt)):
        module.__spec__ = importlib.machinery.ModuleSpec(name, None)     # importlib.util.find_spec asks for one
        monkeypatch.setitem(sys.modules, name, module)
    return state
