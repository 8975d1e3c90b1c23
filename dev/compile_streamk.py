"""Offline sm_90 compile of the stream-K linear (`ops.linear.triton_streamk`) at the decode
shapes of Llama-3.2-1B and Llama-3-8B (no GPU): registers, shared memory, spills, the MMA and
load instructions of each variant.
    env -u TRITON_INTERPRET PYTHONPATH=src:dev python dev/compile_streamk.py [OUTDIR]
"""

from __future__ import annotations

import sys

import torch
from mla_cases import compile_offline

from pagedattn.ops import offline, prepared
from pagedattn.ops.linear.dense import StreamKConfig
from pagedattn.ops.linear.triton_streamk import streamk_linear_triton

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/streamk"
for M, N, K, act, cfg in [
    (64, 2048, 2048, False, StreamKConfig()),
    (64, 2048, 8192, True, StreamKConfig()),
    (64, 2048, 2048, False, StreamKConfig(block_k=64, stages=6)),
    (128, 4096, 4096, False, StreamKConfig(max_rows=128)),
    (16, 4096, 4096, False, StreamKConfig()),
]:
    x = torch.empty(M, 2 * K if act else K, dtype=torch.bfloat16)
    w = torch.empty(N, K, dtype=torch.bfloat16)
    (launch,) = offline.capture(
        prepared, lambda: streamk_linear_triton(x, w, None, act, cfg, 132),
        _fast_path=lambda kernel, grid: False,
    )
    tag = f"m{M}_n{N}_k{K}_{'silu' if act else 'plain'}_bk{cfg.block_k}_s{cfg.stages}"
    print(tag, compile_offline(launch, out, tag))
