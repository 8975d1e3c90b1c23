"""`pagedattn.ops.fused` (RMSNorm with the residual add, q/k/v RoPE with Qwen3's head norm,
silu * up): the Triton kernels (under TRITON_INTERPRET=1 on the CPU, natively with `-m gpu`)
and the reference against a float64 oracle under DESIGN.md section 5's rule, on fresh random
inputs with NaN and inf rows, non-power-of-two widths and empty batches; the reference equals
transformers' torch ops bit for bit; bad arguments raise typed errors naming them."""

from __future__ import annotations

import pytest
import torch

from pagedattn.errors import InvalidArgumentError
from pagedattn.ops.fused import argmax_rows, rms_norm, rope_qkv, sample_rows, silu_mul
from pagedattn.ops.fused.reference import gumbel_noise, sample_rows_reference
from pagedattn.testing import assert_close

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
TOL = {
    torch.float32: (1e-5, 1e-5),
    torch.bfloat16: (2e-2, 2 / 128),
    torch.float16: (4e-3, 4e-3),
}  # a few roundings of O(1) values
BACKENDS = ["reference", "triton"]
ROPE_CASES = [(0, 4, 2, 16, False), (3, 4, 2, 16, False), (7, 8, 2, 64, True), (2, 3, 1, 32, True)]


def _dev() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _oracle_norm(x, w, eps, weight_first):
    h = x.double()
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    return w.double() * h


def _close(out, ref, dtype, name):
    a, r = TOL[dtype]
    if dtype == torch.bfloat16 and not out.is_cuda:  # the interpreter truncates bf16 casts
        a, r = 2 * a, 2 * r
    assert_close(out, ref, abs_tol=a, rel_tol=r, cos_tol=1e-4 if dtype != torch.float32 else 1e-9,
                 name=name)  # fmt: skip


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,H", [(0, 64), (1, 64), (5, 96), (9, 256)])
def test_rms_norm(backend, dtype, T, H):
    g = torch.Generator().manual_seed(T * 131 + H)
    dev = _dev()
    x = (torch.randn(T, H, generator=g) * 3).to(dtype).to(dev)
    r = torch.randn(T, H, generator=g).to(dtype).to(dev)
    if T >= 5:  # a NaN row and an inf row: the whole row NaN in both paths
        x[1, 3] = float("nan")
        x[2, 0] = float("inf")
    for weight_first in (False, True):
        w = (1 + 0.3 * torch.randn(H, generator=g)).to(torch.float32 if weight_first else dtype)
        w = w.to(dev)
        out = rms_norm(x, w, 1e-5, weight_first=weight_first, backend=backend)
        _close(out, _oracle_norm(x, w, 1e-5, weight_first), dtype, "rms_norm")
        out, s = rms_norm(x, w, 1e-5, r, weight_first=weight_first, backend=backend)
        want_s = r + x  # the sum in x's dtype: exactly (the CPU interpreter's bf16 casts
        # truncate instead of rounding to nearest: within one bf16 ulp there)
        assert torch.equal(s.isnan(), want_s.isnan())
        if dev == "cuda" or backend == "reference" or dtype != torch.bfloat16:
            assert torch.equal(s.nan_to_num(), want_s.nan_to_num())
        else:
            d = (s.nan_to_num().double() - want_s.nan_to_num().double()).abs()
            assert torch.all(d <= want_s.nan_to_num().double().abs() * 2**-7)
        _close(out, _oracle_norm(want_s, w, 1e-5, weight_first), dtype, "rms_norm(residual)")


def _oracle_rope(x, cos, sin):
    x1, x2 = x.double().chunk(2, -1)
    c, s = cos.double()[:, None], sin.double()[:, None]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,h_q,h_kv,d,norm", ROPE_CASES)
