"""GQA decode at the shapes a model's decode step has (issue 57's bench_model, and serving):
short, nearly equal context lengths (prompt 512 plus the tokens decoded so far) and head dims
64 (Llama-3.2-1B) and 128 (Llama-3-8B), 32/8 heads, page 16, bf16. The decode kernel there ran
at ~0.55 of copy (1B, 29 us a layer against 16 us of bytes; bench_model's profile), far from the
long-context controls (0.98-1.01). This sweeps launch variants (`MHATuning.decode` fields) on
each shape, checks each against the float32 reference, and times graph replays beside
FlashInfer's decode wrapper on the same pages.

    python dev/sweep_gqa_decode.py [--out FILE]     # GPU; env SHAPES / VARIANTS filter by name
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import bench_real as br  # noqa: E402
from common import copy_bandwidth, flashinfer, time_ms  # noqa: E402
from profile_gqa_skew import kernel_times  # noqa: E402

from pagedattn import KVCacheParams, PagedOperand  # noqa: E402
from pagedattn.ops.mha.selection import MHATuning  # noqa: E402
from pagedattn.ops.mha.triton_mha import mha_triton  # noqa: E402
from pagedattn.testing import make_paged_cache, ragged_offsets  # noqa: E402

H_Q, H_KV, PAGE = 32, 8, 16

# (name, head dim, batch, lengths): "model" = 512 + U[0, 48] (a bench_model step), "serve" =
# lognormal median 600, sigma 0.6, clipped 32..4096 (bench-serve's prompts part-way decoded),
# "skew" / "onelong": bench_real's lognormal (median 1.5k) and 32k among 200s
SHAPES = [
    ("1b b64", 64, 64, "model"),
    ("8b skew b64", 128, 64, "skew"),
    ("8b onelong b64", 128, 64, "onelong"),
    ("1b b256", 64, 256, "model"),
    ("8b b64", 128, 64, "model"),
    ("8b b256", 128, 256, "model"),
    ("1b serve b256", 64, 256, "serve"),
    ("8b serve b128", 128, 128, "serve"),
    # small batches (latency-bound: a few CTAs, each a short chain of dependent loads); run
    # only when SHAPES names them
    *(
        (f"{m} b{b}", d, b, "model")
        for m, d in (("1b", 64), ("8b", 128))
        for b in (1, 4, 8, 16, 32)
    ),  # fmt: skip
    # the fixed cost and the marginal rate (b64, every row N keys), run only when SHAPES names
    # them
    *(
        (f"{m} b64 x{n}", d, 64, f"x{n}")
        for m, d in (("1b", 64), ("8b", 128))
        for n in (1, 64, 256, 512, 1024, 2048, 4096)
    ),  # fmt: skip
    ("8b b1 x1k", 128, 1, "1k"),
    ("8b b8 x1k", 128, 8, "1k"),
    ("8b skew b32", 128, 32, "skew"),
    # other head layouts (h_q / h_kv after the name's colon; default 32 / 8): Qwen3-30B-A3B
    # 32 / 4 d128, Qwen2.5-7B 28 / 4 (a group of 7), Qwen3-235B 64 / 4, gpt-oss 64 / 8 d64
    ("q3moe:32/4 b64", 128, 64, "model"),
    ("q3moe:32/4 b256", 128, 256, "model"),
    ("q25:28/4 b64", 128, 64, "model"),
    ("q3big:64/4 b64", 128, 64, "model"),
    ("oss:64/8 b64", 64, 64, "model"),
]

N_DEFAULT = 8  # the shapes run when SHAPES is not set

VARIANTS = {
    "base": {},
    "bn32": {"BLOCK_N": 32},
    "bn128": {"BLOCK_N": 128},
    "bn64": {"BLOCK_N": 64},
    "st8": {"num_stages": 8},
    "st6": {"num_stages": 6},
    "bn64 st8": {"BLOCK_N": 64, "num_stages": 8},
    "bn128 st8": {"BLOCK_N": 128, "num_stages": 8},
    "st3": {"num_stages": 3},
    "st4": {"num_stages": 4},
    "st2": {"num_stages": 2},
    "w2": {"num_warps": 2},
    "w4": {"num_warps": 4},
    "w8": {"num_warps": 8},
    "nohilo": {"hi_lo": False},
    "bn32 st3": {"BLOCK_N": 32, "num_stages": 3},
    "bn128 st3": {"BLOCK_N": 128, "num_stages": 3},
    "bn128 st2": {"BLOCK_N": 128, "num_stages": 2},
    "bn16 tma": {"BLOCK_N": 16, "tma": True},
    "bn16 tma st8": {"BLOCK_N": 16, "tma": True, "num_stages": 8},
    "order0": {"list_order": 0},
    "one P st2": {"balanced": False, "num_stages": 2},
    "min64": {"min_chunk": 64},
    "combine launch min128": {"fused_merge": False, "min_chunk": 128, "small_min_chunk": 128},
    # one item a row (no row split)
    "nosplit": {"min_chunk": 1 << 20, "small_min_chunk": 1 << 20},
    "merge st2": {"merge_stages": 2},
    "no cap": {"max_ctas_per_sm": 0},
    "cap5": {"max_ctas_per_sm": 5},
    "min128": {"min_chunk": 128, "small_min_chunk": 128},
    "min512": {"min_chunk": 512},
    "min1024": {"min_chunk": 1024},
    "combine launch min64": {"fused_merge": False, "min_chunk": 64, "small_min_chunk": 64},
    "waves2": {"waves": 2},
    "waves2 min128": {"waves": 2, "min_chunk": 128},
    "one P": {"balanced": False},
    "one P st3": {"balanced": False, "num_stages": 3},
    "one P st4": {"balanced": False, "num_stages": 4},
    "one P w2": {"balanced": False, "num_warps": 2},
    "one P bn32": {"balanced": False, "BLOCK_N": 32},
    "one P nohilo": {"balanced": False, "hi_lo": False},
    # probes of the balanced list's overheads (valid where every row is one item, as here:
    # each is checked against the reference): the grid cut to the rows' programs, the
    # combine launch left out, both
    "combine launch": {"fused_merge": False},
    "list exact grid": {"_exact": True},
    "list no combine": {"_nocomb": True},
    "list exact+nocomb": {"_exact": True, "_nocomb": True},
}


def _probe(knobs: dict, batch: int):
    """A context that cuts the balanced decode grid to `batch` rows' programs (`_exact`) and / or
    leaves the combine out (`_nocomb`), by patching `triton_mha`'s module names."""
    import contextlib

    import pagedattn.ops.mha.triton_mha as TM

    @contextlib.contextmanager
    def ctx():
        launch0, comb0 = TM.launch, TM.worklist_combine_triton

        def launch(kernel, grid, *a, **kw):
            if kw.get("BALANCED") and knobs.get("_exact"):
                grid = (batch * kw["H_KV"],)
            return launch0(kernel, grid, *a, **kw)

        TM.launch = launch
        if knobs.get("_nocomb"):
            TM.worklist_combine_triton = lambda *a, **k: None
        try:
            yield
        finally:
            TM.launch, TM.worklist_combine_triton = launch0, comb0

    return ctx


