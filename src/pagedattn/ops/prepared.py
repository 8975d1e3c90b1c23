"""Prepared launches: an op's validate-and-plan once per call signature, then launches of
already-specialized kernels with no re-validation (DESIGN.md section 4b, "the host path").

An op that uses this module (`ops.mha.triton_mha.PreparedMHA`, `ops.mla.triton_mla.PreparedMLA`)
splits each eager call in two:
- validate-and-plan, on a miss: the op's full path (argument checks, launch plan, the launches
  through `ops.launch.launch`, recorded with `ops.launch.recording`), after which the recorded
  launches are frozen into `PreparedLaunch`es and stored under the call's signature;
- run, on a hit: the outputs allocated, the pointers of the call's tensors read, and each
  frozen launch handed straight to the compiled kernel's launcher.

What makes a hit safe:
- The signature is a `PreparedCache` key (the call's non-tensor state: operand kinds and
  formats, page size, mask kind and parameter, scale, flags, which optional tensors are
  present and which are the same object, the backend and `env_state()`, the current CUDA
  device) plus a guard (`tensor_guard`) over every tensor argument: dtype, device, sizes,
  strides, requires_grad, dispatch keys. The op also keys on the 16-byte alignment of each pointer
  (Triton specializes on it). Everything the op's checks and its plan read is in the key
  or the guard, so a call that hits equals, in all of it, a call that validated; a bad call
  has never validated, so it never hits and takes the full path, which raises the op's typed
  error.
- Each frozen launch keeps its grid, its constexprs and its int / float arguments (sizes,
  strides, batch, mask parameter, scale: functions of the guarded key), also inside Triton
  tuple arguments; every pointer argument is taken from the call (`PreparedLaunch` maps each
  to one of the op's call tensors, its "sources"), never cached. A view from a later element
  of a source (a slice of its requests) is that source's pointer plus the byte offset the
  prepared call had: the op derives such views from the key (a split point, guarded
  strides), and keys the pointers' 16-byte residues, so the offset pointer's alignment is the
  same too. A launch whose pointer does not map to exactly one source (an argument the op
  derived by a copy, a view inside two sources sharing memory) or with a callable grid is not
  prepared: the op keeps its full path for that signature. An op may pass a grid per call
  where its grid depends on a value outside the key (`PreparedLaunch.run`).
- Compiled launches only: a cluster launch keeps its cluster size and the shared-memory
  offsets `ops.launch.launch` read of the compiled kernel (`smem_args`: functions of the
  kernel). A host tensor descriptor (Triton's or Gluon's `TensorDescriptor`) whose base maps to
  a source is prepared where the op opts in (`build(..., descriptors=True)`: its shape and
  strides are functions of the guarded call): it is re-encoded for the call's base pointer,
  once per pointer (`_Descriptors`: a descriptor depends on nothing else).
- Values that only the host can check (offsets, cache lengths, page-table reach) are checked
  by the ops' references on the CPU; the CUDA path never reads them, cached or not.

`PreparedLaunch` runs on CUDA through the launcher of the Triton `CompiledKernel` that the
recorded launch ran (Triton's binder and `JITFunction.run` skipped: ~11-22 us and 9-20 us of
an eager launch on an H100 host, docs/kernels/launch.md): the arguments go as one call whose
constants are closed over (the code generated once per form of launch, `_factory`), pointers
as ints (the launcher then skips `data_ptr()` and `cuPointerGetAttribute` for each). A registered
Triton launch hook, or a kernel that needs global / profile scratch, takes the compiled
kernel's `run` with its launch metadata instead. Under Triton's interpreter (CPU runs) a
prepared launch calls `kernel[grid](...)` with the call's tensors, so that CPU tests run the
hit path end to end.

`cached_launch(kernel, grid, *args, **kwargs)`: the same frozen launches for ops whose launch
is their whole host path (the fused layer ops, `store_kv`), keyed by every value a launch
inlines instead of an op's signature (the function's docstring; measured in
docs/kernels/launch.md).

`PreparedOp`: the same prepared calls for the small ops (`ops.fused`' rms_norm, rope_qkv,
silu_mul, argmax_rows; `ops.store_kv`'s store_kv, rope_store_kv): each op keys its call as
above (its non-tensor arguments, the environment and device; a guard of its tensors; their
pointers' residues), and a hit allocates the outputs as the validated call did and runs its
one frozen launch (`fast` on CUDA), skipping the op's checks, dispatch and `cached_launch`
(the class's docstring).

`workspace(device, stream, numel)`: a float32 scratch tensor reused by the calls on one
stream (split-K partials). Rule: a workspace belongs to one (device, stream); two calls
in flight on that stream are ordered by it, so they may share it; calls on different streams
get different workspaces; while the stream is being captured into a CUDA graph the op
allocates fresh buffers instead (the graph's private pool owns them, and no later eager call
can overwrite memory a replay reads). At most `MAX_WORKSPACES` are kept (the oldest dropped;
the caching allocator returns a dropped one to its stream's pool, so work still in flight on
that stream is safe).

`semaphores(device, stream, numel)`: int32 counters that are zero between launches, one tensor
per (device, stream) (the balanced MHA decode's fused merge counts its split rows' items on
them), never freed; a capture on a stream without one takes fresh zeros a call (the
function's docstring).

Bounds: `PreparedCache` keeps at most `capacity` keys (least recently used dropped) and
`per_key` guarded entries under one key; `cached_launch` at most `MAX_LAUNCHES` keys. No
tuning state lives here: a prepared launch is the frozen result of the op's own plan.
"""

from __future__ import annotations

import math
import os
import threading
from collections import OrderedDict
from collections.abc import Sequence
from operator import itemgetter
from typing import Any

import torch

from .launch import _RECORD, Launched, _fast_path, launch, recording

try:
    from triton import knobs
    from triton.knobs import HookChain
