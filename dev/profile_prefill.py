"""Launch the causal prefill benchmark case (8 x 4096 tokens, 32 heads, d128, bf16, ragged K/V)
a few times, for a profiler (`ncu`) to attach to:

    ncu --kernel-name regex:_mha_prefill --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section ComputeWorkloadAnalysis ... \
        python dev/profile_prefill.py [variant]

variant: a key of gpu_mha_dev.PREFILL_VARIANTS (default: the library's default).
"""

from __future__ import annotations

import sys

import torch
from gpu_mha_dev import PREFILL_VARIANTS

import pagedattn.ops.mha.triton_mha as M
from pagedattn import RaggedOperand
from pagedattn.ops.mha.selection import MHATuning

tuning = MHATuning(prefill=PREFILL_VARIANTS[sys.argv[1]] if len(sys.argv) > 1 else {})
nseq, n, h, d = 8, 4096, 32, 128
q = torch.randn(nseq * n, h, d, device="cuda", dtype=torch.bfloat16)
k, v = torch.randn_like(q), torch.randn_like(q)
offs = torch.arange(nseq + 1, dtype=torch.int32, device="cuda") * n
out = torch.empty_like(q)
for _ in range(4):
    M.mha_triton(q, RaggedOperand(k, offs), RaggedOperand(v, offs), offs, out=out, config=tuning)
torch.cuda.synchronize()
