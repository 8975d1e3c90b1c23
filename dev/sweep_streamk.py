"""The stream-K linear (`ops.linear.linear`, triton) against cuBLAS at a decode step's shapes.

Shapes: the projections of Llama-3.2-1B and Llama-3-8B (qkv, o, gate_up, and down with the
SwiGLU activation fused, whose cuBLAS counterpart is `ops.fused.silu_mul` then `F.linear`), at
M rows (a decode batch). Each variant is a `StreamKConfig`; "cublas" is torch's F.linear.

Timing: R copies of the weight (R * bytes >= 512 MB, so the weights stream from HBM as in a
model step, not from L2), one CUDA graph of R calls over them in turn, replayed; us a call, and
its fraction of the copy roofline (weight + x + y bytes over the copy bandwidth of this run).
Correctness first: each variant's output against float64 (|err| <= 2 ulp of bf16 of the
reference's magnitude + K * 2^-20 of the sum of |products|), and two calls bit for bit.

Env: SHAPES (comma list of names), MS (comma list of rows), VARIANTS (comma list of names).
Usage (GPU): python dev/sweep_streamk.py [OUT.json]
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from common import copy_bandwidth  # noqa: E402

from pagedattn.ops.fused import silu_mul  # noqa: E402
from pagedattn.ops.linear.dense import StreamKConfig, linear  # noqa: E402

SHAPES = {
    "1b_qkv": (3072, 2048, False),
    "1b_o": (2048, 2048, False),
    "1b_gate_up": (16384, 2048, False),
    "1b_down": (2048, 8192, True),
    "8b_qkv": (6144, 4096, False),
    "8b_o": (4096, 4096, False),
    "8b_gate_up": (28672, 4096, False),
    "8b_down": (4096, 14336, True),
}
C = StreamKConfig
VARIANTS = {
    "bn64_bk128_s4": C(max_rows=128),
    "bn64_bk64_s6": C(block_k=64, stages=6, max_rows=128),
    "bn64_bk64_s4_c2": C(block_k=64, stages=4, ctas_per_sm=2, max_rows=128),
    "bn128_bk64_s4": C(block_n=128, block_k=64, max_rows=128),
    "bn64_bk128_s3": C(stages=3, max_rows=128),
    "bn32_bk128_s4": C(block_n=32, max_rows=128),
    "bn64_bk256_s3": C(block_k=256, stages=3, max_rows=128),
}


def pick(env: str, names):
    v = os.environ.get(env)
    return [n for n in v.split(",") if n] if v else list(names)


def cublas(x, w, act):
    return F.linear(silu_mul(x) if act else x, w)


def main() -> None:
    out_path = sys.argv[1] if len(sys.argv) > 1 else None
    dev = torch.device("cuda")
    bw = copy_bandwidth()  # GB/s
    print(f"copy {bw:.0f} GB/s")
    rows = []
    for shape in pick("SHAPES", SHAPES):
        N, K, act = SHAPES[shape]
        wbytes = N * K * 2
        R = max(2, -(-512 * 2**20 // wbytes))
        g = torch.Generator(device=dev).manual_seed(0)
        ws = [torch.randn(N, K, device=dev, generator=g, dtype=torch.bfloat16) * K**-0.5
              for _ in range(R)]  # fmt: skip
        for M in [int(m) for m in pick("MS", ["1", "16", "64", "128"])]:
            x = torch.randn(M, 2 * K if act else K, device=dev, generator=g).bfloat16()
            xr = x.double()
            if act:
                xr = silu_mul(x).double()
            ref = xr @ ws[0].double().T
            mag = (xr.abs() @ ws[0].double().abs().T)
            tol = 2 * 2.0**-8 * ref.abs() + K * 2.0**-20 * mag + 1e-6
            floor_us = (wbytes + x.numel() * 2 + M * N * 2) / bw / 1e3
            res = dict(shape=shape, M=M, N=N, K=K, act=act, floor_us=round(floor_us, 2))
            for v in ["cublas", *pick("VARIANTS", VARIANTS)]:
                if v == "cublas":
                    def fn(w, x=x, act=act):
                        return cublas(x, w, act)
                else:
                    cfg = VARIANTS[v]

                    def fn(w, x=x, act=act, cfg=cfg):
                        return linear(x, w, act="silu_mul" if act else None, config=cfg,
                                      backend="triton")  # fmt: skip
                try:
                    y1, y2 = fn(ws[0]), fn(ws[0])
                    err = ((y1.double() - ref).abs() - tol).max().item()
                    ok = err <= 0 and bool(torch.equal(y1, y2))
                    s = torch.cuda.Stream()
                    s.wait_stream(torch.cuda.current_stream())
                    with torch.cuda.stream(s):
                        for w in ws:
                            fn(w)
                    torch.cuda.synchronize()
                    graph = torch.cuda.CUDAGraph()
                    with torch.cuda.graph(graph, stream=s):
                        for w in ws:
                            fn(w)
                    graph.replay()
                    torch.cuda.synchronize()
                    times = []
                    for _ in range(15):
                        a, b = torch.cuda.Event(True), torch.cuda.Event(True)
                        a.record()
                        graph.replay()
                        b.record()
                        b.synchronize()
                        times.append(a.elapsed_time(b) * 1e3 / R)
                    us = sorted(times)[len(times) // 2]
                    res[v] = dict(us=round(us, 2), frac=round(floor_us / us, 3), ok=ok,
                                  err=err)  # fmt: skip
                    del graph
                except Exception as e:  # noqa: BLE001
                    res[v] = dict(error=repr(e)[:200])
            rows.append(res)
            best = min((k for k in res if isinstance(res[k], dict) and "us" in res[k]
                        and k != "cublas"), key=lambda k: res[k]["us"], default=None)  # fmt: skip
            cb = res["cublas"].get("us")
            line = " ".join(
                f"{k}={res[k]['us']:.1f}{'' if res[k]['ok'] else '!'}"
                if "us" in res[k] else f"{k}=ERR"
                for k in res if isinstance(res[k], dict)
            )  # fmt: skip
            print(f"{shape:11s} M{M:<4d} floor {floor_us:6.1f}  {line}  best {best} "
                  f"x{cb / res[best]['us']:.2f}" if best and cb else f"{shape} M{M} {line}")
        del ws
        torch.cuda.empty_cache()
    if out_path:
        with open(out_path, "w") as f:
            json.dump(dict(copy_gbps=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