def test_rope_qkv(backend, dtype, T, h_q, h_kv, d, norm):
    g = torch.Generator().manual_seed(T + 7 * d)
    dev = _dev()
    qkv = torch.randn(T, (h_q + 2 * h_kv) * d, generator=g).to(dtype).to(dev)
    ang = torch.rand(T, d // 2, generator=g) * 6.3
    cos, sin = ang.cos().to(dtype).to(dev), ang.sin().to(dtype).to(dev)
    qn = kn = None
    if norm:
        qn = (1 + 0.2 * torch.randn(d, generator=g)).to(dtype).to(dev)
        kn = (1 + 0.2 * torch.randn(d, generator=g)).to(dtype).to(dev)
    q, k, v = rope_qkv(qkv, cos, sin, h_q, h_kv, q_norm=qn, k_norm=kn, eps=1e-6, backend=backend)
    assert q.shape == (T, h_q, d) and k.shape == (T, h_kv, d) and v.shape == (T, h_kv, d)
    assert q.is_contiguous() and k.is_contiguous() and v.is_contiguous()
    q0, k0, v0 = qkv.split([h_q * d, h_kv * d, h_kv * d], -1)
    q0, k0 = q0.reshape(T, h_q, d), k0.reshape(T, h_kv, d)
    if norm:  # the oracle from the dtype-rounded normed heads (as the op rounds them)
        q0 = (_oracle_norm(q0, qn, 1e-6, False)).to(dtype)
        k0 = (_oracle_norm(k0, kn, 1e-6, False)).to(dtype)
    assert torch.equal(v, v0.reshape(T, h_kv, d))
    _close(q, _oracle_rope(q0, cos, sin), dtype, "q")
    _close(k, _oracle_rope(k0, cos, sin), dtype, "k")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("T,inter", [(0, 8), (1, 8), (6, 96), (3, 3000)])
def test_silu_mul(backend, dtype, T, inter):
    g = torch.Generator().manual_seed(T + inter)
    gu = (torch.randn(T, 2 * inter, generator=g) * 4).to(dtype).to(_dev())
    if T >= 6:
        gu[2, 5] = float("nan")
        gu[3, 1] = float("-inf")  # silu(-inf) = -inf / (1 + inf): NaN, as torch's F.silu
    out = silu_mul(gu, backend=backend)
    gt, up = gu.double().chunk(2, -1)
    want = gt / (1 + torch.exp(-gt)) * up
    _close(out, want, dtype, "silu_mul")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    "n,V", [(0, 5), (1, 1), (3, 7), (6, 5000), (2, 128256), (66, 20000), (300, 5000)]
)
def test_argmax_rows(backend, dtype, n, V):
    """torch.argmax's answer on fresh rows, with the first of equal maxima across the kernel's
    4096-column blocks and its spans (`argmax_plan`: (6, 5000) two spans of a block, (66,
    20000) three of two blocks, (300, 5000) one a row), a row of -inf, NaN rows (the first
    NaN), +inf, non-contiguous rows."""
    g = torch.Generator().manual_seed(n * 7 + V)
    x = torch.randn(n, V, generator=g).to(dtype).to(_dev())
    if n >= 6:
        x[0, 100] = x[0].max() + 1
        x[0, 4600] = x[0, 100]  # a tie in a later block: the earlier index
        x[0, V - 1] = x[0, 100]  # and in the last span
        x[1] = float("-inf")
        x[2, 10] = float("nan")
        x[2, V - 1] = float("nan")
        x[3, V - 1] = float("inf")
        x[4, 17] = float("-inf")
        x[5, :] = x[5, 0]  # all equal: index 0
        if V >= 9001:  # NaN in a later span than the maximum; the maximum at a span's start
            x[6, 9000], x[6, 3], x[7, 8192] = float("nan"), 1e30, 1e30
    want = x.double().cpu().argmax(-1)
    assert torch.equal(argmax_rows(x, backend=backend).cpu(), want)
    if n:  # rows of a wider buffer (stride > V)
        wide = torch.randn(n, V + 3, generator=g).to(dtype).to(_dev())[:, :V]
        assert torch.equal(argmax_rows(wide, backend=backend).cpu(), wide.cpu().argmax(-1))


