"""Host cost of one eager MLA decode call, by part (GPU machine): where the ~190 us of an eager
`mla_decode` go on the H100 host (bench/results/h100_2026-11-22.json, rope-aware FP8 h_q 16).

    python dev/host_cost.py

Each part runs N times back to back on a tiny problem (b 128, s_k 64: a few us of GPU work),
so the wall time per call is the host's; parts alternate over ROUNDS rounds, each keeping its
best (the host's speed drifts). "kernel launch only" is Triton's own `kernel[grid](...)`; the
indented rows are its argument binder and the compiled kernel's launch, the two steps that
`pagedattn.ops.launch` keeps. Prints one line per part, in us; --profile also prints a
cProfile of `mla_decode_triton`.
"""

from __future__ import annotations

import os
import sys
import time

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "src"))

import torch  # noqa: E402
from mla_cases import capture, make_case  # noqa: E402

import pagedattn.ops.mla.triton_mla as M  # noqa: E402
from pagedattn import mla_decode  # noqa: E402
from pagedattn.ops.mla import validate_args  # noqa: E402
from pagedattn.ops.mla.triton_mla_combine import mla_combine_triton  # noqa: E402

ROUNDS = 3


def per_call_us(fn, n: int = 1000) -> float:
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / n * 1e6


def profile(fn, n: int = 1000) -> None:
    """cProfile of n calls of fn: the top functions by own time."""
    import cProfile
    import pstats

    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    pr = cProfile.Profile()
    pr.enable()
    for _ in range(n):
        fn()
    pr.disable()
    torch.cuda.synchronize()
    pstats.Stats(pr).sort_stats("tottime").print_stats(25)


def main() -> None:
    rows = []
    for fmt in ("rope_aware", "bf16"):
        q, kv, offs, kw, _ = make_case("dense", fmt, 576, 128, 64, 16, 1, 64, 0)
        out = torch.empty(q.shape[0], 16, 512, dtype=q.dtype, device="cuda")
        for P in (1, 2):

            def full(P=P):
                return mla_decode(q, kv, offs, out=out, num_partitions=P)

            def direct(P=P):
                return M.mla_decode_triton(q, kv, offs, out=out, num_partitions=P)

            cap = capture(direct, sm90=True)
            kern, grid, args, kwargs = cap.kernel, cap.grid, cap.args, cap.kwargs
            po = torch.randn(P, q.shape[0], 16, 512, device="cuda")
            pl = torch.randn(P, q.shape[0], 16, device="cuda")
            lse = torch.empty(q.shape[0], 16, device="cuda")
            ck = kern[grid](*args, **kwargs)  # the CompiledKernel of this specialization
            binder = kern.device_caches[torch.cuda.current_device()][4]
            vals = tuple(binder(*args, **kwargs)[0].values())
            g3 = tuple(grid) + (1,) * (3 - len(grid))
            stream = torch.cuda.current_stream().cuda_stream
            parts = {
                "mla_decode": full,
                "mla_decode_triton": direct,
                "validate_args": lambda P=P: validate_args(
                    q, kv, offs, 512, None, True, None, None, None, None, None, None, P, out
                ),
                "kernel launch only": lambda: kern[grid](*args, **kwargs),
                "  binder only": lambda: binder(*args, **kwargs),
                "  compiled[grid](*args)": lambda: ck[g3](*vals),
                "  compiled.run (raw)": lambda: ck.run(
                    *g3, stream, ck.function, ck.packed_metadata, None, None, None, *vals
                ),
                "combine launch only": lambda: mla_combine_triton(po, pl, out, lse),
                "torch.empty": lambda: torch.empty(P, 2048, 512, device="cuda"),
            }
            if P == 1:
                del parts["combine launch only"]
            if "--profile" in sys.argv and fmt == "rope_aware" and P == 1:
                profile(direct)
            best = dict.fromkeys(parts, float("inf"))
            for _ in range(ROUNDS):  # alternating rounds: the host's clock drifts between parts
                for name, fn in parts.items():
                    best[name] = min(best[name], per_call_us(fn))
            for name, us in best.items():
                rows.append((fmt, P, name, us))
                print(f"{fmt:10s} P={P} {name:24s} {us:8.1f} us", flush=True)
    print(f"\nhost cost per call (us, best of {ROUNDS} alternating rounds)")
    for fmt, P, name, us in rows:
        print(f"{fmt:10s} P={P} {name:24s} {us:8.1f}")


if __name__ == "__main__":
    main()
