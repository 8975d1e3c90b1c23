"""Hugging Face transformers' DeepSeek modules as independent references for MLA.

`DeepseekV3Attention` runs in its expanded form (kv_b_proj expands the latent into per-head K
and V; eager softmax) in float64 on a tiny random config. pagedattn computes the same step in
the absorbed form: RMSNorm + RoPE of the latent written into a paged latent cache with
`store_kv`, q_nope absorbed through kv_b_proj's K half (w_uk), `mla_decode`, and the V half
(w_uv) applied to its output, then the module's own o_proj.

DeepSeek-V3.2 (`DeepseekV32Attention`) runs the same way with its lightning indexer: the
indexer's top-k indices (captured from the module with a forward hook) become pagedattn's
sparse `indices` (`page * page_size + offset` of the same tokens; indices the module's causal
mask removes become -1), and sparse `mla_decode` must match the module's output.

Both modules run as they are on the CPU; the tiny configs keep DeepSeek's MLA geometry
(kv_lora_rank 512, rope 64, so d_qk = 576) and shrink everything else.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers.models.deepseek_v3.configuration_deepseek_v3 import (
    DeepseekV3Config,
)
from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
    DeepseekV3Attention,
    DeepseekV3RotaryEmbedding,
)
from transformers.models.deepseek_v32.configuration_deepseek_v32 import (
    DeepseekV32Config,
)
from transformers.models.deepseek_v32.modeling_deepseek_v32 import (
    DeepseekV32Attention,
    DeepseekV32RotaryEmbedding,
)

from pagedattn import KVCacheParams, PagedOperand, store_kv
from pagedattn.ops.linear import make_freqs_cis, quantize_weight_blocks, rmsnorm, rope
from pagedattn.ops.mla import mla_decode
from pagedattn.ops.mla_branch import mla_decode_branch_fp8
from pagedattn.testing import assert_close, make_paged_cache, ragged_offsets

BF16, F32, F64 = torch.bfloat16, torch.float32, torch.float64
LAYER = 0
HIDDEN, HEADS, NOPE, ROPE, V_HEAD, RANK = 64, 4, 32, 64, 32, 512
# float32 latent cache and queries vs the float64 module: a few float32 ulps of O(1) values.
F32_TOL = dict(abs_tol=2e-5, rel_tol=1e-4, cos_tol=1e-10)
# bf16 cache and queries: the attention's inputs are rounded to bf16 (2^-9) too, so the error
# is noise of ~2^-9 of the output's scale (not of each element), summed over a few hundred terms.
# Its worst element over a call: at 2^-8 of the output's largest value, 29 random seeds of each
# bf16 case used a median 0.5 and at most 0.83 of that bound (a ~0.5% chance of failing a run
# by the fitted tail), so the element bound is 2^-7 of it; the cosine bound (at most 0.24 of
# 2e-5 used) is what checks the agreement tightly.


def bf16_in_tol(ref: torch.Tensor) -> dict:
    return dict(abs_tol=2**-7 * float(ref.abs().max()), rel_tol=2 / 128, cos_tol=2e-5)


COMMON = dict(
    hidden_size=HIDDEN,
    num_attention_heads=HEADS,
    num_key_value_heads=HEADS,
    kv_lora_rank=RANK,
    qk_rope_head_dim=ROPE,
    qk_nope_head_dim=NOPE,
    v_head_dim=V_HEAD,
    num_hidden_layers=1,
    vocab_size=16,
    intermediate_size=32,
    moe_intermediate_size=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    n_group=1,
    topk_group=1,
    max_position_embeddings=256,
)


def randomize_(module: torch.nn.Module, gen: torch.Generator) -> None:
    """Fresh random float64 weights (norm weights around 1, linear weights ~ 1/sqrt(fan_in))."""
    with torch.no_grad():
        for p in module.parameters():
            if p.ndim == 1:
                p.copy_(1 + 0.2 * torch.randn(p.shape, generator=gen, dtype=F64))
            else:
                p.copy_(torch.randn(p.shape, generator=gen, dtype=F64) / p.shape[1] ** 0.5)


def causal_mask(T: int) -> torch.Tensor:
    return torch.full((T, T), float("-inf"), dtype=F64).triu(1)[None, None]


def run_module(module, rotary, h: torch.Tensor, capture_indexer: bool = False):
    """The HF module over one whole sequence h [T, hidden] (prefill, causal): output [T, hidden]
    and, for V3.2, the indexer's top-k indices [T, topk]."""
    T = h.shape[0]
    pos = torch.arange(T)[None]
    cos, sin = rotary(h[None], pos)
    captured = {}
    hook = None
    if capture_indexer:
        hook = module.indexer.register_forward_hook(
            lambda mod, args, out: captured.__setitem__("topk", out[0])
        )
    with torch.no_grad():
        out, _ = module(h[None], (cos, sin), causal_mask(T), position_ids=pos)
    if hook is not None:
        hook.remove()
    return out[0], captured.get("topk")


