"""Host cost of one eager decode call on a CPU, launches stubbed: the full path (argument
checks, plan, launches) against the prepared path (`ops.prepared`), by part, for `pagedattn.mha`
and `pagedattn.mla_decode`.

    TRITON_INTERPRET=1 python dev/host_cost_cpu.py [--rounds 7] [--calls 2000] [--op mha|step|mla]

Shapes: the suite's host-cost cases (bench/bench_real.py): mha decode GQA 32/8 heads, d128,
pages of 16, bf16, ~1k keys a request, b in (1, 8, 64), out given and not; mla_decode h_q 16,
d_qk 576 / d_v 512, pages of 64, bf16, ~1k keys a request, b in (1, 8), planned as on an H200
(the keys-as-M Gluon kernel on the balanced work list and its combine: `_use_sm90_path` and
`fast_hbm` patched, as `ops.offline` captures do). No kernel runs:
- full path: the public op's checks (`_validate` / `validate_args`) + `choose_backend` + the
  Triton launcher (`mha_triton` / `mla_decode_triton`: what the op did before prepared calls,
  and what a miss still does), its launches replaced by a no-op (`ops.offline.capture`
  style: the kernels' modules get a recording `launch`);
- prepared path: the public op hitting an entry whose launches are the compiled form
  (`PreparedLaunch.generated`, the code a CUDA hit runs; its values and types from Triton's
  binder for mla) with the C launcher replaced by a Python no-op taking the same arguments
  ("stub launcher" row: its own cost, included).
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
from operator import itemgetter

os.environ.setdefault("TRITON_INTERPRET", "1")  # the Triton backend on a CPU
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(_ROOT, "src"))

import torch  # noqa: E402
from devtools import best_us_per_call  # noqa: E402

from pagedattn import KVCacheParams, PagedOperand  # noqa: E402
from pagedattn.ops import offline  # noqa: E402
from pagedattn.ops import prepared as PR  # noqa: E402
from pagedattn.ops.dispatch import choose_backend  # noqa: E402
from pagedattn.ops.launch import Launched  # noqa: E402
from pagedattn.ops.masks import causal  # noqa: E402
from pagedattn.ops.mha import StepPlan, _validate, mha  # noqa: E402
from pagedattn.ops.mha import triton_mha as TM  # noqa: E402
from pagedattn.ops.mha import triton_worklist as WL  # noqa: E402
from pagedattn.ops.mha.selection import NO_TUNING, plan  # noqa: E402
from pagedattn.ops.mla import mla_decode, validate_args  # noqa: E402
from pagedattn.ops.mla import triton_mla as TMLA  # noqa: E402
from pagedattn.ops.mla import triton_mla_combine as MLA_C  # noqa: E402
from pagedattn.ops.mla import worklist as MLA_WL  # noqa: E402
from pagedattn.testing import make_paged_cache  # noqa: E402

H_Q, H_KV, D, PAGE, CTX = 32, 8, 128, 16, 1024
MLA_H_Q, MLA_D_QK, MLA_D_V, MLA_PAGE = 16, 576, 512, 64


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


def stub_build(rec: Launched, sources, descriptors: bool = False):
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


def prepare_stubbed(q, k, v, offs, out, return_lse=False, num_decodes=None, step_plan=None):
    """Put the call's prepared entry (compiled form, stub launcher) into `mha`'s cache, from
    the launches its full path makes (recorded, not run)."""
    ran = []
    kw = dict(mask=causal(), scale=None, sinks=None, num_partitions=None,
              return_lse=return_lse, out=out, plan=step_plan)  # fmt: skip

    def call():
        ran.append(TM._mixed_path(q, k, v, offs, num_decodes or 0, **kw))

    made_wl: list = []
    made = offline.capture(TM, lambda: made_wl.extend(offline.capture(WL, call)))
    recs = [Launched(m.kernel, m.grid, m.args, m.kwargs) for m in made + made_wl]
    key, src = TM._signature(q, k, v, offs, None, None, None, None, return_lse, out, "triton",
                             num_decodes, step_plan)  # fmt: skip
    pick = itemgetter(*TM._guarded(src))
    res, rans = ran[-1]
    saved = PR.PreparedLaunch.build
    PR.PreparedLaunch.build = staticmethod(stub_build)
    try:
        outs = res if return_lse else (res, None)
        entry = TM._prepare_call(recs, src, rans, outs, out is not None, causal())
    finally:
        PR.PreparedLaunch.build = saved
    assert entry is not None and entry.fast, "not preparable"
    TM.PREPARED.cache.store(key, PR.tensor_guard(pick(src)), pick, entry)
    import pagedattn.ops.mha as M

    M._prepared = TM.PREPARED


def _stubbed_full_path(fn):
    """fn() with `mha`'s launches stubbed (and the interpreter's host item count, which CUDA
    does not take)."""
    noop = lambda *args, **kwargs: None  # noqa: E731
    saved = TM.launch, WL.launch, TM.host_item_count
    TM.launch = WL.launch = noop
    TM.host_item_count = lambda *args, **kwargs: 1
    try:
        return fn()
    finally:
        TM.launch, WL.launch, TM.host_item_count = saved


def mha_rows(a) -> None:
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

        parts = {
            "full path, out given": lambda: full(out),
            "full path, out=None": lambda: full(None),
            "  _validate": lambda: _validate(q, k, v, offs, None, None, None, None, False, out),
            "  selection.plan": lambda: plan(
                q, ka, va, D, D, b, causal(), None, None, NO_TUNING, TM.device_facts(q.device)
            ),
        }
        rows = _stubbed_full_path(lambda: {n: best_us_per_call(f, a.calls, a.rounds)
                                           for n, f in parts.items()})  # fmt: skip
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
        rows.update({n: best_us_per_call(f, a.calls, a.rounds) for n, f in parts.items()})
        for n, us in rows.items():
            print(f"b{b:<3d} {n:34s} {us:8.2f}")


def step_rows(a) -> None:
    """An engine layer's call (`models.layers`): `mha(..., num_decodes=D, plan=step plan)` of a
    mixed step (D decodes over ~1k keys, then 4 prefill chunks of 64 over 256 cached) and of a
    decode step (every request one query), the step plan made from host lengths (once a
    step: made before the timed calls, as the first layer does)."""
    for name, nd, chunks in (("mixed", 56, 4), ("decode", 64, 0)):
        p = KVCacheParams(torch.bfloat16, 1, H_KV, D, PAGE, num_q_heads=H_Q)
        lens = [CTX - 1 - 7 * i for i in range(nd)] + [256] * chunks
        q_lens = [1] * nd + [64] * chunks
        pc = make_paged_cache(p, lens, q_lens)
        k, v = PagedOperand(pc.inputs, p, 0, "k"), PagedOperand(pc.inputs, p, 0, "v")
        offs = torch.tensor([0, *torch.tensor(q_lens).cumsum(0).tolist()], dtype=torch.int32)
        q = torch.randn(int(offs[-1]), H_Q, D, dtype=torch.bfloat16)
        step = StepPlan(lens[:nd])
        TM.PREPARED.cache.clear()
        prepare_stubbed(q, k, v, offs, None, False, nd, step)
        kw = dict(num_decodes=nd, plan=step, backend="triton")

        def full():
            _validate(q, k, v, offs, None, None, None, None, False, None)
            choose_backend(q.device, "triton")
            return TM.mha_mixed_triton(q, k, v, offs, nd, plan=step)

        rows = {"full path": _stubbed_full_path(lambda: best_us_per_call(full, a.calls, a.rounds))}
        rows["prepared"] = best_us_per_call(lambda: mha(q, k, v, offs, **kw), a.calls, a.rounds)
        for n, us in rows.items():
            print(f"{name} step layer call ({nd} decodes, {chunks} chunks) {n:12s} {us:8.2f}")


# --------------------------------------------------------------------------------------------
# mla_decode
# --------------------------------------------------------------------------------------------
class _StubLauncher:
    """Triton's CudaLauncher as a prepared launch reads it (no scratch; `launch` the stub)."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False
    launch = staticmethod(stub_launcher)


