"""Small helpers of the dev scripts (not the benchmark suite's: that is bench/common.py).

- `write_compiled`: a compiled Triton kernel's PTX, TTGIR, cubin and SASS written to files, with
  its shared memory, registers and stack.
- `write_rows`, `print_rows`: a probe's record (JSON) and its rows as a plain table.
- `best_us_per_call`: host wall time of a call, best of rounds (the CPU host-cost probes).
- `graph_us_per_call`: device us a call of a CUDA graph that captured several calls.
"""

from __future__ import annotations

import json
import os
import re
import time

import torch


def best_us_per_call(fn, calls: int, rounds: int = 5, warmup: int = 1) -> float:
    """us of wall time a call of `fn` (no device sync: host-cost probes on the CPU), the best
    of `rounds` rounds of `calls` calls, after `warmup` calls."""
    for _ in range(warmup):
        fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def graph_us_per_call(fn, items: list, rounds: int = 9) -> float:
    """Median over `rounds` replays of one CUDA graph that captured `fn(item)` for each of
    `items` (warmed up on a side stream first), in us a call."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for it in items:
            fn(it)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        for it in items:
            fn(it)
    g.replay()
    torch.cuda.synchronize()
    t = []
    for _ in range(rounds):
        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        t.append(a.elapsed_time(b) * 1e3 / len(items))
    return sorted(t)[rounds // 2]


def write_rows(path: str, rows: list[dict], **meta) -> None:
    """A probe's record at `path`: {"device": the CUDA device's name, **meta, "rows": rows}."""
    device = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    with open(path, "w") as fh:
        json.dump(dict(device=device, **meta, rows=rows), fh, indent=1)


def print_rows(rows: list[dict], cols: list[tuple]) -> None:
    """A probe's rows as a plain table, one line a row. cols: (key, format spec[, header]),
    the spec's width (`8.1f`, `>5`, `<28`) also the header's; booleans print as words."""
    widths = [int(re.match(r"[<>^]?(\d*)", c[1]).group(1) or 0) for c in cols]
    align = ["<" if c[1].startswith("<") else ">" for c in cols]
    print(" ".join(f"{(c[2] if len(c) > 2 else c[0]):{a}{w}}"
                   for c, a, w in zip(cols, align, widths)))  # fmt: skip
    for r in rows:
        print(" ".join(format(str(r[c[0]]) if isinstance(r[c[0]], bool) else r[c[0]], c[1])
                       for c in cols))  # fmt: skip


def write_compiled(k, outdir: str, tag: str) -> tuple[dict, str]:
    """Write a Triton CompiledKernel's ptx, ttgir, cubin and SASS as outdir/tag.*; returns
    ({smem, regs, stack}: shared bytes, registers and stack bytes a thread from cuobjdump, -1
    where not found) and the SASS text."""
    import subprocess

    import triton

    os.makedirs(outdir, exist_ok=True)
    base = os.path.join(outdir, tag)
    for ext in ("ptx", "ttgir"):
        with open(f"{base}.{ext}", "w") as fh:
            fh.write(k.asm[ext])
    with open(f"{base}.cubin", "wb") as fh:
        fh.write(k.asm["cubin"])
    tb = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")

    def cuobjdump(*flags):
        cmd = [f"{tb}/cuobjdump", *flags, f"{base}.cubin"]
        return subprocess.run(cmd, capture_output=True, text=True).stdout

    sass = cuobjdump("-sass")
    with open(f"{base}.sass", "w") as fh:
        fh.write(sass)
    m = re.search(r"REG:(\d+) STACK:(\d+)", cuobjdump("--dump-resource-usage"))
    regs, stack = (int(m.group(1)), int(m.group(2))) if m else (-1, -1)
    return dict(smem=k.metadata.shared, regs=regs, stack=stack), sass