@dataclasses.dataclass
class Absorbed:
    """What pagedattn needs from the module's weights (float64)."""

    w_uk: torch.Tensor  # [H, nope, rank]: q_nope[h] @ w_uk[h] -> latent query
    w_uv: torch.Tensor  # [H, v_head, rank]: w_uv[h] @ latent output -> value output
    gamma: torch.Tensor  # [rank] kv_a_layernorm weight
    eps: float


def absorbed(module) -> Absorbed:
    w = module.kv_b_proj.weight.detach().view(HEADS, NOPE + V_HEAD, RANK)
    return Absorbed(
        w[:, :NOPE, :],
        w[:, NOPE:, :],
        module.kv_a_layernorm.weight.detach(),
        module.kv_a_layernorm.variance_epsilon,
    )


def queries(module, h: torch.Tensor) -> torch.Tensor:
    """[T, H, nope + rope] un-roped queries from the module's own projections."""
    with torch.no_grad():
        if getattr(module, "q_proj", None) is not None:
            q = module.q_proj(h)
        else:
            q = module.q_b_proj(module.q_a_layernorm(module.q_a_proj(h)))
    return q.view(h.shape[0], HEADS, NOPE + ROPE)


def latents(module, h: torch.Tensor) -> torch.Tensor:
    """[T, 1, rank + rope] un-normed latent and un-roped k_rope (kv_a_proj_with_mqa)."""
    with torch.no_grad():
        return module.kv_a_proj_with_mqa(h)[:, None, :]


def build_cache(dtype, page_size, cache_lens, q_lens, rows_prefix, gen):
    """MLA cache with each request's prefix rows (already normed and roped) stored."""
    params = KVCacheParams(dtype, 1, 1, RANK + ROPE, page_size, is_mla=True, num_q_heads=HEADS)
    pc = make_paged_cache(params, cache_lens, q_lens, generator=gen)
    zero = dataclasses.replace(
        pc.inputs, cache_lengths=torch.zeros(len(cache_lens), dtype=torch.int32)
    )
    store_kv(
        torch.cat(rows_prefix).to(dtype), None, zero, params, LAYER, ragged_offsets(cache_lens)
    )
    return params, pc


def normed_roped(ab: Absorbed, lat: torch.Tensor, pos: torch.Tensor, freqs, interleaved, dtype):
    """pagedattn's RMSNorm + RoPE of latent rows [n, 1, rank + rope] at positions pos."""
    latent = rmsnorm(lat[..., :RANK].to(F32), ab.gamma.to(F32), ab.eps)
    k_rope = rope(lat[..., RANK:].to(F32), freqs, pos, interleaved=interleaved)
    return torch.cat([latent, k_rope], dim=-1).to(dtype)


SEQS = [(7, 1), (12, 3), (0, 2)]  # (cached tokens, new tokens this step) per request


