"""Workarounds for Triton 3.6's interpreter (TRITON_INTERPRET=1, how CI runs the kernels on a
CPU). Compiled kernels are untouched. Every Triton module of pagedattn imports this first."""

from __future__ import annotations

import triton.language as tl

from .. import env


def install_interpreter_shim() -> None:
    """Work around these bugs of Triton 3.6's interpreter (TRITON_INTERPRET=1 only; no effect on
    compiled kernels):
    - it turns a scalar tensor into a Python int with `int(array)`, which NumPy >= 2.4 refuses
      for its 1-element arrays, so any loop bound read from memory fails;
    - `tl.dot` on bfloat16 multiplies the raw uint16 bit patterns; widen them to float32 first
      (exact, and what the tensor cores do with bf16 inputs and an f32 accumulator);
    - float32 -> bfloat16 casts truncate; round to nearest even as the GPU does;
    - float <-> fp8 casts mis-round ties and subnormals and lose NaN; convert through torch
      (round to nearest even, as `cvt.rn.satfinite` does for finite values);
    - `libdevice`'s functions are not interpreted (they return None); `libdevice.log` runs
      as `tl.log` (NumPy's log; on the GPU it is CUDA's logf, which torch's log also is).

    It also makes the interpreter cheaper, without changing a result:
    - the language patching (`_fast_patch_lang`): the same patches, found without scanning
      every member of `triton.language` at each call of a `@triton.jit` helper (a third of an
      interpreted kernel's time before);
    - no int32 overflow checks: the interpreter checked every int32 +, - and * for overflow
      (Triton's `sanitize_overflow`: each op again in int64, and a device assert), which a
      compiled kernel does only in Triton's debug mode, and which took a quarter of an
      interpreted kernel's time (`tests/test_mla_worklist.py`'s one-request case, 2-core CPU).
      `PAGEDATTN_INTERPRET_OVERFLOW=1` keeps them (to look for an int32 overflow at a CPU
      test's shapes)."""
    if not env.triton_interpreter():
        return
    import numpy as np
    from triton.runtime import interpreter

    if getattr(interpreter, "_pagedattn_shim", False):
        return
    from triton.language.extra import libdevice

    libdevice.log = lambda x, _semantic=None: tl.log(x)
    patch_tensor = interpreter._patch_lang_tensor

    def patched_tensor(tensor, scope):
        patch_tensor(tensor, scope)
        scope.set_attr(tensor, "__index__", lambda self: int(self.handle.data.reshape(-1)[0]))

    builder = interpreter.InterpreterBuilder
    create_dot = builder.create_dot

    def widen(h):
        if h.dtype.scalar != tl.bfloat16:
            return h
        bits = h.data.astype(np.uint32) << np.uint32(16)
        return interpreter.TensorHandle(bits.view(np.float32), tl.float32)

    def patched_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        return create_dot(self, widen(a), widen(b), d, input_precision, max_num_imprecise_acc)

    cast_impl = builder.cast_impl

    def patched_cast(self, src, dst_type):
        if src.dtype.scalar == tl.float32 and dst_type.scalar == tl.bfloat16:
            bits = np.ascontiguousarray(src.data, dtype=np.float32).view(np.uint32)
            rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> 16
            nan = np.isnan(src.data)
            out = np.where(nan, (bits >> 16) | np.uint32(0x40), rounded).astype(np.uint16)
            return interpreter.TensorHandle(out, tl.bfloat16)
        return cast_impl(self, src, dst_type)

    fp_to_fp = builder.create_fp_to_fp
    fp8 = {tl.float8e4nv: "float8_e4m3fn", tl.float8e5: "float8_e5m2"}
    np_float = {tl.float32: np.float32, tl.float16: np.float16}

    def patched_fp_to_fp(self, src, dst_type, rounding_mode):
        import torch

        s_ty, d_ty = src.dtype.scalar, dst_type.scalar
        if s_ty not in fp8 and d_ty not in fp8:
            return fp_to_fp(self, src, dst_type, rounding_mode)
        if s_ty in fp8:
            t = torch.from_numpy(np.ascontiguousarray(src.data).view(np.uint8).copy())
            t = t.view(getattr(torch, fp8[s_ty])).float()
        else:
            t = torch.from_numpy(
                widen(src).data.astype(np.float32)
                if s_ty == tl.bfloat16
                else src.data.astype(np.float32)
            )
        if d_ty in fp8:
            out = t.to(getattr(torch, fp8[d_ty])).view(torch.uint8).numpy()
            return interpreter.TensorHandle(out, d_ty)
        f32 = interpreter.TensorHandle(t.numpy(), tl.float32)
        if d_ty == tl.float32:
            return f32
        if d_ty in np_float:
            return interpreter.TensorHandle(t.numpy().astype(np_float[d_ty]), d_ty)
        return patched_cast(self, f32, dst_type)

    interpreter._patch_lang_tensor = patched_tensor
    interpreter._patch_lang = _fast_patch_lang(interpreter)
    if env.read("INTERPRET_OVERFLOW") != "1":
        import dataclasses

        opts = dataclasses.replace(interpreter.interpreter_builder.options, sanitize_overflow=False)
        interpreter.interpreter_builder.options = opts
    builder.create_dot = patched_dot
    builder.cast_impl = patched_cast
    builder.create_fp_to_fp = patched_fp_to_fp
    interpreter._pagedattn_shim = True


