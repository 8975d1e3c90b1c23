"""Test utilities shared by the test suite, the benchmarks and the demo (no pytest dependency).

Layer 4 (integration; `pagedattn/__init__.py`): it builds caches (layer 1), and nothing in the
layers below may depend on test utilities.

- `assert_close`: DESIGN.md section 5's rule. An element passes when its absolute error is
  under abs_tol OR its relative error is under rel_tol; NaN/inf positions must match; the
  cosine difference 1 - 2*sum(a*b)/sum(a*a + b*b) must stay under cos_tol.
- `make_paged_cache`: a random paged cache with shuffled non-contiguous pages, sentinel ids in
  unused lookup-table columns and NaN in every slot no valid (request, position) points to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .cache.buffers import allocate_buffers
from .cache.inputs import KVCacheInputsPerDevice
from .cache.params import KVCacheParams

# FlashMLA's own bounds for bf16 outputs (DESIGN.md section 5).
BF16_TOL = dict(abs_tol=8e-4, rel_tol=2 / 128, cos_tol=5e-6)


def cos_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().flatten(), b.double().flatten()
    fin = torch.isfinite(a) & torch.isfinite(b)
    a, b = a[fin], b[fin]
    den = (a * a + b * b).sum()
    if den == 0:
        return 0.0
    return float(1 - 2 * (a * b).sum() / den)


def element_errors(o: torch.Tensor, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(absolute, relative) errors of `o` against reference `r` (float64, same shape) at the
    elements where r is finite, flattened."""
    fin = torch.isfinite(r)
    err = (o - r).abs()[fin]
    return err, err / r.abs()[fin].clamp_min(1e-30)


def assert_close(
    out: torch.Tensor,
    ref: torch.Tensor,
    abs_tol: float = 8e-4,
    rel_tol: float = 2 / 128,
    cos_tol: float = 5e-6,
    name: str = "out",
) -> None:
    """Raise AssertionError unless `out` matches `ref` under DESIGN.md section 5's rule."""
    assert out.shape == ref.shape, f"{name}: shape {tuple(out.shape)} != {tuple(ref.shape)}"
    o, r = out.double().cpu(), ref.double().cpu()
    nan_o, nan_r = torch.isnan(o), torch.isnan(r)
    assert torch.equal(nan_o, nan_r), (
        f"{name}: NaN positions differ ({int(nan_o.sum())} vs {int(nan_r.sum())})"
    )
    inf_o, inf_r = torch.isinf(o), torch.isinf(r)
    assert torch.equal(inf_o, inf_r) and torch.equal(o[inf_o], r[inf_r]), (
        f"{name}: inf positions or signs differ"
    )
    err, rel = element_errors(o, r)
    bad = (err > abs_tol) & (rel > rel_tol)
    if bad.any():
        i = int(torch.nonzero(bad)[0])
        fin = torch.isfinite(r)  # the elements err and rel are of
        raise AssertionError(
            f"{name}: {int(bad.sum())}/{bad.numel()} elements out of tolerance; worst abs err "
            f"{float(err.max()):.3e}; first bad: out={float(o[fin][i]):.6g} "
            f"ref={float(r[fin][i]):.6g}"
        )
    c = cos_diff(o, r)
    assert c <= cos_tol, f"{name}: cosine difference {c:.3e} > {cos_tol:.1e}"


def poison_(t: torch.Tensor) -> torch.Tensor:
    """Fill a buffer with NaN: 0xFF bytes for 1-byte dtypes (NaN in e4m3, e8m0, and in every
    bf16/f32 value they form)."""
    if t.dtype.is_floating_point and t.element_size() > 1:
        return t.fill_(float("nan"))
    return t.view(torch.uint8).fill_(0xFF)


@dataclass
class PagedCache:
    """A populated random paged cache (see `make_paged_cache`)."""

    params: KVCacheParams
    inputs: KVCacheInputsPerDevice
    seq_lens: list[int]  # valid tokens per request (cache_length + new tokens)


def make_paged_cache(
    params: KVCacheParams,
    cache_lengths: list[int],
    new_tokens: list[int] | None = None,
    *,
    extra_pages: int = 3,
    extra_cols: int = 2,
    generator: torch.Generator | None = None,
    device: str | torch.device = "cpu",
) -> PagedCache:
    """Random shuffled page assignment covering cache_length + new_tokens per request.

    Every byte of the pool starts NaN (0xFF for byte formats) so that reading an unreferenced
    slot shows up in the output; lookup-table columns past a request's pages hold the
    sentinel `total_num_pages`. The caller writes K/V (e.g. with `store_kv`).
    """
    new_tokens = new_tokens or [0] * len(cache_lengths)
    seq = [c + n for c, n in zip(cache_lengths, new_tokens)]
    ps = params.page_size
    pages_per = [-(-s // ps) for s in seq]
    total = sum(pages_per) + extra_pages
    bufs = allocate_buffers(params, total, device=device)
    poison_(bufs.kv_blocks)
    if bufs.kv_scales is not None and params.quant_format != "per_tensor":
        poison_(bufs.kv_scales)
    perm = torch.randperm(total, generator=generator).tolist()
    cols = max(pages_per, default=0) + extra_cols
    lut = torch.full((len(seq), max(cols, 1)), total, dtype=torch.int32)
    k = 0
    for b, n in enumerate(pages_per):
        lut[b, :n] = torch.tensor(perm[k : k + n], dtype=torch.int32)
        k += n
    inputs = KVCacheInputsPerDevice(
        kv_blocks=bufs.kv_blocks,
        cache_lengths=torch.tensor(cache_lengths, dtype=torch.int32, device=device),
        lookup_table=lut.to(device),
        max_lengths=torch.tensor(
            [[max(new_tokens, default=0), max(cache_lengths, default=0)]], dtype=torch.int32
        ),
        kv_scales=bufs.kv_scales,
    )
    return PagedCache(params, inputs, seq)


def ragged_offsets(lengths: list[int], device: str | torch.device = "cpu") -> torch.Tensor:
    """[batch + 1] int32 prefix sums."""
    out = torch.zeros(len(lengths) + 1, dtype=torch.int32)
    out[1:] = torch.tensor(lengths, dtype=torch.int32).cumsum(0)
    return out.to(device)
