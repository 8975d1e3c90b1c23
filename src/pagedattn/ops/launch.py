"""Kernel launches without Triton's per-call bookkeeping.

`launch(kernel, grid, *args, **kwargs)` does what `kernel[grid](*args, **kwargs)` does. Once a
specialization has compiled, it binds the arguments with Triton's own binder (so the
specialization is exactly the one Triton would pick: argument types, 16-byte alignment, ints
equal to 1), finds the compiled kernel in its own cache and calls its launcher directly. What
it skips of `JITFunction.run` is the cache key's string of the options, the check that no
global the kernel read has changed since it compiled (the kernels read module constants
only), and the launch's keyword handling.

What that saves: an eager MLA decode call 78.7 -> 72.6 us (bf16, P = 1) on an H100 host
(docs/kernels/launch.md).

Anything that is not a compiled JIT function (Triton's interpreter on a CPU, a test's stand-in)
takes `kernel[grid](...)`, and so does every first launch of a specialization.

`jit_compiles()` lists the Triton/Gluon kernels compiled inside a block (any thread, any
path), so a serving loop can show it compiled nothing after start-up.

`recording()` lists the launches its thread makes through `launch` (`Launched`: the kernel,
grid, arguments and the compiled kernel that ran), so that `ops.prepared` can freeze them into
prepared launches. A launch that does not reach this function (an `ops.offline` capture
replaces a module's `launch`) is not listed.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

try:
    from triton import knobs
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
except ImportError:  # pragma: no cover - triton is a dependency
    JITFunction = None

_COMPILED: dict[tuple, Any] = {}


@dataclass
class Launched:
    """One launch that `launch` made: its arguments as given, and Triton's `CompiledKernel`
    that ran it (None for anything but a compiled-mode JIT function, e.g. under Triton's
    interpreter)."""

    kernel: Any
    grid: Any
    args: tuple
    kwargs: dict = field(default_factory=dict)
    compiled: Any = None
    cluster: int = 1
    smem_args: dict | None = None
    min_shared: int = 0


_RECORD = threading.local()

# sm_90's shared memory a SM (228 KB) and the driver's reservation a CTA (1 KB)
SM90_SHARED_PER_SM = 233472
SHARED_RESERVED_PER_CTA = 1024
NO_OPT_IN_SHARED = 48 * 1024


def occupancy_shared(ctas_per_sm: int, per_sm: int = SM90_SHARED_PER_SM) -> int:
    """The fewest shared bytes a CTA that let at most `ctas_per_sm` CTAs share a SM (0 where
    that needs more than 48 KB, which a launch takes only with the kernel's opt-in)."""
    n = per_sm // (ctas_per_sm + 1) - SHARED_RESERVED_PER_CTA + 1
    return n if 0 < n <= NO_OPT_IN_SHARED else 0


def with_min_shared(meta: tuple, min_shared: int) -> tuple:
    """Triton's packed launch metadata (num_warps, num_ctas, shared) with at least min_shared
    bytes of shared memory."""
    if min_shared > meta[2]:
        return (meta[0], meta[1], min_shared) + tuple(meta[3:])
    return meta


@contextmanager
def recording() -> Iterator[list[Launched]]:
    """The launches this thread makes through `launch` inside the block, in order (nested
    blocks each get their own list)."""
    outer = getattr(_RECORD, "launches", None)
    made: list[Launched] = []
    _RECORD.launches = made
    try:
        yield made
    finally:
        _RECORD.launches = outer


def _fast_path(kernel: Any, grid: Any) -> bool:
    """Whether `kernel` is a compiled-mode Triton (or Gluon) JIT function (under
    TRITON_INTERPRET=1 kernels are Triton's `InterpretedFunction`) and `grid` a tuple."""
    return JITFunction is not None and isinstance(kernel, JITFunction) and isinstance(grid, tuple)


def _specialization(kernel: Any, args: tuple, kwargs: dict):
    """(device, bound arguments, cache key) of a launch, with Triton's own binder."""
    device = driver.active.get_current_device()
    bound, specialization, options = kernel.device_caches[device][4](*args, **kwargs)
    key = (
        kernel,
        device,
        tuple(specialization),
        tuple(options.items()),
        knobs.runtime.debug,
        knobs.compilation.instrumentation_mode,
    )
    return device, bound, key


def _cached(key: tuple) -> tuple[Any, tuple | None]:
    """(the compiled kernel of `key` or None, the key or None where a constexpr is unhashable:
    Triton's own path then, every time)."""
    try:
        return _COMPILED.get(key), key
    except TypeError:
        return None, None


def compiled_kernel(kernel: Any, grid: tuple, *args: Any, **kwargs: Any) -> Any:
    """The compiled kernel (Triton's `CompiledKernel`) a launch with these arguments runs,
    compiled (not launched) if it has not been yet. CUDA only."""
    if not _fast_path(kernel, grid):
        raise TypeError(f"compiled_kernel needs a compiled-mode JIT function, got {kernel!r}")
    compiled, key = _cached(_specialization(kernel, args, kwargs)[2])
    return compiled if compiled is not None else _warmup(kernel, grid, key, args, kwargs)


def _warmup(kernel: Any, grid: tuple, key: tuple | None, args: tuple, kwargs: dict) -> Any:
    """Compile (not launch) the kernel of a launch whose cache key (`_cached`) is `key`, kept
    under it unless None."""
    compiled = kernel.warmup(*args, grid=grid, **kwargs)
    if hasattr(compiled, "result"):  # an async compile's future
        compiled = compiled.result()
    if key is not None:
        _COMPILED[key] = compiled
    return compiled


@contextmanager
def jit_compiles() -> Iterator[list[str]]:
    """The names of the Triton/Gluon kernels compiled inside the block, in order (Triton's
    post-compile hook: a binary loaded from Triton's disk cache counts too; the hook that was
    set is restored after). Empty without Triton's runtime (knobs)."""
    names: list[str] = []
    if JITFunction is None:
        yield names
        return
    prev = knobs.runtime.jit_post_compile_hook

    def hook(**kw: Any) -> None:
        names.append(kw["fn"].name)
        if prev is not None:
            prev(**kw)

    knobs.runtime.jit_post_compile_hook = hook
    try:
        yield names
    finally:
        knobs.runtime.jit_post_compile_hook = prev


_SMEM_OFFSETS: dict = {}


def launch(
    kernel: Any,
    grid: tuple,
    *args: Any,
    cluster: int = 1,
    smem_args: dict[str, str] | None = None,
    min_shared: int = 0,
    **kwargs: Any,
) -> None:
    """`kernel[grid](*args, **kwargs)` on the current CUDA device and stream (grid: 1 to 3 ints).

    Compiled kernels only (CUDA), for the cross-CTA steps of `ops.gluon_cluster`:
    - cluster > 1 (sm_90): launch grid[0] clusters of `cluster` CTAs along x (grid[0] *
      cluster CTAs; program_id(0) counts CTAs, a cluster's CTAs are consecutive) of a kernel
      compiled as one CTA;
    - smem_args {argument: allocation}: those runtime arguments (not specialized on, left at
      their defaults in `args`) get the compiled kernel's shared offsets of the named
      allocations (`gluon_cluster.smem_offsets`, read once a compiled kernel).
    - min_shared: launch with at least this many bytes of (dynamic) shared memory, at most
      48 KB (no opt-in): an occupancy cap, `occupancy_shared` (interpreted launches: none)."""
    made = getattr(_RECORD, "launches", None)
    if made is not None:
        rec = Launched(kernel, grid, args, dict(kwargs), None, cluster, smem_args, min_shared)
        made.append(rec)
    compiled = key = None
    special = cluster > 1 or bool(smem_args)
    if _fast_path(kernel, grid):
        device, bound, key = _specialization(kernel, args, kwargs)
        compiled, key = _cached(key)
        if compiled is None and special:
            compiled = _warmup(kernel, grid, key, args, kwargs)
    elif special:
        raise TypeError(f"a cluster launch needs a compiled-mode JIT function, got {kernel!r}")
    if compiled is None:
        compiled = kernel[grid](*args, **kwargs)  # compiles (or finds) and launches
        if key is not None and compiled is not None and not hasattr(compiled, "result"):
            _COMPILED[key] = compiled  # (an async compile's future is not kept)
            if made is not None:
                rec.compiled = compiled
        return
    if made is not None:
        rec.compiled = compiled
    if smem_args:
        offs = _SMEM_OFFSETS.get(compiled)
        if offs is None:
            from .gluon_cluster import smem_offsets

            offs = _SMEM_OFFSETS[compiled] = smem_offsets(
                compiled.asm["ttgir"], tuple(smem_args.values())
            )
        for name, alloc in smem_args.items():
            bound[name] = offs[alloc]
    values = bound.values()
    g = grid + (1,) * (3 - len(grid))
    stream = driver.active.get_current_stream(device)
    meta = compiled.packed_metadata
    if cluster > 1:  # (num_warps, num_ctas, shared): the launcher sets the cluster from num_ctas
        meta = (meta[0], cluster) + tuple(meta[2:])
    meta = with_min_shared(meta, min_shared)
    compiled.run(
        g[0],
        g[1],
        g[2],
        stream,
        compiled.function,
        meta,
        compiled.launch_metadata(g, stream, *values),
        knobs.runtime.launch_enter_hook,
        knobs.runtime.launch_exit_hook,
        *values,
    )