def cached_prefix(module, ab, hs, dtype, page_size, interleaved, gen):
    """Every request's cached tokens, normed and roped, in a fresh cache with room for the new
    ones: (freqs_cis, params, cache)."""
    cache_lens = [c for c, _ in SEQS]
    q_lens = [n for _, n in SEQS]
    freqs = make_freqs_cis(ROPE, 64, module.config.rope_parameters["rope_theta"])
    prefix = [
        normed_roped(ab, latents(module, h)[:c], torch.arange(c), freqs, interleaved, dtype)
        for h, (c, _) in zip(hs, SEQS)
    ]
    params, pc = build_cache(dtype, page_size, cache_lens, q_lens, prefix, gen)
    return freqs, params, pc


def pagedattn_step(module, ab, hs, dtype, page_size, interleaved, gen, sparse_of=None):
    """One decode step of every request with pagedattn in the absorbed form: store the new
    tokens, mla_decode (dense, or sparse with indices from `sparse_of(b, lut)`), w_uv, o_proj.
    Returns [sum(new), hidden] float64."""
    freqs, params, pc = cached_prefix(module, ab, hs, dtype, page_size, interleaved, gen)
    offsets = ragged_offsets([n for _, n in SEQS])
    new_rows, qs = [], []
    for h, (c, n) in zip(hs, SEQS):
        pos = torch.arange(c, c + n)
        new_rows.append(normed_roped(ab, latents(module, h)[c:], pos, freqs, interleaved, dtype))
        q = queries(module, h)[c:]
        q_lat = torch.einsum("thn,hnr->thr", q[..., :NOPE], ab.w_uk)
        q_rope = rope(q[..., NOPE:].to(F32), freqs, pos, interleaved=interleaved)
        qs.append(torch.cat([q_lat.to(F32), q_rope], dim=-1).to(dtype))
    store_kv(torch.cat(new_rows), None, pc.inputs, params, LAYER, offsets)
    kw = {}
    if sparse_of is not None:
        kw["indices"] = sparse_of(pc.inputs.lookup_table.tolist())
    out, _ = mla_decode(
        torch.cat(qs),
        PagedOperand(pc.inputs, params, LAYER, "k"),
        offsets,
        scale=module.scaling,
        backend="reference",
        **kw,
    )
    o_v = torch.einsum("thr,hvr->thv", out.to(F64), ab.w_uv)
    with torch.no_grad():
        return module.o_proj(o_v.reshape(o_v.shape[0], HEADS * V_HEAD))


def v3_module(interleaved: bool, q_lora: bool, gen):
    cfg = DeepseekV3Config(
        **COMMON, q_lora_rank=48 if q_lora else None, rope_interleave=interleaved
    )
    cfg._attn_implementation = "eager"
    module = DeepseekV3Attention(cfg, LAYER).to(F64).eval()
    randomize_(module, gen)
    return module, DeepseekV3RotaryEmbedding(cfg)


def hf_reference(module, rotary, hs, capture_indexer=False):
    outs, topks = [], []
    for h, (c, n) in zip(hs, SEQS):
        out, topk = run_module(module, rotary, h, capture_indexer)
        outs.append(out[c : c + n])
        topks.append(topk)
    return torch.cat(outs), topks


def hidden_states(gen):
    return [torch.randn(c + n, HIDDEN, generator=gen, dtype=F64) for c, n in SEQS]


@pytest.mark.parametrize("interleaved", [True, False], ids=["rope_interleave", "rotate_half"])
@pytest.mark.parametrize(
    "dtype,page_size,q_lora",
    [(F32, 16, False), (F32, 1, True), (BF16, 4, False)],
    ids=["f32-ps16", "f32-ps1-qlora", "bf16-ps4"],
)
def test_deepseek_v3_attention_absorbed(gen, interleaved, dtype, page_size, q_lora):
    module, rotary = v3_module(interleaved, q_lora, gen)
    hs = hidden_states(gen)
    ref, _ = hf_reference(module, rotary, hs)
    out = pagedattn_step(module, absorbed(module), hs, dtype, page_size, interleaved, gen)
    assert_close(out, ref, **(F32_TOL if dtype == F32 else bf16_in_tol(ref)))


