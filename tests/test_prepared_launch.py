"""Prepared calls of `pagedattn.mha` (`ops.prepared`, `ops.mha.triton_mha.PreparedMHA`).

A decode call on the Triton backend is validated and planned once per signature; later calls
of that signature launch the frozen kernels with their own tensors. On a CPU the kernels run
in Triton's interpreter (TRITON_INTERPRET=1), so these tests run the hit path end to end:
- a hit gives the same bytes as the unprepared op (`mha_triton`) on the same inputs: several
  shapes, split-K and the balanced work list, sinks, LSE, out given or not, new lengths and
  new tensors between hits;
- calls that differ in anything the plan reads get separate entries, and calls that differ
  only in tensor data share one;
- a bad argument raises its typed error after a good call of the same shapes has hit;
- the compiled form (`PreparedLaunch.generated`, what a CUDA hit runs) hands the launcher
  the pointers and values that the full path's launch had for the same call.
"""

from __future__ import annotations

import os
from operator import itemgetter

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

from bad_inputs import assert_rejected, tensor_variants  # noqa: E402
from prepared_fixtures import (  # noqa: E402
    assert_launched_as,
    count_full_paths,
    fresh_prepared,
    recording_build,
)

from pagedattn import DenseOperand, KVCacheParams, PagedOperand  # noqa: E402
from pagedattn.errors import InvalidArgumentError  # noqa: E402
from pagedattn.ops import masks, offline  # noqa: E402
from pagedattn.ops import prepared as PR  # noqa: E402
from pagedattn.ops.launch import Launched  # noqa: E402
from pagedattn.ops.mha import mha  # noqa: E402
from pagedattn.ops.mha import triton_mha as TM  # noqa: E402
from pagedattn.ops.mha import triton_worklist as WL  # noqa: E402
from pagedattn.testing import make_paged_cache  # noqa: E402

BF16 = torch.bfloat16
DEV = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.fixture(autouse=True)
def fresh_cache():
    yield from fresh_prepared(TM)


@pytest.fixture
def full_paths(monkeypatch):
    """Counts the full-path runs (misses and unprepared calls) of `mha` and `mha_triton`."""
    return count_full_paths(monkeypatch, TM)


def paged(cache_lens, *, page=4, h_kv=2, d=16, dtype=BF16, seed=0, extra_pages=3):
    """K and V of layer 1 of a 2-layer paged cache (pages shuffled, NaN outside the tokens)."""
    g = torch.Generator().manual_seed(seed)
    p = KVCacheParams(dtype, 2, h_kv, d, page)
    pc = make_paged_cache(p, cache_lens, [1] * len(cache_lens), generator=g, device=DEV,
                          extra_pages=extra_pages)  # fmt: skip
    x = torch.randn(pc.inputs.kv_blocks.shape, generator=g).to(dtype)
    pc.inputs.kv_blocks.copy_(x.to(DEV))
    return PagedOperand(pc.inputs, p, 1, "k"), PagedOperand(pc.inputs, p, 1, "v"), pc.inputs


