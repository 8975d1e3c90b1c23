"""Prepared calls of the small ops (`ops.prepared.PreparedOp`): `ops.fused`' rms_norm,
rope_qkv, silu_mul, argmax_rows and `ops.store_kv`'s store_kv, rope_store_kv.

On a CPU (Triton's interpreter): a hit equals the op's Triton function run directly, over new
tensors, and skips the full path; a changed shape, dtype, alignment, argument, environment or
backend takes the full path again (and is right); aliasing arguments are never stored; a bad
argument after a hit raises the same typed error naming it, the host-value checks of a CPU
cache included; the compiled form of a hit (the code a CUDA hit runs, its C launcher a
recorder here) passes the arguments and pointers of the full path's own launch. On CUDA
(`-m gpu`): hits equal the op's Triton function through plain `ops.launch.launch`, bitwise,
over new tensors, a misaligned view, a dtype change and a CUDA-graph replay with new data.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

from prepared_fixtures import assert_launched_as, recording_build  # noqa: E402

from pagedattn import KVCacheParams  # noqa: E402
from pagedattn.cache.dispatch import num_sms  # noqa: E402
from pagedattn.errors import InvalidArgumentError  # noqa: E402
from pagedattn.operands import PagedOperand  # noqa: E402
from pagedattn.ops import fused as F  # noqa: E402
from pagedattn.ops import prepared as PR  # noqa: E402
from pagedattn.ops import store_kv as SK  # noqa: E402
from pagedattn.ops.fused import triton_fused as TF  # noqa: E402
from pagedattn.ops.launch import Launched, recording  # noqa: E402
from pagedattn.ops.store_kv import triton_rope_store as TR  # noqa: E402
from pagedattn.ops.store_kv import triton_store as TS  # noqa: E402
from pagedattn.testing import make_paged_cache, ragged_offsets  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BF = torch.bfloat16
ALL = (F.PREPARED_RMS_NORM, F.PREPARED_ROPE_QKV, F.PREPARED_SILU_MUL, F.PREPARED_ARGMAX_ROWS,
       SK.PREPARED_STORE_KV, SK.PREPARED_ROPE_STORE_KV)  # fmt: skip
H_Q, H_KV, D = 4, 2, 16


@pytest.fixture(autouse=True)
def fresh(monkeypatch):
    monkeypatch.setenv("PAGEDATTN_BACKEND", "triton")
    for p in ALL:
        p.cache.clear()
    yield
    for p in ALL:
        p.cache.clear()


def count(monkeypatch, module, name) -> list:
    """A list that grows by one per call of module.name (an op's Triton full path)."""
    calls = []
    inner = getattr(module, name)

    def counted(*a, **kw):
        calls.append(1)
        return inner(*a, **kw)

    monkeypatch.setattr(module, name, counted)
    return calls


def rnd(*shape, dtype=BF, seed=0, offset=0):
    """A random tensor on DEV; offset > 0: a view `offset` elements into a larger buffer."""
    g = torch.Generator().manual_seed(seed)
    n = 1
    for s in shape:
        n *= s
    flat = torch.randn(n + offset, generator=g).to(dtype).to(DEV)
    return flat[offset:].view(shape)


# Each fused case: (op call, the Triton function's name, the same call of that function)
def _rms(T, dtype=BF, seed=0, offset=0, residual=False, weight_first=False):
    x = rnd(T, 64, dtype=dtype, seed=seed, offset=offset)
    w = rnd(64, dtype=torch.float32 if weight_first else dtype, seed=seed + 1)
    r = rnd(T, 64, dtype=dtype, seed=seed + 2) if residual else None
    return (lambda: F.rms_norm(x, w, 1e-5, r, weight_first=weight_first),
            lambda: TF.rms_norm_triton(x, w, 1e-5, r, weight_first))  # fmt: skip


def _rope(T, dtype=BF, seed=0, offset=0, norm=False):
    qkv = rnd(T, (H_Q + 2 * H_KV) * D, dtype=dtype, seed=seed, offset=offset)
    cos = rnd(T, D // 2, dtype=dtype, seed=seed + 1)
    sin = rnd(T, D // 2, dtype=dtype, seed=seed + 2)
    qn = rnd(D, dtype=dtype, seed=seed + 3) if norm else None
    kn = rnd(D, dtype=dtype, seed=seed + 4) if norm else None
    return (lambda: F.rope_qkv(qkv, cos, sin, H_Q, H_KV, q_norm=qn, k_norm=kn, eps=1e-6),
            lambda: TF.rope_qkv_triton(qkv, cos, sin, H_Q, H_KV, qn, kn, 1e-6))  # fmt: skip


def _silu(T, dtype=BF, seed=0, offset=0):
    gu = rnd(T, 96, dtype=dtype, seed=seed, offset=offset)
    return lambda: F.silu_mul(gu), lambda: TF.silu_mul_triton(gu)


def _argmax(T, dtype=torch.float32, seed=0, offset=0, V=100):
    x = rnd(T, V, dtype=dtype, seed=seed, offset=offset)
    return lambda: F.argmax_rows(x), lambda: TF.argmax_rows_triton(x, num_sms(x.device))[0]


def _sample(T, dtype=torch.float32, seed=0, offset=0, V=3000, filt=False):
    x = rnd(T, V, dtype=dtype, seed=seed, offset=offset)
    g = torch.Generator().manual_seed(seed + 7)
    t = (torch.rand(T, generator=g) + 0.2).to(DEV)
    seeds = torch.randint(0, 2**62, (T,), generator=g).to(DEV)
    ctr = torch.randint(0, 2**31, (T,), generator=g).to(DEV)
    k = torch.randint(0, V + 1, (T,), generator=g).to(DEV) if filt else None
    p = torch.rand(T, generator=g).to(DEV) if filt else None
    sms = num_sms(x.device)
    return (lambda: F.sample_rows(x, t, seeds, ctr, top_k=k, top_p=p),
            lambda: TF.sample_rows_triton(x, t, seeds, ctr, sms, k, p)[0])  # fmt: skip


FUSED = {
    "rms_norm": (_rms, {}, "rms_norm_triton"),
    "rms_norm+residual": (_rms, dict(residual=True), "rms_norm_triton"),
    "rms_norm weight_first": (_rms, dict(residual=True, weight_first=True), "rms_norm_triton"),
    "rope_qkv": (_rope, {}, "rope_qkv_triton"),
    "rope_qkv+norm": (_rope, dict(norm=True), "rope_qkv_triton"),
    "silu_mul": (_silu, {}, "silu_mul_triton"),
    "argmax_rows": (_argmax, {}, "argmax_rows_triton"),
    "argmax_rows in spans": (_argmax, dict(V=5000), "argmax_rows_triton"),
    "sample_rows": (_sample, {}, "sample_rows_triton"),
    "sample_rows top_k top_p": (_sample, dict(filt=True), "sample_rows_triton"),
}


def same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype and x.stride() == y.stride()
        assert torch.equal(x, y)


@pytest.mark.parametrize("case", list(FUSED))
def test_fused_hits_equal_the_full_path(case, monkeypatch):
    make, kw, name = FUSED[case]
    full = count(monkeypatch, TF, name)
    for seed in range(3):  # new tensors: hits after the first call
        op, direct = make(5, seed=seed, **kw)
        same(op(), direct())
    assert len(full) == 1 + 3  # (each `direct` counts too)
    other = torch.bfloat16 if case.startswith(("argmax", "sample")) else torch.float16
    for args in (dict(T=7), dict(T=5, dtype=other), dict(T=5, offset=1)):  # shape, dtype, align
        before = len(full)
        for seed in range(2):
            op, direct = make(seed=seed, **args, **kw)
            same(op(), direct())
        assert len(full) == before + 1 + 2  # one miss, one hit


def _cache(seed=0, new=(1, 1, 3)):
    params = KVCacheParams(BF, 3, H_KV, D, 4, num_q_heads=H_Q, devices=[DEV])
    g = torch.Generator().manual_seed(seed)
    cache = make_paged_cache(params, [5, 0, 9], list(new), generator=g, device=DEV)
    return params, cache.inputs, ragged_offsets(list(new), DEV)


def _store_case(seed, layer=1, op="store_kv"):
    params, inp, offs = _cache(seed)
    T = int(offs[-1])
    if op == "store_kv":
        k, v = rnd(T, H_KV, D, seed=seed + 10), rnd(T, H_KV, D, seed=seed + 11)

        def call(i):
            return SK.store_kv(k, v, i, params, layer, offs)

        def direct(i):
            TS.store_kv_triton(k, v, PagedOperand(i, params, layer, "k"),
                               PagedOperand(i, params, layer, "v"), offs)  # fmt: skip
    else:
        qkv = rnd(T, (H_Q + 2 * H_KV) * D, seed=seed + 10)
        cos, sin = rnd(T, D // 2, seed=seed + 11), rnd(T, D // 2, seed=seed + 12)

        def call(i):
            return SK.rope_store_kv(qkv, cos, sin, H_Q, H_KV, i, params, layer, offs)

        def direct(i):
            return TR.rope_store_kv_triton(
                qkv, cos, sin, H_Q, H_KV, None, None, 0.0, PagedOperand(i, params, layer, "k"),
                PagedOperand(i, params, layer, "v"), offs,
            )  # fmt: skip

    return params, inp, call, direct


def _clone_inputs(inp):
    import dataclasses

    return dataclasses.replace(inp, kv_blocks=inp.kv_blocks.clone())


@pytest.mark.parametrize("op", ["store_kv", "rope_store_kv"])
def test_store_hits_write_what_the_full_path_writes(op, monkeypatch):
    name = "store_kv_triton" if op == "store_kv" else "rope_store_kv_triton"
    full = count(monkeypatch, TS if op == "store_kv" else TR, name)
    for seed, layer in ((0, 1), (1, 1), (2, 1), (3, 2)):  # hits, then another layer's hit
        params, inp, call, direct = _store_case(seed, layer, op)
        twin = _clone_inputs(inp)
        got, want = call(inp), direct(twin)
        if op == "rope_store_kv":
            same(got, want)
        assert torch.equal(inp.kv_blocks.view(torch.int16), twin.kv_blocks.view(torch.int16))
    assert len(full) == 4 + 1  # 4 direct, the first call's miss (every layer shares it)
    assert len(SK.PREPARED_STORE_KV.cache if op == "store_kv" else
               SK.PREPARED_ROPE_STORE_KV.cache) == 1  # fmt: skip


def test_bad_arguments_after_a_hit_raise_typed_errors():
    x, w, r = rnd(3, 8), rnd(8), rnd(3, 8)
    gu, qkv = rnd(2, 32), rnd(2, 32)
    cs = rnd(2, 4)
    for _ in range(2):  # each a hit the second time
        F.rms_norm(x, w, 1e-6)
        F.rms_norm(x, w, 1e-6, r)
        F.silu_mul(gu)
        F.rope_qkv(qkv, cs, cs.clone(), 2, 1)
        F.argmax_rows(x.float())
    bad = [
        ("weight", lambda: F.rms_norm(x, w.float(), 1e-6)),
        ("weight", lambda: F.rms_norm(x, w[:7], 1e-6)),
        ("eps", lambda: F.rms_norm(x, w, -1.0)),
        ("eps", lambda: F.rms_norm(x, w, 1)),
        ("residual", lambda: F.rms_norm(x, w, 1e-6, rnd(3, 8, dtype=torch.float16))),
        ("x", lambda: F.rms_norm(x[0], w, 1e-6)),
        ("x", lambda: F.rms_norm("x", w, 1e-6)),
        ("backend", lambda: F.rms_norm(x, w, 1e-6, backend="cuda")),
        ("backend", lambda: F.rms_norm(x, w, 1e-6, backend=["triton"])),
        ("qkv", lambda: F.rope_qkv(qkv, cs, cs.clone(), 3, 1)),
        ("cos", lambda: F.rope_qkv(qkv, cs.float(), cs.clone(), 2, 1)),
        ("h_q", lambda: F.rope_qkv(qkv, cs, cs.clone(), 2.0, 1)),
        ("gate_up", lambda: F.silu_mul(rnd(2, 31))),
        ("x", lambda: F.argmax_rows(torch.zeros(3, 0, device=DEV))),
    ]
    for name, call in bad:
        with pytest.raises(InvalidArgumentError, match=name):
            call()


def test_store_bad_arguments_after_a_hit_raise_typed_errors():
    params, inp, offs = _cache()
    T = int(offs[-1])
    k, v = rnd(T, H_KV, D), rnd(T, H_KV, D)
    qkv, cs = rnd(T, (H_Q + 2 * H_KV) * D), rnd(T, D // 2)
    for _ in range(2):
        SK.store_kv(k, v, inp, params, 1, offs)
        SK.rope_store_kv(qkv, cs, cs.clone(), H_Q, H_KV, inp, params, 1, offs)
    bad = [
        ("layer_idx", lambda: SK.store_kv(k, v, inp, params, 3, offs)),
        ("layer_idx", lambda: SK.store_kv(k, v, inp, params, True, offs)),
        ("v_new", lambda: SK.store_kv(k, v[:, :1], inp, params, 1, offs)),
        ("q_row_offsets", lambda: SK.store_kv(k, v, inp, params, 1, offs.long())),
        ("params", lambda: SK.store_kv(k, v, inp, "params", 1, offs)),
        ("qkv", lambda: SK.rope_store_kv(qkv, cs, cs.clone(), H_KV, H_Q, inp, params, 1, offs)),
        ("k_new", lambda: SK.rope_store_kv(qkv, cs, cs.clone(), 6, 1, inp, params, 1, offs)),
        (
            "layer_idx",
            lambda: SK.rope_store_kv(qkv, cs, cs.clone(), H_Q, H_KV, inp, params, -1, offs),
        ),  # fmt: skip
    ]
    if DEV == "cpu":  # the host values of a CPU cache: checked on every call, hits included
        for name, value in (("cache_lengths", -1), ("q_row_offsets", 0)):
            bad_inp = _clone_inputs(inp)
            bad_offs = offs.clone()
            if name == "cache_lengths":
                bad_inp.cache_lengths[1] = value
            else:
                bad_offs[-1] = value
            bad += [
                (name, lambda i=bad_inp, o=bad_offs: SK.store_kv(k, v, i, params, 1, o)),
                (name, lambda i=bad_inp, o=bad_offs: SK.rope_store_kv(
                    qkv, cs, cs.clone(), H_Q, H_KV, i, params, 1, o)),
            ]  # fmt: skip
    before = inp.kv_blocks.clone()
    for name, call in bad:
        with pytest.raises(InvalidArgumentError, match=name):
            call()
    assert torch.equal(before.view(torch.int16), inp.kv_blocks.view(torch.int16))


def test_environment_and_backend_are_keyed(monkeypatch):
    full = count(monkeypatch, TF, "rms_norm_triton")
    ref = count(monkeypatch, F, "rms_norm_reference")
    x, w = rnd(3, 64), rnd(64)
    F.rms_norm(x, w, 1e-5)
    F.rms_norm(x, w, 1e-5)
    assert (len(full), len(ref)) == (1, 0)
    F.rms_norm(x, w, 1e-5, backend="reference")
    monkeypatch.setenv("PAGEDATTN_BACKEND", "reference")
    F.rms_norm(x, w, 1e-5)
    assert (len(full), len(ref)) == (1, 2)
    F.rms_norm(x, w, 1e-5, backend="triton")
    assert (len(full), len(ref)) == (2, 2)


def test_aliasing_and_empty_calls_are_not_stored():
    x, w = rnd(3, 64), rnd(64)
    same(F.rms_norm(x, w, 1e-5, x), TF.rms_norm_triton(x, w, 1e-5, x))
    F.rms_norm(rnd(0, 64), w, 1e-5)
    assert len(F.PREPARED_RMS_NORM.cache) == 0
    qkv, cs = rnd(2, 32), rnd(2, 4)
    same(F.rope_qkv(qkv, cs, cs, 2, 1), TF.rope_qkv_triton(qkv, cs, cs, 2, 1))
    assert len(F.PREPARED_ROPE_QKV.cache) == 0


def test_guard_of_one_tensor_is_a_tuple():
    x = torch.zeros(4, 3)
    guard, pick = PR.guard_call(("k",), [x, None], (0,))
    assert pick([x, None]) == (x,) and guard.check(*pick([torch.ones(4, 3), None]))
    assert not guard.check(*pick([torch.ones(3, 4), None]))


@pytest.mark.parametrize("case", ["rms_norm+residual", "rope_qkv+norm", "silu_mul", "store_kv",
                                  "rope_store_kv"])  # fmt: skip
def test_compiled_form_passes_the_full_paths_arguments(case, monkeypatch):
    """The compiled form of a hit (what a CUDA hit launches; its C launcher a recorder here):
    the grid, stream, metadata, values and pointers of the full path's own launch of that
    call (the outputs' pointers: the hit's fresh outputs)."""
    seen: list = []
    monkeypatch.setattr(PR.PreparedLaunch, "build", staticmethod(recording_build(seen)))
    if case in FUSED:
        make, kw, _ = FUSED[case]
        make(5, seed=0, **kw)[0]()  # prepared (its launch ran: the full path's)
        op, direct = make(5, seed=1, **kw)
        got = op()
        with recording() as want:
            ref = direct()
        got, ref = (got, ref) if isinstance(got, tuple) else ((got,), (ref,))
        outs = {id(r): g.data_ptr() for r, g in zip(ref, got)}
    else:
        _, inp0, call0, _ = _store_case(0, 1, case)
        call0(inp0)  # prepared
        _, inp, call, direct = _store_case(1, 1, case)
        got = call(inp)
        with recording() as want:
            ref = direct(inp)
        outs = {} if ref is None else {id(ref): got.data_ptr()}
    assert len(seen) == 1
    want = [Launched(m.kernel, m.grid, m.args, m.kwargs) for m in want]
    assert_launched_as(seen, want, PR.current_stream(-1 if DEV == "cpu" else 0),
                       lambda t: outs.get(id(t)))  # fmt: skip


@pytest.mark.gpu
def test_gpu_hits_equal_plain_launches(monkeypatch):
    """Each op's hits (compiled form) equal its Triton function launched through
    `ops.launch.launch` (no cached launch, no prepared call), bitwise: new tensors, a
    misaligned view, another dtype, and a CUDA-graph replay of a hit with new data."""
    from pagedattn.ops.launch import launch

    def plain(fn):
        with monkeypatch.context() as m:
            m.setattr(TF, "cached_launch", launch)
            m.setattr(TS, "cached_launch", launch)
            m.setattr(TR, "cached_launch", launch)
            return fn()

    for case, (make, kw, _) in FUSED.items():
        for args in (dict(T=37), dict(T=37), dict(T=37, offset=1), dict(T=37, dtype=torch.float16)):
            if case == "argmax_rows" and args.get("dtype") == torch.float16:
                args = dict(T=37, dtype=torch.bfloat16)
            for seed in range(2):
                op, direct = make(seed=seed, **args, **kw)
                same(op(), plain(direct))
        op, direct = make(37, seed=5, **kw)
        op()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = op()
        op2, direct2 = make(37, seed=6, **kw)  # new data into the captured inputs
        for a, b in zip(op.__closure__ or (), op2.__closure__ or ()):
            if isinstance(a.cell_contents, torch.Tensor):
                a.cell_contents.copy_(b.cell_contents)
        graph.replay()
        same(out, plain(direct))
    for op in ("store_kv", "rope_store_kv"):
        for seed in range(3):
            _, inp, call, direct = _store_case(seed, 1, op)
            twin = _clone_inputs(inp)
            got, want = call(inp), plain(lambda d=direct, t=twin: d(t))
            if op == "rope_store_kv":
                same(got, want)
            assert torch.equal(inp.kv_blocks.view(torch.int16), twin.kv_blocks.view(torch.int16))
    assert all(p.cache._d for p in ALL)
    assert all(e is not None and e.fast for p in ALL for c in p.cache._d.values()
               for _, _, e in c)  # fmt: skip
