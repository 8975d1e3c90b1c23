"""Host cost of one eager `pagedattn.mha` decode call on a CPU, launches stubbed: the full path
(argument checks, plan, launches) against the prepared path (`ops.prepared`), by part.

    TRITON_INTERPRET=1 python dev/host_cost_cpu.py [--rounds 7] [--calls 2000]

Shapes: the suite's host-cost case (bench/bench_real.py), decode GQA 32/8 heads, d128, pages
of 16, bf16, ~1k keys a request, b in (1, 8, 64), out given and not. No kernel runs:
- full path: `_validate` + `choose_backend` + `mha_triton` (what `mha` did before prepared
  calls, and what a miss still does), its launches replaced by a no-op (`ops.offline.capture`
  style: the kernels' modules get a recording `launch`);
- prepared path: `mha(...)` hitting an entry whose launches are the compiled form
  (`PreparedLaunch.generated`, the code a CUDA hit runs) with the C launcher replaced by a
  Python no-op taking the same arguments ("stub launcher" row: its own cost, included).
What the CPU leaves out of the GPU host path: the C launcher itself (argument parsing and
cuLaunchKernelEx, twice a split call), the current-stream query, and torch.empty on CUDA
instead of the CPU. dev/host_cost_gpu.py measures the whole call on the GPU.

Prints one line per part (us per call, best of --rounds rounds of --calls calls each).
"""

from __future__ import annotations

import argparse
import inspect
import os
import sys
import time
from operator import itemgetter

os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton backend on a CPU
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "src"))

import torch  # noqa: E402

from pagedattn import KVCacheParams, PagedOperand  # noqa: E402
from pagedattn.ops import offline  # noqa: E402
from pagedattn.ops import prepared as PR  # noqa: E402
from pagedattn.ops.dispatch import choose_backend  # noqa: E402
from pagedattn.ops.launch import Launched  # noqa: E402
from pagedattn.ops.masks import causal  # noqa: E402
from pagedattn.ops.mha import _validate, mha  # noqa: E402
from pagedattn.ops.mha import triton_mha as TM  # noqa: E402
from pagedattn.ops.mha import triton_worklist as WL  # noqa: E402
from pagedattn.ops.mha.selection import NO_TUNING, plan  # noqa: E402
from pagedattn.testing import make_paged_cache  # noqa: E402

H_Q, H_KV, D, PAGE, CTX = 32, 8, 128, 16, 1024


def per_call_us(fn, calls: int, rounds: int) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        best = min(best, (time.perf_counter() - t0) / calls * 1e6)
    return best


def stub_launcher(*args) -> None:
    """Stands in for Triton's C launcher (same arguments, does nothing)."""


class _StubCompiled:
    """The parts of a CompiledKernel a prepared launch reads."""

    function = 0
    packed_metadata = (4, 1, 0)
    name = "stub"


def _types(kernel, values: list) -> list:
    """Triton's specialized types, as the binder writes them, of a launch's bound values."""
    params = inspect.signature(kernel.fn).parameters.values()
    out = []
    for p, v in zip(params, values):
        if "constexpr" in str(p.annotation):
            out.append("constexpr")
        elif isinstance(v, torch.Tensor):
            out.append("*" + str(v.dtype).removeprefix("torch."))
        elif isinstance(v, float):
            out.append("fp32")
        else:
            out.append("i32")
    return out


def stub_build(rec: Launched, sources):
    """`PreparedLaunch.build` of a recorded (interpreted) launch in its compiled form, with the
    stub launcher (the code a CUDA hit runs, minus the C call)."""
    sig = inspect.signature(rec.kernel.fn)
    names = set(sig.parameters)
    bound = sig.bind(*rec.args, **{k: v for k, v in rec.kwargs.items() if k in names})
    bound.apply_defaults()
    values = list(bound.arguments.values())
    return PR.PreparedLaunch.generated(
        values, _types(rec.kernel, values), sources, rec.grid, rec.kernel, _StubCompiled,
        (stub_launcher, False, False),
    )  # fmt: skip


