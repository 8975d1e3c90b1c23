"""Prepared calls of `pagedattn.mla_decode` (`ops.prepared`, `ops.mla.triton_mla.PreparedMLA`).

A call on the Triton backend is validated and planned once per signature; later calls of that
signature launch the frozen kernels with their own tensors. On a CPU the kernels run in
Triton's interpreter (TRITON_INTERPRET=1), so these tests run the hit path end to end:
- a hit gives the same bytes as the unprepared op (`mla_decode_triton`) on the same inputs:
  dense (the balanced work list and its combine, MTP tiles, split-K and its combine, one
  partition), sparse (indices, top-k lengths, an extra cache), sinks, an FP8 cache whose
  scales the launcher views as bytes; out given or not, new lengths, indices and tensors
  between hits;
- calls that differ in anything the plan reads get separate entries, and calls that differ
  only in tensor data share one;
- a bad argument raises its typed error after a good call of the same shapes has hit;
- the compiled form (`PreparedLaunch.bound` / `generated`, what a CUDA hit runs) hands the
  launcher the pointers and values that the full path's launch had for the same call, for
  the kernels an H200 plans: the keys-as-M kernel and the work-list combine, the TMA-fed
  seesaw (its descriptors re-encoded for the call's cache), the 2-CTA cluster seesaw (its
  cluster size and shared offsets), the persistent kernel and its cut-token combine.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

from bad_inputs import assert_rejected, tensor_variants  # noqa: E402
from prepared_fixtures import count_full_paths, fresh_prepared  # noqa: E402

from pagedattn import KVCacheParams, KVQuantConfig, PagedOperand  # noqa: E402
from pagedattn.errors import InvalidArgumentError  # noqa: E402
from pagedattn.ops import offline  # noqa: E402
from pagedattn.ops import prepared as PR  # noqa: E402
from pagedattn.ops.launch import _SMEM_OFFSETS, Launched  # noqa: E402
from pagedattn.ops.mla import mla_decode  # noqa: E402
from pagedattn.ops.mla import triton_mla as TM  # noqa: E402
from pagedattn.ops.mla import triton_mla_combine as MC  # noqa: E402
from pagedattn.ops.mla import worklist as WL  # noqa: E402
from pagedattn.ops.mla.triton_mla_plan import SS_CROSS_SMEM  # noqa: E402
from pagedattn.testing import make_paged_cache, ragged_offsets  # noqa: E402

BF16, E8M0 = torch.bfloat16, torch.float8_e8m0fnu
DEV = "cuda" if torch.cuda.is_available() else "cpu"
D, DV, H = 64, 32, 4  # small BF16 latent (any d_qk <= 576), so that the interpreter is quick


@pytest.fixture(autouse=True)
def fresh_cache():
    yield from fresh_prepared(TM)


@pytest.fixture
def full_paths(monkeypatch):
    """Counts the full-path runs (misses and unprepared calls) of `mla_decode` and
    `mla_decode_triton`."""
    return count_full_paths(monkeypatch, TM)


def cache(lens, q_lens=None, *, d=D, page=16, dtype=BF16, quant=None, seed=0, extra_pages=3):
    """(operand of layer 1 of a 2-layer paged MLA cache, its inputs): shuffled pages, random
    values in the requests' tokens' pages, NaN elsewhere."""
    g = torch.Generator().manual_seed(seed)
    p = KVCacheParams(dtype, 2, 1, d, page, is_mla=True, num_q_heads=H, quantization=quant,
                      mla_rope_dim=min(64, d // 4), devices=(DEV,))  # fmt: skip
    pc = make_paged_cache(p, lens, q_lens or [1] * len(lens), generator=g, device=DEV,
                          extra_pages=extra_pages)  # fmt: skip
    blocks = pc.inputs.kv_blocks
    blocks.copy_(torch.randn(blocks.shape, generator=g).to(blocks.dtype))
    if pc.inputs.kv_scales is not None:  # e8m0 exponents around 1
        s = pc.inputs.kv_scales.view(torch.uint8)
        s.copy_(torch.randint(124, 130, s.shape, generator=g, dtype=torch.uint8))
    return PagedOperand(pc.inputs, p, 1, "k"), pc.inputs


def make_q(tokens, d=D, dtype=BF16, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(tokens, H, d, generator=g).to(dtype).to(DEV)


def sparse_indices(tokens, width, slots, seed):
    """[tokens, width] int32 encoded indices with invalid entries of several kinds."""
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, slots, (tokens, width), generator=g, dtype=torch.int32)
    idx[:, 1] = -1
    idx[0, 2] = slots  # one past the end
    idx[-1, 3] = -(2**31)
    return idx.to(DEV)


def same(a, b):
    """Bitwise equal (out, lse) pairs, NaN positions included."""
    assert len(a) == len(b) == 2
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.equal(x.isnan(), y.isnan())
        assert torch.equal(x.nan_to_num(), y.nan_to_num())


def sinks():
    return torch.tensor([float("inf"), 0.5, -1.0, float("-inf")], device=DEV)


def offsets(q_lens):
    return ragged_offsets(q_lens, DEV)


# (name, cache lengths, query lengths, kwargs); "sparse" / "extra" / "fp8" build their tensors
CASES = [
    ("balanced", [5, 40, 9], [1, 1, 1], {}),
    ("mtp tiles, sinks", [3, 30], [2, 3], dict(attn_sink=True)),
    ("split-K", [30, 3, 17], [1, 1, 1], dict(num_partitions=3, causal=False)),
    ("one partition", [1, 17, 8, 12], [1, 1, 1, 1], dict(num_partitions=1, scale=0.3)),
    ("sparse", [20, 33], [1, 2], dict(sparse=True, num_partitions=2)),
    (
        "sparse, extra cache, sinks",
        [12, 25],
        [2, 1],
        dict(sparse=True, extra=True, attn_sink=True),
    ),  # fmt: skip
    ("fp8 blockwise e8m0", [9, 21], [1, 1], dict(fp8=True)),
]


def _call_kwargs(kw, kv, q_lens, step):
    """The case's mla_decode keywords for one step (fresh indices each step)."""
    kw = dict(kw)
    tokens = sum(q_lens)
    if kw.pop("attn_sink", False):
        kw["attn_sink"] = sinks()
    kw.pop("fp8", None)
    if kw.pop("sparse", False):
        slots = kv.num_sparse_slots()
        kw["indices"] = sparse_indices(tokens, 24, slots, seed=10 + step)
        kw["topk_lengths"] = torch.tensor([24, 7 + step][: len(q_lens)], dtype=torch.int32,
                                          device=DEV)  # fmt: skip
    if kw.pop("extra", False):
        x, _ = cache([16, 16], seed=5)
        kw["extra_kv"] = x
        kw["extra_indices"] = sparse_indices(tokens, 8, x.num_sparse_slots(), seed=20 + step)
    return kw


