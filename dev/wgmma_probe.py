"""How fast one SM runs a stream of small wgmma instructions (issue 5: what bounds the
rope-aware FP8 MLA consumers on an H200, `gluon_mla_tw`).

Each CTA (one a SM) issues R rounds of float16 wgmma with the A operand in registers and B
[K, N] in shared memory, as `_t_tile` does: M rows a warpgroup (64: the S product's keys; 512:
the P V product's dims, 8 m-blocks), K 64 (four k16 steps, the S chunks) or 16 (the P V
chunks), N query columns, CH independent accumulators a round and at most PEND groups left in
flight after each round. The SM's cycle counter around the loop gives cycles a wgmma
instruction (an m64nNk16 step) of one warpgroup, and with NW 8 (two warpgroups, M rows each)
whether two warpgroups' streams overlap.

    python bench/wgmma_probe.py --compile-only   # any machine: sm_90 SASS counts
    python bench/wgmma_probe.py                  # GPU: a table, JSON under --out
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "src"))

from pagedattn.ops.gluon_imports import (  # noqa: E402
    fence_async_shared,
    gl,
    gluon,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from pagedattn.ops.mla.sm90.gluon_mla import _g_cycles  # noqa: E402


@gluon.jit
def _probe(A, B, OUT, CYC, R, NW: gl.constexpr, M: gl.constexpr, N: gl.constexpr,
           K: gl.constexpr, CH: gl.constexpr, PEND: gl.constexpr):  # fmt: skip
    """R rounds of CH async wgmma calls (A [M, K] registers, B [K, N] shared) a CTA; CYC [CTAs]
    gets the loop's cycles, OUT the accumulators' sum (so that nothing is dead)."""
    mma_l: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[NW, 1], instr_shape=[16, N, 16]
    )
    dot_l: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_l, k_width=2)
    ld_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
    b_l: gl.constexpr = gl.NVMMASharedLayout(
        swizzle_byte_width=min(128, 2 * K), element_bitwidth=16, rank=2
    )
    rm = gl.arange(0, M, layout=gl.SliceLayout(1, ld_l))
    rk = gl.arange(0, K, layout=gl.SliceLayout(0, ld_l))
    rn = gl.arange(0, N, layout=gl.SliceLayout(1, ld_l))
    a = gl.convert_layout(gl.load(A + rm[:, None] * K + rk[None, :]), dot_l)
    b_s = gl.allocate_shared_memory(
        gl.float16, [N, K], b_l, gl.load(B + rn[:, None] * K + rk[None, :])
    )
    fence_async_shared()
    gl.thread_barrier()
    b = b_s.permute((1, 0))
    acc0 = gl.zeros([M, N], gl.float32, mma_l)
    acc1 = gl.zeros([M, N], gl.float32, mma_l)
    t0 = _g_cycles()
    for _r in range(R):
        acc0 = warpgroup_mma(a, b, acc0, is_async=True)
        if CH == 2:
            acc1 = warpgroup_mma(a, b, acc1, is_async=True)
            acc0, acc1 = warpgroup_mma_wait(num_outstanding=PEND, deps=(acc0, acc1))
        else:
            acc0 = warpgroup_mma_wait(num_outstanding=PEND, deps=(acc0,))
    acc0, acc1 = warpgroup_mma_wait(num_outstanding=0, deps=(acc0, acc1))
    t1 = _g_cycles()
    pid = gl.program_id(0)
    gl.store(CYC + pid, t1 - t0)
    gl.atomic_add(OUT + pid, gl.sum(gl.sum(acc0 + acc1, 1), 0))


# name -> (NW, M, N, K, CH, PEND): the tw consumers' S chunk (m64, K 64, one group left in flight)
# and P V chunk (M 512), their N scaling, two chains, two warpgroups, nothing waited for.
VARIANTS = {
    "s_chain": (4, 64, 16, 64, 1, 1),
    "s_chain_p0": (4, 64, 16, 64, 1, 0),
    "s_chain_2acc": (4, 64, 16, 64, 2, 1),
    "s_chain_2wg": (8, 128, 16, 64, 1, 1),
    "s_chain_2wg_2acc": (8, 128, 16, 64, 2, 1),
    "s_n32": (4, 64, 32, 64, 1, 1),
    "s_n64": (4, 64, 64, 64, 1, 1),
    "s_n128": (4, 64, 128, 64, 1, 1),
    "pv_chunk": (4, 512, 16, 16, 1, 1),
    "pv_chunk_2wg": (8, 1024, 16, 16, 1, 1),
    "pv_n32": (4, 512, 32, 16, 1, 1),
}


def steps(v):
    """wgmma instructions (m64nNk16) one warpgroup issues a round."""
    nw, m, _n, k, ch, _p = VARIANTS[v]
    return ch * (m // (nw // 4) // 64) * (k // 16)


def args_for(v, R, device, sms):
    nw, m, n, k, ch, pend = VARIANTS[v]
    g = torch.Generator(device="cpu").manual_seed(0)
    a = (torch.randn(m, k, generator=g) / 8).to(device=device, dtype=torch.float16)
    b = (torch.randn(n, k, generator=g) / 8).to(device=device, dtype=torch.float16)
    out = torch.zeros(sms, device=device)
    cyc = torch.full((sms,), -1, dtype=torch.int64, device=device)
    return (a, b, out, cyc, R), dict(NW=nw, M=m, N=n, K=k, CH=ch, PEND=pend, num_warps=nw)


def compile_only(outdir):
    """Each variant's sm_90 compile: resources, HGMMA and WARPGROUP (arrive / wait: one a
    wgmma where ptxas serialized them) counts in the SASS, files under outdir."""
    from common import write_compiled

    from pagedattn.ops import offline

    for v in VARIANTS:
        args, kw = args_for(v, 8, "cpu", 1)
        k = offline.compile_sm90(offline.Launch(_probe, (1,), args, kw))
        res, sass = write_compiled(k, outdir, v)
        ops = {op: len(re.findall(rf"\b{op}\b", sass)) for op in ("HGMMA", "WARPGROUP")}
        print(v, res, ops, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/wgmma_probe"))
    ap.add_argument("--rounds", type=int, default=4096)
    a = ap.parse_args()
    if a.compile_only:
        return compile_only(os.path.join(a.out, "asm"))
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for v in VARIANTS:
        for grid in (1, sms):
            args, kw = args_for(v, a.rounds, "cuda", sms)
            _probe[(grid,)](*args, **kw)  # compile, warm
            torch.cuda.synchronize()
            _probe[(grid,)](*args, **kw)
            torch.cuda.synchronize()
            cyc = args[3][:grid].double()
            per = (cyc / (a.rounds * steps(v))).median().item()
            r = dict(variant=v, grid=grid, cfg=VARIANTS[v], cycles_per_wgmma=per,
                     cycles_median=cyc.median().item(), ok=bool((cyc > 0).all()))  # fmt: skip
            rows.append(r)
            print(json.dumps(r), flush=True)
    os.makedirs(a.out, exist_ok=True)
    with open(os.path.join(a.out, "wgmma_probe.json"), "w") as fh:
        json.dump(
            dict(device=torch.cuda.get_device_name(), rounds=a.rounds, rows=rows), fh, indent=1
        )
    print(f"\n{'variant':18s} {'(NW, M, N, K, CH, PEND)':26s} {'grid':>5s} {'cyc/wgmma':>10s}")
    for r in rows:
        print(
            f"{r['variant']:18s} {str(r['cfg']):26s} {r['grid']:5d} {r['cycles_per_wgmma']:10.1f}"
        )


if __name__ == "__main__":
    main()
