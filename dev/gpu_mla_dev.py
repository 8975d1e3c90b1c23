"""Development bench for the Triton MLA decode kernels (issue 5): correctness at real sizes and
timings of launch variants in one run, short table last. Full numbers go to $OUT (or --out).

    python dev/gpu_mla_dev.py                 # on a GPU: check + time
    python dev/gpu_mla_dev.py --compile-only  # on any machine: offline sm_90 compiles, PTX/SASS
                                              # resource report (wgmma, smem, spills)

Cases and the work counted: `mla_cases.make_case`. Timings: triton.testing.do_bench median over
fresh inputs; the cache pool is larger than L2 (50 MB) in every case.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path[:0] = [os.path.join(_ROOT, "src"), os.path.join(_ROOT, "bench")]

import torch  # noqa: E402
from common import cold_l2  # noqa: E402
from mla_cases import capture, compile_offline, launcher, make_case  # noqa: E402

# ------------------------------------------------------------------------------------------
# Launch variants (timed, and compiled offline by --compile-only)
# ------------------------------------------------------------------------------------------
# Launch variants timed (and compiled offline): name -> (`MLATuning` overrides, set through
# PAGEDATTN_MLA_TUNING, which `mla_decode_triton` reads at each call).
_SS = dict(gluon=True, sm90_ss=True, sm90_t=False, ss_tma=False)  # the seesaw variants' base
VARIANTS = {
    "auto": {},
    "pfbn32w8": dict(prefetch=True, BN=32, num_warps=8),
    "pfbn16w4": dict(prefetch=True, BN=16, num_warps=4),
    "pfbn128w8": dict(prefetch=True, BN=128, num_warps=8),
    "pf0s5": dict(prefetch=False, BN=32, num_warps=4, num_stages=5),
    "pf0bn32": dict(prefetch=False, BN=32, num_stages=3),
    "tl": dict(gluon=False),
    "sm90": dict(gluon=True),
    "sm90b64n2": dict(gluon=True, sm90_bn=64, sm90_nbuf=2),
    "sm90b32n3": dict(gluon=True, sm90_bn=32, sm90_nbuf=3),
    "sm90b32n5": dict(gluon=True, sm90_bn=32, sm90_nbuf=5),
    "sm90t": dict(gluon=True, sm90_t=True, sm90_tw=False),  # keys-as-M, one warpgroup
    "sm90tn2": dict(gluon=True, sm90_t=True, sm90_tw=False, sm90_t_nbuf=2),
    "sm90tn3": dict(gluon=True, sm90_t=True, sm90_tw=False, sm90_t_nbuf=3),
    "sm90tw": dict(gluon=True, sm90_t=True, sm90_tw=True),  # warp-specialized (FP8)
    "sm90tw2": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_nbuf=2),
    "sm90tw3": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_nbuf=3),
    "sm90tw4": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_nbuf=4),
    "sm90tw5": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_nbuf=5),
    # tw's producer (defaults since 2026-11-28: a power-of-two page size a compile-time constant,
    # PS_C; int32 rows with one int64 offset a row, ADDR): as before, and each one alone
    "sm90tw_old": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_psc=False, tw_addr=False),
    "sm90tw_psc": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_addr=False),
    "sm90tw_a": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_psc=False),
    # the softmax's reduction of the pair (max, largest scale), as before 2026-11-28 (FOLD off)
    "sm90tw_nofold": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_fold=False),
    # the reduction on every tile, without `t_tile` SPEC (the default since 2026-11-28)
    "sm90tw_nospec": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_spec=False),
    # the FP8 stages' plain swizzle (2-way bank conflicts on the S loads), `t_raw_layout`
    "sm90tw_k0": dict(gluon=True, sm90_t=True, sm90_tw=True, t_kswz=0),
    "sm90t_k0": dict(gluon=True, sm90_t=True, sm90_tw=False, t_kswz=0),
    # the e4m3 chunks loaded right before their upcast, not one chunk ahead (`t_tile` PF)
    "sm90tw_p0": dict(gluon=True, sm90_t=True, sm90_tw=True, t_pf=False),
    "sm90t_p0": dict(gluon=True, sm90_t=True, sm90_tw=False, t_pf=False),
    # tw: tiles issued by the CTA's warps before the partitions start (default 1)
    "sm90tw_pre0": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_pre=0),
    "sm90tw_pre2": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_pre=2),
    "sm90tw_pre3": dict(gluon=True, sm90_t=True, sm90_tw=True, tw_pre=3),
    "sm90_64": dict(gluon=True, sm90_t=False),
    "sm90np": dict(gluon=True, sm90_pipe=False),  # 64-row kernel, P V waited in its iteration
    # the cp.async seesaw (gluon_mla_ss; for dense BF16 pages of whole tiles the TMA-fed one serves)
    "ss": _SS,
    "sm90old": dict(gluon=True, sm90_ss=False),  # the key-split 64-row kernel
    "ss0": dict(_SS, ss_order=0, ss_half=False),
    "ss_o1": dict(_SS, ss_order=1, ss_half=False),
    "ss_o2": dict(_SS, ss_order=2, ss_half=False),
    "ss_o2h": dict(_SS, ss_order=2, ss_half=True),
    "ss_o1h": dict(_SS, ss_order=1, ss_half=True),
    "ss_h": dict(_SS, ss_order=0, ss_half=True),
    "ss_r208": dict(_SS, ss_regs=(208, 96)),
    # V32, h_q > 64: the 2-CTA cluster kernel (each CTA dequantizes half of every tile)
    "ss_1cta": dict(_SS, ss_cross=False),  # the single-CTA seesaw (before the cluster one)
    "ss_ps": dict(_SS, ss_persist=True),  # sparse: the persistent cluster kernel (gluon_mla_ps)
    "ss_ps0": dict(_SS, ss_persist=True, ps_epi=0),  # its epilogue in 4-byte stores
    # G clusters of the persistent kernel (default one a pair of SMs): 256 = one token each
    # (the per-token kernel's work split on the persistent code), 128 = two tokens each
    "ss_ps_g256": dict(_SS, ss_persist=True, ps_g=256),
    "ss_ps_g128": dict(_SS, ss_persist=True, ps_g=128),
    # the persistent kernel's work in token order (default: the i-th tokens of all requests first)
    "ss_ps_t": dict(_SS, ss_persist=True, ps_order=0),
    "ss_ps_g256t": dict(_SS, ss_persist=True, ps_g=256, ps_order=0),
    # the V32 cluster producer's tile step (defaults since 2026-11-28, record
    # bench/results/h100_2026-11-28_mla_v32_producer.json): one store of a half's two
    # dequantized groups (ss_deq1), the page size a compile-time constant (ps_const), int32 row
    # numbers with one offset product a row (ss_addr), consumer / producer registers 200 / 104
    # (the default partition, consumer 0, gets 504 - 200 - 104 = 200). Each one undone:
    "ss_deq0": dict(_SS, ss_deq1=False),
    "ss_pc0": dict(_SS, ps_const=False),
    "ss_a0": dict(_SS, ss_addr=False),
    "ss_r112": dict(_SS, ss_regs=(200, 112)),
    "ss_old": dict(_SS, ss_deq1=False, ps_const=False, ss_addr=False, ss_regs=(200, 112)),
    # the persistent kernel as it was before 2026-11-28
    "ss_ps_old": dict(
        _SS, ss_persist=True, ss_deq1=False, ps_const=False, ss_addr=False, ss_regs=(200, 112)
    ),
    # the cluster producer copies each 16 KB group to the peer once stored (default: dense)
    "ss_scp": dict(_SS, ss_splitcp=True),
    "ss_scp0": dict(_SS, ss_splitcp=False),
    # q cp.async'ed, the consumers waiting for it on a barrier (gluon_mla_ss SS_QASYNC; the
    # default for sparse V32 with two head blocks a token)
    "ss_qa": dict(_SS, ss_qasync=True),
    "ss_qa0": dict(_SS, ss_qasync=False),
    # the TMA-fed seesaw (gluon_mla_st; dense BF16, pages of whole tiles)
    "st": dict(_SS, ss_tma=True),
}

CASES = [
    # name, mode, fmt, d_qk, b, s_k, h_q, s_q, ps, topk, variants, partitions
    ("dense bf16 h16 8k", "dense", "bf16", 576, 128, 8192, 16, 1, 64, 0, ["sm90t"], [None]),
    ("dense bf16 h16 4k", "dense", "bf16", 576, 128, 4096, 16, 1, 64, 0, ["sm90t"], [None]),
    ("dense rope-fp8 h16 8k", "dense", "rope_aware", 576, 128, 8192, 16, 1, 64, 0,
     ["sm90tw", "sm90tw_pre0", "sm90tw_p0", "sm90tw2", "sm90tw4", "sm90tw5", "sm90tw_old",
      "sm90tw_psc", "sm90tw_a", "sm90tw_nofold", "sm90tw_nospec"], [1]),
    ("dense rope-fp8 h16 4k", "dense", "rope_aware", 576, 128, 4096, 16, 1, 64, 0,
     ["sm90tw", "sm90tw_pre0", "sm90tw_pre2", "sm90tw_p0", "sm90tw_k0", "sm90tw2", "sm90tw4",
      "sm90tw5", "sm90tw_old", "sm90tw_psc", "sm90tw_a", "sm90tw_nofold",
      "sm90tw_nospec"], [1, 2]),
    ("dense rope-fp8 h16 2k", "dense", "rope_aware", 576, 128, 2048, 16, 1, 64, 0,
     ["sm90t", "sm90tw2", "sm90tw3", "sm90tw4"], [1, 2]),
    ("dense rope-fp8 h16 16k", "dense", "rope_aware", 576, 128, 16384, 16, 1, 64, 0,
     ["sm90t", "sm90tw2", "sm90tw3", "sm90tw4"], [1, 2]),
    ("dense rope-fp8 h16 sq2 4k", "dense", "rope_aware", 576, 64, 4096, 16, 2, 64, 0,
     ["sm90t", "sm90tw"], [None, 1, 2]),
    ("dense bf16 h16 sq2 8k", "dense", "bf16", 576, 64, 8192, 16, 2, 64, 0,
     ["sm90t", "sm90_64"], [None]),
    ("dense v32 h16 8k", "dense", "v32", 576, 128, 8192, 16, 1, 64, 0, ["sm90"], [None, 2]),
    ("dense bf16 h128 8k", "dense", "bf16", 576, 128, 8192, 128, 1, 64, 0,
     ["ss", "st"], [None]),
    ("dense bf16 h128 4k", "dense", "bf16", 576, 128, 4096, 128, 1, 64, 0,
     ["ss", "st"], [None]),
    ("dense rope-fp8 h128 8k", "dense", "rope_aware", 576, 128, 8192, 128, 1, 64, 0,
     ["sm90"], [None]),
    ("dense v32 h128 8k", "dense", "v32", 576, 128, 8192, 128, 1, 64, 0,
     ["ss", "ss_qa", "ss_scp0", "ss_old", "ss_r112"], [None]),
    ("sparse v32 h128 sq2 2k", "sparse", "v32", 576, 128, 8192, 128, 2, 64, 2048,
     ["ss", "ss_qa0", "ss_old", "ss_deq0", "ss_pc0", "ss_a0", "ss_r112", "ss_r208", "ss_scp",
      "ss_ps", "ss_ps_old", "ss_ps_g256t"], [None]),
    ("sparse bf16 h128 sq2 2k", "sparse", "bf16", 576, 128, 8192, 128, 2, 64, 2048,
     ["ss0", "ss", "ss_qa"], [None]),
    ("sparse model1 h128 sq2 2k", "sparse", "model1", 512, 128, 8192, 128, 2, 64, 2048,
     ["auto"], [None]),
]  # fmt: skip


# Correctness cases of the seesaw kernel (mode, fmt, d_qk, h_q, s_q, page, top-k, P): odd tile
# counts (8192 + s_q keys), causal multi-token tiles, padded rows, sparse with invalid slots.
SS_CHECKS = [
    ("dense", "bf16", 576, 128, 1, 64, 0, None),
    ("dense", "bf16", 576, 128, 2, 16, 0, 3),
    ("dense", "bf16", 576, 64, 4, 1, 0, None),
    ("dense", "bf16", 576, 20, 4, 128, 0, 2),
    ("sparse", "bf16", 576, 128, 2, 16, 2048, None),
    ("sparse", "bf16", 576, 64, 1, 1, 256, 2),
    ("sparse", "bf16", 576, 16, 1, 64, 2048, 1),
    ("sparse", "v32", 576, 128, 2, 64, 2048, None),
    ("sparse", "v32", 576, 64, 1, 1, 256, 2),
    ("dense", "v32", 576, 20, 4, 1, 0, None),
    ("dense", "v32", 576, 128, 4, 128, 0, 2),
]


# Correctness cases of the TMA-fed seesaw (dense BF16, pages of whole tiles): odd and even tile
# counts a partition (P 2, 4, auto), causal multi-token tiles, padded rows, NaN past the keys.
ST_CHECKS = [
    ("dense", "bf16", 576, 128, 1, 64, 0, None),
    ("dense", "bf16", 576, 128, 1, 64, 0, 4),
    ("dense", "bf16", 576, 128, 2, 128, 0, 2),
    ("dense", "bf16", 576, 64, 4, 64, 0, None),
    ("dense", "bf16", 576, 20, 4, 128, 0, 4),
    ("dense", "bf16", 576, 16, 2, 64, 0, 1),
    ("dense", "bf16", 576, 128, 4, 64, 0, 1),
]


# Correctness cases of the keys-as-M kernel (BF16 h_q <= 32, rope-aware FP8 h_q <= 16).
T_CHECKS = [
    ("dense", "rope_aware", 576, 16, 1, 64, 0, None),
    ("dense", "rope_aware", 576, 16, 2, 16, 0, 3),
    ("dense", "rope_aware", 576, 8, 1, 1, 0, 2),
    ("dense", "rope_aware", 576, 1, 4, 128, 0, None),
    ("sparse", "rope_aware", 576, 16, 1, 64, 2048, None),
    ("sparse", "rope_aware", 576, 5, 2, 1, 256, 2),
    ("dense", "bf16", 576, 16, 1, 64, 0, None),
    ("dense", "bf16", 576, 20, 4, 128, 0, 2),
    ("sparse", "bf16", 576, 32, 1, 1, 256, 1),
]


def compile_only(outdir, cases=""):
    rows = []
    for name, mode, fmt, d_qk, _b, _s, h_q, s_q, ps, _tk, variants, _parts in CASES:
        if cases and not re.search(cases, name):
            continue
        q, kv, offs, kw, _ = make_case(mode, fmt, d_qk, 4, 256, h_q, s_q, ps, 128, "cpu")
        for v in variants:
            os.environ["PAGEDATTN_MLA_TUNING"] = json.dumps(VARIANTS[v])
            launch = capture(launcher(q, kv, offs, kw, 1), v.startswith(("sm90", "ss", "st")))
            tag = re.sub(r"[^A-Za-z0-9]+", "_", f"{name}_{v}")
            t0 = time.time()
            try:
                r = compile_offline(launch, outdir, tag)
            except Exception as e:  # noqa: BLE001 - report and go on
                r = dict(error=str(e).splitlines()[0][:200])
            r["compile_s"] = round(time.time() - t0, 1)
            r["case"], r["variant"] = name, v
            rows.append(r)
            print(json.dumps(r), flush=True)
    os.environ.pop("PAGEDATTN_MLA_TUNING", None)
    return rows


# ------------------------------------------------------------------------------------------
# GPU: ceilings, correctness at real sizes, timings
# ------------------------------------------------------------------------------------------
def ceilings():
    import triton

    n = 1 << 30  # 1 GiB each way
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    t = triton.testing.do_bench(lambda: b.copy_(a), warmup=50, rep=300, return_mode="median")
    copy_bw = 2 * n / (t * 1e-3)
    x = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    y = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    t = triton.testing.do_bench(lambda: x @ y, warmup=50, rep=300, return_mode="median")
    mm = 2 * 8192**3 / (t * 1e-3)
    return copy_bw, mm


def check_case(mode, fmt, d_qk, h_q, s_q, ps, topk, P):
    """Kernel vs the library's reference (fp32, on the GPU) at a real key count."""
    from pagedattn.ops.mla.reference import mla_decode_reference
    from pagedattn.testing import cos_diff

    q, kv, offs, kw, _ = make_case(mode, fmt, d_qk, 6, 8192, h_q, s_q, ps, topk, seed=7,
                                   poison=True)  # fmt: skip
    sink = torch.randn(h_q, device="cuda")
    o, lse = launcher(q, kv, offs, dict(kw, attn_sink=sink), P)()
    ro, rl = mla_decode_reference(q, kv, offs, attn_sink=sink, **kw)
    err = (o.float() - ro.float()).abs().max().item()
    lerr = (lse - rl).abs().max().item()
    return dict(max_abs=err, cos=cos_diff(o, ro), lse_max_abs=lerr, nan=bool(torch.isnan(o).any()))


