"""The step graph shared by every architecture (the I/O contract: runtime/manifest.py).

inputs   input_ids      int64 [B, T]
         position_ids   int64 [B, T]              start_b .. start_b + T - 1: row b writes K/V at these slots
         logit_rows     int64 [B, n]              which of the T rows return logits and ids (indices into T)
         past_key.{i}   float [B, H_kv, S, D]     the static buffer of layer i (S = kv_slots, see below)
         past_value.{i} float [B, H_kv, S, D]
outputs  logits         float [B, n, V_head]
         ids            int64 [B, n]              argmax of each logits row (first index on ties), as the full
                                                  vocabulary's token id (a lighter head's columns mapped back)
         present_key.{i}   float [B, H_kv, S, D]  the node's own output, bound by the runtime to the memory of
         present_value.{i} float [B, H_kv, S, D]  past_key.{i}: the new K/V are written in place

Rows are the runtime's business: it pads them to a common T (repeating a row's last token at the following
positions), runs a lone token as two rows where that keeps rows exact (ModelBackend.min_rows), and asks for
logit rows by index, repeating one where the LM head should see two rows. The graph is correct for any
rows and any logit_rows; slots at or beyond a row's committed length are scratch.

Two attention variants (ATTENTION_VARIANTS), recorded in the manifest as graph_variant:

"standard" (static-kv-standard-v1): standard ONNX ops (opset 24), apart from MatMulNBits/GatherBlockQuantized
for quantized weights. The new K/V of each row are written into the bound buffer by TensorScatter at the
row's first position (in place: its output is present_key.{i} itself, which onnxruntime's CPU kernel then
shares with past_key.{i}); a query at position p attends to slots j <= p of all S slots, as one matrix
product per kv head over R*T query rows (R = max(group size, 2): MLAS takes another accumulation path for
a single row, so a lone token's row equals its row in a longer call). Runs any batch size (max_batch
null); S = max_seq_len + max_draft + 2 (rows right-padded to a common length, and dummy rows written at a
row's committed length, land beyond max_seq_len). Every node runs on onnxruntime's CUDA provider, none on
the CPU (the condition for CUDA graphs): no Shape-derived reshapes (the unquantized table and LM head are
stored transposed, [E, V], so the head is a MatMul straight to [B, n, V] and the embedding a Gather on axis 1),
and no Tile of booleans (the CUDA provider has none: the positions are tiled before the comparison).

"gqa" (static-kv-gqa-v3): com.microsoft GroupQueryAttention (and RotaryEmbedding), in place too; attention
reads only the valid length. Its rows are bitwise independent of the row count only from two rows on, so
the attention always gets one throwaway row after the last (see StepGraph._extra_row), written into the
slot after the last position, while the linear layers run on the T rows. GroupQueryAttention refuses
several new tokens per row after a past when B > 1: max_batch 1. S = max_seq_len + 2 (one slot for a
runtime pad row at the next position, one for the graph's extra row).

Either way slots beyond the committed length (stale drafts) never matter, so rejection costs nothing;
and a token's attention sums over the same slots in the same order whether it arrives alone or in a
verify call of k + 1 tokens, so verify rows equal single-step rows bit for bit (what keeps greedy
speculation identical to target-only greedy). Linear layers are MatMul on fp32 weights, or MatMulNBits
on weights quantized at export (see quantize.py). The LM head runs only on the logit rows (it is a large
share of a step: prefill and draft catch-up need one row, verification k + 1).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from specedge.export.onnx_builder import GraphBuilder
from specedge.export.quantize import Quantization, quantize
from specedge.models.spec import ModelSpec, rope_attention_factor, rope_inv_freq

ATTENTION_VARIANTS = {"gqa": "static-kv-gqa-v3", "standard": "static-kv-standard-v1"}
MAX_BATCH = {"gqa": 1, "standard": None}        # rows one call may carry (None: any)
_DTYPE_NAMES = {TensorProto.INT64: "int64", TensorProto.FLOAT: "float32", TensorProto.FLOAT16: "float16",
                TensorProto.BFLOAT16: "bfloat16"}


class StepGraph:
    """Inputs, the shared mask and RoPE tables, attention, and the outputs of one step graph."""

    PAD_ATTENTION_ROWS = True        # gqa: one extra attention row (see _extra_row); off only to test why

    def __init__(self, builder: GraphBuilder, spec: ModelSpec, max_seq_len: int, max_draft: int,
                 quantization: Quantization | None = None, attention: str = "gqa",
                 quantize_embedding: bool = False):
        """quantize_embedding: the embedding table too, gathered by GatherBlockQuantized (needs quantization)."""
        if attention not in ATTENTION_VARIANTS:
            raise ValueError(f"unknown attention variant '{attention}'")
        self.b, self.spec, self.max_seq_len, self.quantization = builder, spec, max_seq_len, quantization
        self.float = builder.float_type          # KV buffers and activations; norms, softmax and logits float32
        self.graph_variant, self.max_batch = ATTENTION_VARIANTS[attention], MAX_BATCH[attention]
        self.quantize_embedding = quantize_embedding and quantization is not None
        self.embedding_bytes = 0
        self.gqa = attention == "gqa"
        self.transposed_head = not self.gqa            # [E, V] table and head: see the module docstring
        self.quantized: dict[str, tuple] = {}          # module name -> (codes, scales, zero points, K), for the check
        # standard attention runs as one matrix product per kv head with R*T query rows. MLAS takes a different
        # accumulation path for a single row, so R >= 2 keeps verify rows bitwise equal to single steps:
        # R = the GQA group size, or 2 (the query rows duplicated) for plain multi-head attention.
        self.groups = spec.num_heads // spec.num_kv_heads
        self.query_rows = max(self.groups, 2)
        self.extra_row = self.gqa and self.PAD_ATTENTION_ROWS
        self.kv_slots = max_seq_len + 2 if self.gqa else max_seq_len + max_draft + 2
        b, kv_shape = builder, ["batch", spec.num_kv_heads, self.kv_slots, spec.head_dim]
        self.ids = b.input("input_ids", TensorProto.INT64, ["batch", "step"])
        self.positions = b.input("position_ids", TensorProto.INT64, ["batch", "step"])
        self.logit_rows = b.input("logit_rows", TensorProto.INT64, ["batch", "logit_rows"])
        self.past = [(b.input(f"past_key.{i}", self.float, kv_shape),
                      b.input(f"past_value.{i}", self.float, kv_shape))
                     for i in range(spec.num_layers)]
        self._window_visible = None
        # layers whose window can hide a slot (one at least as long as the buffer masks nothing: left out); their rope
        # stays the sliding layers' own either way (Gemma 3)
        self.windowed = set(spec.sliding_layers) if 0 < spec.sliding_window < self.kv_slots else set()
        if self.gqa:
            self._extra_row()
        else:
            self.visible = self._visibility()
            first = b.op("Gather", self.positions, b.const([0]), axis=1)                             # [B, 1]
            self.write_index = b.op("Squeeze", first, b.const([1]))                                # [B]
        ropes = {"": spec.rope, "local": spec.rope_local} if spec.rope_local else {"": spec.rope}
        tables = self._rope_caches if self.gqa else self._rope_tables
        self.cos_sin = {key: tables(rope, key) for key, rope in ropes.items()} if spec.rope else {}
        self.scale_value = spec.attention_scale or float(1.0 / np.sqrt(spec.head_dim))
        self.scale = b.const(np.float32(self.scale_value), np.float32, "attn_scale", keep=True)
        self.masked = b.const(np.float32(np.finfo(np.float32).min), np.float32, "masked", keep=True)

    def _last_row(self, x: str) -> str:
        """x [B, T, ...] -> [B, 1, ...]"""
        b = self.b
        return b.op("Slice", x, b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([1]))

    def _visibility(self) -> str:
        """standard: slot j is visible to a query at position p iff j <= p -> [B, 1, R*T, S] (rows as q's)."""
        b, pos = self.b, self.positions
        slots = b.const(np.arange(self.kv_slots).reshape(1, 1, -1), hint="slots")        # [1, 1, S]
        rows = b.op("Tile", pos, b.const([1, self.query_rows]))                           # [B, R*T]: row g*T + t
        visible = b.op("LessOrEqual", slots, b.op("Unsqueeze", rows, b.const([2])))     # [B, R*T, S]
        return b.op("Unsqueeze", visible, b.const([1]))                                   # [B, 1, R*T, S]

    def _window_visibility(self) -> str:
        """standard, a sliding layer: slot j is visible to a query at position p iff p - window < j <= p (the last
        `window` positions, its own included, as transformers) -> [B, 1, R*T, S]; made once, shared by the layers."""
        if self._window_visible is None:
            b = self.b
            slots = b.const(np.arange(self.kv_slots).reshape(1, 1, 1, -1), hint="slots4")        # [1, 1, 1, S]
            rows = b.op("Tile", self.positions, b.const([1, self.query_rows]))                    # [B, R*T]
            oldest = b.op("Sub", b.op("Unsqueeze", rows, b.const([1, 3])), b.const(self.spec.sliding_window))
            self._window_visible = b.op("And", self.visible, b.op("Greater", slots, oldest))      # [B, 1, R*T, S]
        return self._window_visible

    def _extra_row(self) -> None:
        """GroupQueryAttention sees T + 1 rows: its rows are bitwise independent of the row count only from
        two rows on. The extra row is a copy of the last, at the position after it: its K/V land in the
        headroom slot or in a slot beyond the committed length, which is never read before it is rewritten.
        Sets the attention's positions [B, T + 1] and GroupQueryAttention's lengths (seqlens_k int32 [B]: the
        index of the last row, total int32 [])."""
        b, pos = self.b, self.positions
        last = self._last_row(pos)                                                        # [B, 1]
        if self.extra_row:
            last = b.op("Add", last, b.const([[1]]))
            self.attention_positions = b.op("Concat", pos, last, axis=1)                  # [B, T + 1]
        else:
            self.attention_positions = pos
        last = b.op("Squeeze", last, b.const([1]))                                        # [B]
        self.seqlens_k = b.op("Cast", last, to=TensorProto.INT32)
        self.total_length = b.op("Cast", b.op("Add", b.op("ReduceMax", last, keepdims=0), b.const(1)),
                                 to=TensorProto.INT32)

    def _with_extra_row(self, x: str) -> str:
        """x [B, T, C] -> [B, T + 1, C], the last row repeated (see _extra_row)."""
        return self.b.op("Concat", x, self._last_row(x), axis=1)

    def _layer_cos_sin(self, layer: int) -> tuple[str, str] | None:
        """The rope tables of a layer: a sliding layer's own where the model has them (Gemma 3), else the one;
        None for a layer without rope (SmolLM3's NoPE layers)."""
        if layer in self.spec.nope_layers:
            return None
        local = layer in self.spec.sliding_layers and "local" in self.cos_sin
        return self.cos_sin.get("local" if local else "")

    def _rope_tables(self, rope: dict, key: str) -> tuple[str, str]:
        """standard: cos/sin of each row's angles, computed from its position [B, 1, T, rotary dims / 2]."""
        b, name = self.b, f"rope{'.' + key if key else ''}"
        inv_freq = b.weight(f"{name}.inv_freq", rope_inv_freq(rope, self.spec.rotary_dim).reshape(1, 1, -1),
                            keep=True)                                                    # angles in float32
        pos = b.op("Unsqueeze", b.op("Cast", self.positions, to=TensorProto.FLOAT), b.const([2]))  # [B, T, 1]
        freqs = b.op("Mul", pos, inv_freq)                                                # [B, T, D/2]
        axis = b.const([1])
        cos, sin = b.op("Cos", freqs), b.op("Sin", freqs)
        scale = rope_attention_factor(rope)
        if scale != 1.0:                                                                  # YaRN: in float32, as HF
            factor = b.const(np.float32(scale), np.float32, f"{name}_scale", keep=True)
            cos, sin = b.op("Mul", cos, factor), b.op("Mul", sin, factor)
        cos, sin = b.from_float32(cos), b.from_float32(sin)
        return b.op("Unsqueeze", cos, axis), b.op("Unsqueeze", sin, axis)

    def _rope_caches(self, rope: dict, key: str) -> tuple[str, str]:
        """gqa: cos/sin of every slot's angles [S, rotary dims / 2], for com.microsoft.RotaryEmbedding: one node per
        q or k instead of a dozen. The angles are float32 products, as in transformers."""
        b, name = self.b, f"rope{'.' + key if key else ''}"
        inv_freq = rope_inv_freq(rope, self.spec.rotary_dim).astype(np.float32)
        freqs = np.arange(self.kv_slots, dtype=np.float32)[:, None] * inv_freq[None, :]     # the extra row's too
        scale = np.float32(rope_attention_factor(rope))              # YaRN's or LongRoPE's; 1 (exact) otherwise
        return (b.weight(f"{name}.cos_cache", np.cos(freqs) * scale),
                b.weight(f"{name}.sin_cache", np.sin(freqs) * scale))

    def _rotate(self, x: str, cos_sin: tuple[str, str]) -> str:
        """HF's rotate-half RoPE on x [B, H, T, D] (standard); with partial rotary dims only the first
        `rotary_dim` of each head turn, the rest pass through."""
        b, (cos, sin), turned, d = self.b, cos_sin, self.spec.rotary_dim, self.spec.head_dim
        if turned < d:
            x, rest = b.op("Split", x, b.const([turned, d - turned]), axis=-1, n_out=2)
        x1, x2 = b.op("Split", x, axis=-1, num_outputs=2, n_out=2)
        first = b.op("Sub", b.op("Mul", x1, cos), b.op("Mul", x2, sin))
        second = b.op("Add", b.op("Mul", x2, cos), b.op("Mul", x1, sin))
        return b.op("Concat", first, second, *([rest] if turned < d else []), axis=-1)

    def _heads(self, x: str, n_heads: int) -> str:
        """[B, T, n*D] -> [B, n, T, D]"""
        b = self.b
        return b.op("Transpose", b.op("Reshape", x, b.const([0, 0, n_heads, self.spec.head_dim])), perm=[0, 2, 1, 3])

    def embedding(self, name: str, rows: np.ndarray, ids: str) -> tuple[str, str | None]:
        """rows [V, E] gathered at ids [B, T] -> ([B, T, E], the fp32 table's initializer name or None).

        Quantized, the table is MatMulNBits-style codes (two int4 codes a byte, row after row) that
        GatherBlockQuantized expands per gathered row: a decode step reads one row either way, but the
        weights in memory shrink by the table's 7/8 (int4). Its rows are the module's dequantized values,
        what the export check's reference model gets too."""
        b = self.b
        module = name.removesuffix(".weight")
        if not self.quantize_embedding:
            self.embedding_bytes = rows.nbytes
            if self.transposed_head:
                table = b.weight(name, rows.T)                                            # [E, V]
                columns = b.op("Gather", table, ids, axis=1)                              # [E, B, T]
                return b.op("Transpose", columns, perm=[1, 2, 0]), table
            table = b.weight(name, rows)
            return b.op("Gather", table, ids), table
        q = self.quantization
        codes, scales, zero_points = self._quantized(module, rows)
        n, e = rows.shape
        arrays = [codes.reshape(n, -1), scales.reshape(n, -1), zero_points.reshape(n, -1)]
        data, scale, zp = (b.weight(f"{name}.{part}", a) for part, a in zip((q.name, "scales", "zero_points"), arrays))
        self.embedding_bytes = sum(a.nbytes for a in arrays)
        x = b.op("GatherBlockQuantized", data, ids, scale, zp, domain="com.microsoft", bits=q.bits,
                 block_size=q.block_size, gather_axis=0, quantize_axis=1)                 # [B, T, blocks*block]
        if e % q.block_size:
            x = b.op("Slice", x, b.const([0]), b.const([e]), b.const([-1]))              # the last block's padding
        return x, None

    def linear(self, x: str, name: str, weight: np.ndarray, bias: np.ndarray | None = None) -> str:
        """x [..., K] @ weight^T (+ bias), weight [N, K] in HF's (out, in) layout."""
        b = self.b
        if self.quantization is None:
            y = b.op("MatMul", x, b.weight(f"{name}.weight_t", weight.T))
        else:
            y = self._matmul_nbits(x, name, weight)
        return b.op("Add", y, b.weight(f"{name}.bias", bias)) if bias is not None else y

    def fused_linear(self, x: str, name: str, parts: list[tuple[str, np.ndarray, np.ndarray | None]]) -> str:
        """Several linear layers on the same input (q/k/v, gate/up) as one matrix product: parts [(module
        name, weight [N_i, K], bias [N_i] or None)] -> their outputs side by side [..., sum N_i]. One call
        instead of three saves onnxruntime's per-call work (and, quantized, quantizing the activations
        again). Rows are quantized per module, as unfused, so the fused weight is those rows stacked."""
        b = self.b
        sizes = [weight.shape[0] for _, weight, _ in parts]
        if self.quantization is None:
            stacked = np.concatenate([weight for _, weight, _ in parts])
            y = b.op("MatMul", x, b.weight(f"{name}.weight_t", stacked.T))
        else:
            pieces = [self._quantized(module, weight) for module, weight, _ in parts]
            y = self._matmul_nbits_op(x, name, *(np.concatenate(arrays) for arrays in zip(*pieces)),
                                      k=parts[0][1].shape[1])
        if any(bias is not None for *_, bias in parts):
            bias = np.concatenate([np.zeros(n, np.float32) if bias is None else bias
                                   for (_, _, bias), n in zip(parts, sizes)])
            y = b.op("Add", y, b.weight(f"{name}.bias", bias))
        return y

    def split(self, x: str, sizes: list[int]) -> list[str]:
        """[..., sum sizes] -> one tensor per size along the last axis."""
        return self.b.op("Split", x, self.b.const(sizes), axis=-1, n_out=len(sizes))

    def _quantized(self, name: str, weight: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        codes, scales, zero_points = quantize(weight, self.quantization)
        self.quantized[name] = (codes, scales, zero_points, weight.shape[1])
        return codes, scales, zero_points

    def _matmul_nbits(self, x: str, name: str, weight: np.ndarray, out: str | None = None) -> str:
        return self._matmul_nbits_op(x, name, *self._quantized(name, weight), k=weight.shape[1], out=out)

    def _matmul_nbits_op(self, x: str, name: str, codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray,
                         k: int, out: str | None = None) -> str:
        """codes [N, blocks, block bytes]; scales and zero points flat, row after row. out: the output's name."""
        q, b = self.quantization, self.b
        return b.op("MatMulNBits", x, b.weight(f"{name}.{q.name}", codes), b.weight(f"{name}.scales", scales),
                    b.weight(f"{name}.zero_points", zero_points), domain="com.microsoft", out_names=[out],
                    K=k, N=codes.shape[0], bits=q.bits, block_size=q.block_size, accuracy_level=q.accuracy_level)

    def _present(self, layer: int, present_k: str, present_v: str) -> None:
        kv_shape = ["batch", self.spec.num_kv_heads, self.kv_slots, self.spec.head_dim]
        self.b.output(present_k, f"present_key.{layer}", self.float, kv_shape)
        self.b.output(present_v, f"present_value.{layer}", self.float, kv_shape)

    def rms_norm(self, x: str, name: str, weight: np.ndarray) -> str:
        """RMSNorm over x's last axis, weight [that width]; in float32 whatever the graph's dtype (a half-precision
        sum of squares overflows)."""
        b = self.b
        w = b.weight(name, weight, keep=True)
        two = b.const(2.0, dtype="float32", hint="two", keep=True)
        x = b.to_float32(x)
        variance = b.op("ReduceMean", b.op("Pow", x, two), b.const([-1]), keepdims=1)
        eps = b.const(self.spec.norm_eps, dtype="float32", hint="eps", keep=True)
        return b.from_float32(b.op("Mul", b.op("Div", x, b.op("Sqrt", b.op("Add", variance, eps))), w))

    def layer_norm(self, x: str, name: str, weights) -> str:
        """LayerNorm over x's last axis (the hidden size), its weight and bias taken from the WeightTable as
        name.weight / name.bias; in float32 whatever the graph's dtype."""
        b, e = self.b, self.spec.hidden_size
        w = b.weight(f"{name}.weight", weights.take(f"{name}.weight", (e,)), keep=True)
        bias = b.weight(f"{name}.bias", weights.take(f"{name}.bias", (e,)), keep=True)
        return b.from_float32(b.op("LayerNormalization", b.to_float32(x), w, bias, axis=-1,
                                   epsilon=self.spec.norm_eps))

    def gelu(self, x: str, exact: bool) -> str:
        """0.5 x (1 + erf(x / sqrt 2)), or its tanh approximation (gelu_new, gelu_pytorch_tanh)."""
        b = self.b
        half = b.const(0.5, dtype="float32", hint="half")
        one = b.const(1.0, dtype="float32", hint="one")
        if exact:
            inner = b.op("Erf", b.op("Mul", x, b.const(1 / np.sqrt(2.0), dtype="float32")))
        else:
            cube = b.op("Mul", b.op("Mul", x, x), x)
            poly = b.op("Add", x, b.op("Mul", cube, b.const(0.044715, dtype="float32")))
            inner = b.op("Tanh", b.op("Mul", poly, b.const(np.sqrt(2.0 / np.pi), dtype="float32")))
        return b.op("Mul", b.op("Mul", x, half), b.op("Add", inner, one))

    def _head_norm(self, x: str, name: str, weight: np.ndarray) -> str:
        """RMSNorm of each head: x [B, T, n*D] -> [B, T, n*D], weight [D]; or of all n heads together where
        the weight is [n*D] (OLMo 2)."""
        b, d = self.b, self.spec.head_dim
        if weight.shape[0] != d:
            return self.rms_norm(x, name, weight)
        heads = b.op("Reshape", x, b.const([0, 0, -1, d]))                              # [B, T, n, D]
        return b.op("Reshape", self.rms_norm(heads, name, weight), b.const([0, 0, -1]))

    def attention(self, layer: int, qkv: str, head_norms: list[tuple[str, np.ndarray]] | None = None) -> str:
        """qkv [B, T, (H + 2 H_kv)*D], the fused projection -> context [B, T, H*D]; writes layer's K/V in
        place (present_*). gqa adds its extra row here, once for q, k and v. head_norms: [(name, weight)] of
        an RMSNorm of q and of k before RoPE: each head's (Qwen3, weight [D]) or the whole projection's (OLMo 2)."""
        b, s = self.b, self.spec
        if self.extra_row:
            qkv = self._with_extra_row(qkv)
        q, k, v = self.split(qkv, [s.num_heads * s.head_dim] + [s.num_kv_heads * s.head_dim] * 2)
        after = head_norms if s.qk_norm_after_rope else None         # HunYuan norms q and k heads after RoPE
        if head_norms and not after:
            (q_name, q_weight), (k_name, k_weight) = head_norms
            q, k = self._head_norm(q, q_name, q_weight), self._head_norm(k, k_name, k_weight)
        if self.gqa:
            return self._attention_gqa(layer, q, k, v, after)
        q, k, v = self._heads(q, s.num_heads), self._heads(k, s.num_kv_heads), self._heads(v, s.num_kv_heads)
        cos_sin = self._layer_cos_sin(layer)
        if cos_sin:
            q, k = self._rotate(q, cos_sin), self._rotate(k, cos_sin)
        if after:                                                     # [B, H, T, D]: over each head's last axis
            (q_name, q_weight), (k_name, k_weight) = after
            q, k = self.rms_norm(q, q_name, q_weight), self.rms_norm(k, k_name, k_weight)
        past_k, past_v = self.past[layer]
        # present_* are TensorScatter's own outputs (no Identity): onnxruntime writes in place only then
        keys = b.op("TensorScatter", past_k, k, self.write_index, axis=2,
                    out_names=[f"present_key.{layer}"])                                   # [B, Hkv, S, D]
        values = b.op("TensorScatter", past_v, v, self.write_index, axis=2,
                      out_names=[f"present_value.{layer}"])
        self._present(layer, keys, values)
        q = b.op("Reshape", q, b.const([0, s.num_kv_heads, -1, s.head_dim]))             # [B, Hkv, G*T, D]
        if self.groups == 1:
            q = b.op("Concat", q, q, axis=2)                                              # [B, H, 2T, D]
        scores = b.op("MatMul", q, b.op("Transpose", keys, perm=[0, 1, 3, 2]))            # [B, Hkv, R*T, S]
        scores = b.op("Mul", b.to_float32(scores), self.scale)                             # softmax in float32
        if s.attn_softcap:                                                                # Gemma 2: cap * tanh(x / cap)
            cap = b.const(np.float32(s.attn_softcap), np.float32, "attn_softcap", keep=True)
            scores = b.op("Mul", b.op("Tanh", b.op("Div", scores, cap)), cap)
        visible = self._window_visibility() if layer in self.windowed else self.visible
        scores = b.op("Where", visible, scores, self.masked)
        context = b.op("MatMul", b.from_float32(b.op("Softmax", scores, axis=-1)), values)  # [B, Hkv, R*T, D]
        if self.groups == 1:
            context = b.op("Split", context, axis=2, num_outputs=2, n_out=2)[0]            # [B, H, T, D]
        context = b.op("Reshape", context, b.const([0, s.num_heads, -1, s.head_dim]))    # [B, H, T, D]
        context = b.op("Transpose", context, perm=[0, 2, 1, 3])                           # [B, T, H, D]
        return b.op("Reshape", context, b.const([0, 0, s.num_heads * s.head_dim]))

    def _attention_gqa(self, layer: int, q: str, k: str, v: str, norms_after: list | None = None) -> str:
        b, s = self.b, self.spec
        cos_sin = self._layer_cos_sin(layer)
        if cos_sin:
            cos, sin = cos_sin
            partial = {"rotary_embedding_dim": s.rotary_dim} if s.rotary_dim < s.head_dim else {}
            q = b.op("RotaryEmbedding", q, self.attention_positions, cos, sin, domain="com.microsoft",
                     interleaved=0, num_heads=s.num_heads, **partial)                     # [B, T + 1, H*D]
            k = b.op("RotaryEmbedding", k, self.attention_positions, cos, sin, domain="com.microsoft",
                     interleaved=0, num_heads=s.num_kv_heads, **partial)
        if norms_after:
            (q_name, q_weight), (k_name, k_weight) = norms_after
            q, k = self._head_norm(q, q_name, q_weight), self._head_norm(k, k_name, k_weight)
        past_k, past_v = self.past[layer]
        # present_* are the node's own outputs (no Identity): onnxruntime shares them with past_* only then
        present = (f"present_key.{layer}", f"present_value.{layer}")
        context, present_k, present_v = b.op(
            "GroupQueryAttention", q, k, v, past_k, past_v, self.seqlens_k, self.total_length, n_out=3,
            out_names=[None, *present], domain="com.microsoft", num_heads=s.num_heads, kv_num_heads=s.num_kv_heads,
            scale=self.scale_value, softcap=float(s.attn_softcap),
            local_window_size=s.sliding_window if layer in self.windowed else -1)
        self._present(layer, present_k, present_v)
        if self.extra_row:
            context = b.op("Slice", context, b.const([0]), b.const([-1]), b.const([1]))   # drops the extra row
        return context                                                                    # [B, T, H*D]

    def logits(self, hidden: str, head: np.ndarray, tied_embedding: str | None = None) -> None:
        """hidden [B, T, E], head [V, E] (HF layout) -> logits [B, n, V] of the rows logit_rows names, and their
        argmax ids [B, n].

        An fp32 head tied to the embedding shares its initializer; a quantized one gets its own copy.
        """
        b, v = self.b, head.shape[0]
        index = b.op("Unsqueeze", self.logit_rows, b.const([2]))                          # [B, n, 1]
        rows = b.op("GatherND", hidden, index, batch_dims=1)                              # [B, n, E]
        # outputs are their nodes' own tensors: an Identity before a graph output that is also read (by ArgMax)
        # stays in the optimized graph, a copy of the logits every step
        half = self.float != TensorProto.FLOAT            # a half-precision graph's logits come out as float32
        capped = bool(self.spec.logit_softcap)           # Gemma 2: cap * tanh(x / cap), in float32
        divided = self.spec.logit_divisor != 1.0         # Granite: logits / logits_scaling, in float32
        named = None if half or capped or divided else "logits"
        if self.quantization is not None:
            logits = self._matmul_nbits(rows, "lm_head", head, out=named)                 # [B, n, V]
        elif self.transposed_head:
            head_name = tied_embedding or b.weight("lm_head.weight", head.T)                  # [E, V]
            logits = b.op("MatMul", rows, head_name, out_names=[named])                       # [B, n, V]
        else:
            head_name = tied_embedding or b.weight("lm_head.weight", head)
            flat = b.op("Reshape", rows, b.const([-1, self.spec.hidden_size]))
            logits = b.op("Gemm", flat, head_name, transB=1)                              # [B*n, V]
            shape = b.op("Concat", b.op("Shape", self.logit_rows), b.const([v]), axis=0)
            logits = b.op("Reshape", logits, shape, out_names=[named])
        if half:
            logits = b.op("Cast", logits, to=TensorProto.FLOAT,
                          out_names=[None if capped or divided else "logits"])
        if divided:
            divisor = b.const(np.float32(self.spec.logit_divisor), np.float32, "logit_divisor", keep=True)
            logits = b.op("Div", logits, divisor, out_names=[None if capped else "logits"])
        if capped:
            cap = b.const(np.float32(self.spec.logit_softcap), np.float32, "logit_softcap", keep=True)
            logits = b.op("Mul", b.op("Tanh", b.op("Div", logits, cap)), cap, out_names=["logits"])
        b.output(logits, "logits", TensorProto.FLOAT, ["batch", "logit_rows", v])
        ids = b.op("ArgMax", logits, axis=-1, keepdims=0, select_last_index=0, out_names=["ids"])   # [B, n]
        b.output(ids, "ids", TensorProto.INT64, ["batch", "logit_rows"])

    def io(self) -> dict:
        """The manifest's io record, from what the graph declares: {"inputs": {name: {"dtype", "shape"}},
        "outputs": {...}, "kv": [[past_key, past_value, present_key, present_value] per layer]}."""
        def tensors(values) -> dict:
            return {value.name: {"dtype": _DTYPE_NAMES[value.type.tensor_type.elem_type],
                                 "shape": [d.dim_param or d.dim_value for d in value.type.tensor_type.shape.dim]}
                    for value in values}

        return {"inputs": tensors(self.b.inputs), "outputs": tensors(self.b.outputs),
                "kv": [[f"past_key.{i}", f"past_value.{i}", f"present_key.{i}", f"present_value.{i}"]
                       for i in range(self.spec.num_layers)]}

