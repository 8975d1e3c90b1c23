"""Locate the misaligned access of MLA decode over blockwise FP8 caches (run with
CUDA_LAUNCH_BLOCKING=1). Usage: python bench/gpu_debug_mla_fp8.py FMT ALIGN"""

import sys

import torch

import pagedattn.ops.mla.triton_mla as tm
from pagedattn import KVCacheParams, KVQuantConfig, PagedOperand, mla_decode, store_kv
from pagedattn.testing import make_paged_cache, ragged_offsets

fmt, align = sys.argv[1], sys.argv[2] == "1"
if not align:
    init = tm._Operand.__init__

    def patched(self, *a, **k):
        init(self, *a, **k)
        self.align = False

    tm._Operand.__init__ = patched
quant = {
    "g64": KVQuantConfig.blockwise(64),
    "g128e8": KVQuantConfig.blockwise(128, torch.float8_e8m0fnu),
    "tok": KVQuantConfig.per_token(),
    "none": None,
}[fmt]
for d_qk in (576, 512):
    for ps in (1, 16, 64):
        p = KVCacheParams(
            torch.bfloat16,
            1,
            1,
            d_qk,
            ps,
            is_mla=True,
            num_q_heads=16,
            quantization=quant,
            mla_rope_dim=64,
        )
        lens = [700, 123, 5]
        c = make_paged_cache(p, [0, 0, 0], lens, device="cuda")
        x = torch.randn(sum(lens), 1, d_qk, device="cuda", dtype=torch.bfloat16)
        store_kv(x, None, c.inputs, p, 0, ragged_offsets(lens, "cuda"), backend="reference")
        c.inputs.cache_lengths.copy_(torch.tensor([l - 1 for l in lens], dtype=torch.int32))
        torch.cuda.synchronize()
        op = PagedOperand(c.inputs, p, 0, "k")
        q = torch.randn(3, 16, d_qk, device="cuda", dtype=torch.bfloat16)
        for P in (1, 2):
            try:
                o, l = mla_decode(q, op, ragged_offsets([1, 1, 1], "cuda"), num_partitions=P)
                torch.cuda.synchronize()
                r, rl = mla_decode(
                    q, op, ragged_offsets([1, 1, 1], "cuda"), num_partitions=P, backend="reference"
                )
                err = (o.float() - r.float()).abs().max().item()
                print(f"{fmt} align={align} d{d_qk} ps{ps} P{P}: ok err={err:.3g}")
            except Exception as e:
                print(f"{fmt} align={align} d{d_qk} ps{ps} P{P}: FAIL {type(e).__name__} {e}")
                sys.exit(1)
