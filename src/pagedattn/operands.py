"""Layer 2: how a kernel addresses K/V. The `MHAOperand` protocol and its implementations.

Every operand views its storage as rows: a `[num_kv_rows, heads, row_elems]` tensor `rows`
(a strided view into the cache buffer, no copy), where one row holds one token of every head.

- Paged: row_idx(b, t) = lut[b, t // page_size] * page_stride_rows + t % page_size.
- Non-paged (dense, continuous batching, ragged): row_idx(b, t) = row_offsets[b] + t.

`kernel_args()` hands a Triton kernel exactly that (base tensor, strides, lookup table or row
offsets, page size, cache lengths, scales), so one kernel serves every operand kind through
compile-time specialisation on `page_size > 0` and on the quantization format.

Cache lengths count tokens cached before the step. An op over queries with `q_len(b)` new
tokens reads `cache_length(b) + q_len(b)` keys (the new tokens' K/V are written first).
"""

from __future__ import annotations

import copy
import weakref
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import torch

from .cache.inputs import KVCacheInputsPerDevice
from .cache.params import KVCacheParams
from .errors import InvalidArgumentError, check, check_int
from .fp8 import dequantize_blockwise, mla_formats
from .fp8.mla_formats import MODEL1_BYTES, MODEL1_DATA_BYTES, MODEL1_SCALE_BYTES


@dataclass
class KernelArgs:
    """What a Triton kernel needs to read an operand (tensors stay on the operand's device).

    rows: [num_kv_rows, heads, row_elems] strided view; rows.stride() gives row/head strides.
    lut: [batch, cols] int32 page ids (paged) or None.
    row_offsets: [batch] int32 first row of each request (non-paged) or None.
    page_size: tokens per page, 0 when not paged.
    page_stride_rows: rows between consecutive physical pages (paged only).
    cache_lengths: [batch] int32 tokens cached before the step.
    scales: [num_kv_rows, heads, n_scales] view (blockwise, rope-aware) or [] float32 scalar
      (per-tensor) or None.
    quant_format / granularity: the FP8 layout (None when not quantized) and its G.
    """

    rows: torch.Tensor
    lut: torch.Tensor | None
    row_offsets: torch.Tensor | None
    page_size: int
    page_stride_rows: int
    cache_lengths: torch.Tensor
    scales: torch.Tensor | None
    quant_format: str | None
    granularity: int


@runtime_checkable
class MHAOperand(Protocol):
    """The MHAOperand trait (seed `mha_operand_trait.txt`) in Python."""

    dtype: torch.dtype
    page_size: int
    quantization_enabled: bool
    quantization_granularity: int
    scale_dtype: torch.dtype | None

    def cache_length(self, batch_idx: int) -> int: ...
    def max_context_length(self) -> int: ...
    def num_kv_rows(self) -> int: ...
    def row_idx(self, batch_idx: int, tok_idx: int) -> int: ...
    def get_tma_row(self, encoded_index: int) -> int: ...
    def populate(self, batch_idx: int, base_kv_row: int, BN: int) -> list[int]: ...
    def kernel_args(self) -> KernelArgs: ...


