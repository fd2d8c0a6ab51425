"""The ONNX operators TensorRT's ONNX parser supports, and a checker for step graphs.

Version: TensorRT 10.15 (onnx-tensorrt release/10.15-GA, 2026-02-02), the first release whose parser reads
TensorScatter (the standard variant's in-place KV write), mapped to TensorRT's KVCacheUpdate layer. It "supports
operators in the inclusive range of opset 9 to opset 24".
Source: https://github.com/onnx/onnx-tensorrt/blob/release/10.15-GA/docs/operators.md (the operator support
matrix, transcribed below: name, supported types, restrictions) and the 10.15 entry of onnx-tensorrt's
CHANGELOG.md ("Added support for RotaryEmbedding, RMSNormalization and TensorScatter"; Attention came in 10.14).
Only the default domain (ai.onnx) is in that list: com.microsoft operators (GroupQueryAttention, RotaryEmbedding,
MatMulNBits, GatherBlockQuantized, ...) are onnxruntime contrib ops that TensorRT's parser rejects without a
plugin. So the gqa variant and int4/int8 (MatMulNBits) bundles cannot be built; see refusal() below.

This table says what the parser accepts; whether a graph then builds and runs exactly is a GPU question that
has not been tried (docs/tensorrt.md).
"""

from __future__ import annotations

TENSORRT_VERSION = "10.15"
MIN_TENSORRT = (10, 15)
SOURCE = "https://github.com/onnx/onnx-tensorrt/blob/release/10.15-GA/docs/operators.md"
OPSET_RANGE = (9, 24)
DEFAULT_DOMAINS = ("", "ai.onnx")

_F = "FP32, FP16, BF16"
_FI = "FP32, FP16, BF16, INT32, INT64"
_FIB = "FP32, FP16, BF16, INT32, INT64, BOOL"
_AXES = "`axes` must be an initializer"

