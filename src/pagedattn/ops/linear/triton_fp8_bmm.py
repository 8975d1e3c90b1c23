"""Triton blockwise-FP8 batched matmul (same contract as `reference.fp8_bmm_reference`).

out[b, m, n] = sum_g (sum_{k in group g} x_q[b, m, k] * w[b, n, k]) * sx[b, m, g] * sw[b, n // n_gran, g]

- Activations x [batch, m, k] (bf16/fp16/f32, any strides) are quantized in 1 x k_gran
  groups with correctly rounded divisions (`div_rn`), so x_q and sx are bit-identical to
  `quantize_activation_groups` on the CPU: scale = amax / 448, x_q = e4m3(x / scale).
  (PyTorch on CUDA divides by a Python scalar as a multiplication by its reciprocal, so the
  reference run on a GPU rounds some ties the other way; see the tests.) Below m = 64 the
  quantization is fused into the GEMM's load path: a program loads its x tile of one k
  group, takes the row amax and rounds the tile in registers (programs of other n tiles
  repeat that elementwise work). From m = 64 a one-pass quantization kernel runs first and
  the GEMM reads e4m3 x. `fp8_bmm_config` picks the tiles (docs/kernels/fp8_bmm.md).
- Weights w [batch, n, k] e4m3 (k contiguous) and their block scales w_scale
  [batch, ceil(n/n_gran), ceil(k/k_gran)] in float32 or e8m0 (read as bytes).
- Each k group is one fp8 tensor-core dot (`tl.dot` on float8e4nv, fp32 accumulator; wgmma
  on sm_90), scaled by sx (rows) and sw (columns) and added to an fp32 accumulator in
  registers: DeepSeek's "promote every 128 k" scheme, so the tensor core's reduced-precision
  fp8 accumulation never spans more than one group.
- Small m (decode: m = tokens) swaps the operands (out^T = w @ x_q^T) so that n fills the
  tensor core's 64-row M dimension and the few tokens sit in its narrow N dimension.
- `out=` takes any strided [batch, m, n] view (e.g. the first kv_lora_rank columns of the MLA
  branch's concatenated query, transposed to [h_q, tokens, rank]).

Any k_gran >= 1 and n_gran >= 1 work (partial last blocks too): a k group is covered by
ceil(k_gran / BLOCK_K) chunks whose columns past the group end are masked. NaN in an
activation group makes that group's scale NaN (as `torch.amax` does in the reference).
No host synchronisation; the output is the only allocation (when `out` is None).
"""

from __future__ import annotations

import dataclasses
import functools

import torch
import triton
import triton.language as tl

from ...errors import Lazy, check
from ...fp8 import blockwise
from .._checks import check_granularities, describe
from .._triton_interpreter import install_interpreter_shim
from ..launch import launch
from .checks import X_DTYPES, check_fp8_bmm_args

install_interpreter_shim()

FP8_MAX = tl.constexpr(blockwise.FP8_MAX)  # 448.0, the largest finite e4m3fn
SCALE_FLOOR = tl.constexpr(blockwise.SCALE_FLOOR)  # 2^-126


# ------------------------------------------------------------------------------------------
# Device helpers
# ------------------------------------------------------------------------------------------
@triton.jit
def _e8m0_bytes_to_f32(byte):
    """uint8 e8m0 -> float32 2^(byte - 127); 0 -> 2^-127 (subnormal), 255 -> NaN."""
    bi = byte.to(tl.int32)
    f = (bi << 23).to(tl.float32, bitcast=True)
    f = tl.where(bi == 0, (bi * 0 + 0x00400000).to(tl.float32, bitcast=True), f)
    return tl.where(bi == 255, (bi * 0 + 0x7FC00000).to(tl.float32, bitcast=True), f)


@triton.jit
def _group_scale(amax, has_nan):
    """Activation scale of a group: max(amax / 448, 2^-126), NaN when the group has a NaN."""
    s = tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))
    s = tl.maximum(s, SCALE_FLOOR)
    return tl.where(has_nan, float("nan"), s)


@triton.jit
def saturate_e4m3(q):
    """Clamp to +-448 keeping NaN, then round to e4m3. Written with `tl.where` rather than
    `tl.clamp(..., propagate_nan=ALL)`, whose PTX `min.NaN`/`max.NaN` next to fp8 stores can
    trip a Triton store miscompile (triton-lang/triton#11111, a precaution)."""
    c = tl.minimum(tl.maximum(q, -FP8_MAX), FP8_MAX)
    return tl.where(q != q, q, c).to(tl.float8e4nv)