except ImportError:  # pragma: no cover - triton is a dependency
    knobs = HookChain = None

MISS = object()  # a lookup found no prepared launch for this call: take the full path
UNPREPARED = object()  # the signature validated, but its launches are not preparable

MAX_WORKSPACES = 16

# --------------------------------------------------------------------------------------------
# Environment and device state in the key
# --------------------------------------------------------------------------------------------
# The variables a plan reads (ops.dispatch, ops.pdl, the tuning overrides, Triton's
# interpreter switch), keyed by their raw values: os.environ.get cost ~0.9 us each on the CI
# CPU (the key's encoding), a lookup in its byte table ~0.05 us.
ENV_NAMES = (
    "PAGEDATTN_BACKEND",
    "PAGEDATTN_PDL",
    "PAGEDATTN_MHA_TUNING",
    "PAGEDATTN_MLA_TUNING",
    "TRITON_INTERPRET",
)
_ENV = os.environ
try:
    _ENV_KEYS = tuple(_ENV.encodekey(n) for n in ENV_NAMES)
    _ENV_DATA = _ENV._data
except AttributeError:  # pragma: no cover - not CPython's os._Environ
    _ENV_KEYS = _ENV_DATA = None


def env_state() -> tuple:
    """The raw values (None when unset) of ENV_NAMES now: part of every prepared key, so that
    a variable set between two calls plans the second call afresh."""
    d = _ENV_DATA
    if d is None or _ENV._data is not d:  # pragma: no cover - see above
        return tuple(_ENV.get(n) for n in ENV_NAMES)
    k0, k1, k2, k3, k4 = _ENV_KEYS
    return (d.get(k0), d.get(k1), d.get(k2), d.get(k3), d.get(k4))


_cuda_device = getattr(torch._C, "_cuda_getDevice", None)
_cuda_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
_cuda_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)


def current_device(t: torch.Tensor) -> int:
    """The current CUDA device's index where `t` is a CUDA tensor (the device Triton launches
    on), else -1."""
    return _cuda_device() if t.is_cuda else -1


def current_stream(device: int) -> int:
    """The raw handle of the current stream of CUDA device `device` (0 for -1: no CUDA)."""
    return _cuda_stream(device) if device >= 0 else 0


def capturing(device: int) -> bool:
    """Whether the current stream of `device` (the current device) is capturing a CUDA graph."""
    return device >= 0 and _cuda_capturing()


# --------------------------------------------------------------------------------------------
# Guards and the cache
# --------------------------------------------------------------------------------------------
class _PyTensorGuard:
    """`tensor_guard` in Python (where torch's C++ TensorGuards is missing or misbehaves)."""

    __slots__ = ("sig",)

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        self.sig = self._sig(tensors)

    @staticmethod
    def _sig(tensors) -> tuple:
        return tuple(
            (type(t), t.dtype, t.device, t.requires_grad, tuple(t.shape), t.stride())
            for t in tensors
        )

    def check(self, *tensors: Any) -> bool:
        try:
            return self._sig(tensors) == self.sig
        except (AttributeError, TypeError):
            return False


def _cxx_tensor_guard() -> Any:
    """torch's C++ TensorGuards (what torch.compile guards tensors with) if it exists and, on a
    probe, rejects every change a prepared launch depends on; else None."""
    try:
        from torch._C._dynamo.guards import TensorGuards
    except ImportError:  # pragma: no cover - torch without dynamo
        return None

    def make(ts):
        return TensorGuards(
            *ts,
            dynamic_dims_sizes=[list(t.shape) for t in ts],
            dynamic_dims_strides=[list(t.stride()) for t in ts],
        )

    try:
        a = torch.zeros(4, 6)
        g = make([a])
        others = [
            torch.zeros(4, 5),  # size
            torch.zeros(6, 4).t(),  # strides
            torch.zeros(4, 6, dtype=torch.float64),  # dtype
            torch.zeros(4, 6, device="meta"),  # device
            None,
            3,
        ]
        ok = g.check(torch.ones(4, 6)) and not any(g.check(o) for o in others)
    except Exception:  # pragma: no cover - an API change: the Python guard then
        return None
    return make if ok else None


_MAKE_CXX_GUARD = _cxx_tensor_guard()


def tensor_guard(tensors: Sequence[torch.Tensor]) -> Any:
    """A guard of `tensors`' metadata: `.check(*others)` is True iff `others` has as many
    tensors, each of the same type and dispatch keys, dtype, device, sizes, strides and
    requires_grad (never their data or data pointer). One C++ call where torch has it
    (1.4 us for 7 tensors on the CI CPU against 5 us for the same reads in Python). The C++
    guard also fails where two of the checked tensors are one object: pass each once (a
    caller whose own tensors fail their guard cannot hit, and should not store)."""
    if _MAKE_CXX_GUARD is not None:
        return _MAKE_CXX_GUARD(list(tensors))
    return _PyTensorGuard(tensors)  # pragma: no cover - see _cxx_tensor_guard


