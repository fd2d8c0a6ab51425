"""A small ONNX graph builder that streams weights into an external-data file as it goes.

Weights never accumulate in the ModelProto: each initializer is appended to `<model>.onnx.data`
(4 KiB aligned, so onnxruntime can map it) and the proto keeps only a reference. That keeps export
memory flat and makes models over 2 GB a non-issue.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

OPSET = 24                            # TensorScatter (standard graphs); ops take axes/splits as inputs
IR_VERSION = 12                       # the IR version that opset 24 came with (onnx 1.19)
ALIGN = 4096
INLINE_LIMIT_BYTES = 1024

FLOAT_TYPES = {"float32": TensorProto.FLOAT, "float16": TensorProto.FLOAT16, "bfloat16": TensorProto.BFLOAT16}

_ONNX_DTYPES = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float16): TensorProto.FLOAT16,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.uint8): TensorProto.UINT8,
    np.dtype(np.bool_): TensorProto.BOOL,
}


class GraphBuilder:
    """Collects nodes; `weight()` writes tensors to the external data file immediately."""

    def __init__(self, onnx_path: Path, graph_name: str, float_dtype: str = "float32"):
        """float_dtype: how float32 weights are stored ("float32", "float16", "bfloat16"); `weight(keep=True)`
        keeps one in float32 (norms and softmax run in float32 in a half-precision graph)."""
        self.onnx_path = Path(onnx_path)
        self.float_dtype, self.float_type = float_dtype, FLOAT_TYPES[float_dtype]
        self.data_name = self.onnx_path.name + ".data"
        self._data = open(self.onnx_path.parent / self.data_name, "wb")
        self._offset = 0
        self.name = graph_name
        self.nodes: list[onnx.NodeProto] = []
        self.initializers: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.outputs: list[onnx.ValueInfoProto] = []
        self._count = 0
        self.weight_bytes = 0

    # -- values -------------------------------------------------------------------------------
    def _fresh(self, hint: str) -> str:
        self._count += 1
        return f"{hint}_{self._count}"

    def weight(self, name: str, array: np.ndarray, keep: bool = False) -> str:
        """Adds a constant tensor; large ones go to external data right away. A float32 array is stored in the
        graph's float dtype unless `keep`."""
        array = np.ascontiguousarray(array)
        if array.dtype not in _ONNX_DTYPES:
            raise TypeError(f"unsupported initializer dtype {array.dtype} for {name}")
        data_type = _ONNX_DTYPES[array.dtype]
        if array.dtype == np.float32 and not keep and self.float_dtype != "float32":
            array, data_type = _to_half(array, self.float_dtype), self.float_type
        if array.nbytes <= INLINE_LIMIT_BYTES:
            tensor = numpy_helper.from_array(array, name)
            tensor.data_type = data_type                 # bfloat16 travels as its raw 16-bit patterns
            self.initializers.append(tensor)
            return name
        pad = (-self._offset) % ALIGN
        if pad:
            self._data.write(b"\0" * pad)
            self._offset += pad
        self._data.write(array.tobytes())
        tensor = TensorProto()
        tensor.name = name
        tensor.data_type = data_type
        tensor.dims.extend(array.shape)
        tensor.data_location = TensorProto.EXTERNAL
        for key, value in (("location", self.data_name), ("offset", str(self._offset)),
                           ("length", str(array.nbytes))):
            entry = tensor.external_data.add()
            entry.key, entry.value = key, value
        self.initializers.append(tensor)
        self._offset += array.nbytes
        self.weight_bytes += array.nbytes
        return name

    def const(self, value, dtype=np.int64, hint: str = "const", keep: bool = False) -> str:
        return self.weight(self._fresh(hint), np.asarray(value, dtype=dtype), keep=keep)

    def to_float32(self, x: str) -> str:
        """x in the graph's float dtype -> float32 (nothing in a float32 graph)."""
        return x if self.float_dtype == "float32" else self.op("Cast", x, to=TensorProto.FLOAT)

    def from_float32(self, x: str, out_name: str | None = None) -> str:
        """x float32 -> the graph's float dtype (nothing in a float32 graph)."""
        if self.float_dtype == "float32":
            return x
        return self.op("Cast", x, to=self.float_type, out_names=[out_name])

    def input(self, name: str, elem_type: int, shape: list) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    def output(self, value: str, name: str, elem_type: int, shape: list) -> str:
        """Makes `value` the graph output `name` (an Identity node; a value already named so is declared only)."""
        if value != name:
            self.nodes.append(helper.make_node("Identity", [value], [name], name=f"out_{name}"))
        self.outputs.append(helper.make_tensor_value_info(name, elem_type, shape))
        return name

    # -- ops ----------------------------------------------------------------------------------
    def op(self, op_type: str, *inputs: str, n_out: int = 1, domain: str = "", out_names=None, **attrs):
        """Adds a node; `out_names` (None entries get fresh names) names outputs that must be the node's own
        tensors, such as graph outputs bound to the inputs' memory."""
        outs = [name or self._fresh(op_type.lower()) for name in (out_names or [None] * n_out)]
        self.nodes.append(helper.make_node(op_type, list(inputs), outs, name=outs[0],
                                           domain=domain or None, **attrs))
        return outs[0] if n_out == 1 else outs

    # -- finish -------------------------------------------------------------------------------
    def save(self) -> None:
        self._data.close()
        graph = helper.make_graph(self.nodes, self.name, self.inputs, self.outputs, self.initializers)
        opsets = [helper.make_opsetid("", OPSET)]
        if any(node.domain == "com.microsoft" for node in self.nodes):
            opsets.append(helper.make_opsetid("com.microsoft", 1))
        model = helper.make_model(graph, opset_imports=opsets, producer_name="specedge")
        model.ir_version = IR_VERSION
        with open(self.onnx_path, "wb") as f:
            f.write(model.SerializeToString())
        onnx.checker.check_model(str(self.onnx_path))


def _to_half(array: np.ndarray, dtype: str) -> np.ndarray:
    """float32 -> float16, or bfloat16 as uint16 bit patterns (round to nearest even, NaN kept NaN)."""
    if dtype == "float16":
        return array.astype(np.float16)
    bits = array.view(np.uint32)
    rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)
    return np.where(np.isnan(array), np.uint16(0x7FC0), rounded)
