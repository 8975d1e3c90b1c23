"""Prepared launches: an op's validate-and-plan once per call signature, then launches of
already-specialized kernels with no re-validation (DESIGN.md section 4b, "the host path").

An op that uses this module (`ops.mha.triton_mha.PreparedMHA`) splits each eager call in two:
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
  strides, batch, mask parameter, scale: functions of the guarded key); every pointer
  argument is taken from the call (`PreparedLaunch` maps each to one of the op's call
  tensors, its "sources"), never cached. A launch whose pointer does not map to exactly one
  source (an argument the op derived with an offset or a copy, two sources sharing memory), a
  tensor descriptor, a callable grid or a cluster launch is not prepared: the op keeps its
  full path for that signature.
- Values that only the host can check (offsets, cache lengths, page-table reach) are checked
  by the ops' references on the CPU; the CUDA path never reads them, cached or not.

`PreparedLaunch` runs on CUDA through the launcher of the Triton `CompiledKernel` that the
recorded launch ran (Triton's binder and `JITFunction.run` skipped: ~11-22 us and 9-20 us of
an eager launch on an H100 host, docs/kernels/launch.md): the arguments go as one call whose
constants are inlined (generated once per launch, like Triton's own binder), pointers as ints
(the launcher then skips `data_ptr()` and `cuPointerGetAttribute` for each). A registered
Triton launch hook, or a kernel that needs global / profile scratch, takes the compiled
kernel's `run` with its launch metadata instead. Under Triton's interpreter (CPU runs) a
prepared launch calls `kernel[grid](...)` with the call's tensors, so that CPU tests run the
hit path end to end.

`workspace(device, stream, numel)`: a float32 scratch tensor reused by the calls on one
stream (split-K partials). Rule: a workspace belongs to one (device, stream); two calls
in flight on that stream are ordered by it, so they may share it; calls on different streams
get different workspaces; while the stream is being captured into a CUDA graph the op
allocates fresh buffers instead (the graph's private pool owns them, and no later eager call
can overwrite memory a replay reads). At most `MAX_WORKSPACES` are kept (the oldest dropped;
the caching allocator returns a dropped one to its stream's pool, so work still in flight on
that stream is safe).

Bounds: `PreparedCache` keeps at most `capacity` keys (least recently used dropped) and
`per_key` guarded entries under one key. No tuning state lives here: a prepared launch is
the frozen result of the op's own plan.
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

import torch

from .launch import Launched, _fast_path

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


# --------------------------------------------------------------------------------------------
# Prepared launches
# --------------------------------------------------------------------------------------------
def _match_source(arg: torch.Tensor, sources: Sequence[torch.Tensor | None]) -> int | None:
    """The index of the source `arg` is (by identity: the first), else of the one source whose
    data pointer it shares (an op hands its kernels its sources, or views of them from their
    first element: a reshape, a dtype view); None when none or several different objects
    match."""
    for i, s in enumerate(sources):
        if s is arg:
            return i
    p = arg.data_ptr()
    found: int | None = None
    for i, s in enumerate(sources):
        if s is not None and s.data_ptr() == p:
            if found is not None and sources[found] is not s:
                return None
            if found is None:
                found = i
    return found


def hooks_idle() -> bool:
    """No Triton launch hook is registered (a profiler's needs each launch's metadata, which
    `PreparedLaunch.run` passes and `fast` does not)."""
    rt = knobs.runtime
    e, x = rt.launch_enter_hook, rt.launch_exit_hook
    e_idle = e is None or (type(e) is HookChain and not e.calls)
    return e_idle and (x is None or (type(x) is HookChain and not x.calls))


def _literal(v: Any) -> str | None:
    """Python source that evaluates to exactly `v` (ints, bools, None, finite floats, strs),
    else None."""
    t = type(v)
    if v is None or t is bool or t is int or t is str:
        return repr(v)
    if t is float and v == v and v not in (float("inf"), float("-inf")):
        return repr(v)  # round-trips exactly
    return None


class PreparedLaunch:
    """One recorded launch, frozen: kernel, grid, constexprs and scalar arguments fixed; its
    pointer arguments taken from the call's sources.

    `run(stream, P, S, grid=None)`: P[i] the data pointer (int) of source i, S[i] the source
    tensor itself. Compiled launches read P only (their grid is fixed); interpreted ones
    (Triton's interpreter, CPU) read S and take `grid` where the op's grid depends on host
    values. `fast(stream, P)`: the compiled launch straight into Triton's C launcher, for
    callers that checked `hooks_idle()` (None where the launcher needs scratch memory, and
    for interpreted launches). `sources`: the source indices the launch reads. Build with
    `PreparedLaunch.build`."""

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
    def build(cls, rec: Launched, sources: Sequence[torch.Tensor | None]) -> PreparedLaunch | None:
        """The prepared form of `rec` (a launch `ops.launch.launch` made during the op's full
        path) whose tensor arguments each come from one of `sources` (the call's tensors, None
        where absent), or None where it cannot be prepared (see the module docstring)."""
        grid = rec.grid
        if rec.cluster != 1 or rec.smem_args:
            return None
        if not isinstance(grid, tuple) or not 1 <= len(grid) <= 3:
            return None
        if not all(type(g) is int for g in grid):
            return None
        if _fast_path(rec.kernel, grid):
            if rec.compiled is None:
                return None
            return cls._compiled(rec, sources)
        return cls._interpreted(rec, sources)

    @classmethod
    def _interpreted(cls, rec: Launched, sources) -> PreparedLaunch | None:
        slots = []  # (source index or None, dtype to view it as or None, fixed value)
        for a in rec.args:
            if isinstance(a, torch.Tensor):
                i = _match_source(a, sources)
                if i is None:
                    return None
                slots.append((i, a.dtype if a.dtype != sources[i].dtype else None, None))
            elif type(a) in (int, float, bool) or a is None:
                slots.append((None, None, a))
            else:
                return None
        if any(isinstance(v, torch.Tensor) for v in rec.kwargs.values()):
            return None
        kernel, kwargs, fixed = rec.kernel, dict(rec.kwargs), rec.grid

        def run(stream, P, S, grid=None):
            args = [
                v if i is None else (S[i] if view is None else S[i].view(view))
                for i, view, v in slots
            ]
            kernel[fixed if grid is None else grid](*args, **kwargs)

        used = tuple(sorted({i for i, _, _ in slots if i is not None}))
        return cls(run, used, False, kernel, fixed)

    @classmethod
    def _compiled(cls, rec: Launched, sources) -> PreparedLaunch | None:
        from triton.runtime.driver import driver

        ck = rec.compiled
        binder = rec.kernel.device_caches[driver.active.get_current_device()][4]
        bound, spec, _ = binder(*rec.args, **rec.kwargs)  # Triton's own: what `run` passes
        launcher = ck.run  # loads the module and makes the launcher where not yet done
        direct = None
        if (
            getattr(launcher, "global_scratch_size", 1) == 0
            and getattr(launcher, "profile_scratch_size", 1) == 0
            and hasattr(launcher, "launch")
        ):
            direct = (launcher.launch, launcher.launch_cooperative_grid, launcher.launch_pdl)
        return cls.generated(
            list(bound.values()), [ty for ty, _ in spec], sources, rec.grid, rec.kernel, ck,
            direct,
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
    ) -> PreparedLaunch | None:
        """The compiled form: every parameter's value (`values`, Triton's bound arguments in
        parameter order) and its specialized type (`types`: "*bf16", "i32", "constexpr", ...)
        as one generated call of the launcher. direct: (the C launcher, cooperative grid,
        PDL) where it can be called as is (no scratch to allocate), else None (`ck.run`).
        `ck`: the CompiledKernel (its function handle, packed metadata, `run`)."""
        parts, ns, used = [], {}, set()
        for j, (v, ty) in enumerate(zip(values, types)):
            if isinstance(v, torch.Tensor):
                if not (isinstance(ty, str) and ty.startswith("*")):
                    return None
                i = _match_source(v, sources)
                if i is None:
                    return None
                used.add(i)
                parts.append(f"P[{i}]")
                continue
            if ty != "constexpr" and type(v) not in (int, float, bool):
                return None  # a tensor descriptor or another object the launcher unpacks
            lit = _literal(v)
            if lit is None:
                ns[f"_c{j}"] = v
                lit = f"_c{j}"
            parts.append(lit)
        g = tuple(grid) + (1,) * (3 - len(grid))
        args_src = ", ".join(parts)
        ns.update(_ck=ck, _fn=ck.function, _meta=ck.packed_metadata, _grid=g, _rt=knobs.runtime)
        src = (
            "def run(stream, P, S=None, grid=None):\n"
            f"    a = ({args_src}{',' if parts else ''})\n"
            "    _ck.run(_grid[0], _grid[1], _grid[2], stream, _fn, _meta,\n"
            "            _ck.launch_metadata(_grid, stream, *a),\n"
            "            _rt.launch_enter_hook, _rt.launch_exit_hook, *a)\n"
        )
        if direct is not None:
            ns.update(_go=direct[0], _coop=bool(direct[1]), _pdl=bool(direct[2]))
            src += (
                "def fast(stream, P):\n"
                f"    _go({g[0]}, {g[1]}, {g[2]}, stream, _fn, _coop, _pdl, None, None, _meta, "
                f"None, None, None, {args_src})\n"
            )
        name = getattr(ck, "name", "kernel")
        exec(compile(src, f"<prepared launch of {name}>", "exec"), ns)
        return cls(ns["run"], tuple(sorted(used)), True, kernel, grid, ns.get("fast"))


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