def decode_q(b, h_q=4, d=16, dtype=BF16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(b, h_q, d, generator=g).to(dtype).to(DEV)


def offsets(b):
    return torch.arange(b + 1, dtype=torch.int32, device=DEV)


def same(a, b):
    """Bitwise equal outputs (and LSEs), NaN positions included."""
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.equal(x.isnan(), y.isnan())
        assert torch.equal(x.nan_to_num(), y.nan_to_num())


CASES = [  # (cache lengths, kwargs): the balanced list, fixed split-K, P = 1, sinks, LSE
    ([5, 22, 9], {}),
    ([30, 3], dict(num_partitions=3, return_lse=True)),
    ([1, 17, 8, 12], dict(num_partitions=1, sinks=True)),
    ([13, 26], dict(return_lse=True, sinks=True, mask="swc")),
]


def _kwargs(kw, h_q):
    kw = dict(kw)
    if kw.pop("sinks", False):
        kw["sinks"] = torch.linspace(-1.0, 1.0, h_q).to(DEV)
    if kw.get("mask") == "swc":
        kw["mask"] = masks.sliding_window_causal(7)
    return kw


@pytest.mark.parametrize("out_given", [False, True])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_hit_equals_unprepared(case, out_given, full_paths):
    """Miss, then hits: the same bytes as `mha_triton`; new lengths, new q and a new out
    between hits; only the first call takes the full path."""
    lens, kw = CASES[case]
    b = len(lens)
    k, v, inputs = paged(lens)
    kw = _kwargs(kw, 4)
    offs = offsets(b)
    for step in range(3):
        q = decode_q(b, seed=step)
        if step == 2:  # shorter contexts than the cache holds: a hit with new lengths
            inputs.cache_lengths.copy_(torch.tensor([max(0, n - 3) for n in lens]))
        out = torch.full((b, 4, 16), float("nan"), dtype=BF16, device=DEV) if out_given else None
        want = TM.mha_triton(q, k, v, offs, **kw)
        before = len(full_paths)
        got = mha(q, k, v, offs, backend="triton", out=out, **kw)
        same(got, want)
        if out_given:
            assert (got[0] if isinstance(got, tuple) else got) is out
        assert len(full_paths) - before == (1 if step == 0 else 0)  # a miss, then hits
    assert len(TM.PREPARED.cache) == 1


def test_other_tensors_same_signature_share_the_entry(full_paths):
    """A second cache (other pages, other data, other lengths) and query of the same shapes
    hits the first call's entry and reads its own tensors."""
    k1, v1, _ = paged([9, 14], seed=1)
    k2, v2, inputs2 = paged([9, 14], seed=2)
    inputs2.cache_lengths.copy_(torch.tensor([5, 2]))
    q1, q2 = decode_q(2, seed=3), decode_q(2, seed=4)
    offs = offsets(2)
    same(mha(q1, k1, v1, offs, backend="triton"), TM.mha_triton(q1, k1, v1, offs))
    n = len(full_paths)
    got = mha(q2, k2, v2, offs, backend="triton")
    assert len(full_paths) == n  # a hit
    same(got, TM.mha_triton(q2, k2, v2, offs))
    assert len(TM.PREPARED.cache) == 1


def test_dense_operands_hit():
    """Row-offset (dense) K/V: the same path, its row offsets as sources."""
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 2, 24, 2, 16, generator=g).to(BF16).to(DEV)  # [kv, b, seq, h, d]
    lens = torch.tensor([10, 23], dtype=torch.int32, device=DEV)
    k, v = DenseOperand(x[0], lens), DenseOperand(x[1], lens)
    offs = offsets(2)
    for seed in (6, 7):
        q = decode_q(2, seed=seed)
        same(mha(q, k, v, offs, backend="triton", num_partitions=2),
             TM.mha_triton(q, k, v, offs, num_partitions=2))  # fmt: skip
    assert len(TM.PREPARED.cache) == 1


def _variants():
    """Calls that differ from the base call in one planned property each."""
    base = dict(lens=[6, 11], page=4, dtype=BF16, q_stride=None, kw={})
    yield "base", base
    yield "dtype", dict(base, dtype=torch.float16)
    yield "page size", dict(base, page=8)
    yield "q stride", dict(base, q_stride=24)  # q a view of wider rows: stride(1) 24, not 16
    yield "mask", dict(base, kw=dict(mask=masks.null()))
    yield "window", dict(base, kw=dict(mask=masks.sliding_window_causal(5)))
    yield "other window", dict(base, kw=dict(mask=masks.sliding_window_causal(6)))
    yield "partitions", dict(base, kw=dict(num_partitions=2))
    yield "scale", dict(base, kw=dict(scale=0.5))
    yield "lse", dict(base, kw=dict(return_lse=True))
    yield "sinks", dict(base, kw=dict(sinks=torch.zeros(4, device=DEV)))
    yield "batch", dict(base, lens=[6, 11, 2])