class PreparedCache:
    """key -> up to `per_key` (guard, pick, value) triples, over at most `capacity` keys (both
    least recently used dropped). `pick(sources)` selects the tensors `guard` checks from an
    op's sources; a value is the op's prepared call, or None where the signature validated
    but is not preparable (UNPREPARED)."""

    def __init__(self, capacity: int = 256, per_key: int = 4) -> None:
        if capacity < 1 or per_key < 1:
            raise ValueError("capacity and per_key must be >= 1")
        self.capacity = capacity
        self.per_key = per_key
        self._d: OrderedDict = OrderedDict()

    def __len__(self) -> int:
        return sum(len(v) for v in self._d.values())

    def clear(self) -> None:
        self._d.clear()

    def candidates(self, key: Any) -> list | None:
        """The (guard, pick, value) triples under `key` (most recent first), or None. Raises
        TypeError for an unhashable key (a bad argument: the caller's full path reports it)."""
        c = self._d.get(key)
        if c is not None:
            self._d.move_to_end(key)
        return c

    def store(self, key: Any, guard: Any, pick: Any, value: Any) -> None:
        """Keep `value` under `key`, behind `guard` (`tensor_guard` of the tensors `pick`
        selects from the call's sources)."""
        c = self._d.get(key)
        if c is None:
            c = self._d[key] = []
            while len(self._d) > self.capacity:
                self._d.popitem(last=False)
        else:
            self._d.move_to_end(key)
        c.insert(0, (guard, pick, value))
        del c[self.per_key :]

    def lookup(self, key: Any, src: list, *extra: Any) -> Any:
        """The prepared result of a call with signature `key` and sources `src` (its entry's
        value called on src and `extra`, e.g. a step plan), UNPREPARED where the signature is
        stored as not preparable, or MISS."""
        try:
            cands = self.candidates(key)
        except TypeError:  # an unhashable key: a bad argument the full path reports
            return MISS
        if cands is None:
            return MISS
        for guard, pick, entry in cands:
            if guard.check(*pick(src)):
                if entry is None:
                    return UNPREPARED
                r = entry(src, *extra)
                if r is not MISS:
                    return r
        return MISS


def guard_call(key: Any, src: list, guarded: Sequence[int]) -> tuple[Any, Any] | None:
    """(guard, pick) of a validated call's sources `src`, whose positions `guarded` hold the
    tensors to guard, or None where the call cannot be guarded (an unhashable key; tensors
    aliasing each other, e.g. out=q)."""
    try:
        hash(key)
        if len(guarded) == 1:  # (itemgetter of one index returns the item, not a tuple)
            i = guarded[0]

            def pick(s):
                return (s[i],)
        else:
            pick = itemgetter(*guarded)
        tensors = pick(src)
        guard = tensor_guard(tensors)
        return (guard, pick) if guard.check(*tensors) else None
    except Exception:  # (not expected of a validated call) not prepared
        return None


# --------------------------------------------------------------------------------------------
# Prepared launches
# --------------------------------------------------------------------------------------------
def _extent(t: torch.Tensor) -> int:
    """Bytes from `t`'s first element to just past its last (0 for an empty tensor)."""
    if t.numel() == 0:
        return 0
    return t.element_size() * (1 + sum((n - 1) * s for n, s in zip(t.shape, t.stride())))


def _match_source(
    arg: torch.Tensor, sources: Sequence[torch.Tensor | None]
) -> tuple[int, int] | None:
    """(index, byte offset) of the source `arg` views: the source it is (by identity: the
    first), else the one source whose data pointer it shares (an op hands its kernels its
    sources, or views of them from their first element: a reshape, a dtype view; offset 0),
    else the one source whose memory holds arg's first element (a view from a later element,
    e.g. the requests [d, batch) of a mixed step: the offset is arg's pointer less the
    source's). None when none or several different objects match."""
    for i, s in enumerate(sources):
        if s is arg:
            return i, 0
    p = arg.data_ptr()
    found: int | None = None
    for i, s in enumerate(sources):
        if s is not None and s.data_ptr() == p:
            if found is not None and sources[found] is not s:
                return None
            if found is None:
                found = i
    if found is not None:
        return found, 0
    storage = arg.untyped_storage().data_ptr()
    for i, s in enumerate(sources):
        if s is None or s.untyped_storage().data_ptr() != storage:
            continue
        if s.data_ptr() < p < s.data_ptr() + _extent(s):
            if found is not None and sources[found] is not s:
                return None
            if found is None:
                found = i
    return None if found is None else (found, p - sources[found].data_ptr())


def hooks_idle() -> bool:
    """No Triton launch hook is registered (a profiler's needs each launch's metadata, which
    `PreparedLaunch.run` passes and `fast` does not)."""
    rt = knobs.runtime
    e, x = rt.launch_enter_hook, rt.launch_exit_hook
    e_idle = e is None or (type(e) is HookChain and not e.calls)
    return e_idle and (x is None or (type(x) is HookChain and not x.calls))


def _template(a: Any, sources: Sequence[torch.Tensor | None]) -> Any:
    """How an interpreted launch rebuilds argument `a` from a call's sources: ("s", index,
    dtype to view it as or None) for a tensor from a source's first element, ("o", index,
    dtype or None, shape, strides, byte offset) for a view from a later element, ("t",
    [templates]) for a tuple, ("v", a) for an int / float / bool / None; None where it cannot
    (a tensor of no single source, another object)."""
    if isinstance(a, torch.Tensor):
        m = _match_source(a, sources)
        if m is None:
            return None
        i, off = m
        dtype = a.dtype if a.dtype != sources[i].dtype else None
        if off:
            return ("o", i, dtype, tuple(a.shape), a.stride(), off)
        return ("s", i, dtype)
    if type(a) is tuple:
        parts = [_template(x, sources) for x in a]
        return None if any(p is None for p in parts) else ("t", parts)
    if type(a) in (int, float, bool) or a is None:
        return ("v", a)
    return None


