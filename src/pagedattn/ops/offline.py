"""Offline compiles for sm_90, on any machine (no GPU, no CUDA driver): the specialization that
a kernel launch would compile on an H100, built from the launch's own arguments.

- `capture(module, call, **patches)`: run `call` with `module.launch` (`ops.launch.launch`;
  a tuple of modules: each one's) recording instead of launching, and the module's attributes
  named in `patches` replaced meanwhile -> the `Launch`es it made, in order. CPU tensors will
  do: nothing is launched. The device checks are the caller's patches; PDL's, which several
  modules import, is `ops.pdl.pdl_as_on_sm90` (a capture inside it gets the PDL arguments a
  GPU launch gets).
- `specialize(launch)`: (source, options) from Triton's own binder for a CUDA sm_90 target,
  as `JITFunction.run` builds them on the GPU: argument types, 16-byte alignment, ints equal
  to 1 as constants.
- `front_end(launch)`: the source's TTIR only, the step where a kernel's Python-level errors
  show (a wrong type, a None result, a shape mismatch); 0.1-0.5 s a kernel.
- `compile_sm90(launch)`: `triton.compile` of it for sm_90 -> Triton's CompiledKernel (asm:
  ttgir, ptx, cubin; metadata.shared), ptxas included: seconds a kernel.
- `cache_hash(launch)`: the hash of Triton's cache key of that compile (what the compiled
  kernel's `.hash` is), without compiling: on an H100 it equals the hash of the kernel the
  launch runs (a GPU test checks it).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

SM90 = ("cuda", 90, 32)  # GPUTarget(backend, arch, warp size)


@dataclass
class Launch:
    """One intercepted `launch(kernel, grid, *args, cluster=, smem_args=, **kwargs)`."""

    kernel: Any
    grid: tuple
    args: tuple
    kwargs: dict = field(default_factory=dict)
    cluster: int = 1

    @property
    def name(self) -> str:
        return self.kernel.fn.__name__ if hasattr(self.kernel, "fn") else repr(self.kernel)


def capture(module: Any, call: Callable[[], Any], **patches: Any) -> list[Launch]:
    """The launches `call()` makes through `module.launch`, none of them run, in launch order;
    `module` may be a tuple of modules (an op and the modules of its other kernels: a combine,
    a planner), each one's `launch` recorded. `patches` replace the (first) module's
    attributes of those names while it runs (all are restored after)."""
    made: list[Launch] = []
    modules = module if isinstance(module, tuple) else (module,)

    def record(kernel, grid, *args, cluster=1, smem_args=None, min_shared=0, **kwargs):
        # smem_args' arguments keep their defaults in args: the compiled specialization's
        made.append(Launch(kernel, tuple(grid), args, dict(kwargs), cluster))

    swaps = [(m, "launch", record) for m in modules]
    swaps += [(modules[0], n, v) for n, v in patches.items()]
    saved = [(m, n, getattr(m, n)) for m, n, _ in swaps]
    for m, n, v in swaps:
        setattr(m, n, v)
    try:
        call()
    finally:
        for m, n, v in reversed(saved):
            setattr(m, n, v)
    return made


@functools.cache
def _backend() -> tuple[Any, Any]:
    """(GPUTarget, Triton's compiler backend) of sm_90, made once."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend

    target = GPUTarget(*SM90)
    return target, make_backend(target)


def _options(src: Any, options: dict) -> Any:
    """The backend's parsed options of a compile of `src`, as `triton.compile` makes them."""
    return _backend()[1].parse_options(dict(options, **src.parse_options()))


def specialize(launch: Launch) -> tuple[Any, dict]:
    """(ASTSource or GluonASTSource, compile options) of `launch` on an sm_90 device."""
    from triton.compiler import ASTSource
    from triton.runtime.jit import create_function_from_signature

    try:
        from triton.experimental.gluon._runtime import GluonASTSource, GluonJITFunction
    except ImportError:  # a Triton without Gluon: every kernel is a tl one
        GluonASTSource = GluonJITFunction = None
    k = launch.kernel
    backend = _backend()[1]
    binder = create_function_from_signature(k.signature, k.params, backend)
    kwargs = dict(launch.kwargs, debug=bool(getattr(k, "debug", False)), instrumentation_mode="")
    bound, spec, opts = binder(*launch.args, **kwargs)
    options, signature, constexprs, attrs = k._pack_args(backend, kwargs, bound, spec, opts)
    source = GluonASTSource if GluonJITFunction and isinstance(k, GluonJITFunction) else ASTSource
    return source(k, signature, constexprs, attrs), options.__dict__


def front_end(launch: Launch) -> Any:
    """The TTIR module of `launch`'s kernel for sm_90 (raises the kernel's CompilationError)."""
    from triton._C.libtriton import ir

    src, options = specialize(launch)
    target, backend = _backend()
    opts = _options(src, options)
    context = ir.context()
    ir.load_dialects(context)
    backend.load_dialects(context)
    return src.make_ir(
        target, opts, backend.get_codegen_implementation(opts), backend.get_module_map(), context
    )


def compile_sm90(launch: Launch) -> Any:
    """Triton's CompiledKernel of `launch` for sm_90 (through Triton's on-disk cache)."""
    import triton

    src, options = specialize(launch)
    return triton.compile(src, target=_backend()[0], options=options)


def cache_hash(launch: Launch) -> str:
    """sha256 of Triton's cache key of `compile_sm90(launch)` (its CompiledKernel's `.hash`)."""
    import hashlib

    from triton._C.libtriton import get_cache_invalidating_env_vars
    from triton.runtime.cache import get_cache_key

    src, options = specialize(launch)
    opts = _options(src, options)
    key = get_cache_key(src, _backend()[1], opts, get_cache_invalidating_env_vars())
    return hashlib.sha256(key.encode("utf-8")).hexdigest()
