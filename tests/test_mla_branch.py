"""`pagedattn.ops.mla_branch.mla_decode_branch_fp8` (reference backend) against an independent
float64 composition of its five steps, including the cache contents written in place.

The oracle quantizes activations and dequantizes weights itself (loops over groups / blocks),
applies RoPE from theta with `math.cos`, RMSNorm in float64, decodes the cache's raw bytes
itself (`decode_pool` of test_mla_reference's layout decoder is re-implemented here in short)
and computes attention one query token at a time. Intermediates are rounded to bf16 where
MAX's kernel keeps them in bf16.

Tolerance of the final output: the attention output is rounded to bf16 and quantized to e4m3
(float32 scale = group amax / 448) before `@ w_uv`. The library (float32) and the oracle
(float64) compute every intermediate with different rounding errors, so a few elements round
to neighbouring bf16 values; a perturbed element moves by at most one e4m3 step (2^-3
relative), and when the perturbed element is its group's amax, the scale moves and the whole
group of 128 may re-round. Hence, for output j of a (token, head) with activations x:
  - every element: |err| <= BF16 tolerance + 2^-3 * 3 * ||x * w_j||_2 (a whole group
    re-rounding, > 4 standard deviations);
  - all but 1% of elements: |err| <= BF16 tolerance + 2^-3 * max_i |x_i w_ji| (one flip);
  - the cosine difference over the whole output stays <= 2e-5.
The FP8 bmm itself is checked exactly in test_fp8_bmm.py, and
`test_branch_is_the_composition_of_the_public_ops` checks the wiring bit for bit.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from pagedattn import InvalidArgumentError, KVCacheParams, KVQuantConfig, PagedOperand, store_kv
from pagedattn.ops.linear import make_freqs_cis, quantize_weight_blocks
from pagedattn.ops.mla_branch import mla_decode_branch_fp8
from pagedattn.testing import (
    BF16_TOL,
    assert_close,
    cos_diff,
    make_paged_cache,
    poison_,
    ragged_offsets,
)

BF16, F32, E4M3, E8M0 = torch.bfloat16, torch.float32, torch.float8_e4m3fn, torch.float8_e8m0fnu
LAYER = 1
ROPE = 64
THETA = 10000.0
EPS = 1e-6


# --------------------------------------------------------------------------------------------
# Independent decoding of the cache bytes (float64)
# --------------------------------------------------------------------------------------------
def _as(b: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return b.contiguous().view(dtype).double()


def decode_pool(params: KVCacheParams, inputs) -> torch.Tensor:
    """float64 [P, page_size, head_dim] of layer LAYER, from the documented byte layouts."""
    blocks = inputs.kv_blocks[:, 0, LAYER, :, 0, :]
    P, ps, _ = blocks.shape
    lat = params.head_dim - params.mla_rope_dim
    fmt = params.quant_format
    if fmt is None:
        return blocks.double()
    if fmt == "blockwise":
        s = inputs.kv_scales[:, 0, LAYER, :, 0, :].double()
        return blocks.double() * s.repeat_interleave(params.scale_granularity, dim=-1)
    if fmt == "mla_rope_aware":
        s = inputs.kv_scales[:, 0, LAYER, :, 0, :].double()
        return torch.cat([_as(blocks[..., :lat], E4M3) * s, _as(blocks[..., lat:], BF16)], -1)
    if fmt == "flashmla_v32":
        sc = _as(blocks[..., 512:528], F32)
        latent = _as(blocks[..., :512], E4M3).reshape(P, ps, 4, 128) * sc[..., None]
        return torch.cat([latent.reshape(P, ps, 512), _as(blocks[..., 528:], BF16)], -1)
    assert fmt == "flashmla_model1"
    page = inputs.kv_blocks[:, 0, LAYER].reshape(P, ps * 584)
    data = page[:, : ps * 576].reshape(P, ps, 576)
    sc = torch.pow(2.0, page[:, ps * 576 :].reshape(P, ps, 8)[..., :7].double() - 127)
    latent = _as(data[..., :448], E4M3).reshape(P, ps, 7, 64) * sc[..., None]
    return torch.cat([latent.reshape(P, ps, 448), _as(data[..., 448:], BF16)], -1)


# --------------------------------------------------------------------------------------------
# Oracle pieces
# --------------------------------------------------------------------------------------------
def bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(BF16).double()


def act_quant64(x: torch.Tensor, k_gran: int) -> torch.Tensor:
    """Dequantized e4m3 activations [.., K] (float64), groups of k_gran: s = amax / 448."""
    out = torch.empty(x.shape, dtype=torch.float64)
    K = x.shape[-1]
    flat, oflat = x.reshape(-1, K), out.view(-1, K)
    for r in range(flat.shape[0]):
        for g0 in range(0, K, k_gran):
            grp = flat[r, g0 : g0 + k_gran].float()
            s = torch.clamp(grp.abs().max() / torch.tensor(448.0), min=2.0**-126)
            oflat[r, g0 : g0 + k_gran] = (grp / s).clamp(-448, 448).to(E4M3).double() * float(s)
    return out


def weight_deq64(w: torch.Tensor, ws: torch.Tensor, n_gran: int, k_gran: int) -> torch.Tensor:
    out = torch.empty(w.shape, dtype=torch.float64)
    for h in range(w.shape[0]):
        for i in range(ws.shape[1]):
            for j in range(ws.shape[2]):
                rs, cs = slice(i * n_gran, (i + 1) * n_gran), slice(j * k_gran, (j + 1) * k_gran)
                out[h, rs, cs] = w[h, rs, cs].double() * float(ws[h, i, j].float())
    return out


def rope64(x: torch.Tensor, pos: int, interleaved: bool) -> torch.Tensor:
    """x [..., D] float64 rotated at position pos (pairs (2i, 2i+1) or (i, i + D/2))."""
    D = x.shape[-1]
    out = x.clone()
    for i in range(D // 2):
        ang = pos * THETA ** (-2 * i / D)
        c, s = math.cos(ang), math.sin(ang)
        ia, ib = (2 * i, 2 * i + 1) if interleaved else (i, i + D // 2)
        a, b = x[..., ia], x[..., ib]
        out[..., ia], out[..., ib] = a * c - b * s, a * s + b * c
    return out


def rmsnorm64(x: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    return x / torch.sqrt((x * x).mean() + EPS) * gamma.double()


def attend64(q: torch.Tensor, keys: torch.Tensor, d_v: int, scale: float, sink) -> torch.Tensor:
    """q [h, d], keys [N, d] -> [h, d_v] float64 (sink joins the denominator only)."""
    if keys.shape[0] == 0:
        return torch.zeros(q.shape[0], d_v, dtype=torch.float64)
    s = keys @ q.T * scale
    m = s.max(dim=0).values
    e = torch.exp(s - m)
    den = e.sum(dim=0)
    if sink is not None:
        den = den + torch.exp(sink.double() - m)
    return (e.T @ keys[:, :d_v]) / den[:, None]


# --------------------------------------------------------------------------------------------
# Scenario
# --------------------------------------------------------------------------------------------
QUANT = {
    "bf16": None,
    "fp8_g64": KVQuantConfig.blockwise(64),
    "fp8_token": KVQuantConfig.per_token(),
    "rope_aware": KVQuantConfig.mla_rope_aware(),
    "v32": KVQuantConfig.flashmla_v32(),
    "model1": KVQuantConfig.flashmla_model1(),
}


def make_cache(fmt, d_qk, ps, cache_lens, q_lens, h_q, gen):
    params = KVCacheParams(
        BF16, 2, 1, d_qk, ps, is_mla=True, num_q_heads=h_q, quantization=QUANT[fmt]
    )
    pc = make_paged_cache(params, cache_lens, q_lens, generator=gen)
    # The cached prefix (already normed and roped in a real model): random rows.
    if sum(cache_lens):
        x = torch.randn(sum(cache_lens), 1, d_qk, generator=gen).to(BF16)
        zero = dataclasses.replace(
            pc.inputs, cache_lengths=torch.zeros(len(cache_lens), dtype=torch.int32)
        )
        store_kv(x, None, zero, params, LAYER, ragged_offsets(cache_lens), backend="reference")
    return params, pc


@dataclasses.dataclass
class Branch:
    """Inputs of one branch call plus the oracle's view of them."""

    params: KVCacheParams
    inputs: object
    lut: list[list[int]]
    cache_lens: list[int]
    q_lens: list[int]
    kwargs: dict
    args: tuple
    nope: int
    rank: int
    d_v: int
    v_head: int


