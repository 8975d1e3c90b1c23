"""Routed experts at decode shapes on the GPU: `ops.moe` (plan + gate_up + down with silu fused
+ token sum) under launch-shape variants, against the grouped-matmul path the models took
before (`torch._grouped_mm` with the sort and the expert-order sum) and the memory floor (the
routed experts' weights read once at the copy bandwidth measured in the same run). CUDA-graph
replays, fresh random weights and routings (`bench_moe.weights`; the records' calls drew them
with the global generator), outputs checked against the float32 reference.

    python dev/sweep_moe.py OUT.json [--only TEXT] [--variants A,B]  # shapes / variants whose
                                                                     # names contain TEXT / A..
    python dev/sweep_moe.py --ncu VARIANT [SHAPE [down]]   # 6 eager layers (or 6 down
                                                           # products), for ncu

Each variant's time is the whole layer's graph replay and each part's (the plan, the gate_up
product, the down product with silu fused, the token sum) in a graph of its own.
"""

from __future__ import annotations

import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from bench_moe import grouped_mm_layer, weights  # noqa: E402
from common import copy_bandwidth  # noqa: E402

from pagedattn.ops.moe import (  # noqa: E402
    MatmulShape,
    MoETuning,
    expert_matmul,
    moe_block_m,
    moe_plan,
    moe_sum,
)
from pagedattn.testing import cos_diff  # noqa: E402

SHAPES = {  # name: (T, k, E, H, I, fp8)
    "v2lite b64": (64, 6, 64, 2048, 1408, False),
    "v2lite b256": (256, 6, 64, 2048, 1408, False),
    "gpt-oss-20b b64 (bf16)": (64, 4, 32, 2880, 2880, False),
    "v3 b64 fp8": (64, 8, 256, 7168, 2048, True),
    "v2lite prefill 2048": (2048, 6, 64, 2048, 1408, False),
}
PARTS = ("plan", "gate_up", "down", "sum")


def _v(n, k, s, w=4, **kw):
    """Both decode shapes (plain and gated) set to one launch shape."""
    shape = MatmulShape(n, k, s, w, **kw)
    return MoETuning(decode=shape, gated=shape)


def _w(bm, n, k, s, w):
    """Blocks of at most `bm` rows (64 or 128), all of them at one launch shape."""
    shape = MatmulShape(n, k, s, w)
    if bm == 64:
        return MoETuning(rows_64=float("inf"), wide=shape)
    return MoETuning(wide=shape, wide128=shape)


VARIANTS = {
    "shipped": MoETuning(),
    "n32 k128 s4": _v(32, 128, 4),
    "n32 k128 s4 w2": _v(32, 128, 4, 2),
    "n32 k256 s3": _v(32, 256, 3),
    "n64 k128 s2": _v(64, 128, 2),
    "n64 k128 s3 w2": _v(64, 128, 3, 2),
    "n64 k64 s4": _v(64, 64, 4),
    "n64 k64 s4 w2": _v(64, 64, 4, 2),
    "n128 k128 s3": _v(128, 128, 3),
    "n128 k64 s3": _v(128, 64, 3),
    # blocks of 32 / 64 rows (`MoETuning.wide`; no 128-row blocks) and of 128 (rows_64, wide128)
    "wide n128 k64 s3 w8": _w(64, 128, 64, 3, 8),
    "wide n256 k64 s3 w8": _w(64, 256, 64, 3, 8),
    "wide n128 k64 s4 w4": _w(64, 128, 64, 4, 4),
    "wide bm128 n128 k64 s3 w8": _w(128, 128, 64, 3, 8),
    "wide bm128 n256 k64 s2 w8": _w(128, 256, 64, 2, 8),
    "wide bm128 n128 k64 s4 w8 (shipped)": _w(128, 128, 64, 4, 8),
}


