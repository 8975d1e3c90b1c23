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
      as `tl.log` (NumPy's log; on the GPU it is CUDA's logf, which torch's log also is)."""
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
    builder.create_dot = patched_dot
    builder.cast_impl = patched_cast
    builder.create_fp_to_fp = patched_fp_to_fp
    interpreter._pagedattn_shim = True


install_interpreter_shim()