def sample_case(n, V, seed):
    """Fresh logits and sampling rows: temperatures 0 (greedy), tiny, large and in (0, 2);
    seeds over all 64 bits (negative ones included), counters below 2**32; NaN, -inf, +inf, and
    sampled rows of -inf only (index 0) and NaN only (index 0)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, V, generator=g) * 3
    t = torch.rand(n, generator=g) * 2 + 0.05
    t[::4] = 0.0
    if n >= 6:
        t[1], t[2] = 1e-3, 50.0
        x[3, V // 3] = float("nan")
        x[4] = float("-inf")
        x[5, V - 1] = float("inf")
    if n >= 10:  # sampled rows of -inf only and of NaN only
        t[7], t[9] = 0.5, 0.8
        x[7] = float("-inf")
        x[9] = float("nan")
    seeds = torch.randint(-(2**63), 2**63 - 1, (n,), generator=g)
    counters = torch.randint(0, 2**32, (n,), generator=g)
    return x, t, seeds, counters


def assert_same_draws(got, x, t, seeds, counters, tol=1e-5):
    """got equals the reference's draws, except in rows whose two best scores (x / t + g in
    float64) are within `tol` (a rounding of the logs can order them either way)."""
    want = sample_rows_reference(x, t, seeds, counters)
    bad = (got != want).nonzero().flatten().tolist()
    s = x.double() / torch.where(t > 0, t, 1.0).double()[:, None]
    s = (
        s
        + torch.where(t > 0, 1.0, 0.0).double()[:, None]
        * gumbel_noise(seeds, counters, x.shape[1]).double()
    )
    for i in bad:
        top = s[i].nan_to_num(nan=float("inf")).topk(2).values
        gap = float(top[0] - top[1])
        assert gap <= tol * max(1.0, float(top[0].abs())), (i, int(got[i]), int(want[i]), gap)
    print(f"{len(bad)} near-tie differences of {x.shape[0]} rows")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("n,V", [(0, 5), (1, 1), (3, 7), (6, 5000), (13, 30000), (66, 20000)])
def test_sample_rows(backend, n, V):
    """The reference's draws (argmax of x / t + Gumbel noise of (seed, counter, column) where
    t > 0, argmax_rows' answer where t == 0) on the Triton path too, one span a row or several
    (`argmax_plan`); x's dtype bf16 as well."""
    x, t, seeds, counters = sample_case(n, V, seed=n + V)
    dev = _dev()
    got = sample_rows(x.to(dev), t.to(dev), seeds.to(dev), counters.to(dev), backend=backend)
    assert got.dtype == torch.int64 and got.shape == (n,)
    assert_same_draws(got.cpu(), x, t, seeds, counters)
    xb = x.to(torch.bfloat16)
    got = sample_rows(xb.to(dev), t.to(dev), seeds.to(dev), counters.to(dev), backend=backend)
    assert_same_draws(got.cpu(), xb, t, seeds, counters)