def replay_us(fn, reps: int = 30) -> float:
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    g.replay()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(True), torch.cuda.Event(True)
    ts = []
    for _ in range(reps):
        start.record()
        g.replay()
        end.record()
        end.synchronize()
        ts.append(start.elapsed_time(end) * 1e3)
    ts.sort()
    return ts[len(ts) // 2]


def layer_data(T, k, E, H, inter, fp8):
    """x, the routing (ids, weights) and the (weights, scales) of gate_up and down, seed 0
    (`bench_moe.weights`)."""
    g = torch.Generator(device="cuda").manual_seed(0)
    wgu = weights(E, 2 * inter, H, fp8, "cuda", g)
    wd = weights(E, H, inter, fp8, "cuda", g)
    x = torch.randn(T, H, device="cuda", generator=g).bfloat16()
    ids = torch.stack([torch.randperm(E, device="cuda", generator=g)[:k] for _ in range(T)])
    return x, ids, torch.rand(T, k, device="cuda", generator=g), wgu, wd


def main() -> None:
    if sys.argv[1] == "--ncu":
        a = sys.argv[2:] + [None] * 2
        return ncu(a[0], a[1] or "v2lite b64", a[2] == "down")
    out_path = sys.argv[1]
    only = sys.argv[sys.argv.index("--only") + 1] if "--only" in sys.argv else ""
    pick = sys.argv[sys.argv.index("--variants") + 1].split(",") if "--variants" in sys.argv else []
    gbps = copy_bandwidth()
    rows = []
    print(f"copy {gbps:.0f} GB/s")
    for name, (T, k, E, H, inter, fp8) in SHAPES.items():
        if only and only not in name:
            continue
        x, ids, rw, (wgu, sgu), (wd, sd) = layer_data(T, k, E, H, inter, fp8)
        hit = int(torch.unique(ids).numel())
        wbytes = hit * (wgu[0].numel() * wgu.element_size() + wd[0].numel() * wd.element_size())
        floor_us = wbytes / gbps / 1e3

        parts = {
            "plan": lambda tun, be: moe_plan(
                ids, E, block_m=(tun or MoETuning()).block_m(T * k, E), backend=be),
            "gate_up": lambda tun, be: expert_matmul(x, wgu, ctx["plan"], w_scale=sgu,
                                                     activation="silu_mul", backend=be,
                                                     tuning=tun),
            "down": lambda tun, be: expert_matmul(
                ctx["h"], wd, ctx["plan"], w_scale=sd, row_weights=rw,
                out_dtype=torch.float32, backend=be, tuning=tun),
            "sum": lambda tun, be: moe_sum(ctx["y"], k, out_dtype=torch.bfloat16, backend=be),
        }  # fmt: skip
        ctx: dict = {}

        def fused(tuning=None, backend=None):
            ctx["plan"] = parts["plan"](tuning, backend)
            ctx["h"] = parts["gate_up"](tuning, backend)
            ctx["y"] = parts["down"](tuning, backend)
            return parts["sum"](tuning, backend)

        ref = fused(backend="reference").float()
        res = dict(shape=name, T=T, k=k, E=E, H=H, I=inter, fp8=fp8, experts_hit=hit,
                   weight_bytes=wbytes, floor_us=round(floor_us, 2), variants={})  # fmt: skip
        for vname, tun in VARIANTS.items():
            if pick and not any(p in vname for p in pick):
                continue
            try:
                o = fused(tun).float()
                cd = cos_diff(o, ref)
                us = replay_us(lambda tun=tun: fused(tun))
                pus = {p: round(replay_us(lambda p=p, tun=tun: parts[p](tun, None)), 2)
                       for p in PARTS}  # fmt: skip
                res["variants"][vname] = dict(us=round(us, 2), of_floor=round(floor_us / us, 3),
                                              cos_diff=cd, parts_us=pus)  # fmt: skip
                print(
                    f"{name:24} {vname:18} {us:8.1f} us {floor_us / us:.3f} of floor  "
                    + " ".join(f"{p} {v:.1f}" for p, v in pus.items())
                    + f"  cos {cd:.0e}"
                )
            except Exception as e:  # noqa: BLE001 - a variant that fails to build is reported
                res["variants"][vname] = dict(error=str(e)[:300])
                print(f"{name:24} {vname:16} error {str(e)[:120]}")
        if not fp8:

            def grouped():
                return grouped_mm_layer(x, ids, rw, wgu, wd)

            cd = cos_diff(grouped().float(), ref)
            us = replay_us(grouped)
            res["grouped_mm"] = dict(us=round(us, 2), of_floor=round(floor_us / us, 3),
                                     cos_diff=cd)  # fmt: skip
            print(
                f"{name:24} {'grouped_mm':16} {us:9.1f} us  {floor_us / us:.3f} of floor  "
                f"cos diff {cd:.1e}"
            )
        rows.append(res)
        wgu = wd = sgu = sd = None  # the next shape's weights in their place
        torch.cuda.empty_cache()
    env = dict(device=torch.cuda.get_device_name(), torch=torch.__version__, copy_gbps=gbps,
               date=time.strftime("%Y-%m-%d"))  # fmt: skip
    with open(out_path, "w") as f:
        json.dump(dict(env=env, shapes=rows), f, indent=1)


def ncu(variant: str, shape: str, down_only: bool = False) -> None:
    """Six eager layers of `shape` under `variant` (dev/ncu_profile.sh skips the first two), or
    one gate_up product and six down products."""
    T, k, E, H, inter, fp8 = SHAPES[shape]
    tun = VARIANTS[variant]
    x, ids, rw, (wgu, sgu), (wd, sd) = layer_data(T, k, E, H, inter, fp8)
    plan = moe_plan(ids, E, block_m=moe_block_m(T * k, E))
    h = expert_matmul(x, wgu, plan, w_scale=sgu, activation="silu_mul", tuning=tun)
    for _ in range(6):
        if not down_only:
            plan = moe_plan(ids, E, block_m=moe_block_m(T * k, E))
            h = expert_matmul(x, wgu, plan, w_scale=sgu, activation="silu_mul", tuning=tun)
        y = expert_matmul(h, wd, plan, w_scale=sd, row_weights=rw, out_dtype=torch.float32,
                          tuning=tun)  # fmt: skip
        if not down_only:
            moe_sum(y, k, out_dtype=torch.bfloat16)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
