"""Triton MLA decode branch (same contract as `reference.mla_decode_branch_fp8_reference`,
chosen by `mla_decode_branch_fp8` on CUDA; bf16/fp16 q).

Four launches, no host synchronisation, allocations that depend on shapes only:

  1. `fp8_bmm_triton(q_nope^T, w_uk)` writes q_latent straight into q_full[..., :kv_lora_rank]
     (a strided `out=` view; no concat copy);
  2. `_rope_norm_store_kernel`, one program per (new token, block of heads):
     - RoPE of q_rope -> q_full[..., kv_lora_rank:] (every program, its heads);
     - for the token's cache row (first head block only): RMSNorm of the latent, RoPE of
       k_rope, rounding to the cache's dtype, quantization in the cache's own format and the
       store at cache_length + i. Formats: BF16/FP16/F32, blockwise (float32 or e8m0 scales,
       any G dividing head_dim; per-token is G = head_dim), per-tensor, rope-aware
       (640-byte rows + float32 token scale), FlashMLA V32 (656-byte rows) and MODEL1 (page
       data + scale trailer). No format goes through the reference writer;
  3. `pagedattn.ops.mla.mla_decode(..., backend="triton")`, dense or sparse with every
     argument (extra cache, sink, split-K);
  4. `fp8_bmm_triton(raw^T, w_uv)` writes out^T in place.

Rounding follows the reference: q_latent, roped q_rope and raw are rounded to q.dtype; the
normed latent and roped k_rope to the cache's logical dtype before quantization. Kernel 2 runs
without FMA contraction and with correctly rounded divisions and square root, so RoPE
(bit-exact) and the quantization of a given row (bit-exact) match the reference; RMSNorm's
sum of squares is reduced in another order (a rare last-bit difference before rounding).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ...errors import check
from ...operands import RowOperand
from .._triton_interpreter import install_interpreter_shim
from ..launch import launch
from ..linear.triton_fp8_bmm import fp8_bmm_triton, saturate_e4m3
from ..mla import mla_decode
from .args import BranchArgs

install_interpreter_shim()

# Cache formats (compile-time).
FMT_PLAIN, FMT_BLOCKWISE, FMT_PER_TENSOR, FMT_ROPE_AWARE, FMT_V32, FMT_MODEL1 = range(6)
_FORMATS = {
    None: FMT_PLAIN,
    "blockwise": FMT_BLOCKWISE,
    "per_tensor": FMT_PER_TENSOR,
    "mla_rope_aware": FMT_ROPE_AWARE,
    "flashmla_v32": FMT_V32,
    "flashmla_model1": FMT_MODEL1,
}
# Byte layout of the packed rows (see fp8/mla_formats.py).
V32_SCALE_OFF, V32_ROPE_OFF = tl.constexpr(512), tl.constexpr(528)
MODEL1_DATA, MODEL1_SCALE_BYTES = tl.constexpr(576), tl.constexpr(8)


@triton.jit
def _find_request(offsets, batch, t, BLOCK_B: tl.constexpr):
    """Request b with offsets[b] <= t < offsets[b + 1] (offsets: [batch + 1] int32)."""
    cnt = tl.full((), 0, tl.int32)
    for c in range(0, batch, BLOCK_B):
        o = c + tl.arange(0, BLOCK_B)
        ends = tl.load(offsets + 1 + o, mask=o < batch, other=2147483647)
        cnt += tl.sum((ends <= t).to(tl.int32), 0)
    return cnt


@triton.jit
def _rope_pairs(j, R: tl.constexpr, INTERLEAVED: tl.constexpr):
    """For rope column j: (partner column, frequency index, is the pair's first element)."""
    if INTERLEAVED:
        return j ^ 1, j // 2, (j % 2) == 0
    else:
        half = R // 2
        first = j < half
        return tl.where(first, j + half, j - half), j % half, first


@triton.jit
def _rotate(x, xp, c, s, first):
    """One rotated element: first of pair a' = a c - b s, second b' = a s + b c."""
    return tl.where(first, x * c - xp * s, xp * s + x * c)


@triton.jit
def _e8m0_round_up(scale):
    """float32 scale > 0 -> (e8m0 byte of the next power of two >= scale, its float32 value;
    NaN for NaN/inf/overflow, as `fp8.blockwise.round_scale`)."""
    bits = scale.to(tl.int32, bitcast=True)
    e = (bits >> 23) & 0xFF
    byte = tl.where(e == 255, 255, e + ((bits & 0x7FFFFF) != 0).to(tl.int32))
    byte = tl.minimum(byte, 255)
    val = (byte << 23).to(tl.float32, bitcast=True)
    return byte, tl.where(byte == 255, float("nan"), val)


@triton.jit
def _rope_norm_store_kernel(
    Q,
    s_qt,
    s_qh,
    QF,
    s_ft,
    s_fh,
    NKV,
    s_nt,
    Freqs,
    s_fp,
    max_pos,
    Gamma,
    eps,
    offsets,
    batch,
    cache_lens,
    Lut,
    s_lut,
    page_size,
    page_stride_rows,
    Rows,
    s_row,
    Scales,
    s_srow,
    H,
    NOPE: tl.constexpr,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    D: tl.constexpr,
    G: tl.constexpr,
    GP: tl.constexpr,
    NGP: tl.constexpr,
    FMT: tl.constexpr,
    E8M0: tl.constexpr,
    INTERLEAVED: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_B: tl.constexpr,
):
    """Token t = program_id(0), heads [program_id(1) * BLOCK_H, +BLOCK_H).

    Q [tokens, H, NOPE + ROPE]; QF [tokens, H, RANK + ROPE] (columns RANK: written);
    NKV [tokens, 1, D] (latent then k_rope); Freqs [max_pos, ROPE] f32 (cos, sin) pairs;
    Gamma [RANK]. The cache row is handled as a [NGP, GP] tile, element d = g * G + e:
    quantization groups (blockwise) or latent tiles (packed formats; rope in the last ones).
    """
    t = tl.program_id(0)
    hb = tl.program_id(1)
    in_rng = t < batch
    o_lo = tl.load(offsets + t, mask=in_rng, other=-1)
    o_hi = tl.load(offsets + t + 1, mask=in_rng, other=-1)
    b = t
    if (o_lo != t) | (o_hi != t + 1):  # not one token a request: search
        b = _find_request(offsets, batch, t, BLOCK_B)
        o_lo = tl.load(offsets + b)
    pos = tl.load(cache_lens + b) + (t - o_lo)
    pos_ok = (pos >= 0) & (pos < max_pos)  # out of the table: cos = sin = NaN
    f_base = Freqs + pos.to(tl.int64) * s_fp
    t64 = t.to(tl.int64)

    # ---- RoPE of q_rope for this program's heads -------------------------------------------
    j = tl.arange(0, ROPE)
    jp, fi, first = _rope_pairs(j, ROPE, INTERLEAVED)
    c = tl.load(f_base + 2 * fi, mask=pos_ok, other=float("nan"))
    s = tl.load(f_base + 2 * fi + 1, mask=pos_ok, other=float("nan"))
    h = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    mh = (h < H)[:, None]
    q_row = Q + t64 * s_qt + h[:, None] * s_qh + NOPE
    x = tl.load(q_row + j[None, :], mask=mh, other=0.0).to(tl.float32)
    xp = tl.load(q_row + jp[None, :], mask=mh, other=0.0).to(tl.float32)
    y = _rotate(x, xp, c[None, :], s[None, :], first[None, :])
    tl.store(
        QF + t64 * s_ft + h[:, None] * s_fh + RANK + j[None, :],
        y.to(QF.dtype.element_ty),
        mask=mh,
    )

    # ---- the new token's cache row ---------------------------------------------------------
    if hb == 0:
        g2 = tl.arange(0, NGP)[:, None]
        d = g2 * G + tl.arange(0, GP)[None, :]  # [NGP, GP]
        valid = (tl.arange(0, GP)[None, :] < G) & (d < D)
        lat = valid & (d < RANK)
        rp = valid & (d >= RANK)
        kv_row = NKV + t64 * s_nt
        kx = tl.load(kv_row + d, mask=valid, other=0.0).to(tl.float32)
        # RMSNorm of the latent (fp32, correctly rounded divisions and square root).
        ss = tl.sum(tl.sum(tl.where(lat, kx * kx, 0.0), 1), 0)
        mean = tl.math.div_rn(ss, tl.full((), RANK, tl.float32))
        inv = tl.math.div_rn(tl.full((), 1.0, tl.float32), tl.math.sqrt_rn(mean + eps))
        gam = tl.load(Gamma + d, mask=lat, other=0.0).to(tl.float32)
        normed = kx * inv * gam
        # RoPE of k_rope.
        jr = tl.where(rp, d - RANK, 0)
        jrp, fir, firstr = _rope_pairs(jr, ROPE, INTERLEAVED)
        kxp = tl.load(kv_row + RANK + jrp, mask=rp, other=0.0).to(tl.float32)
        cr = tl.load(f_base + 2 * fir, mask=rp & pos_ok, other=float("nan"))
        sr = tl.load(f_base + 2 * fir + 1, mask=rp & pos_ok, other=float("nan"))
        roped = _rotate(kx, kxp, cr, sr, firstr)
        # The row as the reference hands it to store_kv: rounded to the cache's logical dtype.
        v = tl.where(lat, normed, roped).to(NKV.dtype.element_ty).to(tl.float32)
        v = tl.where(valid, v, 0.0)

        page = tl.load(Lut + b * s_lut + pos // page_size).to(tl.int64)
        off = (pos % page_size).to(tl.int64)
        row = page * page_stride_rows + off
        if FMT == 0:  # plain cache
            tl.store(Rows + row * s_row + d, v.to(Rows.dtype.element_ty), mask=valid)
        elif FMT == 2:  # per-tensor static scale
            sc = tl.load(Scales)
            qv = saturate_e4m3(tl.math.div_rn(v, sc))
            tl.store(Rows + row * s_row + d, qv, mask=valid)
        else:
            # Groups to quantize: every group (blockwise), the latent tiles (packed formats).
            if FMT == 1:
                qm = valid
            else:
                qm = lat
            has_nan = tl.max(((v != v) & qm).to(tl.int32), 1) > 0
            amax = tl.max(tl.where(qm, tl.abs(v), 0.0), 1)
            scale = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
            scale = tl.maximum(scale, 1.1754943508222875e-38)  # 2^-126
            scale = tl.where(has_nan, float("nan"), scale)
            if E8M0:
                byte, scale = _e8m0_round_up(scale)
            qv = tl.math.div_rn(tl.where(qm, v, 0.0), scale[:, None])
            qv = saturate_e4m3(qv)
            gm = tl.max(qm.to(tl.int32), 1) > 0  # groups holding quantized values
            gi = tl.arange(0, NGP)
            if FMT == 1:  # blockwise: e4m3 row + [D // G] scales of the row
                tl.store(Rows + row * s_row + d, qv, mask=valid)
                s_ptr = Scales + row * s_srow + gi
                if E8M0:
                    tl.store(s_ptr, byte.to(tl.uint8), mask=gm)
                else:
                    tl.store(s_ptr, scale, mask=gm)
            else:
                # Packed rows: byte offsets of the latent, the bf16 rope and the scales.
                if FMT == 5:  # MODEL1: data at page + off * 576, scales in the page trailer
                    base = Rows + page * page_stride_rows * s_row + off * MODEL1_DATA
                    rope_off = RANK
                    s_base = Rows + page * page_stride_rows * s_row + page_size * MODEL1_DATA
                    s_base += off * MODEL1_SCALE_BYTES
                elif FMT == 4:  # V32: 512 e4m3 | 4 f32 scales | 64 bf16
                    base = Rows + row * s_row
                    rope_off = V32_ROPE_OFF
                    s_base = base + V32_SCALE_OFF
                else:  # rope-aware: latent e4m3 | rope bf16; f32 token scale in Scales
                    base = Rows + row * s_row
                    rope_off = RANK
                    s_base = Scales + row * s_srow
                tl.store(base + d, qv.to(tl.uint8, bitcast=True), mask=lat)
                rope_ptr = (base + rope_off).to(tl.pointer_type(tl.bfloat16), bitcast=True)
                tl.store(rope_ptr + jr, v.to(tl.bfloat16), mask=rp)
                if FMT == 5:
                    pad = gi == NGP - 1  # the 8th trailer byte is padding (0)
                    tl.store(s_base + gi, tl.where(pad, 0, byte).to(tl.uint8), mask=gm | pad)
                elif FMT == 4:
                    f32_ptr = s_base.to(tl.pointer_type(tl.float32), bitcast=True)
                    tl.store(f32_ptr + gi, scale, mask=gm)
                else:
                    tl.store(s_base + gi, scale, mask=gm)


def _format_layout(op: RowOperand, rank: int) -> tuple[int, int, int, bool]:
    """(format code, G, number of groups, power-of-two scales) of the row tile of a cache
    operand (V32 stores its power-of-two scales as float32, MODEL1 as e8m0 bytes)."""
    fmt = _FORMATS[op.quant_format]
    d = op.head_dim
    if fmt == FMT_BLOCKWISE:
        g = op.quantization_granularity or d
        return fmt, g, d // g, op.scale_dtype == torch.float8_e8m0fnu
    if fmt == FMT_ROPE_AWARE:
        return fmt, rank, -(-d // rank), False
    if fmt == FMT_V32:
        return fmt, 128, 5, True  # 4 latent tiles of 128 (power-of-two f32 scales), rope
    if fmt == FMT_MODEL1:
        return fmt, 64, 8, True  # 7 latent tiles of 64, then the rope
    g = triton.next_power_of_2(d) if d <= 1024 else 1024
    return fmt, g, -(-d // g), False


def rope_norm_store_triton(
    q: torch.Tensor,
    q_full: torch.Tensor,
    new_kv: torch.Tensor,
    freqs_cis: torch.Tensor,
    kv_norm_gamma: torch.Tensor,
    epsilon: float,
    kv: RowOperand,
    input_row_offsets: torch.Tensor,
    *,
    qk_nope_dim: int,
    interleaved: bool = True,
) -> None:
    """Step 2 of the branch in one kernel.

    q: [tokens, h_q, qk_nope_dim + rope] (q_rope = its last rope columns).
    q_full: [tokens, h_q, kv_lora_rank + rope] (unit last stride); columns kv_lora_rank: get
      the roped q_rope in q_full.dtype.
    new_kv: [tokens, 1, head_dim] un-normed latent then un-roped k_rope (cache logical dtype).
    freqs_cis: float32 [max_pos, rope] (cos, sin) pairs; kv_norm_gamma: [kv_lora_rank].
    kv: the paged MLA cache operand; token i of request b is written at cache_length(b) + i.
    input_row_offsets: [batch + 1] int32. Positions outside freqs_cis give NaN rotations.
    """
    tokens, h_q, _ = q.shape
    rope = kv.rope_dim
    d = kv.head_dim
    rank = d - rope
    check(kv.page_size > 0, "kv", "a paged MLA cache operand", "page_size 0")
    check(
        rope >= 2 and rope & (rope - 1) == 0,
        "rope_dim",
        "a power of two >= 2 (the Triton branch)",
        rope,
    )
    if tokens == 0:
        return
    if q.stride(2) != 1:
        q = q.contiguous()
    if new_kv.stride(2) != 1:
        new_kv = new_kv.contiguous()
    freqs = freqs_cis if freqs_cis.dtype == torch.float32 else freqs_cis.float()
    if freqs.stride(1) != 1:
        freqs = freqs.contiguous()
    gamma = kv_norm_gamma.contiguous()
    fmt, g, ng, e8m0 = _format_layout(kv, rank)
    rows = kv.rows
    check(rows.stride(2) == 1, "kv.rows", "a unit last stride", rows.stride())
    if fmt == FMT_BLOCKWISE and e8m0:
        scales, s_srow = kv.scales.view(torch.uint8), kv.scales.stride(0)
    elif fmt in (FMT_BLOCKWISE, FMT_ROPE_AWARE):
        scales, s_srow = kv.scales, kv.scales.stride(0)
    elif fmt == FMT_PER_TENSOR:
        scales, s_srow = kv.scales, 0
    else:
        scales, s_srow = rows, 0  # never read
    if fmt in (FMT_ROPE_AWARE, FMT_V32, FMT_MODEL1):
        align = 4 if fmt == FMT_V32 else 2
        check(
            rows.data_ptr() % align == 0 and rows.stride(0) % align == 0,
            "kv.rows",
            f"{align}-byte aligned packed rows",
            f"pointer mod {align} = {rows.data_ptr() % align}",
        )
    batch = input_row_offsets.shape[0] - 1
    block_h = min(triton.next_power_of_2(h_q), max(1, 4096 // rope))
    grid = (tokens, triton.cdiv(h_q, block_h))
    launch(
        _rope_norm_store_kernel,
        grid,
        q,
        q.stride(0),
        q.stride(1),
        q_full,
        q_full.stride(0),
        q_full.stride(1),
        new_kv,
        new_kv.stride(0),
        freqs,
        freqs.stride(0),
        freqs.shape[0],
        gamma,
        float(epsilon),
        input_row_offsets,
        batch,
        kv.cache_lengths,
        kv.lut,
        kv.lut.stride(0),
        kv.page_size,
        kv.page_stride_rows,
        rows,
        rows.stride(0),
        scales,
        s_srow,
        h_q,
        NOPE=qk_nope_dim,
        RANK=rank,
        ROPE=rope,
        D=d,
        G=g,
        GP=triton.next_power_of_2(g),
        NGP=triton.next_power_of_2(ng),
        FMT=fmt,
        E8M0=e8m0,
        INTERLEAVED=bool(interleaved),
        BLOCK_H=block_h,
        BLOCK_B=max(16, min(1024, triton.next_power_of_2(batch + 1))),
        num_warps=4,
        enable_fp_fusion=False,
    )


def mla_decode_branch_fp8_triton(a: BranchArgs) -> torch.Tensor:
    """The branch with its pieces fused (arguments validated by `mla_decode_branch_fp8`).
    Writes the new tokens into the cache; returns out [tokens, h_q, v_head_dim] in q.dtype.
    q must be bf16 or fp16 (the Triton MLA decode's dtypes); checked before anything is
    written."""
    q = a.q
    check(
        q.dtype in (torch.bfloat16, torch.float16),
        "q.dtype",
        "torch.bfloat16 or torch.float16 for the Triton branch (use backend='reference' for "
        "float32)",
        q.dtype,
    )
    tokens, h_q, _ = q.shape
    rank = a.kv_lora_rank
    gran = dict(k_gran=a.k_gran, n_gran=a.n_gran, out_dtype=q.dtype)
    kv = a.cache()
    out = a.out
    if out is None:
        out = torch.empty(tokens, h_q, a.v_head_dim, dtype=q.dtype, device=q.device)
    num_partitions = a.decode_num_partitions()
    if tokens == 0:
        return out

    q_full = torch.empty(tokens, h_q, a.params.head_dim, dtype=q.dtype, device=q.device)
    # 1. q_nope @ w_uk -> q_full[..., :rank] (as [h_q, tokens, rank] views).
    q_nope = q[..., : a.qk_nope_dim].transpose(0, 1)
    fp8_bmm_triton(q_nope, a.w_uk, a.w_uk_scale, **gran, out=q_full[..., :rank].transpose(0, 1))
    # 2. RoPE(q_rope) -> q_full[..., rank:]; RMSNorm + RoPE + quantize + store of new tokens.
    rope_norm_store_triton(
        q,
        q_full,
        a.new_kv,
        a.freqs_cis,
        a.kv_norm_gamma,
        a.epsilon,
        kv,
        a.input_row_offsets,
        qk_nope_dim=a.qk_nope_dim,
        interleaved=a.interleaved_rope,
    )
    # 3-4. MLA decode over the cache (now holding the new tokens).
    raw = mla_decode(
        q_full,
        kv,
        a.input_row_offsets,
        **a.decode_kwargs(),
        num_partitions=num_partitions,
        backend="triton",
        return_lse=False,
    )
    # 5. raw @ w_uv -> out (as [h_q, tokens, v_head_dim] views).
    fp8_bmm_triton(raw.transpose(0, 1), a.w_uv, a.w_uv_scale, **gran, out=out.transpose(0, 1))
    return out


__all__ = ["mla_decode_branch_fp8_triton", "rope_norm_store_triton"]
