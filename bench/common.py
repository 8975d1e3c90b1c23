"""Shared benchmark machinery: timing, ceilings measured in the same run, peers, records.

- `time_ms`: the faster of eager calls and CUDA-graph replays of one call (both kept in the
  record's extra, with the SM clock and the board's power where NVML can tell: an H200 at its
  700 W limit lowers the clock, `dev/mla_power_probe.py`), rounds of the two alternating, each
  the lowest of 2 medians of CUDA-event timings with L2 cold before
  every call (`_bench`): on the H100 (2026-11-21) one config in a run of ~20 sometimes ran
  1.3-3x slow for a whole 100 ms window (a different one each run), which one median does
  not reject.
- `copy_bandwidth`: a 2 GiB device-to-device copy, bytes read + written over time (eager).
- `matmul_tflops`: an 8192^3 bf16 matmul on random data (eager).
- `flashinfer`: the FlashInfer module when its wheels are importable, else None.
Never time on zeros: every input is fresh random data.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import re
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from datetime import date

import torch


@dataclass
class Record:
    suite: str
    config: str
    impl: str
    ms: float
    bytes: float = 0.0
    flops: float = 0.0
    extra: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        if isinstance(self.ms, Ms):  # keep both timings
            g = self.ms.graph
            self.extra = dict(
                self.extra,
                ms_eager=round(self.ms.eager, 5),
                ms_graph=round(g, 5) if g is not None else None,
                timing=self.ms.how,
                sm_mhz=self.ms.mhz,
                watts=self.ms.watts,
            )
        self.ms = float(self.ms)

    @property
    def gbps(self) -> float:
        return self.bytes / self.ms / 1e6 if self.ms else 0.0

    @property
    def tflops(self) -> float:
        return self.flops / self.ms / 1e9 if self.ms else 0.0


class Ms(float):
    """A time in ms, the faster of an eager and a CUDA-graph timing of the same call
    (`eager`, `graph`; `how` names the one taken)."""

    eager: float
    graph: float | None
    how: str
    mhz: list[int] | None  # SM clock after each pair of rounds (NVML), if known
    watts: list[float] | None  # board power after each pair of rounds (NVML), if known


_FLUSH: dict = {}


def cold_l2() -> None:
    """Evict L2 (50 MB on the H100) by reading 256 MB: the lines left are clean, so the timed
    call pays no write-back of the flush's own data (triton's do_bench zeroes its buffer,
    and the ~50 MB of dirty lines then cost a short memory-bound call ~4%: H100 2026-11-22,
    MLA bf16 h_q 16 s_k 4096, 0.2175 ms against 0.209 without a flush)."""
    if "buf" not in _FLUSH:
        _FLUSH["buf"] = torch.ones(64 * 2**20, device="cuda")
        _FLUSH["out"] = torch.empty((), device="cuda")
    torch.sum(_FLUSH["buf"], dim=0, out=_FLUSH["out"])


def _bench(fn, warmup: int, rep: int, repeats: int) -> float:
    """The lowest of `repeats` medians of CUDA-event timings of `fn` (L2 cold before each
    call): ~`warmup` ms of untimed calls, then ~`rep` ms of timed ones."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        cold_l2()
        fn()
    end.record()
    torch.cuda.synchronize()
    est = max(start.elapsed_time(end) / 5, 1e-3)
    n_warm, n_rep = max(1, int(warmup / est)), max(5, int(rep / est))
    best = float("inf")
    for _ in range(repeats):
        for _ in range(n_warm):
            fn()
        best = min(best, statistics.median(call_times(fn, n_rep)))
    return best


def call_times(fn, n: int, flush: bool = True) -> list[float]:
    """CUDA-event time (ms) of each of n calls of `fn`, L2 evicted before each (`cold_l2`)
    unless not flush."""
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
          for _ in range(n)]  # fmt: skip
    for s, e in ev:
        if flush:
            cold_l2()
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) for s, e in ev]


