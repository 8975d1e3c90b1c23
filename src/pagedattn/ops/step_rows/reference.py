"""`unpack_step_rows` in torch (any device; reads n and w on the host)."""

from __future__ import annotations

import torch

from .layout import KEEP, StagedRows


def unpack_step_rows_reference(
    stage: torch.Tensor,
    layout: StagedRows,
    rows: int,
    cache_lengths: torch.Tensor,
    lookup_table: torch.Tensor,
    input_ids: torch.Tensor,
    positions: torch.Tensor,
    tokens: torch.Tensor,
    meta: torch.Tensor | None,
    pad_cache_length: torch.Tensor,
    pad_lookup_row: torch.Tensor,
    sentinel: int,
) -> None:
    n = int(stage[0])
    if n < 0:
        return
    w = int(stage[1])
    M, C, at = layout.max_rows, layout.cols, layout.rows_at
    real = min(n, rows)
    cache_lengths[:real] = stage[at : at + real].to(torch.int32)
    cache_lengths[real:rows] = pad_cache_length
    ids = stage[at + M : at + M + real]
    fed = (ids < 0) & (ids != KEEP)
    src = torch.where(fed, -1 - ids, 0)
    taken = tokens[src] if real else ids
    input_ids[:real] = torch.where(ids == KEEP, input_ids[:real], torch.where(fed, taken, ids))
    input_ids[real:rows] = 0
    positions[:real] = stage[at + 2 * M : at + 2 * M + real]
    positions[real:rows] = 0
    lut = torch.full((real, C), sentinel, dtype=torch.int64, device=stage.device)
    if real:
        lut[:, :w] = stage[layout.lut_at : layout.lut_at + real * w].view(real, w)
    lookup_table[:real] = lut.to(torch.int32)
    lookup_table[real:rows] = pad_lookup_row
    if meta is not None and rows > 0:
        meta.copy_(stage[layout.meta_at : layout.meta_at + layout.meta])
