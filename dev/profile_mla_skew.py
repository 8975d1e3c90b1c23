"""Where a skewed MLA decode step's time goes (issue 56): the decode kernel, its combine and
the gap between them, for bench_real's MLA cases (seeded lognormal lengths, one long among
short, uniform controls; d_qk 576 / d_v 512, page 64, bf16), from graph-replay wall times and
torch.profiler device times, on the shipped choice and on forced variants.

    python dev/profile_mla_skew.py [--out FILE]     (CASES=name,... VARIANTS="name;...")
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import bench_real as br  # noqa: E402
from common import copy_bandwidth  # noqa: E402
from profile_gqa_skew import measure, report  # noqa: E402

import pagedattn.ops.mla.triton_mla as TM  # noqa: E402
import pagedattn.ops.mla.worklist as WL  # noqa: E402
from pagedattn.operands import PagedOperand  # noqa: E402
from pagedattn.ops.mla.triton_mla import mla_decode_triton  # noqa: E402
from pagedattn.ops.mla.tuning import MLATuning  # noqa: E402
from pagedattn.testing import ragged_offsets  # noqa: E402

CASES = [
    ("h16 skew b64", ("lognormal", 3072), 64, 16),
    ("h16 skew b128", ("lognormal", 3072), 128, 16),
    ("h16 onelong", ("onelong", 32768, 300), 64, 16),
    ("h16 uniform b128", ("uniform", 4096), 128, 16),
    ("h128 skew b64", ("lognormal", 3072), 64, 128),
    ("h128 skew b128", ("lognormal", 3072), 128, 128),
    ("h128 onelong", ("onelong", 32768, 300), 64, 128),
    ("h128 uniform b128", ("uniform", 4096), 128, 128),
]

# shipped: the default tuning; runs: the contiguous runs forced (no one-wave items; the TMA-fed
# seesaw's too); st-runs: the TMA-fed seesaw on its runs (`wl_st_runs`, items where they fit
# two waves); items: the balanced item list (no runs); request-order: the item list in request
# order (`wl_order` 0; the default is by bucket of size); P: one partition count a batch.
# "merge=NS,DB,STAGES,WARPS": the shipped tuning with the combines'
# `worklist.MergeShape(ns, db, stages, num_warps)`; "runs+merge=...": a variant's tuning with
# that combine shape; 'tune={"wl_waves": 2}': the shipped tuning with those `MLATuning` knobs.
VARIANTS = {
    "shipped": {},
    "runs": {"wl_one_wave": False, "wl_st_runs": True},
    "st-runs": {"wl_st_runs": True},
    "items": {"wl_runs": False},
    "request-order": {"wl_order": 0},
    "P": {"balanced": False},
}


def _with_merge(variant: str, call):
    """`call` with the combines' shape of a "merge=NS,DB,STAGES,WARPS" variant (else as
    is)."""
    if "merge=" not in variant:
        return call
    ns, db, stages, warps = (int(x) for x in variant.split("merge=")[1].split(","))
    shape = WL.MergeShape(ns=ns, db=db, stages=stages, num_warps=warps)
    names = ("mla_runs_combine_triton", "mla_worklist_combine_triton")
    base = {n: getattr(TM, n) for n in names}

    def run():
        for n in names:
            setattr(TM, n, functools.partial(base[n], merge=shape))
        try:
            call()
        finally:
            for n in names:
                setattr(TM, n, base[n])

    return run


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    rows = []
    only = os.environ.get("CASES")
    names = os.environ.get("VARIANTS", ";".join(VARIANTS)).split(";")
    for name, spec, b, h_q in CASES:
        if only and name not in only.split(","):
            continue
        lens = br.draw_lengths(spec, b, 0)
        pc = br.mla_cache([s - 1 for s in lens], [1] * b, 64, h_q, dev, 0)
        op = PagedOperand(pc.inputs, pc.params, 0, "k")
        offs = ragged_offsets([1] * b, dev)
        q = torch.randn(b, h_q, 576, device=dev, dtype=torch.bfloat16)
        nbytes = sum(lens) * 576 * 2 + q.numel() * 2 + b * h_q * 512 * 2
        floor_us = nbytes / (bw * 1e3)
        ref = None
        for variant in names:
            try:
                knobs = (json.loads(variant[5:]) if variant.startswith("tune=")
                         else VARIANTS.get(variant.split("+")[0], {}))  # fmt: skip
                cfg = MLATuning().replace(**knobs)
            except Exception as e:  # a knob this tree lacks
                print(f"skip {variant}: {e}")
                continue
            out = torch.full((b, h_q, 512), float("nan"), device=dev, dtype=torch.bfloat16)
            row, ref = measure(
                name, variant, out, ref, floor_us,
                lambda: _with_merge(variant, lambda: mla_decode_triton(
                    q, op, offs, scale=576**-0.5, out=out, config=cfg)),
            )  # fmt: skip
            if row is not None:
                rows.append(row)
    report(rows, bw, args.out)


if __name__ == "__main__":
    main()