def _variant_call(spec):
    k, v, _ = paged(spec["lens"], page=spec["page"], dtype=spec["dtype"])
    b = len(spec["lens"])
    q = decode_q(b, dtype=spec["dtype"])
    if spec["q_stride"]:
        wide = torch.zeros(b, 4, spec["q_stride"], dtype=spec["dtype"], device=DEV)
        wide[..., :16] = q
        q = wide[..., :16]
    return q, k, v, offsets(b), spec["kw"]


def test_key_separates_planned_properties():
    """Each variant gets its own entry (and the same bytes as the unprepared op), and repeating
    every variant adds none."""
    variants = list(_variants())
    for i, (name, spec) in enumerate(variants):
        q, k, v, offs, kw = _variant_call(spec)
        same(mha(q, k, v, offs, backend="triton", **kw), TM.mha_triton(q, k, v, offs, **kw))
        assert len(TM.PREPARED.cache) == i + 1, name
    for _name, spec in variants:
        q, k, v, offs, kw = _variant_call(spec)
        same(mha(q, k, v, offs, backend="triton", **kw), TM.mha_triton(q, k, v, offs, **kw))
    assert len(TM.PREPARED.cache) == len(variants)


def test_environment_is_keyed(monkeypatch, full_paths):
    """A tuning override set between two calls re-plans the second."""
    k, v, _ = paged([12, 7])
    q, offs = decode_q(2), offsets(2)
    monkeypatch.delenv("PAGEDATTN_MHA_TUNING", raising=False)
    mha(q, k, v, offs, backend="triton")
    n = len(full_paths)
    monkeypatch.setenv("PAGEDATTN_MHA_TUNING", '{"decode": {"BLOCK_N": 16}}')
    same(mha(q, k, v, offs, backend="triton"), TM.mha_triton(q, k, v, offs))
    assert len(full_paths) == n + 2 and len(TM.PREPARED.cache) == 2


def test_misaligned_pointer_is_a_separate_entry(full_paths):
    """A q at an odd element offset (not 16-byte aligned) with the same shape and strides
    misses the aligned entry (Triton specializes on alignment) and gets its own."""
    k, v, _ = paged([8, 5])
    offs = offsets(2)
    base = decode_q(4).reshape(-1)
    aligned = base[: 2 * 4 * 16].view(2, 4, 16)
    odd = base[1 : 1 + 2 * 4 * 16].view(2, 4, 16)
    same(mha(aligned, k, v, offs, backend="triton"), TM.mha_triton(aligned, k, v, offs))
    n = len(full_paths)
    same(mha(odd, k, v, offs, backend="triton"), TM.mha_triton(odd, k, v, offs))
    assert len(full_paths) == n + 2  # a miss (and mha_triton's own call)
    (key,) = TM.PREPARED.cache._d
    entries = [e for _, _, e in TM.PREPARED.cache.candidates(key)]
    assert len(entries) == 2 and entries[0].aligned is not True and entries[1].aligned is True
    n = len(full_paths)
    mha(odd, k, v, offs, backend="triton")
    mha(aligned, k, v, offs, backend="triton")
    assert len(full_paths) == n  # both hit now


def test_unpreparable_signatures_keep_the_full_path(full_paths):
    """A decode call whose q the launcher must copy (last dim not contiguous) is stored as not
    preparable: correct, and never prepared again; a prefill call (two queries in a request)
    beside it is prepared."""
    k, v, _ = paged([6, 4])
    q2 = decode_q(3)
    offs2 = torch.tensor([0, 2, 3], dtype=torch.int32, device=DEV)
    qt = decode_q(2).transpose(1, 2).contiguous().transpose(1, 2)  # stride(2) != 1
    offs = offsets(2)
    for _ in range(2):
        same(mha(q2, k, v, offs2, backend="triton"), TM.mha_triton(q2, k, v, offs2))
        same(mha(qt, k, v, offs, backend="triton"), TM.mha_triton(qt, k, v, offs))
    entries = [e for c in TM.PREPARED.cache._d.values() for _, _, e in c]
    assert len(entries) == 2 and entries[0] is not None and entries[1] is None


