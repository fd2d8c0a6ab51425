"""The step graph shared by every architecture (see README, "The step graph").

inputs   input_ids      int64 [B, T]
         position_ids   int64 [B, T]              absolute positions; row b writes at position_ids[b]
         num_logits     int64 [1]                 n <= T: logits only for the last n tokens
         min_rows       int64 [1]                 quantized targets only: 1, or 2 to run single steps as two
                                                  rows (see _pad_rows)
         past_key.{i}   float [B, H_kv, S, D]     the whole static buffer of layer i (S = S_max, or
         past_value.{i} float [B, H_kv, S, D]     S_max + 1 for gqa: one headroom slot, see below; + 1 more
                                                  with min_rows)
outputs  logits         float [B, n, V]
         key.{i}        float [B, H_kv, T, D]     K/V of the T new tokens only (after RoPE)
         value.{i}      float [B, H_kv, T, D]

Two attention variants (ATTENTION_VARIANTS), recorded in the manifest as graph_variant:

"scatter" (static-kv-scatter-v2): the new K/V are scattered into a copy of the buffer at their positions,
and a query at position p attends to slots j <= p of that copy; outputs key.{i}/value.{i} are the new
tokens' K/V [B, H_kv, T, D], which the runtime writes into its buffers. Every step copies and attends
over all S_max slots.

"gqa" (static-kv-gqa-v2): com.microsoft GroupQueryAttention with present_key.{i}/present_value.{i}
[B, H_kv, S_max + 1, D] bound by the runtime to the same memory as past_key.{i}: the new K/V are written
in place and attention reads only the valid length. Its rows are bitwise independent of the row count
only from two rows on (a single row takes another MLAS path), so the attention always gets one
throwaway row after the last (see StepGraph._extra_row), written into the slot after the last position
(hence the headroom slot), while the linear layers run on the T rows. (v1 put the extra row before the
first position, re-reading the committed slot from the buffer: more nodes per layer; still loadable.)

Either way slots beyond the committed length (stale drafts) never matter, so rejection costs nothing;
and a token's attention sums over the same slots in the same order whether it arrives alone or in a
verify call of k + 1 tokens, so verify rows equal single-step rows bit for bit (what keeps greedy
speculation identical to target-only greedy).
`num_logits` exists because the LM head is a large share of a step: prefill and draft catch-up need
one row, verification k + 1. Linear layers are MatMul on fp32 weights, or MatMulNBits on weights
quantized at export (see quantize.py).
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto

from specedge.export.onnx_builder import GraphBuilder
from specedge.export.quantize import Quantization, quantize
from specedge.models.spec import ModelSpec, rope_inv_freq

ATTENTION_VARIANTS = {"gqa": "static-kv-gqa-v2",
                      "scatter": "static-kv-scatter-v2"}   # scatter v1: no num_logits input (still loadable)


class StepGraph:
    """Inputs, the shared mask and RoPE tables, attention, and the outputs of one step graph."""

    PAD_ATTENTION_ROWS = True        # gqa: one extra attention row (see _extra_row); off only to test why

    def __init__(self, builder: GraphBuilder, spec: ModelSpec, max_seq_len: int,
                 quantization: Quantization | None = None, attention: str = "scatter",
                 head_rows: np.ndarray | None = None, quantize_embedding: bool = False, pad_rows: bool = False):
        """head_rows: token ids the LM head keeps (a lighter draft head, see draft_vocab.py); None = all.
        quantize_embedding: the embedding table too, gathered by GatherBlockQuantized (needs quantization).
        pad_rows: the step runs on at least min_rows rows, an input (see _pad_rows): for quantized targets."""
        self.b, self.spec, self.max_seq_len, self.quantization = builder, spec, max_seq_len, quantization
        self.head_rows, self.pad_rows = head_rows, pad_rows
        self.quantize_embedding = quantize_embedding and quantization is not None
        self.embedding_bytes = 0
        self.in_place = attention == "gqa"
        self.quantized: dict[str, tuple] = {}          # module name -> (codes, scales, zero points, K), for the check
        # Attention runs as one matrix product per kv head with R*T query rows. MLAS takes a different
        # accumulation path for a single row, so R >= 2 keeps verify rows bitwise equal to single steps:
        # R = the GQA group size, or 2 (the query rows duplicated) for plain multi-head attention.
        self.groups = spec.num_heads // spec.num_kv_heads
        self.query_rows = max(self.groups, 2)
        self.extra_row = self.in_place and self.PAD_ATTENTION_ROWS
        # headroom: gqa's extra row after the last position, and before it _pad_rows' copy
        self.kv_slots = max_seq_len + (int(self.extra_row) + int(pad_rows) if self.in_place else 0)
        b, kv_shape = builder, ["batch", spec.num_kv_heads, self.kv_slots, spec.head_dim]
        self.input_ids = b.input("input_ids", TensorProto.INT64, ["batch", "step"])
        self.position_ids = b.input("position_ids", TensorProto.INT64, ["batch", "step"])
        self.num_logits = b.input("num_logits", TensorProto.INT64, [1])
        self.min_rows = b.input("min_rows", TensorProto.INT64, [1]) if pad_rows else None         # 1 or 2
        self.ids, self.positions = self._pad_rows() if pad_rows else (self.input_ids, self.position_ids)
        self.past = [(b.input(f"past_key.{i}", TensorProto.FLOAT, kv_shape),
                      b.input(f"past_value.{i}", TensorProto.FLOAT, kv_shape))
                     for i in range(spec.num_layers)]
        if self.in_place:
            self._extra_row()
        else:
            self.visible = self._visibility()
        if not spec.rope:
            self.cos_sin = None
        elif self.in_place:
            self.cos_sin = self._rope_caches()
        else:
            self.cos_sin = self._rope_tables()
        self.scale = b.const(np.float32(1.0 / np.sqrt(spec.head_dim)), np.float32, "attn_scale")
        self.masked = b.const(np.float32(np.finfo(np.float32).min), np.float32, "masked")

    def _pad_rows(self) -> tuple[str, str]:
        """input_ids, position_ids [B, T] -> [B, max(T, min_rows)]: with min_rows 2 a single step gets a copy
        of its token as a second row. MatMulNBits takes another kernel for one row, whose results differ in
        the last bits on some CPUs (an AVX2 EPYC; not an AVX-512 Xeon), so there a quantized target's single
        steps must not be single rows for verify rows to equal them; the runtime measures which at load
        (runtime/row_check.py). The copy sits at the next position (gqa: a headroom slot or beyond the
        committed length, never read before it is rewritten) or, for scatter, at the same position, where
        it writes the same K/V again; its outputs are dropped."""
        b = self.b
        self.step_rows = b.op("Slice", b.op("Shape", self.input_ids), b.const([1]), b.const([2]))   # [1]: T
        rows = self.padded_rows = b.op("Max", self.step_rows, self.min_rows)                # [1]: T'

        def padded(x: str, tail: str) -> str:
            return b.op("Slice", b.op("Concat", x, tail, axis=1), b.const([0]), rows, b.const([1]))

        last_pos = self._last_row(self.position_ids)
        next_pos = b.op("Add", last_pos, b.const([[1]])) if self.in_place else last_pos
        return padded(self.input_ids, self._last_row(self.input_ids)), padded(self.position_ids, next_pos)

    def _last_row(self, x: str) -> str:
        """x [B, T, ...] -> [B, 1, ...]"""
        b = self.b
        return b.op("Slice", x, b.const([-1]), b.const([np.iinfo(np.int64).max]), b.const([1]))

    def _unpadded(self, x: str, axis: int) -> str:
        """The first T rows of x along axis (drops _pad_rows' copy)."""
        return self.b.op("Slice", x, self.b.const([0]), self.step_rows, self.b.const([axis])) if self.pad_rows else x

    def _visibility(self) -> str:
        b, pos = self.b, self.positions
        slots = b.const(np.arange(self.max_seq_len).reshape(1, 1, -1), hint="slots")      # [1, 1, S]
        visible = b.op("LessOrEqual", slots, b.op("Unsqueeze", pos, b.const([2])))      # [B, T, S]
        self.scatter_index = b.op("Unsqueeze", pos, b.const([1, 3]))                      # [B, 1, T, 1]
        visible = b.op("Unsqueeze", visible, b.const([1]))                                # [B, 1, T, S]
        return b.op("Tile", visible, b.const([1, 1, self.query_rows, 1]))                 # [B, 1, R*T, S]

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

    def _rope_tables(self) -> tuple[str, str]:
        b = self.b
        inv_freq = b.weight("rope.inv_freq", rope_inv_freq(self.spec.rope, self.spec.head_dim).reshape(1, 1, -1))
        pos = b.op("Unsqueeze", b.op("Cast", self.positions, to=TensorProto.FLOAT), b.const([2]))  # [B, T, 1]
        freqs = b.op("Mul", pos, inv_freq)                                                # [B, T, D/2]
        axis = b.const([1])
        return b.op("Unsqueeze", b.op("Cos", freqs), axis), b.op("Unsqueeze", b.op("Sin", freqs), axis)  # [B, 1, T, D/2]

    def _rope_caches(self) -> tuple[str, str]:
        """cos/sin of every slot's angles [S_max + 1, D/2], for com.microsoft.RotaryEmbedding: one node per
        q or k instead of a dozen. The angles are float32 products, as in transformers."""
        b = self.b
        inv_freq = rope_inv_freq(self.spec.rope, self.spec.head_dim).astype(np.float32)
        freqs = np.arange(self.kv_slots, dtype=np.float32)[:, None] * inv_freq[None, :]     # the extra row's too
        return b.weight("rope.cos_cache", np.cos(freqs)), b.weight("rope.sin_cache", np.sin(freqs))

    def _rotate(self, x: str) -> str:
        """HF's rotate-half RoPE on x [B, H, T, D] (scatter)."""
        b, (cos, sin) = self.b, self.cos_sin
        x1, x2 = b.op("Split", x, axis=-1, n_out=2)
        first = b.op("Sub", b.op("Mul", x1, cos), b.op("Mul", x2, sin))
        second = b.op("Add", b.op("Mul", x2, cos), b.op("Mul", x1, sin))
        return b.op("Concat", first, second, axis=-1)

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
            table = b.weight(name, rows)
            self.embedding_bytes = rows.nbytes
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

    def _matmul_nbits(self, x: str, name: str, weight: np.ndarray) -> str:
        return self._matmul_nbits_op(x, name, *self._quantized(name, weight), k=weight.shape[1])

    def _matmul_nbits_op(self, x: str, name: str, codes: np.ndarray, scales: np.ndarray, zero_points: np.ndarray,
                         k: int) -> str:
        """codes [N, blocks, block bytes]; scales and zero points flat, row after row."""
        q, b = self.quantization, self.b
        return b.op("MatMulNBits", x, b.weight(f"{name}.{q.name}", codes), b.weight(f"{name}.scales", scales),
                    b.weight(f"{name}.zero_points", zero_points), domain="com.microsoft",
                    K=k, N=codes.shape[0], bits=q.bits, block_size=q.block_size, accuracy_level=q.accuracy_level)

    def attention(self, layer: int, qkv: str) -> str:
        """qkv [B, T, (H + 2 H_kv)*D], the fused projection -> context [B, T, H*D]; emits this variant's K/V
        outputs. gqa adds its extra row here, once for q, k and v."""
        b, s = self.b, self.spec
        if self.extra_row:
            qkv = self._with_extra_row(qkv)
        q, k, v = self.split(qkv, [s.num_heads * s.head_dim] + [s.num_kv_heads * s.head_dim] * 2)
        if self.in_place:
            return self._attention_in_place(layer, q, k, v)
        q, k, v = self._heads(q, s.num_heads), self._heads(k, s.num_kv_heads), self._heads(v, s.num_kv_heads)
        if self.cos_sin:
            q, k = self._rotate(q), self._rotate(k)
        kv_out = ["batch", s.num_kv_heads, "step", s.head_dim]
        b.output(self._unpadded(k, 2), f"key.{layer}", TensorProto.FLOAT, kv_out)
        b.output(self._unpadded(v, 2), f"value.{layer}", TensorProto.FLOAT, kv_out)
        past_k, past_v = self.past[layer]
        index = b.op("Expand", self.scatter_index, b.op("Shape", k))                      # [B, Hkv, T, D]
        keys = b.op("ScatterElements", past_k, index, k, axis=2)                          # [B, Hkv, S, D]
        values = b.op("ScatterElements", past_v, index, v, axis=2)
        q = b.op("Reshape", q, b.const([0, s.num_kv_heads, -1, s.head_dim]))             # [B, Hkv, G*T, D]
        if self.groups == 1:
            q = b.op("Concat", q, q, axis=2)                                              # [B, H, 2T, D]
        scores = b.op("MatMul", q, b.op("Transpose", keys, perm=[0, 1, 3, 2]))            # [B, Hkv, R*T, S]
        scores = b.op("Where", self.visible, b.op("Mul", scores, self.scale), self.masked)
        context = b.op("MatMul", b.op("Softmax", scores, axis=-1), values)                # [B, Hkv, R*T, D]
        if self.groups == 1:
            context = b.op("Split", context, axis=2, n_out=2)[0]                          # [B, H, T, D]
        context = b.op("Reshape", context, b.const([0, s.num_heads, -1, s.head_dim]))    # [B, H, T, D]
        context = b.op("Transpose", context, perm=[0, 2, 1, 3])                           # [B, T, H, D]
        return b.op("Reshape", context, b.const([0, 0, s.num_heads * s.head_dim]))

    def _attention_in_place(self, layer: int, q: str, k: str, v: str) -> str:
        b, s = self.b, self.spec
        if self.cos_sin:
            cos, sin = self.cos_sin
            q = b.op("RotaryEmbedding", q, self.attention_positions, cos, sin, domain="com.microsoft",
                     interleaved=0, num_heads=s.num_heads)                                # [B, T + 1, H*D]
            k = b.op("RotaryEmbedding", k, self.attention_positions, cos, sin, domain="com.microsoft",
                     interleaved=0, num_heads=s.num_kv_heads)
        past_k, past_v = self.past[layer]
        # present_* are the node's own outputs (no Identity): onnxruntime shares them with past_* only then
        present = (f"present_key.{layer}", f"present_value.{layer}")
        context, present_k, present_v = b.op(
            "GroupQueryAttention", q, k, v, past_k, past_v, self.seqlens_k, self.total_length, n_out=3,
            out_names=[None, *present], domain="com.microsoft", num_heads=s.num_heads, kv_num_heads=s.num_kv_heads,
            scale=float(1.0 / np.sqrt(s.head_dim)))
        kv_shape = ["batch", s.num_kv_heads, self.kv_slots, s.head_dim]
        b.output(present_k, f"present_key.{layer}", TensorProto.FLOAT, kv_shape)
        b.output(present_v, f"present_value.{layer}", TensorProto.FLOAT, kv_shape)
        if self.extra_row:
            context = b.op("Slice", context, b.const([0]), b.const([-1]), b.const([1]))   # drops the extra row
        return context                                                                    # [B, T, H*D]

    def logits(self, hidden: str, head: np.ndarray, tied_embedding: str | None = None) -> None:
        """hidden [B, T, E], head [V, E] (HF layout) -> logits [B, n, V] of the last n = num_logits tokens.

        An fp32 head tied to the embedding shares its initializer; a quantized or row-subset one gets its
        own copy. With head_rows, n columns are those tokens': [B, n, len(head_rows)].
        """
        if self.head_rows is not None:
            head, tied_embedding = head[self.head_rows], None
        b, v = self.b, head.shape[0]
        if self.pad_rows:
            return self._padded_logits(hidden, head)
        last = b.op("Slice", hidden, b.op("Neg", self.num_logits), b.const([np.iinfo(np.int64).max]), b.const([1]))
        if self.quantization is not None:
            logits = self._matmul_nbits(last, "lm_head", head)                           # [B, n, V]
        else:
            head_name = tied_embedding or b.weight("lm_head.weight", head)
            flat = b.op("Reshape", last, b.const([-1, self.spec.hidden_size]))
            logits = b.op("Gemm", flat, head_name, transB=1)                              # [B*n, V]
            shape = b.op("Concat", b.op("Slice", b.op("Shape", last), b.const([0]), b.const([2])),
                         b.const([v]), axis=0)
            logits = b.op("Reshape", logits, shape)
        b.output(logits, "logits", TensorProto.FLOAT, ["batch", "logit_rows", v])


    def _padded_logits(self, hidden: str, head: np.ndarray) -> None:
        """hidden [B, T', E] with T' = max(T, min_rows) rows (_pad_rows) -> logits of the last n real rows. The
        head (quantized: padding is for quantized targets) also gets m = max(n, min_rows) rows, the last m of
        hidden, so that with min_rows 2 one logit row is computed as two, like a verify call's; then the pad
        rows are dropped."""
        b, one = self.b, self.b.const([1])
        m = b.op("Max", self.num_logits, self.min_rows)
        rows = b.op("Slice", hidden, b.op("Sub", self.padded_rows, m), self.padded_rows, one)   # [B, m, E]
        logits = self._matmul_nbits(rows, "lm_head", head)                               # [B, m, V]
        end = b.op("Sub", m, b.op("Sub", self.padded_rows, self.step_rows))              # m - pad rows
        logits = b.op("Slice", logits, b.op("Sub", end, self.num_logits), end, one)      # [B, n, V]
        b.output(logits, "logits", TensorProto.FLOAT, ["batch", "logit_rows", head.shape[0]])


def io_names(num_layers: int, attention: str = "scatter", pad_rows: bool = False) -> dict:
    """The I/O names of a step graph, as the manifest records them."""
    kv_out = ("present_key", "present_value") if attention == "gqa" else ("key", "value")
    return {
        "inputs": ["input_ids", "position_ids", "num_logits"] + (["min_rows"] if pad_rows else [])
        + [n for i in range(num_layers) for n in (f"past_key.{i}", f"past_value.{i}")],
        "outputs": ["logits"] + [f"{name}.{i}" for i in range(num_layers) for name in kv_out],
    }
