"""`unpack_step_rows`: a decode step's staged rows into the static buffers of a captured graph.

A captured decode graph reads fixed buffers. Copying a step's device arrays into them took
the engine ~6 device copies a step outside the graph, each a host call and an idle gap on the
device (H200, Llama-3.2-1B b64: 70-80 us of a 1.6 ms step idle between the step's ops outside
its graph, `dev/profile_engine_step.py`). Instead the engine packs the step's host arrays into
one int64 staging buffer (`StagedRows` layout), moves them with one host-to-device copy, and
the graph's first kernel, this op, writes the buffers from it:

    unpack_step_rows(stage, layout, rows, cache_lengths, lookup_table, input_ids, positions,
                     tokens, meta, pad_cache_length, pad_lookup_row, sentinel, *, backend=None)

- stage: int64 [>= layout.size], contiguous; n = stage[0] the step's rows (negative: nothing
  is written, the buffers keep what another path loaded), w = stage[1] the staged lookup
  width (0 <= w <= layout.cols, and n <= layout.max_rows);
- rows: the rows written, [0, rows) (a graph's bucket, >= n); row r < n from the stage, row
  n <= r < rows a pad row: `pad_cache_length`, `pad_lookup_row`, token 0, position 0;
- cache_lengths int32 [>= rows]; lookup_table int32 [>= rows, layout.cols] (unit column
  stride): a real row's columns >= w take `sentinel` (the cache's page count); input_ids /
  positions int64 [>= rows]: a staged id `KEEP` leaves the row's id as it is (a token written
  on the device before: the engine's feed of the previous step's samples), another negative
  id -1 - j takes tokens[j];
- tokens: int64 [>= 1] (the previous step's samples, where the graph computed them);
- meta: int64 [layout.meta] (the metadata words, written when rows > 0), or None where
  layout.meta is 0; pad_cache_length: int32, one element; pad_lookup_row: int32
  [layout.cols].

Every tensor on stage's device. The Triton kernel (CUDA; one program a row, no host read, so
it can be captured) and the reference (torch; reads n and w on the host) write the same
values. Bad arguments raise InvalidArgumentError naming the argument, before anything is
written.
"""

from __future__ import annotations

import torch
import triton

from ...errors import InvalidArgumentError, check_int
from .._checks import describe
from ..dispatch import choose_backend
from ..launch import launch
from .layout import HEADER, KEEP, StagedRows
from .reference import unpack_step_rows_reference


def _bad(name: str, expected: str, got: object) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name}: expected {expected}, got {describe(got)}")


def _vector(name, t, dtype, n, device, exact=False) -> None:
    ok = (
        isinstance(t, torch.Tensor)
        and t.dtype == dtype
        and t.dim() == 1
        and (t.shape[0] == n if exact else t.shape[0] >= n)
        and t.device == device
        and t.stride(0) == 1
    )
    if not ok:
        size = f"[{n}]" if exact else f"[>= {n}]"
        raise _bad(name, f"a contiguous {dtype} tensor {size} on {device}", t)


def _check(stage, layout, rows, cl, lut, ids, pos, tokens, meta, pad_cl, pad_row, sentinel) -> int:
    if not isinstance(layout, StagedRows):
        raise _bad("layout", "a StagedRows", layout)
    if not isinstance(stage, torch.Tensor):
        raise _bad("stage", "an int64 tensor", stage)
    dev = stage.device
    _vector("stage", stage, torch.int64, layout.size, dev)
    M, C = layout.max_rows, layout.cols
    rows = check_int("rows", rows, 0, M)
    _vector("cache_lengths", cl, torch.int32, rows, dev)
    if not (
        isinstance(lut, torch.Tensor)
        and lut.dtype == torch.int32
        and lut.dim() == 2
        and lut.shape[0] >= rows
        and lut.shape[1] == C
        and lut.device == dev
        and lut.stride(1) == 1
    ):
        want = f"an int32 tensor [>= {rows}, {C}] on {dev}, unit column stride"
        raise _bad("lookup_table", want, lut)
    _vector("input_ids", ids, torch.int64, rows, dev)
    _vector("positions", pos, torch.int64, rows, dev)
    _vector("tokens", tokens, torch.int64, 1, dev)
    if layout.meta:
        _vector("meta", meta, torch.int64, layout.meta, dev, exact=True)
    elif meta is not None:
        raise _bad("meta", "None (layout.meta is 0)", meta)
    if not (
        isinstance(pad_cl, torch.Tensor)
        and pad_cl.dtype == torch.int32
        and pad_cl.numel() == 1
        and pad_cl.device == dev
    ):
        raise _bad("pad_cache_length", f"an int32 tensor of one element on {dev}", pad_cl)
    _vector("pad_lookup_row", pad_row, torch.int32, C, dev, exact=True)
    check_int("sentinel", sentinel, 0)
    return rows


def unpack_step_rows(
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
    *,
    backend: str | None = None,
) -> None:
    """Module docstring."""
    args = (stage, layout, rows, cache_lengths, lookup_table, input_ids, positions, tokens, meta,
            pad_cache_length, pad_lookup_row, sentinel)  # fmt: skip
    rows = _check(*args)
    if choose_backend(stage.device, backend) == "reference":
        unpack_step_rows_reference(*args)
        return
    if rows == 0:
        return
    from .triton_unpack import _unpack_step_rows_kernel  # noqa: PLC0415

    C = layout.cols
    launch(
        _unpack_step_rows_kernel, (rows,),
        stage, cache_lengths, lookup_table, lookup_table.stride(0), input_ids, positions, tokens,
        meta if meta is not None else stage, pad_cache_length, pad_lookup_row, int(sentinel),
        M=layout.max_rows, C=C, K=layout.meta, HEADER=HEADER, KEEP=KEEP,
        BLOCK_C=min(1024, triton.next_power_of_2(C)),
        BLOCK_K=max(16, triton.next_power_of_2(max(layout.meta, 1))), num_warps=1,
    )  # fmt: skip


__all__ = ["HEADER", "KEEP", "StagedRows", "unpack_step_rows", "unpack_step_rows_reference"]