def filter_case(n, V, seed):
    """`sample_case`'s rows, with some rows tied (rounded to bf16 values), flat (every token
    one of two values), or packed (distinct values a float32 rounding apart near the max), and
    top_k / top_p per row: off (k 0, V, > V; p 1, inf), 1, tiny, near V, and random."""
    x, t, seeds, counters = sample_case(n, V, seed)
    g = torch.Generator().manual_seed(seed + 1)
    for i in range(n):
        kind = (i * 7 + seed) % 5
        if kind == 1:
            x[i] = x[i].to(torch.bfloat16).float()
        elif kind == 2 and V > 2:
            x[i] = torch.where(torch.rand(V, generator=g) < 0.5, 1.25, -0.5)
        elif kind == 3:
            x[i] = 4.0 - torch.randperm(V, generator=g).float() * 4.8e-7
    ks = [0, 1, 2, 5, 50, V - 1, V, V + 3]
    ps = [1.0, float("inf"), 0.9, 0.5, 1e-3, 0.999, 0.97]
    top_k = torch.tensor(
        [ks[int(j)] for j in torch.randint(0, len(ks), (n,), generator=g)], dtype=torch.int64
    )
    top_p = torch.tensor([ps[int(j)] for j in torch.randint(0, len(ps), (n,), generator=g)])
    if n:
        top_k[-1] = int(torch.randint(1, V + 1, (), generator=g))
        top_p[-1] = float(torch.rand((), generator=g))
    return x, t, seeds, counters, top_k, top_p.to(torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_k,with_p", [(True, False), (False, True), (True, True)])
@pytest.mark.parametrize("n,V", [(0, 5), (1, 1), (3, 7), (10, 3000), (13, 12000)])
def test_sample_rows_top_k_top_p(backend, with_k, with_p, n, V, monkeypatch):
    """With top_k / top_p, the draws equal the reference's (an argmax over the tokens
    `top_k_top_p_keep` keeps, in float64), and on the Triton path each row's threshold keeps
    exactly the reference's tokens, except tokens whose larger mass is within 1e-4 of p times
    the kept mass (float32 sums), and the draws of rows where only those differ or whose two
    best kept scores are within a rounding. Ties, -inf, NaN and +inf rows, greedy rows, rows
    longer than the threshold's list (THR_LIST), k and p at and beyond their ends; both forms
    of the threshold (the chain of span passes, a program a row), twice each, and the draws of
    each."""
    from pagedattn.ops.fused.reference import top_k_top_p_keep
    from pagedattn.ops.fused.triton_fused import sample_rows_triton

    x, t, seeds, counters, top_k, top_p = filter_case(n, V, seed=n * 31 + V + 2 * with_k + with_p)
    k = top_k if with_k else None
    p = top_p if with_p else None
    dev = _dev()
    on = [None if a is None else a.to(dev) for a in (x, t, seeds, counters, k, p)]
    want = sample_rows_reference(x, t, seeds, counters, k, p)
    got = sample_rows(*on[:4], top_k=on[4], top_p=on[5], backend=backend).cpu()
    import pagedattn.ops.fused as F
    import pagedattn.ops.fused.keep_threshold as KT

    monkeypatch.setattr(KT, "THR_CHAIN_MAX_ROWS", 0)  # the other form (n <= 64: the chain)
    F.PREPARED_SAMPLE_ROWS.cache.clear()
    got_kernel = sample_rows(*on[:4], top_k=on[4], top_p=on[5], backend=backend).cpu()
    monkeypatch.undo()
    F.PREPARED_SAMPLE_ROWS.cache.clear()
    s = x / torch.where(t > 0, t, 1.0)[:, None]
    keep, margin = top_k_top_p_keep(s, k, p, margins=True)
    loose = margin.abs() <= 1e-4
    if backend == "triton" and n:
        kk = on[4] if with_k else torch.zeros(n, dtype=torch.int64, device=dev)  # (off)
        pp = on[5] if with_p else torch.full((n,), float("inf"), device=dev)
        b = s.view(torch.int32)
        key = torch.where(s == 0, 0, b ^ ((b >> 31) & 0x7FFFFFFF))
        sampled = t > 0
        forms = {}
        for form, most in (("chain", 2**31), ("a program a row", 0)):
            monkeypatch.setattr(KT, "THR_CHAIN_MAX_ROWS", most)
            thr = sample_rows_triton(*on[:4], 132, kk, pp)[2].cpu()
            again = sample_rows_triton(*on[:4], 132, kk, pp)[2].cpu()
            assert torch.equal(thr, again), form  # deterministic (the spans' sums in order)
            wrong = (key >= thr[:, None]) != keep
            wrong &= ~loose & sampled[:, None]
            assert not wrong.any(), (form, wrong.any(1).nonzero().flatten().tolist())
            forms[form] = thr
        if not with_p:  # counts are exact: both forms find the same key
            assert torch.equal(forms["chain"], forms["a program a row"])
    scores = (s.double() + gumbel_noise(seeds, counters, V).double()).masked_fill(~keep, -1e300)
    bad = ((got != want) | (got_kernel != want)).nonzero().flatten().tolist()
    for i in bad:
        top = scores[i].nan_to_num(nan=float("inf")).topk(min(2, V)).values
        near_tie = V > 1 and float(top[0] - top[1]) <= 1e-5 * max(1.0, float(top[0].abs()))
        assert near_tie or bool(loose[i].any()), (i, int(got[i]), int(got_kernel[i]), int(want[i]))


def test_sample_rows_draws_follow_softmax():
    """The Triton path's draws over many counters follow softmax(x / t) (chi-square, a small
    vocabulary; the reference's own statistics are tests/test_engine_sampler.py's)."""
    V, n = 6, 600
    x = torch.tensor([[0.5, 0.2, 0.0, -0.3, 0.8, -0.5]]).expand(n, V).contiguous()
    t = torch.full((n,), 0.7)
    seeds = torch.full((n,), 1234567, dtype=torch.int64)
    counters = torch.arange(n, dtype=torch.int64)
    dev = _dev()
    got = sample_rows(x.to(dev), t.to(dev), seeds.to(dev), counters.to(dev), backend="triton")
    counts = torch.bincount(got.cpu(), minlength=V).double()
    p = torch.softmax(x[0].double() / 0.7, 0)
    chi2 = float(((counts - n * p) ** 2 / (n * p)).sum())
    assert chi2 < 20.5, chi2  # 5 degrees of freedom: p = 0.001


def test_reference_is_transformers_ops_bitwise():
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(3)
    x = torch.randn(5, 64, generator=g).to(torch.bfloat16)
    w = (1 + torch.randn(64, generator=g) * 0.1).to(torch.bfloat16)
    h = x.float()
    want = w * (h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6)).to(torch.bfloat16)
    assert torch.equal(rms_norm(x, w, 1e-6, backend="reference"), want)
    gu = torch.randn(5, 32, generator=g).to(torch.bfloat16)
    assert torch.equal(silu_mul(gu, backend="reference"), F.silu(gu[:, :16]) * gu[:, 16:])