@pytest.mark.parametrize("out_given", [False, True])
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_hit_equals_unprepared(case, out_given, full_paths):
    """Miss, then hits: the same bytes as `mla_decode_triton`; new lengths, new q, indices and
    out between hits; only the first call takes the full path."""
    _, lens, q_lens, kw = next(c for c in CASES if c[0] == case)
    fp8 = kw.get("fp8", False)
    d, d_v = (512, 512) if fp8 else (D, DV)
    quant = KVQuantConfig.blockwise(64, E8M0) if fp8 else None
    kv, inputs = cache(lens, q_lens, d=d, quant=quant)
    offs = offsets(q_lens)
    tokens = sum(q_lens)
    for step in range(3):
        q = make_q(tokens, d=d, seed=step)
        if step == 2:  # shorter contexts than the cache holds: a hit with new lengths
            inputs.cache_lengths.copy_(torch.tensor([max(0, n - 3) for n in lens]))
        ckw = _call_kwargs(kw, kv, q_lens, step)
        out = None
        if out_given:
            out = torch.full((tokens, H, d_v), float("nan"), dtype=BF16, device=DEV)
        want = TM.mla_decode_triton(q, kv, offs, d_v=d_v, **ckw)
        before = len(full_paths)
        got = mla_decode(q, kv, offs, d_v=d_v, backend="triton", out=out, **ckw)
        same(got, want)
        if out_given:
            assert got[0] is out
        assert len(full_paths) - before == (1 if step == 0 else 0)  # a miss, then hits
    assert len(TM.PREPARED.cache) == 1
    (entries,) = TM.PREPARED.cache._d.values()
    assert entries[0][2] is not None  # prepared, not merely marked


def test_other_tensors_same_signature_share_the_entry(full_paths):
    """A second cache (other pages, other data, other lengths) and query of the same shapes
    hits the first call's entry and reads its own tensors."""
    kv1, _ = cache([9, 14], seed=1)
    kv2, inputs2 = cache([9, 14], seed=2)
    inputs2.cache_lengths.copy_(torch.tensor([5, 2]))
    q1, q2 = make_q(2, seed=3), make_q(2, seed=4)
    offs = offsets([1, 1])
    same(mla_decode(q1, kv1, offs, d_v=DV, backend="triton"),
         TM.mla_decode_triton(q1, kv1, offs, d_v=DV))  # fmt: skip
    n = len(full_paths)
    got = mla_decode(q2, kv2, offs, d_v=DV, backend="triton")
    assert len(full_paths) == n  # a hit
    same(got, TM.mla_decode_triton(q2, kv2, offs, d_v=DV))
    assert len(TM.PREPARED.cache) == 1


