"""Triton MLA decode branch (`ops/mla_branch/triton_branch.py`) against the reference ops.

CPU runs use TRITON_INTERPRET=1 (set before triton is imported) at small shapes; the
`@pytest.mark.gpu` tests use DeepSeek's sizes (h_q 16/128, kv_lora_rank 512, qk_nope 128,
v_head 128) and CUDA-graph capture (which fails on any host synchronisation).

Every case runs the public `mla_decode_branch_fp8(..., backend="triton")` on a NaN-poisoned
paged cache (shuffled pages, sentinel lookup-table entries) with a poisoned `out`, and the
reference composition (`fp8_bmm_reference`, `rope`, `rmsnorm`, the reference row writer,
`mla_decode_reference`, `fp8_bmm_reference`: the five steps of `reference.py`) on a byte copy.
A spy on the branch's `mla_decode` call captures the concatenated query and the decode output,
so each stage is checked against the reference given the same inputs:

  A. cache: the bytes written in place equal the reference writer's (all formats are written
     by the Triton kernel). RoPE and the quantization of a row are bit-exact; RMSNorm's sum of
     squares is reduced in another order, so a rare normed value may differ by one ulp of the
     cache dtype, hence by one e4m3 step after quantization (and a whole group re-rounds when
     it is the group's amax): decoded rows must agree within that, and at most 2% of the new
     rows' bytes may differ. Bytes the reference leaves alone are never touched.
  B. q_full: the roped q_rope is bit-exact; q_nope @ w_uk against `fp8_bmm_reference` run on
     the CPU, within BF16_TOL (the fp32 sums differ in order only; on Hopper the fp8 tensor
     core's accumulator may lose up to 2^-9 of the sum of |terms|, which widens abs_tol:
     test_triton_fp8_bmm.py).
  C. raw: `mla_decode_reference` of the captured q_full over the Triton-written cache. The
     Triton decode rounds P to bf16 before P.V (as FlashMLA does): each weight moves by at
     most half an ulp, 2^-8 relative, so |err| <= 2^-8 * max|v| (abs_tol, max over the keys
     of the cache) or 2/128 relative. One dominant key (these small, peaky cases) leaves an
     error of ~2^-8/sqrt(3) relative, a cosine difference of ~3e-6: bounded by 2e-5. Formats
     the kernel dequantizes to bf16 once (several float32 scales a row) move the scores too
     (test_triton_mla.py's TOL_DEQ): abs_tol 3e-2, cosine 6e-5.
  D. out: `fp8_bmm_reference` of the captured raw, as B.
  E. end to end against the reference composition: raw moves by C's error (~2e-3 relative
     a element), which re-rounds a few percent of the second bmm's e4m3 activations by one
     step (2^-4..2^-3 relative): ~2% rms relative error, a cosine difference of ~2e-4;
     bounded by 1e-3 (a wrong key or head moves it by orders of magnitude).
"""

from __future__ import annotations

import os

import torch

ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
if not ON_GPU:
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

import dataclasses  # noqa: E402
import math  # noqa: E402

import pytest  # noqa: E402

from pagedattn import KVCacheParams, KVQuantConfig, PagedOperand  # noqa: E402
from pagedattn.ops.linear import (  # noqa: E402
    dequantize_weight_blocks,
    fp8_bmm_reference,
    make_freqs_cis,
    quantize_weight_blocks,
    rmsnorm,
    rope,
)
from pagedattn.ops.mla.reference import mla_decode_reference  # noqa: E402
from pagedattn.ops.mla_branch import mla_decode_branch_fp8, triton_branch  # noqa: E402
from pagedattn.ops.store_kv import reference as store_ref  # noqa: E402
from pagedattn.testing import (  # noqa: E402
    BF16_TOL,
    assert_close,
    cos_diff,
    make_paged_cache,
    poison_,
    ragged_offsets,
)

BF16, F32, E8M0 = torch.bfloat16, torch.float32, torch.float8_e8m0fnu
DEV = "cuda" if ON_GPU else "cpu"
LAYER = 1  # of 2 layers: catches layer-stride mistakes
ROPE = 64
THETA = 10000.0
EPS = 1e-6
PER_TENSOR_SCALE = 0.0125

