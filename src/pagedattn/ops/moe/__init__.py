"""Routed experts of a top-k MoE layer on the device, with no host sync (CUDA-graph safe).

A layer's experts run as:

    plan = moe_plan(topk_ids, E, block_m=moe_block_m(T * k, E))
    h = expert_matmul(x, w_gate_up, plan, activation="silu_mul")   # [T * k, I], slot rows
    y = expert_matmul(h, w_down, plan, row_weights=topk_weights, out_dtype=torch.float32)
    out = moe_sum(y, k, out_dtype=x.dtype)                         # [T, H]

- `moe_plan(topk_ids, num_experts, *, block_m=16)`: topk_ids [T, k] int32 / int64 ->
  `MoEPlan` (module `plan`): the slot rows r = t * k + s grouped by expert, in blocks of
  block_m rows (a power of two in [16, 128]), in buffers whose size depends on (T, k, E,
  block_m) only. An id outside [0, E) puts its row in a last bucket whose outputs are NaN
  (checked and refused on CPU tensors, where reading the ids costs no sync).
- `expert_matmul(x, w, plan, *, w_scale=None, w_block=(128, 128), bias=None,
  row_weights=None, activation=None, out_dtype=None)`: y [T * k, N], row r =
  act(x_r @ w[e_r]^T + bias[e_r]) * row_weights[r], with x_r = x[r // k] when x has T rows
  (the tokens) or x[r] when it has T * k (the slots). w [E, N, K] any strides (an [E, K, N]
  checkpoint layout passes `w.transpose(1, 2)`), x's float dtype, or float8_e4m3fn with
  w_scale [E, cdiv(N, n_gran), cdiv(K, k_gran)] float32 (DeepSeek's `weight_scale_inv`,
  w_block = (n_gran, k_gran), k_gran a multiple of 16): the weight is dequantized in
  registers, the activations stay in x's dtype (W8A16). activation "silu_mul": w's rows are
  [gate | up] (2 N' of them, N' = N / 2 output columns) and the output is silu(gate) * up
  [T * k, N'] (the gate_up projection and the SwiGLU in one pass over the weights). bias
  [E, N] (before the activation); row_weights [T, k] float32 (the router's weights).
  Accumulation in float32, one rounding to out_dtype (x's dtype by default, or float32); the
  reference rounds a silu_mul product to x's dtype first and combines it op by op, as
  transformers does.
- `moe_sum(y, top_k, *, out_dtype)`: [T, N], each token's k rows summed in slot order in
  float32, rounded once.
- `moe_block_m(num_rows, num_experts)`: the block the shipped tuning picks (`MoETuning`).

Backends (`ops.dispatch`): "triton" (`triton_moe`: a counting and a placing launch for the
plan, one launch a product, one for the sum) and "reference" (plain torch, float32). The two
plans are equal element for element; the products agree within float32 accumulation order
and one rounding (the reference rounds silu * up op by op, like transformers).
"""

from __future__ import annotations

import torch

from ...errors import Lazy, check, check_int
from .._checks import Described, describe, typed_binding
from ..dispatch import choose_backend
from .plan import MoEPlan, plan_capacity
from .reference import expert_matmul_reference, moe_plan_reference, moe_sum_reference
from .tuning import MatmulShape, MoETuning

FLOATS = (torch.float16, torch.bfloat16, torch.float32)
IDS = (torch.int32, torch.int64)


def moe_block_m(num_rows: int, num_experts: int) -> int:
    """Rows a plan block for `num_rows` slot rows over `num_experts` (`MoETuning.block_m`)."""
    return MoETuning.current().block_m(num_rows, num_experts)


def _triton(backend: str | None, t: torch.Tensor) -> bool:
    return choose_backend(t.device, backend) == "triton"


@typed_binding
def moe_plan(topk_ids, num_experts, *, block_m: int = 16, backend: str | None = None) -> MoEPlan:
    """The grouped layout of a routing (module docstring; `MoEPlan` has the buffers)."""
    check(
        isinstance(topk_ids, torch.Tensor) and topk_ids.ndim == 2 and topk_ids.dtype in IDS,
        "topk_ids", "a [T, k] int32 / int64 tensor", Described(topk_ids),
    )  # fmt: skip
    check(topk_ids.shape[1] >= 1, "topk_ids", "k >= 1 choices a token", Described(topk_ids))
    check_int("num_experts", num_experts, 1, 2**20)
    check_int("block_m", block_m, 16, 128)
    check(block_m & (block_m - 1) == 0, "block_m", "a power of two in [16, 128]", block_m)
    check(topk_ids.numel() < 2**30, "topk_ids", "fewer than 2^30 entries", topk_ids.numel())
    if topk_ids.device.type == "cpu" and topk_ids.numel():
        lo, hi = int(topk_ids.min()), int(topk_ids.max())
        check(lo >= 0 and hi < num_experts, "topk_ids",
              f"expert ids in [0, {num_experts})", f"ids in [{lo}, {hi}]")  # fmt: skip
    if _triton(backend, topk_ids):
        from .triton_moe import moe_plan_triton  # noqa: PLC0415

        return moe_plan_triton(topk_ids, num_experts, block_m)
    return moe_plan_reference(topk_ids, num_experts, block_m)


