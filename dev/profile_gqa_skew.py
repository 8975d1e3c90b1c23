"""Where a skewed GQA decode step's time goes (issue 56): the balanced work list's decode
kernel, its combine and the gap between them, with and without the step's plan, from
torch.profiler device times and graph-replay wall times. Cases are bench_real's (seeded
lognormal lengths, one long among short, a uniform control); GQA 32/8 d128 page 16 bf16.

    python dev/profile_gqa_skew.py [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import bench_real as br  # noqa: E402
from common import copy_bandwidth, time_ms  # noqa: E402

from pagedattn.operands import PagedOperand  # noqa: E402
from pagedattn.ops.mha import StepPlan  # noqa: E402
from pagedattn.ops.mha.selection import MHATuning  # noqa: E402
from pagedattn.ops.mha.triton_mha import mha_triton  # noqa: E402
from pagedattn.testing import ragged_offsets  # noqa: E402

CASES = [
    ("skew b32", ("lognormal", 1536), 32),
    ("skew b64", ("lognormal", 1536), 64),
    ("skew b128", ("lognormal", 1536), 128),
    ("skew b256", ("lognormal", 1536), 256),
    ("onelong 32k+63x200", ("onelong", 32768, 200), 64),
    ("onelong 32k+255x200", ("onelong", 32768, 200), 256),
    ("uniform b64 x4096", ("uniform", 4096), 64),
]

# list: the kernel derives one wave of items in every program; plan: the step's plan from the
# host's lengths (made once, as FlashInfer's plan()); device-plan: made on the device once (the
# grid: the plan's capacity); plan+planner: a device plan a call (the planner launch timed too);
# P: one partition count a batch (no list), for reference
VARIANTS = tuple(os.environ.get("VARIANTS", "list,plan,device-plan,plan+planner,P").split(","))


def _call(variant, q, k_op, v_op, offs, out, lens):
    if variant == "P":
        cfg = MHATuning(decode={"balanced": False})
        return lambda: mha_triton(q, k_op, v_op, offs, out=out, config=cfg)
    if variant == "list":
        return lambda: mha_triton(q, k_op, v_op, offs, out=out)
    if variant == "plan":
        plan = StepPlan(lens)
        return lambda: mha_triton(q, k_op, v_op, offs, out=out, plan=plan)
    if variant == "device-plan":
        plan = StepPlan()
        return lambda: mha_triton(q, k_op, v_op, offs, out=out, plan=plan)
    if variant.startswith("combine"):
        # probe "combineE_W[_D_S]": E partial elements a step, W warps, D output dims a
        # program, loads pipelined S deep
        import functools

        import pagedattn.ops.mha.triton_mha as TM

        r, w, *ds = (int(x) for x in variant[len("combine") :].split("_"))
        more = dict(dims_a_program=ds[0], stages=ds[1]) if ds else {}
        plan = StepPlan(lens)
        base = TM.worklist_combine_triton

        def run():
            TM.worklist_combine_triton = functools.partial(
                base, elems_a_step=r, num_warps=w, **more
            )
            try:
                mha_triton(q, k_op, v_op, offs, out=out, plan=plan)
            finally:
                TM.worklist_combine_triton = base

        return run
    return lambda: mha_triton(q, k_op, v_op, offs, out=out, plan=StepPlan())


def kernel_times(fn, n=20) -> dict[str, float]:
    """Mean device us a call of each kernel `fn` launches (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
    out: dict[str, float] = {}
    for e in prof.key_averages():
        if e.device_type.name == "CUDA":
            out[e.key[:40]] = round(e.device_time_total / n, 2)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    rows = []
    only = os.environ.get("CASES")
    for name, spec, b in CASES:
        if only and name not in only.split(","):
            continue
        lens = br.draw_lengths(spec, b, 0)
        pc = br.gqa_cache([s - 1 for s in lens], [1] * b, 16, 32, dev, 0)
        inp = pc.inputs
        k_op, v_op = PagedOperand(inp, pc.params, 0, "k"), PagedOperand(inp, pc.params, 0, "v")
        q = torch.randn(b, 32, 128, device=dev, dtype=torch.bfloat16)
        offs = ragged_offsets([1] * b, dev)
        nbytes = sum(lens) * 8 * 2 * 128 * 2 + 2 * q.numel() * 2
        floor_us = nbytes / (bw * 1e3)  # bw in GB/s
        ref = None
        for variant in VARIANTS:
            out = torch.full_like(q, float("nan"))
            fn = _call(variant, q, k_op, v_op, offs, out, [x - 1 for x in lens])
            fn()
            torch.cuda.synchronize()
            if ref is None:
                ref = out.float().clone()
            assert torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2), (name, variant)
            ms = time_ms(fn)
            us = float(ms.graph if getattr(ms, "graph", None) else ms) * 1e3
            kt = kernel_times(fn)
            row = dict(case=name, variant=variant, us=round(us, 1), floor_us=round(floor_us, 1),
                       frac=round(floor_us / us, 3), kernels=kt)  # fmt: skip
            rows.append(row)
            print(json.dumps(row), flush=True)
    report(rows, bw, args.out)


def report(rows: list[dict], bw: float, out: str | None) -> None:
    """Print the rows' table (case, variant, us, fraction of the floor, `ok` where a row has
    it, each kernel's device us) and write {copy_gbps, rows} to `out` (None: not written)."""
    print(f"\ncopy {bw:.0f} GB/s")
    print(f"{'case':<22} {'variant':>16} {'us':>8} {'frac':>6}  kernels (device us a call)")
    for r in rows:
        ks = ", ".join(f"{k.split('(')[0]} {v}" for k, v in r["kernels"].items())
        ok = "" if "ok" not in r else f" ok {int(r['ok'])}"
        print(f"{r['case']:<22} {r['variant']:>16} {r['us']:>8} {r['frac']:>6}{ok}  {ks}")
    if out:
        with open(out, "w") as f:
            json.dump(dict(copy_gbps=bw, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
