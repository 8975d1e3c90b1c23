"""Probe (GPU): a mixed step's decode and prefill parts run at once on disjoint SM partitions
(CUDA green contexts, through the driver API by ctypes), against one stream.

The suite's mixed step with few decodes (56 skewed decodes + 8 chunks of 512 over 1k cached,
32/8 heads d128, page 16) runs its two parts one after the other: the warp-specialized prefill
kernel holds a whole SM, so a decode CTA cannot share its SM, and two plain streams did not
overlap them (docs/performance.md). Green contexts confine each part's CTAs to its own SMs.
Each variant is captured in a CUDA graph (fork / join by events) and its replays timed
(`common.time_ms`); its outputs must equal the serial step's.

Usage: python dev/green_overlap_probe.py [--out DIR] [--splits 16 24 ...]
       python dev/green_overlap_probe.py --prefill-variants '{"gluon": false, "num_warps": 4}' ...
(the second form: prefill launches that leave room on their SMs for the decode's CTAs, the
two parts on two plain streams)
"""

from __future__ import annotations

import argparse
import ctypes
import dataclasses
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))

from bench_real import H_KV, D, draw_lengths, gqa_cache  # noqa: E402
from common import copy_bandwidth, matmul_tflops, time_ms  # noqa: E402

import pagedattn.ops.mha.triton_mha as tm  # noqa: E402
from pagedattn import PagedOperand, StepPlan, mha  # noqa: E402
from pagedattn.testing import ragged_offsets  # noqa: E402

_RES_BYTES = 4096  # more than any CUDA version's CUdevResource
_SM_COUNT_OFFSET = 96  # CUdevResource: type (4 B), 92 B of padding, then the SM union


class Driver:
    """The few driver calls a disjoint SM split needs."""

    def __init__(self) -> None:
        self.lib = ctypes.CDLL("libcuda.so.1")

    def call(self, name: str, *args) -> None:
        rc = getattr(self.lib, name)(*args)
        if rc != 0:
            s = ctypes.c_char_p()
            self.lib.cuGetErrorString(rc, ctypes.byref(s))
            raise RuntimeError(f"{name}: {rc} {s.value}")

    def split(self, counts: list[int]) -> list[tuple[int, torch.cuda.ExternalStream]]:
        """Disjoint partitions of `counts` SMs each, then the remaining SMs: (SM count, a
        stream of a green context over them) each."""
        dev = ctypes.c_int()
        self.call("cuDeviceGet", ctypes.byref(dev), torch.cuda.current_device())
        res = ctypes.create_string_buffer(_RES_BYTES)
        self.call("cuDeviceGetDevResource", dev, res, 1)  # CU_DEV_RESOURCE_TYPE_SM
        parts = []
        for n in counts:
            got, rest = (
                ctypes.create_string_buffer(_RES_BYTES),
                ctypes.create_string_buffer(_RES_BYTES),
            )
            nb = ctypes.c_uint(1)
            self.call("cuDevSmResourceSplitByCount", got, ctypes.byref(nb), res, rest, 0, n)
            parts.append(got)
            res = rest
        parts.append(res)
        out = []
        for r in parts:
            desc, g, s = ctypes.c_void_p(), ctypes.c_void_p(), ctypes.c_void_p()
            self.call("cuDevResourceGenerateDesc", ctypes.byref(desc), r, 1)
            self.call("cuGreenCtxCreate", ctypes.byref(g), desc, dev, 1)  # DEFAULT_STREAM
            self.call("cuGreenCtxStreamCreate", ctypes.byref(s), g, 1, 0)  # NON_BLOCKING
            sms = int.from_bytes(r.raw[_SM_COUNT_OFFSET : _SM_COUNT_OFFSET + 4], "little")
            out.append((sms, torch.cuda.ExternalStream(s.value)))
        return out