def fixed_cost_probe(copy_bw):
    """Where the rope-aware h_q 16 split launch (P = 2) spends its fixed time: GPU time of the
    whole launch, of the split kernel without its combine, and of the combine alone."""
    import triton

    import pagedattn.ops.mla.triton_mla as M
    from pagedattn.ops.mla.triton_mla_combine import mla_combine_triton

    rows = []
    comb = M.mla_combine_triton
    for s_k in (2048, 4096, 8192):
        q, kv, offs, kw, work = make_case("dense", "rope_aware", 576, 128, s_k, 16, 1, 64, 0)
        fn = launcher(q, kv, offs, kw, 2)
        t_all = triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median")
        M.mla_combine_triton = lambda *a, **k: None
        try:
            t_split = triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median")
        finally:
            M.mla_combine_triton = comb
        po = torch.randn(2, q.shape[0], 16, 512, device="cuda")
        pl = torch.randn(2, q.shape[0], 16, device="cuda")
        out = torch.empty(q.shape[0], 16, 512, dtype=q.dtype, device="cuda")
        lse = torch.empty(q.shape[0], 16, device="cuda")
        t_comb = triton.testing.do_bench_cudagraph(
            lambda: mla_combine_triton(po, pl, out, lse), rep=60, return_mode="median"
        )
        floor = work["bytes"] / copy_bw * 1e3
        r = dict(s_k=s_k, ms_all=t_all, ms_split=t_split, ms_combine=t_comb, ms_copy=floor)
        rows.append(r)
        print("fixed", json.dumps(r), flush=True)
    return rows