def prepare_stubbed(q, k, v, offs, out, return_lse=False) -> None:
    """Put the call's prepared entry (compiled form, stub launcher) into `mha`'s cache, from
    the launches its full path makes (recorded, not run)."""
    ran = []
    kw = dict(mask=causal(), scale=None, sinks=None, num_partitions=None,
              return_lse=return_lse, out=out)  # fmt: skip

    def call():
        ran.append(TM._full_path(q, k, v, offs, **kw)[1])

    made_wl: list = []
    made = offline.capture(TM, lambda: made_wl.extend(offline.capture(WL, call)))
    recs = [Launched(m.kernel, m.grid, m.args, m.kwargs) for m in made + made_wl]
    key, src = TM._signature(q, k, v, offs, None, None, None, None, return_lse, out, "triton")
    pick = itemgetter(*TM._guarded(src))
    r = ran[-1]
    src[TM._OUT], src[TM._LSE], src[TM._PO], src[TM._PL] = r.out, r.lse, r.po, r.pl
    saved = PR.PreparedLaunch.build
    PR.PreparedLaunch.build = staticmethod(stub_build)
    try:
        entry = TM._prepare_decode(recs, src, r, out is not None, q, causal())
    finally:
        PR.PreparedLaunch.build = saved
    assert entry is not None and entry.decode.compiled, "not preparable"
    TM.PREPARED.cache.store(key, PR.tensor_guard(pick(src)), pick, entry)
    import pagedattn.ops.mha as M

    M._prepared = TM.PREPARED


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    a = ap.parse_args()
    noop = lambda *args, **kwargs: None  # noqa: E731
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; us per call, best of {a.rounds}")
    for b in (1, 8, 64):
        p = KVCacheParams(torch.bfloat16, 1, H_KV, D, PAGE, num_q_heads=H_Q)
        pc = make_paged_cache(p, [CTX - 1] * b, [1] * b)
        k, v = PagedOperand(pc.inputs, p, 0, "k"), PagedOperand(pc.inputs, p, 0, "v")
        q = torch.randn(b, H_Q, D, dtype=torch.bfloat16)
        offs = torch.arange(b + 1, dtype=torch.int32)
        out = torch.empty_like(q)
        ka, va = k.kernel_args(), v.kernel_args()
        TM.PREPARED.cache.clear()
        prepare_stubbed(q, k, v, offs, out)
        prepare_stubbed(q, k, v, offs, None)
        key, src = TM._signature(q, k, v, offs, None, None, None, None, False, out, "triton")
        guard, pick, entry = TM.PREPARED.cache.candidates(key)[0]
        fake_args = (1,) * 13 + tuple(range(84))  # ~ the decode kernel's launcher arguments

        def full(o):
            _validate(q, k, v, offs, None, None, None, None, False, o)
            choose_backend(q.device, "triton")
            return TM.mha_triton(q, k, v, offs, out=o)

        saved = TM.launch, WL.launch, TM.host_item_count
        TM.launch = WL.launch = noop
        TM.host_item_count = lambda *args, **kwargs: 1  # CUDA sizes the grid without it
        try:
            parts = {
                "full path, out given": lambda: full(out),
                "full path, out=None": lambda: full(None),
                "  _validate": lambda: _validate(
                    q, k, v, offs, None, None, None, None, False, out
                ),  # fmt: skip
                "  selection.plan": lambda: plan(
                    q, ka, va, D, D, b, causal(), None, None, NO_TUNING, TM.device_facts(q.device)
                ),
            }
            rows = {n: per_call_us(f, a.calls, a.rounds) for n, f in parts.items()}
        finally:
            TM.launch, WL.launch, TM.host_item_count = saved
        parts = {
            "prepared, out given": lambda: mha(q, k, v, offs, out=out, backend="triton"),
            "prepared, out=None": lambda: mha(q, k, v, offs, backend="triton"),
            "  _signature (key, sources)": lambda: TM._signature(
                q, k, v, offs, None, None, None, None, False, out, "triton"
            ),
            "  env_state": PR.env_state,
            "  cache.candidates": lambda: TM.PREPARED.cache.candidates(key),
            "  guard.check": lambda: guard.check(*pick(src)),
            "  entry run (pointers, launches)": lambda: entry(list(src)),
            "  stub launcher alone": lambda: stub_launcher(*fake_args),
        }
        rows.update({n: per_call_us(f, a.calls, a.rounds) for n, f in parts.items()})
        for n, us in rows.items():
            print(f"b{b:<3d} {n:34s} {us:8.2f}")


if __name__ == "__main__":
    main()