class RowOperand:
    """Shared implementation: a row view plus a paged or offset addressing rule.

    Do not build directly; use `PagedOperand`, `DenseOperand`, `ContinuousBatchingOperand`,
    `RaggedOperand` or `ScalesOperand`.
    """

    def __init__(
        self,
        rows: torch.Tensor,
        cache_lengths: torch.Tensor,
        *,
        lut: torch.Tensor | None = None,
        page_size: int = 0,
        page_stride_rows: int = 0,
        row_offsets: torch.Tensor | None = None,
        head_dim: int | None = None,
        scales: torch.Tensor | None = None,
        quant_format: str | None = None,
        granularity: int = 0,
        scale_dtype: torch.dtype | None = None,
        logical_dtype: torch.dtype | None = None,
        rope_dim: int = 0,
    ) -> None:
        check(rows.ndim == 3, "rows", "a [num_kv_rows, heads, row_elems] tensor", rows.shape)
        check(
            cache_lengths.ndim == 1 and cache_lengths.dtype == torch.int32,
            "cache_lengths",
            "a 1-D int32 tensor",
            f"{tuple(cache_lengths.shape)} {cache_lengths.dtype}",
        )
        self.rows = rows
        self.cache_lengths = cache_lengths
        self.lut = lut
        self.page_size = int(page_size)
        self.page_stride_rows = int(page_stride_rows)
        self.row_offsets = row_offsets
        self.head_dim = head_dim if head_dim is not None else rows.shape[-1]
        self.num_heads = rows.shape[1]
        self.dtype = rows.dtype
        self.logical_dtype = logical_dtype or rows.dtype
        self.scales = scales
        self.quant_format = quant_format
        self.quantization_enabled = quant_format is not None
        self.quantization_granularity = int(granularity)
        self.scale_dtype = scale_dtype
        self.rope_dim = rope_dim
        self._cl_host: list[int] | None = None
        self._lut_host: list[list[int]] | None = None

    # Host mirrors (these methods are for tests, planning and the reference path) ---------
    def _cl(self) -> list[int]:
        if self._cl_host is None:
            self._cl_host = self.cache_lengths.tolist()
        return self._cl_host

    def _lut(self) -> list[list[int]]:
        if self._lut_host is None:
            self._lut_host = self.lut.tolist()
        return self._lut_host

    @property
    def batch_size(self) -> int:
        return self.cache_lengths.shape[0]

    def select_requests(self, start: int, stop: int) -> RowOperand:
        """This operand over requests [start, stop) of its batch only (request b of the result
        is request start + b here): views of the cache lengths and of the lookup table or row
        offsets, the same rows and scales (no copy, no host sync)."""
        check(
            isinstance(start, int) and isinstance(stop, int) and 0 <= start <= stop
            and stop <= self.batch_size,
            "start, stop",
            f"ints with 0 <= start <= stop <= batch size {self.batch_size}",
            (start, stop),
        )  # fmt: skip
        op = copy.copy(self)
        op.cache_lengths = self.cache_lengths[start:stop]
        if self.lut is not None:
            op.lut = self.lut[start:stop]
        if self.row_offsets is not None:
            op.row_offsets = self.row_offsets[start:stop]
        op._cl_host = op._lut_host = None
        return op

    def cache_length(self, batch_idx: int) -> int:
        return self._cl()[batch_idx]

    def max_context_length(self) -> int:
        return max(self._cl(), default=0)

    def num_kv_rows(self) -> int:
        return self.rows.shape[0]

    def row_idx(self, batch_idx: int, tok_idx: int) -> int:
        if self.page_size:
            page = self._lut()[batch_idx][tok_idx // self.page_size]
            return page * self.page_stride_rows + tok_idx % self.page_size
        return int(self.row_offsets[batch_idx]) + tok_idx

    def get_tma_row(self, encoded_index: int) -> int:
        """block*page_size + offset -> block*page_stride_rows + offset; identity if not paged."""
        if not self.page_size:
            return int(encoded_index)
        block, off = divmod(int(encoded_index), self.page_size)
        return block * self.page_stride_rows + off

    def populate(self, batch_idx: int, base_kv_row: int, BN: int) -> list[int]:
        """Physical row of the first token of each page sub-tile of tokens
        [base_kv_row, base_kv_row + BN): one entry per page the tile touches."""
        if not self.page_size:
            return [self.row_idx(batch_idx, base_kv_row)]
        ps = self.page_size
        out, t = [], base_kv_row
        while t < base_kv_row + BN:
            out.append(self.row_idx(batch_idx, t))
            t = (t // ps + 1) * ps
        return out

    def physical_rows(self, batch_idx: torch.Tensor | int, pos: torch.Tensor) -> torch.Tensor:
        """`row_idx` elementwise on the device: int64 rows of (request, position) pairs."""
        if self.page_size:
            page = self.lut.long()[batch_idx, pos // self.page_size]
            return page * self.page_stride_rows + pos % self.page_size
        return self.row_offsets.long()[batch_idx] + pos

    def rows_for(self, batch_idx: int, num_tokens: int) -> torch.Tensor:
        """[num_tokens] int64 physical rows of tokens 0..num_tokens-1 of a request (device)."""
        return self.physical_rows(batch_idx, torch.arange(num_tokens, device=self.rows.device))

    def num_sparse_slots(self) -> int:
        """Encoded sparse indices valid for this operand lie in [0, num_sparse_slots()).

        Paged: num_pages * page_size (an index encodes `block * page_size + offset` with `block`
        a physical page id). Not paged: the number of rows.
        """
        n_rows = self.num_kv_rows()
        if not self.page_size:
            return n_rows
        if n_rows < self.page_size:
            return 0
        return ((n_rows - self.page_size) // self.page_stride_rows + 1) * self.page_size

    def tma_rows(self, encoded: torch.Tensor) -> torch.Tensor:
        """`get_tma_row` elementwise: int64 physical rows of encoded sparse indices (only
        meaningful for valid entries, see `num_sparse_slots`)."""
        enc = encoded.long()
        if not self.page_size:
            return enc
        return (enc // self.page_size) * self.page_stride_rows + enc % self.page_size

    def load_rows(self, rows: torch.Tensor, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """Dequantized [len(rows), heads, head_dim] for physical row ids (reference path)."""
        raw = self.rows[rows]
        f = self.quant_format
        if f is None:
            return raw.to(out_dtype)
        if f == "blockwise":
            return dequantize_blockwise(
                raw, self.scales[rows], self.quantization_granularity, out_dtype
            )
        if f == "per_tensor":
            return raw.to(out_dtype) * self.scales.to(out_dtype)
        if f == "mla_rope_aware":
            return mla_formats.unpack_rope_aware(raw, self.scales[rows], self.rope_dim, out_dtype)
        if f == "flashmla_v32":
            return mla_formats.unpack_v32(raw, out_dtype)
        if f == "flashmla_model1":
            return load_model1_rows(self, rows, out_dtype)
        raise InvalidArgumentError(f"quant_format: unknown {f!r}")

    def gather(self, batch_idx: int, num_tokens: int, out_dtype=torch.float32) -> torch.Tensor:
        """Tokens 0..num_tokens-1 of a request, dequantized: [num_tokens, heads, head_dim]."""
        return self.load_rows(self.rows_for(batch_idx, num_tokens), out_dtype)

    def kernel_args(self) -> KernelArgs:
        return KernelArgs(
            rows=self.rows,
            lut=self.lut,
            row_offsets=self.row_offsets,
            page_size=self.page_size,
            page_stride_rows=self.page_stride_rows,
            cache_lengths=self.cache_lengths,
            scales=self.scales,
            quant_format=self.quant_format,
            granularity=self.quantization_granularity,
        )


# Packed MLA rows through an operand (the byte layouts are fp8.mla_formats') -------------
def model1_page_views(op: RowOperand) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(data [pages, page_size, 576], scale trailer [pages, page_size, 8], page stride rows)
    as uint8 views of a MODEL1 operand's storage (no copy)."""
    ps, st = int(op.page_size), int(op.page_stride_rows)
    check(ps > 0, "op.page_size", "> 0 (MODEL1 needs a paged operand)", ps)
    check(st >= ps, "op.page_stride_rows", f">= page_size={ps}", st)
    r = op.rows
    check(
        r.dtype == torch.uint8
        and r.ndim == 3
        and r.shape[1] == 1
        and r.shape[2] == MODEL1_BYTES
        and r.is_contiguous()
        and r.shape[0] >= ps,
        "op.rows",
        f"a contiguous uint8 [rows >= {ps}, 1, {MODEL1_BYTES}] view",
        f"{tuple(r.shape)} {r.dtype} strides {r.stride()}",
    )
    n_pages = (r.shape[0] - ps) // st + 1
    base, page_bytes = r.storage_offset(), st * MODEL1_BYTES
    data = r.as_strided((n_pages, ps, MODEL1_DATA_BYTES), (page_bytes, MODEL1_DATA_BYTES, 1), base)
    trailer = r.as_strided(
        (n_pages, ps, MODEL1_SCALE_BYTES),
        (page_bytes, MODEL1_SCALE_BYTES, 1),
        base + ps * MODEL1_DATA_BYTES,
    )
    return data, trailer, st


def check_row_ids(rows: object, n: int | None = None) -> torch.Tensor:
    """rows: a 1-D int32/int64 tensor of physical row ids (of length n when given), as int64."""
    check(
        isinstance(rows, torch.Tensor)
        and rows.ndim == 1
        and rows.dtype in (torch.int32, torch.int64),
        "rows",
        "a 1-D int32/int64 tensor of physical row ids",
        f"{tuple(rows.shape)} {rows.dtype}" if isinstance(rows, torch.Tensor) else type(rows),
    )
    if n is not None:
        check(rows.shape[0] == n, "rows", f"length {n} (x.shape[0])", rows.shape[0])
    return rows.long()


def load_model1_rows(
    op: RowOperand, rows: torch.Tensor, out_dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """Dequantize MODEL1 tokens at physical rows (row = page * page_stride_rows + offset, as
    `op.row_idx` / `op.rows_for` / `op.get_tma_row` produce) -> [N, 1, 512] in out_dtype.

    Token `offset` of the page starting at row `page * page_stride_rows` has its data at byte
    offset*576 of that page's block and its scales at byte page_size*576 + offset*8.
    Rows must address valid tokens (offset < page_size); nothing is checked on the device.
    """
    rows = check_row_ids(rows)
    data, trailer, st = model1_page_views(op)
    page, off = rows // st, rows % st
    return mla_formats.unpack_model1_tokens(data[page, off], trailer[page, off], out_dtype)


# id(blocks tensor) -> (a weak reference to it, {(kv_idx, layer, data pointer, shape, strides):
# (rows view, page stride)}): an engine builds each layer's operands every step (store_kv's and
# mha's: 4 a layer, ~20 us each of host time on the H200 host, most of it the indexing and
# as_strided below); an entry goes when its blocks tensor does, and the key's pointer, shape
# and strides keep a view from outliving a change of the blocks' storage. (Keyed by id, not a
# WeakKeyDictionary: its lookups compare tensors with ==.)
_ROWS: dict[int, tuple[weakref.ref, dict]] = {}


def _forget(i: int, r: weakref.ref) -> None:
    if _ROWS.get(i, (None,))[0] is r:
        del _ROWS[i]


def _paged_rows(blocks: torch.Tensor, kv_idx: int, layer: int) -> tuple[torch.Tensor, int]:
    """[P, kv_dim, L, page, H, D] -> ([P*kv_dim*L*page - offset, H, D] row view, page stride)."""
    i = id(blocks)
    entry = _ROWS.get(i)
    if entry is None or entry[0]() is not blocks:
        try:
            r = weakref.ref(blocks, lambda r, i=i: _forget(i, r))
        except TypeError:  # (not weak-referenceable)
            return _paged_rows_view(blocks, kv_idx, layer)
        entry = _ROWS[i] = (r, {})
    memo = entry[1]
    key = (kv_idx, layer, blocks.data_ptr(), blocks.shape, blocks.stride())
    got = memo.get(key)
    if got is None:
        rows, stride = _paged_rows_view(blocks, kv_idx, layer)
        # the same view over the storage alone (a view's `_base` would keep `blocks` alive)
        alone = rows.new_empty(0).set_(
            rows.untyped_storage(), rows.storage_offset(), rows.shape, rows.stride()
        )
        got = memo[key] = (alone, stride)
    return got


def _paged_rows_view(blocks: torch.Tensor, kv_idx: int, layer: int) -> tuple[torch.Tensor, int]:
    P, kv_dim, L, page, H, D = blocks.shape
    page_stride_rows = kv_dim * L * page
    base = blocks[0, kv_idx, layer]  # [page, H, D], data_ptr at the right offset
    n_rows = (P - 1) * page_stride_rows + page
    rows = base.as_strided((n_rows, H, D), (H * D, D, 1), base.storage_offset())
    return rows, page_stride_rows


def _paged_operand(
    buffer: torch.Tensor,
    inputs: KVCacheInputsPerDevice,
    params: KVCacheParams,
    layer_idx: int,
    kv_idx: int,
    **fields,
) -> RowOperand:
    """The rows of `buffer` (kv_blocks or kv_scales) for one layer and K or V, addressed
    through the cache's lookup table; `fields`: the rest of `RowOperand`'s arguments."""
    rows, stride = _paged_rows(buffer, kv_idx, layer_idx)
    return RowOperand(
        rows,
        inputs.cache_lengths,
        lut=inputs.lookup_table,
        page_size=params.page_size,
        page_stride_rows=stride,
        **fields,
    )


def _layer_scales(inputs, params, kv_idx: int, layer_idx: int) -> torch.Tensor | None:
    """The scales of K (kv_idx 0) or V (1) of one layer of a paged cache, or None."""
    fmt = params.quant_format
    if fmt in ("blockwise", "mla_rope_aware"):
        return _paged_rows(inputs.kv_scales, kv_idx, layer_idx)[0]
    if fmt == "per_tensor":
        return inputs.kv_scales[kv_idx, layer_idx]
    return None


def paged_layer_tensors(inputs: KVCacheInputsPerDevice, params: KVCacheParams,
                        layer_idx: int) -> list:  # fmt: skip
    """[K rows, V rows, K scales, V scales] of layer `layer_idx` (an int in [0, num_layers)):
    the tensors `PagedOperand(inputs, params, layer_idx, "k" / "v")` address (the rows the same
    memoized view objects; None where absent: V of an MLA cache, the scales of a plain one).
    What a prepared op keys a layer's cache by (`ops.store_kv`: one entry for every layer)."""
    if type(layer_idx) is not int or not 0 <= layer_idx < params.num_layers:
        raise IndexError(f"layer_idx {layer_idx!r}")  # (callers take their full path)
    blocks = inputs.kv_blocks
    k = _paged_rows(blocks, 0, layer_idx)[0]
    if params.is_mla:
        return [k, None, _layer_scales(inputs, params, 0, layer_idx), None]
    return [k, _paged_rows(blocks, 1, layer_idx)[0], _layer_scales(inputs, params, 0, layer_idx),
            _layer_scales(inputs, params, 1, layer_idx)]  # fmt: skip


def PagedOperand(
    inputs: KVCacheInputsPerDevice,
    params: KVCacheParams,
    layer_idx: int,
    kv: Literal["k", "v"] = "k",
) -> RowOperand:
    """K or V of one layer of a paged cache (MLA: kv must be 'k'; V is the first d_v of K)."""
    check(kv in ("k", "v"), "kv", "'k' or 'v'", kv)
    layer_idx = check_int("layer_idx", layer_idx, 0, params.num_layers - 1)
    if params.is_mla:
        check(kv == "k", "kv", "'k' for an MLA cache (V is the first d_v dims of K)", kv)
    kv_idx = 0 if kv == "k" else 1
    return _paged_operand(
        inputs.kv_blocks,
        inputs,
        params,
        layer_idx,
        kv_idx,
        head_dim=params.head_dim,
        scales=_layer_scales(inputs, params, kv_idx, layer_idx),
        quant_format=params.quant_format,
        granularity=params.scale_granularity or 0,
        scale_dtype=params.scale_dtype,
        logical_dtype=params.dtype,
        rope_dim=params.mla_rope_dim if params.is_mla else 0,
    )


def DenseOperand(
    x: torch.Tensor, cache_lengths: torch.Tensor, scales: torch.Tensor | None = None, G: int = 0
) -> RowOperand:
    """Dense `[batch, seq, heads, dim]` K or V (optionally FP8 with blockwise `scales`)."""
    check(x.ndim == 4, "x", "a [batch, seq, heads, dim] tensor", tuple(x.shape))
    B, S, H, D = x.shape
    offsets = torch.arange(B, device=x.device, dtype=torch.int32) * S
    sc = None if scales is None else scales.reshape(B * S, H, -1)
    return RowOperand(
        x.reshape(B * S, H, D),
        cache_lengths,
        row_offsets=offsets,
        scales=sc,
        quant_format="blockwise" if scales is not None else None,
        granularity=G or (D // scales.shape[-1] if scales is not None else 0),
        scale_dtype=None if scales is None else scales.dtype,
    )


def ContinuousBatchingOperand(
    cache: torch.Tensor, slots: torch.Tensor, cache_lengths: torch.Tensor
) -> RowOperand:
    """One max-length slot per request: cache `[max_batch, max_len, heads, dim]`, request b in
    slot `slots[b]`."""
    check(cache.ndim == 4, "cache", "a [max_batch, max_len, heads, dim] tensor", cache.shape)
    M, S, H, D = cache.shape
    return RowOperand(
        cache.reshape(M * S, H, D),
        cache_lengths,
        row_offsets=(slots.to(torch.int32) * S).contiguous(),
    )


def RaggedOperand(x: torch.Tensor, row_offsets: torch.Tensor) -> RowOperand:
    """Prefill K/V passed directly: `[total_tokens, heads, dim]` + `[batch + 1]` row offsets.
    No cached prefix (cache_length 0); request b's keys are rows [off[b], off[b+1])."""
    check(x.ndim == 3, "x", "a [total_tokens, heads, dim] tensor", tuple(x.shape))
    check(
        row_offsets.ndim == 1 and row_offsets.dtype == torch.int32,
        "row_offsets",
        "a 1-D int32 tensor of batch + 1 prefix sums",
        f"{tuple(row_offsets.shape)} {row_offsets.dtype}",
    )
    B = row_offsets.shape[0] - 1
    zeros = torch.zeros(B, dtype=torch.int32, device=x.device)
    return RowOperand(x, zeros, row_offsets=row_offsets[:-1].contiguous())


def ScalesOperand(
    inputs: KVCacheInputsPerDevice, params: KVCacheParams, layer_idx: int, kv: str = "k"
) -> RowOperand:
    """The scale pool of a blockwise/rope-aware FP8 cache viewed as an operand: rows of
    `[heads, head_dim // G]` scales, addressed like the cache itself."""
    check(
        params.quant_format in ("blockwise", "mla_rope_aware"),
        "params.quantization",
        "a blockwise or rope-aware FP8 cache",
        params.quant_format,
    )
    return _paged_operand(inputs.kv_scales, inputs, params, layer_idx, 0 if kv == "k" else 1)


# Flattening for torch.library custom ops (whose arguments must be tensors and scalars) ------
def flatten_operand(op: RowOperand) -> tuple[list[torch.Tensor | None], list[int], str]:
    """(tensors, ints, format) that `unflatten_operand` turns back into an equal operand."""
    tensors = [op.rows, op.cache_lengths, op.lut, op.row_offsets, op.scales]
    ints = [
        op.page_size,
        op.page_stride_rows,
        op.head_dim,
        op.quantization_granularity,
        op.rope_dim,
    ]
    return tensors, ints, op.quant_format or ""


def unflatten_operand(tensors: list[torch.Tensor | None], ints: list[int], fmt: str) -> RowOperand:
    rows, cache_lengths, lut, row_offsets, scales = tensors
    page_size, page_stride_rows, head_dim, granularity, rope_dim = ints
    scale_dtype = None
    if fmt == "flashmla_model1":
        scale_dtype = torch.float8_e8m0fnu
    elif scales is not None:
        scale_dtype = scales.dtype
    return RowOperand(
        rows,
        cache_lengths,
        lut=lut,
        page_size=page_size,
        page_stride_rows=page_stride_rows,
        row_offsets=row_offsets,
        head_dim=head_dim,
        scales=scales,
        quant_format=fmt or None,
        granularity=granularity,
        scale_dtype=scale_dtype,
        rope_dim=rope_dim,
    )