QUANT = {
    "bf16": None,
    "fp8_g64": KVQuantConfig.blockwise(64),
    "fp8_g192_e8m0": KVQuantConfig.blockwise(192, E8M0),  # a group spans latent and rope
    "fp8_token_e8m0": KVQuantConfig.per_token(E8M0),
    "fp8_token": KVQuantConfig.per_token(),
    "per_tensor": KVQuantConfig.per_tensor(),
    "rope_aware": KVQuantConfig.mla_rope_aware(),
    "v32": KVQuantConfig.flashmla_v32(),
    "model1": KVQuantConfig.flashmla_model1(),
}


def decode_tol(fmt: str, d_qk: int, vmax: float) -> dict:
    """Tolerance of C (module docstring): formats dequantized with several float32 scales a
    row (or a per-token scale next to an unscaled rope at d_qk 512) are rounded to bf16."""
    if fmt == "fp8_g64" or (fmt == "rope_aware" and d_qk == 512):
        return dict(abs_tol=max(3e-2, 2.0**-8 * vmax), rel_tol=2 / 128, cos_tol=6e-5)
    return dict(abs_tol=2.0**-8 * vmax, rel_tol=2 / 128, cos_tol=2e-5)


def check_bmm(out, x, w, ws, n_gran: int, k_gran: int, name: str) -> None:
    """B and D: out [batch, m, n] against `fp8_bmm_reference` of x @ w^T run on the CPU (on
    CUDA, PyTorch divides by the scalar 448 as a multiplication by its reciprocal, which rounds
    some quantization ties differently from the kernel and from the CPU reference)."""
    ref = fp8_bmm_reference(
        x.cpu(), w.cpu(), ws.cpu(), k_gran=k_gran, n_gran=n_gran, out_dtype=out.dtype
    )
    tol = BF16_TOL
    if ON_GPU:
        wd = dequantize_weight_blocks(w.cpu(), ws.cpu(), n_gran, k_gran)
        mag = float((x.cpu().float().abs() @ wd.abs().transpose(1, 2)).max())
        tol = dict(BF16_TOL, abs_tol=max(BF16_TOL["abs_tol"], 2.0**-9 * mag))
    assert_close(out.cpu(), ref, **tol, name=name)


def value_max(case: Case, kw: dict) -> float:
    """max |v| over every valid key of the cache (and of the extra cache)."""
    d_v = kw["w_uv"].shape[2]
    vmax = 0.0
    ops = [(PagedOperand(case.inputs, case.params, LAYER, "k"), None)]
    if kw.get("extra_kv") is not None:
        ops.append((kw["extra_kv"], 15))
    offsets = case.args[1].tolist()
    for op, n in ops:
        for b in range(op.batch_size):
            seq = n if n is not None else op.cache_length(b) + offsets[b + 1] - offsets[b]
            if seq:
                vmax = max(vmax, float(op.gather(b, seq)[..., :d_v].abs().max()))
    return vmax


# --------------------------------------------------------------------------------------------
# Reference pieces
# --------------------------------------------------------------------------------------------
def store_rows(inputs, params, x: torch.Tensor, offsets: torch.Tensor) -> None:
    """Write x [N, 1, d_qk] (ragged by offsets) at cache_length + i with the reference row
    writer (`store_kv.reference.write_rows`)."""
    op = PagedOperand(inputs, params, LAYER, "k")
    b, pos = store_ref.token_batch_and_pos(offsets, inputs.cache_lengths, x.shape[0])
    store_ref.write_rows(op, op.physical_rows(b, pos), x)


@dataclasses.dataclass
class Case:
    fmt: str
    params: KVCacheParams
    inputs: object  # the Triton branch's cache
    twin: object  # the reference's byte copy
    args: tuple
    kw: dict
    nope: int
    rank: int


def clone_inputs(inputs):
    return dataclasses.replace(
        inputs,
        kv_blocks=inputs.kv_blocks.clone(),
        kv_scales=None if inputs.kv_scales is None else inputs.kv_scales.clone(),
    )