def _cold_trace(fn, tr):
    """Run `fn` once from a cold L2 with `MLATuning.trace` = tr set; tr's rows (numpy)."""
    cold_l2()
    torch.cuda.synchronize()
    fn()
    torch.cuda.synchronize()
    return tr.cpu().numpy()


def trace_probe(copy_bw, outdir, only=""):
    """Per-CTA timeline (globaltimer) of the keys-as-M kernels (h_q 16) and the seesaws (h_q
    128: the TMA-fed st over dense bf16, the cluster ss over sparse V32 s_q 2 top-k 2048), b
    128, page 64: the CTA's start, before its loop (tw: the producer's first tile issued;
    st, ss: after the prologue), when its first tile (st, ss: pair) is done, after the loop and
    at its end (tw: slot 5, the producer's last tile issued; st: warpgroup 1's loop end; ss:
    the producer's first tile released), and its SM. Summaries in microseconds from the first
    CTA's start; `only`: a regex on the run labels."""
    import numpy as np
    import triton

    from pagedattn.ops.mla import tuning as mla_tuning

    rows = []
    # label, fmt, s_k, h_q, P, variant (ss: sparse V32, s_q 2, top-k 2048)
    runs = [("fp8tw", "rope_aware", 4096, 16, 1, "sm90tw"),
            # the same, each CTA given the pages of the request b / 2 rows away (do the slow
            # CTAs follow their SMs or their pages?)
            ("fp8tw_roll", "rope_aware", 4096, 16, 1, "sm90tw"),
            ("fp8tw", "rope_aware", 8192, 16, 1, "sm90tw"),
            # every request reading request 0's pages (L2-resident: the consumers' pace)
            ("fp8tw_l2", "rope_aware", 8192, 16, 1, "sm90tw"),
            ("bf16_l2", "bf16", 8192, 16, 1, "sm90t"),
            ("fp8tw", "rope_aware", 4096, 16, 2, "sm90tw"),
            ("fp8t", "rope_aware", 4096, 16, 2, "sm90t"), ("bf16", "bf16", 4096, 16, 1, "sm90t"),
            ("bf16", "bf16", 8192, 16, 1, "sm90t"), ("st128", "bf16", 4096, 128, 1, "st"),
            ("st128", "bf16", 8192, 128, 1, "st"),
            ("ss128", "v32", 8192, 128, 1, "ss")]  # fmt: skip
    for label, fmt, s_k, h_q, P, variant in runs:
        if only and not re.search(only, label):
            continue
        seesaw = variant.startswith(("st", "ss"))
        if variant.startswith("ss"):  # sparse V32, s_q 2, top-k 2048
            q, kv, offs, kw, work = make_case("sparse", fmt, 576, 128, s_k, h_q, 2, 64, 2048)
        else:
            shared = "L2" if label.endswith("_l2") else ""
            q, kv, offs, kw, work = make_case("dense", fmt, 576, 128, s_k, h_q, 1, 64, 0,
                                              shared=shared)  # fmt: skip
            if label.endswith("_roll"):
                kv.lut.copy_(kv.lut.roll(kv.lut.shape[0] // 2, 0))
        os.environ["PAGEDATTN_MLA_TUNING"] = json.dumps(VARIANTS[variant])
        fn = launcher(q, kv, offs, kw, P)
        fn()
        t_graph = triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median")
        n_cta = q.shape[0] * P * (2 if seesaw else 1)
        tr = torch.zeros(n_cta, 10, dtype=torch.int64, device="cuda")  # `_g_trace_open`
        kw["config"] = mla_tuning.from_env().replace(trace=tr)
        fn()
        for rep in range(3):
            a = _cold_trace(fn, tr)
            rel = (a[:, :6] - a[:, 0].min()) / 1e3
            n_it = a[:, 7]
            done = 2 if seesaw else 1  # tiles done at slot 2
            per_tile = (rel[:, 3] - rel[:, 2]) / np.maximum(n_it - done, 1)
            _sm, cnt = np.unique(a[:, 6], return_counts=True)
            end = rel[:, 4]
            # consecutive CTAs of one SM: the next one's start after the previous one's end
            gaps, wave2 = [], []
            for sm in _sm:
                i = np.where(a[:, 6] == sm)[0]
                i = i[np.argsort(rel[i, 0])]
                gaps += (rel[i[1:], 0] - rel[i[:-1], 4]).tolist()
                wave2 += i[1:].tolist()
            w2 = np.array(wave2, dtype=np.int64)
            r = dict(
                case=f"{label} s_k {s_k} P {P}", rep=rep, graph_us=t_graph * 1e3,
                floor_us=work["bytes"] / copy_bw * 1e6, span_us=float(end.max()),
                tflops_span=work["flops"] / (float(end.max()) * 1e-6) / 1e12,
                start_spread=float(np.sort(rel[:, 0])[min(len(rel), 132) - 1]),
                prologue_med=float(np.median(rel[:, 1] - rel[:, 0])),
                first_tile_med=float(np.median(rel[:, 2] - rel[:, 1])),
                first_tile_max=float((rel[:, 2] - rel[:, 1]).max()),
                tile_us_min=float(per_tile.min()), tile_us_med=float(np.median(per_tile)),
                tile_us_max=float(per_tile.max()),
                epilogue_med=float(np.median(rel[:, 4] - rel[:, 3])),
                slot5_med=float(np.median(rel[:, 5] - rel[:, 3])) if variant != "sm90t" else 0.0,
                # ss: the producer's first tile released, after the prologue's end
                p_first_med=float(np.median(rel[:, 5] - rel[:, 1])),
                end_p0=float(end.min()), end_p10=float(np.percentile(end, 10)),
                end_p50=float(np.median(end)), end_p90=float(np.percentile(end, 90)),
                sms=len(cnt), ctas_per_sm=sorted(set(cnt.tolist())),
                gap_med=float(np.median(gaps)) if gaps else 0.0,
                gap_max=float(np.max(gaps)) if gaps else 0.0,
                wave2_start_p0=float(rel[w2, 0].min()) if len(w2) else 0.0,
                wave2_start_p50=float(np.median(rel[w2, 0])) if len(w2) else 0.0,
                wave2_first_med=float(np.median(rel[w2, 2] - rel[w2, 0])) if len(w2) else 0.0,
                # the SM clock over each CTA's life (cycle counter / globaltimer), MHz
                sm_mhz_med=float(np.median((a[:, 9] - a[:, 8]) / (a[:, 4] - a[:, 0]) * 1e3)),
            )  # fmt: skip
            rows.append(r)
            print("trace", json.dumps({k: (round(v, 2) if isinstance(v, float) else v)
                                       for k, v in r.items()}), flush=True)  # fmt: skip
            np.save(os.path.join(outdir, f"trace_{label}_{s_k}_P{P}_{rep}.npy"), a)
        os.environ.pop("PAGEDATTN_MLA_TUNING", None)
        del q, kv, kw
    return rows


def ps_trace_probe(variants=("ss_ps",)):
    """Per-segment timeline of the persistent kernel (`gluon_mla_ps` TRACE slots), sparse V32
    b 128 s_q 2 top-k 2048: medians over CTAs (us) of each segment's wait for q (from the
    previous one's store), first pair, tile rate, epilogue; the producer's q issue and first
    tile release after the consumers' previous loop end; the span."""
    import numpy as np
    import triton

    import pagedattn.ops.mla.triton_mla_plan as M
    from pagedattn.ops.mla import tuning as mla_tuning

    q, kv, offs, kw, work = make_case("sparse", "v32", 576, 128, 8192, 128, 2, 64, 2048)
    out = []
    for v in variants:
        os.environ["PAGEDATTN_MLA_TUNING"] = json.dumps(VARIANTS[v])
        kw.pop("config", None)  # the previous variant's trace config
        fn = launcher(q, kv, offs, kw, 1)
        fn()
        tg = triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median")
        g = M.ps_plan(q.shape[0], kw["indices"].shape[1], q.device)[0]
        tr = torch.zeros(2 * g, 80, dtype=torch.int64, device="cuda")
        kw["config"] = mla_tuning.from_env().replace(trace=tr)
        for rep in range(2):
            a = _cold_trace(fn, tr)
            t0 = a[:, 0].min()
            us = lambda x: (x - t0) / 1e3  # noqa: E731
            nseg = a[:, 79]
            r = dict(variant=v, rep=rep, graph_us=tg * 1e3, nseg=sorted(set(nseg.tolist())),
                     start_med=float(np.median(us(a[:, 0]))))  # fmt: skip
            segs = []
            for s in range(int(nseg.max())):
                m = nseg > s
                qr, p1, le, fin = (us(a[m, 2 + 4 * s + k]) for k in range(4))
                prev_fin = us(a[m, 1 + 4 * s]) if s else us(a[m, 0])
                prev_le = us(a[m, 4 * s]) if s else us(a[m, 0])
                qi, t0r = us(a[m, 50 + 2 * s]), us(a[m, 51 + 2 * s])
                segs.append({k: round(float(np.median(x)), 2) for k, x in dict(
                    q_wait=qr - prev_fin, first_pair=p1 - qr, loop=le - qr, epi=fin - le,
                    q_issue_after_prev_loop=qi - prev_le, tile0_after_prev_loop=t0r - prev_le,
                    end=fin).items()})  # fmt: skip
            r["segments"] = segs
            mhz = (a[:, 76] - a[:, 77]) / (a[:, 78] - a[:, 0]) * 1e3
            r["sm_mhz_med"] = round(float(np.median(mhz)), 1)
            ends = [us(a[i, 5 + 4 * (nseg[i] - 1)]) for i in range(len(a))]
            r["end_p0_p50_max"] = [round(float(x), 1) for x in np.percentile(ends, [0, 50, 100])]
            out.append(r)
            print("pstrace", json.dumps(r), flush=True)
        os.environ.pop("PAGEDATTN_MLA_TUNING", None)
    return out


def tile_trace_summary(a, ps):
    """`tile_trace_probe`'s medians (us) of one TRACE 2 buffer a (int64 [CTAs, 394] from
    `gluon_mla_ss`, [CTAs, 464] from `gluon_mla_ps` where ps): the producer's steps of tiles
    2..29 (`ss_cross_tile`'s ticks e0..e4) and the consumers' of pairs 1..14 (their start,
    own `ready` passed, end), in SM cycles over the median SM clock of the CTAs' lives."""
    import numpy as np

    from pagedattn.ops.mla.sm90.gluon_mla import TILE_TRACE_SLOTS

    n = a.shape[0]
    base = a.shape[1] - TILE_TRACE_SLOTS  # after the kernel's own trace slots
    c0, c1, g0, g1 = (77, 76, 0, 78) if ps else (8, 9, 0, 4)  # cycles / time: start, end
    mhz = (a[:, c1] - a[:, c0]) / np.maximum(a[:, g1] - a[:, g0], 1) * 1e3
    cyc_us = float(np.median(mhz))  # SM cycles a us
    # the tile trace's layout (`gluon_mla._g_tile_slots`, `_g_pair_slots`)
    P = a[:, base : base + 256].reshape(n, 32, 8)[:, :, :5].astype(np.float64)
    C = a[:, base + 256 : base + 384].reshape(n, 2, 16, 4).astype(np.float64)
    pj, ci = slice(2, 30), slice(1, 15)

    def us(x, f=np.median):
        return round(float(f(x)) / cyc_us, 3)

    r = dict(
        sm_mhz=round(cyc_us, 1),
        p_wait_own=us(P[:, pj, 1] - P[:, pj, 0]),  # the own half's `empty`
        p_store=us(P[:, pj, 2] - P[:, pj, 1]),  # dequantized and stored (loads landed)
        p_wait_peer=us(P[:, pj, 3] - P[:, pj, 2]),  # the peer's `rempty`, copy issued
        p_wait_other=us(P[:, pj, 4] - P[:, pj, 3]),  # the other half's `empty`
        p_tile=us(P[:, 3:31, 0] - P[:, 2:30, 0]),
        p_next=us(P[:, 3:31, 0] - P[:, 2:30, 4]),  # release, next keys, next loads issued
        p_wait_own_mean=us(P[:, pj, 1] - P[:, pj, 0], np.mean),
        p_store_mean=us(P[:, pj, 2] - P[:, pj, 1], np.mean),
    )  # fmt: skip
    for w in range(2):
        r[f"c{w}_wait_ready"] = us(C[:, w, ci, 1] - C[:, w, ci, 0])
        r[f"c{w}_wait_ready_mean"] = us(C[:, w, ci, 1] - C[:, w, ci, 0], np.mean)
        r[f"c{w}_pair"] = us(C[:, w, ci, 3] - C[:, w, ci, 0])
    return r


def tile_trace_probe(variants, outdir, shared=("",)):
    """Per-tile timeline (SM cycles, TRACE 2) of the sparse V32 cluster seesaws, b 128 s_q 2
    h_q 128 top-k 2048: `gluon_mla_ss` (variant "ss") and `gluon_mla_ps` ("ss_ps*"), from a
    cold L2 (shared "": every key from HBM; "L2": every request's keys in L2). Medians in us
    over CTAs and steps 2..29 (tiles) / 1..14 (pairs) of: the producer's wait for its own
    half's `empty`, its dequantize-and-store, its wait for the peer's `rempty`, for the other
    half's `empty`, and the tile interval (from one tile's first wait to the next one's);
    each consumer's wait for its own tile's `ready` and the pair (`tile_trace_summary`). Raw
    rows into outdir/tiletrace_<variant>_<shared>_<rep>.npy."""
    import numpy as np
    import triton

    import pagedattn.ops.mla.triton_mla_plan as M
    from pagedattn.ops.mla import tuning as mla_tuning
    from pagedattn.ops.mla.sm90.gluon_mla import TILE_TRACE_SLOTS

    out = []
    for sh in shared:
        q, kv, offs, kw, work = make_case("sparse", "v32", 576, 128, 8192, 128, 2, 64, 2048,
                                          shared=sh)  # fmt: skip
        for v in variants:
            os.environ["PAGEDATTN_MLA_TUNING"] = json.dumps(VARIANTS[v])
            kw.pop("config", None)  # the previous variant's trace config
            ps = bool(VARIANTS[v].get("ss_persist"))
            fn = launcher(q, kv, offs, kw, 1)
            fn()
            tg = triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median")
            n = 2 * M.ps_plan(q.shape[0], kw["indices"].shape[1], q.device)[0] if ps else (
                2 * q.shape[0])  # fmt: skip
            base = 80 if ps else 10  # the kernel's own trace slots, then the tile trace
            width = base + TILE_TRACE_SLOTS
            tr = torch.zeros(n, width, dtype=torch.int64, device="cuda")
            kw["config"] = mla_tuning.from_env().replace(trace=tr)
            fn()
            tg_tr = triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median")
            for rep in range(2):
                a = _cold_trace(fn, tr)
                np.save(os.path.join(outdir, f"tiletrace_{v}_{sh or 'hbm'}_{rep}.npy"), a)
                r = dict(
                    variant=v,
                    shared=sh or "hbm",
                    rep=rep,
                    graph_us=round(tg * 1e3, 2),
                    graph_traced_us=round(tg_tr * 1e3, 2),
                    **tile_trace_summary(a, ps),
                )
                out.append(r)
                print("tiletrace", json.dumps(r), flush=True)
        os.environ.pop("PAGEDATTN_MLA_TUNING", None)
        del q, kv, kw
    return out


def roll_summary(outdir):
    """Correlations of the FP8 tw CTAs' tile rates (s_k 4096) between trace reps: same SM and
    pages (two reps of `fp8tw`), same SM only and same pages only (an `fp8tw` rep against an
    `fp8tw_roll` one, whose CTAs read the pages of the request b / 2 away)."""
    import glob

    import numpy as np

    def load(label):
        return [np.load(f) for f in sorted(glob.glob(f"{outdir}/trace_{label}_4096_P1_*.npy"))]

    def rates(a):  # us a tile of consumer 0's loop: (by SM id, by CTA)
        rel = (a[:, :6] - a[:, 0].min()) / 1e3
        by_cta = (rel[:, 3] - rel[:, 2]) / np.maximum(a[:, 7] - 1, 1)
        by_sm = np.full(int(a[:, 6].max()) + 1, np.nan)
        by_sm[a[:, 6]] = by_cta
        return by_sm, by_cta

    def corr(x, y):
        n = min(len(x), len(y))
        m = ~np.isnan(x[:n]) & ~np.isnan(y[:n])
        return round(float(np.corrcoef(x[:n][m], y[:n][m])[0, 1]), 2)

    base, roll = load("fp8tw"), load("fp8tw_roll")
    if not base or not roll:
        return {}
    h = len(base[0]) // 2
    rb, rr = [rates(a) for a in base], [rates(a) for a in roll]
    r = dict(
        same_sm_and_pages=[corr(x[0], y[0]) for i, x in enumerate(rb) for y in rb[i + 1 :]],
        same_sm=[corr(x[0], y[0]) for x in rb for y in rr],
        same_pages=[corr(x[1], np.roll(y[1], -h)) for x in rb for y in rr],
    )
    print("roll", json.dumps(r), flush=True)
    return r


def time_variants(case, q, kv, offs, kw, work, variants, parts, copy_bw, only="", cold=False):
    """Eager (twice) and graph-replay times of each launch variant and partition count
    (`only`: a regex the variant names must match, and P 1 only). cold: also the benchmark
    suite's time (`common.time_ms`: L2 evicted before every call, CUDA events around each)."""
    import triton

    rows = []
    for v in variants:
        if only and not re.fullmatch(only, v):
            continue
        for P in parts if not only else [p for p in parts if p in (None, 1)][:1]:
            os.environ["PAGEDATTN_MLA_TUNING"] = json.dumps(VARIANTS[v])
            fn = launcher(q, kv, offs, kw, P)
            try:
                fn()
                torch.cuda.synchronize()
                t = triton.testing.do_bench(fn, warmup=20, rep=120, return_mode="median")
                t2 = triton.testing.do_bench(fn, warmup=5, rep=60, return_mode="median")
                # the GPU's time alone (no host launch cost): replays of a captured graph
                tg = triton.testing.do_bench_cudagraph(fn, rep=60, return_mode="median")
            except Exception as e:  # noqa: BLE001
                print("FAIL", case, v, P, str(e)[:300], flush=True)
                continue
            if cold:
                from common import time_ms

                tc = time_ms(fn)
                row_cold = dict(ms_cold=tc, ms_cold_eager=tc.eager, ms_cold_graph=tc.graph)
            else:
                row_cold = {}
            row = dict(
                case=case, variant=v, P=P, ms=t, ms_repeat=t2, ms_graph=tg, **row_cold,
                frac_copy_graph=work["bytes"] / (tg * 1e-3) / copy_bw,
                tflops=work["flops"] / (t * 1e-3) / 1e12,
                gbs=work["bytes"] / (t * 1e-3) / 1e9,
                frac_copy=work["bytes"] / (t * 1e-3) / copy_bw,
            )  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    os.environ.pop("PAGEDATTN_MLA_TUNING", None)
    return rows


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/mla_bench"))
    ap.add_argument("--cases", default="")
    ap.add_argument("--checks", default="all", choices=["all", "ss", "st", "t", "none"])
    ap.add_argument("--ss-variants", default="ss", help="comma list: variants --checks ss runs")
    ap.add_argument("--t-variants", default="sm90t", help="comma list: variants --checks t runs")
    ap.add_argument("--variants", default="", help="regex: time only these variants (at P 1)")
    ap.add_argument("--shared", default="", help="also time 'L2' and/or 'none' (make_case)")
    ap.add_argument("--cold", action="store_true", help="also the suite's cold-L2 call time")
    ap.add_argument("--fixed", action="store_true", help="run fixed_cost_probe")
    ap.add_argument("--trace", default="", help="run trace_probe on the runs this regex finds")
    ap.add_argument("--ps-trace", default="", help="comma list: ps_trace_probe's variants")
    ap.add_argument("--tile-trace", default="", help="comma list: tile_trace_probe's variants")
    ap.add_argument("--tile-shared", default=",L2", help="comma list: tile_trace_probe's modes")
    ap.add_argument(
        "--once", default="", help="launch VARIANT 3 times a case, nothing else (under ncu)"
    )
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    if args.compile_only:
        rows = compile_only(os.path.join(args.out, "asm"), args.cases)
        with open(os.path.join(args.out, "compile.json"), "w") as fh:
            json.dump(rows, fh, indent=1)
        return

    if args.once:
        os.environ["PAGEDATTN_MLA_TUNING"] = json.dumps(VARIANTS[args.once])
        for name, mode, fmt, d_qk, b, s_k, h_q, s_q, ps, topk, _v, _p in CASES:
            if not args.cases or re.search(args.cases, name):
                shared = args.shared.split(",")[0]  # --once: the first --shared mode
                case = make_case(mode, fmt, d_qk, b, s_k, h_q, s_q, ps, topk, shared=shared)
                fn = launcher(*case[:4], 1)
                for _ in range(3):
                    fn()
                torch.cuda.synchronize()
        return

    res = dict(device=torch.cuda.get_device_name(), checks=[], timings=[])
    copy_bw, mm = ceilings()
    res.update(copy_bw=copy_bw, mm_flops=mm)
    print(f"copy {copy_bw / 1e9:.0f} GB/s, bf16 mm {mm / 1e12:.0f} TFLOP/s", flush=True)
    checks = [
        ("dense", "bf16", 576, 16, 1, 64, 0, None),
        ("dense", "rope_aware", 576, 128, 2, 16, 0, 3),
        ("sparse", "v32", 576, 128, 2, 64, 2048, None),
        ("sparse", "model1", 512, 64, 1, 64, 2048, 2),
        ("dense", "g64_e8m0", 576, 20, 4, 1, 0, None),
        ("dense", "bf16", 576, 128, 1, 64, 0, 2),
        ("sparse", "bf16", 576, 128, 2, 16, 2048, None),
        ("sparse", "rope_aware", 576, 64, 1, 64, 2048, 1),
        ("dense", "v32", 576, 20, 4, 1, 0, None),
        ("sparse", "bf16", 576, 1, 1, 1, 256, 2),
        ("dense", "rope_aware", 576, 16, 1, 64, 0, 1),
    ]
    if args.checks == "ss":  # the seesaw kernel (forced where another would serve)
        checks = [c + (v,) for v in args.ss_variants.split(",") for c in SS_CHECKS]
    if args.checks == "st":  # the TMA-fed seesaw
        checks = [c + (v,) for v in args.ss_variants.split(",") for c in ST_CHECKS]
    if args.checks == "t":  # the keys-as-M kernel
        checks = [c + (v,) for v in args.t_variants.split(",") for c in T_CHECKS]
    for c in checks if args.checks != "none" else []:
        os.environ["PAGEDATTN_MLA_TUNING"] = json.dumps(VARIANTS[c[8]] if len(c) > 8 else {})
        r = check_case(*c[:8])
        r["case"] = c
        res["checks"].append(r)
        print("check", c, r, flush=True)
    if args.fixed:
        res["fixed"] = fixed_cost_probe(copy_bw)
    if args.ps_trace:
        res["ps_trace"] = ps_trace_probe(args.ps_trace.split(","))
    if args.tile_trace:
        res["tile_trace"] = tile_trace_probe(
            args.tile_trace.split(","), args.out, args.tile_shared.split(",")
        )
    if args.trace:
        res["trace"] = trace_probe(copy_bw, args.out, args.trace)
        res["roll"] = roll_summary(args.out)
    table = []
    for name, mode, fmt, d_qk, b, s_k, h_q, s_q, ps, topk, variants, parts in CASES:
        if args.cases and not re.search(args.cases, name):
            continue
        for shared in [""] + [m for m in args.shared.split(",") if m]:
            if shared == "none" and mode != "sparse":
                continue
            q, kv, offs, kw, work = make_case(
                mode, fmt, d_qk, b, s_k, h_q, s_q, ps, topk, shared=shared
            )
            table += time_variants(f"{name} {shared}".strip(), q, kv, offs, kw, work,
                                   variants, parts, copy_bw, args.variants,
                                   args.cold)  # fmt: skip
        del q, kv, kw
        torch.cuda.empty_cache()
    os.environ.pop("PAGEDATTN_MLA_TUNING", None)
    res["timings"] = table
    with open(os.path.join(args.out, "mla_dev.json"), "w") as fh:
        json.dump(res, fh, indent=1)
    print(f"\ncopy {copy_bw / 1e9:.0f} GB/s   bf16 mm {mm / 1e12:.0f} TFLOP/s")
    print(
        f"{'case':28s} {'var':7s} {'P':>4s} {'ms':>8s} {'TFLOP/s':>8s} {'GB/s':>7s} {'copy':>5s}"
        f" {'graph ms':>8s} {'copy':>5s}"
    )
    for r in table:
        print(
            f"{r['case']:28s} {r['variant']:7s} {str(r['P']):>4s} {r['ms']:8.3f} "
            f"{r['tflops']:8.1f} {r['gbs']:7.0f} {r['frac_copy']:5.2f} {r['ms_graph']:8.3f} "
            f"{r['frac_copy_graph']:5.2f}" + (f" cold {r['ms_cold']:.4f}" if "ms_cold" in r else "")
        )
    for c in res["checks"]:
        print("check", c["case"], f"cos {c['cos']:.2e} max_abs {c['max_abs']:.2e}", c["nan"])
    for r in res.get("fixed", []):
        print("fixed (GPU ms)", {k: round(v, 4) for k, v in r.items()})


if __name__ == "__main__":
    main()