def _fast_patch_lang(interpreter):
    """Triton 3.6's `interpreter._patch_lang`, equivalent and cheaper. The interpreter calls it
    at each kernel launch and at each call of a `@triton.jit` helper inside one; each call ran
    `inspect.getmembers` over `tl`, `tl.tensor`, `tl.math` and `tl.core.tensor_descriptor_base`
    (~0.2 ms each) and `inspect.ismodule` over the function's globals, to patch the members that
    are still Triton builtins (inside a launch they already are patched: a helper's call patches
    nothing). Here the builtin members' names of each of those packages are listed once,
    before any launch patches them, and each call patches those of them that are still
    builtins, through the interpreter's own `_patch_attr`: the same patches in the same scope.
    Measured on a 2-core CPU: test_mha_worklist's split-rows cases 45.7 -> 31.0 s."""
    import inspect

    is_builtin = tl.core.is_builtin
    names: dict[int, tuple[str, ...]] = {}

    def builtin_names(pkg) -> tuple[str, ...]:
        got = names.get(id(pkg))
        if got is None:
            got = names[id(pkg)] = tuple(n for n, m in inspect.getmembers(pkg) if is_builtin(m))
        return got

    def patch_builtin(pkg, builder, scope) -> None:
        for name in builtin_names(pkg):
            member = getattr(pkg, name)
            if is_builtin(member):
                interpreter._patch_attr(pkg, name, member, builder, scope)

    for pkg in (tl, tl.tensor, tl.math, tl.core, tl.core.tensor_descriptor_base):
        builtin_names(pkg)  # (now, while nothing is patched)
    langs_of: dict[int, tuple] = {}

    def patch_lang(fn):
        scope = interpreter._LangPatchScope()
        g = fn.__globals__
        langs = langs_of.get(id(g))
        if langs is None:  # (a module's globals: its imports of tl / tl.core are made once)
            langs = tuple(v for v in g.values() if inspect.ismodule(v) and v in (tl, tl.core))
            langs_of[id(g)] = langs
        assert langs, "triton.language must be visible from within jit'd function"
        builder = interpreter.interpreter_builder
        for lang in langs:
            patch_builtin(lang, builder, scope)
            patch_builtin(lang.tensor, builder, scope)
            if lang == tl:
                patch_builtin(lang.math, builder, scope)
            interpreter._patch_lang_tensor(lang.tensor, scope)
            interpreter._patch_lang_core(lang, scope)
        patch_builtin(tl.core.tensor_descriptor_base, builder, scope)
        return scope

    return patch_lang


install_interpreter_shim()
