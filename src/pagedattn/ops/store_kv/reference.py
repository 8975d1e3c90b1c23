"""Reference store_kv / gather_kv: plain torch, any device, no host synchronisation.

Which rows a call writes (the Triton kernel follows the same rules, so both backends agree
on every input, valid or not): token t of k_new belongs to request b, where b = t when
q_row_offsets[t] == t and q_row_offsets[t + 1] == t + 1 (the one-token-a-request fast path),
else b = the number of requests whose end q_row_offsets[b + 1] is <= t. The token is written
only when

- b < batch and q_row_offsets[b] <= t < q_row_offsets[b + 1] (tokens outside every request's
  range are skipped),
- its position pos = cache_lengths[b] + (t - q_row_offsets[b]) is >= 0, and
- paged operands: pos < lookup_table.shape[1] * page_size (the table's reach) and the page id
  lookup_table[b, pos // page_size] is in [0, num_pages); non-paged operands: its row
  row_offsets[b] + pos is in [0, num_kv_rows).

A skipped token changes no byte of the cache or of its scales. For valid inputs (what
`store_kv` checks on the host when the index tensors are on the CPU) no token is skipped.
"""

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
    No host sync. Assumes valid offsets (see `token_targets` for the checked form)."""
    t = torch.arange(total, device=q_row_offsets.device)
    b = torch.searchsorted(q_row_offsets[1:].long(), t, right=True)
    pos = cache_lengths.long()[b] + t - q_row_offsets.long()[b]
    return b, pos


def token_requests(
    q_row_offsets: torch.Tensor, cache_lengths: torch.Tensor, total: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(b, pos, ok) of each of `total` ragged tokens, for any offsets (see the module
    docstring): b [total] int64 clamped to [0, batch), pos [total] int64, ok [total] bool
    (the token lies in request b's range). No host sync."""
    dev = q_row_offsets.device
    offs = q_row_offsets.long()
    batch = offs.shape[0] - 1
    t = torch.arange(total, device=dev)
    if batch <= 0 or total == 0:
        zero = torch.zeros(total, dtype=torch.long, device=dev)
        return zero, zero, torch.zeros(total, dtype=torch.bool, device=dev)
    ends = offs[1:]
    # find_request's count of the requests that end at or before t (ends may be unsorted).
    b = torch.searchsorted(torch.sort(ends).values, t, right=True)
    tc = t.clamp(max=batch - 1)
    fast = (t < batch) & (offs[tc] == t) & (offs[tc + 1] == t + 1)
    b = torch.where(fast, t, b)
    lo = offs[b]  # b <= batch: in range
    hi = torch.where(b < batch, offs[(b + 1).clamp(max=batch)], -1)
    ok = (lo <= t) & (t < hi)
    b = b.clamp(max=batch - 1)
    pos = cache_lengths.long()[b] + (t - lo)
    return b, pos, ok