def sm_clock_mhz() -> int | None:
    """The SM clock now (MHz, NVML through torch), None where NVML is not installed."""
    try:
        return int(torch.cuda.clock_rate())
    except Exception:  # noqa: BLE001 - pynvml missing or no NVML: the record goes without
        return None


def board_watts() -> float | None:
    """The board's power draw now (W, NVML through torch), None where NVML cannot tell."""
    try:
        return round(torch.cuda.power_draw() / 1000, 1)
    except Exception:  # noqa: BLE001 - as sm_clock_mhz
        return None


@functools.cache
def _stream_on(device: int) -> torch.cuda.Stream:
    return torch.cuda.Stream(device)


def _capture_stream() -> torch.cuda.Stream:
    """The current CUDA device's stream that `time_ms` warms up and captures on."""
    return _stream_on(torch.cuda.current_device())


def time_ms(fn, warmup: int = 25, rep: int = 100, repeats: int = 2) -> Ms:
    """Time of `fn` in ms: the faster of eager calls and replays of one call captured in a
    CUDA graph (a call that cannot be captured is timed eagerly only). Replays leave out the
    host's launch cost (Python argument handling, checks), as a serving engine's captured
    decode step does: eager MLA decode calls were bound by it (H100 2026-11-22, rope-aware FP8
    h_q 16 s_k 4096: 0.285 ms eager, 0.150 replayed).

    Eager and graph rounds alternate (eager, graph, eager, ...), each kind keeping its fastest
    round: a compute-bound kernel's time follows the SM clock, which steps down as the GPU
    warms (H100 2026-11-22, `mla_timing_probe.py`, in git at 0a24423:bench/, MLA h_q 128 s_k
    8192, profiler kernel durations of one process: 0.530, 0.520, 0.515, then 0.497 ms in
    steps; the same graph replays 0.497-0.500 in one window and 0.533-0.546 in a later one), so
    timing all eager rounds first made eager look 2-8% faster than graph replays for such
    kernels. The first round still runs cooler than the rest (`mla_timing_probe.py --order`,
    same kernel: 0.495 ms for the process's first round, eager; 0.516-0.536 for every later
    one, either kind, graph 0.522 when it went first), so the eager time of a long
    compute-bound call is its cool-GPU time and the graph time its time under sustained load."""
    # compiles and warms before the capture, on the capture's stream (PyTorch's practice; a
    # stream's first balanced decode call makes its fused-merge counters there, so that the
    # graph reads them instead of filling fresh zeros: `pagedattn.ops.prepared.semaphores`);
    # one stream a device for every timing, so the counters are made once
    side = _capture_stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.synchronize()
    g = None
    try:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=side):
            fn()
        g.replay()
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a peer that cannot be captured keeps eager
        print(f"[bench] graph capture failed ({type(e).__name__}: {str(e)[:120]}): eager time")
        g = None
    eager = graph = float("inf")
    clocks, watts = [], []
    for _ in range(repeats):
        eager = min(eager, _bench(fn, warmup, rep, 1))
        if g is not None:
            graph = min(graph, _bench(g.replay, warmup, rep, 1))
        clocks.append(sm_clock_mhz())
        watts.append(board_watts())
    del g
    ms = Ms(min(eager, graph))
    ms.eager, ms.graph = eager, (graph if graph < float("inf") else None)
    ms.how = "graph" if graph < eager else "eager"
    ms.mhz = [c for c in clocks if c is not None] or None
    ms.watts = [w for w in watts if w is not None] or None
    return ms


def copy_bandwidth(gib: float = 2.0) -> float:
    """GB/s of a device-to-device copy, counting bytes read plus bytes written."""
    n = int(gib * 2**30) // 4
    a = torch.randn(n, device="cuda")
    b = torch.empty_like(a)
    ms = _bench(lambda: b.copy_(a), 25, 100, 3)  # eager: a captured copy runs on a DMA engine
    return 2 * n * 4 / ms / 1e6


def matmul_tflops(n: int = 8192) -> float:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = _bench(lambda: a @ b, 25, 100, 3)
    return 2 * n**3 / ms / 1e9


