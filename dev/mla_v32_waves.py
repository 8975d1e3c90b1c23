"""How much of the sparse V32 h_q 128 decode's time is per-CTA fixed cost and wave
quantization? Times the default launch (the 2-CTA cluster seesaw; graph replays, cold L2,
`common.time_ms`) of sparse V32, s_q 2, page 64, s_k 8192:

- over batches around whole waves (a token's two head blocks are one cluster, so b requests
  launch 4 b CTAs: b 33 fills the 132 SMs once, b 128 takes 3.88 waves);
- over top-k at b 128 (the slope is the time a tile, the intercept the CTAs' fixed cost
  times the waves), from HBM and with no key loaded (every index invalid).

    python3 bench/mla_v32_waves.py [--out DIR]

H100 2026-11-23 (`bench/results/h100_2026-11-23_mla_v32_fixed.json`): b 16 / 32 / 33 / 34 / 64 /
66 / 67 / 128 / 132 take 75 / 116 / 117 / 225 / 226 / 227 / 334 / 444 / 448 us (66 clusters a
wave); at b 128 top-k 512 / 1024 / 2048 / 4096 take 158 / 254 / 448 / 837 us from HBM and 131 /
209 / 366 / 679 with no key loaded: ~3.0 (2.4) us a tile and 12-15 (13) us a CTA besides.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import print_row, print_rows, time_ms, write_rows  # noqa: E402
from gpu_mla_dev import _launcher, make_case  # noqa: E402


def run(b: int, topk: int, shared: str = "") -> dict:
    q, kv, offs, kw, work = make_case("sparse", "v32", 576, b, 8192, 128, 2, 64, topk,
                                      shared=shared)  # fmt: skip
    ms = time_ms(_launcher(q, kv, offs, kw, None))
    r = dict(b=b, topk=topk, shared=shared or "hbm", ctas=4 * b, waves=4 * b / 132,
             us=ms * 1e3, us_graph=(ms.graph or ms) * 1e3,
             tflops=work["flops"] / (ms * 1e-3) / 1e12)  # fmt: skip
    print_row(r)
    del q, kv, kw
    torch.cuda.empty_cache()
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp"))
    ap.add_argument("--batches", default="16,32,33,34,64,66,67,96,99,100,128,132")
    ap.add_argument("--topks", default="512,1024,2048,3072,4096")
    a = ap.parse_args()
    rows = [run(b, 2048) for b in map(int, a.batches.split(","))]
    for shared in ("", "none"):
        rows += [run(128, k, shared) for k in map(int, a.topks.split(","))]
    write_rows(os.path.join(a.out, "mla_v32_waves.json"), rows)
    print_rows(rows, [("b", "4d"), ("topk", "5d"), ("shared", ">5", "keys"), ("waves", "6.2f"),
                      ("us", "8.1f"), ("tflops", "8.1f", "TFLOP/s")])  # fmt: skip


if __name__ == "__main__":
    main()
