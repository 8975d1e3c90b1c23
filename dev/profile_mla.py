"""Launch one MLA decode case a few times, for a profiler (`ncu`) to attach to:

    ncu --kernel-name regex:_mla_decode --launch-skip 2 --launch-count 1 \
        --section WarpStateStats --section ComputeWorkloadAnalysis ... \
        python dev/profile_mla.py dense bf16 128 1 4096

Arguments: mode fmt h_q s_q s_k [P [variant]] (b = 128, page 64, top-k 2048 for sparse;
P: num_partitions, default the heuristic; variant: a key of gpu_mla_dev.VARIANTS).
"""

from __future__ import annotations

import sys

import torch
from gpu_mla_dev import VARIANTS
from mla_cases import launcher, make_case

from pagedattn.ops.mla.tuning import MLATuning

mode, fmt, h_q, s_q, s_k = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
P = int(sys.argv[6]) if len(sys.argv) > 6 and sys.argv[6] != "auto" else None
config = MLATuning().replace(**(VARIANTS[sys.argv[7]] if len(sys.argv) > 7 else {}))
q, kv, offs, kw, _ = make_case(mode, fmt, 576, 128, s_k, h_q, s_q, 64, 2048)
kw["config"] = config
fn = launcher(q, kv, offs, kw, P)
for _ in range(4):
    fn()
torch.cuda.synchronize()