def make_case(
    fmt,
    d_qk,
    ps,
    cache_lens,
    q_lens,
    h_q,
    gen,
    *,
    nope=128,
    v_head=128,
    d_v=None,
    k_gran=128,
    n_gran=128,
    sdt=F32,
    interleaved=True,
    causal=True,
):
    params = KVCacheParams(
        BF16, 2, 1, d_qk, ps, is_mla=True, num_q_heads=h_q, quantization=QUANT[fmt]
    )
    pc = make_paged_cache(params, cache_lens, q_lens, generator=gen, device=DEV)
    inputs = pc.inputs
    if fmt == "per_tensor":
        inputs.kv_scales[0, LAYER] = PER_TENSOR_SCALE
    if sum(cache_lens):  # the cached prefix (already normed and roped in a model): random
        prefix = torch.randn(sum(cache_lens), 1, d_qk, generator=gen).to(BF16).to(DEV)
        zero = dataclasses.replace(inputs, cache_lengths=torch.zeros_like(inputs.cache_lengths))
        store_rows(zero, params, prefix, ragged_offsets(cache_lens, DEV))
    rank = d_qk - ROPE
    d_v = rank if d_v is None else d_v
    tokens = sum(q_lens)

    def dev(t):
        return t.to(DEV)

    q = dev(torch.randn(tokens, h_q, nope + ROPE, generator=gen).to(BF16))
    new_kv = dev((torch.randn(tokens, 1, d_qk, generator=gen) * 1.5).to(BF16))
    gamma = dev((1 + 0.2 * torch.randn(rank, generator=gen)).to(BF16))
    w_uk, w_uk_s = quantize_weight_blocks(
        torch.randn(h_q, rank, nope, generator=gen) / math.sqrt(nope), n_gran, k_gran, sdt
    )
    w_uv, w_uv_s = quantize_weight_blocks(
        torch.randn(h_q, v_head, d_v, generator=gen) / math.sqrt(d_v), n_gran, k_gran, sdt
    )
    freqs = make_freqs_cis(ROPE, 4096, THETA, device=DEV)
    args = (q, ragged_offsets(q_lens, DEV), freqs, gamma)
    kw = dict(
        scale=1 / math.sqrt(nope + ROPE),
        epsilon=EPS,
        w_uk=dev(w_uk),
        w_uk_scale=dev(w_uk_s),
        w_uv=dev(w_uv),
        w_uv_scale=dev(w_uv_s),
        new_kv=new_kv,
        k_gran=k_gran,
        n_gran=n_gran,
        mask="causal" if causal else "null",
        interleaved_rope=interleaved,
    )
    return Case(fmt, params, inputs, clone_inputs(inputs), args, kw, nope, rank)


def decode_kwargs(kw: dict, inputs) -> dict:
    """mla_decode's keyword arguments for the branch's keyword arguments."""
    P = kw.get("num_partitions")
    if P is None and inputs.mla_num_partitions is not None:
        P = int(inputs.mla_num_partitions.reshape(-1)[0])
    return dict(
        d_v=kw["w_uv"].shape[2],
        scale=kw["scale"],
        causal=kw["mask"] == "causal",
        indices=kw.get("d_indices"),
        topk_lengths=kw.get("topk_lengths"),
        extra_kv=kw.get("extra_kv"),
        extra_indices=kw.get("extra_d_indices"),
        extra_topk_lengths=kw.get("extra_topk_lengths"),
        attn_sink=kw.get("attn_sink"),
        num_partitions=P,
    )


def reference_branch(case: Case, kw: dict):
    """The reference's five steps on case.twin -> (out, q_full, raw)."""
    q, offsets, freqs, gamma = case.args
    nope, rank, params = case.nope, case.rank, case.params
    tokens = q.shape[0]
    _, pos = store_ref.token_batch_and_pos(offsets, case.twin.cache_lengths, tokens)
    gran = dict(k_gran=kw["k_gran"], n_gran=kw["n_gran"], out_dtype=q.dtype)
    q_lat = fp8_bmm_reference(q[..., :nope].transpose(0, 1), kw["w_uk"], kw["w_uk_scale"], **gran)
    il = kw["interleaved_rope"]
    q_rope = rope(q[..., nope:], freqs, pos, interleaved=il)
    new_kv = kw["new_kv"]
    latent = rmsnorm(new_kv[..., :rank], gamma, EPS)
    k_rope = rope(new_kv[..., rank:], freqs, pos, interleaved=il)
    store_rows(case.twin, params, torch.cat([latent, k_rope], -1).to(params.dtype), offsets)
    q_full = torch.cat([q_lat.transpose(0, 1), q_rope], -1)
    op = PagedOperand(case.twin, params, LAYER, "k")
    raw, _ = mla_decode_reference(q_full, op, offsets, **decode_kwargs(kw, case.twin))
    out = fp8_bmm_reference(raw.transpose(0, 1), kw["w_uv"], kw["w_uv_scale"], **gran)
    return out.transpose(0, 1), q_full, raw


def new_rows(case: Case) -> torch.Tensor:
    """Physical rows of the new tokens."""
    q, offsets = case.args[:2]
    op = PagedOperand(case.inputs, case.params, LAYER, "k")
    b, pos = store_ref.token_batch_and_pos(offsets, case.inputs.cache_lengths, q.shape[0])
    return op.physical_rows(b, pos)


