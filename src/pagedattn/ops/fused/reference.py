"""The fused layer ops in plain torch: the math of transformers' modules, op for op (so a
model on the CPU gives transformers' logits bit for bit). `pagedattn.ops.fused` documents
the contracts."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def rms_norm_reference(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    weight_first: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """LlamaRMSNorm (weight_first False: `weight * normed.to(dtype)`) or GptOssRMSNorm
    (`(weight * normed).to(dtype)`), after `residual + x` when a residual is given."""
    if residual is not None:
        x = residual + x
    dt = x.dtype
    h = x.to(torch.float32)
    h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps)
    out = (weight * h).to(dt) if weight_first else weight * h.to(dt)
    return out if residual is None else (out, x)


def apply_rope_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Neox-style (rotate-half) RoPE of x [T, heads, d] with cos/sin [T, d // 2]."""
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def rope_qkv_reference(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    h_q: int,
    h_kv: int,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Split a fused q|k|v projection [T, (h_q + 2 h_kv) d] into heads, RMSNorm q and k per
    head (Qwen3) when their weights are given, RoPE q and k; v made contiguous."""
    T = qkv.shape[0]
    d = qkv.shape[1] // (h_q + 2 * h_kv)
    q, k, v = qkv.split([h_q * d, h_kv * d, h_kv * d], dim=-1)
    q, k = q.reshape(T, h_q, d), k.reshape(T, h_kv, d)
    v = v.reshape(T, h_kv, d).contiguous()
    if q_norm is not None:
        q, k = rms_norm_reference(q, q_norm, eps), rms_norm_reference(k, k_norm, eps)
    return apply_rope_reference(q, cos, sin), apply_rope_reference(k, cos, sin), v


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up of a fused gate|up projection [T, 2 I] (LlamaMLP's act_fn(gate) * up)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def argmax_rows_reference(x: torch.Tensor) -> torch.Tensor:
    """`x.argmax(dim=-1)` of x [n, V]: [n] int64 (the first of equal maxima; a row with a NaN
    gives its first NaN)."""
    return x.argmax(dim=-1)


_M32 = 0xFFFFFFFF


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for x in [0, 2**32) held in int64, without int64 overflow."""
    lo, hi = c & 0xFFFF, c >> 16
    return (x * lo + (((x * hi) & 0xFFFF) << 16)) & _M32


def _fmix32(x: torch.Tensor) -> torch.Tensor:
    """murmur3's 32-bit finalizer (a bijection of [0, 2**32) with full avalanche)."""
    x = x ^ (x >> 16)
    x = _mul32(x, 0x85EBCA6B)
    x = x ^ (x >> 13)
    x = _mul32(x, 0xC2B2AE35)
    return x ^ (x >> 16)


def uniform_noise(seeds: torch.Tensor, counters: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, vocab] float32 uniforms in (0, 1), a pure function of (seed, counter, column).

    seeds [n] int64 (any value; its 64 bits are used), counters [n] int64 in [0, 2**32).
    Each value is one of 2**23 midpoints (m + 0.5) / 2**23: never 0 or 1.
    """
    lo = seeds & _M32
    hi = (seeds >> 32) & _M32
    key = _fmix32(lo ^ 0x9E3779B9)
    key = _fmix32(key ^ hi)
    key = _fmix32(key ^ _fmix32((counters & _M32) ^ 0x7F4A7C15))
    cols = _fmix32(torch.arange(vocab, dtype=torch.int64, device=seeds.device))
    bits = _fmix32(_fmix32(key[:, None] ^ cols[None, :]) ^ 0x165667B1)
    return ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def gumbel_noise(seeds: torch.Tensor, counters: torch.Tensor, vocab: int) -> torch.Tensor:
    """[n, vocab] float32 Gumbel noise -log(-log(u)) of `uniform_noise`'s u."""
    return -torch.log(-torch.log(uniform_noise(seeds, counters, vocab)))


def top_k_top_p_keep(
    s: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    *,
    margins: bool = False,
) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """bool [n, V]: the tokens top-k and then top-p keep of the scaled logits s [n, V] float32
    (`ops.fused` module docstring, by value: ties at a boundary are kept together).

    top_k [n] int64: keep j iff fewer than k tokens have s_i > s_j (k <= 0 or k >= V: off).
    top_p [n] float32: among the kept, with e_i = exp(s_i - max s), keep j iff the mass of the
    kept tokens with s_i > s_j is < p times the kept mass (p >= 1 or NaN: off); the largest
    value always stays. A row holding a NaN or +inf keeps every token. In float64.
    margins: also return float64 [n, V], each token's (larger kept mass - p kept mass) / kept
    mass where top-p is on (its distance from the boundary, for tests of float32 paths), inf
    elsewhere."""
    n, V = s.shape
    d = s.double()
    bad = (d.isnan() | (d == float("inf"))).any(-1, keepdim=True)
    d = d.nan_to_num(nan=float("-inf"))
    asc = d.sort(-1).values
    le = torch.searchsorted(asc, d, right=True)  # tokens with s_i <= s_j
    keep = torch.ones_like(d, dtype=torch.bool)
    if top_k is not None:
        k = top_k[:, None]
        keep &= ~((k > 0) & (k < V)) | (V - le < k)
    if top_p is not None:
        p = top_p.double()[:, None]
        m = asc[:, -1:]
        kept_asc = torch.ones_like(asc, dtype=torch.bool)
        if top_k is not None:
            kept_asc = ~((k > 0) & (k < V)) | (V - torch.searchsorted(asc, asc, right=True) < k)
        e_asc = torch.where(kept_asc, torch.exp(asc - m), 0.0)
        csum = e_asc.cumsum(-1)
        total = csum[:, -1:]
        below = torch.where(le > 0, csum.gather(-1, (le - 1).clamp(min=0)), 0.0)
        greater = total - below  # the kept mass of the tokens with s_i > s_j
        keep &= ~(p < 1) | (greater < p * total) | (d == m)
        margin = torch.where((p < 1) & ~bad, (greater - p * total) / total, float("inf"))
    else:
        margin = torch.full_like(d, float("inf"))
    keep |= bad
    return (keep, margin) if margins else keep


def sample_rows_reference(
    x: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    counters: torch.Tensor,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
) -> torch.Tensor:
    """[n] int64: row i's argmax of x[i] / t_i + g_i (float32; g `gumbel_noise` of the row's
    seed and counter) over the tokens `top_k_top_p_keep` keeps of x[i] / t_i, where t_i > 0;
    else of x[i] (`argmax_rows_reference`'s rules)."""
    t = temperature
    greedy = x.argmax(dim=-1)
    scaled = x.to(torch.float32) / torch.where(t > 0, t, 1.0)[:, None]
    scores = scaled + gumbel_noise(seeds, counters, x.shape[-1])
    if top_k is not None or top_p is not None:
        scores = scores.masked_fill(~top_k_top_p_keep(scaled, top_k, top_p), float("-inf"))
    return torch.where(t > 0, scores.argmax(dim=-1), greedy)