def make_branch(fmt, d_qk, ps, cache_lens, q_lens, h_q, gen, *, nope=128, v_head=128, d_v=None):
    params, pc = make_cache(fmt, d_qk, ps, cache_lens, q_lens, h_q, gen)
    rank = d_qk - ROPE
    d_v = rank if d_v is None else d_v
    tokens = sum(q_lens)
    q = torch.randn(tokens, h_q, nope + ROPE, generator=gen).to(BF16)
    new_kv = (torch.randn(tokens, 1, d_qk, generator=gen) * 1.5).to(BF16)
    gamma = (1 + 0.2 * torch.randn(rank, generator=gen)).to(BF16)
    w_uk = torch.randn(h_q, rank, nope, generator=gen) / math.sqrt(nope)
    w_uv = torch.randn(h_q, v_head, d_v, generator=gen) / math.sqrt(d_v)
    args = (
        q,
        ragged_offsets(q_lens),
        make_freqs_cis(ROPE, 128, THETA),
        gamma,
        pc.inputs,
        params,
        LAYER,
    )
    kwargs = dict(
        scale=1 / math.sqrt(nope + ROPE),
        epsilon=EPS,
        new_kv=new_kv,
        w_uk_true=w_uk,
        w_uv_true=w_uv,
    )
    return Branch(
        params,
        pc.inputs,
        pc.inputs.lookup_table.tolist(),
        cache_lens,
        q_lens,
        kwargs,
        args,
        nope,
        rank,
        d_v,
        v_head,
    )


