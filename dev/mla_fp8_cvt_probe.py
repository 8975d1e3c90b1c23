"""Do the e4m3 -> float16 conversions bound the rope-aware FP8 MLA decode's consumers
(`gluon_mla_tw`)? Development probe, issue 5; wrong values by design, never a library path.

Each consumer converts every e4m3 byte of its tile twice (K for S in `_g_deq_k`, V for P V in
`_g_deq_v`), with F2FP (`cvt.rn.f16x2.e4m3x2`, two elements an instruction). A mode swaps
those conversions for one PRMT a pair of bytes (each byte put in the high byte of a float16:
the same instruction count on the integer pipe; the values are wrong, the timing is what
counts):

    f2fp      the library's kernel
    prmt_k    K's conversions swapped (S wrong)
    prmt_v    V's conversions swapped (P V wrong)
    prmt_kv   both
    old       V's upcast as before 2026-11-28 (bytes upcast in cache order, the float16
              results paired by PRMT afterwards: two PRMT a 4 elements, not one)

    python bench/mla_fp8_cvt_probe.py --mode prmt_kv            # on a GPU: one mode, JSON out
    python bench/mla_fp8_cvt_probe.py --mode prmt_kv --compile-only --out DIR
                                                                # offline sm_90 SASS counts

Graph replays (`triton.testing.do_bench_cudagraph`) of b 128, h_q 16, page 64, s_k 4096 and
8192, from HBM and with every request reading request 0's pages (L2-resident). Each mode runs
in its own process (the patched helpers are resolved when the kernel compiles).

H200 (2026-11-28, record `bench/results/h200_2026-11-28_mla_fp8_cvt.json`): the upcasts do not
bound it. prmt_kv took 0.1010 / 0.0938 ms (s_k 4096, HBM / L2) against f2fp's 0.1041-0.1046 /
0.0924, prmt_k 0.1001 / 0.0923, prmt_v 0.1035 / 0.0936 (s_k 8192 L2: 0.1797 / 0.1767 / 0.1798
against 0.1769-0.1770). What fewer instructions in the P V step did give: `_g_deq_v` with V's
bytes interleaved before the upcast (one PRMT a 4 elements, the consumer's tile step 1005 -> 941
and 1198 -> 1120 sm_90 SASS instructions) 0.1036-0.1037 / 0.0898-0.0904 ms against old's
0.1061-0.1063 / 0.0931, s_k 8192 0.2038-0.2045 / 0.1719-0.1731 against 0.2088-0.2089 / 0.1784.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import torch  # noqa: E402

MODES = ("f2fp", "prmt_k", "prmt_v", "prmt_kv", "old")


def patch(mode: str) -> None:
    """Swap `gluon_mla`'s upcast helpers for `mode` before any kernel compiles."""
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl

    import pagedattn.ops.mla.sm90.gluon_mla as G

    @gluon.jit
    def _prmt_f16(raw):
        # 4 bytes in -> 2 registers of float16 pairs, each byte the high byte of its half
        return gl.inline_asm_elementwise(
            "prmt.b32 $0, $2, 0, 0x1404;\n\tprmt.b32 $1, $2, 0, 0x3424;",
            "=r,=r,r",
            [raw.to(gl.int8, bitcast=True)],
            dtype=gl.float16,
            is_pure=True,
            pack=4,
        )

    @gluon.jit
    def _probe_deq_k(raw, dot_l: gl.constexpr):
        x = _prmt_f16(raw)
        x = gl.permute(gl.reshape(x, [64, 4, 4, 2, 2]), (0, 2, 3, 1, 4))
        return gl.convert_layout(gl.reshape(x, [64, 64]), dot_l)

    @gluon.jit
    def _probe_deq_v(raw, dot_l: gl.constexpr):
        x = gl.permute(_prmt_f16(raw), (1, 0))
        x = gl.permute(gl.reshape(x, [4, 8, 8, 2, 16]), (2, 0, 3, 1, 4))
        return gl.convert_layout(gl.reshape(x, [512, 16]), dot_l)

    @gluon.jit
    def _old_deq_v(raw, dot_l: gl.constexpr):
        x = gl.permute(raw.to(gl.float16), (1, 0))
        x = gl.permute(gl.reshape(x, [4, 8, 8, 2, 16]), (2, 0, 3, 1, 4))
        return gl.convert_layout(gl.reshape(x, [512, 16]), dot_l)

    G._prmt_f16 = _prmt_f16
    if mode == "old":
        G._g_deq_v = _old_deq_v
    if mode in ("prmt_k", "prmt_kv"):
        G._g_deq_k = _probe_deq_k
    if mode in ("prmt_v", "prmt_kv"):
        G._g_deq_v = _probe_deq_v


def _tw_launcher(s_k: int, shared: str, fmt: str = "rope_aware", device: str = "cuda"):
    from gpu_mla_dev import _launcher, make_case

    import pagedattn.ops.mla.triton_mla as M

    M.TUNING.update({k: None for k in M.TUNING})
    if fmt == "rope_aware":
        M.TUNING.update(dict(gluon=True, sm90_t=True, sm90_tw=True))
    else:
        M.TUNING.update(dict(gluon=True, sm90_t=True, sm90_tw=False))
    q, kv, offs, kw, work = make_case(
        "dense", fmt, 576, 128 if device == "cuda" else 4, s_k, 16, 1, 64, 0, device=device,
        shared=shared,
    )  # fmt: skip
    return _launcher(q, kv, offs, kw, 1), work


def compile_only(mode: str, out: str) -> dict:
    """Offline sm_90 compile of the tw kernel under `mode`: instruction counts of its SASS."""
    from gpu_mla_dev import _capture, compile_offline

    fn, _ = _tw_launcher(256, "", device="cpu")
    launch = _capture(fn, True)
    r = compile_offline(launch, out, f"tw_{mode}")
    sass = open(os.path.join(out, f"tw_{mode}.sass")).read()
    for op in ("F2FP", "PRMT", "HGMMA", "LDS", "BAR.SYNC", "SHFL"):
        r[op] = len(re.findall(rf"\b{re.escape(op)}\b", sass))
    return r


def time_mode(mode: str) -> list[dict]:
    import triton

    rows = []
    cases = [(s, sh, "rope_aware") for s in (4096, 8192) for sh in ("", "L2")]
    if mode == "f2fp":
        cases += [(s, sh, "bf16") for s in (4096, 8192) for sh in ("", "L2")]
    for s_k, shared, fmt in cases:
        fn, _ = _tw_launcher(s_k, shared, fmt)
        fn()
        torch.cuda.synchronize()
        ts = [triton.testing.do_bench_cudagraph(fn, rep=80, return_mode="median") for _ in range(3)]
        r = dict(mode=mode if fmt == "rope_aware" else "bf16_t", s_k=s_k, shared=shared or "HBM",
                 ms=min(ts), ms_all=ts)  # fmt: skip
        rows.append(r)
        print(json.dumps(r), flush=True)
        del fn
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=MODES, default="f2fp")
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/cvt_probe"))
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    patch(args.mode)
    if args.compile_only:
        r = compile_only(args.mode, args.out)
        print(json.dumps({k: r[k] for k in r if k != "wgmma"}))
        return
    rows = time_mode(args.mode)
    with open(os.path.join(args.out, f"cvt_{args.mode}.json"), "w") as fh:
        json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), fh, indent=1)


if __name__ == "__main__":
    main()
