"""K/V tile helpers shared by the Triton MHA kernels (`triton_decode`, `triton_prefill`; the
Gluon prefills take `visible_range`). Inlined by Triton into each kernel.

Addressing (see `operands.KernelArgs`): token t of request b sits in physical row
  paged:     lut[b, t // PAGE] * page_stride + t % PAGE
  not paged: row_offsets[b] + t
and element d of KV head h at `row * stride_r + h * stride_h + d`. PAGE is a constexpr (0 = not
paged), so pages of any size (1, 3, 16, 64, ...) work and a tile may span several pages: the row
is computed per token inside the tile.

Quantization codes (constexpr): 0 none, 1 per-tensor (one float32 scale), 2 per-token
(blockwise with G == head_dim: one scale per token and head, applied to score / probability
columns), 3 blockwise G < head_dim (elementwise dequantization of the tile). e8m0 scales are
read as uint8 and decoded as 2^(byte - 127) (255 is NaN).

`qk_tile` / `pv_tile` (one K / V tile of the online softmax) take an operand's run-time
arguments as one tuple, `kv = (base, stride_r, head_off, lut, stride_lut, row_base,
page_stride, scales, stride_sr, s_head_off)`, which the kernels build once a program.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .._triton_interpreter import install_interpreter_shim

install_interpreter_shim()

# quantization codes
Q_NONE, Q_TENSOR, Q_TOKEN, Q_BLOCK = 0, 1, 2, 3


@triton.jit
def e8m0_to_f32(byte):
    """uint8 e8m0 exponent -> float32 2^(byte - 127); 255 -> NaN, 0 -> 2^-127."""
    bi = byte.to(tl.int32)
    f = (bi << 23).to(tl.float32, bitcast=True)
    f = tl.where(bi == 0, (bi * 0 + 0x00400000).to(tl.float32, bitcast=True), f)
    return tl.where(bi == 255, (bi * 0 + 0x7FC00000).to(tl.float32, bitcast=True), f)


@triton.jit
def find_request(offsets, batch, idx, BLOCK_B: tl.constexpr):
    """Request b with offsets[b] <= idx < offsets[b + 1] (offsets: [batch + 1] int32 prefix
    sums): the number of requests that end at or before idx. One vector load per chunk."""
    cnt = tl.full((), 0, tl.int32)
    for c in range(0, batch, BLOCK_B):
        o = c + tl.arange(0, BLOCK_B)
        ends = tl.load(offsets + 1 + o, mask=o < batch, other=2147483647)
        cnt += tl.sum((ends <= idx).to(tl.int32), 0)
    return cnt


@triton.jit
def row_request(offsets, batch, row, BLOCK_B: tl.constexpr, PAST_END: tl.constexpr):
    """(request b, offsets[b], offsets[b + 1]) of ragged row `row`: one row per request is the
    fast path (no search), else `find_request`. PAST_END: `row` may lie at or past
    offsets[batch] (b == batch), whose offsets[b + 1] is then not read (-1: no request holds
    the row); else every row lies in a request."""
    in_rng = row < batch
    o_lo = tl.load(offsets + row, mask=in_rng, other=-1)
    o_hi = tl.load(offsets + row + 1, mask=in_rng, other=-1)
    b = row
    if (o_lo != row) | (o_hi != row + 1):
        b = find_request(offsets, batch, row, BLOCK_B)
        o_lo = tl.load(offsets + b)
        if PAST_END:
            o_hi = tl.load(offsets + b + 1, mask=b < batch, other=-1)
        else:
            o_hi = tl.load(offsets + b + 1)
    return b, o_lo, o_hi


@triton.jit
def visible_range(pos, kv_len, MASK: tl.constexpr, W):
    """Keys [lo, hi) visible to a query at absolute position `pos` (scalar or vector) among
    kv_len keys, for mask codes 0-4 (the tensor mask, 5, starts from the null range)."""
    zero = pos * 0
    if MASK == 1:  # causal
        lo = zero
        hi = tl.minimum(pos + 1, kv_len)
    elif MASK == 2:  # sliding window, causal
        lo = tl.maximum(pos - W + 1, 0)
        hi = tl.minimum(pos + 1, kv_len)
    elif MASK == 3:  # sliding window, non-causal
        lo = tl.maximum(pos - W + 1, 0)
        hi = tl.minimum(pos + W, kv_len)
    elif MASK == 4:  # chunked causal
        lo = (pos // W) * W
        hi = tl.minimum(pos + 1, kv_len)
    else:  # null / tensor
        lo = zero
        hi = zero + kv_len
    return lo, hi


@triton.jit
def token_rows(tok, valid, b, lut, stride_lut, row_base, page_stride, PAGE: tl.constexpr):
    """int64 physical rows of tokens `tok` of request b (row_base: row_offsets[b], not paged)."""
    if PAGE > 0:
        page = tl.load(lut + b * stride_lut + tok // PAGE, mask=valid, other=0)
        rows = page.to(tl.int64) * page_stride + (tok % PAGE)
    else:
        rows = row_base + tok
    return rows


@triton.jit
def tile_row0(t0, b, lut, stride_lut, row_base, page_stride, PAGE: tl.constexpr):
    """int32 physical row of token t0 (a tile that stays inside one page, for TMA)."""
    if PAGE > 0:
        page = tl.load(lut + b * stride_lut + t0 // PAGE)
        row0 = page * page_stride + (t0 % PAGE)
    else:
        row0 = (row_base + t0).to(tl.int32)
    return row0


@triton.jit
def load_tile(
    base,
    desc_col,
    rows,
    row0,
    stride_r,
    head_off,
    valid,
    offs_d,
    D: tl.constexpr,
    DP: tl.constexpr,
    TMA: tl.constexpr,
):
    """[BN, DP] tile of one head: pointer gather of `rows` (masked, zero fill), or a TMA box at
    (row0, desc_col) of the 2-D `[rows, heads * D]` descriptor `base` (unmasked)."""
    if TMA:
        x = base.load([row0, desc_col])
    else:
        ptrs = base + (rows * stride_r + head_off)[:, None] + offs_d[None, :]
        if D == DP:
            m = valid[:, None]
        else:
            m = valid[:, None] & (offs_d[None, :] < D)
        x = tl.load(ptrs, mask=m, other=0.0)
    return x


@triton.jit
def scales_at(S, off, valid, E8M0: tl.constexpr, MASKED: tl.constexpr):
    """[BN] float32 per-token scales at element offsets `off` of S (0 where not valid when
    MASKED; unmasked loads must only see readable offsets)."""
    if E8M0:
        # One-byte scales: read the 4-byte-aligned 32-bit word that holds each byte (4-byte
        # loads are pipelined with cp.async, 1-byte loads are not) and extract it. The view may
        # start at any byte, so align on the absolute address. The word never leaves the
        # allocation (device allocations are at least 4-byte granular).
        mis = S.to(tl.int64) & 3
        base = (S - mis).to(tl.pointer_type(tl.int32), bitcast=True)
        boff = off + mis
        if MASKED:
            word = tl.load(base + (boff >> 2), mask=valid, other=0)
        else:
            word = tl.load(base + (boff >> 2))
        byte = (word >> ((boff & 3) * 8).to(tl.int32)) & 0xFF
        s = e8m0_to_f32(byte)
        if MASKED:
            s = tl.where(valid, s, 0.0)
    else:
        if MASKED:
            s = tl.load(S + off, mask=valid, other=0)
        else:
            s = tl.load(S + off)
    return s


@triton.jit
def token_scales(S, rows, stride_sr, s_head_off, valid, E8M0: tl.constexpr):
    """[BN] float32 per-token scales of physical rows `rows` (0 where not valid)."""
    return scales_at(S, rows * stride_sr + s_head_off, valid, E8M0, True)


@triton.jit
def kv_operand(
    x,
    S,
    rows,
    stride_sr,
    s_head_off,
    valid,
    offs_d,
    QUANT: tl.constexpr,
    G: tl.constexpr,
    D: tl.constexpr,
    E8M0: tl.constexpr,
    LO: tl.constexpr,
    dtype: tl.constexpr,
):
    """A loaded K/V tile as dot operands (hi, lo) of `dtype`.

    FP8 -> dtype is exact; per-token / per-tensor scales are applied by the caller. Blockwise
    (G < D) tiles are dequantized here, element d scaled by scales[row, head, d // G]; with
    float32 scales the product needs more bits than bf16 has, so LO also returns the rounding
    remainder (hi + lo carries ~16 bits; lo is hi itself and unused when LO is False)."""
    if QUANT == 3:
        BN: tl.constexpr = x.shape[0]
        DP: tl.constexpr = x.shape[1]
        NGP: tl.constexpr = DP // G
        if (G & (G - 1)) == 0 and NGP * G == DP:
            # [BN, D // G] scales, broadcast over their G elements by a reshape (no gather)
            offs_g = tl.arange(0, NGP)
            s = tl.load(
                S + (rows * stride_sr + s_head_off)[:, None] + offs_g[None, :],
                mask=valid[:, None] & (offs_g[None, :] < D // G),
                other=0,
            )
            if E8M0:
                s = e8m0_to_f32(s)
            f = tl.reshape(tl.reshape(x.to(tl.float32), [BN, NGP, G]) * s[:, :, None], [BN, DP])
        else:  # G not a power of two: gather the scale of each element
            m = valid[:, None] & (offs_d[None, :] < D)
            s = tl.load(
                S + (rows * stride_sr + s_head_off)[:, None] + (offs_d // G)[None, :],
                mask=m,
                other=0,
            )
            if E8M0:
                s = e8m0_to_f32(s)
            f = x.to(tl.float32) * s
        hi = f.to(dtype)
        if LO:
            lo = (f - hi.to(tl.float32)).to(dtype)
        else:
            lo = hi
    else:
        hi = x.to(dtype)
        lo = hi
    return hi, lo


@triton.jit
def q_to_f16(q, qk_scale):
    """q -> float16 for FP8 K/V (whose e4m3 values are exact in fp16, upcast by one native
    cvt per pair). q is scaled by 2^-e (exact) so that max|q| < 2^15 fits fp16; returns
    (q16, qk_scale * 2^e). The maximum is over finite elements: an inf (or NaN) in one query
    row stays in that row (it must not scale the other rows of the tile down to 0)."""
    qf = q.to(tl.float32)
    qa = tl.abs(qf)
    qmax = tl.max(tl.max(tl.where(qa < float("inf"), qa, 0.0), 1), 0)
    e = tl.minimum(tl.maximum(tl.ceil(tl.log2(qmax)) - 14.0, 0.0), 120.0).to(tl.int32)
    down = ((127 - e) << 23).to(tl.float32, bitcast=True)
    up = ((127 + e) << 23).to(tl.float32, bitcast=True)
    return (qf * down).to(tl.float16), qk_scale * up


@triton.jit
def pv_dot(p, v, acc, dtype: tl.constexpr, DOT_PREC: tl.constexpr, P_SPLIT: tl.constexpr):
    """acc + p @ v with p [M, BN] f32 and v [BN, D] in dtype. P_SPLIT rounds p to dtype as a
    hi + lo pair (two MMAs) so that p keeps ~16 mantissa bits instead of 8: free when the
    kernel is memory-bound (decode), and it removes the main error term of bf16 attention."""
    p_hi = p.to(dtype)
    acc = tl.dot(p_hi, v, acc, input_precision=DOT_PREC)
    if P_SPLIT:
        p_lo = (p - p_hi.to(tl.float32)).to(dtype)
        acc = tl.dot(p_lo, v, acc, input_precision=DOT_PREC)
    return acc


@triton.jit
def kv_bases(K_off, V_off, b, K_PAGE: tl.constexpr, V_PAGE: tl.constexpr):
    """int64 first rows of request b in K and V (row-offset operands; 0 for paged ones)."""
    k_base = tl.full((), 0, tl.int64)
    v_base = tl.full((), 0, tl.int64)
    if K_PAGE == 0:
        k_base = tl.load(K_off + b).to(tl.int64)
    if V_PAGE == 0:
        v_base = tl.load(V_off + b).to(tl.int64)
    return k_base, v_base


@triton.jit
def qk_tile(
    q,
    t0,
    tok,
    valid,
    b,
    hkv,
    kv,
    offs_d,
    D: tl.constexpr,
    DP: tl.constexpr,
    PAGE: tl.constexpr,
    QUANT: tl.constexpr,
    G: tl.constexpr,
    E8M0: tl.constexpr,
    TMA: tl.constexpr,
    LO: tl.constexpr,
    DOT_PREC: tl.constexpr,
    dtype: tl.constexpr,
):
    """Raw scores q @ K^T of the K tile of tokens `tok` (t0 the first) of request b, KV head
    hkv, per-token K scales applied; and the tile's physical rows (krows, row0 for TMA)."""
    K, stride_r, head, lut, stride_lut, base, page_stride, S, stride_sr, s_head = kv
    krows = token_rows(tok, valid, b, lut, stride_lut, base, page_stride, PAGE)
    k_row0 = 0
    if TMA:
        k_row0 = tile_row0(t0, b, lut, stride_lut, base, page_stride, PAGE)
    k = load_tile(K, hkv * D, krows, k_row0, stride_r, head, valid, offs_d, D, DP, TMA)
    k, k_lo = kv_operand(k, S, krows, stride_sr, s_head, valid, offs_d, QUANT, G, D, E8M0, LO,
                         dtype)  # fmt: skip
    s = tl.dot(q, tl.trans(k), input_precision=DOT_PREC)
    if LO:
        s = tl.dot(q, tl.trans(k_lo), s, input_precision=DOT_PREC)
    if QUANT == 2:
        s = s * token_scales(S, krows, stride_sr, s_head, valid, E8M0)[None, :]
    return s, krows, k_row0


@triton.jit
def pv_tile(
    acc,
    p,
    alpha,
    t0,
    tok,
    valid,
    b,
    hkv,
    krows,
    k_row0,
    kv,
    offs_d,
    D: tl.constexpr,
    DP: tl.constexpr,
    PAGE: tl.constexpr,
    SAME_ROWS: tl.constexpr,
    QUANT: tl.constexpr,
    G: tl.constexpr,
    E8M0: tl.constexpr,
    TMA: tl.constexpr,
    LO: tl.constexpr,
    ZERO_TMA: tl.constexpr,
    DOT_PREC: tl.constexpr,
    P_SPLIT: tl.constexpr,
    dtype: tl.constexpr,
):
    """acc * alpha + p @ V over the V tile of tokens `tok` (SAME_ROWS: K's rows krows / k_row0),
    per-token V scales folded into p. Rows of invalid tokens are zeroed for FP8 and, with
    ZERO_TMA, for TMA boxes (which may hold rows past the valid keys: NaN pools)."""
    V, stride_r, head, lut, stride_lut, base, page_stride, S, stride_sr, s_head = kv
    if SAME_ROWS:
        vrows = krows
        v_row0 = k_row0
    else:
        vrows = token_rows(tok, valid, b, lut, stride_lut, base, page_stride, PAGE)
        v_row0 = 0
        if TMA:
            v_row0 = tile_row0(t0, b, lut, stride_lut, base, page_stride, PAGE)
    v = load_tile(V, hkv * D, vrows, v_row0, stride_r, head, valid, offs_d, D, DP, TMA)
    v, v_lo = kv_operand(v, S, vrows, stride_sr, s_head, valid, offs_d, QUANT, G, D, E8M0, LO,
                         dtype)  # fmt: skip
    if (ZERO_TMA and TMA) or QUANT != 0:
        # For FP8 the select also makes the compiler upcast V in registers with wide
        # shared-memory reads (then ldmatrix.trans), instead of one byte-wide read per element.
        v = tl.where(valid[:, None], v, 0.0)
    if QUANT == 2:
        p = p * token_scales(S, vrows, stride_sr, s_head, valid, E8M0)[None, :]
    acc = acc * alpha[:, None]
    acc = pv_dot(p, v, acc, dtype, DOT_PREC, P_SPLIT)
    if LO:
        acc = tl.dot(p.to(dtype), v_lo, acc, input_precision=DOT_PREC)
    return acc
