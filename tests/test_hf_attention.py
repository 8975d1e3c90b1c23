"""`pagedattn.ops.mha.mha` inside real serving flows, against Hugging Face transformers' own
attention modules as independent float64 references.

For each model (Llama GQA, Qwen3 GQA with q/k RMSNorm, optionally sliding window; gpt-oss with
attention sinks, full and sliding-window layers) a tiny random-weight attention module runs:
- in HF, as a float64 copy of the module (see `float64_reference`), one request at a time, with
  HF's `DynamicCache` and HF's own mask builders (`create_causal_mask` /
  `create_sliding_window_causal_mask`), chunk by chunk;
- in pagedattn, in float32, with every request batched: q/k/v projected with the module's
  weights (and its q/k norms), RoPE from the module's rotary embedding (cos/sin), K/V written by
  `store_kv` into a NaN-poisoned paged cache owned by a real `PagedKVCacheManager`
  (claim/alloc/runtime_inputs/store_kv/step, with a prefix-cache hit), `mha` with the layer's
  mask, sinks and scale, then the module's o_proj.

The schedule mixes chunked prefill, a full prompt, a prompt whose first pages come from the
prefix cache, and decode steps (those with split-K), in batches of up to three requests.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import DynamicCache, GptOssConfig, LlamaConfig, Qwen3Config
from transformers.masking_utils import create_causal_mask, create_sliding_window_causal_mask
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssRotaryEmbedding
from transformers.models.llama.modeling_llama import LlamaAttention, LlamaRotaryEmbedding
from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention, Qwen3RotaryEmbedding

from pagedattn import KVCacheParams, PagedKVCacheManager, PagedOperand, store_kv
from pagedattn.ops import masks
from pagedattn.ops.mha import mha
from pagedattn.testing import assert_close, poison_, ragged_offsets

VOCAB = 97
WINDOW = 4
# pagedattn's side is float32 throughout (projections, q/k norms, RoPE, mha, o_proj); the HF side
# is the float64 truth, so their difference is the float32 path's rounding error: noise of a few
# float32 ulps of the output's scale (its largest value), not of each element, since an output
# near 0 is o_proj's sum of 64-256 terms of O(1). (A fixed abs bound of 5e-6 against a float32 HF
# forward failed Qwen3, outputs of scale ~20, about 1 run in 40.) Measured with PAGEDATTN_TOL_LOG,
# the worst element of a call used at most 0.33 of this bound over 1000 runs of the batched-prompts
# test and 0.44 over 600 runs of the serving schedule (3000 / 21600 calls per model; serving: Llama
# 0.34, Qwen3 0.35, Qwen3-SWA 0.36, gpt-oss 0.40, gpt-oss-SWA 0.44; median ~0.1), the cosine
# difference at most 5.2e-13. A wrong key, mask edge, sink or RoPE position moves outputs by
# >= 1e-2; one key element off by 1e-4 fails most of these tests.
F32_ULPS = 16


def f32_tol(ref: torch.Tensor) -> dict:
    """Bounds for a float32 output against its float64 reference `ref`."""
    eps = torch.finfo(torch.float32).eps
    return dict(abs_tol=F32_ULPS * eps * float(ref.abs().max()), rel_tol=1e-4, cos_tol=1e-10)


def _common(**kw) -> dict:
    base = dict(vocab_size=VOCAB, num_hidden_layers=1, intermediate_size=32)
    base.update(kw)
    return base


def build_model(name: str):
    """(attention module, rotary embedding, config, is_sliding) for a tiny random config."""
    if name == "llama":
        cfg = LlamaConfig(
            **_common(hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=16)
        )
        cls, rot = LlamaAttention, LlamaRotaryEmbedding
    elif name.startswith("qwen3"):
        swa = name == "qwen3-swa"
        cfg = Qwen3Config(
            **_common(
                hidden_size=128,
                num_attention_heads=8,
                num_key_value_heads=2,
                head_dim=32,
                use_sliding_window=swa,
                sliding_window=WINDOW,
                max_window_layers=0,
            )
        )
        cls, rot = Qwen3Attention, Qwen3RotaryEmbedding
    else:
        layer = "sliding_attention" if name == "gpt-oss-swa" else "full_attention"
        cfg = GptOssConfig(
            **_common(
                hidden_size=64,
                num_attention_heads=8,
                num_key_value_heads=2,
                head_dim=16,
                sliding_window=WINDOW,
                layer_types=[layer],
                num_local_experts=2,
                num_experts_per_tok=1,
            )
        )
        cls, rot = GptOssAttention, GptOssRotaryEmbedding
    cfg._attn_implementation = "eager"
    attn = cls(cfg, layer_idx=0).eval()
    with torch.no_grad():
        for pname, p in attn.named_parameters():
            if pname.endswith("norm.weight"):
                p.copy_(1 + 0.3 * torch.randn_like(p))
            elif pname == "sinks":
                p.copy_(torch.randn_like(p) * 2)
            else:
                p.normal_(0, 0.15)
    # Llama has no layer types; Qwen3 and gpt-oss set `sliding_window` on sliding layers only.
    sliding = getattr(attn, "sliding_window", None) is not None
    assert sliding == name.endswith("-swa")
    return attn, rot(cfg), cfg, sliding


# --------------------------------------------------------------------------------------------
# HF side: float64, one request at a time, DynamicCache, HF masks
# --------------------------------------------------------------------------------------------
def float64_reference(attn):
    """A float64 copy of the HF attention module (same weights, its own config copy).

    HF computes two steps in float32 whatever the module's dtype; the copy makes them float64
    too, else their rounding (up to ~1/5 of the measured float32 error) would be in the truth:
    - Qwen3's q/k RMSNorm casts to float32: replaced by `torch.nn.RMSNorm` with the same weight
      and eps (the same formula, computed in the input's dtype);
    - Llama's and Qwen3's eager attention takes its softmax in float32: those run HF's "sdpa"
      implementation instead (torch's SDPA in float64, HF's boolean masks). gpt-oss keeps its
      eager attention with sinks, which is float64 already.
    The rotary embedding needs no copy: HF computes the cos/sin table in float32 in any case,
    the same table pagedattn's side uses, and casts it to the input's dtype (exactly)."""
    ref = copy.deepcopy(attn).double()
    for name in ("q_norm", "k_norm"):
        if hasattr(ref, name):
            hf = getattr(ref, name)
            norm = torch.nn.RMSNorm(hf.weight.shape, eps=hf.variance_epsilon, dtype=torch.float64)
            with torch.no_grad():
                norm.weight.copy_(hf.weight)
            setattr(ref, name, norm)
    if not hasattr(ref, "sinks"):
        ref.config._attn_implementation = "sdpa"
    return ref


@torch.no_grad()
def hf_forward(ref, rot, sliding, emb, toks: list[int], start: int = 0, past=None):
    """The float64 module `ref` over tokens `toks` at positions start.., after the tokens in
    `past` (a DynamicCache it extends) or uncached: [len(toks), hidden] float64."""
    x = emb.double()[torch.tensor(toks)][None]
    pos = torch.arange(start, start + len(toks))[None]
    make_mask = create_sliding_window_causal_mask if sliding else create_causal_mask
    cfg = ref.config
    mask = make_mask(
        config=cfg, inputs_embeds=x, attention_mask=None, past_key_values=past, position_ids=pos
    )
    cached = {} if past is None else dict(past_key_values=past)
    y, _ = ref(x, position_embeddings=rot(x, pos), attention_mask=mask, **cached)
    return y[0]


def hf_run(ref, rot, sliding, emb, chunks: list[list[int]]) -> list[torch.Tensor]:
    """Feed token chunks through the float64 module with a DynamicCache; outputs per chunk."""
    past = DynamicCache(config=ref.config)
    outs, start = [], 0
    for toks in chunks:
        outs.append(hf_forward(ref, rot, sliding, emb, toks, start, past))
        start += len(toks)
    return outs


# --------------------------------------------------------------------------------------------
# pagedattn side: batched, paged, through the cache manager
# --------------------------------------------------------------------------------------------
def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE. x [T, heads, d]; cos/sin [T, d] or [T, d/2] (gpt-oss gives half)."""
    if cos.shape[-1] * 2 == x.shape[-1]:
        cos, sin = torch.cat([cos, cos], -1), torch.cat([sin, sin], -1)
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos[:, None] + torch.cat([-x2, x1], -1) * sin[:, None]


class PagedLayer:
    """The same attention layer computed with pagedattn over a PagedKVCacheManager cache."""

    def __init__(self, attn, rot, sliding: bool, page_size: int):
        self.attn, self.rot = attn, rot
        self.h_q = attn.config.num_attention_heads
        self.h_kv = attn.config.num_key_value_heads
        self.d = attn.head_dim
        self.params = KVCacheParams(
            torch.float32,
            num_layers=1,
            n_kv_heads=self.h_kv,
            head_dim=self.d,
            page_size=page_size,
            num_q_heads=self.h_q,
        )
        self.mgr = PagedKVCacheManager(self.params, total_num_pages=96 // page_size + 8)
        poison_(self.mgr.buffers[0].kv_blocks)  # every slot never written stays NaN
        self.mask = masks.sliding_window_causal(attn.sliding_window) if sliding else masks.causal()
        sinks = getattr(attn, "sinks", None)
        self.sinks = None if sinks is None else sinks.detach().float()

    def project(self, x: torch.Tensor, pos: torch.Tensor):
        """x [T, hidden], absolute positions [T] -> q [T, h_q, d], k, v [T, h_kv, d]."""
        a = self.attn
        q = a.q_proj(x).view(-1, self.h_q, self.d)
        k = a.k_proj(x).view(-1, self.h_kv, self.d)
        v = a.v_proj(x).view(-1, self.h_kv, self.d)
        if hasattr(a, "q_norm"):
            q, k = a.q_norm(q), a.k_norm(k)
        cos, sin = self.rot(x[None], pos[None])
        return rope(q, cos[0], sin[0]), rope(k, cos[0], sin[0]), v

    @torch.no_grad()
    def step(self, emb, work: dict, sampled: dict, num_partitions=None) -> dict:
        """One engine step. work: rid -> tokens to compute now; sampled: rid -> tokens sampled
        at the end of the step ([] mid-prompt). Returns rid -> [len(tokens), hidden]."""
        rids = list(work)
        for rid in rids:
            self.mgr.alloc(rid, len(work[rid]))
        inputs = self.mgr.runtime_inputs(rids)[0]
        cache_lens = inputs.cache_lengths.tolist()
        lens = [len(work[r]) for r in rids]
        x = emb[torch.tensor([t for r in rids for t in work[r]])]
        pos = torch.cat([torch.arange(c, c + n) for c, n in zip(cache_lens, lens)])
        q, k, v = self.project(x, pos)
        offs = ragged_offsets(lens)
        store_kv(k, v, inputs, self.params, 0, offs)
        o = mha(
            q,
            PagedOperand(inputs, self.params, 0, "k"),
            PagedOperand(inputs, self.params, 0, "v"),
            offs,
            mask=self.mask,
            sinks=self.sinks,
            scale=self.attn.scaling,
            num_partitions=num_partitions,
        )
        y = self.attn.o_proj(o.reshape(o.shape[0], -1))
        self.mgr.step(rids, [sampled[r] for r in rids])
        return dict(zip(rids, y.split(lens)))


MODELS = ["llama", "qwen3", "qwen3-swa", "gpt-oss", "gpt-oss-swa"]


@pytest.mark.parametrize("page_size", [1, 3, 16])
@pytest.mark.parametrize("name", MODELS)
def test_serving_schedule_matches_hf(name, page_size):
    attn, rot, cfg, sliding = build_model(name)
    emb = torch.randn(VOCAB, cfg.hidden_size)
    tok = lambda n: torch.randint(0, VOCAB, (n,)).tolist()
    prompt_a = tok(11)
    prompt_b = tok(7)
    prompt_b[0] = (prompt_a[0] + 1) % VOCAB  # B shares no page with A (1 in 97 runs did)
    prompt_c = prompt_a[:6] + [(t + 1) % VOCAB for t in prompt_a[6:9]]  # diverges at 6
    sample = {r: tok(4) for r in "abc"}  # tokens "sampled" after each full prompt / decode

    layer = PagedLayer(attn, rot, sliding, page_size)
    mgr = layer.mgr
    got: dict[str, list[torch.Tensor]] = {r: [] for r in "abc"}

    # step 0: A's first prompt chunk (chunked prefill)
    assert mgr.claim("a", prompt_a) == 0
    got["a"].append(layer.step(emb, {"a": prompt_a[:6]}, {"a": []})["a"])
    # step 1: A's last chunk over its 6 cached tokens + B's whole prompt
    assert mgr.claim("b", prompt_b) == 0
    out = layer.step(
        emb, {"a": prompt_a[6:], "b": prompt_b}, {"a": sample["a"][:1], "b": sample["b"][:1]}
    )
    got["a"].append(out["a"])
    got["b"].append(out["b"])
    # step 2: C hits A's committed pages in the prefix cache; A and B decode (split-K)
    hit = mgr.claim("c", prompt_c)
    assert hit == (6 // page_size) * page_size
    work = {"a": sample["a"][:1], "b": sample["b"][:1], "c": prompt_c[hit:]}
    out = layer.step(emb, work, {r: sample[r][:1] if r == "c" else sample[r][1:2] for r in work})
    for r in "abc":
        got[r].append(out[r])
    # steps 3, 4: everyone decodes
    for s in (1, 2):
        work = {"a": sample["a"][s : s + 1], "b": sample["b"][s : s + 1]}
        work["c"] = sample["c"][s - 1 : s]
        nxt = {"a": sample["a"][s + 1 : s + 2], "b": sample["b"][s + 1 : s + 2]}
        nxt["c"] = sample["c"][s : s + 1]
        out = layer.step(emb, work, nxt, num_partitions=3 * s)
        for r in "abc":
            got[r].append(out[r])

    d = sample
    chunks = {
        "a": [prompt_a[:6], prompt_a[6:], d["a"][:1], d["a"][1:2], d["a"][2:3]],
        "b": [prompt_b, d["b"][:1], d["b"][1:2], d["b"][2:3]],
        "c": ([prompt_c[:hit]] if hit else []) + [prompt_c[hit:], d["c"][:1], d["c"][1:2]],
    }
    ref64 = float64_reference(attn)
    for r in "abc":
        ref = hf_run(ref64, rot, sliding, emb, chunks[r])
        ref = ref[1:] if (r == "c" and hit) else ref  # C's cached prefix is not recomputed
        assert len(ref) == len(got[r])
        for i, (o, e) in enumerate(zip(got[r], ref)):
            assert_close(o, e, **f32_tol(e), name=f"{name} request {r} step {i}")


@pytest.mark.parametrize("name", MODELS)
def test_batched_prompts_match_hf_full_forward(name):
    """Whole prompts of different lengths in one batch vs one uncached HF forward each."""
    attn, rot, cfg, sliding = build_model(name)
    emb = torch.randn(VOCAB, cfg.hidden_size)
    prompts = [torch.randint(0, VOCAB, (n,)).tolist() for n in (9, 1, 14)]
    layer = PagedLayer(attn, rot, sliding, page_size=4)
    for i, p in enumerate(prompts):
        layer.mgr.claim(i, p)
    out = layer.step(emb, dict(enumerate(prompts)), {i: [0] for i in range(len(prompts))})
    ref64 = float64_reference(attn)
    for i, p in enumerate(prompts):
        ref = hf_forward(ref64, rot, sliding, emb, p)
        assert_close(out[i], ref, **f32_tol(ref), name=f"{name} prompt {i}")
