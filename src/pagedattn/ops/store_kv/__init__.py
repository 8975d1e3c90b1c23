"""store_kv: write new tokens' K/V into a paged cache; gather_kv: read a request back."""

from __future__ import annotations

import torch

from ...cache.inputs import KVCacheInputsPerDevice
from ...cache.params import KVCacheParams
from ...errors import check
from ...operands import PagedOperand
from ..dispatch import choose_backend
from .reference import store_kv_reference


def _check_offsets(q_row_offsets: torch.Tensor, batch: int, total: int) -> None:
    check(
        isinstance(q_row_offsets, torch.Tensor)
        and q_row_offsets.dtype == torch.int32
        and q_row_offsets.shape == (batch + 1,),
        "q_row_offsets",
        f"an int32 tensor of shape ({batch + 1},)",
        q_row_offsets.shape if isinstance(q_row_offsets, torch.Tensor) else type(q_row_offsets),
    )


def store_kv(
    k_new: torch.Tensor,
    v_new: torch.Tensor | None,
    inputs: KVCacheInputsPerDevice,
    params: KVCacheParams,
    layer_idx: int,
    q_row_offsets: torch.Tensor,
    *,
    backend: str | None = None,
) -> None:
    """Write new ragged K/V into the cache at `cache_lengths[b] + i`, quantizing to the
    cache's FP8 format when it has one.

    k_new, v_new: [total_new_tokens, n_kv_heads_per_device, head_dim] (MHA) in params.dtype;
      MLA: k_new [total, 1, head_dim] (latent then rope), v_new None.
    q_row_offsets: [batch + 1] int32 prefix sums of new tokens per request.
    The pages must be allocated (PagedKVCacheManager.alloc) before.
    """
    H, D = params.n_kv_heads_per_device, params.head_dim
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        if name == "v_new" and params.is_mla:
            check(x is None, "v_new", "None for an MLA cache", type(x))
            continue
        check(
            isinstance(x, torch.Tensor) and x.ndim == 3 and tuple(x.shape[1:]) == (H, D),
            name,
            f"a [total_tokens, {H}, {D}] tensor",
            tuple(x.shape) if isinstance(x, torch.Tensor) else type(x),
        )
        check(x.dtype == params.dtype, f"{name}.dtype", str(params.dtype), x.dtype)
        check(
            x.device == inputs.kv_blocks.device,
            f"{name}.device",
            str(inputs.kv_blocks.device),
            x.device,
        )
    if v_new is not None:
        check(v_new.shape == k_new.shape, "v_new", f"shape {tuple(k_new.shape)}", v_new.shape)
    _check_offsets(q_row_offsets, inputs.batch_size, k_new.shape[0])
    k_op = PagedOperand(inputs, params, layer_idx, "k")
    v_op = None if params.is_mla else PagedOperand(inputs, params, layer_idx, "v")
    if choose_backend(k_new.device, backend) == "triton":
        from .triton_store import store_kv_triton

        store_kv_triton(k_new, v_new, k_op, v_op, q_row_offsets)
    else:
        store_kv_reference(k_new, v_new, k_op, v_op, q_row_offsets)


def gather_kv(
    inputs: KVCacheInputsPerDevice,
    params: KVCacheParams,
    layer_idx: int,
    batch_idx: int,
    num_tokens: int,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokens 0..num_tokens-1 of request `batch_idx`, dequantized, in logical order:
    (K [num_tokens, heads, head_dim], V or None for MLA). For tests and debugging."""
    check(
        0 <= batch_idx < inputs.batch_size,
        "batch_idx",
        f"in [0, {inputs.batch_size})",
        batch_idx,
    )
    cols = inputs.lookup_table.shape[1]
    check(
        0 <= num_tokens <= cols * params.page_size,
        "num_tokens",
        f"in [0, {cols * params.page_size}] (the lookup table's reach)",
        num_tokens,
    )
    k = PagedOperand(inputs, params, layer_idx, "k").gather(batch_idx, num_tokens, out_dtype)
    if params.is_mla:
        return k, None
    v = PagedOperand(inputs, params, layer_idx, "v").gather(batch_idx, num_tokens, out_dtype)
    return k, v