def _fill(t: tuple, S: Sequence[torch.Tensor | None]) -> Any:
    """The argument `_template` `t` describes, from the call's sources S."""
    kind = t[0]
    if kind == "s":
        x = S[t[1]]
        return x if t[2] is None else x.view(t[2])
    if kind == "o":
        x = S[t[1]] if t[2] is None else S[t[1]].view(t[2])
        return x.as_strided(t[3], t[4], x.storage_offset() + t[5] // x.element_size())
    if kind == "t":
        return tuple(_fill(p, S) for p in t[1])
    return t[1]


def _template_sources(t: tuple, into: set) -> None:
    if t[0] in ("s", "o"):
        into.add(t[1])
    elif t[0] == "t":
        for p in t[1]:
            _template_sources(p, into)


class _Ptr:
    """A data pointer standing in for a descriptor's base tensor (what Triton's launcher reads of
    it: `data_ptr()`, `dtype`)."""

    __slots__ = ("ptr", "dtype")

    def __init__(self, ptr: int, dtype: torch.dtype) -> None:
        self.ptr, self.dtype = ptr, dtype

    def data_ptr(self) -> int:
        return self.ptr


class _DescriptorAt:
    """A recorded host tensor descriptor (Triton's or Gluon's `TensorDescriptor`) over another
    base pointer: shape, strides, block shape, layout and padding the recorded one's."""

    __slots__ = ("base", "shape", "strides", "block_shape", "layout", "padding")

    def __init__(self, desc: Any, ptr: int) -> None:
        self.base = _Ptr(ptr, desc.base.dtype)
        self.shape, self.strides = desc.shape, desc.strides
        self.block_shape = desc.block_shape
        self.layout = getattr(desc, "layout", None)
        self.padding = desc.padding


def _is_descriptor(v: Any, ty: Any) -> bool:
    """Whether bound value `v` of specialized type `ty` is a host tensor descriptor."""
    return isinstance(ty, str) and ty.startswith("tensordesc") and hasattr(v, "block_shape")


MAX_DESCRIPTORS = 256  # encoded descriptors a prepared launch keeps per descriptor argument


class _Descriptors:
    """One descriptor argument of a prepared launch: the recorded descriptor with its base
    replaced by a call's pointer. `at(ptr)`: a stand-in descriptor for the launcher's own
    handling (`CompiledKernel.run`); `expanded(ptr)`: the launcher's arguments of it
    (`expand(descriptor, meta)`: Triton's encoded CUtensorMap, shape and strides), cached by
    pointer (at most MAX_DESCRIPTORS, all dropped when full). A descriptor depends only on its
    base pointer and the recorded shape, strides, block shape, layout and padding, which are
    functions of the guarded call: the same pointer gives the same descriptor."""

    __slots__ = ("desc", "meta", "expand", "cache")

    def __init__(self, desc: Any, meta: Any, expand: Any) -> None:
        self.desc = _DescriptorAt(desc, 0)
        self.meta, self.expand, self.cache = meta, expand, {}

    def at(self, ptr: int) -> _DescriptorAt:
        return _DescriptorAt(self.desc, ptr)

    def expanded(self, ptr: int) -> list:
        e = self.cache.get(ptr)
        if e is None:
            if len(self.cache) >= MAX_DESCRIPTORS:
                self.cache.clear()
            e = self.cache[ptr] = list(self.expand(self.at(ptr), self.meta))
        return e


def _unwrap_tensordesc(launch: Any) -> tuple[Any, list] | None:
    """(the C launch function, the tensor descriptors' metadata) inside a Triton launcher's
    `launch` that wraps descriptor handling (`wrap_handle_tensordesc`), or None where `launch`
    is not such a wrapper (another Triton version: descriptors then go through it)."""
    code, cells = getattr(launch, "__code__", None), getattr(launch, "__closure__", None)
    if code is None or not cells:
        return None
    try:
        env = {n: c.cell_contents for n, c in zip(code.co_freevars, cells)}
    except ValueError:  # pragma: no cover - an empty cell
        return None
    raw, meta = env.get("launcher"), env.get("tensordesc_meta", ())
    if raw is None or "tensordesc_indices" not in env or not callable(raw):
        return None
    return raw, list(meta or ())


class PreparedLaunch:
    """One recorded launch, frozen: kernel, grid, constexprs and scalar arguments fixed; its
    pointer arguments taken from the call's sources.

    `run(stream, P, S, grid=None)`: P[i] the data pointer (int) of source i, S[i] the source
    tensor itself. Compiled launches read P only; interpreted ones (Triton's interpreter, CPU)
    read S. `grid` (a 3-tuple for compiled launches): the call's grid where the op's grid
    depends on a value outside the key (a step plan's item count, the host's lengths), else
    the recorded one. `fast(stream, P, g=grid)`: the compiled launch straight into Triton's C
    launcher, for callers that checked `hooks_idle()` (None where the launcher needs scratch
    memory, and for interpreted launches). `sources`: the source indices the launch reads.
    Build with `PreparedLaunch.build`.

    Arguments: tensors (each one source, or a view of it: from its first element, or from a
    later one at a fixed byte offset, which the op derives from the key), ints,
    floats, bools, None, tuples of these (Triton's tuple arguments) and, compiled only, host
    tensor descriptors whose base is one source (`_Descriptors`). Compiled launches also keep
    a cluster size (the launcher's num_ctas) and shared-memory offset arguments
    (`ops.launch.launch`'s `cluster=` / `smem_args=`, read from the compiled kernel as the
    recorded launch did)."""

    __slots__ = ("run", "fast", "sources", "compiled", "kernel", "grid")

    def __init__(self, run, sources: tuple[int, ...], compiled: bool, kernel, grid,
                 fast=None) -> None:  # fmt: skip
        self.run = run
        self.fast = fast
        self.sources = sources
        self.compiled = compiled
        self.kernel = kernel
        self.grid = grid

    @classmethod
    def build(
        cls, rec: Launched, sources: Sequence[torch.Tensor | None], descriptors: bool = False
    ) -> PreparedLaunch | None:
        """The prepared form of `rec` (a launch `ops.launch.launch` made during the op's full
        path) whose tensor arguments each come from one of `sources` (the call's tensors, None
        where absent), or None where it cannot be prepared (see the module docstring).
        descriptors: whether host tensor descriptors are prepared (`_Descriptors`; an op opts
        in where each descriptor's shape and strides are functions of its guarded call), else
        a launch that takes one is not."""
        grid = rec.grid
        if not isinstance(grid, tuple) or not 1 <= len(grid) <= 3:
            return None
        if not all(type(g) is int for g in grid):
            return None
        if _fast_path(rec.kernel, grid):
            if rec.compiled is None:
                return None
            return cls._compiled(rec, sources, descriptors)
        if rec.cluster != 1 or rec.smem_args:
            return None
        return cls._interpreted(rec, sources)

    @classmethod
    def _interpreted(cls, rec: Launched, sources) -> PreparedLaunch | None:
        args = [_template(a, sources) for a in rec.args]
        kw = {  # (keyword constexprs may be any object: a str, a dtype)
            k: _template(v, sources) if isinstance(v, (torch.Tensor, tuple)) else ("v", v)
            for k, v in rec.kwargs.items()
        }
        if any(t is None for t in args) or any(t is None for t in kw.values()):
            return None
        kernel, fixed = rec.kernel, rec.grid
        plain = {k: t[1] for k, t in kw.items() if t[0] == "v"}
        tensor_kw = {k: t for k, t in kw.items() if t[0] != "v"}

        def run(stream, P, S, grid=None):
            kwargs = dict(plain)
            for k, t in tensor_kw.items():
                kwargs[k] = _fill(t, S)
            kernel[fixed if grid is None else grid](*[_fill(t, S) for t in args], **kwargs)

        used: set = set()
        for t in args + list(kw.values()):
            _template_sources(t, used)
        return cls(run, tuple(sorted(used)), False, kernel, fixed)

    @classmethod
    def _compiled(cls, rec: Launched, sources, descriptors: bool) -> PreparedLaunch | None:
        from triton.runtime.driver import driver

        binder = rec.kernel.device_caches[driver.active.get_current_device()][4]
        bound, spec, _ = binder(*rec.args, **rec.kwargs)  # Triton's own: what `run` passes
        return cls.bound(rec, bound, [ty for ty, _ in spec], sources, descriptors)

    @classmethod
    def bound(
        cls, rec: Launched, bound: dict, types: list, sources, descriptors: bool
    ) -> PreparedLaunch | None:
        """The compiled form of `rec` from Triton's binding of its arguments (`bound`: parameter
        -> value, `types`: their specialized types), with the shared offsets and cluster size
        `ops.launch.launch` gives the compiled kernel `rec.compiled`."""
        from .launch import _SMEM_OFFSETS, with_min_shared

        ck = rec.compiled
        meta = ck.packed_metadata
        if rec.smem_args:  # the offsets `launch` read of this compiled kernel
            offs = _SMEM_OFFSETS.get(ck)
            if offs is None:
                return None
            bound = dict(bound)
            for name, alloc in rec.smem_args.items():
                bound[name] = offs[alloc]
        if rec.cluster != 1:  # (num_warps, num_ctas, ...): as `launch` passes it
            meta = (meta[0], rec.cluster) + tuple(meta[2:])
        meta = with_min_shared(meta, rec.min_shared)
        launcher = ck.run  # loads the module and makes the launcher where not yet done
        direct = None
        if (
            getattr(launcher, "global_scratch_size", 1) == 0
            and getattr(launcher, "profile_scratch_size", 1) == 0
            and hasattr(launcher, "launch")
        ):
            direct = (launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl)
        with_desc = None
        if descriptors and any(_is_descriptor(v, ty) for v, ty in zip(bound.values(), types)):
            from triton.backends.nvidia.driver import make_tensordesc_arg

            raw = _unwrap_tensordesc(direct[0]) if direct is not None else None
            raw = raw if raw is not None else (None, None)
            with_desc = (raw[0], raw[1], make_tensordesc_arg)
        return cls.generated(
            list(bound.values()), types, sources, rec.grid, rec.kernel, ck, direct, meta=meta,
            descriptors=with_desc,
        )  # fmt: skip

    @classmethod
    def generated(
        cls,
        values: list,
        types: list,
        sources: Sequence[torch.Tensor | None],
        grid: tuple,
        kernel: Any,
        ck: Any,
        direct: tuple | None,
        *,
        meta: Any = None,
        descriptors: tuple | None = None,
    ) -> PreparedLaunch | None:
        """The compiled form: every parameter's value (`values`, Triton's bound arguments in
        parameter order) and its specialized type (`types`: "*bf16", "i32", "constexpr", a
        tuple of these for a tuple argument, "tensordesc<...>", ...) as one generated call of
        the launcher. direct: (the C launcher, cooperative grid, PDL) where it can be called as
        is (no scratch to allocate), else None (`ck.run`). `ck`: the CompiledKernel (its
        function handle, packed metadata, `run`); meta: the packed metadata to launch with
        (None: ck's; a cluster launch's num_ctas differs). descriptors: where a value is a host
        tensor descriptor, (the C launch function inside direct[0]'s descriptor handling or
        None, the descriptors' metadata in parameter order, Triton's `make_tensordesc_arg`):
        with the C function, `fast` passes each descriptor encoded once per base pointer
        (`_Descriptors`); without it, a stand-in descriptor a call for the launcher to
        encode."""
        vals: dict = {}  # the factory's parameters: name -> value
        used: set = set()

        def emit(v, ty, j) -> str | None:
            if isinstance(v, torch.Tensor):
                if not (isinstance(ty, str) and ty.startswith("*")):
                    return None
                m = _match_source(v, sources)
                if m is None:
                    return None
                used.add(m[0])
                if not m[1]:
                    return f"P[{m[0]}]"
                vals[f"_o{j}"] = m[1]
                return f"P[{m[0]}] + _o{j}"
            if type(v) is tuple:
                if type(ty) is not tuple or len(ty) != len(v):
                    return None
                parts = [emit(x, t, f"{j}_{n}") for n, (x, t) in enumerate(zip(v, ty))]
                if any(p is None for p in parts):
                    return None
                return "(" + "".join(p + ", " for p in parts) + ")"
            if ty != "constexpr" and type(v) not in (int, float, bool):
                return None  # another object the launcher unpacks
            if v is None:
                return "None"
            vals[f"_c{j}"] = v
            return f"_c{j}"

        raw, metas, expand = descriptors if descriptors is not None else (None, None, None)
        run_parts, fast_parts = [], []
        n_desc = 0
        for j, (v, ty) in enumerate(zip(values, types)):
            if not _is_descriptor(v, ty):
                s = emit(v, ty, j)
                if s is None:
                    return None
                run_parts.append(s)
                fast_parts.append(s)
                continue
            m = _match_source(v.base, sources) if expand is not None else None
            if m is None or m[1] or (raw is not None and n_desc >= len(metas)):
                return None
            i = m[0]
            vals[f"_d{j}"] = _Descriptors(v, metas[n_desc] if raw is not None else None, expand)
            n_desc += 1
            used.add(i)
            run_parts.append(f"_d{j}.at(P[{i}])")
            fast_parts.append(f"*_d{j}.expanded(P[{i}])" if raw is not None else run_parts[-1])
        if raw is not None and n_desc != len(metas):
            return None  # the launcher's metadata does not pair with these descriptors
        g = tuple(grid) + (1,) * (3 - len(grid))
        vals.update(_ck=ck, _fn=ck.function, _meta=ck.packed_metadata if meta is None else meta,
                    _grid=g, _rt=knobs.runtime)  # fmt: skip
        run_src = "".join(p + ", " for p in run_parts)
        body = (
            "    def run(stream, P, S=None, grid=None):\n"
            f"        a = ({run_src})\n"
            "        g = _grid if grid is None else grid\n"
            "        _ck.run(g[0], g[1], g[2], stream, _fn, _meta,\n"
            "                _ck.launch_metadata(g, stream, *a),\n"
            "                _rt.launch_enter_hook, _rt.launch_exit_hook, *a)\n"
        )
        if direct is not None:
            go = direct[0] if raw is None else raw  # (the C launch inside descriptor handling)
            vals.update(_go=go, _coop=bool(direct[1]), _pdl=bool(direct[2]))
            body += (
                "    def fast(stream, P, g=_grid):\n"
                "        _go(g[0], g[1], g[2], stream, _fn, _coop, _pdl, None, None, _meta, "
                f"None, None, None, {', '.join(fast_parts)})\n"
                "    return run, fast\n"
            )
        else:
            body += "    return run, None\n"
        run, fast = _factory(tuple(vals), body)(**vals)
        return cls(run, tuple(sorted(used)), True, kernel, grid, fast)


# The generated launch code, one function a form (`_factory`): a prepared launch's values are
# its factory's arguments, so a call of a new shape (a mixed step's token count, which every
# eager step changes) makes a closure instead of compiling Python (~0.4 ms a launch on the
# H200 host: 21 compiles, 8 ms, of a Llama-3.2-1B mixed step of 2,048 tokens,
# dev/profile_serve_steps.py; docs/kernels/launch.md).
_FACTORIES: OrderedDict = OrderedDict()  # (parameter names, body) -> factory
MAX_FACTORIES = 512


def _factory(names: tuple[str, ...], body: str) -> Any:
    """The function `make(*names)` whose body is `body` (it defines and returns the launch
    functions over its parameters, closed over), compiled once per (names, body)."""
    key = (names, body)
    f = _FACTORIES.get(key)
    if f is None:
        src = f"def make({', '.join(names)}):\n{body}"
        ns: dict = {}
        exec(compile(src, "<prepared launch>", "exec"), ns)
        f = _FACTORIES[key] = ns["make"]
        while len(_FACTORIES) > MAX_FACTORIES:
            _FACTORIES.popitem(last=False)
    return f


# --------------------------------------------------------------------------------------------
# What a prepared call's entry does each call (shared by the ops' entries)
# --------------------------------------------------------------------------------------------
WS_ALIGN = 64  # 4-byte elements (256 bytes) between a call's buffers in the workspace


def pointer_residues(src: list, inputs: Sequence[int]) -> bool | tuple[int, ...]:
    """What an entry keys its input pointers by: True where each is 16-byte aligned, else their
    16-byte residues (Triton specializes on alignment; a view from a later element of a source,
    at a fixed offset, then has the prepared alignment too)."""
    r = tuple(src[i].data_ptr() & 15 for i in inputs)
    return True if not any(r) else r


def read_pointers(src: list, inputs: Sequence[int], residues: Any, n: int) -> list | None:
    """P: the data pointers of `src`'s `inputs` (0 at the other of `n` places), or None where
    they do not have the prepared call's `residues` (`pointer_residues`)."""
    P = [0] * n
    acc = 0
    for i in inputs:
        p = P[i] = src[i].data_ptr()
        acc |= p
    if residues is True:
        return None if acc & 15 else P
    return P if tuple(P[i] & 15 for i in inputs) == residues else None


def workspace_layout(buffers: Sequence[tuple[int, tuple, torch.dtype]]) -> tuple[tuple, int]:
    """(parts, numel): each (source index, shape, dtype) buffer of 4-byte elements placed in a
    workspace, `WS_ALIGN` elements apart: parts (source index, shape, dtype, offset, numel)."""
    parts, off = [], 0
    for i, shape, dtype in buffers:
        n = math.prod(shape)
        parts.append((i, tuple(shape), dtype, off, n))
        off = -(-(off + n) // WS_ALIGN) * WS_ALIGN
    return tuple(parts), off


def place_parts(parts: tuple, numel: int, src: list, P: list, device: torch.device, index: int,
                stream: int, views: bool) -> None:  # fmt: skip
    """Each split buffer of `parts` (`workspace_layout`) for this call: fresh tensors while the
    stream captures a CUDA graph (the graph's private pool owns them), else its place in the
    stream's workspace (`workspace`); P[i] its pointer, and src[i] the tensor itself where
    `views` (interpreted launches read tensors) or fresh."""
    if capturing(index):
        for i, shape, dtype, _, _ in parts:
            t = src[i] = torch.empty(shape, dtype=dtype, device=device)
            P[i] = t.data_ptr()
        return
    w, base = workspace(device, stream, numel)
    for i, shape, dtype, off, n in parts:
        P[i] = base + 4 * off
        if views:
            src[i] = w[off : off + n].view(dtype).view(shape)


# --------------------------------------------------------------------------------------------
# Prepared small ops (the fused layer ops, store_kv, rope_store_kv)
# --------------------------------------------------------------------------------------------
class _OpCall:
    """A small op's prepared call (`PreparedOp`): its frozen launches, the sources they read
    (`inputs`, with their 16-byte residues `aligned`), the outputs a call allocates (`fresh`:
    source index, shape, strides, dtype, as the full path allocated them) and the sources it
    returns (`ret`: an index, a tuple of indices, or None)."""

    __slots__ = ("launches", "inputs", "aligned", "fresh", "device", "index", "ret", "fast", "n")

    def __call__(self, src: list, before: Any = None) -> Any:
        P = read_pointers(src, self.inputs, self.aligned, self.n)
        if P is None:
            return MISS
        if before is not None:
            before()
        dev = self.device
        for i, shape, stride, dtype in self.fresh:
            t = src[i] = torch.empty_strided(shape, stride, dtype=dtype, device=dev)
            P[i] = t.data_ptr()
        stream = current_stream(self.index)
        if self.fast and hooks_idle():
            for x in self.launches:
                x.fast(stream, P)
        else:
            for x in self.launches:
                x.run(stream, P, src)
        r = self.ret
        if r is None or type(r) is int:
            return None if r is None else src[r]
        return tuple(src[i] for i in r)


class PreparedOp:
    """The prepared calls of one small op: an op whose Triton host path is its argument
    checks, its outputs' allocation and one or a few launches (`ops.fused`' rms_norm,
    rope_qkv, silu_mul, argmax_rows; `ops.store_kv`'s store_kv and rope_store_kv), keyed
    like `mha`'s (the module docstring: a `PreparedCache` key of every non-tensor value the
    op's checks and launch read, the environment and the CUDA device included, and a tensor
    guard over its tensor arguments; the 16-byte residues of their pointers).

    `lookup(key, src, before=None)`: the result of a hit (the call's outputs allocated as
    the validated call's were, `before()` called where given, e.g. the host-value checks
    of a CPU cache, and the frozen launches run on src's tensors), or MISS / UNPREPARED.
    `prepare(key, src, guarded, run, outs, launches)`: runs `run()`, the op's full Triton
    path of a call it validated, recording its launches; where exactly `launches` were made
    and each maps onto src, stores them. `active`: whether anything was ever stored (an op
    skips its lookup until then, so a process on the reference backend never builds a key).
    """

    def __init__(self, capacity: int = 256, per_key: int = 4) -> None:
        self.cache = PreparedCache(capacity, per_key)
        self.active = False

    def lookup(self, key: Any, src: list, before: Any = None) -> Any:
        return self.cache.lookup(key, src, before)

    def prepare(self, key: Any, src: list, guarded: Sequence[int], run: Any,
                outs: Sequence[int], launches: int = 1) -> Any:  # fmt: skip
        """`run()`'s result. outs: the source index of each tensor of that result (a tensor,
        a tuple of tensors or Nones, or None), each an output `run` allocated (a None: one this
        call did not make, None on its hits too); `run` must compute
        nothing but its `launches` launches through `ops.launch.launch` (`cached_launch`
        records there): a path that computes otherwise (torch ops, a reference writer)
        launches fewer and is not stored."""
        g = guard_call(key, src, guarded)
        if g is None:
            return run()
        with recording() as made:
            res = run()
        if len(made) != launches:  # (another path ran; an offline capture replaced `launch`)
            return res
        self.cache.store(key, g[0], g[1], _op_call(made, src, res, tuple(outs)))
        self.active = True
        return res


def _op_call(made: list, src: list, res: Any, outs: tuple) -> _OpCall | None:
    """The `_OpCall` of a validated call's recorded launches, or None where a launch does not
    map onto the call's sources (an argument the path copied, two sources sharing memory)."""
    got = () if res is None else (res,) if isinstance(res, torch.Tensor) else tuple(res)
    if len(got) != len(outs):
        return None
    for i, t in zip(outs, got):
        src[i] = t
    launches = [PreparedLaunch.build(m, src) for m in made]
    if any(p is None for p in launches):
        return None
    e = _OpCall()
    e.launches = tuple(launches)
    e.fast = all(p.fast is not None for p in launches)
    e.inputs = tuple(sorted(set().union(*(p.sources for p in launches)) - set(outs)))
    e.aligned = pointer_residues(src, e.inputs)
    e.fresh = tuple((i, tuple(t.shape), t.stride(), t.dtype) for i, t in zip(outs, got)
                    if t is not None)  # fmt: skip
    e.n = len(src)
    first = src[e.inputs[0]] if e.inputs else got[0]
    e.device, e.index = first.device, current_device(first)
    e.ret = None if res is None else outs[0] if isinstance(res, torch.Tensor) else outs
    return e


# --------------------------------------------------------------------------------------------
# Cached launches (small ops: the launch is the op's whole host path)
# --------------------------------------------------------------------------------------------
_LAUNCHES: OrderedDict = OrderedDict()  # launch key -> PreparedLaunch, or None (not preparable)
MAX_LAUNCHES = 512


def _launch_key(kernel: Any, args: tuple, kwargs: dict, tensors: list) -> tuple | None:
    """The key of a launch (every value Triton specializes on and a frozen launch inlines):
    the kernel, the current CUDA device, each non-tensor argument's type and value, each
    tensor's dtype and 16-byte residue (its pointer is the call's: appended to `tensors`);
    None where an argument is another object (a descriptor, a tuple)."""
    key: list = [kernel, _cuda_device()]
    for a in args:
        if isinstance(a, torch.Tensor):
            tensors.append(a)
            key.append((a.dtype, a.data_ptr() & 15))
        elif a is None or type(a) in (int, float, bool, str):
            key.append((type(a), a))
        else:
            return None
    for k, v in kwargs.items():
        if isinstance(v, torch.Tensor):
            tensors.append(v)
            key.append((k, v.dtype, v.data_ptr() & 15))
        elif v is None or type(v) in (int, float, bool, str):
            key.append((k, type(v), v))
        else:
            return None
    return tuple(key)


def cached_launch(kernel: Any, grid: tuple, *args: Any, **kwargs: Any) -> None:
    """`ops.launch.launch(kernel, grid, *args, **kwargs)` through a frozen launch per key
    (`_launch_key`: the kernel, the device, every int / float / bool / str / None argument's
    value, every tensor's dtype and 16-byte residue): the first launch of a key runs `launch`
    and freezes it (`PreparedLaunch`), later ones hand the compiled launcher the tensors'
    pointers and the call's grid, skipping Triton's binder. For ops whose launch is their
    host path (the fused layer ops, `store_kv`): no per-op key to write, and one that is
    right by construction, since everything a launch inlines is in it. `launch` itself runs
    where the kernel is not compiled (Triton's interpreter), while `ops.launch.recording` is
    active (a prepared op records its launches), while a Triton launch hook is registered,
    and for a key whose launch cannot be frozen (scratch memory, an object argument). At
    most MAX_LAUNCHES keys are kept (the oldest dropped)."""
    if (
        not _fast_path(kernel, grid)
        or getattr(_RECORD, "launches", None) is not None
        or not hooks_idle()
    ):
        launch(kernel, grid, *args, **kwargs)
        return
    tensors: list = []
    key = _launch_key(kernel, args, kwargs, tensors)
    if key is None:
        launch(kernel, grid, *args, **kwargs)
        return
    e = _LAUNCHES.get(key, MISS)
    if e is MISS:
        with recording() as made:
            launch(kernel, grid, *args, **kwargs)
        e = None
        if len(made) == 1 and made[0].compiled is not None:
            e = PreparedLaunch.build(made[0], tensors)
            e = e if e is not None and e.fast is not None else None
        _LAUNCHES[key] = e
        while len(_LAUNCHES) > MAX_LAUNCHES:
            _LAUNCHES.popitem(last=False)
        return
    if e is None:
        launch(kernel, grid, *args, **kwargs)
        return
    g = tuple(grid) + (1,) * (3 - len(grid))
    e.fast(_cuda_stream(key[1]), [t.data_ptr() for t in tensors], g)


# --------------------------------------------------------------------------------------------
# Workspaces
# --------------------------------------------------------------------------------------------
_WORKSPACES: dict = {}  # (device, stream) -> (tensor, numel, data pointer), oldest first


def workspace(device: torch.device, stream: int, numel: int) -> tuple[torch.Tensor, int]:
    """(a float32 tensor of at least `numel` elements on `device`, its data pointer), reused by
    every caller on the same (device, stream); its contents are garbage. See the module
    docstring for the rule. Not for use while the stream captures a CUDA graph."""
    key = (device, stream)
    w = _WORKSPACES.get(key)
    if w is None or w[1] < numel:
        t = torch.empty(max(numel, 1), dtype=torch.float32, device=device)
        _WORKSPACES.pop(key, None)
        w = _WORKSPACES[key] = (t, t.numel(), t.data_ptr())
        while len(_WORKSPACES) > MAX_WORKSPACES:
            del _WORKSPACES[next(iter(_WORKSPACES))]
    return w[0], w[2]


def release_workspaces() -> None:
    """Drop every cached workspace (memory returns to the caching allocator)."""
    _WORKSPACES.clear()


# --------------------------------------------------------------------------------------------
# Semaphores
# --------------------------------------------------------------------------------------------
_SEMAPHORES: dict = {}  # (device, stream) -> int32 tensor, zero between launches
_RETIRED: list = []  # replaced semaphore tensors: kept, since a captured graph may read them
SEMAPHORE_MIN = 1024 * 64  # counters a first tensor holds (256 KB): rows x KV heads


def semaphores(device: torch.device, stream: int, numel: int) -> torch.Tensor:
    """An int32 tensor of at least `numel` counters on `device`, every one 0 whenever no launch
    that counts on it is in flight.

    Rule: a kernel that counts on it (the balanced decode's fused merge) sets each counter it
    raised back to 0 before it exits, so launches ordered on one stream may share one; the
    calls on one (device, stream) share theirs, launches on two streams (two micro-batches
    overlapped) get two (on a CPU, where Triton's interpreter runs a launch, one a thread).
    That tensor is made, and zeroed, outside CUDA graph capture, and never freed while the
    process lives (a graph's replay may read it; a larger one replaces it for new calls).
    While a stream without one captures a graph, each call gets a fresh tensor of zeros from
    the graph's pool instead: its zero fill is captured with it (a memset node a call), so
    every replay starts from zeros; warming the call up eagerly on the capture stream first
    (PyTorch's practice) makes the stream's tensor and leaves that node out."""
    # (no stream orders a CPU launch under Triton's interpreter: one tensor a thread there)
    key = (device, stream) if device.type == "cuda" else (device, threading.get_ident())
    t = _SEMAPHORES.get(key)
    if t is not None and t.numel() >= numel:
        return t
    if device.type == "cuda" and _cuda_capturing():
        return torch.zeros(max(numel, 1), dtype=torch.int32, device=device)
    if t is not None:
        _RETIRED.append(t)
    t = _SEMAPHORES[key] = torch.zeros(max(numel, SEMAPHORE_MIN), dtype=torch.int32, device=device)
    return t