def check_cache(case: Case, before) -> None:
    """A: the Triton-written cache against the reference-written twin."""
    fp8 = case.params.quant_format is not None
    changed = 0
    for name in ("kv_blocks", "kv_scales"):
        a, b = getattr(case.inputs, name), getattr(case.twin, name)
        if a is None:
            continue
        a, b, s = (t.view(torch.uint8).cpu() for t in (a, b, getattr(before, name)))
        stray = (a != s) & (b == s)
        assert not stray.any(), f"{name}: {int(stray.sum())} bytes written the reference left alone"
        changed += int((a != b).sum())
    rows = new_rows(case)
    row_bytes = case.inputs.kv_blocks.shape[-1] * case.inputs.kv_blocks.element_size()
    assert changed <= 0.02 * rows.numel() * row_bytes, f"{changed} bytes differ"
    got = PagedOperand(case.inputs, case.params, LAYER, "k").load_rows(rows).double().cpu()
    ref = PagedOperand(case.twin, case.params, LAYER, "k").load_rows(rows).double().cpu()
    err = (got - ref).abs()
    bound = 2.0**-7 * ref.abs()  # one ulp of bf16
    if fp8:  # one e4m3 step, or a re-rounded group (its scale moves by one bf16 ulp)
        amax = ref.abs().amax(dim=-1, keepdim=True)
        bound = bound + 2.0**-3 * ref.abs() + 2.0**-9 * amax
    assert torch.all(err <= bound), f"stored rows: max err {float(err.max()):.3g}"


def run_branch(case: Case, monkeypatch, **extra) -> torch.Tensor:
    """Run the Triton branch and the reference on the same inputs; check A-E."""
    kw = dict(case.kw, **extra)
    q = case.args[0]
    tokens, h_q, _ = q.shape
    v_head = kw["w_uv"].shape[1]
    spy = {}
    real = triton_branch.mla_decode

    def spy_decode(q_full, kv, offsets, **dkw):
        spy["q_full"] = q_full.clone()
        res = real(q_full, kv, offsets, **dkw)
        assert dkw["backend"] == "triton" and dkw["return_lse"] is False  # (out alone)
        spy["raw"] = res.clone()
        return res

    monkeypatch.setattr(triton_branch, "mla_decode", spy_decode)
    before = clone_inputs(case.inputs)
    out = poison_(torch.empty(tokens, h_q, v_head, dtype=BF16, device=DEV))
    res = mla_decode_branch_fp8(
        *case.args, case.inputs, case.params, LAYER, **kw, out=out, backend="triton"
    )
    assert res is out
    ref_out, ref_qfull, _ = reference_branch(case, kw)

    check_cache(case, before)  # A
    rank = case.rank
    assert torch.equal(spy["q_full"][..., rank:], ref_qfull[..., rank:])  # B
    g = (kw["n_gran"], kw["k_gran"])
    check_bmm(
        spy["q_full"][..., :rank].transpose(0, 1), q[..., : case.nope].transpose(0, 1),
        kw["w_uk"], kw["w_uk_scale"], *g, "q_latent",
    )  # fmt: skip
    op = PagedOperand(case.inputs, case.params, LAYER, "k")  # C
    raw_ref, _ = mla_decode_reference(
        spy["q_full"], op, case.args[1], **decode_kwargs(kw, case.inputs)
    )
    tol = decode_tol(case.fmt, case.params.head_dim, value_max(case, kw))
    assert_close(spy["raw"], raw_ref, **tol, name="raw")
    check_bmm(  # D
        out.transpose(0, 1), spy["raw"].transpose(0, 1), kw["w_uv"], kw["w_uv_scale"], *g, "out"
    )
    c = cos_diff(out, ref_out)  # E
    assert c <= 1e-3, f"end to end: cosine difference {c:.3e}"
    return out


# --------------------------------------------------------------------------------------------
# Dense
# --------------------------------------------------------------------------------------------
DENSE = [
    # fmt, d_qk, ps, cache_lens, q_lens, h_q, causal, interleaved, w scale dtype
    ("bf16", 576, 16, [30, 0, 7], [1, 4, 2], 16, True, True, F32),
    ("fp8_g64", 576, 1, [12, 3], [2, 1], 20, False, False, E8M0),
    ("fp8_g192_e8m0", 576, 7, [9, 20], [3, 1], 8, True, True, F32),
    ("fp8_token_e8m0", 576, 16, [40], [3], 16, True, True, F32),
    ("per_tensor", 576, 5, [11, 2], [1, 2], 4, True, False, E8M0),
    ("rope_aware", 576, 64, [70, 5], [1, 2], 1, True, True, F32),
    ("v32", 576, 16, [17, 0], [2, 3], 16, True, False, E8M0),
    ("model1", 512, 3, [21, 4], [2, 2], 16, True, True, F32),
]


