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

NaN and inf (docs/ops.md, "NaN and inf"): step 4 follows `mla_decode`'s rule. A NaN or inf in
a row's q_nope makes its whole q_latent NaN (step 1 quantizes it to NaN), one in a new token's
latent makes its whole normed row NaN (step 2), and step 5 turns a decode row holding a NaN
into a NaN output row; rows that attend no NaN stay finite.
"""

from __future__ import annotations

import torch

from ..linear.reference import fp8_bmm_reference, rmsnorm, rope
from ..mla.reference import host_offsets, mla_decode_reference
from ..store_kv import store_kv
from ..store_kv.reference import token_batch_and_pos
from .args import BranchArgs


def mla_decode_branch_fp8_reference(a: BranchArgs) -> torch.Tensor:
    """The branch in plain torch (arguments validated by `mla_decode_branch_fp8`). Writes the
    new tokens into the cache; returns out [tokens, h_q, v_head_dim] in q.dtype."""
    q, offsets, kv_inputs, params = a.q, a.input_row_offsets, a.kv_inputs, a.params
    tokens = q.shape[0]
    nope, rank = a.qk_nope_dim, a.kv_lora_rank
    gran = dict(k_gran=a.k_gran, n_gran=a.n_gran, out_dtype=q.dtype)
    host_offsets(offsets, tokens, "input_row_offsets")  # before anything is written
    _, pos = token_batch_and_pos(offsets, kv_inputs.cache_lengths, tokens)

    # 1. q_nope @ w_uk (per head): [h_q, tokens, nope] x [h_q, rank, nope] -> [h_q, tokens, rank]
    q_latent = fp8_bmm_reference(q[..., :nope].transpose(0, 1), a.w_uk, a.w_uk_scale, **gran)
    q_latent = q_latent.transpose(0, 1)

    # 2. RoPE (q and the new k_rope), RMSNorm of the new latent, written in place.
    q_rope = rope(q[..., nope:], a.freqs_cis, pos, interleaved=a.interleaved_rope)
    latent = rmsnorm(a.new_kv[..., :rank], a.kv_norm_gamma, a.epsilon)
    k_rope = rope(a.new_kv[..., rank:], a.freqs_cis, pos, interleaved=a.interleaved_rope)
    row = torch.cat([latent, k_rope], dim=-1).to(params.dtype)
    store_kv(row, None, kv_inputs, params, a.layer_idx, offsets, backend="reference")

    # 3. concat
    q_full = torch.cat([q_latent, q_rope], dim=-1)

    # 4. MLA decode over the cache (now holding the new tokens)
    raw, _ = mla_decode_reference(
        q_full,
        a.cache(),
        offsets,
        **a.decode_kwargs(),
        num_partitions=a.decode_num_partitions(),
    )

    # 5. raw @ w_uv (per head): [h_q, tokens, d_v] x [h_q, v_head_dim, d_v]
    res = fp8_bmm_reference(raw.transpose(0, 1), a.w_uv, a.w_uv_scale, **gran).transpose(0, 1)
    if a.out is None:
        return res.contiguous()
    a.out.copy_(res)
    return a.out


__all__ = ["mla_decode_branch_fp8_reference"]