def target_rows(
    op: RowOperand, b: torch.Tensor, pos: torch.Tensor, ok: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(rows, ok): the physical rows of (request, position) pairs and `ok` narrowed to the
    pairs inside the operand (module docstring). rows of skipped pairs are meaningless."""
    ok = ok & (pos >= 0)
    if op.page_size:
        reach = op.lut.shape[1] * op.page_size
        ok &= pos < reach
        if reach == 0:
            return torch.zeros_like(pos), ok
        safe = torch.where(ok, pos, 0)
        page = op.lut.long()[b, safe // op.page_size]
        ok &= (page >= 0) & (page < op.num_sparse_slots() // op.page_size)
        return page * op.page_stride_rows + safe % op.page_size, ok
    row = op.row_offsets.long()[b] + pos
    ok &= (row >= 0) & (row < op.num_kv_rows())
    return row, ok


def token_targets(
    op: RowOperand, q_row_offsets: torch.Tensor, total: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(b, pos, rows, ok) of `total` ragged new tokens written through `op`."""
    b, pos, ok = token_requests(q_row_offsets, op.cache_lengths, total)
    rows, ok = target_rows(op, b, pos, ok)
    return b, pos, rows, ok


def _bytes(x: torch.Tensor) -> torch.Tensor:
    return x if x.dtype == torch.uint8 else x.view(torch.uint8)


def masked_put(
    dst: torch.Tensor,
    index: tuple[torch.Tensor, ...],
    vals: torch.Tensor,
    ok: torch.Tensor | None,
) -> None:
    """dst[index] = vals for the entries where `ok` holds, without a host sync: a skipped
    entry repeats the first kept entry's write (same place, same bytes), or, when none is
    kept, writes dst's first element back in place. Bytes are copied exactly (NaN payloads,
    e8m0 scales). dst and vals: same dtype; index: one [N] int64 tensor per leading dim."""
    d8, v8 = _bytes(dst), _bytes(vals.contiguous())
    n = v8.shape[0]
    if n == 0 or d8.numel() == 0:
        return
    if ok is None:
        d8[index] = v8
        return
    j = ok.to(torch.uint8).argmax().view(1)  # the first kept entry (0 when none is)
    any_ok = ok.any()
    origin = (0,) * len(index)
    fb_index = tuple(torch.where(any_ok, i[j], 0) for i in index)
    fb_vals = torch.where(any_ok, v8[j], d8[origin])
    sel = ok.view(n, *([1] * (v8.ndim - 1)))
    d8[tuple(torch.where(ok, i, f) for i, f in zip(index, fb_index))] = torch.where(
        sel, v8, fb_vals
    )


def write_rows(
    op: RowOperand, rows: torch.Tensor, x: torch.Tensor, ok: torch.Tensor | None = None
) -> None:
    """Quantize x [N, heads, head_dim] in the operand's format and write it at `rows`
    (only where `ok` holds, when given; skipped rows may hold any value)."""
    f = op.quant_format
    if f is None:
        masked_put(op.rows, (rows,), x.to(op.rows.dtype), ok)
    elif f == "blockwise":
        q, s = quantize_blockwise(x, op.quantization_granularity, op.scale_dtype)
        masked_put(op.rows, (rows,), q, ok)
        masked_put(op.scales, (rows,), s, ok)
    elif f == "per_tensor":
        masked_put(op.rows, (rows,), quantize_per_tensor(x, op.scales), ok)
    else:
        store_rows(op, rows, x, ok)


def store_rows(
    op: RowOperand, rows: torch.Tensor, x: torch.Tensor, ok: torch.Tensor | None = None
) -> None:
    """Quantize x [N, 1, d_qk] in the operand's packed MLA format and write it at physical
    `rows` [N] (see `operands.load_model1_rows` for the addressing); only where `ok` holds,
    when given.

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
        masked_put(op.rows, (rows,), raw, ok)
        masked_put(op.scales, (rows,), s, ok)
    elif f == "flashmla_v32":
        check(
            tuple(op.rows.shape[1:]) == (1, V32_BYTES) and op.rows.dtype == torch.uint8,
            "op.rows",
            f"uint8 rows of shape [*, 1, {V32_BYTES}]",
            f"{tuple(op.rows.shape)} {op.rows.dtype}",
        )
        masked_put(op.rows, (rows,), mla_formats.pack_v32(x), ok)
    else:
        data_view, trailer_view, st = model1_page_views(op)
        data, scale_bytes = mla_formats.pack_model1_tokens(x)
        page, off = rows // st, rows % st
        masked_put(data_view, (page, off), data, ok)
        masked_put(trailer_view, (page, off), scale_bytes, ok)


def store_kv_reference(
    k_new: torch.Tensor,
    v_new: torch.Tensor | None,
    k_cache: RowOperand,
    v_cache: RowOperand | None,
    q_row_offsets: torch.Tensor,
    *,
    checked: bool = False,
) -> None:
    """Write token i of request b at position cache_length(b) + i of each operand, skipping
    the tokens the module docstring's rules exclude (no host sync).

    checked: the index values were validated on the host (`store_kv`'s CPU path), so no
    token is skipped and the per-token masks are left out (the same bytes, fewer ops).
    """
    if checked:
        b, pos = token_batch_and_pos(q_row_offsets, k_cache.cache_lengths, k_new.shape[0])
        write_rows(k_cache, k_cache.physical_rows(b, pos), k_new)
        if v_new is not None:
            write_rows(v_cache, v_cache.physical_rows(b, pos), v_new)
        return
    b, pos, ok = token_requests(q_row_offsets, k_cache.cache_lengths, k_new.shape[0])
    rows, k_ok = target_rows(k_cache, b, pos, ok)
    write_rows(k_cache, rows, k_new, k_ok)
    if v_new is not None:
        v_rows, v_ok = target_rows(v_cache, b, pos, ok)
        write_rows(v_cache, v_rows, v_new, v_ok)