@pytest.mark.parametrize(
    "fmt,d_qk,ps,cache_lens,q_lens,h_q,causal,interleaved,sdt",
    DENSE,
    ids=[f"{c[0]}-ps{c[2]}-h{c[5]}-{'causal' if c[6] else 'null'}" for c in DENSE],
)
def test_dense_branch(
    gen, monkeypatch, fmt, d_qk, ps, cache_lens, q_lens, h_q, causal, interleaved, sdt
):
    case = make_case(
        fmt, d_qk, ps, cache_lens, q_lens, h_q, gen, sdt=sdt, interleaved=interleaved, causal=causal
    )
    sink = torch.randn(h_q, generator=gen).to(DEV) if h_q > 1 else None
    run_branch(case, monkeypatch, attn_sink=sink)


def test_partitions_from_inputs_and_small_blocks(gen, monkeypatch):
    """mla_num_partitions of the inputs (the seed's scalar_args), 64 x 32 weight blocks and
    partial last blocks (qk_nope 96, v_head 80)."""
    case = make_case(
        "fp8_token", 576, 16, [50, 9], [1, 3], 4, gen, nope=96, v_head=80, k_gran=32, n_gran=64
    )
    case.inputs.mla_num_partitions = torch.tensor([3], dtype=torch.int64)
    case.twin.mla_num_partitions = case.inputs.mla_num_partitions
    run_branch(case, monkeypatch)


