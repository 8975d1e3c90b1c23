"""The read floor of the h_q 16 MLA decode benchmark: how fast can any kernel read the same
pages (the b 128, page 64 bf16 and rope-aware FP8 caches of `bench_mla.mla_cache`, through the
same shuffled lookup table, with FP8's per-token scales) under the same timing (`common.time_ms`:
graph replays, cold L2)? A Triton kernel XORs every 32-bit word of a request's pages (and its
scale words) into a register tile: SPLIT programs a request, UNROLL pages loaded a loop step.
Beside it, the shipped decode of both caches and a flat torch read of the same byte count.
The floors' bf16 / FP8 ratio is the speed-up the bytes and their layout allow.

    python3 bench/mla_read_floor.py [--s-k 4096,8192] [--out DIR]

H100 2026-11-22 (`bench/results/h100_2026-11-22_mla_read_floor.json`, copy 3033 GB/s), s_k
4096 / 8192: FP8 read at 114.6 / 224.5 us (four programs a request; one: 131.7 / 257.6), its
decode 124.6 / 235.3; bf16 read 201.3 / 398.0, decode 207.9 / 404.7. Floors' ratio 1.757 /
1.772, the decodes' 1.669 / 1.720. From s_k 4096 to 8192 all of them stream at 3.05-3.07 TB/s;
the decodes' fixed time is 13.9 (FP8) and 11.1 us (bf16) against the reader's 4.7. The flat
torch.sum reads at 0.19 of copy (an int64 accumulation), not a floor.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mla import mla_cache  # noqa: E402
from common import copy_bandwidth, print_row, time_ms, write_rows  # noqa: E402
from mla_batch_probe import ROW_BYTES, h16_call  # noqa: E402

from pagedattn import KVQuantConfig  # noqa: E402

CH = 2048  # words a row of a page's load (8 KB): FP8 pages hold 5, bf16 pages 9


@triton.jit
def _read_pages(KV, SC, LUT, OUT, lut_stride, n_pages, PAGE_W: tl.constexpr,
                SC_W: tl.constexpr, SPLIT: tl.constexpr, UNROLL: tl.constexpr,
                CH: tl.constexpr):  # fmt: skip
    """XOR of every word of pages lo .. lo + n_pages of request b's table row (program b *
    SPLIT + s reads part s), each page one masked [16, CH] load so that all its words are in
    flight at once."""
    NC: tl.constexpr = PAGE_W // CH
    pid = tl.program_id(0)
    b = pid // SPLIT
    lo = (pid % SPLIT) * n_pages
    c = tl.arange(0, 16)[:, None]
    offs = c * CH + tl.arange(0, CH)[None, :]
    acc = tl.zeros([CH], dtype=tl.int32)
    for i in range(0, n_pages, UNROLL):
        for u in tl.static_range(UNROLL):
            pg = tl.load(LUT + b * lut_stride + lo + i + u).to(tl.int64)
            acc = acc ^ tl.xor_sum(tl.load(KV + pg * PAGE_W + offs, mask=c < NC, other=0), 0)
            if SC_W > 0:
                acc = acc ^ tl.xor_sum(tl.load(SC + pg * SC_W + tl.arange(0, SC_W)), 0)
    tl.store(OUT + pid * CH + tl.arange(0, CH), acc)


def page_reader(inp, split: int, unroll: int, scales: bool):
    """A call that reads every page of `inp`'s lookup table (and the pages' scale words)."""
    kv = inp.kv_blocks.view(inp.kv_blocks.shape[0], -1).view(torch.int32)
    sc = inp.kv_scales
    sc_w = 0
    if scales and sc is not None:
        sc = sc.view(sc.shape[0], -1).view(torch.int32)
        sc_w = sc.shape[1]
    else:
        sc = kv
    lut = inp.lookup_table
    b, pages = lut.shape
    assert pages % (split * unroll) == 0 and kv.shape[1] % CH == 0
    out = torch.empty(b * split, CH, dtype=torch.int32, device=kv.device)

    def run():
        _read_pages[(b * split,)](kv, sc, lut, out, lut.stride(0), pages // split,
                                  PAGE_W=kv.shape[1], SC_W=sc_w, SPLIT=split, UNROLL=unroll,
                                  CH=CH, num_warps=8)  # fmt: skip

    return run


def calls(b: int, s_k: int, quant: KVQuantConfig | None) -> tuple[dict, int]:
    """The timed calls over one fresh cache (the shipped decode, the flat read, the page
    readers) and the cache's counted bytes."""
    _p, inp, op = mla_cache(b, s_k, 64, 16, quant)
    nbytes = b * s_k * ROW_BYTES["bf16" if quant is None else "rope_aware"]
    flat = inp.kv_blocks.view(-1).view(torch.int32)[: nbytes // 4]
    res = torch.empty((), dtype=torch.int64, device="cuda")
    out = {"decode": h16_call(b, op), "flat": lambda: torch.sum(flat, dim=0, out=res)}
    for split in (1, 2, 4, 8):
        for unroll in (1, 2):
            out[f"read s{split} u{unroll}"] = page_reader(inp, split, unroll, True)
    if quant is not None:
        out["read s2 u1 nosc"] = page_reader(inp, 2, 1, False)
    return out, nbytes


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--s-k", default="4096,8192")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    a = ap.parse_args()
    bw = copy_bandwidth() * 1e9
    rows = []
    for s_k in map(int, a.s_k.split(",")):
        for fmt in ("bf16", "rope_aware"):
            quant = KVQuantConfig.mla_rope_aware() if fmt != "bf16" else None
            fns, nbytes = calls(128, s_k, quant)
            for name, fn in fns.items():
                ms = time_ms(fn)
                r = dict(fmt=fmt, s_k=s_k, call=name, us=ms * 1e3,
                         us_graph=(ms.graph or float("nan")) * 1e3,
                         frac_copy=nbytes / (ms * 1e-3) / bw)  # fmt: skip
                rows.append(r)
                print_row(r, 2)
            del fns
            torch.cuda.empty_cache()
    write_rows(os.path.join(a.out, "mla_read_floor.json"), rows, copy_bw=bw)
    print(f"copy {bw / 1e9:.0f} GB/s")
    for s_k in map(int, a.s_k.split(",")):
        sel = [r for r in rows if r["s_k"] == s_k]
        best = {f: min(r["us"] for r in sel if r["fmt"] == f and r["call"].startswith("read"))
                for f in ("bf16", "rope_aware")}  # fmt: skip
        dec = {f: next(r["us"] for r in sel if r["fmt"] == f and r["call"] == "decode")
               for f in ("bf16", "rope_aware")}  # fmt: skip
        for r in sel:
            print(f"s_k {s_k} {r['fmt']:>10} {r['call']:>16} {r['us']:7.1f} us "
                  f"copy {r['frac_copy']:.3f}")  # fmt: skip
        print(f"s_k {s_k}: read floor bf16/fp8 {best['bf16'] / best['rope_aware']:.3f}, "
              f"decode {dec['bf16'] / dec['rope_aware']:.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
