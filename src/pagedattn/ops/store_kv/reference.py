"""Reference store_kv / gather_kv: plain torch, any device."""

from __future__ import annotations

import torch

from ...fp8 import quantize_blockwise, quantize_per_tensor
from ...operands import RowOperand


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
        from ...fp8 import mla_formats

        mla_formats.store_rows(op, rows, x)


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
