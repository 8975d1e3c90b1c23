"""Host time of one eager call of each element-wise op a decoder layer runs (`ops.fused`'
rms_norm, silu_mul, rope_qkv, argmax_rows; `ops.store_kv`'s store_kv and rope_store_kv), on
the CPU, with the Triton backend's host code and the kernel launch stubbed.

  python dev/host_ops_cpu.py [--rows 64] [--hidden 2048] [--calls 2000] [--stub launch|grid]
                             [--full] [--no-host-check] [--profile OP]

Shapes: a decode step of `--rows` requests at the Llama-3.2-1B shape (hidden 2048, h_q 32,
h_kv 8, d 64, intermediate 8192, bf16; a paged cache of 16-token pages, every request at
~100 cached tokens). TRITON_INTERPRET=1 and backend "triton" (through PAGEDATTN_BACKEND, as
the engine's calls pass none), then:
--stub launch (default): `kernel[grid](...)` of every interpreted kernel is a no-op, so what
  is timed is the op's own host path (checks, dispatch, keys, allocation of outputs, the
  prepared lookup) and the Python call of the launch, not Triton's interpreter;
--stub grid: only the interpreted run is a no-op (`GridExecutor.__call__`, as
  `dev/host_eager_cpu.py --triton`): the interpreter's argument binding is timed too.
Neither is the CUDA path's launch (the compiled C launcher, ~3-6 us a launch on the H200
host, docs/kernels/launch.md); both time every part of the host path that runs on CUDA too.
--full: the ops' prepared calls off (`ops.prepared.PreparedOp.prepare` runs the full path
  and stores nothing): every call validates, as before 2026-11-30's prepared small ops.
--no-host-check: the host-value checks of a CPU cache (`store_kv._check_host_values`, which
  store_kv / rope_store_kv run on every CPU call, prepared or not, and never on CUDA) a
  no-op, so the store ops' time is the part the CUDA path also runs.
Best of 5 rounds of `--calls` calls, us a call. --profile OP: cProfile of OP's calls.
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import sys

os.environ["TRITON_INTERPRET"] = "1"  # before triton is imported
os.environ["PAGEDATTN_BACKEND"] = "triton"

import torch  # noqa: E402
from devtools import best_us_per_call  # noqa: E402

from pagedattn import KVCacheParams  # noqa: E402
from pagedattn.ops.fused import argmax_rows, rms_norm, rope_qkv, silu_mul  # noqa: E402
from pagedattn.ops.store_kv import rope_store_kv, store_kv  # noqa: E402
from pagedattn.testing import make_paged_cache, ragged_offsets  # noqa: E402


def stub(kind: str) -> None:
    from triton.runtime import interpreter

    if kind == "launch":
        interpreter.InterpretedFunction.run = lambda self, *a, **kw: None
    else:
        interpreter.GridExecutor.__call__ = lambda self, *a, **kw: None


def calls(rows: int, hidden: int) -> dict:
    bf = torch.bfloat16
    g = torch.Generator().manual_seed(0)
    h_q, h_kv, d, inter = 32, 8, 64, 4 * hidden
    x = torch.randn(rows, hidden, generator=g).to(bf)
    r = torch.randn(rows, hidden, generator=g).to(bf)
    w = torch.randn(hidden, generator=g).to(bf)
    gu = torch.randn(rows, 2 * inter, generator=g).to(bf)
    qkv = torch.randn(rows, (h_q + 2 * h_kv) * d, generator=g).to(bf)
    cos = torch.randn(rows, d // 2, generator=g).to(bf)
    sin = torch.randn(rows, d // 2, generator=g).to(bf)
    k = torch.randn(rows, h_kv, d, generator=g).to(bf)
    v = torch.randn(rows, h_kv, d, generator=g).to(bf)
    logits = torch.randn(rows, 1024, generator=g)
    params = KVCacheParams(bf, 16, h_kv, d, 16, num_q_heads=h_q)
    lens = [100 + i % 7 for i in range(rows)]
    cache = make_paged_cache(params, lens, [1] * rows, generator=g)
    inp, offs = cache.inputs, ragged_offsets([1] * rows)
    return {
        "rms_norm": lambda: rms_norm(x, w, 1e-5),
        "rms_norm+residual": lambda: rms_norm(x, w, 1e-5, r),
        "silu_mul": lambda: silu_mul(gu),
        "rope_qkv": lambda: rope_qkv(qkv, cos, sin, h_q, h_kv),
        "rope_store_kv": lambda: rope_store_kv(qkv, cos, sin, h_q, h_kv, inp, params, 3, offs),
        "store_kv": lambda: store_kv(k, v, inp, params, 3, offs),
        "argmax_rows": lambda: argmax_rows(logits),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=2048)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--stub", choices=("launch", "grid"), default="launch")
    ap.add_argument("--full", action="store_true", help="prepared calls off")
    ap.add_argument("--no-host-check", action="store_true", help="CPU host-value checks off")
    ap.add_argument("--profile", default=None)
    a = ap.parse_args()
    torch.set_num_threads(1)
    stub(a.stub)
    if a.full:
        from pagedattn.ops import prepared

        prepared.PreparedOp.prepare = lambda self, key, src, guarded, run, *rest: run()
    if a.no_host_check:
        import pagedattn.ops.store_kv as sk

        sk._check_host_values = lambda *args: None
    ops = calls(a.rows, a.hidden)
    mode = ("full path" if a.full else "prepared") + (", no host check" if a.no_host_check else "")
    print(f"stub {a.stub}, {mode}, {a.rows} rows x {a.hidden}: us a call (best of 5 x {a.calls})")
    for name, fn in ops.items():
        print(f"  {name:18s} {best_us_per_call(fn, a.calls):7.2f}")
    if a.profile:
        fn = ops[a.profile]
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(a.calls):
            fn()
        pr.disable()
        pstats.Stats(pr).sort_stats("tottime").print_stats(20)


if __name__ == "__main__":
    sys.exit(main())