def flashinfer():
    try:
        import flashinfer as fi  # noqa: PLC0415

        return fi
    except Exception as e:  # missing wheel, CUDA_HOME, JIT failure
        print(f"[bench] FlashInfer unavailable: {type(e).__name__}: {e}")
        return None


def environment(probe_flashinfer: bool = True) -> dict:
    env = {
        "date": str(date.today()),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }
    try:
        import triton

        env["triton"] = triton.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        env.update(device=p.name, sms=p.multi_processor_count)
    fi = flashinfer() if probe_flashinfer else None
    if fi is not None:
        env["flashinfer"] = getattr(fi, "__version__", "?")
    return env


def device_tag(name: str) -> str:
    """A short lower-case device name for file names: "NVIDIA H200" -> "h200", "NVIDIA H100
    80GB HBM3" -> "h100"; "gpu" when no model number shows."""
    m = re.search(r"\b([a-z]{1,2}\d{2,4}[a-z]?)\b", name.lower())
    return m.group(1) if m else "gpu"


def git_commit() -> str:
    """The checkout's short commit, or "nogit" (a copy of the tree without .git)."""
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=here,
                             capture_output=True, text=True, timeout=10)  # fmt: skip
        return out.stdout.strip() or "nogit"
    except Exception:  # noqa: BLE001 - no git binary
        return "nogit"


def default_out(env: dict, suffix: str = "") -> str:
    """bench/results/<device>_<date>_<commit><suffix>.json (bench/results/README.md's names)."""
    name = f"{device_tag(env.get('device', 'gpu'))}_{env.get('date', date.today())}_{git_commit()}"
    return os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "results", name + suffix + ".json"
    )


def fastest_of(rounds: list[list[Record]]) -> list[Record]:
    """Per (suite, config, impl), the record of the fastest round, with every round's time in
    extra["ms_rounds"]; order of first appearance."""
    best: dict[tuple, Record] = {}
    times: dict[tuple, list[float]] = {}
    for records in rounds:
        for r in records:
            key = (r.suite, r.config, r.impl)
            times.setdefault(key, []).append(round(r.ms, 5))
            if key not in best or r.ms < best[key].ms:
                best[key] = r
    out = []
    for key, r in best.items():
        r.extra = dict(r.extra, ms_rounds=times[key]) if len(rounds) > 1 else r.extra
        out.append(r)
    return out


