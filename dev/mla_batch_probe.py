"""Is the FP8 rope-aware h_q 16 MLA decode bound by DRAM or by its SMs at b 128 (128 CTAs on
132 SMs), and what do its scale reads cost? Times the default launches (graph replays, cold
L2, `common.time_ms`) of bf16 and rope-aware FP8 h_q 16, page 64, at batches around the SM
count: if 132 requests take as long as 128, the four idle SMs are lost throughput; if the time
grows with the bytes, DRAM bounds it. `--variants` times FP8 launch variants in alternating
rounds instead (`variant_probe`).

    python3 bench/mla_batch_probe.py [--variants base,sc0,...] [--out DIR]

H100 2026-11-22 (`bench/results/h100_2026-11-22_mla_fp8_stream.json`), s_k 4096, FP8 b 120 /
124 / 128 / 132: 118.0 / 120.8 / 123.1 / 128.3 us (bf16 203.7 / 204.1 / 208.5 / 213.9): the
time follows the bytes, so spreading the work over all 132 SMs would gain nothing. From b 128
to s_k 8192 added keys stream at 3.05 TB/s (bf16 3.09) on ~12.4 us of fixed time (bf16 13.0).
Every scale read from one address (sc0, L2-resident) takes 122.9 against 124.0 us at s_k
4096 and 233.3 against 235.1 at 8192: the 256-byte scale read a 40 KB tile, from its own
place in the scale buffer, costs the stream ~1%.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_mla import mla_cache  # noqa: E402
from common import copy_bandwidth, print_row, print_rows, time_ms, write_rows  # noqa: E402

from pagedattn import KVQuantConfig, mla_decode  # noqa: E402

ROW_BYTES = {"bf16": 1152, "rope_aware": 644}  # counted bytes a token (FP8: + its scale)


def h16_decode(b: int, s_k: int, quant: KVQuantConfig | None):
    """A bf16 (quant None) or FP8 MLA cache of b requests of s_k keys, page 64, and the default
    h_q 16 decode call over it (`h16_call`)."""
    return h16_call(b, mla_cache(b, s_k, 64, 16, quant)[2])


def h16_call(b: int, op):
    """The default h_q 16 decode call over operand `op` of b requests (fresh random queries, a
    preallocated output)."""
    q = torch.randn(b, 16, 576, device="cuda", dtype=torch.bfloat16)
    offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
    out = torch.empty(b, 16, 512, device="cuda", dtype=torch.bfloat16)
    return lambda: mla_decode(q, op, offs, scale=576**-0.5, out=out)


def variant_probe(bw: float, out_dir: str, names: list[str]) -> None:
    """FP8 b 128 h_q 16: graph replays of launch variants in alternating rounds (three each):
    "base" as shipped, "sc0" with every scale read from one address (`_Operand.sc_stride` 0:
    L2-resident; timing only, wrong values), or a `gpu_mla_dev.VARIANTS` name. What the
    per-token scale reads (256 bytes a 40 KB tile, from the scale buffer) cost the stream."""
    import gpu_mla_dev as D

    import pagedattn.ops.mla.triton_mla as M

    init = M._Operand.__init__

    def init_sc0(self, *a, **k):
        init(self, *a, **k)
        self.sc_stride = 0

    unknown = [n for n in names if n not in ("base", "sc0") and n not in D.VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}: base, sc0 or gpu_mla_dev.VARIANTS")
    rows = []
    for s_k in (2048, 4096, 8192):
        decode = h16_decode(128, s_k, KVQuantConfig.mla_rope_aware())
        for rnd in range(3):
            for name in names:
                M._Operand.__init__ = init_sc0 if name == "sc0" else init
                M.TUNING.update({k: None for k in M.TUNING})
                M.TUNING.update(D.VARIANTS.get(name, {}))  # base, sc0: as shipped
                try:
                    ms = time_ms(decode)
                finally:
                    M._Operand.__init__ = init
                    M.TUNING.update({k: None for k in M.TUNING})
                r = dict(s_k=s_k, variant=name, rnd=rnd, us_graph=ms.graph * 1e3, us=ms * 1e3)
                rows.append(r)
                print_row(r)
        torch.cuda.empty_cache()
    write_rows(os.path.join(out_dir, "mla_variant_probe.json"), rows, copy_bw=bw)
    for s_k in (2048, 4096, 8192):
        for name in names:
            g = [r["us_graph"] for r in rows if r["s_k"] == s_k and r["variant"] == name]
            print(f"s_k {s_k} {name:>12}: graph us min {min(g):.1f} all {[round(x, 1) for x in g]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--batches", default="64,120,124,128,132,136")
    ap.add_argument("--s-k", default="4096,8192")
    ap.add_argument(
        "--variants",
        default="",
        help="comma list: FP8 launch variants timed in alternating rounds (variant_probe)",
    )
    a = ap.parse_args()
    bw = copy_bandwidth() * 1e9  # bytes/s
    if a.variants:
        variant_probe(bw, a.out, a.variants.split(","))
        return
    rows = []
    for s_k in map(int, a.s_k.split(",")):
        for fmt in ("bf16", "rope_aware"):
            for b in map(int, a.batches.split(",")):
                quant = KVQuantConfig.mla_rope_aware() if fmt != "bf16" else None
                ms = time_ms(h16_decode(b, s_k, quant))
                nbytes = b * s_k * ROW_BYTES[fmt]
                r = dict(fmt=fmt, b=b, s_k=s_k, us=ms * 1e3, us_graph=ms.graph * 1e3,
                         us_per_128=ms * 1e3 * 128 / b, frac_copy=nbytes / (ms * 1e-3) / bw,
                         floor_us=nbytes / bw * 1e6)  # fmt: skip
                rows.append(r)
                print_row(r)
                torch.cuda.empty_cache()
    write_rows(os.path.join(a.out, "mla_batch_probe.json"), rows, copy_bw=bw)
    print(f"copy {bw / 1e9:.0f} GB/s")
    cols = [("fmt", ">10"), ("s_k", ">5"), ("b", ">4"), ("us", "7.1f"),
            ("us_per_128", "9.1f", "us/128req"), ("frac_copy", "5.3f", "copy")]  # fmt: skip
    print_rows(rows, cols)


if __name__ == "__main__":
    main()
