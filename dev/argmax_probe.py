"""The greedy argmax of a decode step's logits (`ops.fused.argmax_rows`) against torch.argmax,
and a draw with temperature (`ops.fused.sample_rows`) against the reference's torch passes (the
sampler's path before the fused kernel):
graph replays of 20 calls on fresh random float32 logits [n, V] (each call its own copy, so
the logits stream from HBM), us a call, and the fraction of the copy bandwidth; each answer
checked against torch.argmax. The one-program-a-row kernel is timed too (`sms=0` plan).

    python dev/argmax_probe.py [n ...]      # GPU; default 1 8 64 256 at V = 128256
"""

from __future__ import annotations

import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import copy_bandwidth  # noqa: E402
from devtools import graph_us_per_call  # noqa: E402

from pagedattn.cache.dispatch import num_sms  # noqa: E402
from pagedattn.ops.fused import argmax_rows, sample_rows  # noqa: E402
from pagedattn.ops.fused.reference import sample_rows_reference  # noqa: E402
from pagedattn.ops.fused.triton_fused import argmax_rows_triton  # noqa: E402

V = 128256
CALLS = 20


def main() -> None:
    ns = [int(a) for a in sys.argv[1:]] or [1, 8, 64, 256]
    bw = copy_bandwidth()
    sms = num_sms("cuda")
    for n in ns:
        xs = [torch.randn(n, V, device="cuda") for _ in range(CALLS)]
        for x in xs:
            assert torch.equal(argmax_rows(x), x.argmax(-1))
            assert torch.equal(argmax_rows_triton(x, 0)[0], x.argmax(-1))
            assert torch.equal(argmax_rows_triton(x, 2 * sms)[0], x.argmax(-1))
        floor = n * V * 4 / bw / 1e3
        row = {
            "torch": graph_us_per_call(lambda x: x.argmax(-1), xs),
            "one program a row": graph_us_per_call(lambda x: argmax_rows_triton(x, 0)[0], xs),
            "spans (shipped)": graph_us_per_call(lambda x: argmax_rows_triton(x, sms)[0], xs),
            # as many spans again (4 programs a SM)
            "spans x2": graph_us_per_call(lambda x: argmax_rows_triton(x, 2 * sms)[0], xs),
        }
        t = torch.rand(n, device="cuda") + 0.1
        seeds = torch.randint(0, 2**62, (n,), device="cuda")
        ctr = torch.randint(0, 2**31, (n,), device="cuda")
        same = sum(int((sample_rows(x, t, seeds, ctr) ==
                        sample_rows_reference(x, t, seeds, ctr)).sum()) for x in xs)  # fmt: skip
        row["draw: torch passes (before)"] = graph_us_per_call(
            lambda x: sample_rows_reference(x, t, seeds, ctr), xs)  # fmt: skip
        row["draw: fused"] = graph_us_per_call(lambda x: sample_rows(x, t, seeds, ctr), xs)
        print(f"draws equal to the reference's: {same} of {n * len(xs)}")
        print(f"n {n:4d} x {V}: floor {floor:5.1f} us; " + ", ".join(
            f"{k} {v:6.1f} us ({floor / v:.2f})" for k, v in row.items()))  # fmt: skip


if __name__ == "__main__":
    main()