def save(
    path: str, env: dict, ceilings: dict, records: list[Record], meta: dict | None = None
) -> None:
    """Write the records (with GB/s, TFLOP/s and fractions of the ceilings) as JSON; `meta`'s
    keys (a suite's seed, errors, ...) join the top level."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    rows = []
    for r in records:
        d = asdict(r)
        d.update(gbps=round(r.gbps, 1), tflops=round(r.tflops, 1))
        if ceilings.get("copy_gbps") and r.bytes:
            d["frac_copy"] = round(r.gbps / ceilings["copy_gbps"], 3)
        if ceilings.get("mm_tflops") and r.flops:
            d["frac_mm"] = round(r.tflops / ceilings["mm_tflops"], 3)
        rows.append(d)
    with open(path, "w") as f:
        json.dump({"env": env, "ceilings": ceilings, "records": rows, **(meta or {})}, f, indent=1)


def save_and_report(tag: str, out: str, env: dict, ceilings: dict, records: list[Record],
                    meta: dict, plot_fn) -> None:  # fmt: skip
    """Write a suite's records and run metadata to `out`, draw its plot (`plot_fn()`, the
    PNG's path; a missing matplotlib leaves the JSON alone), then print the record's counts
    and its errors, each line tagged `[tag]`."""
    save(out, env, ceilings, records, meta=meta)
    try:
        print(f"[{tag}] plot {plot_fn()}")
    except ImportError as e:  # matplotlib missing: the JSON stands alone
        print(f"[{tag}] no plot: {e}")
    print(f"[{tag}] {out}: {len(records)} records, {len(meta['errors'])} errors, "
          f"{meta['total_seconds']} s")  # fmt: skip
    for line in meta["errors"]:
        print(f"[{tag}] error: {line}")


def ratio_table(records: list[Record], ceilings: dict, ours: str = "pagedattn") -> str:
    """One line per (suite, config): our GPU time (and eager time), fraction of copy BW /
    matmul, ratio to peers (GPU times)."""
    by: dict[tuple, dict[str, Record]] = {}
    for r in records:
        by.setdefault((r.suite, r.config), {})[r.impl] = r
    lines = [
        f"{'suite':<10} {'config':<44} {'ms':>8} {'eager':>8} {'GB/s':>7} {'TF/s':>6} "
        f"{'/copy':>6} {'/mm':>5}  peers (x faster than)"
    ]
    for (suite, cfg), impls in by.items():
        o = impls.get(ours)
        if o is None:
            continue
        fc = o.gbps / ceilings["copy_gbps"] if o.bytes else 0
        fm = o.tflops / ceilings["mm_tflops"] if o.flops else 0
        peers = " ".join(f"{k}={v.ms / o.ms:.2f}" for k, v in impls.items() if k != ours)
        eager = o.extra.get("ms_eager", o.ms)
        lines.append(
            f"{suite:<10} {cfg:<44} {o.ms:>8.4f} {eager:>8.4f} {o.gbps:>7.0f} {o.tflops:>6.0f} "
            f"{fc:>6.2f} {fm:>5.2f}  {peers}"
        )
    return "\n".join(lines)


def roofline_ms(ceilings: dict, nbytes: float, flops: float) -> tuple[float, str]:
    """(ms, "copy" or "mm"): max(bytes / copy bandwidth, FLOPs / bf16 matmul) with the run's
    own ceilings (`copy_gbps`, `mm_tflops`), and which one bounds."""
    t_copy = nbytes / (ceilings["copy_gbps"] * 1e6)
    t_mm = flops / (ceilings["mm_tflops"] * 1e9)
    return (t_copy, "copy") if t_copy >= t_mm else (t_mm, "mm")


def selected(name: str, only: str | None) -> bool:
    """Whether a case named `name` runs under `--only` (None: all; else a comma-separated list
    of parts, one of which the name contains)."""
    return not only or any(part in name for part in only.split(","))


def suite_main(argv, doc: str, name: str, run_and_save, probe_flashinfer: bool = True) -> None:
    """The command line of a suite script (`bench_real.py`, `bench_model.py`): --dry-run (CPU,
    tiny sizes, placeholder ceilings, one thread), --seed, --only, --out; on CUDA the copy and
    matmul ceilings measured first, then `run_and_save(out, env, ceilings, seed, only=...)`."""
    import argparse

    ap = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    ap.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes, no timing claims")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument(
        "--only", default=None, help="run the cases whose name contains one of these (a,b,...)"
    )
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.dry_run:
        out = args.out or f"bench/out/{name}_dry.json"
        env = dict(environment(probe_flashinfer=False), dry_run=True)
        ceilings = {"copy_gbps": 20.0, "mm_tflops": 0.2}  # placeholders: no claim on a CPU
        threads = torch.get_num_threads()
        torch.set_num_threads(1)  # tiny ops: more threads only contend for the cores
        try:
            run_and_save(out, env, ceilings, args.seed, dry=True, only=args.only)
        finally:
            torch.set_num_threads(threads)
        return
    if not torch.cuda.is_available():
        print(f"bench_{name}.py needs a CUDA device (or --dry-run)")
        return
    env = environment(probe_flashinfer=probe_flashinfer)
    ceilings = {"copy_gbps": copy_bandwidth(), "mm_tflops": matmul_tflops()}
    print(
        f"[bench] copy {ceilings['copy_gbps']:.0f} GB/s, bf16 mm {ceilings['mm_tflops']:.0f} TF/s"
    )
    out = args.out or default_out(env, suffix=f"_{name}")
    run_and_save(out, env, ceilings, args.seed, only=args.only)