# --------------------------------------------------------------------------------------------
# Sparse
# --------------------------------------------------------------------------------------------
def sparse_indices(case: Case, stride: int, lengths, gen) -> dict:
    """Indices over each request's cached and new tokens plus every invalid kind."""
    ps = case.params.page_size
    lut = case.inputs.lookup_table.tolist()
    slots = case.inputs.kv_blocks.shape[0] * ps
    bad = [-1, -(2**31), slots, 2**31 - 1]
    q_lens = (case.args[1][1:] - case.args[1][:-1]).tolist()
    cache_lens = case.inputs.cache_lengths.tolist()
    rows = []
    for b, n in enumerate(q_lens):
        seq = cache_lens[b] + n
        for _ in range(n):
            row = []
            for _ in range(stride):
                if int(torch.randint(0, 4, (), generator=gen)) == 0:
                    row.append(bad[int(torch.randint(0, len(bad), (), generator=gen))])
                else:
                    j = int(torch.randint(0, seq, (), generator=gen))
                    row.append(lut[b][j // ps] * ps + j % ps)
            rows.append(row)
    idx = torch.tensor(rows, dtype=torch.int32, device=DEV)
    lens = None if lengths is None else torch.tensor(lengths, dtype=torch.int32, device=DEV)
    return dict(d_indices=idx, topk_lengths=lens)


def extra_cache(case: Case, fmt: str, gen) -> dict:
    """A second cache of its own format, attended through its own indices."""
    q_lens = (case.args[1][1:] - case.args[1][:-1]).tolist()
    h_q = case.args[0].shape[1]
    params = KVCacheParams(
        BF16, 2, 1, case.params.head_dim, 16, is_mla=True, num_q_heads=h_q,
        quantization=QUANT[fmt],
    )  # fmt: skip
    pc = make_paged_cache(params, [15] * len(q_lens), None, generator=gen, device=DEV)
    rows = torch.randn(15 * len(q_lens), 1, params.head_dim, generator=gen).to(BF16).to(DEV)
    zero = dataclasses.replace(pc.inputs, cache_lengths=torch.zeros_like(pc.inputs.cache_lengths))
    store_rows(zero, params, rows, ragged_offsets([15] * len(q_lens), DEV))
    lut = pc.inputs.lookup_table.tolist()
    idx = []
    for b, n in enumerate(q_lens):
        for _ in range(n):
            js = torch.randint(0, 15, (6,), generator=gen).tolist()
            idx.append([lut[b][j // 16] * 16 + j % 16 for j in js])
    lengths = [5, 0, 6, 3][: len(q_lens)]
    return dict(
        extra_kv=PagedOperand(pc.inputs, params, LAYER, "k"),
        extra_d_indices=torch.tensor(idx, dtype=torch.int32, device=DEV),
        extra_topk_lengths=torch.tensor(lengths, dtype=torch.int32, device=DEV),
    )


@pytest.mark.parametrize(
    "fmt,ps,extra_fmt,P",
    [("v32", 16, "fp8_g64", 3), ("bf16", 64, None, None), ("rope_aware", 1, "bf16", 2)],
    ids=["v32-extra-P3", "bf16", "rope_aware-extra-P2"],
)
def test_sparse_branch(gen, monkeypatch, fmt, ps, extra_fmt, P):
    case = make_case(fmt, 576, ps, [33, 6, 0], [2, 1, 3], 16, gen)
    kw = sparse_indices(case, 12, [10, 0, 12], gen)
    if extra_fmt is not None:
        kw.update(extra_cache(case, extra_fmt, gen))
    sink = torch.randn(16, generator=gen)
    sink[3] = float("inf")
    out = run_branch(case, monkeypatch, **kw, attn_sink=sink.to(DEV), num_partitions=P)
    assert torch.all(out[:, 3] == 0)


# --------------------------------------------------------------------------------------------
# Step 2's kernel alone: RoPE of q (bit-exact) and the stored rows, heads split in blocks
# --------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fmt", ["fp8_token", "model1"])
def test_rope_norm_store_kernel(gen, fmt):
    d_qk = 512 if fmt == "model1" else 576
    case = make_case(fmt, d_qk, 5, [3, 11], [2, 3], 160, gen, nope=32)
    q, offsets, freqs, gamma = case.args
    q_full = poison_(torch.empty(q.shape[0], 160, d_qk, dtype=BF16, device=DEV))
    op = PagedOperand(case.inputs, case.params, LAYER, "k")
    before = clone_inputs(case.inputs)
    triton_branch.rope_norm_store_triton(
        q, q_full, case.kw["new_kv"], freqs, gamma, EPS, op, offsets, qk_nope_dim=32
    )
    _, q_ref, _ = reference_branch(case, case.kw)
    assert torch.equal(q_full[..., case.rank :], q_ref[..., case.rank :])
    assert torch.isnan(q_full[..., : case.rank]).all()
    check_cache(case, before)


# --------------------------------------------------------------------------------------------
# GPU: DeepSeek sizes, and CUDA-graph capture (no host sync on the path)
# --------------------------------------------------------------------------------------------
GPU_CASES = [
    # fmt, d_qk, h_q, sparse, q_len
    ("bf16", 576, 128, False, 1),
    ("bf16", 576, 16, False, 2),
    ("rope_aware", 576, 128, False, 1),
    ("fp8_token", 576, 16, False, 1),
    ("v32", 576, 128, True, 2),
    ("model1", 512, 64, True, 1),
]


@pytest.mark.gpu
@pytest.mark.parametrize(
    "fmt,d_qk,h_q,sparse,q_len",
    GPU_CASES,
    ids=[f"{c[0]}-h{c[2]}-{'sparse' if c[3] else 'dense'}-sq{c[4]}" for c in GPU_CASES],
)
def test_gpu_deepseek_sizes(gen, monkeypatch, fmt, d_qk, h_q, sparse, q_len):
    cache_lens = [700, 64, 1, 333]
    case = make_case(fmt, d_qk, 64, cache_lens, [q_len] * 4, h_q, gen, d_v=512)
    kw = {}
    if sparse:
        kw = sparse_indices(case, 256, [200, 0, 256, 77], gen)
        if fmt == "v32":
            kw.update(extra_cache(case, "fp8_g64", gen))
    run_branch(case, monkeypatch, **kw, attn_sink=torch.randn(h_q, generator=gen).to(DEV))


@pytest.mark.gpu
def test_gpu_cuda_graph_capture():
    gen = torch.Generator().manual_seed(0)
    case = make_case("rope_aware", 576, 64, [300, 5], [1, 1], 128, gen)
    kw = dict(case.kw, num_partitions=2)
    out = torch.empty(2, 128, 128, dtype=BF16, device=DEV)
    args = (*case.args, case.inputs, case.params, LAYER)
    eager = mla_decode_branch_fp8(*args, **kw, out=out.clone(), backend="triton")
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):  # warm-up (compiles) outside the capture
        mla_decode_branch_fp8(*args, **kw, out=out, backend="triton")
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        mla_decode_branch_fp8(*args, **kw, out=out, backend="triton")
    out.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