def _variants():
    """Calls that differ from the base call in one planned property each."""
    base = dict(lens=[6, 11], q_lens=[1, 1], page=16, dtype=BF16, q_stride=None, kw={})
    yield "base", base
    yield "dtype", dict(base, dtype=torch.float16)
    yield "page size", dict(base, page=8)
    yield "q stride", dict(base, q_stride=80)  # q a view of wider rows: stride(1) 80, not 64
    yield "query lengths", dict(base, q_lens=[2, 1])
    yield "d_v", dict(base, kw=dict(d_v=16))
    yield "causal", dict(base, q_lens=[2, 1], kw=dict(causal=False))
    yield "partitions", dict(base, kw=dict(num_partitions=2))
    yield "scale", dict(base, kw=dict(scale=0.5))
    yield "sinks", dict(base, kw=dict(attn_sink=torch.zeros(H, device=DEV)))
    yield "sparse", dict(base, kw=dict(indices=torch.zeros(2, 4, dtype=torch.int32, device=DEV)))
    yield "batch", dict(base, lens=[6, 11, 2], q_lens=[1, 1, 1])
    yield "no lse", dict(base, kw=dict(return_lse=False))


def _variant_call(spec):
    kv, _ = cache(spec["lens"], spec["q_lens"], page=spec["page"], dtype=spec["dtype"])
    tokens = sum(spec["q_lens"])
    q = make_q(tokens, dtype=spec["dtype"])
    if spec["q_stride"]:
        wide = torch.zeros(tokens, H, spec["q_stride"], dtype=spec["dtype"], device=DEV)
        wide[..., :D] = q
        q = wide[..., :D]
    kw = {"d_v": DV, **spec["kw"]}
    return q, kv, offsets(spec["q_lens"]), kw


def _no_flag(kw):
    """`mla_decode` keywords without return_lse (for `mla_decode_triton`)."""
    return {k: v for k, v in kw.items() if k != "return_lse"}


def _with_lse(res, want):
    """A result as (out, lse): want's LSE where the call returned out alone."""
    return res if isinstance(res, tuple) else (res, want[1])


@pytest.mark.parametrize("case", ["balanced", "mtp tiles, sinks", "split-K", "one partition"])
def test_hit_without_the_lse(case, full_paths):
    """return_lse=False: out alone, the same bytes as the full path's out (miss and hits, new
    q and lengths between them); the prepared entry takes the LSE from the workspace (no
    allocation a call), and a call with the LSE is another entry."""
    _, lens, q_lens, kw = next(c for c in CASES if c[0] == case)
    kv, inputs = cache(lens, q_lens)
    offs = offsets(q_lens)
    for step in range(3):
        q = make_q(sum(q_lens), seed=step)
        if step == 2:
            inputs.cache_lengths.copy_(torch.tensor([max(0, n - 3) for n in lens]))
        ckw = _call_kwargs(kw, kv, q_lens, step)
        want = TM.mla_decode_triton(q, kv, offs, d_v=DV, **ckw)
        before = len(full_paths)
        got = mla_decode(q, kv, offs, d_v=DV, backend="triton", return_lse=False, **ckw)
        assert isinstance(got, torch.Tensor)
        same((got, want[1]), want)
        assert len(full_paths) - before == (1 if step == 0 else 0)
    (entries,) = TM.PREPARED.cache._d.values()
    entry = entries[0][2]
    assert not entry.return_lse and TM._LSE in [p[0] for p in entry.parts]
    with_lse = mla_decode(q, kv, offs, d_v=DV, backend="triton", **ckw)
    same(with_lse, want)
    assert len(TM.PREPARED.cache) == 2


def test_key_separates_planned_properties():
    """Each variant gets its own entry (and the same bytes as the unprepared op), and repeating
    every variant adds none."""
    variants = list(_variants())
    for i, (name, spec) in enumerate(variants):
        q, kv, offs, kw = _variant_call(spec)
        want = TM.mla_decode_triton(q, kv, offs, **_no_flag(kw))
        same(_with_lse(mla_decode(q, kv, offs, backend="triton", **kw), want), want)
        assert len(TM.PREPARED.cache) == i + 1, name
    for _name, spec in variants:
        q, kv, offs, kw = _variant_call(spec)
        want = TM.mla_decode_triton(q, kv, offs, **_no_flag(kw))
        same(_with_lse(mla_decode(q, kv, offs, backend="triton", **kw), want), want)
    assert len(TM.PREPARED.cache) == len(variants)