def encode(br: Branch, b: int, pos: int) -> int:
    ps = br.params.page_size
    return br.lut[b][pos // ps] * ps + pos % ps


def oracle_new_rows(br: Branch, interleaved: bool) -> torch.Tensor:
    """float64 [tokens, d_qk]: what the branch must store for each new token (bf16 values)."""
    new_kv = br.kwargs["new_kv"]
    gamma = br.args[3]
    rows = []
    t = 0
    for b, n in enumerate(br.q_lens):
        for i in range(n):
            pos = br.cache_lens[b] + i
            lat = rmsnorm64(new_kv[t, 0, : br.rank].double(), gamma)
            kr = rope64(new_kv[t, 0, br.rank :].double(), pos, interleaved)
            rows.append(bf16(torch.cat([lat, kr])))
            t += 1
    return torch.stack(rows)


def run_and_check(
    br: Branch,
    *,
    interleaved=True,
    causal=True,
    w_scale_dtype=F32,
    sparse=None,
    extra=None,
    sink=None,
    num_partitions=None,
    k_gran=128,
    n_gran=128,
):
    kw = dict(br.kwargs)
    w_uk_true, w_uv_true = kw.pop("w_uk_true"), kw.pop("w_uv_true")
    w_uk, w_uk_s = quantize_weight_blocks(w_uk_true, n_gran, k_gran, w_scale_dtype)
    w_uv, w_uv_s = quantize_weight_blocks(w_uv_true, n_gran, k_gran, w_scale_dtype)
    q = br.args[0]
    tokens, h_q, _ = q.shape
    offs = ragged_offsets(br.q_lens).tolist()
    pool_before = decode_pool(br.params, br.inputs)
    blocks_before = br.inputs.kv_blocks.clone()

    extra_kw = {}
    if sparse is not None:
        extra_kw.update(d_indices=sparse["indices"], topk_lengths=sparse.get("lengths"))
    if extra is not None:
        extra_kw.update(
            extra_kv=extra["operand"],
            extra_d_indices=extra["indices"],
            extra_topk_lengths=extra.get("lengths"),
        )
    out = poison_(torch.empty(tokens, h_q, br.v_head, dtype=BF16))
    res = mla_decode_branch_fp8(
        *br.args,
        **kw,
        w_uk=w_uk,
        w_uk_scale=w_uk_s,
        w_uv=w_uv,
        w_uv_scale=w_uv_s,
        k_gran=k_gran,
        n_gran=n_gran,
        mask="causal" if causal else "null",
        interleaved_rope=interleaved,
        attn_sink=sink,
        num_partitions=num_partitions,
        out=out,
        backend="reference",
        **extra_kw,
    )
    assert res is out

    # ---- cache contents written in place -------------------------------------------------
    ps = br.params.page_size
    expected = oracle_new_rows(br, interleaved)
    pool_after = decode_pool(br.params, br.inputs)
    new_slots = []
    t = 0
    for b, n in enumerate(br.q_lens):
        for i in range(n):
            pos = br.cache_lens[b] + i
            new_slots.append((br.lut[b][pos // ps], pos % ps))
    got = torch.stack([pool_after[p, s] for p, s in new_slots])
    if br.params.quant_format is None:
        assert_close(got, expected, **BF16_TOL, name="stored rows")
    else:  # one e4m3 rounding: half an ulp is 2^-4 relative (subnormals: tiny absolute)
        amax = expected[:, : br.rank].abs().max()
        assert_close(
            got, expected, abs_tol=float(amax) * 2**-12, rel_tol=2**-4 + 1e-6, cos_tol=2e-3
        )
    # Every other slot is untouched (bytes of pages holding no new token; decoded slots).
    touched = torch.zeros(pool_after.shape[:2], dtype=torch.bool)
    for p, s in new_slots:
        touched[p, s] = True
    torch.testing.assert_close(
        pool_after[~touched], pool_before[~touched], rtol=0, atol=0, equal_nan=True
    )
    pages_touched = {p for p, _ in new_slots}
    for p in range(blocks_before.shape[0]):
        if p not in pages_touched:
            assert torch.equal(
                br.inputs.kv_blocks[p].view(torch.uint8), blocks_before[p].view(torch.uint8)
            )

    # ---- keys as the oracle sees them ------------------------------------------------------
    # bf16 cache: the new tokens are the oracle's own rows; FP8: the rows as stored (their
    # quantization was checked just above).
    new_rows = expected if br.params.quant_format is None else got
    pool = pool_before.clone()
    for k, (p, s) in enumerate(new_slots):
        pool[p, s] = new_rows[k]

    # ---- steps 1-5 ---------------------------------------------------------------------------
    wuk64 = weight_deq64(w_uk, w_uk_s, n_gran, k_gran)  # [h, rank, nope]
    wuv64 = weight_deq64(w_uv, w_uv_s, n_gran, k_gran)  # [h, v_head, d_v]
    q_nope_deq = act_quant64(q[..., : br.nope], k_gran)  # [tokens, h, nope]
    scale = br.kwargs["scale"]
    ref = torch.zeros(tokens, h_q, br.v_head, dtype=torch.float64)
    one, group = torch.zeros_like(ref), torch.zeros_like(ref)
    for b, n in enumerate(br.q_lens):
        for i in range(n):
            t = offs[b] + i
            pos = br.cache_lens[b] + i
            q_lat = bf16(torch.einsum("hrn,hn->hr", wuk64, q_nope_deq[t]))
            q_rope = bf16(rope64(q[t, :, br.nope :].double(), pos, interleaved))
            q_full = torch.cat([q_lat, q_rope], dim=-1)
            if sparse is None:
                n_keys = br.cache_lens[b] + (i + 1 if causal else n)
                keys = [pool[br.lut[b][j // ps], j % ps] for j in range(n_keys)]
            else:
                keys = [pool[e // ps, e % ps] for e in sparse["valid"][t]]
            if extra is not None:
                keys += extra["keys"][t]
            K = torch.stack(keys) if keys else torch.zeros(0, br.params.head_dim).double()
            raw = bf16(attend64(q_full, K, br.d_v, scale, sink))  # [h, d_v]
            ref[t] = torch.einsum("hvd,hd->hv", wuv64, act_quant64(raw, k_gran))
            xw = raw[:, None, :] * wuv64  # [h, v_head, d_v]
            one[t] = 2**-3 * xw.abs().amax(dim=-1)
            group[t] = 2**-3 * 3 * xw.norm(dim=-1)
    close_with_slack(res, ref, one, group)
    return res, ref


def close_with_slack(out: torch.Tensor, ref: torch.Tensor, one: torch.Tensor, group: torch.Tensor):
    """The tolerance of the module docstring: `one` (one flip) and `group` (a group
    re-rounding) widen BF16_TOL elementwise."""
    assert not torch.isnan(out).any()
    err = (out.double() - ref).abs()
    base = torch.maximum(torch.full_like(ref, BF16_TOL["abs_tol"]), BF16_TOL["rel_tol"] * ref.abs())
    within_group = err <= base + group
    if not within_group.all():
        i = tuple(torch.nonzero(~within_group)[0].tolist())
        raise AssertionError(
            f"out: {int((~within_group).sum())}/{err.numel()} elements out of tolerance; first "
            f"bad at {i}: out={float(out[i]):.6g} ref={float(ref[i]):.6g}"
        )
    n_bad = int((err > base + one).sum())
    assert n_bad <= 0.01 * err.numel(), f"out: {n_bad}/{err.numel()} elements off by > 1 flip"
    c = cos_diff(out, ref)
    assert c <= 2e-5, f"out: cosine difference {c:.3e} > 2e-5"


# --------------------------------------------------------------------------------------------
# Tests
# --------------------------------------------------------------------------------------------
DENSE = [
    # fmt, d_qk, ps, cache_lens, q_lens, h_q, causal, interleaved, w scale dtype, d_v
    ("bf16", 576, 16, [30, 0, 7], [1, 4, 2], 16, True, True, F32, None),
    ("fp8_g64", 576, 1, [12, 3], [2, 1], 20, False, False, E8M0, None),
    ("fp8_token", 576, 16, [40], [3], 16, True, True, F32, None),
    ("rope_aware", 576, 64, [70, 5], [1, 2], 1, True, True, F32, None),
    ("v32", 576, 16, [17, 0], [2, 3], 16, True, False, E8M0, None),
    ("model1", 512, 16, [21, 4], [2, 2], 16, True, True, F32, 512),
]


@pytest.mark.parametrize(
    "fmt,d_qk,ps,cache_lens,q_lens,h_q,causal,interleaved,sdt,d_v",
    DENSE,
    ids=[f"{c[0]}-ps{c[2]}-h{c[5]}-{'causal' if c[6] else 'null'}" for c in DENSE],
)
def test_dense_branch(gen, fmt, d_qk, ps, cache_lens, q_lens, h_q, causal, interleaved, sdt, d_v):
    br = make_branch(fmt, d_qk, ps, cache_lens, q_lens, h_q, gen, d_v=d_v)
    sink = torch.randn(h_q, generator=gen) if h_q > 1 else None
    run_and_check(br, interleaved=interleaved, causal=causal, w_scale_dtype=sdt, sink=sink)


def test_num_partitions_from_inputs_and_small_blocks(gen):
    """mla_num_partitions of the inputs (the seed's scalar_args) and 64 x 32 weight blocks."""
    br = make_branch("fp8_g64", 576, 16, [50, 9], [1, 3], 4, gen, nope=96, v_head=80)
    br.inputs.mla_num_partitions = torch.tensor([3], dtype=torch.int64)
    run_and_check(br, k_gran=32, n_gran=64)


def _sparse_inputs(br: Branch, stride, lengths, gen):
    """Indices over the request's cached and new tokens plus every invalid kind."""
    ps = br.params.page_size
    slots = len(br.inputs.kv_blocks) * ps
    bad = [-1, -(2**31), slots, 2**31 - 1]
    offs = ragged_offsets(br.q_lens).tolist()
    idx = torch.empty(offs[-1], stride, dtype=torch.int32)
    valid = []
    for b, n in enumerate(br.q_lens):
        seq = br.cache_lens[b] + n
        for t in range(offs[b], offs[b + 1]):
            row = []
            for _ in range(stride):
                if int(torch.randint(0, 4, (), generator=gen)) == 0:
                    row.append(bad[int(torch.randint(0, len(bad), (), generator=gen))])
                else:
                    row.append(encode(br, b, int(torch.randint(0, seq, (), generator=gen))))
            idx[t] = torch.tensor(row, dtype=torch.int32)
            lim = stride if lengths is None else min(lengths[b], stride)
            valid.append([e for e in row[:lim] if 0 <= e < slots])
    lens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32)
    return dict(indices=idx, lengths=lens, valid=valid)


def _extra_cache(br: Branch, fmt, ps, gen):
    """A second cache (own format) whose rows the oracle decodes itself."""
    params, pc = make_cache(fmt, br.params.head_dim, ps, [15] * len(br.q_lens), None, 16, gen)
    pool = decode_pool(params, pc.inputs)
    lut = pc.inputs.lookup_table.tolist()
    offs = ragged_offsets(br.q_lens).tolist()
    stride, lengths = 6, [5, 0, 6][: len(br.q_lens)]
    idx = torch.full((offs[-1], stride), -1, dtype=torch.int32)
    keys = []
    for b in range(len(br.q_lens)):
        for t in range(offs[b], offs[b + 1]):
            ks = []
            for p in range(stride):
                j = int(torch.randint(0, 15, (), generator=gen))
                e = lut[b][j // ps] * ps + j % ps
                idx[t, p] = e
                if p < lengths[b]:
                    ks.append(pool[e // ps, e % ps])
            keys.append(ks)
    return dict(
        operand=PagedOperand(pc.inputs, params, LAYER, "k"),
        indices=idx,
        lengths=torch.tensor(lengths, dtype=torch.int32),
        keys=keys,
    )


@pytest.mark.parametrize(
    "fmt,ps,with_extra,P",
    [("v32", 16, True, 7), ("bf16", 64, False, None), ("rope_aware", 1, True, 2)],
    ids=["v32-extra-P7", "bf16", "rope_aware-extra-P2"],
)
def test_sparse_branch(gen, fmt, ps, with_extra, P):
    br = make_branch(fmt, 576, ps, [33, 6, 0], [2, 1, 3], 16, gen)
    sparse = _sparse_inputs(br, 12, [10, 0, 12], gen)
    extra = _extra_cache(br, "fp8_g64", 16, gen) if with_extra else None
    sink = torch.randn(16, generator=gen)
    sink[3] = float("inf")
    res, _ = run_and_check(br, sparse=sparse, extra=extra, sink=sink, num_partitions=P)
    assert torch.all(res[:, 3] == 0)


# --------------------------------------------------------------------------------------------
# Errors (validation happens before anything is written)
# --------------------------------------------------------------------------------------------
def _bad_cases():
    return [
        ("mask", dict(mask="sliding_window_causal"), "mask"),
        ("q_dim", dict(q=lambda a: a[..., :-1]), "q"),
        ("q_dtype", dict(q=lambda a: a.float()), "q"),
        ("w_uk_shape", dict(w_uk=lambda a: a[:, :-1]), "w_uk"),
        ("w_uk_dtype", dict(w_uk=lambda a: a.to(BF16)), "w_uk"),
        ("w_uk_scale", dict(w_uk_scale=lambda a: a[:, :1]), "w_uk_scale"),
        ("w_uv_heads", dict(w_uv=lambda a: a[:1], w_uv_scale=lambda a: a[:1]), "w_uv"),
        ("w_uv_dv", dict(w_uv=lambda a: torch.cat([a, a], -1)), "w_uv"),
        ("new_kv", dict(new_kv=lambda a: a[:-1]), "new_kv"),
        ("gamma", dict(kv_norm_gamma=lambda a: a[:-1]), "kv_norm_gamma"),
        ("freqs", dict(freqs_cis=lambda a: a[:, :-2]), "freqs_cis"),
        ("scale", dict(scale=lambda a: -a), "scale"),
        ("epsilon", dict(epsilon=lambda a: float("nan")), "epsilon"),
        ("layer", dict(layer_idx=lambda a: 2), "layer_idx"),
        ("layer_bool", dict(layer_idx=lambda a: True), "layer_idx"),
        ("w_uk_scale_negative", dict(w_uk_scale=lambda a: -a), "w_uk_scale"),
        ("w_uv_scale_nan", dict(w_uv_scale=lambda a: a * math.nan), "w_uv_scale"),
        (
            "w_uv_dv_past_512",
            dict(
                w_uv=lambda a: torch.cat([a, a[..., :64]], -1),
                w_uv_scale=lambda a: torch.cat([a, a[..., :1]], -1),
            ),
            "w_uv",
        ),
        ("gamma_fp8", dict(kv_norm_gamma=lambda a: a.to(E4M3)), "kv_norm_gamma"),
        ("num_partitions", dict(num_partitions=lambda a: 2**40), "num_partitions"),
        ("offsets", dict(input_row_offsets=lambda a: a.long()), "input_row_offsets"),
        ("offsets_order", dict(input_row_offsets=lambda a: a[[0, 2, 1]]), "input_row_offsets"),
        ("d_indices", dict(d_indices=lambda a: torch.zeros(2, 4, dtype=torch.int32)), "d_indices"),
        ("sink", dict(attn_sink=lambda a: torch.zeros(3)), "attn_sink"),
        ("topk_dense", dict(topk_lengths=lambda a: torch.zeros(2, dtype=torch.int32)), "topk"),
        ("k_gran", dict(k_gran=lambda a: 0), "k_gran"),
        ("out", dict(out=lambda a: torch.zeros(3, 4, 7, dtype=BF16)), "out"),
        ("rope_flag", dict(interleaved_rope=lambda a: 1), "interleaved_rope"),
    ]


BAD = _bad_cases()


@pytest.mark.parametrize("over,match", [b[1:] for b in BAD], ids=[b[0] for b in BAD])
def test_bad_arguments_write_nothing(gen, over, match):
    br = make_branch("bf16", 576, 16, [5, 2], [2, 1], 4, gen)
    w_uk, w_uk_s = quantize_weight_blocks(br.kwargs["w_uk_true"])
    w_uv, w_uv_s = quantize_weight_blocks(br.kwargs["w_uv_true"])
    names = ("q", "input_row_offsets", "freqs_cis", "kv_norm_gamma", "inputs", "params")
    call = dict(zip(names, br.args[:6]))
    call.update(
        layer_idx=LAYER,
        scale=br.kwargs["scale"],
        epsilon=EPS,
        new_kv=br.kwargs["new_kv"],
        w_uk=w_uk,
        w_uk_scale=w_uk_s,
        w_uv=w_uv,
        w_uv_scale=w_uv_s,
        attn_sink=None,
        topk_lengths=None,
        d_indices=None,
        num_partitions=None,
        out=None,
        k_gran=128,
        mask="causal",
        interleaved_rope=True,
    )
    for k, v in over.items():
        call[k] = v(call[k]) if callable(v) else v
    before = br.inputs.kv_blocks.clone()
    pos = [call.pop(n) for n in names] + [call.pop("layer_idx")]
    with pytest.raises(InvalidArgumentError, match=match):
        mla_decode_branch_fp8(*pos, backend="reference", **call)
    assert torch.equal(br.inputs.kv_blocks.view(torch.uint8), before.view(torch.uint8))


def test_not_an_mla_cache(gen):
    br = make_branch("bf16", 576, 16, [5], [1], 4, gen)
    mha_params = KVCacheParams(BF16, 2, 1, 576, 16)
    w_uk, w_uk_s = quantize_weight_blocks(br.kwargs["w_uk_true"])
    w_uv, w_uv_s = quantize_weight_blocks(br.kwargs["w_uv_true"])
    args = list(br.args)
    args[5] = mha_params
    with pytest.raises(InvalidArgumentError, match="params"):
        mla_decode_branch_fp8(
            *args,
            scale=0.1,
            epsilon=EPS,
            w_uk=w_uk,
            w_uk_scale=w_uk_s,
            w_uv=w_uv,
            w_uv_scale=w_uv_s,
            new_kv=br.kwargs["new_kv"],
        )


def test_branch_is_the_composition_of_the_public_ops(gen):
    """Wiring, bit for bit: the branch equals fp8_bmm -> rope/rmsnorm -> store_kv ->
    mla_decode -> fp8_bmm called one by one (reference backend) on a copy of the cache."""
    from pagedattn.ops.linear import fp8_bmm, rmsnorm, rope
    from pagedattn.ops.mla import mla_decode

    br = make_branch("fp8_g64", 576, 16, [20, 3], [2, 1], 8, gen)
    params, inputs = br.params, br.inputs
    twin = dataclasses.replace(
        inputs, kv_blocks=inputs.kv_blocks.clone(), kv_scales=inputs.kv_scales.clone()
    )
    w_uk, w_uk_s = quantize_weight_blocks(br.kwargs["w_uk_true"])
    w_uv, w_uv_s = quantize_weight_blocks(br.kwargs["w_uv_true"])
    q, offsets, freqs, gamma = br.args[:4]
    new_kv, scale = br.kwargs["new_kv"], br.kwargs["scale"]
    out = mla_decode_branch_fp8(
        *br.args,
        scale=scale,
        epsilon=EPS,
        w_uk=w_uk,
        w_uk_scale=w_uk_s,
        w_uv=w_uv,
        w_uv_scale=w_uv_s,
        new_kv=new_kv,
        backend="reference",
    )
    pos = torch.tensor([20, 21, 3])
    q_lat = fp8_bmm(q[..., : br.nope].transpose(0, 1), w_uk, w_uk_s, backend="reference")
    q_rope = rope(q[..., br.nope :], freqs, pos, interleaved=True)
    latent = rmsnorm(new_kv[..., : br.rank], gamma, EPS)
    k_rope = rope(new_kv[..., br.rank :], freqs, pos, interleaved=True)
    store_kv(torch.cat([latent, k_rope], -1), None, twin, params, LAYER, offsets)
    raw, _ = mla_decode(
        torch.cat([q_lat.transpose(0, 1), q_rope], -1),
        PagedOperand(twin, params, LAYER, "k"),
        offsets,
        scale=scale,
        backend="reference",
    )
    ref = fp8_bmm(raw.transpose(0, 1), w_uv, w_uv_s, backend="reference").transpose(0, 1)
    assert torch.equal(out, ref)
    assert torch.equal(inputs.kv_blocks.view(torch.uint8), twin.kv_blocks.view(torch.uint8))
    assert torch.equal(inputs.kv_scales.view(torch.uint8), twin.kv_scales.view(torch.uint8))
