"""Per-CTA timeline of the keys-as-M MLA decode on its contiguous runs (h_q 16), for
bench_real's MLA steps (seeded lognormal lengths, one long among short, the uniform control):
where a skewed step's decode time goes against its bytes.

Each CTA's start and end (globaltimer, `MLATuning.trace`), with its piece's blocks and
segments from the host mirror of the runs (`worklist.mla_host_runs`), fitted as
busy = a + b x blocks + c x segments (least squares over the CTAs): b is a block's time, c a
segment's cost beyond its blocks (q, the ring's fill, the store), a the CTA's fixed part. Also
the launch's start spread, the ends' spread (the makespan against the median CTA) and the
graph-replay time of the decode with its combine.

    python dev/trace_mla_runs.py [--tunes '[{}, {"wl_overhead": 4}]'] [--out F.json]
                                                     (CASES="h16 skew b64,...")

`--tunes`: `MLATuning` knobs a variant, each traced and timed (graph replays of the decode
and its combine).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np
import torch
import triton

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "bench"))
import bench_real as br  # noqa: E402
from common import cold_l2, copy_bandwidth  # noqa: E402

from pagedattn.cache.dispatch import num_sms  # noqa: E402
from pagedattn.operands import PagedOperand  # noqa: E402
from pagedattn.ops.mla import worklist as WL  # noqa: E402
from pagedattn.ops.mla.sm90.gluon_mla import RUNS_TRACE_SLOTS  # noqa: E402
from pagedattn.ops.mla.triton_mla import mla_decode_triton  # noqa: E402
from pagedattn.ops.mla.tuning import MLATuning  # noqa: E402
from pagedattn.testing import ragged_offsets  # noqa: E402

CASES = [
    ("h16 skew b64", ("lognormal", 3072), 64),
    ("h16 skew b128", ("lognormal", 3072), 128),
    ("h16 skew b256", ("lognormal", 3072), 256),
    ("h16 onelong", ("onelong", 32768, 300), 64),
    ("h16 uniform b128", ("uniform", 4096), 128),
]


def piece_work(lens: list[int], run_p: int, cfg: MLATuning):
    """(blocks, segments) of each of the run_p pieces, from the host mirror of the runs; None
    where the launch takes one wave of items instead."""
    offs = torch.arange(len(lens) + 1, dtype=torch.int32)
    cl = torch.tensor([s - 1 for s in lens], dtype=torch.int32)
    kw = dict(tpt=1, bn=64, ovh=cfg.wl.wl_overhead, run_p=run_p, run_min=cfg.wl.wl_run_min_blocks)
    if WL.mla_host_run_programs(offs, cl, item_waves=1, **kw)[0]:
        return None
    runs = WL.mla_host_runs(offs, cl, **kw)
    blocks = np.array([sum(hi - lo for _, lo, hi, _, _ in segs) for segs in runs], float)
    segs = np.array([len(segs) for segs in runs], float)
    return blocks, segs


def parts(t: np.ndarray) -> dict:
    """Median us of each step of a CTA's timeline (TRACE 3 slots; the last tile's for 10-14)."""
    steps = {"zero ring": (0, 15), "derive runs": (15, 5), "to last tile": (5, 13),
             "key range": (13, 10), "ring fill": (10, 11), "q store": (11, 1),
             "first block": (1, 2), "loop": (2, 3), "store": (3, 14),
             "to end": (14, 4)}  # fmt: skip
    return {k: round(float(np.median(t[:, b] - t[:, a])) / 1e3, 2) for k, (a, b) in steps.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tunes", default="[{}]")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--out", default=None)
    a = ap.parse_args()
    tunes = json.loads(a.tunes)
    dev = torch.device("cuda")
    bw = copy_bandwidth()
    only = os.environ.get("CASES")
    rows = []
    for name, spec, b in CASES:
        if only and name not in only.split(","):
            continue
        lens = br.draw_lengths(spec, b, 0)
        pc = br.mla_cache([s - 1 for s in lens], [1] * b, 64, 16, dev, 0)
        op = PagedOperand(pc.inputs, pc.params, 0, "k")
        offs = ragged_offsets([1] * b, dev)
        q = torch.randn(b, 16, 576, device=dev, dtype=torch.bfloat16)
        out = torch.empty(b, 16, 512, device=dev, dtype=torch.bfloat16)
        floor_us = (sum(lens) * 576 * 2 + q.numel() * 2 + out.numel() * 2) / (bw * 1e3)
        for knobs in tunes:
            cfg = MLATuning().replace(**knobs)
            fn = lambda c=cfg: mla_decode_triton(q, op, offs, scale=576**-0.5, out=out, config=c)  # noqa: E731
            fn()
            graph_us = triton.testing.do_bench_cudagraph(fn, rep=100, return_mode="median") * 1e3
            tr = torch.zeros(4096, RUNS_TRACE_SLOTS, dtype=torch.int64, device=dev)  # TRACE 3
            traced = cfg.replace(trace=tr)
            fn(traced)
            for rep in range(a.reps):
                tr.zero_()
                cold_l2()
                torch.cuda.synchronize()
                fn(traced)
                torch.cuda.synchronize()
                t = tr.cpu().numpy()
                t = t[t[:, 0] != 0]
                run_p = len(t)
                rel = (t[:, [0, 1, 2, 3, 4]] - t[:, 0].min()) / 1e3
                start, end = rel[:, 0], rel[:, 4]
                busy = end - start
                work = piece_work(lens, run_p, cfg)
                r = dict(case=name, tune=knobs, rep=rep, ctas=run_p, sms=num_sms(dev),
                         graph_us=round(graph_us, 2),
                         floor_us=round(floor_us, 2), span_us=round(float(end.max()), 2),
                         start_p50=round(float(np.median(start)), 2),
                         start_max=round(float(start.max()), 2),
                     derived_p50=round(float(np.median((t[:, 5] - t[:, 0]) / 1e3)), 2),
                         end_p10=round(float(np.percentile(end, 10)), 2),
                         end_p50=round(float(np.median(end)), 2),
                         end_max=round(float(end.max()), 2),
                         busy_p50=round(float(np.median(busy)), 2),
                         last_seg_first_tile_p50=round(float(np.median(rel[:, 2] - rel[:, 1])), 2),
                         last_seg_prologue_p50=round(float(np.median(rel[:, 1] - start)), 2),
                         last_seg_epilogue_p50=round(float(np.median(end - rel[:, 3])), 2),
                         parts_p50=parts(t),
                         )  # fmt: skip
                if work is not None:
                    blocks, segs = work
                    x = np.stack([np.ones_like(blocks), blocks, segs], 1)
                    coef, *_ = np.linalg.lstsq(x, busy, rcond=None)
                    pred = x @ coef
                    r.update(fit_fixed_us=round(float(coef[0]), 2),
                             fit_block_us=round(float(coef[1]), 3),
                             fit_segment_us=round(float(coef[2]), 2),
                             fit_rms_us=round(float(np.sqrt(np.mean((busy - pred) ** 2))), 2),
                             blocks_min_max=[int(blocks.min()), int(blocks.max())],
                             segments_hist=np.bincount(segs.astype(int)).tolist(),
                             busy_by_segments={int(k): round(float(np.median(busy[segs == k])), 2)
                                               for k in np.unique(segs)})  # fmt: skip
                rows.append(r)
                print(json.dumps(r), flush=True)
    if a.out:
        with open(a.out, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
