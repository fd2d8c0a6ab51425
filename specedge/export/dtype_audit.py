"""What a half-precision step graph computes in which dtype, checked without running it.

onnxruntime's CPU provider cannot run float16/bfloat16 step graphs (see runtime/backends/cpu.py), so the export
check runs a float32 copy of the same graph against transformers and this audit checks the half-precision graph
itself: the ONNX checker (full), strict shape and type inference, the KV buffers and the activations in the
graph's dtype, and float32 only where intended (norms, softmax, RoPE angles, the logits). Any other float32
value, or a float tensor of a third type, fails the export.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import onnx
from onnx import TensorProto

from specedge.errors import ExportError
from specedge.export.onnx_builder import FLOAT_TYPES

# ops whose float32 outputs are intended in a half-precision graph: norms (the sum of squares overflows float16),
# softmax, RoPE angles (positions as float), the logits cast, and the small float32 arithmetic around them
FLOAT32_OPS = {"Cast", "Pow", "ReduceMean", "Add", "Sqrt", "Div", "Mul", "LayerNormalization", "Softmax", "Where",
               "Cos", "Sin", "Unsqueeze", "Tanh"}                 # Tanh: Gemma 2's soft-caps, in float32


def audit_dtype(path: Path, dtype: str) -> dict:
    """-> {"dtype", "float32_ops": {op: n}, "half_ops": {op: n}, "float32_initializers", "summary"}; raises
    ExportError when the graph is invalid or computes something in an unintended dtype."""
    half = FLOAT_TYPES[dtype]
    try:
        onnx.checker.check_model(str(path), full_check=True)
        inferred = onnx.shape_inference.infer_shapes(onnx.load(str(path), load_external_data=False), strict_mode=True,
                                                     data_prop=True)
    except Exception as err:  # onnx raises several types with multi-line messages
        raise ExportError(f"{path.name}: the {dtype} graph fails the ONNX checks ({str(err).splitlines()[0]})") from err
    graph = inferred.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*graph.input, *graph.output, *graph.value_info]}
    types.update({t.name: t.data_type for t in graph.initializer})
    _propagate(graph, types)
    float_kinds = {TensorProto.FLOAT, half}
    problems = []
    for value in graph.input:
        if value.name.startswith("past_") and types[value.name] != half:
            problems.append(f"input {value.name} is not {dtype}")
    for value in graph.output:
        wanted = TensorProto.FLOAT if value.name == "logits" else (half if value.name.startswith("present_") else None)
        if wanted is not None and types[value.name] != wanted:
            problems.append(f"output {value.name} has type {TensorProto.DataType.Name(types[value.name])}")
    float32_ops, half_ops = Counter(), Counter()
    for node in graph.node:
        out = types.get(node.output[0])
        if out == half:
            half_ops[node.op_type] += 1
        elif out == TensorProto.FLOAT:
            float32_ops[node.op_type] += 1
            if node.op_type not in FLOAT32_OPS:
                problems.append(f"{node.op_type} node {node.name} computes in float32")
        elif out in (TensorProto.FLOAT, TensorProto.DOUBLE, TensorProto.FLOAT16, TensorProto.BFLOAT16) \
                and out not in float_kinds:
            problems.append(f"{node.op_type} node {node.name} computes in {TensorProto.DataType.Name(out)}")
    matmuls = sum(half_ops[op] for op in ("MatMul", "Gemm", "MatMulNBits"))
    if not matmuls:
        problems.append(f"no matrix product runs in {dtype}")
    if problems:
        raise ExportError(f"{path.name}: the {dtype} graph is not as intended: {'; '.join(problems[:3])}")
    float32_initializers = sum(1 for t in graph.initializer if t.data_type == TensorProto.FLOAT)
    summary = (f"{sum(half_ops.values())} nodes in {dtype} ({matmuls} matrix products), "
               f"{sum(float32_ops.values())} in float32 ({', '.join(sorted(float32_ops))})")
    return {"dtype": dtype, "float32_ops": dict(sorted(float32_ops.items())), "half_ops": dict(sorted(half_ops.items())),
            "float32_initializers": float32_initializers, "summary": summary}


_INT64_OPS = {"Shape", "ArgMax", "ArgMin", "NonZero", "Size"}
_BOOL_OPS = {"Less", "LessOrEqual", "Greater", "GreaterOrEqual", "Equal", "Not", "And", "Or"}


def _propagate(graph, types: dict) -> None:
    """Types of the values ONNX inference leaves open: the outputs of com.microsoft ops (no schema in onnx) and
    everything after them. Nodes come in topological order; an op's output takes its first typed input's type,
    apart from casts, index-valued ops and comparisons; GatherBlockQuantized takes its scales' type."""
    for node in graph.node:
        for out in node.output:
            if types.get(out):
                continue
            if node.op_type == "Cast":
                types[out] = next(a.i for a in node.attribute if a.name == "to")
            elif node.op_type in _INT64_OPS:
                types[out] = TensorProto.INT64
            elif node.op_type in _BOOL_OPS:
                types[out] = TensorProto.BOOL
            elif node.op_type == "GatherBlockQuantized":
                types[out] = types.get(node.input[2], 0)
            else:
                types[out] = next((types[i] for i in node.input if types.get(i)), 0)