class _StubMLACompiled(_StubCompiled):
    run = _StubLauncher()


_BINDERS: dict = {}


def _binder(kernel):
    """Triton's binder of `kernel` for an sm_90 target (what `JITFunction.run` binds with)."""
    from triton.runtime.jit import JITFunction, create_function_from_signature

    b = _BINDERS.get(kernel)
    if b is None:
        jf = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)
        b = _BINDERS[kernel] = create_function_from_signature(
            jf.signature, jf.params, offline._backend()[1]
        )
    return b


def mla_stub_build(rec: Launched, sources, descriptors: bool = False):
    """`PreparedLaunch.build` of a captured launch in its compiled form (Triton's binder, the
    stub launcher)."""
    bound, spec, _ = _binder(rec.kernel)(*rec.args, **rec.kwargs)
    rec = Launched(rec.kernel, rec.grid, rec.args, rec.kwargs, _StubMLACompiled)
    return PR.PreparedLaunch.bound(rec, bound, [t for t, _ in spec], sources, descriptors)


H200 = dict(_use_sm90_path=TMLA.sm90_serves, fast_hbm=lambda device: True)


def mla_captured(call):
    """The launches `call` makes through triton_mla, the work-list combine and the split-K
    combine, none run (planned as on an H200)."""
    made: list = []

    def inner():
        made.extend(offline.capture(MLA_WL, lambda: made.extend(offline.capture(MLA_C, call))))

    first = offline.capture(TMLA, inner, **H200)
    return first + made


