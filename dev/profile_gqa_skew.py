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
from pagedattn.ops.mha.triton_mha import mha_mixed_triton, mha_triton  # noqa: E402
from pagedattn.testing import ragged_offsets  # noqa: E402

CASES = [
    ("skew b32", ("lognormal", 1536), 32),
    ("skew b64", ("lognormal", 1536), 64),
    ("skew b128", ("lognormal", 1536), 128),
    ("skew b256", ("lognormal", 1536), 256),
    ("onelong 32k+63x200", ("onelong", 32768, 200), 64),
    ("onelong 32k+255x200", ("onelong", 32768, 200), 256),
    ("uniform b64 x4096", ("uniform", 4096), 64),
    ("uniform b1 x1024", ("uniform", 1024), 1),
    ("uniform b8 x1024", ("uniform", 1024), 8),
    # mixed steps: bench_real's decodes (lognormal) then prefill chunks (cached, new), one call
    ("mixed 56+8x512", ("lognormal", 1536), 56, ((1024, 512),) * 8),
    ("mixed 120+4x2048", ("lognormal", 1536), 120, ((4096, 2048),) * 4),
]
# cases run only when CASES names them
EXTRA = ("uniform b1 x1024", "uniform b8 x1024", "mixed 56+8x512", "mixed 120+4x2048")

# list: the kernel derives one wave of items in every program; plan: the step's plan from the
# host's lengths (made once, as FlashInfer's plan()); device-plan: made on the device once (the
# grid: the plan's capacity); plan+planner: a device plan a call (the planner launch timed too);
# P: one partition count a batch (no list), for reference; "twopass": the kernels' own list
# with the combine launch's short rows merged in two rounds of loads; "tune={json}": the
# step's plan with those decode tuning fields (`MHATuning(decode=...)`), e.g.
# tune={"min_chunk": 128}; "split=N": the step's plan made with work_plan.MAX_SPLIT N;
# "list": the kernels' own list (rows by bucket of size, the default); "list-split-first": that
# list with the split rows first (`list_order` 0)
_V = os.environ.get("VARIANTS", "list,plan,device-plan,plan+planner,P")
VARIANTS = tuple(_V.split(";" if ";" in _V else ","))


def _call(variant, q, k_op, v_op, offs, out, lens, num_decodes=None):
    if num_decodes is not None and variant.startswith("streams="):
        return _streams_call(json.loads(variant[8:]), q, k_op, v_op, offs, out, lens, num_decodes)
    if num_decodes is not None:  # a mixed step: the decodes lead it (`mha`'s num_decodes)
        cfg = MHATuning(decode=json.loads(variant[5:])) if variant.startswith("tune=") else None
        plan = StepPlan(lens)
        return lambda: mha_mixed_triton(q, k_op, v_op, offs, num_decodes, out=out, plan=plan,
                                        config=cfg)  # fmt: skip
    if variant.startswith("tune="):
        cfg = MHATuning(decode=json.loads(variant[5:]))
        plan = StepPlan(lens)
        return lambda: mha_triton(q, k_op, v_op, offs, out=out, plan=plan, config=cfg)
    if variant.startswith("split="):  # the step's plan made under another MAX_SPLIT (probe)
        import pagedattn.ops.mha.work_plan as WP

        plan = StepPlan(lens)
        keep, WP.MAX_SPLIT = WP.MAX_SPLIT, int(variant[6:])
        try:
            mha_triton(q, k_op, v_op, offs, out=out, plan=plan)  # plans now
        finally:
            WP.MAX_SPLIT = keep
        return lambda: mha_triton(q, k_op, v_op, offs, out=out, plan=plan)
    if variant == "P":
        cfg = MHATuning(decode={"balanced": False})
        return lambda: mha_triton(q, k_op, v_op, offs, out=out, config=cfg)
    if variant == "list":
        return lambda: mha_triton(q, k_op, v_op, offs, out=out)
    if variant == "list-split-first":  # the kernels' own list, split rows first
        cfg = MHATuning(decode={"list_order": 0})
        return lambda: mha_triton(q, k_op, v_op, offs, out=out, config=cfg)
    if variant == "plan":
        plan = StepPlan(lens)
        return lambda: mha_triton(q, k_op, v_op, offs, out=out, plan=plan)
    if variant == "device-plan":
        plan = StepPlan()
        return lambda: mha_triton(q, k_op, v_op, offs, out=out, plan=plan)
    if variant == "twopass":  # the combine launch's rows merged in two rounds of loads
        return _with_combine(lambda: mha_triton(q, k_op, v_op, offs, out=out), one_pass=False)
    if variant.startswith("combine"):
        # probe "combineE_W[_D_S]": E partial elements a step, W warps, D output dims a
        # program, loads pipelined S deep
        r, w, *ds = (int(x) for x in variant[len("combine") :].split("_"))
        more = dict(dims_a_program=ds[0], stages=ds[1]) if ds else {}
        plan = StepPlan(lens)
        return _with_combine(lambda: mha_triton(q, k_op, v_op, offs, out=out, plan=plan),
                             elems_a_step=r, num_warps=w, **more)  # fmt: skip
    return lambda: mha_triton(q, k_op, v_op, offs, out=out, plan=StepPlan())