def test_environment_is_keyed(monkeypatch, full_paths):
    """A tuning override set between two calls re-plans the second (here: split-K instead of
    the balanced work list)."""
    kv, _ = cache([12, 7])
    q, offs = make_q(2), offsets([1, 1])
    monkeypatch.delenv("PAGEDATTN_MLA_TUNING", raising=False)
    mla_decode(q, kv, offs, d_v=DV, backend="triton")
    n = len(full_paths)
    monkeypatch.setenv("PAGEDATTN_MLA_TUNING", '{"balanced": false}')
    same(mla_decode(q, kv, offs, d_v=DV, backend="triton"),
         TM.mla_decode_triton(q, kv, offs, d_v=DV))  # fmt: skip
    assert len(full_paths) == n + 2 and len(TM.PREPARED.cache) == 2


def test_misaligned_pointer_is_a_separate_entry(full_paths):
    """A q at an odd element offset (not 16-byte aligned) with the same shape and strides
    misses the aligned entry (Triton specializes on alignment) and gets its own, which keys
    the pointers' low four bits."""
    kv, _ = cache([8, 5])
    offs = offsets([1, 1])
    base = make_q(4).reshape(-1)
    aligned = base[: 2 * H * D].view(2, H, D)
    odd = base[1 : 1 + 2 * H * D].view(2, H, D)
    same(mla_decode(aligned, kv, offs, d_v=DV, backend="triton"),
         TM.mla_decode_triton(aligned, kv, offs, d_v=DV))  # fmt: skip
    n = len(full_paths)
    same(mla_decode(odd, kv, offs, d_v=DV, backend="triton"),
         TM.mla_decode_triton(odd, kv, offs, d_v=DV))  # fmt: skip
    assert len(full_paths) == n + 2  # a miss (and mla_decode_triton's own call)
    (key,) = TM.PREPARED.cache._d
    entries = [e for _, _, e in TM.PREPARED.cache.candidates(key)]
    assert len(entries) == 2 and entries[1].aligned is True
    assert entries[0].aligned[entries[0].inputs.index(0)] == odd.data_ptr() & 15 != 0
    n = len(full_paths)
    mla_decode(odd, kv, offs, d_v=DV, backend="triton")
    mla_decode(aligned, kv, offs, d_v=DV, backend="triton")
    assert len(full_paths) == n  # both hit now


def test_unpreparable_signatures_keep_the_full_path(full_paths):
    """Sparse indices the launcher must copy (last dim not contiguous) and a call with no
    token are stored as not preparable: correct, and never prepared again. float32 queries
    take the reference: nothing is stored."""
    kv, _ = cache([6, 4])
    offs = offsets([1, 1])
    q = make_q(2)
    idx = sparse_indices(2, 6, kv.num_sparse_slots(), seed=3)
    idx_t = idx.t().contiguous().t()  # stride(1) != 1
    empty_q, empty_offs = make_q(0), torch.zeros(3, dtype=torch.int32, device=DEV)
    for _ in range(2):
        same(mla_decode(q, kv, offs, d_v=DV, indices=idx_t, backend="triton"),
             TM.mla_decode_triton(q, kv, offs, d_v=DV, indices=idx))  # fmt: skip
        o, lse = mla_decode(empty_q, kv, empty_offs, d_v=DV, backend="triton")
        assert o.shape == (0, H, DV) and lse.shape == (0, H)
    assert [e for c in TM.PREPARED.cache._d.values() for _, _, e in c] == [None, None]
    kv_f32, _ = cache([6, 4], dtype=torch.float32)
    n = len(full_paths)
    for _ in range(2):
        mla_decode(q.float(), kv_f32, offs, d_v=DV, backend="triton")
    assert len(full_paths) == n and len(TM.PREPARED.cache) == 2


def test_aliasing_arguments_are_not_stored():
    """out=q (one tensor for two arguments, d_v = d_qk) is never prepared (its guard could not
    pass)."""
    kv, _ = cache([6, 4])
    q, offs = make_q(2), offsets([1, 1])
    want = TM.mla_decode_triton(q.clone(), kv, offs, d_v=D)
    got = mla_decode(q, kv, offs, d_v=D, backend="triton", out=q)
    assert got[0] is q
    same(got, want)
    assert len(TM.PREPARED.cache) == 0


def test_offline_capture_prepares_nothing():
    """An offline capture replaces the launcher module's `launch`: the launches are recorded
    by the capture, none is run, and nothing is prepared from them."""
    kv, _ = cache([6, 4])
    q, offs = make_q(2), offsets([1, 1])
    call = lambda: mla_decode(q, kv, offs, d_v=DV, backend="triton", num_partitions=1)  # noqa: E731
    made = offline.capture(TM, call)
    assert [m.name for m in made] == ["_mla_decode_kernel"]
    assert len(TM.PREPARED.cache) == 0