# op -> (supported types, restrictions), the "Y" rows of the 10.15 matrix
SUPPORTED: dict[str, tuple[str, str]] = {
    "Abs": (_FI, ""), "Acos": (_F, ""), "Acosh": (_F, ""), "Add": (_FI, ""), "And": ("BOOL", ""),
    "ArgMax": (_FI, ""), "ArgMin": (_FI, ""), "Asin": (_F, ""), "Asinh": (_F, ""), "Atan": (_F, ""),
    "Atanh": (_F, ""),
    "Attention": (_F + ", INT8, FP8", "Q, K, V and attn_mask must be 4D; past_key, past_value and nonpad_kv_seqlen "
                  "inputs, present_key, present_value and qk_matmul_output outputs, qk_matmul_output_mode and softcap "
                  "are unsupported"),
    "AveragePool": (_F, "2D or 3D pooling only; dilations empty or all ones"),
    "BatchNormalization": (_F, ""), "BlackmanWindow": ("FP32, FP16", ""),
    "Cast": (_FI + ", UINT8, BOOL", ""), "CastLike": (_FI + ", UINT8, BOOL", ""), "Ceil": (_F, ""),
    "Celu": (_F, ""), "Clip": (_F, ""), "Concat": (_FIB, ""),
    "Constant": (_FIB + ", FP8, FP4, INT4", "sparse_value, value_string, value_strings unsupported"),
    "ConstantOfShape": (_FIB + ", FP8, FP4, INT4", ""), "Conv": (_F, ""), "ConvTranspose": (_F, ""),
    "Cos": (_F, ""), "Cosh": (_F, ""), "CumSum": (_F, "`axis` must be a build-time constant"),
    "DeformConv": ("FP32, FP16", "1D or 2D spatial input; symmetric pads"),
    "DepthToSpace": (_FI, ""), "DequantizeLinear": ("INT8, FP8, FP4, INT4", "`x_zero_point` must be zero"),
    "Div": (_FI, ""), "Dropout": (_F, "`is_training` must be an initializer evaluating to False"),
    "Einsum": (_F, ""), "Elu": (_F, ""), "Equal": (_FI, ""), "Erf": (_F, ""), "Exp": (_F, ""),
    "Expand": (_FIB, ""), "EyeLike": (_FIB, "`input` must have static dimensions"), "Flatten": (_FIB, ""),
    "Floor": (_F, ""), "Gather": (_FIB, ""), "GatherElements": (_FIB, ""), "GatherND": (_FIB, ""),
    "Gelu": (_F + ", INT8, INT32, INT64", ""), "Gemm": (_F, ""), "GlobalAveragePool": (_F, ""),
    "GlobalLpPool": (_F, ""), "GlobalMaxPool": (_F, ""), "Greater": (_FI, ""), "GreaterOrEqual": (_FI, ""),
    "GridSample": ("FP32, FP16", "4D input"), "GroupNormalization": (_F, ""),
    "GRU": (_F, "bidirectional: same activations both ways"), "HammingWindow": ("FP32, FP16", ""),
    "HannWindow": ("FP32, FP16", ""), "HardSigmoid": (_F, ""), "HardSwish": (_F, ""),
    "Hardmax": (_F, "`axis` dimension must be a build-time constant"), "Identity": (_FIB, ""),
    "If": (_FIB, "branch outputs of the same rank, with different names"), "ImageScaler": (_F, ""),
    "InstanceNormalization": (_F, ""), "IsInf": (_F, ""), "IsNaN": (_FI, ""),
    "LayerNormalization": (_F, "only the first output Y"), "LeakyRelu": (_F, ""), "Less": (_FI, ""),
    "LessOrEqual": (_FI, ""), "Log": (_F, ""), "LogSoftmax": (_F, ""),
    "Loop": (_FIB, "scan output length static; carried shapes constant across iterations"), "LRN": (_F, ""),
    "LSTM": (_F, "bidirectional: same activations; input_forget 0; layout 0"), "LpNormalization": (_F, ""),
    "LpPool": (_F, "dilations empty or all ones"), "MatMul": (_F, ""), "Max": (_FI, ""),
    "MaxPool": (_F, "2D or 3D; no Indices output; dilations empty or all ones"), "Mean": (_FI + ", FP8", ""),
    "MeanVarianceNormalization": (_F, ""), "Min": (_FI, ""), "Mish": ("FP32, FP16", ""), "Mod": (_FI, ""),
    "Mul": (_FI, ""), "Neg": (_FI, ""), "NonMaxSuppression": ("FP32, FP16", ""), "NonZero": ("FP32, FP16", ""),
    "Not": ("BOOL", ""), "OneHot": (_FIB, "`depth` must be a build-time constant"), "Or": ("BOOL", ""),
    "Pad": (_FI, ""), "ParametricSoftplus": (_F, ""), "Pow": (_FI, ""), "PRelu": (_F, ""),
    "QuantizeLinear": (_F, "`y_zero_point` must be 0"), "RandomNormal": (_F, "seed ignored"),
    "RandomNormalLike": (_F, "seed ignored"), "RandomUniform": (_F, "seed ignored"),
    "RandomUniformLike": (_F, "seed ignored"), "Range": (_FI, ""), "Reciprocal": (_F, ""),
    "ReduceL1": (_FI, _AXES), "ReduceL2": (_FI, _AXES), "ReduceLogSum": (_FI, _AXES),
    "ReduceLogSumExp": (_FI, _AXES), "ReduceMax": (_FI, _AXES), "ReduceMean": (_FI, _AXES),
    "ReduceMin": (_FI, _AXES), "ReduceProd": (_FI, _AXES), "ReduceSum": (_FI, _AXES),
    "ReduceSumSquare": (_FI, _AXES), "Relu": (_FI, ""), "Reshape": (_FIB, ""),
    "Resize": (_F, "modes nearest/linear; no antialiasing; see the matrix"), "ReverseSequence": (_FIB, ""),
    "RMSNormalization": (_F, ""), "RNN": (_F, "bidirectional: same activations"), "RoiAlign": ("FP32, FP16", ""),
    "RotaryEmbedding": (_F, "`position_ids` must be INT64"), "Round": (_F, ""),
    "STFT": ("FP32", "frame_step and window initializers; real input"), "ScaledTanh": (_F, ""), "Scan": (_F, ""),
    "Scatter": (_FI, ""), "ScatterElements": (_FI, ""), "ScatterND": (_FI, "reduction must be none"),
    "Selu": (_F, ""), "Shape": (_FIB, ""), "Shrink": (_FI, ""), "Sigmoid": (_F, ""), "Sign": (_FI, ""),
    "Sin": (_F, ""), "Sinh": (_F, ""), "Size": (_FIB, ""), "Slice": (_FIB, ""), "Softmax": (_F, ""),
    "Softplus": (_F, ""), "Softsign": (_F, ""), "SpaceToDepth": (_FI, ""), "Split": (_FIB, ""), "Sqrt": (_F, ""),
    "Squeeze": (_FIB, "`axes` must be resolvable to a constant"), "Sub": (_FI, ""), "Sum": (_FI, ""),
    "Tan": (_F, ""), "Tanh": (_F, ""),
    "TensorScatter": ("FP32, FP16, BF16, INT32", "`past_cache` and `update` must be 4D; `axis` must be -2"),
    "ThresholdedRelu": (_F, ""), "Tile": (_FIB, ""), "TopK": (_FI, "`sorted` must be 1; K < 3840"),
    "Transpose": (_FIB, ""), "Trilu": (_FIB, ""),
    "Unsqueeze": (_FIB, "`axes` must be resolvable to a constant"), "Upsample": (_F, ""), "Where": (_FIB, ""),
    "Xor": ("BOOL", ""),
}
# the "N" rows of the same matrix
UNSUPPORTED = frozenset("""AffineGrid Bernoulli BitShift BitwiseAnd BitwiseNot BitwiseOr BitwiseXor Col2Im CenterCropPad
    Compress ConcatFromSequence ConvInteger DFT Det DynamicQuantizeLinear ImageDecoder MatMulInteger MaxRoiPool
    MaxUnpool MelWeightMatrix Multinomial NegativeLogLikelihoodLoss Optional OptionalGetElement OptionalHasElement
    QLinearConv QLinearMatMul RegexFullMatch SequenceAt SequenceConstruct SequenceEmpty SequenceErase SequenceInsert
    SequenceLength SequenceMap SoftmaxCrossEntropyLoss SplitToSequence StringConcat StringNormalizer StringSplit
    TfIdfVectorizer Unique""".split())