def _with_combine(call, **kw):
    """`call` with the work-list combine launched with the keyword arguments `kw`
    (`triton_worklist.worklist_combine_triton`'s shape knobs), by patching `triton_mha`."""
    import functools

    import pagedattn.ops.mha.triton_mha as TM

    base = TM.worklist_combine_triton

    def run():
        TM.worklist_combine_triton = functools.partial(base, **kw)
        try:
            call()
        finally:
            TM.worklist_combine_triton = base

    return run


_SIDE: dict = {}


def _streams_call(opt, q, k_op, v_op, offs, out, lens, d):
    """A mixed step's two parts on two streams (probe, not a shipped path): the decode part on
    a side stream (priority opt["prio"], default 0) whose work list is planned for opt["sms"]
    SMs (default all), the prefill part on the current one, launched first when opt["first"]
    is "prefill"; joined before the call returns."""
    import pagedattn.ops.mha.triton_mha as TM
    from pagedattn.ops.masks import causal
    from pagedattn.ops.mha.selection import Device

    prio = int(opt.get("prio", 0))
    side = _SIDE.setdefault(prio, torch.cuda.Stream(priority=prio))
    facts = TM.device_facts(q.device)
    sms = int(opt.get("sms", facts.sms))
    plan = StepPlan(lens)
    kd, vd = TM._select_pair(k_op, v_op, 0, d)
    kp, vp = TM._select_pair(k_op, v_op, d, offs.shape[0] - 1)
    total_q = q.shape[0]

    def dec():
        base = TM.device_facts
        TM.device_facts = lambda device: Device(facts.sm90, sms, facts.hbm3e)
        try:
            with torch.cuda.stream(side):
                TM._full_path(q[:d], kd, vd, offs[: d + 1], mask=causal(), out=out[:d],
                              lse_out=None, max_q_len=1, plan=plan)  # fmt: skip
        finally:
            TM.device_facts = base

    def pre():
        TM._full_path(q, kp, vp, offs[d:], mask=causal(), out=out, lse_out=None,
                      rows=total_q - d)  # fmt: skip

    def run():
        main = torch.cuda.current_stream()
        side.wait_stream(main)
        for part in (pre, dec) if opt.get("first") == "prefill" else (dec, pre):
            part()
        main.wait_stream(side)

    return run


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
    for name, spec, b, *chunks in CASES:
        if (only and name not in only.split(",")) or (not only and name in EXTRA):
            continue
        chunks = chunks[0] if chunks else ()
        lens = br.draw_lengths(spec, b, 0)
        seq = list(lens) + [c + n for c, n in chunks]
        new = [1] * b + [n for _, n in chunks]
        pc = br.gqa_cache([s - n for s, n in zip(seq, new)], new, 16, 32, dev, 0)
        inp = pc.inputs
        k_op, v_op = PagedOperand(inp, pc.params, 0, "k"), PagedOperand(inp, pc.params, 0, "v")
        q = torch.randn(sum(new), 32, 128, device=dev, dtype=torch.bfloat16)
        offs = ragged_offsets(new, dev)
        nbytes = sum(seq) * 8 * 2 * 128 * 2 + 2 * q.numel() * 2
        floor_us = nbytes / (bw * 1e3)  # bw in GB/s (the bytes' floor; a mixed step's FLOPs
        # are in bench_real's roofline)
        ref = None
        for variant in VARIANTS:
            out = torch.full_like(q, float("nan"))
            row, ref = measure(
                name, variant, out, ref, floor_us,
                lambda: _call(variant, q, k_op, v_op, offs, out, [s - n for s, n in zip(seq, new)],
                              b if chunks else None),
            )  # fmt: skip
            if row is not None:
                rows.append(row)
    report(rows, bw, args.out)


def measure(name, variant, out, ref, floor_us, make):
    """(row, reference) of one variant: `make()` gives the call, which writes `out`; the first
    variant's output is the reference the others are checked against (`ok`); graph-replay and
    eager time, each kernel's device time. A variant that fails is printed, its row None."""
    try:
        fn = make()
        fn()
        torch.cuda.synchronize()
        if ref is None:
            ref = out.float().clone()
        ok = bool(torch.allclose(out.float(), ref, atol=2e-2, rtol=2e-2))
        ms = time_ms(fn)
        kt = kernel_times(fn)
    except Exception as e:  # noqa: BLE001 - a probe keeps the other variants
        print(f"{name} {variant} failed: {type(e).__name__}: {str(e)[:300]}", flush=True)
        return None, ref
    us = float(ms.graph if getattr(ms, "graph", None) else ms) * 1e3
    row = dict(case=name, variant=variant, us=round(us, 1), floor_us=round(floor_us, 1),
               frac=round(floor_us / us, 3), ok=ok, eager_us=round(ms.eager * 1e3, 1),
               kernels=kt)  # fmt: skip
    print(json.dumps(row), flush=True)
    return row, ref


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
