"""Bad arguments of the public ops (`mha`, `mla_decode`, `mla_decode_branch_fp8`, `fp8_bmm`):
each must raise a `PagedAttnError` naming the argument and change nothing (no byte of the
cache, of an out buffer or of any tensor argument).

Regression cases first (a missing or unknown keyword was Python's bare TypeError; a negative
weight scale was taken), then one hypothesis test per op: a valid call at tiny shapes with one
argument replaced by a random bad value, on the reference and on the Triton backend (a
rejected call never launches a kernel, so the interpreter costs nothing here).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math

import pytest
import torch
from bad_inputs import assert_rejected, bad_floats, bad_ints, tensor_variants
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pagedattn import InvalidArgumentError, KVCacheParams, KVQuantConfig, PagedOperand
from pagedattn.ops import masks
from pagedattn.ops.linear import fp8_bmm, make_freqs_cis, quantize_weight_blocks
from pagedattn.ops.mha import mha
from pagedattn.ops.mla import mla_decode
from pagedattn.ops.mla_branch import mla_decode_branch_fp8
from pagedattn.testing import make_paged_cache, ragged_offsets

BF16, F32, E4M3, E8M0 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e8m0fnu
BACKENDS = ["reference", "triton"]
INT32_MAX = 2**31 - 1
SETTINGS = settings(  # one test per (op, argument, backend): a few values each
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)


def _call(fn, positional: tuple[str, ...], kw: dict):
    """fn(*kw[positional], **rest of kw)."""
    kw = dict(kw)
    return fn(*[kw.pop(n) for n in positional], **kw)


# --------------------------------------------------------------------------------------------
# Valid calls at tiny shapes (built once; every test copies the argument dict)
# --------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Case:
    fn: object
    positional: tuple[str, ...]
    kw: dict  # every argument by name (positional ones included)
    extra_state: tuple = ()  # what the call could change besides its tensor arguments

    def call(self, **over):
        return _call(self.fn, self.positional, {**self.kw, **over})

    def state(self) -> tuple:
        return (*[v for v in self.kw.values() if isinstance(v, torch.Tensor)], *self.extra_state)


@functools.cache
def bmm_case() -> Case:
    g = torch.Generator().manual_seed(1)
    w, ws = quantize_weight_blocks(torch.randn(2, 8, 16, generator=g), 8, 8)
    x = torch.randn(2, 3, 16, generator=g).to(BF16)
    kw = dict(x=x, w=w, w_scale=ws, k_gran=8, n_gran=8, out_dtype=BF16)
    return Case(fp8_bmm, ("x", "w", "w_scale"), kw)


@functools.cache
def mha_case() -> Case:
    g = torch.Generator().manual_seed(2)
    params = KVCacheParams(BF16, num_layers=2, n_kv_heads=2, head_dim=16, page_size=4)
    pc = make_paged_cache(params, [3, 2], [2, 1], generator=g)
    pc.inputs.kv_blocks.normal_(generator=g)
    k, v = PagedOperand(pc.inputs, params, 1, "k"), PagedOperand(pc.inputs, params, 1, "v")
    kw = dict(
        q=torch.randn(3, 4, 16, generator=g).to(BF16),
        k=k,
        v=v,
        q_row_offsets=ragged_offsets([2, 1]),
        mask=masks.sliding_window_causal(3),
        scale=0.25,
        sinks=torch.zeros(4),
        num_partitions=2,
        return_lse=True,
        out=torch.full((3, 4, 16), float("nan"), dtype=BF16),
    )
    return Case(mha, ("q", "k", "v", "q_row_offsets"), kw, (pc.inputs,))


MLA_H = 2


@functools.cache
def mla_case() -> Case:
    g = torch.Generator().manual_seed(3)
    params = KVCacheParams(BF16, 2, 1, 576, 4, is_mla=True, num_q_heads=MLA_H)
    pc = make_paged_cache(params, [3, 2], [1, 2], generator=g)
    pc.inputs.kv_blocks.normal_(generator=g)
    kv = PagedOperand(pc.inputs, params, 1, "k")
    kw = dict(
        q=torch.randn(3, MLA_H, 576, generator=g).to(BF16),
        kv=kv,
        q_row_offsets=ragged_offsets([1, 2]),
        d_v=512,
        scale=0.05,
        causal=True,
        indices=torch.zeros(3, 4, dtype=torch.int32),
        topk_lengths=torch.full((2,), 2, dtype=torch.int32),
        extra_kv=kv,
        extra_indices=torch.ones(3, 2, dtype=torch.int32),
        extra_topk_lengths=torch.ones(2, dtype=torch.int32),
        attn_sink=torch.zeros(MLA_H),
        num_partitions=2,
        out=torch.full((3, MLA_H, 512), float("nan"), dtype=BF16),
    )
    return Case(mla_decode, ("q", "kv", "q_row_offsets"), kw, (pc.inputs,))


BRANCH_POSITIONAL = (
    "q",
    "input_row_offsets",
    "freqs_cis",
    "kv_norm_gamma",
    "kv_inputs",
    "params",
    "layer_idx",
)
BRANCH_REQUIRED_KW = ("scale", "epsilon", "w_uk", "w_uk_scale", "w_uv", "w_uv_scale", "new_kv")


@functools.cache
def branch_case() -> Case:
    g = torch.Generator().manual_seed(4)
    h_q, nope, v_head, rank = 2, 32, 16, 512
    params = KVCacheParams(BF16, 2, 1, 576, 4, is_mla=True, num_q_heads=h_q)
    pc = make_paged_cache(params, [3, 2], [1, 2], generator=g)
    pc.inputs.kv_blocks.normal_(generator=g)
    w_uk, w_uk_s = quantize_weight_blocks(torch.randn(h_q, rank, nope, generator=g) / 8)
    w_uv, w_uv_s = quantize_weight_blocks(torch.randn(h_q, v_head, rank, generator=g) / 8)
    kw = dict(
        q=torch.randn(3, h_q, nope + 64, generator=g).to(BF16),
        input_row_offsets=ragged_offsets([1, 2]),
        freqs_cis=make_freqs_cis(64, 16),
        kv_norm_gamma=torch.ones(rank, dtype=BF16),
        kv_inputs=pc.inputs,
        params=params,
        layer_idx=1,
        scale=0.05,
        epsilon=1e-6,
        w_uk=w_uk,
        w_uk_scale=w_uk_s,
        w_uv=w_uv,
        w_uv_scale=w_uv_s,
        new_kv=torch.randn(3, 1, 576, generator=g).to(BF16),
        k_gran=128,
        n_gran=128,
        mask="causal",
        interleaved_rope=True,
        d_indices=torch.zeros(3, 4, dtype=torch.int32),
        topk_lengths=torch.full((2,), 2, dtype=torch.int32),
        attn_sink=torch.zeros(h_q),
        extra_kv=PagedOperand(pc.inputs, params, 0, "k"),
        extra_d_indices=torch.ones(3, 2, dtype=torch.int32),
        extra_topk_lengths=torch.ones(2, dtype=torch.int32),
        num_partitions=None,
        out=torch.full((3, h_q, v_head), float("nan"), dtype=BF16),
    )
    return Case(mla_decode_branch_fp8, BRANCH_POSITIONAL, kw, (pc.inputs,))


CASES = {"fp8_bmm": bmm_case, "mha": mha_case, "mla_decode": mla_case, "branch": branch_case}


@pytest.mark.parametrize("op", list(CASES))
def test_valid_baselines_run(op):
    """The baselines the bad values replace an argument of are valid (reference backend)."""
    c = CASES[op]()
    if op == "branch":  # it writes the cache: run it on a copy
        inputs = c.kw["kv_inputs"]
        twin = dataclasses.replace(inputs, kv_blocks=inputs.kv_blocks.clone())
        c.call(kv_inputs=twin, extra_kv=PagedOperand(twin, c.kw["params"], 0, "k"),
               out=None, backend="reference")  # fmt: skip
    else:
        c.call(out=None, backend="reference") if "out" in c.kw else c.call(backend="reference")


# --------------------------------------------------------------------------------------------
# Regressions: call binding, weight scales
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("missing", BRANCH_REQUIRED_KW + BRANCH_POSITIONAL)
def test_branch_missing_argument_is_named(missing):
    c = branch_case()
    kw = {k: v for k, v in c.kw.items() if k != missing}
    positional = tuple(n for n in c.positional if n != missing)
    if missing in c.positional:  # the positional ones shift left: pass them all by name
        positional = ()
    kw["backend"] = "reference"
    err = assert_rejected(_call, c.fn, positional, kw, state=c.state(), names=missing)
    assert isinstance(err, InvalidArgumentError)
    assert "required" in str(err)


@pytest.mark.parametrize("op", list(CASES))
@pytest.mark.parametrize("backend", BACKENDS)
def test_unknown_keyword_is_named(op, backend):
    c = CASES[op]()
    for bad in ("bogus", "softmax_scale", "kv_cache"):
        assert_rejected(c.call, state=c.state(), names=bad, backend=backend, **{bad: 1})


@pytest.mark.parametrize("op", list(CASES))
def test_missing_positional_and_surplus_positional(op):
    c = CASES[op]()
    first = c.positional[-1]
    args = [c.kw[n] for n in c.positional[:-1]]
    assert_rejected(c.fn, *args, state=c.state(), names=first)
    # Positional arguments past the positional parameters.
    assert_rejected(
        c.fn, *[c.kw[n] for n in c.positional], 1, 2, 3, state=c.state(), names=c.fn.__name__
    )
    # The same argument positionally and by keyword.
    first_name = c.positional[0]
    assert_rejected(
        c.fn,
        *[c.kw[n] for n in c.positional],
        state=c.state(),
        names=first_name,
        **{first_name: c.kw[first_name]},
    )


def test_wrappers_keep_signatures_and_pass_inner_type_errors(monkeypatch):
    """The binding check keeps the ops' signatures (documentation, torch.library) and leaves a
    TypeError raised inside an op alone."""
    assert list(inspect.signature(mha).parameters)[:4] == ["q", "k", "v", "q_row_offsets"]
    assert "w_uk" in inspect.signature(mla_decode_branch_fp8).parameters
    import pagedattn.ops.linear as linear

    def boom(*a, **k):
        raise TypeError("from inside")

    monkeypatch.setattr(linear, "fp8_bmm_reference", boom)
    c = bmm_case()
    with pytest.raises(TypeError, match="from inside"):
        c.call(backend="reference")


def _bad_scales(ws: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    out = []
    for name, val in (("negative", -1.0), ("zero", 0.0), ("nan", math.nan), ("inf", math.inf)):
        t = ws.clone()
        t.view(-1)[-1] = val
        out.append((name, t))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("which", ["negative", "zero", "nan", "inf", "e8m0_nan"])
def test_fp8_bmm_rejects_bad_host_weight_scales(backend, which):
    c = bmm_case()
    if which == "e8m0_nan":
        w = torch.randn(2, 8, 16)
        _, ws = quantize_weight_blocks(w, 8, 8, E8M0)
        ws = ws.clone()
        ws.view(torch.uint8)[0, 0, 0] = 0xFF
    else:
        ws = dict(_bad_scales(c.kw["w_scale"]))[which]
    assert_rejected(c.call, state=(*c.state(), ws), names="w_scale", w_scale=ws, backend=backend)


@pytest.mark.parametrize("which", ["w_uk_scale", "w_uv_scale"])
def test_branch_rejects_a_negative_weight_scale(which):
    c = branch_case()
    bad = c.kw[which].clone()
    bad.view(-1)[0] = -bad.view(-1)[0]
    assert_rejected(c.call, state=c.state(), names=which, backend="reference", **{which: bad})


# --------------------------------------------------------------------------------------------
# Hypothesis: one argument replaced by a bad value
# --------------------------------------------------------------------------------------------
def _not_none(s: st.SearchStrategy) -> st.SearchStrategy:
    return s.filter(lambda v: v is not None)


NOT_TENSORS = st.sampled_from([None, "x", 1.0, 3, True, [1, 2], object()])
NOT_TENSORS_OR_NONE = _not_none(NOT_TENSORS)
BAD_BACKENDS = st.sampled_from(["", "cuda", "Triton", 0, False, ["triton"], object()])
BAD_SCALES = _not_none(bad_floats(finite=True, positive=True)) | st.just(torch.tensor(0.1))
BAD_PARTITIONS = _not_none(bad_ints(1, 65535))
BAD_BOOLS = st.sampled_from([None, 0, 1, "yes", 1.0])


def _variants(t: torch.Tensor, *, keep_dtypes=(), last=True, grow=True) -> list:
    """Wrong versions of a good tensor argument (each must be rejected): `tensor_variants`
    (but a dtype of `keep_dtypes`, and a shorter last dim unless `last`), more dtypes, and one
    more row (`grow`)."""
    out = [
        v
        for name, v in tensor_variants(t)
        if not (name == "dtype" and v.dtype in keep_dtypes) and (last or name != "last dim - 1")
    ]
    for dt in (torch.float16, torch.float32, torch.int64, torch.int32, torch.bool, E4M3):
        if dt != t.dtype and dt not in keep_dtypes:
            out.append(t.to(dt) if dt != E4M3 else t.float().to(dt))
    if grow and t.ndim >= 1:
        out.append(torch.cat([t, t[:1]], 0))
    return out


def _tensor_bad(t, **kw) -> st.SearchStrategy:
    return st.sampled_from(_variants(t, **kw)) | NOT_TENSORS


def _state(case: Case, value) -> tuple:
    """The case's state plus the bad value itself when it is a tensor with bytes to compare
    (not a meta tensor; `fingerprint` views bytes, which a 0-dim tensor cannot)."""
    if isinstance(value, torch.Tensor) and not value.is_meta and value.ndim >= 1:
        return (*case.state(), value)
    return case.state()


def _run_bad(case: Case, arg: str, value, backend: str, names) -> None:
    names = (arg,) if names is None else names
    over = {"backend": backend, arg: value}
    assert_rejected(case.call, state=_state(case, value), names=names, **over)


@functools.cache
def _bmm_bad() -> dict:
    c = bmm_case()
    return dict(
        x=_tensor_bad(c.kw["x"], keep_dtypes=(torch.float16, torch.float32)),
        w=_tensor_bad(c.kw["w"]),
        w_scale=_tensor_bad(c.kw["w_scale"], keep_dtypes=(torch.float32,))
        | st.sampled_from([t for _, t in _bad_scales(c.kw["w_scale"])]),
        k_gran=bad_ints(1, INT32_MAX),
        n_gran=bad_ints(1, INT32_MAX),
        out_dtype=st.sampled_from([None, "bfloat16", torch.int8, E4M3, torch.float64, 1]),
        backend=BAD_BACKENDS,
    )


# Arguments whose bad values may be reported under another argument's name too (the pair
# disagrees: the message names the other one).
BMM_ALSO = {"x": ("x", "w"), "w": ("w", "w_scale")}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arg", sorted(_bmm_bad()))
@SETTINGS
@given(data=st.data())
def test_fp8_bmm_bad_argument(arg, backend, data):
    value = data.draw(_bmm_bad()[arg], label="value")
    _run_bad(bmm_case(), arg, value, backend, BMM_ALSO.get(arg))


@functools.cache
def _mha_bad() -> dict:
    c = mha_case()
    q = c.kw["q"]
    other = KVCacheParams(BF16, num_layers=2, n_kv_heads=3, head_dim=8, page_size=4)
    opc = make_paged_cache(other, [3, 2], [2, 1])
    return dict(
        q=_tensor_bad(q, keep_dtypes=()),
        k=NOT_TENSORS | st.just(q) | st.just(PagedOperand(opc.inputs, other, 0, "k")),
        v=NOT_TENSORS | st.just(q) | st.just(PagedOperand(opc.inputs, other, 0, "v")),
        q_row_offsets=_tensor_bad(c.kw["q_row_offsets"]),
        mask=st.sampled_from(
            [
                "causal",
                1,  # (a bad window or chunk cannot build a Mask: test_mask_window_and_chunk...)
                masks.tensor_mask(torch.ones(2, 9, dtype=torch.bool)),
                masks.tensor_mask(torch.ones(3, 0, dtype=torch.bool)),
                masks.tensor_mask(torch.ones(3, 9, dtype=torch.bool, device="meta")),
            ]
        ),
        scale=BAD_SCALES,
        sinks=_tensor_bad(c.kw["sinks"]).filter(lambda v: v is not None),
        num_partitions=BAD_PARTITIONS,
        return_lse=BAD_BOOLS,
        out=_tensor_bad(c.kw["out"]).filter(lambda v: v is not None),
        backend=BAD_BACKENDS,
    )


# q's dtype or shape can disagree with the operands (named k) rather than be bad on its own.
MHA_ALSO = {"q": ("q", "k", "out"), "k": ("k", "v", "q"), "v": ("v", "k", "q")}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arg", sorted(_mha_bad()))
@SETTINGS
@given(data=st.data())
def test_mha_bad_argument(arg, backend, data):
    value = data.draw(_mha_bad()[arg], label="value")
    _run_bad(mha_case(), arg, value, backend, MHA_ALSO.get(arg))


@functools.cache
def _mla_bad() -> dict:
    c = mla_case()
    q = c.kw["q"]
    mhap = KVCacheParams(BF16, num_layers=2, n_kv_heads=2, head_dim=576, page_size=4)
    mha_kv = PagedOperand(make_paged_cache(mhap, [3, 2], [1, 2]).inputs, mhap, 0, "k")
    ints = {  # a shorter index row is another valid stride
        "q_row_offsets": _tensor_bad(c.kw["q_row_offsets"]),
        "indices": _tensor_bad(c.kw["indices"], last=False),
        "topk_lengths": _tensor_bad(c.kw["topk_lengths"]),
    }
    return dict(
        q=_tensor_bad(q),
        kv=NOT_TENSORS | st.just(q) | st.just(mha_kv),
        extra_kv=NOT_TENSORS_OR_NONE | st.just(q) | st.just(mha_kv),
        d_v=bad_ints(1, 512),
        scale=BAD_SCALES,
        causal=BAD_BOOLS,
        extra_indices=_tensor_bad(c.kw["extra_indices"], last=False),
        extra_topk_lengths=_tensor_bad(c.kw["extra_topk_lengths"]).filter(lambda v: v is not None),
        attn_sink=_tensor_bad(c.kw["attn_sink"]).filter(lambda v: v is not None),
        num_partitions=BAD_PARTITIONS,
        out=_tensor_bad(c.kw["out"]).filter(lambda v: v is not None),
        backend=BAD_BACKENDS,
        **{n: s.filter(lambda v: v is not None) for n, s in ints.items()},
    )


MLA_ALSO = {
    "q": ("q", "kv", "out", "indices"),
    "q_row_offsets": ("q_row_offsets", "topk_lengths"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arg", sorted(_mla_bad()))
@SETTINGS
@given(data=st.data())
def test_mla_decode_bad_argument(arg, backend, data):
    value = data.draw(_mla_bad()[arg], label="value")
    _run_bad(mla_case(), arg, value, backend, MLA_ALSO.get(arg))


@functools.cache
def _branch_bad() -> dict:
    c = branch_case()
    kw = c.kw
    params, inputs = kw["params"], kw["kv_inputs"]
    other = {  # params of another cache: the given buffers are not theirs
        "layers": KVCacheParams(BF16, 3, 1, 576, 4, is_mla=True, num_q_heads=2),
        "page": KVCacheParams(BF16, 2, 1, 576, 8, is_mla=True, num_q_heads=2),
        "v32": KVCacheParams(
            BF16,
            2,
            1,
            576,
            4,
            is_mla=True,
            num_q_heads=2,
            quantization=KVQuantConfig.flashmla_v32(),
        ),
        "mha": KVCacheParams(BF16, 2, 1, 576, 4),
    }
    rep = dataclasses.replace
    bad_inputs = [
        rep(inputs, kv_blocks=inputs.kv_blocks[:, :, :1]),
        rep(inputs, kv_blocks=inputs.kv_blocks.float()),
        rep(inputs, kv_blocks=inputs.kv_blocks[0]),
        rep(inputs, cache_lengths=inputs.cache_lengths.long()),
        rep(inputs, cache_lengths=inputs.cache_lengths[:1]),
        rep(inputs, lookup_table=inputs.lookup_table.long()),
        rep(inputs, lookup_table=inputs.lookup_table[0]),
        rep(inputs, mla_num_partitions=torch.tensor([0])),
        rep(inputs, mla_num_partitions=torch.tensor([-3])),
        rep(inputs, mla_num_partitions=torch.tensor([2.0])),
        rep(inputs, mla_num_partitions=torch.tensor([], dtype=torch.int64)),
        rep(inputs, mla_num_partitions=torch.tensor([2**40])),
        rep(inputs, kv_blocks=None),
    ]
    tensors = {
        n: _tensor_bad(v, last=n not in ("d_indices", "extra_d_indices"))
        for n, v in kw.items()
        if isinstance(v, torch.Tensor)
        and n not in ("freqs_cis", "kv_norm_gamma", "w_uk_scale", "w_uv_scale", "w_uv")
    }
    # freqs_cis / kv_norm_gamma: any float dtype is fine (and a longer freqs_cis table);
    # w_uv: a shorter last dim is another valid d_v.
    floats = (torch.float16, torch.float32)
    tensors["freqs_cis"] = _tensor_bad(kw["freqs_cis"], keep_dtypes=floats, grow=False)
    tensors["kv_norm_gamma"] = _tensor_bad(kw["kv_norm_gamma"], keep_dtypes=floats)
    tensors["w_uv"] = (
        st.sampled_from(
            [
                kw["w_uv"].to(BF16),
                kw["w_uv"][:1],
                kw["w_uv"][..., :0],
                torch.cat([kw["w_uv"]] * 2, -1),
            ]
        )
        | NOT_TENSORS
    )
    for n in ("w_uk_scale", "w_uv_scale"):
        tensors[n] = _tensor_bad(kw[n], keep_dtypes=(torch.float32,)) | st.sampled_from(
            [t for _, t in _bad_scales(kw[n])]
        )
    for n in ("d_indices", "topk_lengths", "attn_sink", "extra_d_indices", "extra_topk_lengths"):
        tensors[n] = tensors[n].filter(lambda v: v is not None)
    tensors["out"] = tensors["out"].filter(lambda v: v is not None)
    return dict(
        **tensors,
        kv_inputs=NOT_TENSORS | st.sampled_from(bad_inputs),
        params=NOT_TENSORS | st.sampled_from(list(other.values())),
        layer_idx=bad_ints(0, params.num_layers - 1),
        scale=_not_none(bad_floats(finite=True, positive=True)) | st.just(None),
        epsilon=bad_floats(finite=True) | st.sampled_from([-1.0, -1e-30]),
        k_gran=bad_ints(1, INT32_MAX),
        n_gran=bad_ints(1, INT32_MAX),
        mask=st.sampled_from([None, 1, "sliding_window_causal", masks.sliding_window_causal(2)]),
        interleaved_rope=BAD_BOOLS,
        extra_kv=NOT_TENSORS_OR_NONE | st.just(kw["q"]),
        num_partitions=BAD_PARTITIONS,
        backend=BAD_BACKENDS,
    )


BRANCH_ALSO = {
    "q": ("q", "w_uk", "new_kv", "d_indices", "input_row_offsets", "out"),
    "w_uk": ("w_uk", "q"),
    "w_uv": ("w_uv", "out"),
    "new_kv": ("new_kv",),
    "kv_inputs": ("kv_inputs",),
    "params": ("params", "kv_inputs", "q", "new_kv", "kv_norm_gamma", "w_uk"),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("arg", sorted(_branch_bad()))
@SETTINGS
@given(data=st.data())
def test_mla_decode_branch_fp8_bad_argument(arg, backend, data):
    value = data.draw(_branch_bad()[arg], label="value")
    c = branch_case()
    # (the inputs' mla_num_partitions is read when num_partitions is None, as in branch_case)
    over = {"backend": backend, arg: value}
    assert_rejected(c.call, state=_state(c, value), names=BRANCH_ALSO.get(arg, (arg,)), **over)


@pytest.mark.parametrize("bad", ["3", True, 1.5, 0, -2, 2**40, None])
def test_mask_window_and_chunk_are_typed(bad):
    """A mask's window / chunk is an int in [1, 2**31 - 1]: anything else is a typed error."""
    from pagedattn.ops import masks

    for make, name in (
        (masks.sliding_window_causal, "mask.window"),
        (masks.sliding_window_noncausal, "mask.window"),
        (masks.chunked_causal, "mask.chunk"),
    ):
        assert_rejected(make, bad, names=name)