def _nodes(model):
    """Every node of the graph and of its subgraphs (If/Loop/Scan bodies)."""
    stack = [model.graph]
    while stack:
        graph = stack.pop()
        for node in graph.node:
            yield node
            stack += [a.g for a in node.attribute if a.HasField("g")] + [g for a in node.attribute for g in a.graphs]


def unsupported_ops(onnx_model) -> dict[str, str]:
    """{"domain.Op" or "Op": why} for every operator of an onnx.ModelProto that TensorRT 10.15's parser lacks,
    plus an opset outside its range. Empty when the parser supports every operator."""
    problems = {}
    for opset in onnx_model.opset_import:
        if opset.domain in DEFAULT_DOMAINS and not OPSET_RANGE[0] <= opset.version <= OPSET_RANGE[1]:
            problems[f"opset {opset.version}"] = f"TensorRT {TENSORRT_VERSION} parses opsets {OPSET_RANGE[0]}..{OPSET_RANGE[1]}"
    for node in _nodes(onnx_model):
        if node.domain not in DEFAULT_DOMAINS:
            problems[f"{node.domain}.{node.op_type}"] = "not an ai.onnx operator (no TensorRT parser support)"
        elif node.op_type in UNSUPPORTED:
            problems[node.op_type] = f"not supported by TensorRT {TENSORRT_VERSION}'s parser"
        elif node.op_type not in SUPPORTED:
            problems[node.op_type] = f"not in TensorRT {TENSORRT_VERSION}'s operator list"
    return problems


def restriction_problems(onnx_model) -> list[str]:
    """The matrix's restrictions that the step graphs could trip, checked on the graph: TensorScatter's axis must be
    -2 (normalize_for_tensorrt rewrites an equivalent positive axis), Squeeze/Unsqueeze/Reduce* axes constant."""
    constants = {t.name for t in onnx_model.graph.initializer}
    constants |= {out for n in onnx_model.graph.node if n.op_type == "Constant" for out in n.output}
    problems = []
    for node in _nodes(onnx_model):
        attrs = {a.name: a for a in node.attribute}
        if node.op_type == "TensorScatter":
            axis = attrs["axis"].i if "axis" in attrs else -2
            if axis != -2:
                problems.append(f"TensorScatter {node.name}: axis {axis}, TensorRT needs -2")
        elif node.op_type in ("Squeeze", "Unsqueeze") or node.op_type.startswith("Reduce"):
            if len(node.input) > 1 and node.input[1] and node.input[1] not in constants:
                problems.append(f"{node.op_type} {node.name}: axes are not a constant")
    return problems


def normalize_for_tensorrt(onnx_model, kv_rank: int = 4) -> list[str]:
    """Rewrites, in place, what TensorRT documents more narrowly than ONNX while meaning the same: TensorScatter's
    axis as a negative index (its KV caches are rank kv_rank). -> what it changed."""
    changed = []
    for node in _nodes(onnx_model):
        if node.op_type == "TensorScatter":
            for attr in node.attribute:
                if attr.name == "axis" and attr.i >= 0:
                    changed.append(f"TensorScatter axis {attr.i} -> {attr.i - kv_rank}")
                    attr.i -= kv_rank
    return sorted(set(changed))


def refusal(manifest: dict) -> str | None:
    """Why this bundle cannot become TensorRT engines, from its manifest alone (None if it can be tried)."""
    for role, model in manifest["models"].items():
        if model["graph_variant"] != "static-kv-standard-v1":
            return (f"the {role} graph is {model['graph_variant']} (com.microsoft GroupQueryAttention and "
                    "RotaryEmbedding, which TensorRT's ONNX parser lacks): re-export with --attention standard")
        weights = model.get("weights", "float32")
        if model.get("quantization") or weights not in ("float32", "float16", "bfloat16"):
            return (f"the {role} weights are {weights} (com.microsoft MatMulNBits / GatherBlockQuantized, onnxruntime "
                    "ops TensorRT's parser lacks; TensorRT's own INT4 needs symmetric blocked DequantizeLinear weights, "
                    "which specedge does not export): re-export without --quantize, e.g. --dtype fp16")
    return None
