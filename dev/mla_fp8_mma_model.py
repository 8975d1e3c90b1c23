"""CPU model: the rope-aware FP8 MLA's latent S product as an e4m3 x e4m3 wgmma (the keys read
straight from the stage; q split exactly into two e4m3 parts, hi + lo / 16, as 2 x h_q
columns) under Hopper's reported FP8 accumulator, against float64.

The accumulator keeps 13 fraction bits and truncates (reported, not measured here). Two models
of where it cuts: "result" (each k32 step's exact sum, then truncated) and "align" (every term
of a step cut to the grid of its largest one's exponent, then summed). Keys and queries are
`tests/test_triton_mla.py`'s (`build_cache`, `make_q`; rise: `rising_q`'s climbing scores).
Prints, per case, the largest errors of S, the LSE and O, the cosine difference and how many
output elements fail the tests' bound (abs 3e-2 or rel 2/128); the tests allow an LSE error of
2e-3.

    python bench/mla_fp8_mma_model.py
"""

from __future__ import annotations

import math

import torch

E4M3 = torch.float8_e4m3fn
FRAC_BITS = 13  # the accumulator's fraction bits


def e4m3(x: torch.Tensor) -> torch.Tensor:
    """x rounded to e4m3 (float64 values)."""
    return x.to(torch.float32).to(E4M3).to(torch.float64)


def cut(v: torch.Tensor, grid_exp: torch.Tensor) -> torch.Tensor:
    """v truncated toward zero to a multiple of 2^(grid_exp - FRAC_BITS)."""
    g = torch.pow(2.0, grid_exp - FRAC_BITS)
    return torch.sign(v) * torch.floor(v.abs() / g) * g


def exponent(v: torch.Tensor) -> torch.Tensor:
    a = v.abs()
    return torch.floor(torch.log2(torch.where(a > 0, a, torch.ones_like(a))))


def mma_chain(k: torch.Tensor, qp: torch.Tensor, model: str) -> torch.Tensor:
    """k [N, 512] and qp [C, 512] e4m3 values -> [N, C] through 16 k32 steps."""
    acc = torch.zeros(k.shape[0], qp.shape[0], dtype=torch.float64)
    for s in range(16):
        prods = k[:, None, 32 * s : 32 * s + 32] * qp[None, :, 32 * s : 32 * s + 32]  # exact
        if model == "result":
            total = acc + prods.sum(-1)
            acc = cut(total, exponent(total))
        else:
            terms = torch.cat([acc[..., None], prods], -1)
            acc = cut(terms, exponent(terms.abs().amax(-1, keepdim=True))).sum(-1)
    return acc


def case(n_keys: int, h_q: int, rise: float, model: str, gen: torch.Generator) -> dict:
    x = torch.randn(n_keys, 576, generator=gen)
    x = (x * torch.exp(torch.randn(n_keys, 1, generator=gen) * 0.3)).clamp(-5.5, 5.5)
    q = torch.randn(h_q, 576, generator=gen) * 2
    if rise:
        x[:, :8] = rise * torch.arange(n_keys)[:, None] / n_keys
        q[:, :8] = torch.where(torch.arange(h_q) % 2 == 0, 20.0, -20.0)[:, None]
    x, q = x.to(torch.bfloat16).double(), q.to(torch.bfloat16).double()
    lat, rope = x[:, :512], x[:, 512:]
    s_tok = (lat.abs().amax(1) / 448).float().double()  # per-token scale
    k8 = e4m3(lat / s_tok[:, None])
    keys = torch.cat([k8 * s_tok[:, None], rope], 1)  # what the cache holds, dequantized
    scale = 1 / math.sqrt(576)
    s_ref = keys @ q.T * scale
    a = torch.pow(2.0, 8 - torch.ceil(torch.log2(q[:, :512].abs().amax(1))))  # max |q a| <= 256
    xq = q[:, :512] * a[:, None]
    hi = e4m3(xq)
    lo = e4m3((xq - hi) * 16)  # bf16's other 4 significant bits: exact
    acc = mma_chain(k8, torch.cat([hi, lo]), model)
    lat_s = (acc[:, :h_q] + acc[:, h_q:] / 16) / a[None, :] * s_tok[:, None]
    s = (lat_s + rope @ q[:, 512:].T) * scale
    o_ref = torch.softmax(s_ref, 0).T @ keys[:, :512]
    o = torch.softmax(s, 0).T @ keys[:, :512]
    err = (o - o_ref).abs()
    ok = (err < 3e-2) | (err / o_ref.abs().clamp_min(1e-30) < 2 / 128)
    return dict(
        s_max=s_ref.abs().max().item(),
        s_err=(s - s_ref).abs().max().item(),
        lse_err=(torch.logsumexp(s, 0) - torch.logsumexp(s_ref, 0)).abs().max().item(),
        o_err=err.max().item(),
        cos=(1 - 2 * (o * o_ref).sum() / (o * o + o_ref * o_ref).sum()).item(),
        failing=int((~ok).sum()),
    )


def main() -> None:
    gen = torch.Generator().manual_seed(0)
    for model in ("result", "align"):
        for n, rise in ((700, 0.0), (4096, 0.0), (2048, 5.5), (4097, 5.5)):
            r = case(n, 16, rise, model, gen)
            print(model, f"keys {n} rise {rise}:", {k: f"{v:.3g}" for k, v in r.items()})


if __name__ == "__main__":
    main()