def test_aliasing_arguments_are_not_stored():
    """out=q (one tensor for two arguments) is never prepared (its guard could not pass)."""
    k, v, _ = paged([6, 4])
    q, offs = decode_q(2), offsets(2)
    want = TM.mha_triton(q.clone(), k, v, offs)
    got = mha(q, k, v, offs, backend="triton", out=q)
    assert got is q
    same(got, want)
    assert len(TM.PREPARED.cache) == 0


def test_offline_capture_prepares_nothing():
    """An offline capture replaces the launcher module's `launch`: the launches are recorded
    by the capture, none is run, and nothing is prepared from them."""
    k, v, _ = paged([6, 4])
    q, offs = decode_q(2), offsets(2)
    made = offline.capture(TM, lambda: mha(q, k, v, offs, backend="triton", num_partitions=1))
    assert [m.name for m in made] == ["_mha_decode_kernel"]
    assert len(TM.PREPARED.cache) == 0


# --------------------------------------------------------------------------------------------
# Bad inputs after a hit
# --------------------------------------------------------------------------------------------
def _good():
    k, v, inputs = paged([7, 3])
    kw = dict(q=decode_q(2), k=k, v=v, q_row_offsets=offsets(2),
              mask=masks.sliding_window_causal(4), scale=0.25,
              sinks=torch.zeros(4, device=DEV), num_partitions=2, return_lse=True,
              out=torch.zeros(2, 4, 16, dtype=BF16, device=DEV))  # fmt: skip
    return kw, inputs


def _bad_values(kw):
    other_k, other_v, _ = paged([7, 3], h_kv=1)
    out = {name: [t for _, t in tensor_variants(kw[name])]
           for name in ("q", "q_row_offsets", "sinks", "out")}  # fmt: skip
    out["out"].append(kw["out"].transpose(1, 2).contiguous().transpose(1, 2))  # stride(2) 4
    out["k"] = [kw["q"], other_k, "k"]
    out["v"] = [kw["q"], other_v, None]
    out["mask"] = ["causal", 1, masks.tensor_mask(torch.ones(1, 5, dtype=torch.bool))]
    out["scale"] = [0.0, -0.25, float("nan"), float("inf"), "0.25", True, [0.25]]
    out["num_partitions"] = [0, -1, 65536, 2.0, "2", True]
    out["return_lse"] = [1, "yes", None]
    out["backend"] = ["cuda", 0, ""]
    return out


ALSO = {"q": ("q", "k", "out"), "k": ("k", "v", "q"), "v": ("v", "k", "q")}


def test_bad_arguments_after_a_hit_raise_typed_errors():
    """After a good decode call has been prepared and hit, each bad value of each argument
    (same shapes otherwise) raises InvalidArgumentError naming it, and writes nothing."""
    kw, inputs = _good()
    for _ in range(2):
        mha(**kw, backend="triton")
    assert len(TM.PREPARED.cache) == 1
    for name, values in _bad_values(kw).items():
        for bad in values:
            call = dict(kw, backend="triton")
            call[name] = bad
            state = (kw["out"], inputs.kv_blocks, kw["q"])
            assert_rejected(mha, state=state, names=ALSO.get(name, name), **call)
        mha(**kw, backend="triton")  # the good call still hits after them
    assert len(TM.PREPARED.cache) == 1
    with pytest.raises(InvalidArgumentError, match="outs"):
        mha(**kw, backend="triton", outs=None)


# --------------------------------------------------------------------------------------------
# The mechanism
# --------------------------------------------------------------------------------------------
def test_cache_bounds():
    c = PR.PreparedCache(capacity=2, per_key=2)
    pick = itemgetter(0)
    t = torch.zeros(2)
    for key in ("a", "b", "c"):
        for value in (1, 2, 3):
            c.store(key, PR.tensor_guard([t]), pick, value)
    assert c.candidates("a") is None and len(c) == 4
    assert [v for _, _, v in c.candidates("c")] == [3, 2]
    c.candidates("b")  # b most recent: d drops c
    c.store("d", PR.tensor_guard([t]), pick, 1)
    assert c.candidates("c") is None and c.candidates("b") is not None
    with pytest.raises(TypeError):
        c.candidates(["unhashable"])


