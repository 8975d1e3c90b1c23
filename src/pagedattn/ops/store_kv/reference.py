"""Reference store_kv / gather_kv: plain torch, any device."""

from __future__ import annotations

import torch

from ...errors import check
from ...fp8 import mla_formats, quantize_blockwise, quantize_per_tensor
from ...fp8.mla_formats import PACKED_FORMATS, V32_BYTES
from ...operands import RowOperand, check_row_ids, model1_page_views


def token_batch_and_pos(
    q_row_offsets: torch.Tensor, cache_lengths: torch.Tensor, total: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each of `total` ragged tokens: its request b and absolute position cache_len[b] + i.
    No host sync."""
    t = torch.arange(total, device=q_row_offsets.device)
    b = torch.searchsorted(q_row_offsets[1:].long(), t, right=True)
    pos = cache_lengths.long()[b] + t - q_row_offsets.long()[b]
    return b, pos


def write_rows(op: RowOperand, rows: torch.Tensor, x: torch.Tensor) -> None:
    """Quantize x [N, heads, head_dim] in the operand's format and write it at `rows`."""
    f = op.quant_format
    if f is None:
        op.rows[rows] = x.to(op.rows.dtype)
    elif f == "blockwise":
        q, s = quantize_blockwise(x, op.quantization_granularity, op.scale_dtype)
        op.rows[rows] = q
        if s.dtype == torch.float8_e8m0fnu:  # torch has no index_put for e8m0: write bytes
            op.scales.view(torch.uint8)[rows] = s.view(torch.uint8)
        else:
            op.scales[rows] = s
    elif f == "per_tensor":
        op.rows[rows] = quantize_per_tensor(x, op.scales)
    else:
        store_rows(op, rows, x)


def store_rows(op: RowOperand, rows: torch.Tensor, x: torch.Tensor) -> None:
    """Quantize x [N, 1, d_qk] in the operand's packed MLA format and write it at physical
    `rows` [N] (see `operands.load_model1_rows` for the addressing).

    mla_rope_aware: row bytes into op.rows, the float32 token scale into op.scales.
    flashmla_v32: 656-byte rows into op.rows. flashmla_model1: data and trailer bytes of
    each token's page. Only the written tokens' bytes change. No host synchronisation.
    """
    f = op.quant_format
    check(f in PACKED_FORMATS, "op.quant_format", f"one of {PACKED_FORMATS}", f)
    mla_formats.check_float_input(x, "x", op.head_dim)
    check(x.ndim == 3 and x.shape[1] == 1, "x", f"a [N, 1, {op.head_dim}] tensor", x.shape)
    rows = check_row_ids(rows, x.shape[0])
    if f == "mla_rope_aware":
        raw, s = mla_formats.pack_rope_aware(x, op.rope_dim)
        check(
            tuple(op.rows.shape[1:]) == tuple(raw.shape[1:]) and op.rows.dtype == torch.uint8,
            "op.rows",
            f"uint8 rows of shape [*, {', '.join(map(str, raw.shape[1:]))}]",
            f"{tuple(op.rows.shape)} {op.rows.dtype}",
        )
        check(
            op.scales is not None and op.scales.dtype == torch.float32,
            "op.scales",
            "a float32 [rows, 1, 1] scale view",
            None if op.scales is None else op.scales.dtype,
        )
        op.rows[rows] = raw
        op.scales[rows] = s
    elif f == "flashmla_v32":
        check(
            tuple(op.rows.shape[1:]) == (1, V32_BYTES) and op.rows.dtype == torch.uint8,
            "op.rows",
            f"uint8 rows of shape [*, 1, {V32_BYTES}]",
            f"{tuple(op.rows.shape)} {op.rows.dtype}",
        )
        op.rows[rows] = mla_formats.pack_v32(x)
    else:
        data_view, trailer_view, st = model1_page_views(op)
        data, scale_bytes = mla_formats.pack_model1_tokens(x)
        page, off = rows // st, rows % st
        data_view[page, off] = data
        trailer_view[page, off] = scale_bytes


def store_kv_reference(
    k_new: torch.Tensor,
    v_new: torch.Tensor | None,
    k_cache: RowOperand,
    v_cache: RowOperand | None,
    q_row_offsets: torch.Tensor,
) -> None:
    """Write token i of request b at position cache_length(b) + i of each operand."""
    b, pos = token_batch_and_pos(q_row_offsets, k_cache.cache_lengths, k_new.shape[0])
    rows = k_cache.physical_rows(b, pos)
    write_rows(k_cache, rows, k_new)
    if v_new is not None:
        write_rows(v_cache, v_cache.physical_rows(b, pos), v_new)
