"""Does sustained load slow the prefill kernels (power / clock)? Per variant of
gpu_mha_dev.PREFILL_VARIANTS (ragged causal 8 x 4096, 32 heads, d128): one launch after an idle
second, then 120 back-to-back launches timed one by one with events; prints the first / last
ten means and the SM clock (NVML) at the end of the run.

    python bench/clock_probe.py tl g128n3 w4b64n3
"""

from __future__ import annotations

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from common import board_watts, sm_clock_mhz  # noqa: E402
from gpu_mha_dev import PREFILL_VARIANTS  # noqa: E402

import pagedattn.ops.mha.triton_mha as M  # noqa: E402
from pagedattn import RaggedOperand  # noqa: E402


def clock_mhz() -> str:
    return f"{sm_clock_mhz()} MHz, {board_watts()} W"  # None where NVML cannot tell


nseq, n, h, d = 8, 4096, 32, 128
q = torch.randn(nseq * n, h, d, device="cuda", dtype=torch.bfloat16)
k, v = torch.randn_like(q), torch.randn_like(q)
offs = torch.arange(nseq + 1, dtype=torch.int32, device="cuda") * n
out = torch.empty_like(q)
flops = 4 * nseq * h * d * n * (n + 1) / 2
for name in sys.argv[1:]:
    M.PREFILL_OVERRIDE.clear()
    M.PREFILL_OVERRIDE.update(PREFILL_VARIANTS[name])
    run = lambda: M.mha_triton(q, RaggedOperand(k, offs), RaggedOperand(v, offs), offs, out=out)  # noqa: E731
    run()
    torch.cuda.synchronize()
    time.sleep(1.0)
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(242)]
    ev[0].record()
    run()
    ev[1].record()
    torch.cuda.synchronize()
    cold = ev[0].elapsed_time(ev[1])
    for i in range(120):
        ev[2 + 2 * i].record()
        run()
        ev[3 + 2 * i].record()
    torch.cuda.synchronize()
    clk = clock_mhz()
    ts = [ev[2 + 2 * i].elapsed_time(ev[3 + 2 * i]) for i in range(120)]
    first, last = sum(ts[:10]) / 10, sum(ts[-10:]) / 10
    print(f"{name:10s} idle-start {flops / cold / 1e9:5.0f}  first10 {flops / first / 1e9:5.0f}"
          f"  last10 {flops / last / 1e9:5.0f} TFLOP/s   end: {clk}", flush=True)  # fmt: skip