def _check_plan(plan: object) -> MoEPlan:
    check(isinstance(plan, MoEPlan), "plan", "a MoEPlan (moe_plan(...))", type(plan).__name__)
    return plan


def _check_tensor(name, t, shape, dtypes, device) -> None:
    check(
        isinstance(t, torch.Tensor) and tuple(t.shape) == shape and t.dtype in dtypes
        and t.device == device,
        name, Lazy(lambda: f"a {list(shape)} tensor of {[str(d) for d in dtypes]} on {device}"),
        Described(t),
    )  # fmt: skip


@typed_binding
def expert_matmul(
    x,
    w,
    plan,
    *,
    w_scale=None,
    w_block: tuple[int, int] = (128, 128),
    bias=None,
    row_weights=None,
    activation: str | None = None,
    out_dtype: torch.dtype | None = None,
    backend: str | None = None,
    tuning: MoETuning | None = None,
) -> torch.Tensor:
    """Each slot row's expert product (module docstring). Returns [T * k, N], or [T * k, N / 2]
    with silu_mul."""
    plan = _check_plan(plan)
    check(isinstance(x, torch.Tensor) and x.ndim == 2 and x.dtype in FLOATS, "x",
          "a [rows, K] float16 / bfloat16 / float32 tensor", Described(x))  # fmt: skip
    check(x.shape[0] in (plan.num_tokens, plan.num_rows), "x",
          Lazy(lambda: f"{plan.num_tokens} token rows or {plan.num_rows} slot rows"),
          Described(x))  # fmt: skip
    check(activation in (None, "silu_mul"), "activation", "None or 'silu_mul'", repr(activation))
    fp8 = w_scale is not None
    check(
        isinstance(w, torch.Tensor) and w.ndim == 3 and w.shape[0] == plan.num_experts
        and w.device == x.device and w.dtype == (torch.float8_e4m3fn if fp8 else x.dtype),
        "w", Lazy(lambda: f"[{plan.num_experts}, N, K] of "
                  f"{'float8_e4m3fn (w_scale given)' if fp8 else x.dtype} on {x.device}"),
        Described(w),
    )  # fmt: skip
    E, N, K = w.shape
    check(x.shape[1] == K, "x", f"{K} columns (w's K)", Described(x))
    check(activation is None or N % 2 == 0, "w", "an even N (gate | up rows) for silu_mul",
          Described(w))  # fmt: skip
    check(
        isinstance(w_block, tuple) and len(w_block) == 2
        and all(type(v) is int and v >= 1 for v in w_block),
        "w_block", "a tuple (n_gran, k_gran) of ints >= 1", repr(w_block),
    )  # fmt: skip
    if fp8:
        n_gran, k_gran = w_block
        check(k_gran % 16 == 0, "w_block", "k_gran a multiple of 16", repr(w_block))
        _check_tensor("w_scale", w_scale, (E, -(-N // n_gran), -(-K // k_gran)),
                      (torch.float32,), x.device)  # fmt: skip
    if bias is not None:
        _check_tensor("bias", bias, (E, N), FLOATS, x.device)
    if row_weights is not None:
        _check_tensor("row_weights", row_weights, (plan.num_tokens, plan.top_k),
                      (torch.float32,), x.device)  # fmt: skip
    check(out_dtype in (None, x.dtype, torch.float32), "out_dtype",
          f"None, {x.dtype} or torch.float32", out_dtype)  # fmt: skip
    check(plan.sorted_rows.device == x.device, "plan", f"a plan on {x.device}",
          f"one on {plan.sorted_rows.device}")  # fmt: skip
    kw = dict(w_scale=w_scale, w_block=w_block, bias=bias, row_weights=row_weights,
              activation=activation, out_dtype=out_dtype)  # fmt: skip
    if _triton(backend, x):
        from .triton_moe import expert_matmul_triton  # noqa: PLC0415

        return expert_matmul_triton(x, w, plan, tuning=tuning, **kw)
    return expert_matmul_reference(x, w, plan, **kw)


@typed_binding
def moe_sum(y, top_k: int, *, out_dtype: torch.dtype, backend: str | None = None):
    """[T, N]: each token's top_k rows of y [T * top_k, N] summed (module docstring)."""
    check_int("top_k", top_k, 1, 2**20)
    check(isinstance(y, torch.Tensor) and y.ndim == 2 and y.dtype in FLOATS
          and y.shape[0] % top_k == 0 and (y.shape[1] == 0 or y.stride(1) == 1), "y",
          f"a [T * {top_k}, N] float tensor, rows contiguous", Described(y))  # fmt: skip
    check(out_dtype in FLOATS, "out_dtype", "float16, bfloat16 or float32", describe(out_dtype))
    if _triton(backend, y):
        from .triton_moe import moe_sum_triton  # noqa: PLC0415

        return moe_sum_triton(y, top_k, out_dtype)
    return moe_sum_reference(y, top_k, out_dtype)


__all__ = [
    "MatmulShape",
    "MoEPlan",
    "MoETuning",
    "expert_matmul",
    "moe_block_m",
    "moe_plan",
    "moe_sum",
    "plan_capacity",
]