def resources(fn) -> dict:
    """Registers, spills and shared bytes of the decode kernel `fn` launches."""
    from pagedattn.ops.launch import recording

    with recording() as made:
        fn()
    for x in made:
        if "decode" in getattr(x.kernel, "__name__", str(x.kernel)) and x.compiled is not None:
            c = x.compiled
            return dict(regs=c.n_regs, spills=c.n_spills, smem=c.metadata.shared)
    return {}


def lengths(kind: str, b: int, rng: np.random.Generator) -> list[int]:
    if kind == "model":
        return [512 + int(x) for x in rng.integers(0, 49, b)]
    if kind in ("skew", "onelong"):  # bench_real's cases (seed 0)
        spec = ("lognormal", 1536) if kind == "skew" else ("onelong", 32768, 200)
        return br.draw_lengths(spec, b, 0)
    if kind == "1k":  # bench_real's host-cost cases
        return [1024] * b
    if kind.startswith("x"):  # every row the same N keys
        return [int(kind[1:])] * b
    x = np.exp(rng.normal(np.log(600), 0.6, b))
    return [int(v) for v in np.clip(x, 32, 4096)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    fi = None if os.environ.get("NO_PEER") else flashinfer()
    want_s = os.environ.get("SHAPES")
    want_v = os.environ.get("VARIANTS")
    rows = []
    for i, (name, d, b, kind) in enumerate(SHAPES):
        if (want_s and name not in want_s.split(",")) or (not want_s and i >= N_DEFAULT):
            continue
        seq = lengths(kind, b, np.random.default_rng(0))
        h_q, h_kv = H_Q, H_KV
        if ":" in name:
            h_q, h_kv = (int(x) for x in name.split(":")[1].split()[0].split("/"))
        p = KVCacheParams(torch.bfloat16, 1, h_kv, d, PAGE, num_q_heads=h_q, devices=[dev])
        pc = make_paged_cache(p, [s - 1 for s in seq], [1] * b,
                              generator=torch.Generator().manual_seed(0), device=dev)  # fmt: skip
        inp = pc.inputs
        inp.kv_blocks.normal_()
        k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
        q = torch.randn(b, h_q, d, device=dev, dtype=torch.bfloat16)
        offs = ragged_offsets([1] * b, dev)
        pool = inp.kv_blocks[:, :, 0]
        indptr, indices, last = br.page_lists(inp.lookup_table, seq, PAGE)
        ref = br.ref_gqa(q, offs, indptr, indices, last, pool, PAGE, d**-0.5)
        nbytes = sum(seq) * h_kv * 2 * d * 2 + 2 * q.numel() * 2
        floor_us = nbytes / (bw * 1e3)
        if fi is not None:
            for tc in (True, False):
                ws = torch.empty(br.WS_BYTES, dtype=torch.uint8, device=dev)
                w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
                try:
                    w.plan(indptr, indices, last, h_q, h_kv, d, PAGE,
                           q_data_type=torch.bfloat16, kv_data_type=torch.bfloat16)  # fmt: skip
                    res = w.run(q, pool).float()
                except RuntimeError as e:  # e.g. no kernel for a group of 7 without tensor cores
                    rows.append(dict(shape=name, variant=f"flashinfer tc={int(tc)}",
                                     error=str(e)[-120:]))  # fmt: skip
                    continue
                cos = br.cosine(res, ref)
                us = float(time_ms(lambda w=w: w.run(q, pool))) * 1e3
                row = dict(shape=name, variant=f"flashinfer tc={int(tc)}", us=round(us, 2),
                           floor_us=round(floor_us, 2), frac=round(floor_us / us, 3),
                           cos=round(cos, 6))  # fmt: skip
                rows.append(row)
                print(json.dumps(row), flush=True)
        for vname, knobs in VARIANTS.items():
            if want_v and vname not in want_v.split(","):
                continue
            cfg = MHATuning(decode={k: v for k, v in knobs.items() if not k.startswith("_")})
            out = torch.full_like(q, float("nan"))
            ctx = _probe(knobs, b)

            def fn(out=out, cfg=cfg, ctx=ctx):
                with ctx():
                    mha_triton(q, k_op, v_op, offs, out=out, config=cfg)

            try:
                fn()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001 - a variant that does not build is a row
                rows.append(dict(shape=name, variant=vname, error=str(e)[:200]))
                print(json.dumps(rows[-1]), flush=True)
                continue
            cos = br.cosine(out.float(), ref)
            us = float(time_ms(fn)) * 1e3
            row = dict(shape=name, variant=vname, us=round(us, 2), floor_us=round(floor_us, 2),
                       frac=round(floor_us / us, 3), cos=round(cos, 6), **resources(fn),
                       kernels=kernel_times(fn))  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    print(f"\ncopy {bw:.0f} GB/s")
    print(f"{'shape':<16} {'variant':>18} {'us':>8} {'frac':>6} {'cos':>9}")
    for r in rows:
        if "error" in r:
            print(f"{r['shape']:<16} {r['variant']:>18} ERROR {r['error'][:60]}")
            continue
        ks = ", ".join(f"{k.split('(')[0]} {v}" for k, v in r.get("kernels", {}).items())
        res = f"r{r['regs']} s{r['smem'] // 1024}K" if "regs" in r else ""
        print(
            f"{r['shape']:<16} {r['variant']:>18} {r['us']:>8} {r['frac']:>6} {r['cos']:>9} "
            f"{res:>9}  {ks}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(copy_gbps=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