def test_tensor_guard():
    a = torch.zeros(3, 4)
    g = PR.tensor_guard([a, a[:, :2]])
    assert g.check(torch.ones(3, 4), torch.ones(3, 4)[:, :2])
    assert not g.check(torch.ones(3, 4), torch.ones(3, 2))  # strides
    assert not g.check(torch.ones(3, 4, dtype=torch.float64), torch.ones(3, 4)[:, :2])
    assert not g.check(torch.ones(3, 4), torch.ones(3, 4)[:1, :2])  # sizes
    assert not g.check(torch.ones(3, 4), None) and not g.check(torch.ones(3, 4), 2)
    p = PR._PyTensorGuard([a])
    assert p.check(torch.ones(3, 4)) and not p.check(torch.ones(4, 3)) and not p.check(3)


def test_workspace_per_stream():
    """One workspace per (device, stream), grown on demand, at most MAX_WORKSPACES kept."""
    dev = torch.device(DEV)
    w1, p1 = PR.workspace(dev, 7, 100)
    assert w1.numel() >= 100 and w1.dtype == torch.float32 and p1 == w1.data_ptr()
    assert PR.workspace(dev, 7, 50)[0] is w1
    assert PR.workspace(dev, 8, 50)[0] is not w1
    w2, _ = PR.workspace(dev, 7, 1000)
    assert w2.numel() >= 1000 and PR.workspace(dev, 7, 10)[0] is w2
    for s in range(PR.MAX_WORKSPACES + 3):
        PR.workspace(dev, 100 + s, 1)
    assert len(PR._WORKSPACES) == PR.MAX_WORKSPACES


def test_env_state_follows_the_environment(monkeypatch):
    monkeypatch.delenv("PAGEDATTN_PDL", raising=False)
    a = PR.env_state()
    monkeypatch.setenv("PAGEDATTN_PDL", "1")
    b = PR.env_state()
    assert a != b and PR.env_state() == b
    assert len(a) == len(PR.ENV_NAMES)


def _captured(q, k, v, offs, out, kw):
    """The full path's launches of a call, none run: [(kernel, grid, bound values)], _Ran."""
    ran = []

    def call():
        ran.append(TM._full_path(q, k, v, offs, mask=masks.causal(), scale=None, sinks=None,
                                 out=out, **kw)[1])  # fmt: skip

    made_wl: list = []
    made = offline.capture(TM, lambda: made_wl.extend(offline.capture(WL, call)))
    return made + made_wl, ran[0]


@pytest.mark.parametrize(
    "kw",
    [dict(num_partitions=None, return_lse=False), dict(num_partitions=2, return_lse=True),
     dict(num_partitions=1, return_lse=False)],
)  # fmt: skip
def test_compiled_form_passes_the_full_paths_arguments(monkeypatch, kw):
    """The compiled form of a prepared call (the code a CUDA hit runs; its C launcher a
    recorder here): for a second call with other tensors, each launch gets the grid, metadata,
    values and pointers that the full path's own launch of that call has (pointers: data_ptr
    of the tensor it passes; the partials: the stream's workspace; the LSE: the call's)."""
    seen: list = []
    calls = []
    for seed in (1, 2):
        k, v, _ = paged([9, 30, 4], seed=seed)
        q, offs = decode_q(3, seed=seed), offsets(3)
        calls.append((q, k, v, offs, torch.empty(3, 4, 16, dtype=BF16, device=DEV)))
    made, ran = _captured(*calls[0], kw)
    key, src = TM._signature(*calls[0][:4], None, None, None, kw["num_partitions"],
                             kw["return_lse"], calls[0][4], "triton")  # fmt: skip
    monkeypatch.setattr(PR.PreparedLaunch, "build", staticmethod(recording_build(seen)))
    recs = [Launched(m.kernel, m.grid, m.args, m.kwargs) for m in made]
    entry = TM._prepare_call(recs, src, [ran], (ran.out, ran.lse), True, masks.causal())
    assert entry is not None and entry.fast and all(x.compiled for x in entry.launches)

    q, k, v, offs, out = calls[1]
    key2, src2 = TM._signature(q, k, v, offs, None, None, None, kw["num_partitions"],
                               kw["return_lse"], out, "triton")  # fmt: skip
    assert key2 == key
    result = entry(src2)
    result = result if isinstance(result, tuple) else (result, None)
    assert result[0] is out
    want, ran2 = _captured(q, k, v, offs, out, kw)
    assert len(seen) == len(want) == len(made)
    stream = PR.current_stream(PR.current_device(q))  # (0 on a CPU)
    _, base = PR.workspace(entry.device, stream, max(entry.ws_numel, 1))
    pointers = {}
    if ran2.po is not None:
        where = {i: base + 4 * off for i, _, _, off, _ in entry.parts}
        pointers = {id(ran2.po): where[TM._PO], id(ran2.pl): where[TM._PL]}
    if ran2.lse is not None:
        pointers[id(ran2.lse)] = result[1].data_ptr()
    assert_launched_as(seen, want, stream, lambda t: pointers.get(id(t)))