def test_shared_operand_fields_are_keyed(full_paths):
    """extra_kv that is kv (its tensors the same objects, which the key records and the guard
    leaves out) and extra_kv that is another cache are separate entries, each correct."""
    kv, _ = cache([10, 7])
    other, _ = cache([10, 7], seed=9)
    q, offs = make_q(2), offsets([1, 1])
    idx = sparse_indices(2, 8, kv.num_sparse_slots(), seed=4)
    x_idx = sparse_indices(2, 4, kv.num_sparse_slots(), seed=5)
    for x in (kv, other, kv, other):
        kw = dict(d_v=DV, indices=idx, extra_kv=x, extra_indices=x_idx)
        same(mla_decode(q, kv, offs, backend="triton", **kw),
             TM.mla_decode_triton(q, kv, offs, **kw))  # fmt: skip
    assert len(TM.PREPARED.cache) == 2
    assert all(e is not None for c in TM.PREPARED.cache._d.values() for _, _, e in c)


# --------------------------------------------------------------------------------------------
# Bad inputs after a hit
# --------------------------------------------------------------------------------------------
def _good():
    kv, inputs = cache([7, 3], [1, 2])
    x, _ = cache([4, 4], seed=3)
    kw = dict(q=make_q(3), kv=kv, q_row_offsets=offsets([1, 2]), d_v=DV, scale=0.25,
              causal=True, indices=sparse_indices(3, 6, kv.num_sparse_slots(), seed=1),
              topk_lengths=torch.tensor([6, 4], dtype=torch.int32, device=DEV),
              extra_kv=x, extra_indices=sparse_indices(3, 4, x.num_sparse_slots(), seed=2),
              extra_topk_lengths=torch.tensor([3, 4], dtype=torch.int32, device=DEV),
              attn_sink=torch.zeros(H, device=DEV), num_partitions=2,
              out=torch.zeros(3, H, DV, dtype=BF16, device=DEV))  # fmt: skip
    return kw, inputs


def _bad_values(kw):
    other, _ = cache([7, 3], d=32)  # another head dim
    tensors = ("q", "q_row_offsets", "indices", "topk_lengths", "extra_indices",
               "extra_topk_lengths", "attn_sink", "out")  # fmt: skip
    out = {  # (a shorter index row is another valid stride)
        name: [t for why, t in tensor_variants(kw[name])
               if not (why == "last dim - 1" and name.endswith("indices"))]
        for name in tensors
    }  # fmt: skip
    out["out"].append(kw["out"].transpose(1, 2).contiguous().transpose(1, 2))  # stride(2) 3
    out["kv"] = [kw["q"], other, "kv"]
    out["extra_kv"] = [kw["q"], other, 1]
    out["d_v"] = [0, -1, 513, D + 1, 32.0, "32", True]
    out["scale"] = [0.0, -0.25, float("nan"), float("inf"), "0.25", True, [0.25]]
    out["causal"] = [1, "yes", None]
    out["num_partitions"] = [0, -1, 65536, 2.0, "2", True]
    out["backend"] = ["cuda", 0, ""]
    out["return_lse"] = [1, 0, "yes", None]
    return out


ALSO = {  # (a batch or token count other arguments are checked against: they may be named)
    "q": ("q", "kv", "out", "indices"),
    "q_row_offsets": ("q_row_offsets", "topk_lengths"),
    "kv": ("kv", "q"),
    "extra_kv": ("extra_kv", "q"),
}


def test_bad_arguments_after_a_hit_raise_typed_errors():
    """After a good call (sparse, extra cache, sinks, split-K) has been prepared and hit, each
    bad value of each argument (same shapes otherwise) raises InvalidArgumentError naming it,
    and writes nothing."""
    kw, inputs = _good()
    for _ in range(2):
        mla_decode(**kw, backend="triton")
    assert len(TM.PREPARED.cache) == 1
    assert all(e is not None for c in TM.PREPARED.cache._d.values() for _, _, e in c)
    for name, values in _bad_values(kw).items():
        for bad in values:
            call = dict(kw, backend="triton")
            call[name] = bad
            state = (kw["out"], inputs.kv_blocks, kw["q"])
            assert_rejected(mla_decode, state=state, names=ALSO.get(name, name), **call)
        mla_decode(**kw, backend="triton")  # the good call still hits after them
    assert len(TM.PREPARED.cache) == 1
    with pytest.raises(InvalidArgumentError, match="outs"):
        mla_decode(**kw, backend="triton", outs=None)


# --------------------------------------------------------------------------------------------
# The compiled form (what a CUDA hit runs), from Triton's own binder
# --------------------------------------------------------------------------------------------
_BINDERS: dict = {}