def mla_prepare_stubbed(q, kv, offs, out, return_lse=True) -> None:
    """Put the call's prepared entry (compiled form, stub launcher) into `mla_decode`'s cache,
    from the launches its full path makes as on an H200 (recorded, not run)."""
    ran = []
    args = (q, kv, offs, MLA_D_V, None, True, None, None, None, None, None, None, None, out)
    made = mla_captured(lambda: ran.append(TMLA._full_path(*args, None)[1]))
    recs = [Launched(m.kernel, m.grid, m.args, m.kwargs) for m in made]
    key, src = TMLA._signature(*args, "triton", return_lse)
    pick = itemgetter(*TMLA._guarded(src))
    r = ran[-1]
    src[TMLA._OUT], src[TMLA._LSE] = r.a.out, r.a.lse
    src[TMLA._PO], src[TMLA._PL], src[TMLA._CUT] = r.po, r.pl, r.cut_t
    saved = PR.PreparedLaunch.build
    PR.PreparedLaunch.build = staticmethod(mla_stub_build)
    try:
        entry = TMLA._prepare_decode(recs, src, r, out is not None, return_lse)
    finally:
        PR.PreparedLaunch.build = saved
    assert entry is not None and entry.decode.compiled and entry.decode.fast, "not preparable"
    TMLA.PREPARED.cache.store(key, PR.tensor_guard(pick(src)), pick, entry)
    import pagedattn.ops.mla as M

    M._prepared = TMLA.PREPARED


def mla_rows(a) -> None:
    noop = lambda *args, **kwargs: None  # noqa: E731
    for b in (1, 8):
        p = KVCacheParams(torch.bfloat16, 1, 1, MLA_D_QK, MLA_PAGE, is_mla=True,
                          num_q_heads=MLA_H_Q, mla_rope_dim=64)  # fmt: skip
        pc = make_paged_cache(p, [CTX - 1] * b, [1] * b)
        kv = PagedOperand(pc.inputs, p, 0, "k")
        q = torch.randn(b, MLA_H_Q, MLA_D_QK, dtype=torch.bfloat16)
        offs = torch.arange(b + 1, dtype=torch.int32)
        out = torch.empty(b, MLA_H_Q, MLA_D_V, dtype=torch.bfloat16)
        TMLA.PREPARED.cache.clear()
        mla_prepare_stubbed(q, kv, offs, out)
        mla_prepare_stubbed(q, kv, offs, None)
        mla_prepare_stubbed(q, kv, offs, out, return_lse=False)
        sig = (q, kv, offs, MLA_D_V, None, True, None, None, None, None, None, None, None)
        key, src = TMLA._signature(*sig, out, "triton")
        guard, pick, entry = TMLA.PREPARED.cache.candidates(key)[0]
        kernel = entry.decode.kernel.fn.__name__
        fake_args = (1,) * 13 + tuple(range(30))  # ~ the decode kernel's launcher arguments

        def full(o):
            validate_args(q, kv, offs, MLA_D_V, None, True, None, None, None, None, None, None,
                          None, o)  # fmt: skip
            choose_backend(q.device, "triton")
            return TMLA.mla_decode_triton(q, kv, offs, d_v=MLA_D_V, out=o)

        saved = {n: getattr(TMLA, n) for n in ("launch", "mla_host_item_count", *H200)}
        saved_l = MLA_WL.launch, MLA_C.launch
        for n, v in dict(H200, launch=noop, mla_host_item_count=lambda *x, **k: 1).items():
            setattr(TMLA, n, v)  # (CUDA sizes the grid without the host count)
        MLA_WL.launch = MLA_C.launch = noop
        try:
            parts = {
                "full path, out given": lambda: full(out),
                "full path, out=None": lambda: full(None),
                "  validate_args": lambda: validate_args(
                    q,
                    kv,
                    offs,
                    MLA_D_V,
                    None,
                    True,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    None,
                    out,
                ),  # fmt: skip
            }
            rows = {n: best_us_per_call(f, a.calls, a.rounds) for n, f in parts.items()}
        finally:
            for n, v in saved.items():
                setattr(TMLA, n, v)
            MLA_WL.launch, MLA_C.launch = saved_l
        parts = {
            "prepared, out given": lambda: mla_decode(
                q, kv, offs, d_v=MLA_D_V, out=out, backend="triton"
            ),
            "prepared, out=None": lambda: mla_decode(q, kv, offs, d_v=MLA_D_V, backend="triton"),
            "prepared, out given, no LSE": lambda: mla_decode(
                q, kv, offs, d_v=MLA_D_V, out=out, backend="triton", return_lse=False
            ),
            "  _signature (key, sources)": lambda: TMLA._signature(*sig, out, "triton"),
            "  cache.candidates": lambda: TMLA.PREPARED.cache.candidates(key),
            "  guard.check": lambda: guard.check(*pick(src)),
            "  entry run (pointers, launches)": lambda: entry(list(src)),
            "  stub launcher alone": lambda: stub_launcher(*fake_args),
        }
        rows.update({n: best_us_per_call(f, a.calls, a.rounds) for n, f in parts.items()})
        print(f"mla b{b}: {kernel} + {entry.combine.kernel.fn.__name__}" if entry.combine
              else f"mla b{b}: {kernel}")  # fmt: skip
        for n, us in rows.items():
            print(f"mla b{b:<3d} {n:34s} {us:8.2f}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--op", choices=("mha", "step", "mla", "all"), default="all")
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs; us per call, best of {a.rounds}")
    if a.op in ("mha", "all"):
        mha_rows(a)
    if a.op in ("step", "all"):
        step_rows(a)
    if a.op in ("mla", "all"):
        mla_rows(a)


if __name__ == "__main__":
    main()