@triton.jit
def _quantize_groups_kernel(
    X,
    s_xb,
    s_xm,
    s_xk,
    XQ,
    SX,
    M,
    K,
    NUM_GROUPS,
    K_GRAN: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_G: tl.constexpr,
):
    """Pre-pass: x [batch, M, K] -> x_q [batch, M, K] e4m3 (contiguous) and sx
    [batch, M, NUM_GROUPS] f32, one program per (BLOCK_R rows, group)."""
    pid_r = tl.program_id(0)
    g = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_r = pid_r * BLOCK_R + tl.arange(0, BLOCK_R)
    offs_k = g * K_GRAN + tl.arange(0, BLOCK_G)
    mk = (tl.arange(0, BLOCK_G) < K_GRAN) & (offs_k < K)
    m = (offs_r[:, None] < M) & mk[None, :]
    x = tl.load(X + b * s_xb + offs_r[:, None] * s_xm + offs_k[None, :] * s_xk, mask=m, other=0.0)
    x = x.to(tl.float32)
    has_nan = tl.max((x != x).to(tl.int32), 1) > 0
    s = _group_scale(tl.max(tl.abs(x), 1), has_nan)
    xq = saturate_e4m3(tl.math.div_rn(x, s[:, None]))
    tl.store(XQ + (b * M + offs_r[:, None]) * K + offs_k[None, :], xq, mask=m)
    tl.store(SX + (b * M + offs_r) * NUM_GROUPS + g, s, mask=offs_r < M)


@triton.jit
def _x_tile(X, b, offs_m, offs_k, mx, s_xb, s_xm, s_xk, M, K, X_FP8: tl.constexpr, T: tl.constexpr):
    """x at rows offs_m, columns offs_k: [BLOCK_M, BLOCK_K], or [BLOCK_K, BLOCK_M] when T
    (the operands-swapped layout, loaded transposed rather than `tl.trans`-ed in registers).
    X_FP8: the pre-quantized contiguous e4m3 copy; else x itself as float32."""
    if X_FP8:
        if T:
            ptrs = X + (b * M + offs_m[None, :]) * K + offs_k[:, None]
        else:
            ptrs = X + (b * M + offs_m[:, None]) * K + offs_k[None, :]
        return tl.load(ptrs, mask=mx, other=0.0)
    else:
        if T:
            ptrs = X + b * s_xb + offs_m[None, :] * s_xm + offs_k[:, None] * s_xk
        else:
            ptrs = X + b * s_xb + offs_m[:, None] * s_xm + offs_k[None, :] * s_xk
        return tl.load(ptrs, mask=mx, other=0.0).to(tl.float32)


@triton.jit
def _group_dot(
    g,
    X,
    s_xb,
    s_xm,
    s_xk,
    SX,
    W,
    s_wb,
    s_wn,
    s_wk,
    b,
    offs_m,
    offs_n,
    mm,
    mn,
    M,
    K,
    NUM_GROUPS,
    K_GRAN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CHUNKS: tl.constexpr,
    EVEN_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    X_FP8: tl.constexpr,
):
    """k group g: (unscaled fp8 dot partial, [BLOCK_N, BLOCK_M] if SWAP_AB else
    [BLOCK_M, BLOCK_N], f32; activation scales sx [BLOCK_M]).

    Both dot operands are loaded K-major as the fp8 wgmma needs them, x transposed in the
    swapped layout (out^T = w @ x_q^T) and w transposed otherwise, so no fp8 tile is
    transposed in registers."""
    ar_k = tl.arange(0, BLOCK_K)
    k0 = g * K_GRAN
    k_end = tl.minimum(k0 + K_GRAN, K)
    RED: tl.constexpr = 0 if SWAP_AB else 1  # the k axis of the x tile
    if SWAP_AB:
        part = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    else:
        part = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if X_FP8:
        sx = tl.load(SX + (b * M + offs_m) * NUM_GROUPS + g, mask=mm, other=1.0)
    elif CHUNKS > 1:  # large groups: a first pass over the group's chunks for its amax
        amax = tl.zeros((BLOCK_M,), dtype=tl.float32)
        nan = tl.zeros((BLOCK_M,), dtype=tl.int32)
        for c in range(0, CHUNKS):
            offs_k = k0 + c * BLOCK_K + ar_k
            mk = offs_k < k_end
            if SWAP_AB:
                mx = mk[:, None] & mm[None, :]
            else:
                mx = mm[:, None] & mk[None, :]
            xc = _x_tile(X, b, offs_m, offs_k, mx, s_xb, s_xm, s_xk, M, K, False, SWAP_AB)
            amax = tl.maximum(amax, tl.max(tl.abs(xc), RED))
            nan = tl.maximum(nan, tl.max((xc != xc).to(tl.int32), RED))
        sx = _group_scale(amax, nan > 0)
    for c in tl.static_range(CHUNKS):
        offs_k = k0 + c * BLOCK_K + ar_k
        mk = offs_k < k_end
        if EVEN_K:
            mk = ar_k >= 0
        if SWAP_AB:
            mx = mk[:, None] & mm[None, :]
            w = tl.load(
                W + b * s_wb + offs_n[:, None] * s_wn + offs_k[None, :] * s_wk,
                mask=mn[:, None] & mk[None, :],
                other=0.0,
            )
        else:
            mx = mm[:, None] & mk[None, :]
            w = tl.load(
                W + b * s_wb + offs_n[None, :] * s_wn + offs_k[:, None] * s_wk,
                mask=mk[:, None] & mn[None, :],
                other=0.0,
            )
        xc = _x_tile(X, b, offs_m, offs_k, mx, s_xb, s_xm, s_xk, M, K, X_FP8, SWAP_AB)
        if X_FP8:
            xq = xc
        else:
            if CHUNKS == 1:  # one load gives the group's scale and its values
                has_nan = tl.max((xc != xc).to(tl.int32), RED) > 0
                sx = _group_scale(tl.max(tl.abs(xc), RED), has_nan)
            if SWAP_AB:
                xq = saturate_e4m3(tl.math.div_rn(xc, sx[None, :]))
            else:
                xq = saturate_e4m3(tl.math.div_rn(xc, sx[:, None]))
        if SWAP_AB:
            part = tl.dot(w, xq, part)
        else:
            part = tl.dot(xq, w, part)
    return part, sx


