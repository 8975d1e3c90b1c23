"""`ops.launch.launch` against `kernel[grid](...)`: the same results for every specialization.

The direct path reuses a compiled kernel only for the specialization Triton itself would pick,
so a launch that changes an argument's 16-byte alignment, an int's divisibility by 16 or its
being 1, or a constexpr, must not reuse an earlier launch's kernel. On a CPU (Triton's
interpreter) `launch` is `kernel[grid](...)`.
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from pagedattn.ops import launch as L  # noqa: E402

DEV = "cuda" if torch.cuda.is_available() else "cpu"


@triton.jit
def _axpb_kernel(X, Y, n, a, b, BLOCK: tl.constexpr, SQUARE: tl.constexpr):
    """Y[i] = a * X[i] + b (SQUARE: a * X[i]^2 + b), i < n."""
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + i, mask=i < n, other=0.0)
    if SQUARE:
        x = x * x
    tl.store(Y + i, a * x + b, mask=i < n)


def _run(x: torch.Tensor, n: int, a: float, b: int, square: bool, block: int = 64) -> torch.Tensor:
    y = torch.full_like(x, float("nan"))  # poisoned: every element i < n is written
    L.launch(_axpb_kernel, (triton.cdiv(n, block),), x, y, n, a, b, BLOCK=block, SQUARE=square)
    return y


def _expect(x: torch.Tensor, n: int, a: float, b: int, square: bool) -> torch.Tensor:
    xd = x.double()
    ref = a * (xd * xd if square else xd) + b
    out = torch.full_like(xd, float("nan"))
    out[:n] = ref[:n]
    return out


def test_launch_matches_every_specialization():
    """Aligned and misaligned views, n and b in {1, 16, 37}, both constexpr values, alternating
    so that each launch follows one of another specialization."""
    g = torch.Generator(device="cpu").manual_seed(int(os.environ.get("PAGEDATTN_SEED", "0")))
    base = torch.randn(400, generator=g).to(DEV)
    cases = []
    for off in (0, 1, 4):  # 4 floats = 16 bytes: aligned again
        for n in (1, 16, 37, 300):
            for b in (1, 16, 37):
                for square in (False, True):
                    cases.append((off, n, b, square))
    for _ in range(2):  # the second pass runs every specialization from the cache
        for off, n, b, square in cases:
            x = base[off : off + 320]
            y = _run(x, n, 1.5, b, square)
            ref = _expect(x.cpu(), n, 1.5, b, square)
            torch.testing.assert_close(y.double().cpu(), ref, rtol=1e-6, atol=1e-6, equal_nan=True)


def test_fallback_for_non_jit_kernels_and_callable_grids():
    """A stand-in object (as the benchmarks' launch captures use) and a callable grid go
    through `kernel[grid](...)` unchanged."""
    seen = []

    class Stand:
        def __getitem__(self, grid):
            return lambda *a, **k: seen.append((grid, a, k))

    L.launch(Stand(), (3, 2), 1, 2, X=3)
    assert seen == [((3, 2), (1, 2), {"X": 3})]
    assert not L._fast_path(Stand(), (1,))
    assert not L._fast_path(_axpb_kernel, lambda meta: (1,))


def test_cluster_launch_needs_a_compiled_kernel():
    """A cluster launch cannot go through `kernel[grid](...)` (it has no cluster argument), so
    anything that is not a compiled JIT function is refused with a TypeError."""

    class Stand:
        def __getitem__(self, grid):
            raise AssertionError("launched without its cluster")

    with pytest.raises(TypeError, match="cluster launch"):
        L.launch(Stand(), (1,), 1, cluster=2)
    with pytest.raises(TypeError, match="compiled-mode"):
        L.compiled_kernel(Stand(), (1,), 1)


@pytest.mark.gpu
def test_launch_caches_one_compiled_kernel_per_specialization():
    """On CUDA the direct path is taken: aligned and misaligned inputs get separate entries, and
    launching through it leaves the results equal to Triton's own launch (BLOCK 128: a
    specialization no other test launches)."""
    x = torch.randn(512, device="cuda")
    before = {k for k in L._COMPILED if k[0] is _axpb_kernel}
    for off in (0, 1, 0, 1):
        _run(x[off : off + 256], 256, 2.0, 3, False, block=128)
    keys = [k for k in L._COMPILED if k[0] is _axpb_kernel and k not in before]
    assert len(keys) == 2, keys
    xs = x[1:257]
    y_fast = _run(xs, 256, 2.0, 3, False, block=128)
    y_triton = torch.empty_like(xs)
    _axpb_kernel[(2,)](xs, y_triton, 256, 2.0, 3, BLOCK=128, SQUARE=False)
    assert torch.equal(y_fast, y_triton)


def test_jit_compiles_lists_compiles_and_restores_the_hook():
    from types import SimpleNamespace

    from triton import knobs

    from pagedattn.ops.launch import jit_compiles

    seen, outer = [], knobs.runtime.jit_post_compile_hook
    knobs.runtime.jit_post_compile_hook = lambda **kw: seen.append(kw["fn"].name)
    try:
        with jit_compiles() as names:
            knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="a"))
            with jit_compiles() as inner:
                knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="b"))
        assert names == ["a", "b"] and inner == ["b"] and seen == ["a", "b"]
        knobs.runtime.jit_post_compile_hook(fn=SimpleNamespace(name="c"))
        assert names == ["a", "b"] and seen == ["a", "b", "c"]
    finally:
        knobs.runtime.jit_post_compile_hook = outer


@pytest.mark.parametrize("ctas", [1, 2, 3, 4, 5, 6, 8])
def test_occupancy_shared_caps_the_ctas_a_sm(ctas):
    """`occupancy_shared(n)`: with the driver's 1 KB a CTA, n CTAs of that many shared bytes
    fit a sm_90 SM (228 KB) and n + 1 do not; 0 where that would take more than 48 KB (a
    launch above it needs the kernel's opt-in)."""
    s = L.occupancy_shared(ctas)
    per_sm, reserved = L.SM90_SHARED_PER_SM, L.SHARED_RESERVED_PER_CTA
    if s == 0:
        assert per_sm // (ctas + 1) - reserved + 1 > L.NO_OPT_IN_SHARED
        return
    assert 0 < s <= L.NO_OPT_IN_SHARED
    assert ctas * (s + reserved) <= per_sm < (ctas + 1) * (s + reserved)


def test_with_min_shared_only_raises():
    meta = (4, 1, 40000)
    assert L.with_min_shared(meta, 0) == meta and L.with_min_shared(meta, 30000) == meta
    assert L.with_min_shared(meta, 45671) == (4, 1, 45671)
    assert L.with_min_shared((8, 2, 1000, 7), 2048) == (8, 2, 2048, 7)


def test_min_shared_changes_no_result():
    """A launch with min_shared computes what one without it does (interpreted: ignored)."""
    x = torch.randn(300, device=DEV)
    want = _run(x, 300, 2.0, 3, False)
    y = torch.full_like(x, float("nan"))
    L.launch(_axpb_kernel, (triton.cdiv(300, 64),), x, y, 300, 2.0, 3, BLOCK=64, SQUARE=False,
             min_shared=L.occupancy_shared(4))  # fmt: skip
    assert torch.equal(y, want)