def test_deepseek_v3_fp8_branch(gen):
    """The whole fused FP8 branch (bf16 cache, FP8 w_uk / w_uv from kv_b_proj) against the
    float64 module: equal within FP8 weight/activation quantization error."""
    module, rotary = v3_module(True, False, gen)
    ab = absorbed(module)
    hs = hidden_states(gen)
    ref, _ = hf_reference(module, rotary, hs)
    freqs, params, pc = cached_prefix(module, ab, hs, BF16, 16, True, gen)
    q = torch.cat([queries(module, h)[c:] for h, (c, _) in zip(hs, SEQS)]).to(BF16)
    new_kv = torch.cat([latents(module, h)[c:] for h, (c, _) in zip(hs, SEQS)]).to(BF16)
    w_uk, w_uk_s = quantize_weight_blocks(ab.w_uk.transpose(1, 2).float())  # [H, rank, nope]
    w_uv, w_uv_s = quantize_weight_blocks(ab.w_uv.float())  # [H, v_head, rank]
    out = mla_decode_branch_fp8(
        q,
        ragged_offsets([n for _, n in SEQS]),
        freqs,
        ab.gamma.to(BF16),
        pc.inputs,
        params,
        LAYER,
        scale=module.scaling,
        epsilon=ab.eps,
        w_uk=w_uk,
        w_uk_scale=w_uk_s,
        w_uv=w_uv,
        w_uv_scale=w_uv_s,
        new_kv=new_kv,
        backend="reference",
    )
    with torch.no_grad():
        res = module.o_proj(out.to(F64).reshape(out.shape[0], HEADS * V_HEAD))
    # Four e4m3 roundings (w_uk, q_nope, w_uv, the attention output), each ~2% rms relative:
    # ~4% rms in the output (3.3-4.1% measured over seeds). A wrong rope layout, scale or
    # projection gives O(1).
    rel = float((res - ref).norm() / ref.norm())
    assert rel < 0.08, rel
    assert_close(res, ref, abs_tol=0.1 * float(ref.abs().max()), rel_tol=0.25, cos_tol=3e-3)


def v32_module(topk: int, gen):
    cfg = DeepseekV32Config(
        **COMMON, q_lora_rank=48, index_topk=topk, index_n_heads=2, index_head_dim=96
    )
    cfg._attn_implementation = "eager"
    module = DeepseekV32Attention(cfg, LAYER).to(F64).eval()
    randomize_(module, gen)
    return module, DeepseekV32RotaryEmbedding(cfg)


@pytest.mark.parametrize(
    "dtype,page_size,topk",
    [(F32, 16, 5), (F32, 1, 8), (BF16, 4, 5)],
    ids=["f32-k5", "f32-ps1-k8", "bf16-k5"],
)
def test_deepseek_v32_sparse_attention(gen, dtype, page_size, topk):
    module, rotary = v32_module(topk, gen)
    hs = hidden_states(gen)
    ref, topks = hf_reference(module, rotary, hs, capture_indexer=True)
    # The indexer really selects: fewer keys than the longest request's context.
    assert topks[1].shape[-1] == topk < SEQS[1][0]

    def sparse_of(lut):
        rows = []
        for b, (c, n) in enumerate(SEQS):
            for i in range(n):
                qpos = c + i
                row = []
                for key in topks[b][qpos].tolist():
                    # Keys after the query are removed by the module's causal mask.
                    ok = key <= qpos
                    row.append(lut[b][key // page_size] * page_size + key % page_size if ok else -1)
                rows.append(row + [-1] * (topk - len(row)))  # short sequences: fewer picks
        return torch.tensor(rows, dtype=torch.int32)

    out = pagedattn_step(
        module, absorbed(module), hs, dtype, page_size, True, gen, sparse_of=sparse_of
    )
    assert_close(out, ref, **(F32_TOL if dtype == F32 else bf16_in_tol(ref)))
    # Dense attention over the same cache differs: the selection matters.
    dense = pagedattn_step(module, absorbed(module), hs, dtype, page_size, True, gen)
    assert float((dense - ref).abs().max()) > 1e-3
