"""The MLA decode kernels' runtime arguments, checked and packed once (`decode_args`).

`decode_args(q, kv, q_row_offsets, ...)` takes `mla_decode_triton`'s arguments, checks what the
kernels need of them (metadata only: no host sync) and returns a `DecodeArgs`: the query, the
outputs, and each operand as an `OperandArgs` (base tensor, strides, lookup table or row
offsets, page geometry, scales, and the compile-time format: FMT_*, how the first 512 dims of
a K tile are built A_*, chunks). Its methods give each kernel family's positional argument
list (`tl_args`: `triton_mla_kernel._mla_decode_kernel`; `sm90_args`: the Gluon sm_90
kernels; `ps_args`: the persistent `gluon_mla_ps`), so every list is written once. Each list
leads with small argument tuples the kernels unpack (q_args, out_args, k_args; x_args of the
tl kernel): Triton specializes a tuple's members as it does plain arguments, so the PTX is the
same (checked with dev/ptx_digest.py).

Formats: BF16 (q's dtype), blockwise / per-tensor e4m3 with a scale buffer, rope-aware
(`mla_rope_aware`), FlashMLA V32 and MODEL1 (`fp8.mla_formats` has the byte layouts).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch

from ...errors import Lazy, check
from ...fp8.mla_formats import MODEL1_BYTES, MODEL1_DATA_BYTES, V32_BYTES
from ..constants import LOG2E_F

# Cache formats (compile-time).
FMT_BF16, FMT_BLOCKWISE, FMT_PER_TENSOR, FMT_ROPE_AWARE, FMT_V32, FMT_MODEL1 = range(6)
# How the first 512 dims of a K tile (also V) are built.
A_PLAIN, A_FOLD, A_CHUNK, A_GATHER = range(4)

FORMATS = {
    None: FMT_BF16,
    "blockwise": FMT_BLOCKWISE,
    "per_tensor": FMT_PER_TENSOR,
    "mla_rope_aware": FMT_ROPE_AWARE,
    "flashmla_v32": FMT_V32,
    "flashmla_model1": FMT_MODEL1,
}


class OperandArgs:
    """Kernel arguments of one MLA operand (main or extra)."""

    def __init__(self, op, d_qk: int, q_dtype: torch.dtype, name: str) -> None:
        check(hasattr(op, "kernel_args"), name, "an MHAOperand with kernel_args()", type(op))
        a = op.kernel_args()
        rows = a.rows
        check(
            rows.ndim == 3 and rows.shape[1] == 1,
            f"{name}.rows",
            "[rows, 1, row_elems]",
            rows.shape,
        )
        self.fmt = FORMATS.get(a.quant_format, -1)
        check(
            self.fmt >= 0,
            f"{name}.quant_format",
            Lazy(lambda: f"one of {list(FORMATS)}"),
            a.quant_format,
        )
        head_dim = getattr(op, "head_dim", d_qk)
        check(head_dim == d_qk, f"{name}.head_dim", f"{d_qk} (q's last dim)", head_dim)
        self.data = rows
        self.stride = rows.stride(0)
        self.sc = a.scales
        self.sc_stride = 0
        self.e8m0 = False
        self.amode, self.fold_t, self.nc, self.cw, self.g = A_PLAIN, False, 1, 512, 1
        fmt = self.fmt
        expect = {
            FMT_BF16: (q_dtype, d_qk),
            FMT_BLOCKWISE: (torch.float8_e4m3fn, d_qk),
            FMT_PER_TENSOR: (torch.float8_e4m3fn, d_qk),
            FMT_ROPE_AWARE: (torch.uint8, d_qk - 64 + 128),
            FMT_V32: (torch.uint8, V32_BYTES),
            FMT_MODEL1: (torch.uint8, MODEL1_BYTES),
        }[fmt]
        check(
            rows.dtype == expect[0] and rows.shape[2] == expect[1] and rows.stride(2) == 1,
            f"{name}.rows",
            Lazy(
                lambda: (
                    f"{expect[0]} rows of {expect[1]} contiguous elements for format "
                    f"{a.quant_format!r}"
                )
            ),
            Lazy(lambda: f"{rows.dtype} {tuple(rows.shape)} strides {rows.stride()}"),
        )
        if fmt != FMT_BF16:
            check(
                d_qk in (576, 512),
                name,
                "d_qk 576 or 512 for an FP8 cache (BF16 / FP16 caches take any d_qk <= 576)",
                Lazy(lambda: f"d_qk {d_qk} and format {a.quant_format!r}"),
            )
        if fmt == FMT_V32:
            check(d_qk == 576, name, "d_qk 576 for the V32 format", d_qk)
        if fmt == FMT_MODEL1:
            check(d_qk == 512, name, "d_qk 512 for the MODEL1 format", d_qk)
            check(a.page_size > 0, name, "a paged operand for the MODEL1 format", "not paged")
        if fmt in (FMT_ROPE_AWARE, FMT_V32, FMT_MODEL1):
            check(
                self.stride % 4 == 0, f"{name}.rows.stride(0)", "a multiple of 4 bytes", self.stride
            )
        if fmt in (FMT_BLOCKWISE, FMT_ROPE_AWARE):
            check(self.sc is not None, f"{name}.scales", "a scale tensor", None)
            self.sc_stride = self.sc.stride(0)
            self.e8m0 = self.sc.dtype == torch.float8_e8m0fnu
            check(
                self.sc.dtype in (torch.float32, torch.float8_e8m0fnu),
                f"{name}.scales.dtype",
                "float32 or float8_e8m0fnu",
                self.sc.dtype,
            )
            if self.e8m0:
                self.sc = self.sc.view(torch.uint8)
        if fmt == FMT_PER_TENSOR:
            check(
                self.sc is not None and self.sc.numel() == 1, f"{name}.scales", "one scale", self.sc
            )
            self.sc = self.sc.float()
        if fmt == FMT_BLOCKWISE:
            g = a.granularity or d_qk
            check(d_qk % g == 0, f"{name}.granularity", f"a divisor of {d_qk}", g)
            self.g = g
            if g == d_qk:
                self.amode, self.fold_t = A_FOLD, True
            elif 512 % g == 0 and g >= 8:
                self.amode, self.nc, self.cw = A_CHUNK, 512 // g, g
            else:
                self.amode = A_GATHER
        elif fmt == FMT_PER_TENSOR:
            self.amode, self.fold_t = A_FOLD, True
        elif fmt == FMT_ROPE_AWARE:
            if d_qk == 576:
                self.amode = A_FOLD
            else:
                self.amode, self.nc, self.cw = A_CHUNK, 8, 64
        elif fmt == FMT_V32:
            self.amode, self.nc, self.cw = A_CHUNK, 4, 128
        elif fmt == FMT_MODEL1:
            self.amode, self.nc, self.cw = A_CHUNK, 8, 64
        # Hand-pipelined loads (the kernel's PREFETCH), except for the per-element-gather slow
        # path whose [BN, 512] scale tile would not fit in registers twice.
        self.prefetch_default = self.amode != A_GATHER
        self.paged = a.page_size > 0
        n_rows = rows.shape[0]
        if self.paged:
            self.ps, self.psr = a.page_size, a.page_stride_rows
            self.npages = max((n_rows - self.ps) // self.psr + 1, 1)
            self.nenc = self.npages * self.ps
            self.lut = a.lut
            self.roff = None
        else:
            self.ps, self.psr, self.npages, self.nenc = 1, 1, 1, n_rows
            self.lut = None
            self.roff = a.row_offsets
        self.psb = self.psr * self.stride if fmt == FMT_MODEL1 else 0
        row_bytes = (MODEL1_DATA_BYTES if fmt == FMT_MODEL1 else self.stride) * rows.element_size()
        self.align = (
            rows.data_ptr() % 16 == 0
            and row_bytes % 16 == 0
            and self.psb % 16 == 0
            and (fmt == FMT_MODEL1 or (self.stride * rows.element_size()) % 16 == 0)
        )
        self.cl = a.cache_lengths
        if self.sc is None:
            self.sc = rows  # never read

    def row_strides(self) -> tuple[int, int, int]:
        """The row stride in elements of the storage dtype, of 2 bytes and of 4 bytes (byte
        rows: the packed formats' bf16 and f32 fields)."""
        return self.stride, self.stride // 2, self.stride // 4


def sparse_args(indices, lengths, tokens: int, batch: int, name: str):
    """(indices with unit last stride, lengths, whether lengths are per token) of a sparse
    operand, checked: int32 [tokens, stride] indices, int32 [batch] (or [tokens]) lengths."""
    check(
        indices.ndim == 2 and indices.shape[0] == tokens and indices.dtype == torch.int32,
        name,
        f"an int32 [tokens={tokens}, stride] tensor",
        Lazy(lambda: f"{indices.dtype} {tuple(indices.shape)}"),
    )
    if indices.stride(1) != 1:
        indices = indices.contiguous()
    per_tok = False
    if lengths is not None:
        n = lengths.numel()
        check(
            lengths.dtype == torch.int32 and n in (batch, tokens),
            f"{name} lengths",
            f"int32 [batch={batch}] (or [tokens={tokens}])",
            Lazy(lambda: f"{lengths.dtype} {tuple(lengths.shape)}"),
        )
        per_tok = n != batch
    return indices, lengths, per_tok


class DecodeArgs(NamedTuple):
    """One `mla_decode_triton` call's checked arguments (`decode_args`; a NamedTuple: immutable
    and cheap to build on the call's host path)."""

    q: torch.Tensor  # [tokens, h_q, d_qk]
    q_row_offsets: torch.Tensor  # [batch + 1] int32 (also the dummy of absent tensors)
    tokens: int
    h_q: int
    d_qk: int
    batch: int
    d_v: int
    causal: bool
    sm_scale: float
    out: torch.Tensor  # [tokens, h_q, d_v]
    lse: torch.Tensor  # [tokens, h_q] f32
    sink: torch.Tensor | None = None  # [h_q] f32, contiguous
    K: OperandArgs | None = None  # None when there is nothing to compute (no token or head)
    sparse: bool = False
    idx: Any = None  # [tokens, stride] int32 (sparse), else q_row_offsets
    topk: torch.Tensor | None = None
    topk_tok: bool = False  # topk holds one length a token, not a request
    X: OperandArgs | None = None  # the extra operand (sparse), else K (never read)
    x_idx: Any = None
    x_topk: torch.Tensor | None = None
    x_topk_tok: bool = False
    has_x: bool = False

    def _q(self) -> tuple:
        """q and its request offsets: (Q, stride_qt, stride_qh, QOFF, batch, n_tokens)."""
        q = self.q
        return (q, q.stride(0), q.stride(1), self.q_row_offsets, self.batch, self.tokens)

    def _out(self, po, pl, *mid) -> tuple:
        """The outputs, `mid`, then the sink (lse: never read without one) and the scale of the
        scores in log2 units."""
        out = self.out
        return (out, out.stride(0), out.stride(1), self.lse, po, pl, *mid,
                self.sink if self.sink is not None else self.lse, self.sm_scale * LOG2E_F)  # fmt: skip

    def _opt(self, t: torch.Tensor | None) -> torch.Tensor:
        return t if t is not None else self.q_row_offsets

    def _idx_len(self, idx, used: bool) -> int:
        return idx.shape[1] if used else 0

    def tl_args(self, po, pl, P: int) -> tuple:
        """`_mla_decode_kernel`'s positional arguments: the tuples q_args, out_args (the
        outputs, sink, scale, P), k_args (the main operand) and x_args (the extra one)."""
        K, X, idx, x_idx = self.K, self.X, self.idx, self.x_idx
        k_args = (
            K.data, K.sc, self._opt(K.lut), self._opt(K.roff), K.cl, idx, self._opt(self.topk),
            *K.row_strides(), K.sc_stride, K.lut.stride(0) if K.paged else 0, K.ps, K.psr,
            K.psb, K.psb // 2, K.nenc, K.npages, idx.stride(0), self._idx_len(idx, self.sparse),
        )  # fmt: skip
        x_args = (
            X.data, X.sc, x_idx, self._opt(self.x_topk),
            *X.row_strides(), X.sc_stride, X.ps, X.psr, X.psb, X.psb // 2, X.nenc,
            x_idx.stride(0), self._idx_len(x_idx, self.has_x),
        )  # fmt: skip
        return self._q(), (*self._out(po, pl), P), k_args, x_args

    def sm90_args(self, po, pl, P: int) -> tuple:
        """The Gluon sm_90 kernels' positional arguments (paged operands, no extra one): the
        tuples q_args, out_args (the outputs, sink, scale, P) and k_args (the cache)."""
        K, idx = self.K, self.idx
        k_args = (
            K.data, K.sc, K.lut, K.cl, idx, self._opt(self.topk),
            *K.row_strides(), K.sc_stride, K.lut.stride(0), K.ps, K.psr, K.nenc, K.npages,
            idx.stride(0), self._idx_len(idx, self.sparse),
        )  # fmt: skip
        return self._q(), (*self._out(po, pl), P), k_args

    def ps_args(self, po, pl, cut_t, L: int, npr: int) -> tuple:
        """`gluon_mla_ps._mla_decode_sm90_ps`'s positional arguments (sparse V32): q_args,
        out_args (with the cut tokens' CUT_T), k_args, L, NPR."""
        K, idx = self.K, self.idx
        k_args = (
            K.data, K.cl, idx, self._opt(self.topk), *K.row_strides(), K.ps, K.psr, K.nenc,
            K.npages, idx.stride(0), idx.shape[1],
        )  # fmt: skip
        return self._q(), self._out(po, pl, cut_t), k_args, L, npr


def decode_args(q, kv, q_row_offsets, d_v, scale, causal, indices, topk_lengths, extra_kv,
                extra_indices, extra_topk_lengths, attn_sink, out) -> DecodeArgs:  # fmt: skip
    """`mla_decode_triton`'s arguments (in its order) checked (InvalidArgumentError naming the
    argument) and packed; allocates `out` when None and `lse`. K is None when there is nothing
    to compute."""
    check(q.ndim == 3, "q", "a [tokens, h_q, d_qk] tensor", tuple(q.shape))
    tokens, h_q, d_qk = q.shape
    check(
        q.dtype in (torch.bfloat16, torch.float16),
        "q.dtype",
        "torch.bfloat16 or torch.float16 (use the reference backend for float32)",
        q.dtype,
    )
    check(1 <= d_qk <= 576, "q.shape[-1]", "d_qk in [1, 576]", d_qk)
    check(q.stride(2) == 1, "q", "a last dim of stride 1", q.stride())
    check(1 <= d_v <= 512 and d_v <= d_qk, "d_v", f"in [1, {min(512, d_qk)}]", d_v)
    check(
        q_row_offsets.ndim == 1
        and q_row_offsets.dtype == torch.int32
        and q_row_offsets.numel() >= 1,
        "q_row_offsets",
        "a 1-D int32 [batch + 1] tensor",
        Lazy(lambda: f"{q_row_offsets.dtype} {tuple(q_row_offsets.shape)}"),
    )
    batch = q_row_offsets.numel() - 1
    dev = q.device
    if out is None:
        out = torch.empty(tokens, h_q, d_v, dtype=q.dtype, device=dev)
    else:
        check(
            tuple(out.shape) == (tokens, h_q, d_v) and out.dtype == q.dtype and out.stride(2) == 1,
            "out",
            Lazy(lambda: f"a {q.dtype} [{tokens}, {h_q}, {d_v}] tensor with unit last stride"),
            Lazy(lambda: f"{out.dtype} {tuple(out.shape)}"),
        )
    lse = torch.empty(tokens, h_q, dtype=torch.float32, device=dev)
    if tokens == 0 or h_q == 0:
        return DecodeArgs(q, q_row_offsets, tokens, h_q, d_qk, batch, d_v, causal, 0.0, out, lse)

    K = OperandArgs(kv, d_qk, q.dtype, "kv")
    check(K.cl.numel() == batch, "kv.cache_lengths", f"[batch={batch}]", tuple(K.cl.shape))
    sparse = indices is not None
    if sparse:
        idx, topk, topk_tok = sparse_args(indices, topk_lengths, tokens, batch, "indices")
    else:
        check(topk_lengths is None, "topk_lengths", "None without indices", "a tensor")
        idx, topk, topk_tok = q_row_offsets, None, False
    has_x = extra_kv is not None
    if has_x:
        check(extra_indices is not None, "extra_indices", "a tensor with extra_kv", None)
        X = OperandArgs(extra_kv, d_qk, q.dtype, "extra_kv")
        x_idx, x_topk, x_topk_tok = sparse_args(
            extra_indices, extra_topk_lengths, tokens, batch, "extra_indices"
        )
    else:
        check(extra_indices is None, "extra_indices", "None without extra_kv", "a tensor")
        X, x_idx, x_topk, x_topk_tok = K, idx, None, False
    if attn_sink is not None:
        check(
            attn_sink.numel() == h_q and attn_sink.dtype == torch.float32,
            "attn_sink",
            f"a float32 [h_q={h_q}] tensor",
            Lazy(lambda: f"{attn_sink.dtype} {tuple(attn_sink.shape)}"),
        )
        attn_sink = attn_sink.contiguous()
    sm_scale = (1.0 / math.sqrt(d_qk)) if scale is None else float(scale)
    return DecodeArgs(
        q, q_row_offsets, tokens, h_q, d_qk, batch, d_v, bool(causal), sm_scale, out, lse,
        attn_sink, K, sparse, idx, topk, topk_tok, X, x_idx, x_topk, x_topk_tok, has_x,
    )  # fmt: skip
