"""Offline sm_90 compile of the balanced MLA decode launches (no GPU): the keys-as-M BF16 and
rope-aware FP8 kernels at h_q 16 and the TMA-fed seesaw at h_q 128 on the work list (the
keys-as-M BF16 kernel on its contiguous runs).
    env -u TRITON_INTERPRET PYTHONPATH=src:dev python dev/compile_mla_balanced.py [OUTDIR]
"""

from __future__ import annotations

import os
import sys

from mla_cases import capture, compile_offline, launcher, make_case

out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/mla_balanced"
for fmt, h_q, ps, s_q in [("rope_aware", 16, 64, 1), ("bf16", 16, 64, 1), ("bf16", 128, 64, 1),
                          ("bf16", 16, 64, 2)]:  # fmt: skip
    q, kv, offs, kw, _ = make_case("dense", fmt, 576, 4, 300, h_q, s_q, ps, device="cpu")
    launch = capture(launcher(q, kv, offs, kw, None), sm90=True)
    kw_ = launch.kwargs
    on = bool(kw_.get("BALANCED") or kw_.get("RUNS"))
    assert on or "balanced" in os.environ.get("PAGEDATTN_MLA_TUNING", "")
    res = compile_offline(launch, out, f"{launch.name}_{fmt}_h{h_q}_sq{s_q}")
    print(launch.name, fmt, h_q, s_q, "runs" if kw_.get("RUNS") else "items", res)
