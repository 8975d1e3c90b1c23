"""Split-K decode with and without programmatic dependent launch (ops/pdl.py), same data.

Usage (GPU): python dev/gpu_pdl_dev.py [--out DIR]. Times every split-K config of the MHA
and MLA decode suites with PAGEDATTN_PDL=0 and =1 alternately (fastest of the rounds each)
and prints the ratio; checks PDL's output equals the serial launch's bit for bit.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "bench"))

from bench_mha import DECODE, paged_cache  # noqa: E402
from bench_mla import DENSE, mla_cache  # noqa: E402
from common import copy_bandwidth, time_ms  # noqa: E402
from devtools import print_rows, write_rows  # noqa: E402

from pagedattn import KVQuantConfig, PagedOperand, mha, mla_decode  # noqa: E402


def cases():
    for b, ctx, page, h_q, h_kv, d in DECODE[:4]:
        p, inp = paged_cache(b, ctx, page, h_kv, d)
        q = torch.randn(b, h_q, d, device="cuda", dtype=torch.bfloat16)
        offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        k, v = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
        out = torch.empty_like(q)
        nbytes = 2 * b * ctx * h_kv * d * 2
        yield f"mha b{b} ctx{ctx} p{page}", nbytes, out, lambda: mha(q, k, v, offs, out=out)
    for fmt in (None, "mla_rope_aware"):
        for b, s_k, page, h_q in DENSE:
            if h_q != 16:
                continue
            quant = KVQuantConfig.mla_rope_aware() if fmt else None
            _p, _inp, op = mla_cache(b, s_k, page, h_q, quant)
            q = torch.randn(b, h_q, 576, device="cuda", dtype=torch.bfloat16)
            offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
            out = torch.empty(b, h_q, 512, device="cuda", dtype=torch.bfloat16)
            nbytes = b * s_k * (644 if fmt else 1152)
            yield (f"mla {fmt or 'bf16'} sk{s_k}", nbytes, out,
                   lambda: mla_decode(q, op, offs, scale=576**-0.5, out=out))  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    copy = copy_bandwidth()
    rows = []
    for name, nbytes, out, fn in cases():
        res = {}
        for mode in ("0", "1"):
            os.environ["PAGEDATTN_PDL"] = mode
            out.fill_(float("nan"))
            fn()
            torch.cuda.synchronize()
            res["out" + mode] = out.clone()
        same = torch.equal(res["out0"], res["out1"])
        t = {"0": [], "1": []}
        for _ in range(3):
            for mode in ("0", "1"):
                os.environ["PAGEDATTN_PDL"] = mode
                t[mode].append(time_ms(fn, repeats=1))
        t0, t1 = min(t["0"]), min(t["1"])
        f0 = nbytes / t0 / 1e6 / copy
        f1 = nbytes / t1 / 1e6 / copy
        rows.append(dict(config=name, us_serial=t0 * 1e3, us_pdl=t1 * 1e3, copy_serial=f0,
                         copy_pdl=f1, same=same, rounds=t))  # fmt: skip
        torch.cuda.empty_cache()
    os.environ.pop("PAGEDATTN_PDL")
    if args.out:
        write_rows(os.path.join(args.out, "pdl.json"), rows, copy_gbps=copy)
    print(f"copy {copy:.0f} GB/s")
    print_rows(rows, [("config", "<28"), ("us_serial", "10.1f", "serial us"),
                      ("us_pdl", "8.1f", "pdl us"), ("copy_serial", "6.3f", "copy"),
                      ("copy_pdl", "6.3f", "copy"), ("same", ">5")])  # fmt: skip


if __name__ == "__main__":
    main()
