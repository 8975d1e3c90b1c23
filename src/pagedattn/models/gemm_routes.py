"""Which cuBLAS path each bias-free linear takes, chosen per (weight shape, row count) by timing
both at start-up.

A bias-free `Linear` runs `F.linear` (cuBLAS's GEMM, its heuristic's kernel) or
`torch.addmm` with a zero bias (cuBLASLt's bias epilogue, another kernel list). Neither wins
everywhere, and the winner jumps with the row count M: on an H200 (2026-12-01,
`bench/results/h200_2026-12-01_cublas_lt_by_m.txt`, cuBLASLt against F.linear) the
Llama-3-8B down projection 4096 x 14336 was 8% faster at M = 64 and 11% at 96 but 5% slower at
128; its o projection 20% faster at 96 and level at 64; Qwen2.5-7B's down projection 42% slower
at 192; every Llama-3.2-1B shape within 3%. No rule by shape holds across M, so the engine
measures the model's own shapes at the row counts its decode graphs are captured at
(`measure_gemm_routes`) and routes the rows where cuBLASLt is faster by `LT_MARGIN`
(`apply_gemm_routes`).

Each shape is timed on the model's own weights of that shape, one after the other in a CUDA
graph (as a decode step streams them from memory: one weight repeated would sit in L2), both
paths' graphs replayed alternately and each kept at its fastest replay.

The choice is frozen into the modules (`Linear.lt_rows`) before any graph is captured, and
eager calls of the same row count take the same path, so a replay and an eager call of one
step round alike. A process measures each (shape, row count) once (`_MEASURED`): its later
engines route alike, eager ones included. Two processes may choose differently where the two
paths time within noise of the margin (their results then differ in rounding, as on two GPUs
of one kind with different cuBLAS heuristics).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

#: cuBLASLt is taken where its time is below this fraction of F.linear's: a step's GEMM time
#: varies ~1-2% between replays of one graph, and the by-M table above shows wins of 5-20%
LT_MARGIN = 0.97

ShapeKey = tuple[int, int, torch.dtype]  # (out features, in features, dtype)

#: What each measurement found, by (device index, out, in, dtype, rows, weights of the shape):
#: a cache of measured facts, so that every engine of a process routes a shape alike (two
#: engines of one model in one process give the same bits, replays and eager steps alike)
_MEASURED: dict[tuple, bool] = {}


def routable_linears(model: nn.Module) -> dict[ShapeKey, list[nn.Module]]:
    """The model's bias-free 2-D linears (`layers.Linear` and its tensor-parallel shards) on
    CUDA, grouped by (out features, in features, dtype)."""
    from .layers import Linear

    groups: dict[ShapeKey, list[nn.Module]] = {}
    for m in model.modules():
        w = getattr(m, "weight", None)
        if (
            isinstance(m, Linear)
            and m.bias is None
            and w is not None
            and w.dim() == 2
            and w.device.type == "cuda"
            and w.dtype in (torch.bfloat16, torch.float16)
        ):
            groups.setdefault((w.shape[0], w.shape[1], w.dtype), []).append(m)
    return groups


def _replay_ms(g: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        start.record()
        g.replay()
        end.record()
    end.synchronize()
    return start.elapsed_time(end)


def _capture(fn, stream: torch.cuda.Stream) -> torch.cuda.CUDAGraph:
    with torch.cuda.stream(stream):
        fn()  # cuBLAS's handles and workspaces before the capture
    stream.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        fn()
    return g


def _lt_wins(ws, zero, x, stream, margin: float, repeats: int, times=None) -> bool:
    """Whether x @ w.T over every weight of `ws` runs faster through cuBLASLt's bias epilogue
    than through F.linear by `margin` (graph replays, fastest of `repeats` each); both ms into
    `times` ({"linear": ..., "lt": ...}) where given."""

    def plain():
        for w in ws:
            torch.nn.functional.linear(x, w)

    def lt():
        for w in ws:
            torch.addmm(zero, x, w.t())

    ga, gb = _capture(plain, stream), _capture(lt, stream)
    ta = tb = float("inf")
    for _ in range(repeats):
        ta = min(ta, _replay_ms(ga, stream))
        tb = min(tb, _replay_ms(gb, stream))
    if times is not None:
        times.update(linear=ta, lt=tb)
    return tb < margin * ta


@torch.inference_mode()
def measure_gemm_routes(
    model: nn.Module,
    rows: Iterable[int],
    *,
    margin: float = LT_MARGIN,
    repeats: int = 3,
    times: dict | None = None,
) -> dict[ShapeKey, frozenset[int]]:
    """{shape: the row counts of `rows` at which cuBLASLt's bias epilogue beat F.linear by
    `margin`} for each shape of `routable_linears(model)` (an empty dict where it has none).
    Times, per shape and row count, a CUDA graph of one call per weight of that shape (random
    bf16/fp16 rows), `repeats` alternating replays of each path (the fastest kept). Runs on a
    side stream of the weights' device; takes ~1-3 s for an 8B model at 20 row counts.
    `times` (probes): filled with {(out, in, rows): {"linear": ms, "lt": ms}} of the graphs
    over the shape's weights, for what this call measured (not what the process had)."""
    groups = routable_linears(model)
    out: dict[ShapeKey, frozenset[int]] = {}
    if not groups:
        return out
    dev = next(iter(groups.values()))[0].weight.device
    rows = sorted({int(r) for r in rows if int(r) >= 1})
    with torch.cuda.device(dev):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # the inputs made on the stream that reads them
            for (n, k, dtype), mods in groups.items():
                ws = [m.weight for m in mods]
                zero = torch.zeros(n, dtype=dtype, device=dev)
                won = set()
                for m in rows:
                    key = (dev.index, n, k, dtype, m, len(ws))
                    if key not in _MEASURED:
                        x = torch.randn(m, k, dtype=dtype, device=dev)
                        t = None if times is None else times.setdefault((n, k, m), {})
                        _MEASURED[key] = _lt_wins(ws, zero, x, stream, margin, repeats, t)
                    if _MEASURED[key]:
                        won.add(m)
                out[(n, k, dtype)] = frozenset(won)
        torch.cuda.current_stream().wait_stream(stream)
    return out


def apply_gemm_routes(model: nn.Module, routes: dict[ShapeKey, frozenset[int]]) -> int:
    """Set each routable linear's `lt_rows` (and its zero bias) from `routes`; the number of
    linears that route at least one row count."""
    routed = 0
    for key, mods in routable_linears(model).items():
        rows = routes.get(key, frozenset())
        for m in mods:
            m.set_lt_rows(rows)
        routed += len(mods) if rows else 0
    return routed


def describe_routes(routes: dict[ShapeKey, frozenset[int]]) -> dict[str, list[int]]:
    """{"N x K": sorted row counts routed to cuBLASLt} (for records and logs)."""
    return {f"{n} x {k}": sorted(r) for (n, k, _), r in routes.items()}


__all__ = [
    "LT_MARGIN",
    "apply_gemm_routes",
    "describe_routes",
    "measure_gemm_routes",
    "routable_linears",
]
