"""Does the SM clock drop under sustained MLA decode, and does the time follow it? (issue 5)

For each case (b 128, page 64): one launch after an idle second (cold L2), then SECONDS of
back-to-back replays of a CUDA graph of REPS launches, each replay timed with CUDA events,
while `nvidia-smi` samples the SM clock, the memory clock, the board power and the active
clock-event (throttle) reasons every 50 ms. Prints a row a case: the median time a launch of
the first ten replays and of the last second's, the SM clock and power medians over the last
second, and SM cycles a launch (time x clock: constant while the kernel's pace is set by its
instructions, growing when it waits on memory). Rows go to $OUT/power.json.

    python dev/mla_power_probe.py [CASE_REGEX [VARIANT,...]]   # gpu_mla_dev.VARIANTS names
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(_ROOT, "src"), os.path.join(_ROOT, "bench")]

import torch  # noqa: E402
from common import cold_l2  # noqa: E402
from gpu_mla_dev import VARIANTS  # noqa: E402
from mla_cases import launcher, make_case  # noqa: E402

SECONDS = float(os.environ.get("POWER_SECONDS", 3.0))  # of sustained replays a case
REPS = 20  # launches a graph replay
# name: (mode, fmt, s_k, h_q, s_q, topk, shared)
CASES = {
    "rope-fp8 h16 8k HBM": ("dense", "rope_aware", 8192, 16, 1, 0, ""),
    "rope-fp8 h16 8k L2": ("dense", "rope_aware", 8192, 16, 1, 0, "L2"),
    "rope-fp8 h16 4k HBM": ("dense", "rope_aware", 4096, 16, 1, 0, ""),
    "bf16 h16 8k HBM": ("dense", "bf16", 8192, 16, 1, 0, ""),
    "bf16 h16 4k HBM": ("dense", "bf16", 4096, 16, 1, 0, ""),
    "v32 sparse h128 HBM": ("sparse", "v32", 8192, 128, 2, 2048, ""),
    "v32 sparse h128 L2": ("sparse", "v32", 8192, 128, 2, 2048, "L2"),
}
QUERY = "clocks.sm,clocks.mem,power.draw,temperature.gpu,{}.active"


def _query() -> str:
    """nvidia-smi's query fields; the reasons' field is `clocks_throttle_reasons` before R535."""
    for name in ("clocks_event_reasons", "clocks_throttle_reasons"):
        q = QUERY.format(name)
        cmd = ["nvidia-smi", f"--query-gpu={q}", "--format=csv,noheader"]
        if subprocess.run(cmd, capture_output=True).returncode == 0:
            return q
    return QUERY.format("clocks_throttle_reasons")


def sampler(query: str) -> subprocess.Popen:
    cmd = ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader,nounits", "-lms", "50"]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)


def samples(p: subprocess.Popen) -> list[list[str]]:
    """The sampler's rows (fields as strings), once it is stopped."""
    p.terminate()
    out, _ = p.communicate(timeout=10)
    return [[x.strip() for x in line.split(",")] for line in out.splitlines() if line]


def run_case(name: str, spec: tuple, query: str, variant: str = "") -> dict:
    """One case's row (module docstring), launched with `variant`'s tuning ("": defaults)."""
    from pagedattn.ops.mla.tuning import MLATuning

    mode, fmt, s_k, h_q, s_q, topk, shared = spec
    q, kv, offs, kw, work = make_case(mode, fmt, 576, 128, s_k, h_q, s_q, 64, topk, shared=shared)
    kw["config"] = MLATuning().replace(**(VARIANTS[variant] if variant else {}))
    fn = launcher(q, kv, offs, kw, 1)
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(REPS):
            fn()
    torch.cuda.synchronize()
    time.sleep(1.0)
    cold_l2()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    fn()
    e1.record()
    torch.cuda.synchronize()
    first_ms = e0.elapsed_time(e1)
    p = sampler(query)
    times, stamps = [], []
    t_end = time.time() + SECONDS
    while time.time() < t_end:
        ev = [torch.cuda.Event(enable_timing=True) for _ in range(2 * 10)]
        for i in range(10):
            ev[2 * i].record()
            g.replay()
            ev[2 * i + 1].record()
        torch.cuda.synchronize()
        now = time.time()
        times += [ev[2 * i].elapsed_time(ev[2 * i + 1]) / REPS for i in range(10)]
        stamps += [now] * 10
    rows = samples(p)
    last = [t for t, s in zip(times, stamps) if s > stamps[-1] - 1.0]
    tail = rows[-20:] if len(rows) >= 20 else rows

    def med(i: int) -> float | None:
        v = [float(r[i]) for r in tail if len(r) > i and re.fullmatch(r"[\d.]+", r[i])]
        return statistics.median(v) if v else None

    sm = med(0)
    ms_last = statistics.median(last)
    r = dict(
        case=name, variant=variant or "default", bytes=work["bytes"], flops=work["flops"],
        ms_first=first_ms,
        ms_replay_first=statistics.median(times[:10]), ms_replay_last=ms_last,
        sm_mhz=sm, mem_mhz=med(1), watts=med(2), temp_c=med(3),
        reasons=sorted({r[4] for r in tail if len(r) > 4}),
        mcycles=ms_last * sm / 1e3 if sm else None,  # ms x MHz / 1e3
        tbps_last=work["bytes"] / (ms_last * 1e-3) / 1e12,
        sm_mhz_trace=[float(r[0]) for r in rows if re.fullmatch(r"[\d.]+", r[0])][::4],
    )  # fmt: skip
    return r


def main() -> None:
    only = sys.argv[1] if len(sys.argv) > 1 else ""
    variants = sys.argv[2].split(",") if len(sys.argv) > 2 else [""]
    out = os.environ.get("OUT", "/tmp/mla_power")
    os.makedirs(out, exist_ok=True)
    rows, query = [], _query()
    for name, spec in CASES.items():
        if only and not re.search(only, name):
            continue
        for v in variants:
            r = run_case(name, spec, query, v)
            rows.append(r)
            print("power", json.dumps({k: v for k, v in r.items() if k != "sm_mhz_trace"}),
                  flush=True)  # fmt: skip
    dev = torch.cuda.get_device_name()
    with open(os.path.join(out, "power.json"), "w") as fh:
        json.dump(dict(device=dev, date=time.strftime("%Y-%m-%d"), rows=rows), fh, indent=1)
    print(f"\n{dev}: case | ms first replay / last s | SM MHz | W | Mcycles a launch | reasons")
    for r in rows:
        print(f"{r['case']:22s} {r['variant']:14s} {r['ms_replay_first']:.4f} / "
              f"{r['ms_replay_last']:.4f} | {r['sm_mhz']} | {r['watts']} | "
              f"{r['mcycles'] and round(r['mcycles'], 3)} | {','.join(r['reasons'])}")  # fmt: skip


if __name__ == "__main__":
    main()
