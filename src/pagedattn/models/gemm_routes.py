"""Which kernel each bias-free linear runs, chosen per (weight shape, row count) by timing the
candidates at start-up.

A bias-free `Linear` runs one of three paths (`gemm_paths.PATHS`):
- "linear": `F.linear` (cuBLAS's GEMM, its heuristic's kernel; the default everywhere);
- "lt": `torch.addmm` with a zero bias (cuBLASLt's bias epilogue, another kernel list);
- "small_m": `ops.linear.linear_small_m_triton` (at most 64 rows, CUDA sm_90+ with
  programmatic dependent launch on): a link of the decode step's PDL chain whose CTAs start
  under the kernel before it and prefetch their weight rows into L2 before they wait.

Neither cuBLAS path wins everywhere, and the winner jumps with the row count M: on an H200
(2026-12-01, `bench/results/h200_2026-12-01_cublas_lt_by_m.txt`, cuBLASLt against F.linear)
the Llama-3-8B down projection 4096 x 14336 was 8% faster at M = 64 and 11% at 96 but 5% slower
at 128; its o projection 20% faster at 96 and level at 64; Qwen2.5-7B's down projection 42%
slower at 192; every Llama-3.2-1B shape within 3%. No rule by shape holds across M, so the
engine measures the model's own shapes at the row counts its decode graphs are captured at
(`measure_gemm_routes`) and routes each to the fastest path, F.linear unless another beats it
by `MARGIN` (`apply_gemm_routes`).

Each shape is timed on the model's own weights of that shape, one after the other in a CUDA
graph (as a decode step streams them from memory: one weight repeated would sit in L2), the
paths' graphs replayed alternately and each kept at its fastest replay. (A "small_m" chain of
one shape overlaps each launch with the one before it as the decode step's chain does, with
other kernels before it there.)

The choice is frozen into the modules (`Linear.gemm_paths`) before any graph is captured, and
eager calls of the same row count take the same path, so a replay and an eager call of one
step round alike. A process measures each (shape, row count) once (`_MEASURED`): its later
engines route alike, eager ones included. Two processes may choose differently where two
paths time within noise of the margin (their results then differ in rounding, as on two GPUs
of one kind with different cuBLAS heuristics).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from .gemm_paths import PATHS, candidate_paths, run_path
from .layers import Linear

#: another path is taken where its time is below this fraction of F.linear's: a step's GEMM
#: time varies ~1-2% between replays of one graph, and the by-M table above shows wins of 5-20%
MARGIN = 0.97

ShapeKey = tuple[int, int, torch.dtype]  # (out features, in features, dtype)
Routes = dict[ShapeKey, dict[int, str]]  # {shape: {rows: path other than "linear"}}

#: What each measurement found, by (device index, out, in, dtype, rows, weights of the shape,
#: the candidate paths): a cache of measured facts, so that every engine of a process routes
#: a shape alike (two engines of one model in one process give the same bits, replays and
#: eager steps alike)
_MEASURED: dict[tuple, str] = {}


def routable_linears(model: nn.Module) -> dict[ShapeKey, list[nn.Module]]:
    """The model's bias-free 2-D linears (`layers.Linear` and its tensor-parallel shards) on
    CUDA, grouped by (out features, in features, dtype)."""
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
        fn()  # cuBLAS's handles and workspaces, Triton's compile, before the capture
    stream.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=stream):
        fn()
    return g


def _fastest(ws, zero, x, paths, stream, margin: float, repeats: int, times=None) -> str:
    """The path of `paths` whose graph of x @ w.T over every weight of `ws` replays fastest
    ("linear" unless another beats it by `margin`; fastest of `repeats` replays each); each
    path's ms into `times` where given."""

    def chain(path):
        def run():
            for w in ws:
                run_path(path, x, w, zero)

        return run

    graphs = {p: _capture(chain(p), stream) for p in paths}
    best = dict.fromkeys(paths, float("inf"))
    for _ in range(repeats):
        for p, g in graphs.items():
            best[p] = min(best[p], _replay_ms(g, stream))
    del graphs
    if times is not None:
        times.update(best)
    win = min(paths, key=best.__getitem__)
    return win if best[win] < margin * best["linear"] else "linear"


@torch.inference_mode()
def measure_gemm_routes(
    model: nn.Module,
    rows: Iterable[int],
    *,
    margin: float = MARGIN,
    repeats: int = 3,
    times: dict | None = None,
) -> Routes:
    """{shape: {row count: path}} for each shape of `routable_linears(model)` and each row count
    of `rows` at which a path other than F.linear won (`_fastest`; an empty dict where the
    model has no such linear). Runs on a side stream of the weights' device; an 8B model's five
    shapes at 20 row counts take a few seconds. `times` (probes): filled with {(out, in, rows):
    {path: ms of the graph over the shape's weights}} for what this call measured (a
    measurement the process made before is not repeated)."""
    groups = routable_linears(model)
    out: Routes = {}
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
                won = {}
                for m in rows:
                    paths = candidate_paths(ws[0], m)
                    key = (dev.index, n, k, dtype, m, len(ws), paths)
                    if key not in _MEASURED:
                        x = torch.randn(m, k, dtype=dtype, device=dev)
                        t = None if times is None else times.setdefault((n, k, m), {})
                        _MEASURED[key] = _fastest(ws, zero, x, paths, stream, margin, repeats, t)
                    if _MEASURED[key] != "linear":
                        won[m] = _MEASURED[key]
                out[(n, k, dtype)] = won
        torch.cuda.current_stream().wait_stream(stream)
    return out


def apply_gemm_routes(model: nn.Module, routes: Routes) -> int:
    """Set each routable linear's `gemm_paths` from `routes`; the number of linears that
    route at least one row count away from F.linear."""
    routed = 0
    for key, mods in routable_linears(model).items():
        paths = routes.get(key, {})
        for m in mods:
            m.set_gemm_paths(paths)
        routed += len(mods) if paths else 0
    return routed


def describe_routes(routes: Routes) -> dict[str, dict[str, list[int]]]:
    """{"N x K": {path: sorted row counts}} (for records and logs)."""
    out: dict[str, dict[str, list[int]]] = {}
    for (n, k, _), paths in routes.items():
        by = out.setdefault(f"{n} x {k}", {})
        for m, p in sorted(paths.items()):
            by.setdefault(p, []).append(m)
    return out


__all__ = [
    "MARGIN",
    "PATHS",
    "Routes",
    "apply_gemm_routes",
    "candidate_paths",
    "describe_routes",
    "measure_gemm_routes",
    "routable_linears",
]