def _binder(kernel):
    """Triton's binder of `kernel` (what `JITFunction.run` binds with), for an sm_90 target."""
    from triton.runtime.jit import JITFunction, create_function_from_signature

    if kernel not in _BINDERS:
        jf = kernel if isinstance(kernel, JITFunction) else JITFunction(kernel.fn)
        _BINDERS[kernel] = create_function_from_signature(
            jf.signature, jf.params, offline._backend()[1]
        )
    return _BINDERS[kernel]


def _bind(m):
    """(bound values, their specialized types) of a captured launch."""
    bound, spec, _ = _binder(m.kernel)(*m.args, **m.kwargs)
    return bound, [ty for ty, _ in spec]


class _Recorder:
    """Triton's CudaLauncher as a prepared launch reads it: no scratch, `launch` records its
    arguments (wrapped in Triton's own tensor-descriptor handling where the kernel takes
    descriptors, with the launcher metadata None: the encoding that runs on a CPU)."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self, seen: list, types: list) -> None:
        from triton.backends.nvidia.driver import wrap_handle_tensordesc

        self.launch = wrap_handle_tensordesc(lambda *a: seen.append(a),
                                             dict(enumerate(types)), None)  # fmt: skip


class _Ck:
    """The parts of a CompiledKernel a prepared launch reads."""

    function, name = 11, "stub"

    def __init__(self, seen, types, meta=(4, 1, 0)) -> None:
        self.run = _Recorder(seen, types)
        self.packed_metadata = meta


def _flatten(values, types):
    """Values as the C launcher receives them: tuples flattened, descriptors expanded (the
    CPU encoding: base, shape, strides, padding, shape, strides)."""
    out = []
    for v, ty in zip(values, types):
        if type(v) is tuple:
            out += _flatten(v, ty)
        elif PR._is_descriptor(v, ty):
            out += [("desc", v.base.data_ptr()), *v.shape, *v.strides, v.padding == "nan",
                    *v.shape, *v.strides]  # fmt: skip
        else:
            out.append(v)
    return out


def _flat_got(args):
    out = []
    for x in args:
        if type(x) is tuple:
            out += _flat_got(x)
        elif isinstance(x, PR._Ptr):
            out.append(("desc", x.data_ptr()))
        else:
            out.append(x)
    return out


H200 = dict(_use_sm90_path=TM.sm90_serves, fast_hbm=lambda device: True)


def _captured(args, plan_as, tuning):
    """The launches (not run) a full path of `args` makes as an H200 would (plan_as) or on
    this machine, and what it ran."""
    ran, made = [], []

    def call():
        ran.append(TM._full_path(*args, tuning)[1])

    def inner():
        made.extend(offline.capture(WL, lambda: made.extend(offline.capture(MC, call))))

    first = offline.capture(TM, inner, **plan_as)
    return first + made, ran[0]


def _sm90_case(name, seed):
    """(mla_decode_triton's positional args, plan patches, tuning) of a compiled-form case."""
    from pagedattn.ops.mla import tuning

    g = torch.Generator().manual_seed(seed)
    fmt = {"v32 cluster": KVQuantConfig.flashmla_v32(), "persistent": KVQuantConfig.flashmla_v32()}
    items = name.endswith(" items")  # the item list instead of the contiguous runs
    name = name.removesuffix(" items").replace("tl", "tl balanced") if items else name
    st_runs = name == "tma seesaw runs"  # the TMA-fed seesaw on its (opt-in) runs
    name = "tma seesaw" if st_runs else name
    h_q = {"keys-as-M": 16, "tma seesaw": 64, "v32 cluster": 128, "persistent": 128}.get(name, 4)
    d, dv = (576, 512) if name in ("keys-as-M", "tma seesaw", "v32 cluster", "persistent") else (
        D, DV)  # fmt: skip
    p = KVCacheParams(BF16, 2, 1, d, 64, is_mla=True, num_q_heads=h_q,
                      quantization=fmt.get(name), mla_rope_dim=64 if d == 576 else 16)  # fmt: skip
    # (keys-as-M: one token a tile, the 16 rows that walk the runs; 32 keep the item list)
    lens, q_lens = [700, 90, 333], [1, 1, 1] if name == "keys-as-M" and not items else [1, 2, 1]
    pc = make_paged_cache(p, lens, q_lens, generator=g)
    kv = PagedOperand(pc.inputs, p, 1, "k")
    tokens = sum(q_lens)
    q = torch.randn(tokens, h_q, d, generator=g).to(BF16)
    offs = ragged_offsets(q_lens)
    out = torch.empty(tokens, h_q, dv, dtype=BF16)
    sink = torch.randn(h_q, generator=g)
    idx = topk = None
    parts = None
    if name in ("v32 cluster", "persistent"):
        idx = torch.randint(-1, kv.num_sparse_slots(), (tokens, 200), generator=g,
                            dtype=torch.int32)  # fmt: skip
        topk = torch.tensor([200, 50, 0], dtype=torch.int32)
        parts = 1 if name == "persistent" else None
    if name in ("tl split", "v32 cluster"):
        parts = 2
    cfg = tuning.from_env()
    if name == "persistent":  # 3 clusters over 4 tokens of 2 tile pairs: boundaries cut tokens
        cfg = cfg.replace(ss_persist=True, ps_g=3)
    if items:
        cfg = cfg.replace(wl_runs=False)
    if st_runs:
        cfg = cfg.replace(wl_st_runs=True)
    args = (q, kv, offs, dv, None, True, idx, topk, None, None, None, sink, parts, out)
    plan_as = {} if name.startswith("tl") else H200
    return args, plan_as, cfg


COMPILED_CASES = {  # name -> (decode kernel, combine kernel or None)
    "tl balanced": ("_mla_decode_kernel", "_mla_runs_combine_kernel"),
    "tl items": ("_mla_decode_kernel", "_mla_worklist_combine_kernel"),
    "tl split": ("_mla_decode_kernel", "_mla_combine_kernel"),
    "keys-as-M": ("_mla_decode_sm90_t", "_mla_runs_combine_kernel"),
    "keys-as-M items": ("_mla_decode_sm90_t", "_mla_worklist_combine_kernel"),
    "tma seesaw": ("_mla_decode_sm90_st", "_mla_worklist_combine_kernel"),
    "tma seesaw runs": ("_mla_decode_sm90_st", "_mla_runs_combine_kernel"),
    "v32 cluster": ("_mla_decode_sm90_ss", "_mla_combine_kernel"),
    "persistent": ("_mla_decode_sm90_ps", "_mla_combine_kernel"),
}


@pytest.mark.parametrize("name", list(COMPILED_CASES))
def test_compiled_form_passes_the_full_paths_arguments(monkeypatch, name):
    """The compiled form of a prepared call (the code a CUDA hit runs, from Triton's binder;
    its C launcher a recorder here): for a second call with other tensors, each launch gets
    the grid, metadata (a cluster launch's num_ctas), values and pointers that the full path's
    own launch of that call has (pointers: data_ptr of the tensor it passes, also inside
    tuples and descriptors; the split buffers: the stream's workspace; the LSE: the call's;
    shared offsets: the compiled kernel's)."""
    seen: list = []
    cks: dict = {}
    offs_of = {"OFF_K": 1024, "OFF_READY": 96, "OFF_REMPTY": 112}

    def stub_build(rec, sources, descriptors=False):
        bound, types = _bind(rec)
        cluster = getattr(rec, "cluster", 1)
        ck = cks.setdefault((rec.kernel, cluster), _Ck(seen, types))
        smem = SS_CROSS_SMEM if cluster > 1 else None
        if smem:
            _SMEM_OFFSETS[ck] = {alloc: offs_of[n] for n, alloc in smem.items()}
        launched = Launched(rec.kernel, rec.grid, rec.args, rec.kwargs, ck, cluster, smem)
        return PR.PreparedLaunch.bound(launched, bound, types, sources, descriptors)

    args1, plan_as, cfg = _sm90_case(name, 1)
    made, ran = _captured(args1, plan_as, cfg)
    kernels = [m.name for m in made]
    decode_k, combine_k = COMPILED_CASES[name]
    assert kernels == [decode_k] + ([combine_k] if combine_k else []), kernels
    key, src = TM._signature(*args1, "triton")
    src[TM._OUT], src[TM._LSE] = ran.a.out, ran.a.lse
    src[TM._PO], src[TM._PL], src[TM._CUT] = ran.po, ran.pl, ran.cut_t
    monkeypatch.setattr(PR.PreparedLaunch, "build", staticmethod(stub_build))
    entry = TM._prepare_decode(made, src, ran, True)
    assert entry is not None and entry.decode.compiled and entry.decode.fast is not None
    assert (entry.combine is not None) == ran.combine

    args2, _, _ = _sm90_case(name, 2)  # other tensors (and data) of the same signature
    key2, src2 = TM._signature(*args2, "triton")
    assert key2 == key
    result = entry(src2)
    assert result[0] is args2[-1]
    want, ran2 = _captured(args2, plan_as, cfg)
    assert len(seen) == len(want) == len(made)
    stream = PR.current_stream(PR.current_device(args2[0]))  # (0 on a CPU)
    _, base = PR.workspace(args2[0].device, stream, max(entry.ws_numel, 1))
    where = {i: base + 4 * off for i, _, _, off, _ in entry.parts}
    fresh = {id(t): where[i] for i, t in ((TM._PO, ran2.po), (TM._PL, ran2.pl),
                                           (TM._CUT, ran2.cut_t)) if t is not None}  # fmt: skip
    fresh[id(ran2.a.lse)] = result[1].data_ptr()
    for a, m in zip(seen, want):
        grid = tuple(m.grid) + (1,) * (3 - len(m.grid))
        assert a[:3] == grid and a[3] == stream and a[4] == _Ck.function
        assert a[9] == (4, m.cluster, 0)  # num_ctas: the cluster size
        bound, types = _bind(m)
        if m.cluster > 1:
            for n in SS_CROSS_SMEM:
                bound[n] = offs_of[n]
        values = _flatten(list(bound.values()), types)
        got = _flat_got(a[13:])
        assert len(got) == len(values)
        for x, y in zip(got, values):
            if isinstance(y, torch.Tensor):
                assert x == fresh.get(id(y), y.data_ptr())
            else:
                assert x == y


def test_descriptors_are_encoded_once_per_pointer():
    """`_Descriptors`: the recorded descriptor's shape, strides and block over each call's base
    pointer, encoded once per pointer (at most MAX_DESCRIPTORS kept)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = torch.zeros(64, 1, 128, dtype=BF16)
    desc = TensorDescriptor(rows, [64, 128], [128, 1], [16, 64])
    calls = []

    def expand(d, meta):
        calls.append(d.base.data_ptr())
        return [("map", d.base.data_ptr(), tuple(d.shape), tuple(d.strides), meta)]

    ds = PR._Descriptors(desc, "meta", expand)
    a = ds.expanded(4096)
    assert ds.expanded(4096) is a and calls == [4096]
    assert a == [("map", 4096, (64, 128), (128, 1), "meta")]
    assert ds.expanded(8192)[0][1] == 8192 and calls == [4096, 8192]
    at = ds.at(12288)
    assert at.base.data_ptr() == 12288 and at.block_shape == [16, 64] and at.base.dtype == BF16
    for p in range(PR.MAX_DESCRIPTORS + 5):
        ds.expanded(16 * (p + 1000))
    assert len(ds.cache) <= PR.MAX_DESCRIPTORS


def test_descriptors_need_the_ops_consent():
    """`PreparedLaunch.generated` refuses a descriptor argument unless the op opted in (mha's
    launches with descriptors keep their full path)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = torch.zeros(64, 128, dtype=BF16)
    desc = TensorDescriptor(rows, [64, 128], [128, 1], [16, 64])
    ty = "tensordesc<bf16[16, 64]>"
    seen: list = []
    ck = _Ck(seen, ["*bf16", ty])
    direct = (ck.run.launch, False, False)
    assert PR.PreparedLaunch.generated([rows, desc], ["*bf16", ty], [rows], (1,), None, ck,
                                       direct) is None  # fmt: skip
    pl = PR.PreparedLaunch.generated([rows, desc], ["*bf16", ty], [rows], (1,), None, ck, direct,
                                     descriptors=(None, None, lambda d, m: [d.base]))  # fmt: skip
    assert pl is not None and pl.sources == (0,)
    pl.fast(0, [rows.data_ptr()])
    got = _flat_got(seen[0][13:])
    assert got[0] == rows.data_ptr() and got[1] == ("desc", rows.data_ptr())


def test_unwrap_tensordesc_finds_tritons_c_launch():
    """`_unwrap_tensordesc` takes the C launch and the descriptors' metadata out of Triton's
    descriptor handling, and None of anything else."""
    from triton.backends.nvidia.driver import wrap_handle_tensordesc

    def raw(*a):
        return a

    wrapped = wrap_handle_tensordesc(raw, {0: "*bf16", 1: "tensordesc<bf16[16, 64]>"}, None)
    assert PR._unwrap_tensordesc(wrapped) == (raw, [None])
    assert PR._unwrap_tensordesc(raw) is None and PR._unwrap_tensordesc(print) is None


def test_interpreted_tuples_and_keyword_tensors():
    """The interpreted form rebuilds tuple arguments and tensor keywords from the call's
    sources (the tl kernel's argument tuples, the combine's CUT_T)."""
    a, b = torch.zeros(4), torch.ones(4, dtype=torch.int32)
    t = PR._template((a, 3, (b.view(torch.float32), None)), [b, a])
    assert t == ("t", [("s", 1, None), ("v", 3), ("t", [("s", 0, torch.float32), ("v", None)])])
    c, d = torch.full((4,), 2.0), torch.full((4,), 5, dtype=torch.int32)
    got = PR._fill(t, [d, c])
    assert got[0] is c and got[1] == 3 and got[2][1] is None
    assert torch.equal(got[2][0], d.view(torch.float32))
    assert PR._template((a, object()), [a]) is None
    assert PR._template(torch.zeros(2), [a]) is None  # no source of it