def test_recording_lists_this_threads_launches():
    """`ops.launch.recording` lists the launches made through `ops.launch.launch` in its
    block (none of an inner block's in the outer list); interpreted ones have no compiled
    kernel."""
    from pagedattn.ops.launch import recording

    k, v, _ = paged([6, 4])
    q, offs = decode_q(2), offsets(2)
    with recording() as outer:
        with recording() as inner:
            TM.mha_triton(q, k, v, offs, num_partitions=2)
        TM.mha_triton(q, k, v, offs, num_partitions=1)
    assert [r.kernel.fn.__name__ for r in inner] == ["_mha_decode_kernel", "_combine_kernel"]
    assert [r.kernel.fn.__name__ for r in outer] == ["_mha_decode_kernel"]
    assert all(r.compiled is None for r in inner + outer) or torch.cuda.is_available()


def test_hooks_idle_follows_triton_hooks():
    from triton import knobs

    assert PR.hooks_idle()

    def hook(metadata):
        pass

    knobs.runtime.launch_enter_hook.add(hook)
    try:
        assert not PR.hooks_idle()
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    assert PR.hooks_idle()


def test_generated_launches_of_one_form_share_their_code():
    """Two compiled launches that differ only in their values (sizes, a view's offset, a
    constexpr: a new token count) share one generated factory, and each hands the launcher
    its own values; a launch of another form (a pointer where the other has a value) gets
    its own."""
    from prepared_fixtures import StubCompiled

    seen: list = []
    direct = (lambda *a: seen.append(a), False, False)
    x = torch.arange(64, dtype=torch.float32)
    types = ["*fp32", "*fp32", "i32", "fp32", "constexpr"]
    before = len(PR._FACTORIES)
    a = PR.PreparedLaunch.generated([x, x[8:], 7, 0.5, 16], types, [x], (3,), None,
                                    StubCompiled, direct)  # fmt: skip
    b = PR.PreparedLaunch.generated([x, x[24:], 9, 2.0, 32], types, [x], (5, 2), None,
                                    StubCompiled, direct)  # fmt: skip
    assert len(PR._FACTORIES) == before + 1
    a.fast(1, [1000])
    b.fast(2, [2000])
    assert seen[0][:4] == (3, 1, 1, 1) and seen[0][13:] == (1000, 1000 + 32, 7, 0.5, 16)
    assert seen[1][:4] == (5, 2, 1, 2) and seen[1][13:] == (2000, 2000 + 96, 9, 2.0, 32)
    c = PR.PreparedLaunch.generated([x, x, 7, 0.5, 16], types, [x], (3,), None,
                                    StubCompiled, direct)  # fmt: skip
    assert len(PR._FACTORIES) == before + 2
    c.fast(3, [3000])
    assert seen[2][13:] == (3000, 3000, 7, 0.5, 16)