def build(seed: int):
    """The mixed step's two parts as two calls on their own caches (the same bytes)."""
    lens = draw_lengths(("lognormal", 1536), 56, seed)
    dev, h_q, page, scale = "cuda", 32, 16, D**-0.5

    def part(cache_lens, new):
        pc = gqa_cache(cache_lens, new, page, h_q, dev, seed)
        offs = ragged_offsets(new, dev)
        q = torch.randn(sum(new), h_q, D, device=dev, dtype=torch.bfloat16)
        out = torch.full_like(q, float("nan"))
        k, v = (
            PagedOperand(pc.inputs, pc.params, 0, "k"),
            PagedOperand(pc.inputs, pc.params, 0, "v"),
        )
        plan = StepPlan(cache_lens)
        return lambda: mha(q, k, v, offs, scale=scale, out=out, plan=plan), out

    dec = part([s - 1 for s in lens], [1] * 56)
    pre = part([1024] * 8, [512] * 8)
    nbytes = (sum(lens) + 8 * 1536) * H_KV * 2 * D * 2
    flops = 2 * 8 * (512 * 1536 - 512 * 511 // 2) * h_q * 2 * D
    return dec, pre, nbytes, flops


def forked(first, second, a, b):
    """`a` on stream `first`, `b` on `second` (None: the current stream), joined."""

    def step():
        cur = torch.cuda.current_stream()
        for s in (first, second):
            if s is not None:
                s.wait_stream(cur)
        with torch.cuda.stream(first or cur):
            a()
        with torch.cuda.stream(second or cur):
            b()
        for s in (first, second):
            if s is not None:
                cur.wait_stream(s)

    return step


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=os.environ.get("OUT", "."))
    ap.add_argument("--splits", type=int, nargs="*", default=[16, 24, 32, 40, 48],
                    help="the decode partitions' SM counts")  # fmt: skip
    ap.add_argument("--prefill-variants", nargs="*", default=None,
                    help='prefill tunings (PAGEDATTN_MHA_TUNING "prefill" objects) timed with '
                         "the decode on a second stream, instead of the splits")  # fmt: skip
    args = ap.parse_args()
    copy, mm = copy_bandwidth(), matmul_tflops()
    (dec, dec_out), (pre, pre_out), nbytes, flops = build(0)
    roof = max(nbytes / copy / 1e6, flops / mm / 1e9)
    dec(), pre()
    torch.cuda.synchronize()
    want = dec_out.clone(), pre_out.clone()
    rows = []

    def run(name, fn, checks=None, **extra):
        checks = checks or [(dec_out, want[0]), (pre_out, want[1])]
        for o, _ in checks:
            o.fill_(float("nan"))
        try:
            ms = time_ms(fn)
        except Exception as e:  # noqa: BLE001 - a probe records what failed
            rows.append(dict(name=name, error=f"{type(e).__name__}: {str(e)[:200]}", **extra))
            print(f"{name:44s} ERROR {rows[-1]['error']}", flush=True)
            return
        same = all(torch.equal(o, w) for o, w in checks)
        rows.append(dict(name=name, ms=round(float(ms), 4), graph=ms.graph, eager=ms.eager,
                         of_roofline=round(roof / float(ms), 3), same=same, **extra))  # fmt: skip
        print(f"{name:44s} {float(ms):.4f} ms  {roof / float(ms):.3f}  same={same}", flush=True)

    run("decode alone", dec)
    run("prefill alone", pre)
    run("serial", lambda: (dec(), pre()))
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()
    run("plain streams, prefill first", forked(s1, s2, pre, dec))
    for v in args.prefill_variants or ():
        # a prefill launch that leaves room on its SMs for decode CTAs, on a second stream
        os.environ["PAGEDATTN_MHA_TUNING"] = json.dumps({"prefill": json.loads(v)})
        try:
            pre_out.fill_(float("nan"))
            pre()
            torch.cuda.synchronize()
            checks = [(dec_out, want[0]), (pre_out, pre_out.clone())]
            run(f"prefill {v} alone", pre, checks=checks[1:], variant=v)
            run(f"serial, prefill {v}", lambda: (dec(), pre()), checks=checks, variant=v)
            run(f"streams, prefill {v} first", forked(s1, s2, pre, dec), checks=checks, variant=v)
            run(f"streams, decode first, {v}", forked(s1, s2, dec, pre), checks=checks, variant=v)
        except Exception as e:  # noqa: BLE001
            print(f"variant {v}: {type(e).__name__}: {str(e)[:200]}", flush=True)
        finally:
            del os.environ["PAGEDATTN_MHA_TUNING"]
    if args.prefill_variants:
        args.splits = []
    drv = Driver()
    for k in args.splits:
        try:
            (nd, sd), (np_, sp) = drv.split([k])
        except Exception as e:  # noqa: BLE001
            rows.append(dict(name=f"split {k}", error=str(e)[:200]))
            print(f"split {k}: {e}", flush=True)
            break
        run(f"green decode {nd} SMs / prefill {np_}", forked(sd, sp, dec, pre), dec_sms=nd)
        run(f"green decode {nd} / prefill on all SMs", forked(sd, None, dec, pre), dec_sms=nd)
        base = tm.device_facts
        tm.device_facts = lambda d, n=nd: dataclasses.replace(base(d), sms=n)
        try:
            (dec2, d2o), _, _, _ = build(0)
            dec2()
            torch.cuda.synchronize()
            checks = [(d2o, d2o.clone()), (pre_out, want[1])]
            run(
                f"green decode {nd} planned for it / prefill {np_}",
                forked(sd, sp, dec2, pre),
                checks=checks,
            )
        except Exception as e:  # noqa: BLE001
            print(f"planned for {nd}: {e}", flush=True)
        finally:
            tm.device_facts = base
    print(f"\nroofline {roof:.4f} ms (copy {copy:.0f} GB/s, matmul {mm:.0f} TFLOP/s)")
    with open(os.path.join(args.out, "green_overlap.json"), "w") as f:
        json.dump(dict(roofline_ms=roof, copy=copy, matmul=mm, rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