def test_bad_arguments():
    x = torch.randn(3, 8)
    with pytest.raises(InvalidArgumentError, match="x"):
        argmax_rows(torch.randn(3, 0))
    with pytest.raises(InvalidArgumentError, match="x"):
        argmax_rows(torch.randint(0, 5, (3, 4)))
    t, sd = torch.ones(3), torch.zeros(3, dtype=torch.int64)
    with pytest.raises(InvalidArgumentError, match="temperature"):
        sample_rows(x, t.double(), sd, sd)
    with pytest.raises(InvalidArgumentError, match="seeds"):
        sample_rows(x, t, sd[:2], sd)
    with pytest.raises(InvalidArgumentError, match="counters"):
        sample_rows(x, t, sd, sd.int())
    with pytest.raises(InvalidArgumentError, match="top_k"):
        sample_rows(x, t, sd, sd, top_k=t)
    with pytest.raises(InvalidArgumentError, match="top_k"):
        sample_rows(x, t, sd, sd, top_k=sd[:2])
    with pytest.raises(InvalidArgumentError, match="top_p"):
        sample_rows(x, t, sd, sd, top_p=t[:1])
    with pytest.raises(InvalidArgumentError, match="top_p"):
        sample_rows(x, t, sd, sd, top_k=sd, top_p=sd)
    with pytest.raises(InvalidArgumentError, match="weight"):
        rms_norm(x, torch.ones(7), 1e-6)
    with pytest.raises(InvalidArgumentError, match="weight"):
        rms_norm(x, torch.ones(8, dtype=torch.float64), 1e-6)
    with pytest.raises(InvalidArgumentError, match="residual"):
        rms_norm(x, torch.ones(8), 1e-6, torch.randn(3, 9))
    with pytest.raises(InvalidArgumentError, match="eps"):
        rms_norm(x, torch.ones(8), -1.0)
    with pytest.raises(InvalidArgumentError, match="x"):
        rms_norm(torch.ones(8), torch.ones(8), 1e-6)
    with pytest.raises(InvalidArgumentError, match="qkv"):
        rope_qkv(torch.randn(2, 30), torch.randn(2, 2), torch.randn(2, 2), 2, 1)
    with pytest.raises(InvalidArgumentError, match="cos"):
        rope_qkv(torch.randn(2, 32), torch.randn(2, 3), torch.randn(2, 4), 2, 1)
    with pytest.raises(InvalidArgumentError, match="q_norm"):
        rope_qkv(torch.randn(2, 32), torch.randn(2, 4), torch.randn(2, 4), 2, 1,
                 q_norm=torch.ones(8))  # fmt: skip
    with pytest.raises(InvalidArgumentError, match="gate_up"):
        silu_mul(torch.randn(2, 5))