@triton.jit
def _scaled(part, sx, ws_base, g, s_sk, mn, SWAP_AB: tl.constexpr, WS_E8M0: tl.constexpr):
    """A group's partial times its activation (rows) and weight (columns) scales."""
    if WS_E8M0:
        sw = _e8m0_bytes_to_f32(tl.load(ws_base + g * s_sk, mask=mn, other=127))
    else:
        sw = tl.load(ws_base + g * s_sk, mask=mn, other=1.0)
    if SWAP_AB:
        return part * sw[:, None] * sx[None, :]
    else:
        return part * sx[:, None] * sw[None, :]


@triton.jit(do_not_specialize=["M"])  # m = 1 shares the m <= 16 binary (measured faster)
def _fp8_bmm_kernel(
    X,
    s_xb,
    s_xm,
    s_xk,
    SX,
    W,
    s_wb,
    s_wn,
    s_wk,
    WS,
    s_sb,
    s_sn,
    s_sk,
    Out,
    s_ob,
    s_om,
    s_on,
    M,
    N,
    K,
    NUM_GROUPS,
    K_GRAN: tl.constexpr,
    N_GRAN: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    CHUNKS: tl.constexpr,
    EVEN_K: tl.constexpr,
    SWAP_AB: tl.constexpr,
    X_FP8: tl.constexpr,
    WS_E8M0: tl.constexpr,
    SINGLE_GROUP: tl.constexpr,
    NUM_STAGES: tl.constexpr,
):
    """One program: a BLOCK_M x BLOCK_N tile of out[b]. X_FP8: x is pre-quantized e4m3
    (contiguous) with scales SX [batch, M, NUM_GROUPS]; else x is quantized here.
    SINGLE_GROUP: k fits one group (no loop, no separate accumulator)."""
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    num_n = tl.cdiv(N, BLOCK_N)
    pid_m = pid // num_n
    pid_n = pid % num_n
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mm = offs_m < M
    mn = offs_n < N
    ws_base = WS + b * s_sb + (offs_n // N_GRAN) * s_sn
    if SINGLE_GROUP:
        part, sx = _group_dot(
            0, X, s_xb, s_xm, s_xk, SX, W, s_wb, s_wn, s_wk, b, offs_m, offs_n, mm, mn, M, K,
            NUM_GROUPS, K_GRAN, BLOCK_M, BLOCK_N, BLOCK_K, CHUNKS, EVEN_K, SWAP_AB, X_FP8,
        )  # fmt: skip
        acc = _scaled(part, sx, ws_base, 0, s_sk, mn, SWAP_AB, WS_E8M0)
    else:
        if SWAP_AB:
            acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        else:
            acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for g in tl.range(0, NUM_GROUPS, num_stages=NUM_STAGES):
            part, sx = _group_dot(
                g, X, s_xb, s_xm, s_xk, SX, W, s_wb, s_wn, s_wk, b, offs_m, offs_n, mm, mn, M,
                K, NUM_GROUPS, K_GRAN, BLOCK_M, BLOCK_N, BLOCK_K, CHUNKS, EVEN_K, SWAP_AB, X_FP8,
            )  # fmt: skip
            acc += _scaled(part, sx, ws_base, g, s_sk, mn, SWAP_AB, WS_E8M0)
    o_base = Out + b * s_ob
    if SWAP_AB:
        ptrs = o_base + offs_n[:, None] * s_on + offs_m[None, :] * s_om
        tl.store(ptrs, acc.to(Out.dtype.element_ty), mask=mn[:, None] & mm[None, :])
    else:
        ptrs = o_base + offs_m[:, None] * s_om + offs_n[None, :] * s_on
        tl.store(ptrs, acc.to(Out.dtype.element_ty), mask=mm[:, None] & mn[None, :])


# ------------------------------------------------------------------------------------------
# Host side
# ------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Fp8BmmConfig:
    """Launch configuration of `_fp8_bmm_kernel` (chosen by `fp8_bmm_config`; a development run
    passes its own to `fp8_bmm_triton(config=...)`, e.g. `dataclasses.replace` of the chosen one).

    block_m, block_n: the out tile (rows of x, rows of w); block_k: k chunk (<= 128, >= 32 for
    the fp8 MMA); swap_ab: compute out^T = w @ x_q^T (small m); prequant: quantize x in a
    separate pass first; num_warps; num_stages of the k-group loop.
    """

    block_m: int
    block_n: int
    block_k: int
    swap_ab: bool
    prequant: bool
    num_warps: int
    num_stages: int


@functools.lru_cache(maxsize=4096)  # a pure function of four ints, called each launch
def fp8_bmm_config(m: int, n: int, k: int, k_gran: int) -> Fp8BmmConfig:
    """Tile configuration for out [*, m, n] = x [*, m, k] @ w [*, n, k]^T (H200 sweep of
    DeepSeek's w_uk / w_uv at h_q 16 / 128, m 1..1024: docs/kernels/fp8_bmm.md).

    m <= 64 (decode): operands swapped, block_m (tokens, the MMA's N) = next pow2 of m in
    [16, 64], block_n (weight rows, the MMA's M) 128 when n >= 256 else 64; 8 warps while the
    activations are quantized in the kernel, 4 with the pre-pass. Larger m: a 128 x 128 tile
    (64 x 128 when n is small), 8 warps. prequant from m = 64. block_k covers one k group (>= 32
    for the fp8 MMA's k; at most 128, larger groups take several chunks). One k group (w_uk:
    k = qk_nope = 128) leaves nothing to pipeline: one stage, the least shared memory.
    """
    block_k = min(128, max(32, triton.next_power_of_2(min(k_gran, k))))
    n_groups = -(-k // k_gran)
    prequant = m >= 64  # H200: 5-35% faster at m 64-256, slower below (docs/kernels/fp8_bmm.md)
    swap = m <= 64
    if swap:
        bm = min(64, max(16, triton.next_power_of_2(m)))
        bn = 128 if n >= 256 else 64
        warps = 4 if prequant else 8  # H200: 8 warps 8-30% faster than 4 at m < 64
    else:
        bm = 128
        bn = 128 if n >= 128 else 64
        warps = 8
    return Fp8BmmConfig(bm, bn, block_k, swap, prequant, warps, 1 if n_groups == 1 else 3)


def quantize_activation_groups_triton(
    x: torch.Tensor, k_gran: int = 128
) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton `quantize_activation_groups` (float32 scales), bit for bit.

    x: [batch, m, k] bf16/fp16/f32 (any strides) -> (x_q [batch, m, k] e4m3 contiguous,
    scales [batch, m, ceil(k / k_gran)] float32 = max(amax / 448, 2^-126)).
    """
    check(
        isinstance(x, torch.Tensor) and x.ndim == 3 and x.dtype in X_DTYPES,
        "x",
        "a [batch, m, k] bf16/fp16/f32 tensor",
        Lazy(lambda: describe(x)),
    )
    check_granularities(k_gran, 1)
    batch, m, k = x.shape
    n_groups = -(-k // k_gran)
    xq = torch.empty(batch, m, k, dtype=torch.float8_e4m3fn, device=x.device)
    sx = torch.empty(batch, m, n_groups, dtype=torch.float32, device=x.device)
    if xq.numel() == 0:
        return xq, sx
    block_g = triton.next_power_of_2(min(k_gran, k))
    block_r = max(1, min(16, 4096 // block_g))
    launch(
        _quantize_groups_kernel,
        (triton.cdiv(m, block_r), n_groups, batch),
        x,
        *x.stride(),
        xq,
        sx,
        m,
        k,
        n_groups,
        K_GRAN=k_gran,
        BLOCK_R=block_r,
        BLOCK_G=block_g,
        num_warps=4,
    )
    return xq, sx


def fp8_bmm_triton(
    x: torch.Tensor,
    w: torch.Tensor,
    w_scale: torch.Tensor,
    *,
    k_gran: int = 128,
    n_gran: int = 128,
    out_dtype: torch.dtype = torch.bfloat16,
    out: torch.Tensor | None = None,
    prequant: bool | None = None,
    config: Fp8BmmConfig | None = None,
) -> torch.Tensor:
    """Blockwise-FP8 `x @ w^T` per batch (docs/ops.md `fp8_bmm`), Triton.

    x: [batch, m, k] bf16/fp16/f32 (any strides), quantized to e4m3 in 1 x k_gran groups.
    w: [batch, n, k] float8_e4m3fn (copied when its k stride is not 1).
    w_scale: [batch, ceil(n/n_gran), ceil(k/k_gran)] float32 or float8_e8m0fnu.
    out: optional [batch, m, n] tensor of out_dtype, any strides (written in place).
    prequant: quantize x in a separate pass first (True), in the GEMM's load path (False), or
      as the config says (None).
    config: the launch configuration (None: `fp8_bmm_config(m, n, k, k_gran)`).
    Checks its arguments as `fp8_bmm` does. Returns out [batch, m, n] (out_dtype), fp32
    accumulation. No host synchronisation.
    """
    check_fp8_bmm_args(x, w, w_scale, k_gran, n_gran, out_dtype)
    batch, m, k = x.shape
    n = w.shape[1]
    n_groups = -(-k // k_gran)
    if out is None:
        out = torch.empty(batch, m, n, dtype=out_dtype, device=x.device)
    else:
        check(
            isinstance(out, torch.Tensor)
            and out.shape == (batch, m, n)
            and out.dtype == out_dtype
            and out.device == x.device,
            "out",
            Lazy(lambda: f"a {out_dtype} tensor of shape {(batch, m, n)} on {x.device}"),
            Lazy(lambda: describe(out)),
        )
    check(prequant is None or isinstance(prequant, bool), "prequant", "None or a bool", prequant)
    check(
        config is None or isinstance(config, Fp8BmmConfig),
        "config",
        "None or an Fp8BmmConfig",
        type(config).__name__,
    )
    if batch == 0 or m == 0 or n == 0:
        return out
    if k == 0:
        return out.zero_()
    if w.stride(2) != 1:
        w = w.contiguous()
    e8m0 = w_scale.dtype == torch.float8_e8m0fnu
    ws = w_scale.view(torch.uint8) if e8m0 else w_scale
    cfg = fp8_bmm_config(m, n, k, k_gran) if config is None else config
    bk = cfg.block_k
    chunks = -(-min(k_gran, k) // bk)
    even_k = chunks == 1 and k % k_gran == 0 and k_gran == bk
    if prequant is None:
        prequant = cfg.prequant
    if prequant:
        xq, sx = quantize_activation_groups_triton(x, k_gran)
        x_arg, x_strides = xq, xq.stride()
    else:
        x_arg, x_strides, sx = x, x.stride(), ws  # sx unused
    grid = (triton.cdiv(m, cfg.block_m) * triton.cdiv(n, cfg.block_n), batch)
    launch(
        _fp8_bmm_kernel,
        grid,
        x_arg,
        *x_strides,
        sx,
        w,
        *w.stride(),
        ws,
        *ws.stride(),
        out,
        *out.stride(),
        m,
        n,
        k,
        n_groups,
        K_GRAN=k_gran,
        N_GRAN=n_gran,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_K=bk,
        CHUNKS=chunks,
        EVEN_K=even_k,
        SWAP_AB=cfg.swap_ab,
        X_FP8=prequant,
        WS_E8M0=e8m0,
        SINGLE_GROUP=n_groups == 1,
        NUM_STAGES=cfg.num_stages,
        num_warps=cfg.num_warps,
    )
    return out


__all__ = [
    "Fp8BmmConfig",
    "fp8_bmm_config",
    "fp8_bmm_triton",
    "quantize_activation_groups_triton",
    "saturate_e4m3",
]
