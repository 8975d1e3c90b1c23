"""Reference of the fused FP8 MLA decode branch (seed `mla_decode_branch_fp8`), in MAX's order:

  1. q_nope [tokens, h_q, qk_nope] @ w_uk -> q_latent [tokens, h_q, kv_lora_rank] (fp8_bmm,
     per head: w_uk[h] is [kv_lora_rank, qk_nope] e4m3 with block scales);
  2. RoPE of q_rope and of the new tokens' k_rope, RMSNorm(kv_norm_gamma, epsilon) of the new
     tokens' latent, both at absolute position cache_length(b) + i; the normed latent and the
     roped k_rope are written in place into the cache at cache_length(b) + i (`store_kv`, so
     every FP8 cache format is quantized its own way);
  3. q_full = concat(q_latent, roped q_rope) [tokens, h_q, d_qk];
  4. raw = mla_decode(q_full, cache) [tokens, h_q, d_v] (dense or sparse, extra cache, sink,
     split-K);
  5. out = raw @ w_uv -> [tokens, h_q, v_head_dim] (fp8_bmm, w_uv[h] is [v_head_dim, d_v]).

Intermediates (q_latent, roped q_rope, raw) are rounded to q.dtype, as MAX's kernel keeps them.
Plain torch, fp32 math, any device; composes the reference ops only.
"""

from __future__ import annotations

import torch

from ...cache.inputs import KVCacheInputsPerDevice
from ...cache.params import KVCacheParams
from ...operands import PagedOperand, RowOperand
from ..linear.reference import fp8_bmm_reference, rmsnorm, rope
from ..mla.reference import host_offsets, mla_decode_reference
from ..store_kv import store_kv
from ..store_kv.reference import token_batch_and_pos


def branch_num_partitions(
    num_partitions: int | None, kv_inputs: KVCacheInputsPerDevice
) -> int | None:
    """Step 4's split-K partitions: `num_partitions`; when None, the first value of
    kv_inputs.mla_num_partitions (a host tensor) if present, else None (the decode's default)."""
    if num_partitions is None and kv_inputs.mla_num_partitions is not None:
        return int(kv_inputs.mla_num_partitions.reshape(-1)[0])
    return num_partitions


def mla_decode_branch_fp8_reference(
    q: torch.Tensor,
    input_row_offsets: torch.Tensor,
    freqs_cis: torch.Tensor,
    kv_norm_gamma: torch.Tensor,
    kv_inputs: KVCacheInputsPerDevice,
    params: KVCacheParams,
    layer_idx: int,
    *,
    scale: float,
    epsilon: float,
    w_uk: torch.Tensor,
    w_uk_scale: torch.Tensor,
    w_uv: torch.Tensor,
    w_uv_scale: torch.Tensor,
    new_kv: torch.Tensor,
    k_gran: int = 128,
    n_gran: int = 128,
    causal: bool = True,
    interleaved_rope: bool = True,
    d_indices: torch.Tensor | None = None,
    topk_lengths: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_kv: RowOperand | None = None,
    extra_d_indices: torch.Tensor | None = None,
    extra_topk_lengths: torch.Tensor | None = None,
    num_partitions: int | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """The branch in plain torch (arguments already validated by `mla_decode_branch_fp8`,
    with `mask` resolved to `causal`). Writes the new tokens into the cache; returns
    out [tokens, h_q, v_head_dim] in q.dtype."""
    tokens = q.shape[0]
    nope = w_uk.shape[2]
    rank = params.head_dim - params.mla_rope_dim
    d_v = w_uv.shape[2]
    host_offsets(input_row_offsets, tokens, "input_row_offsets")  # before anything is written
    _, pos = token_batch_and_pos(input_row_offsets, kv_inputs.cache_lengths, tokens)

    # 1. q_nope @ w_uk (per head): [h_q, tokens, nope] x [h_q, rank, nope] -> [h_q, tokens, rank]
    q_latent = fp8_bmm_reference(
        q[..., :nope].transpose(0, 1),
        w_uk,
        w_uk_scale,
        k_gran=k_gran,
        n_gran=n_gran,
        out_dtype=q.dtype,
    ).transpose(0, 1)

    # 2. RoPE (q and the new k_rope), RMSNorm of the new latent, written in place.
    q_rope = rope(q[..., nope:], freqs_cis, pos, interleaved=interleaved_rope)
    latent = rmsnorm(new_kv[..., :rank], kv_norm_gamma, epsilon)
    k_rope = rope(new_kv[..., rank:], freqs_cis, pos, interleaved=interleaved_rope)
    row = torch.cat([latent, k_rope], dim=-1).to(params.dtype)
    store_kv(row, None, kv_inputs, params, layer_idx, input_row_offsets, backend="reference")

    # 3. concat
    q_full = torch.cat([q_latent, q_rope], dim=-1)

    # 4. MLA decode over the cache (now holding the new tokens)
    raw, _ = mla_decode_reference(
        q_full,
        PagedOperand(kv_inputs, params, layer_idx, "k"),
        input_row_offsets,
        d_v=d_v,
        scale=scale,
        causal=causal,
        indices=d_indices,
        topk_lengths=topk_lengths,
        extra_kv=extra_kv,
        extra_indices=extra_d_indices,
        extra_topk_lengths=extra_topk_lengths,
        attn_sink=attn_sink,
        num_partitions=branch_num_partitions(num_partitions, kv_inputs),
    )

    # 5. raw @ w_uv (per head): [h_q, tokens, d_v] x [h_q, v_head_dim, d_v]
    res = fp8_bmm_reference(
        raw.transpose(0, 1), w_uv, w_uv_scale, k_gran=k_gran, n_gran=n_gran, out_dtype=q.dtype
    ).transpose(0, 1)
    if out is None:
        return res.contiguous()
    out.copy_(res)
    return out
