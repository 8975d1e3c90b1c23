"""Whole-model decode (issues 57 and 58): the engine (`pagedattn.engine.LLMEngine`) serving
Llama- and DeepSeek-shaped models with random weights, each decode step against its memory
roofline, and the 1B shape against transformers' `generate` on the same weights.

- Models: `SHAPES`: Llama-3-8B, Llama-3.2-1B and DeepSeek-V2-Lite (bf16), and a DeepSeek-V3
  slice (the release's config at full width, 4 layers: 1 dense + 3 MoE, FP8 e4m3 weights in
  128 x 128 blocks with float32 scales, as the release stores them). Built in memory, no
  checkpoint (`random_model.py`): the model on the meta device, materialised on the GPU,
  every checkpoint tensor drawn there from (seed, its name): linear weights N(0, 1/fan_in)
  (FP8 shapes: that draw quantized per block, amax / 448), embeddings N(0, 1), norm weights
  1, biases (the V3 router's correction bias too) N(0, 0.02^2). The engine takes the loaded
  model (`LLMEngine(model, ...)`).
- A case (`CASES`): `b` requests of `prompt` random tokens (greedy, `ignore_eos`) on a cache
  in the model dtype or the case's FP8 format (`kv_quantization`; the V3 slice: the MLA
  rope-aware layout). Cases: Llama-3-8B b64 and b256, Llama-3.2-1B b64 (with transformers),
  DeepSeek-V2-Lite b64, the DeepSeek-V3 slice b64 (no goal given: the table shows '-'); all
  with 512-token prompts. The engine prefills them (chunked under `PREFILL_BUDGET` tokens a
  step; not timed), runs `WARMUP` decode steps, then `STEPS` timed `engine.step()` calls, each
  between two CUDA events (the step syncs on its sampled tokens, so this is the step loop's
  wall time: host scheduling, input building, the model, sampling and outputs). Every timed
  step must be a pure decode of all b requests (and, with graphs, a replay): else the case
  records an error.
  * A model that captures CUDA graphs (`supports_cuda_graphs`): three engines, each fresh over
    the same model: CUDA graphs with async scheduling (the engine's defaults on CUDA: step
    n + 1 launched before step n's tokens are read, so a call costs max(host, device)),
    `enforce_eager=True` (record "pagedattn-eager"), and graphs with `async_scheduling=False`
    (host and device in series: `sync_ms`). Also timed: the captured graph's replay alone
    (`replay_ms`, the model's device time).
  * A model without graphs (none of the shapes on CUDA since the routed experts run through
    `ops.moe`; FP8 DeepSeek on the CPU, whose experts read their token counts on the host):
    one engine, eager with async scheduling (the record says `graphs: false`; no
    replay, synchronous or second eager numbers, no "pagedattn-eager" record), and, in place
    of the replay, one eager model call alone on the inputs of a further decode step
    (`model_call_ms`: host launches and device work of the model, without the engine's
    scheduling and sampling).
- Roofline of a step: max(bytes / copy bandwidth, FLOPs / bf16 matmul), both ceilings measured
  in the same process (`common.copy_bandwidth`, `common.matmul_tflops`). Bytes (`step_cost`):
  every weight a decode step reads in full (all parameters at their stored size: an FP8
  weight 1 byte an e4m3 element plus 4 a float32 block scale; except an untied input
  embedding, of which the b gathered rows count; every routed expert counted) + the batch's
  KV read once: the cache's bytes a token (`KVCacheParams.bytes_per_page() / page_size`:
  layers x 2 x kv_heads x head_dim x itemsize for MHA, layers x 576 x itemsize for a plain MLA
  cache, layers x (512 + 2 x 64 + 4) for the FP8 rope-aware one) x the mean over timed steps of
  the sum of context lengths (each request's keys, its new token included). FLOPs: 2 x b x
  (linear weights incl. lm_head, the routed experts' times top-k / experts) + attention (4 x
  layers x h_q x head_dim x contexts for MHA; absorbed MLA layers x h_q x (2 x 576 + 2 x 512)
  x contexts).
- transformers (`hf: True` cases): `transformers.LlamaForCausalLM` (sdpa, bf16) holding a copy
  of the same weights (`hf_model`, through the loader's `weight_sources` map), greedy `generate`
  of the same prompts: decode tokens/s = b x (n - 1) / (time(n tokens) - time(1 token)), n up
  to `HF_TOKENS`, fewer when a step is slow (`HF_BUDGET_S` for the n-token call).
- Profile (`profile: True` cases): `torch.profiler` over `PROFILE_REPLAYS` replays of the
  captured decode graph, or for a model without graphs as many eager model calls on one
  decode step's inputs; device kernels grouped by name, the top `TOP_KERNELS` with their share
  of the step's kernel time, and the replay's (model call's) time without a kernel (a graph
  whose kernels the profiler does not see is profiled as one eager model call on the same
  static inputs, and the record says so). Then by component, each against its own roofline
  (`component_profile`, the record's "components"): one eager model call on the same inputs
  (the kernels a replay runs), the device time inside each linear (by name: qkv_proj, o_proj,
  gate_up_proj, down_proj, lm_head, ...), the norms, each layer's attention block (RoPE, KV
  store, decode attention) and MLP block (activation, routing, experts) beside their own
  linears, and the rest; each kind's bytes (parameters, the step's KV for attention, the rows
  in and out) over the copy ceiling.

Usage:
  python bench/bench_model.py [--only 1b] [--seed 0] [--out PATH.json]   # GPU
  python bench/run_all.py --suite model                                   # the same
  python bench/bench_model.py --dry-run     # CPU: tiny shapes, float32, reference backend,
                                            # graphs emulated; no timing claims
Output: JSON (`common.save`, suite "model") and a PNG beside it, then a short table.
"""

from __future__ import annotations

import gc
import math
import os
import sys
import time
import zlib
from collections import defaultdict
from dataclasses import dataclass, replace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import Record, call_times, roofline_ms, save_and_report, selected, suite_main
from random_model import random_model

from pagedattn import KVCacheParams, KVQuantConfig
from pagedattn.engine import LLMEngine, SamplingParams
from pagedattn.engine.cuda_graphs import supports_cuda_graphs
from pagedattn.models import kv_cache_params
from pagedattn.models.loader import weight_sources

SUITE = "model"
PAGE_SIZE = 16
PREFILL_BUDGET = 16384  # max_num_batched_tokens: b256 x 512 prefills in 8 steps
WARMUP = 4  # decode steps before the timed ones
STEPS = 32  # timed decode steps
HF_TOKENS = 16  # transformers: most new tokens of the timed generate
HF_BUDGET_S = 20.0  # ... fewer when its estimate exceeds this
PROFILE_REPLAYS = 3
TOP_KERNELS = 10
X_HF_GOAL = 30.0  # issue 57: our decode tokens/s over transformers', 1B b64

# Hugging Face config.json fields of each shape (random weights; no tokenizer).
SHAPES: dict[str, dict] = {
    "llama3-8b": dict(
        vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
        num_attention_heads=32, num_key_value_heads=8, head_dim=128, rms_norm_eps=1e-5,
        max_position_embeddings=8192, rope_theta=500000.0, tie_word_embeddings=False,
    ),
    "llama3.2-1b": dict(
        vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
        num_attention_heads=32, num_key_value_heads=8, head_dim=64, rms_norm_eps=1e-5,
        max_position_embeddings=131072, rope_theta=500000.0, tie_word_embeddings=True,
        rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                          high_freq_factor=4.0, original_max_position_embeddings=8192),
    ),
    # DeepSeek-V2-Lite (issue 58): MLA (kv_lora_rank 512 + rope 64, no q_lora), 64 routed
    # experts top-6 + 2 shared, the first layer dense, YaRN RoPE.
    "deepseek-v2-lite": dict(
        architectures=["DeepseekV2ForCausalLM"], model_type="deepseek_v2",
        vocab_size=102400, hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408,
        num_hidden_layers=27, num_attention_heads=16, num_key_value_heads=16, kv_lora_rank=512,
        q_lora_rank=None, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        n_routed_experts=64, num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1,
        topk_method="greedy", n_group=1, topk_group=1, norm_topk_prob=False,
        routed_scaling_factor=1.0, rms_norm_eps=1e-6, max_position_embeddings=163840,
        tie_word_embeddings=False,
        rope_scaling=dict(type="yarn", factor=40.0, original_max_position_embeddings=4096,
                          beta_fast=32.0, beta_slow=1.0, mscale=0.707, mscale_all_dim=0.707),
    ),
    # DeepSeek-V3 (issue 58): the release's config.json (FP8 e4m3 weights in 128 x 128 blocks,
    # MLA 512 + 64 with q_lora 1536, 256 routed experts top-8 in 8 groups (top-4 groups,
    # noaux_tc) + 1 shared, YaRN x40) at full width, but 4 layers of its 61. The release has
    # first_k_dense_replace 3 (3 dense layers, 58 MoE: 95% of its layers, 99% of its
    # weights); a 4-layer slice keeping 3 would be 3 dense + 1 MoE, mostly dense weights, so
    # the slice keeps 1: one dense layer and three MoE layers, each as wide as the release's.
    "deepseek-v3-slice": dict(
        architectures=["DeepseekV3ForCausalLM"], model_type="deepseek_v3",
        vocab_size=129280, hidden_size=7168, intermediate_size=18432, moe_intermediate_size=2048,
        num_hidden_layers=4, num_attention_heads=128, num_key_value_heads=128, kv_lora_rank=512,
        q_lora_rank=1536, qk_rope_head_dim=64, qk_nope_head_dim=128, v_head_dim=128,
        n_routed_experts=256, num_experts_per_tok=8, n_shared_experts=1, first_k_dense_replace=1,
        topk_method="noaux_tc", n_group=8, topk_group=4, norm_topk_prob=True,
        routed_scaling_factor=2.5, scoring_func="sigmoid", rms_norm_eps=1e-6,
        max_position_embeddings=163840, rope_theta=10000, tie_word_embeddings=False,
        attention_bias=False, hidden_act="silu",
        rope_scaling=dict(type="yarn", factor=40, original_max_position_embeddings=4096,
                          beta_fast=32, beta_slow=1, mscale=1.0, mscale_all_dim=1.0),
        quantization_config=dict(activation_scheme="dynamic", fmt="e4m3", quant_method="fp8",
                                 weight_block_size=[128, 128]),
    ),
    # Qwen3-30B-A3B (the Qwen3 family's MoE, Qwen3MoeForCausalLM): the release's config.json,
    # 48 layers, 32 / 4 heads of 128 with q/k norm, 128 routed experts of 768 top-8
    # (renormalised), no shared expert.
    "qwen3-30b-a3b": dict(
        architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe",
        vocab_size=151936, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768,
        num_hidden_layers=48, num_attention_heads=32, num_key_value_heads=4, head_dim=128,
        num_experts=128, num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1,
        mlp_only_layers=[], rms_norm_eps=1e-6, max_position_embeddings=40960,
        rope_theta=1000000.0, tie_word_embeddings=False, attention_bias=False,
    ),
}  # fmt: skip
# CPU dry run: the same families at toy sizes (GQA 4:1 kept, tying kept; MLA and MoE kept).
DRY_SHAPE = dict(
    vocab_size=512, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
    num_attention_heads=8, num_key_value_heads=2, head_dim=16,
)  # fmt: skip
DRY_MLA = dict(
    vocab_size=512, hidden_size=128, intermediate_size=256, moe_intermediate_size=32,
    num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=4, kv_lora_rank=32,
    qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, n_routed_experts=4,
    num_experts_per_tok=2, n_shared_experts=1, max_position_embeddings=256,
)  # fmt: skip
# ... and per shape over DRY_MLA: the V3 slice keeps its 4 layers (1 dense, 3 MoE), its
# 128 x 128 FP8 weight blocks and its FP8 rope-aware cache, which needs DeepSeek's latent
# geometry (kv_lora_rank 512 + rope 64: mla_decode's FP8 d_qk 576); the experts' intermediate
# size is one weight block (the FP8 experts need a multiple of it); 16 experts keep 8 groups of
# 2 (noaux_tc scores a group by its top-2), top-4 of them from 4 groups.
DRY_OVERRIDES: dict[str, dict] = {
    "qwen3-30b-a3b": dict(moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2),
    "deepseek-v3-slice": dict(
        num_hidden_layers=4, q_lora_rank=64, kv_lora_rank=512, qk_rope_head_dim=64,
        moe_intermediate_size=128, n_routed_experts=16, num_experts_per_tok=4, n_group=8,
        topk_group=4,
    ),
}  # fmt: skip


@dataclass(frozen=True)
class Case:
    """One served batch: `b` requests of `prompt` tokens on shape `shape`. goal: the fraction
    of the roofline the issue asks of the step (None: no number given); hf: also time
    transformers; profile: also profile one step (a replay, or an eager model call for a
    model without graphs); kv_quantization: the engine's FP8 KV cache (None: the model
    dtype)."""

    name: str
    shape: str
    b: int
    prompt: int
    goal: float | None
    hf: bool = False
    profile: bool = False
    steps: int = STEPS
    warmup: int = WARMUP
    hf_tokens: int = HF_TOKENS
    prefill_budget: int = PREFILL_BUDGET
    kv_quantization: KVQuantConfig | None = None


CASES = [
    Case("llama3-8b b64 p512", "llama3-8b", 64, 512, 0.8, profile=True),
    Case("llama3-8b b256 p512", "llama3-8b", 256, 512, 0.8),
    Case("llama3.2-1b b64 p512", "llama3.2-1b", 64, 512, 0.6, hf=True, profile=True),
    Case("deepseek-v2-lite b64 p512", "deepseek-v2-lite", 64, 512, 0.6, profile=True),
    # issue 58: FP8 block weights (the shape's quantization_config), FP8 rope-aware MLA cache;
    # CUDA graphs (its experts through ops.moe, its attention through the fused FP8 branch);
    # no goal given
    Case("deepseek-v3-slice b64 p512", "deepseek-v3-slice", 64, 512, None, profile=True,
         kv_quantization=KVQuantConfig.mla_rope_aware()),
    # the Qwen3 family's MoE at its release shape (61 GB of bf16 weights); no goal given
    Case("qwen3-30b-a3b b64 p512", "qwen3-30b-a3b", 64, 512, None, profile=True),
]  # fmt: skip


def shrink(c: Case) -> Case:
    """The case at CPU dry-run size: tiny batch, prompt and step counts (shape: `DRY_SHAPE`)."""
    return replace(
        c, b=max(2, c.b // 32), prompt=20, steps=3, warmup=1, hf_tokens=3, prefill_budget=32
    )


def hf_config_dict(shape: str, dry: bool = False) -> dict:
    """The shape's config.json fields (`DRY_SHAPE`, or `DRY_MLA` and the shape's
    `DRY_OVERRIDES`, over them in a dry run); no BOS/EOS/pad."""
    d = dict(SHAPES[shape], bos_token_id=None, eos_token_id=None, pad_token_id=None)
    if not dry:
        return d
    return d | (DRY_MLA if "kv_lora_rank" in d else DRY_SHAPE) | DRY_OVERRIDES.get(shape, {})


# --- the model -----------------------------------------------------------------------------


def build_model(cfg_dict: dict, device, dtype: torch.dtype, seed: int) -> torch.nn.Module:
    """The pagedattn model of the config.json fields `cfg_dict` (a Llama unless they name an
    architecture) with random weights, built and filled on `device` (no host copy;
    `random_model`: norm weights 1, embeddings N(0, 1), linear weights N(0, 1/fan_in), each
    checkpoint tensor seeded by (seed, its name))."""
    arch = dict(architectures=["LlamaForCausalLM"], model_type="llama")
    return random_model(arch | cfg_dict, device, dtype, seed)


@torch.no_grad()
def hf_model(model: torch.nn.Module, cfg_dict: dict):
    """transformers' LlamaForCausalLM (sdpa) of the same config, on the model's device and in
    its dtype, holding a copy of `model`'s weights: each fused parameter (`weight_sources`:
    qkv_proj <- q, k, v; gate_up_proj <- gate, up) split back along dim 0."""
    import transformers  # noqa: PLC0415 - only the transformers peer needs it

    dev = next(model.parameters()).device
    hcfg = transformers.LlamaConfig(**cfg_dict, attn_implementation="sdpa")
    with torch.device(dev):
        hf = transformers.LlamaForCausalLM._from_config(hcfg, dtype=model.dtype)
    hf_params = dict(hf.named_parameters())
    ours = dict(model.named_parameters())
    for name, src in weight_sources(model).items():
        parts = [hf_params[n] for n in src.names]
        if len(parts) == 1:
            parts[0].copy_(ours[name])
        else:
            for dst, piece in zip(parts, ours[name].split([t.shape[0] for t in parts], dim=0)):
                dst.copy_(piece)
    gc_ = hf.generation_config
    gc_.bos_token_id = gc_.eos_token_id = None
    gc_.pad_token_id = 0
    return hf.eval()


def _is_scale(name: str) -> bool:
    """An FP8 weight's block scales (`weight_scale_inv`, the experts' `*_scale_inv`)."""
    return name.endswith("_scale_inv")


def _is_routed_expert(name: str, p: torch.Tensor) -> bool:
    """A stacked routed-expert tensor ([E, ...]: weights and their scales)."""
    return ".experts." in name and p.ndim == 3


def weight_bytes(model: torch.nn.Module, b: int) -> tuple[int, int, int]:
    """(bytes of every parameter, bytes a decode step of b requests reads, linear weights'
    elements a token multiplies).

    Bytes are each parameter's elements times its element size, so an FP8 block-quantized
    weight counts 1 byte an e4m3 element plus 4 bytes a float32 `weight_scale_inv` block
    scale, and bf16 / float32 parameters 2 / 4 bytes an element (the router stays float32).
    A step reads every parameter in full, except an untied input embedding, of which it reads
    the b gathered rows; every routed expert counts, an upper bound on what routing touches
    (DeepSeek-V3 at b 64: 512 picks of 256 experts, ~87% of them under uniform routing).
    (The fused FP8 MLA branch reads w_uk / w_uv, kv_b_proj's elements requantized per head
    in 128 x 128 blocks: the same e4m3 bytes and, for 128-multiple dims, as many scales.)
    Linear elements: every 2-D weight (router and lm_head included; not scales, not an untied
    embedding) plus the routed experts' elements times top-k / experts (a token runs k of
    them)."""
    cfg = model.config
    emb = model.model.embed_tokens.weight
    total = sum(p.numel() * p.element_size() for p in model.parameters())
    read = total
    if not cfg.tie_word_embeddings:
        read -= emb.numel() * emb.element_size() - b * cfg.hidden_size * emb.element_size()
    linear = 0.0
    for n, p in model.named_parameters():
        if _is_scale(n) or p.ndim < 2:
            continue
        if _is_routed_expert(n, p):
            linear += p.numel() * cfg.num_experts_per_tok / cfg.num_experts
        elif p.ndim == 2:
            linear += p.numel()
    if not cfg.tie_word_embeddings:
        linear -= emb.numel()  # a gather, not a matmul (a tied table is the lm_head's matmul)
    return total, read, int(round(linear))


def kv_bytes_per_token(model: torch.nn.Module, kv_params: KVCacheParams | None = None) -> float:
    """Bytes one token's cache rows take over all layers (what a decode step reads of each
    context token), asked of the cache's `KVCacheParams` (the engine's, else the model's
    plain cache in its dtype): `bytes_per_page() / page_size`, scales included. MHA: layers
    x 2 x kv_heads x head_dim x itemsize; MLA: layers x (kv_lora_rank + rope) x itemsize, and
    with the FP8 rope-aware layout layers x (512 e4m3 bytes + 64 x 2 bf16 rope bytes + a
    float32 scale) = layers x 644."""
    if kv_params is None:
        kv_params = kv_cache_params(model.config, dtype=model.dtype, page_size=1)
    return kv_params.bytes_per_page() / kv_params.page_size


def step_cost(
    model: torch.nn.Module, b: int, mean_ctx_sum: float, kv_params: KVCacheParams | None = None
) -> dict:
    """Bytes and FLOPs of one decode step of b requests whose contexts sum to mean_ctx_sum,
    on the cache `kv_params` (None: a plain cache in the model's dtype).

    weight_bytes: `weight_bytes`' read bytes (FP8: 1 byte an e4m3 element + 4 a scale);
    kv_bytes: `kv_bytes_per_token` x mean_ctx_sum (each context row read once a step);
    bytes: their sum; routed_expert_bytes: the routed experts' share of weight_bytes.
    FLOPs: 2 x b x linear elements (`weight_bytes`) + attention: MHA 4 x layers x h_q x
    head_dim x contexts; MLA (absorbed: scores over the 576-wide latent row, values over its
    512) layers x h_q x (2 x (rank + rope) + 2 x rank) x contexts."""
    cfg = model.config
    total, read, linear = weight_bytes(model, b)
    kv = kv_bytes_per_token(model, kv_params) * mean_ctx_sum
    if cfg.is_mla:  # one latent row (kv_lora_rank + rope) a token; absorbed scores and values
        per_key = 2 * cfg.mla_head_dim + 2 * cfg.kv_lora_rank
        flops = 2 * b * linear + cfg.num_layers * cfg.num_heads * per_key * mean_ctx_sum
    else:
        flops = 2 * b * linear + 4 * cfg.num_layers * cfg.num_heads * cfg.head_dim * mean_ctx_sum
    experts = sum(
        p.numel() * p.element_size() for n, p in model.named_parameters() if _is_routed_expert(n, p)
    )
    return dict(param_bytes=total, weight_bytes=read, kv_bytes=kv, bytes=read + kv, flops=flops,
                routed_expert_bytes=experts)  # fmt: skip


# --- running one case --------------------------------------------------------------------------


class _EmulatedGraphsEngine(LLMEngine):
    """The dry run's "graphs" engine: the decode-graph path (static buffers, buckets, replay
    count) run eagerly on the CPU (`LLMEngine._emulate_cuda_graphs`)."""

    _emulate_cuda_graphs = True


class Ctx:
    """Device, dtype, ceilings, seed, the records and the errors of one run."""

    def __init__(self, records, ceilings, seed, dry):
        self.records, self.ceilings, self.seed, self.dry = records, ceilings, seed, dry
        self.dev = torch.device("cpu" if dry else "cuda")
        self.dtype = torch.float32 if dry else torch.bfloat16
        self.errors: list[str] = []
        self.tp = 1  # the engines' tensor_parallel_size (bench_tp.py: one process a rank)

    def sync(self) -> None:
        if not self.dry:
            torch.cuda.synchronize()

    def times_ms(self, fn, n: int) -> list[float]:
        """ms of each of n calls: CUDA events around each (`common.call_times`, L2 left warm)
        on the GPU, perf_counter in a dry run."""
        if not self.dry:
            return call_times(fn, n, flush=False)
        out = []
        for _ in range(n):
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
        return out

    def roofline_ms(self, nbytes: float, flops: float) -> tuple[float, str]:
        return roofline_ms(self.ceilings, nbytes, flops)

    def error(self, case: Case, msg: str) -> None:
        line = f"{case.name}: {msg}"
        print(f"[model] ERROR {line}")
        self.errors.append(line)


def make_engine(ctx: Ctx, model, case: Case, graphs: bool, overlap: bool = True) -> LLMEngine:
    """An engine over `model` for the case: b slots, a pool just large enough (so a graph and
    an eager engine fit one after the other), prefill under the case's token budget, the
    case's KV cache format; overlap: `async_scheduling` (the engine's default on CUDA)."""
    max_tokens = max_new_tokens(case)
    max_len = case.prompt + max_tokens + 1
    cls = _EmulatedGraphsEngine if (ctx.dry and graphs) else LLMEngine
    return cls(
        model,
        page_size=PAGE_SIZE,
        num_pages=case.b * math.ceil(max_len / PAGE_SIZE) + case.b,
        max_num_batched_tokens=case.prefill_budget,
        max_num_seqs=case.b,
        max_model_len=max_len,
        seed=ctx.seed,
        enforce_eager=not graphs,
        tensor_parallel_size=ctx.tp,
        async_scheduling=overlap,
        kv_quantization=case.kv_quantization,
    )


def max_new_tokens(case: Case) -> int:
    """Enough tokens that no request finishes before the timed steps end: one a step while
    the batch prefills (at most one step per budget of prompt tokens, plus one), then warm-up
    and timed steps."""
    prefill_steps = math.ceil(case.b * case.prompt / case.prefill_budget) + 1
    return prefill_steps + case.warmup + case.steps + 4


def prompts(case: Case, vocab: int, seed: int) -> list[list[int]]:
    """b random prompts of `case.prompt` token ids in [0, vocab), from a generator seeded
    with `seed` alone."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (case.b, case.prompt), generator=g).tolist()


def serve(
    ctx: Ctx, case: Case, model, toks: list[list[int]], graphs: bool, overlap: bool = True
) -> dict:
    """Prefill the batch, warm up, time `case.steps` decode steps of a fresh engine; returns
    the step times, the mean context sum of the timed steps, the engine (still alive) and
    what was checked. With `overlap` (async scheduling) a call launches step n + 1 and reads
    step n's tokens: its time is the loop's time a step, max(host, device) when they overlap."""
    t0 = time.perf_counter()
    eng = make_engine(ctx, model, case, graphs, overlap)
    t_build = time.perf_counter() - t0
    params = SamplingParams(max_tokens=max_new_tokens(case), temperature=0.0, ignore_eos=True)
    ids = [eng.add_request({"prompt_token_ids": t}, params) for t in toks]
    n_out = dict.fromkeys(ids, 0)

    def note(outs) -> int:
        for o in outs:
            n_out[o.request_id] = len(o.outputs[0].token_ids)
        return len(outs)

    t0 = time.perf_counter()
    prefill_steps = 0
    while min(n_out.values()) == 0:  # every prompt done: each request has its first token
        note(eng.step())
        prefill_steps += 1
        if prefill_steps > 10 * max_new_tokens(case):
            raise RuntimeError("the batch did not finish its prefill")
    ctx.sync()
    t_prefill = time.perf_counter() - t0
    for _ in range(case.warmup):
        note(eng.step())
    runner = eng.runner.graphs
    replays0 = runner.num_replays if runner is not None else 0
    # The first timed step's sum of contexts (each request's keys, its new token included);
    # each later step adds one token a request (every timed step is checked to be that).
    ctx0 = sum(case.prompt + n for n in n_out.values())
    sizes: list[int] = []  # each timed step's requests that got a token

    def step() -> None:
        sizes.append(note(eng.step()))

    ms = ctx.times_ms(step, case.steps)
    replays = (runner.num_replays - replays0) if runner is not None else 0
    if any(s != case.b for s in sizes):
        ctx.error(case, f"timed steps were not all decodes of {case.b} requests: {sizes}")
    if graphs and replays != case.steps:
        ctx.error(case, f"{replays} graph replays in {case.steps} timed steps")
    if max(n_out.values()) >= max_new_tokens(case):
        ctx.error(case, "a request finished during the timed steps")
    return dict(
        engine=eng,
        ms=ms,
        ctx_sum=ctx0 + case.b * (case.steps - 1) / 2,
        prefill_steps=prefill_steps,
        prefill_s=round(t_prefill, 3),
        build_s=round(t_build, 3),
        replays=replays,
    )


def graph_of(eng: LLMEngine, b: int):
    """The captured (or emulated) decode graph that serves b requests, its buffers loaded with
    the last step's inputs."""
    g = eng.runner.graphs
    return g.graphs[g.bucket(b)]


def replay_ms(ctx: Ctx, eng: LLMEngine, b: int, n: int) -> float:
    """Median ms of a replay of the last decode step's graph alone (rewrites that step's K/V
    with the same values)."""
    g = graph_of(eng, b)
    with torch.inference_mode():  # an emulated replay runs the model (dry run)
        g.replay()
        ctx.sync()
        times = sorted(ctx.times_ms(g.replay, n))
    return times[len(times) // 2]


def kernel_table(prof, replays: int, on_gpu: bool) -> tuple[float, list[dict]]:
    """(kernel us a step, the top kernels by name: us a step, calls a step, share of the
    step's kernel time). GPU: device events (kernels, memcpy/memset); CPU (dry run): leaf ops."""
    from torch.autograd import DeviceType  # noqa: PLC0415

    us: dict[str, float] = defaultdict(float)
    calls: dict[str, int] = defaultdict(int)
    for e in prof.events():
        if on_gpu:
            if e.device_type != DeviceType.CUDA:
                continue
        elif e.device_type != DeviceType.CPU or e.cpu_children:
            continue
        us[e.name] += e.time_range.elapsed_us()
        calls[e.name] += 1
    total = sum(us.values())
    top = sorted(us, key=us.get, reverse=True)[:TOP_KERNELS]
    rows = [
        dict(
            name=name[:160],
            us=round(us[name] / replays, 2),
            calls=round(calls[name] / replays, 2),
            share=round(us[name] / total, 4) if total else 0.0,
        )
        for name in top
    ]
    return total / replays, rows


def last_decode_inputs(ctx: Ctx, eng: LLMEngine, case: Case):
    """The inputs of the model call of one more `engine.step()` of an engine without graphs
    (its eager `runner.eager`, observed for that call), checked to be a pure decode of the
    case's b requests."""
    runner, seen = eng.runner, []
    call = runner.eager
    runner.eager = lambda inputs: (seen.append(inputs), call(inputs))[1]
    try:
        eng.step()
        ctx.sync()
    finally:
        del runner.eager  # the class's method again
    if len(seen) != 1:
        raise RuntimeError(f"{len(seen)} eager model calls in one engine step")
    inputs = seen[0]
    if inputs.num_decodes != case.b or inputs.num_tokens != case.b:
        raise RuntimeError(
            f"the step after the timed ones was not a pure decode of {case.b} requests "
            f"({inputs.num_tokens} tokens, {inputs.num_decodes} decodes)"
        )
    return inputs


def model_call_ms(ctx: Ctx, eng: LLMEngine, inputs, n: int) -> float:
    """Median ms of one eager model call on a decode step's inputs alone (the eager
    counterpart of `replay_ms`: it rewrites that step's K/V with the same values; host launch
    and device work in series, since nothing else overlaps it)."""
    with torch.inference_mode():
        eng.runner.eager(inputs)
        ctx.sync()
        times = sorted(ctx.times_ms(lambda: eng.runner.eager(inputs), n))
    return times[len(times) // 2]


def _profiled(ctx: Ctx, fn):
    """torch.profiler over `PROFILE_REPLAYS` calls of fn (CPU events, and CUDA's off the dry
    run), after one call outside it (warm-up)."""
    from torch.profiler import ProfilerActivity, profile  # noqa: PLC0415

    acts = [ProfilerActivity.CPU] + ([] if ctx.dry else [ProfilerActivity.CUDA])
    with torch.inference_mode():
        fn()
        ctx.sync()
    with torch.inference_mode(), profile(activities=acts) as prof:
        for _ in range(PROFILE_REPLAYS):
            fn()
        ctx.sync()
    return prof


def _profile_calls(ctx: Ctx, fn) -> tuple[float, list[dict]]:
    """`kernel_table` of `_profiled` calls of fn."""
    return kernel_table(_profiled(ctx, fn), PROFILE_REPLAYS, not ctx.dry)


def profile_step(ctx: Ctx, eng: LLMEngine, case: Case, inputs=None) -> dict:
    """Kernel times of `PROFILE_REPLAYS` replays of the decode graph, or for an engine
    without graphs of as many eager model calls on a decode step's inputs (`inputs`, else
    `last_decode_inputs`) (module docstring)."""
    if eng.runner.graphs is None:
        if inputs is None:
            inputs = last_decode_inputs(ctx, eng, case)
        total, rows = _profile_calls(ctx, lambda: eng.runner.eager(inputs))
        source = "eager model call on a decode step's inputs (the model captures no graphs)"
        if ctx.dry:
            source += " (CPU leaf ops)"
        return dict(source=source, replays=PROFILE_REPLAYS, kernel_us=round(total, 2), top=rows)
    # (under inference_mode: an emulated replay runs the model, dry run)
    total, rows = _profile_calls(ctx, graph_of(eng, case.b).replay)
    source = "graph replay" if not ctx.dry else "emulated graph replay (CPU leaf ops)"
    if not ctx.dry and not rows:  # the profiler saw no kernels inside the graph
        source = "eager model call on the graph's inputs (no kernel events from the replay)"
        total, rows = _profile_calls(ctx, static_call(eng, case.b))
    return dict(source=source, replays=PROFILE_REPLAYS, kernel_us=round(total, 2), top=rows)


def static_call(eng: LLMEngine, b: int):
    """One eager model call on the decode graph of bucket b's static inputs (the kernels its
    replay runs)."""
    bufs, model = eng.runner.graphs.buffers, eng.model

    def eager() -> None:
        model(bufs.input_ids[:b], bufs.positions[:b], bufs.kv_rows(b),
              bufs.q_row_offsets[: b + 1], bufs.logits_rows[:b])  # fmt: skip

    return eager


ATTENTION_KIND = "attention (rope, KV store, decode)"
MLP_KIND = "mlp (activation; routing and experts)"
REST_KIND = "rest (embedding, tied lm_head, final norm, glue)"


def _component_kind(name: str, module: torch.nn.Module) -> str | None:
    """The component a module's work counts as (`component_profile`): a linear by its name in
    its parent (qkv_proj, o_proj, gate_up_proj, down_proj, lm_head, ...), the norms, a layer's
    attention block or MLP block (what they run besides their linears and norms); None: not a
    component (its work goes to its enclosing one)."""
    from pagedattn.models.layers import Fp8BlockLinear, Linear, RMSNorm  # noqa: PLC0415

    leaf = name.rsplit(".", 1)[-1]
    if isinstance(module, (Linear, Fp8BlockLinear)):
        return leaf
    if isinstance(module, RMSNorm):
        return "norms"
    if leaf == "self_attn":
        return ATTENTION_KIND
    if leaf == "mlp":
        return MLP_KIND
    return None


def _own_bytes(module: torch.nn.Module, below: set) -> int:
    """Bytes of the parameters a module holds outside its sub-components (`below`: their
    modules)."""
    seen = {id(p) for m in below for p in m.parameters()}
    return sum(p.numel() * p.element_size() for p in module.parameters() if id(p) not in seen)


SLEEP_CYCLES = 400_000_000  # ~0.2 s of GPU clock: the device waits while a call is queued


def _module_times_us(ctx: Ctx, mods: dict, names: list[str], call) -> dict[str, float]:
    """us a call of each named module's forwards (summed over its calls in one `call()`),
    averaged over `PROFILE_REPLAYS` calls after one warm-up. GPU: a CUDA event recorded before
    and after each forward (hooks); the device first sleeps (`torch.cuda._sleep`) while the
    host queues the whole call, so its kernels then run back to back and an event pair spans
    the module's kernels without the idle time of an eager call waiting for its host. Dry run:
    the host's time (perf_counter)."""
    times: dict[str, float] = defaultdict(float)
    marks: list = []

    def stamp():
        if ctx.dry:
            return time.perf_counter()
        e = torch.cuda.Event(enable_timing=True)
        e.record()
        return e

    def pre(name):
        return lambda _m, _a: marks.append((name, True, stamp()))

    def post(name):
        return lambda _m, _a, _o: marks.append((name, False, stamp()))

    handles = []
    for n in names:
        handles.append(mods[n].register_forward_pre_hook(pre(n)))
        handles.append(mods[n].register_forward_hook(post(n)))
    try:
        with torch.inference_mode():
            call()
            ctx.sync()
            for _ in range(PROFILE_REPLAYS):
                marks.clear()
                if not ctx.dry:
                    torch.cuda._sleep(SLEEP_CYCLES)
                call()
                ctx.sync()
                started: dict[str, object] = {}  # a module's forward is not re-entered
                for name, is_pre, t in marks:
                    if is_pre:
                        started[name] = t
                        continue
                    t0 = started.pop(name)
                    dt = (t - t0) * 1e6 if ctx.dry else t0.elapsed_time(t) * 1e3
                    times[name] += dt / PROFILE_REPLAYS
    finally:
        for h in handles:
            h.remove()
    return dict(times)


def component_profile(ctx: Ctx, model, call, b: int, cost: dict) -> dict:
    """Where a decode step's time goes, by component, each against its own roofline (issue
    57's report by kernel): `call()` (one eager model call on a decode step's inputs: the
    kernels a graph replay runs), the device time of every component module's forwards
    (`_component_kind`) and of the model's (`_module_times_us`: CUDA events around each forward,
    the call queued behind a device sleep so that no host gap falls inside), less its
    sub-components' (host time in a dry run), summed by kind over the layers. A linear the
    forward calls as a function (an untied lm_head) counts in the rest.

    Bytes a step of each kind: a linear's parameters (weight, bias, FP8 scales) and its b rows
    in and out; the norms' weights and b rows of x and the residual in and out; an attention
    block's own parameters and the step's KV bytes (`step_cost`), read once; an MLP block's
    own parameters (routed experts: all of them, as `step_cost` counts) and its b rows of
    gate / up in and activation out; the rest, the step's bytes no component covers. FLOPs:
    2 x b x in x out for a linear. Roofline: max(bytes / copy, FLOPs / matmul) of the run's
    ceilings. Returns {"source", "calls", "model_us", "rows": [{kind, calls, us, bytes,
    roofline_us, frac}]} (us a step)."""
    kinds = {n: k for n, m in model.named_modules() if (k := _component_kind(n, m)) is not None}
    mods = dict(model.named_modules())
    act = 4 if ctx.dtype == torch.float32 else 2
    hidden = model.config.hidden_size
    total = _module_times_us(ctx, mods, [*kinds, ""], call)
    model_us = total.pop("", 0.0)
    names = sorted(kinds, key=len)

    def parent(n: str) -> str | None:  # the innermost enclosing component
        ups = [m for m in names if m != n and n.startswith(m + ".")]
        return max(ups, key=len) if ups else None

    own = dict(total)
    for n in kinds:
        if n in total and (p := parent(n)) is not None and p in own:
            own[p] -= total[n]
    kv_layer = cost["kv_bytes"] / model.config.num_layers
    rows: dict[str, dict] = {}
    covered = 0.0
    for n, k in kinds.items():
        m = mods[n]
        subs = {mods[c] for c in kinds if c.startswith(n + ".")}
        nbytes, flops = _own_bytes(m, subs), 0.0
        if k not in (ATTENTION_KIND, MLP_KIND, "norms"):  # a linear
            out_f, in_f = m.weight.shape[0], m.weight.shape[-1]
            nbytes += b * (in_f + out_f) * act
            flops = 2.0 * b * in_f * out_f
        elif k == "norms":
            nbytes += 4 * b * m.weight.shape[-1] * act
        elif k == ATTENTION_KIND:
            nbytes += kv_layer
        else:
            inter = getattr(model.config, "intermediate_size", hidden) or hidden
            nbytes += 3 * b * inter * act
        covered += nbytes
        r = rows.setdefault(k, dict(kind=k, calls=0, us=0.0, bytes=0.0, flops=0.0))
        r["calls"] += 1
        r["us"] += max(own.get(n, 0.0), 0.0)
        r["bytes"] += nbytes
        r["flops"] += flops
    rest_us = model_us - sum(total.get(n, 0.0) for n in kinds if parent(n) is None)
    rows[REST_KIND] = dict(kind=REST_KIND, calls=1, us=max(rest_us, 0.0),
                           bytes=max(cost["bytes"] - covered, 0.0), flops=0.0)  # fmt: skip
    out = []
    for r in sorted(rows.values(), key=lambda r: -r["us"]):
        roof, _ = ctx.roofline_ms(r["bytes"], r["flops"])
        us = r["us"]
        out.append(dict(kind=r["kind"], calls=r["calls"], us=round(us, 2),
                        bytes=round(r["bytes"]), roofline_us=round(roof * 1e3, 2),
                        frac=round(roof * 1e3 / us, 4) if us > 0 else None))  # fmt: skip
    source = "eager model call on a decode step's inputs, queued behind a device sleep"
    if ctx.dry:
        source += " (CPU time)"
    return dict(source=source, calls=PROFILE_REPLAYS, model_us=round(model_us, 2), rows=out)


def hf_decode(ctx: Ctx, case: Case, model, cfg_dict: dict, toks: list[list[int]]) -> dict:
    """transformers' greedy decode tokens/s on the same weights and prompts (module docstring)."""
    hf = hf_model(model, cfg_dict)
    ids = torch.tensor(toks, dtype=torch.int64, device=ctx.dev)
    mask = torch.ones_like(ids)

    def gen(n: int) -> float:
        ctx.sync()
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = hf.generate(input_ids=ids, attention_mask=mask, max_new_tokens=n,
                              min_new_tokens=n, do_sample=False)  # fmt: skip
        ctx.sync()
        if out.shape[1] != case.prompt + n:
            raise RuntimeError(f"transformers generated {out.shape[1] - case.prompt} of {n} tokens")
        return time.perf_counter() - t0

    gen(2)  # warm-up
    t1, t2 = gen(1), gen(2)
    step_s = max(t2 - t1, 1e-6)
    n = max(2, min(case.hf_tokens, int(HF_BUDGET_S / step_s) + 1))
    tn = gen(n)
    decode_s = max(tn - t1, 1e-9)
    return dict(
        new_tokens=n,
        capped=n < case.hf_tokens,
        t1_s=round(t1, 4),
        tn_s=round(tn, 4),
        step_ms=round(decode_s / (n - 1) * 1e3, 4),
        tokens_per_s=round(case.b * (n - 1) / decode_s, 1),
        attn="sdpa",
    )


def weights_label(model: torch.nn.Module) -> str:
    """How the model's linear weights are stored: its dtype, or FP8 e4m3 n x k blocks."""
    block = model.config.fp8_block
    if block is None:
        return str(model.dtype).removeprefix("torch.")
    return f"fp8 e4m3, {block[0]}x{block[1]} blocks, float32 scales"


def kv_label(kv_params: KVCacheParams) -> str:
    """The cache's storage: its format (FP8) or dtype."""
    return kv_params.quant_format or str(kv_params.dtype).removeprefix("torch.")


def run_case(ctx: Ctx, case: Case, model, cfg_dict: dict) -> None:
    """One case: a model that captures CUDA graphs (`supports_cuda_graphs`) gets three
    engines (graphs + async scheduling, eager, graphs synchronous), the replay alone and the
    profile of replays; a model without graphs one engine (eager, async scheduling), its
    model call alone and the profile of eager calls (module docstring); then transformers
    when asked. Records: pagedattn, pagedattn-eager (graph models), transformers."""
    toks = prompts(case, model.config.vocab_size, ctx.seed * 1000 + zlib.crc32(case.name.encode()))
    graphs = supports_cuda_graphs(model)
    res = serve(ctx, case, model, toks, graphs=graphs)
    eng = res.pop("engine")
    kv_params = eng.kv_params
    ms = sum(res["ms"]) / len(res["ms"])
    n_alone = max(3, case.steps // 2)
    cost = step_cost(model, case.b, res["ctx_sum"], kv_params)
    comps = None
    if graphs:
        rep = replay_ms(ctx, eng, case.b, n_alone)
        prof = profile_step(ctx, eng, case) if case.profile else None
        call = static_call(eng, case.b)
    else:
        inputs = last_decode_inputs(ctx, eng, case)
        rep = model_call_ms(ctx, eng, inputs, n_alone)
        prof = profile_step(ctx, eng, case, inputs) if case.profile else None
        call = lambda inputs=inputs, runner=eng.runner: runner.eager(inputs)  # noqa: E731
        del inputs
    if case.profile:
        try:
            comps = component_profile(ctx, eng.model, call, case.b, cost)
        except Exception as e:  # noqa: BLE001 - a failed breakdown is a record, not the end
            ctx.error(case, f"component profile failed: {type(e).__name__}: {str(e)[:300]}")
    del call
    fused_branch = bool(getattr(model.model.layers[0].self_attn, "takes_branch", False))
    del eng
    _free(ctx)
    ms_eager = ms_sync = None
    if graphs:
        eager = serve(ctx, case, model, toks, graphs=False)
        del eager["engine"]
        _free(ctx)
        ms_eager = sum(eager["ms"]) / len(eager["ms"])
        sync = serve(ctx, case, model, toks, graphs=True, overlap=False)
        del sync["engine"]
        _free(ctx)
        ms_sync = sum(sync["ms"]) / len(sync["ms"])

    roof, bound = ctx.roofline_ms(cost["bytes"], cost["flops"])
    med = sorted(res["ms"])[len(res["ms"]) // 2]
    base = dict(
        group=f"model-{case.shape}",
        shape=case.shape,
        batch=case.b,
        prompt=case.prompt,
        steps=case.steps,
        warmup=case.warmup,
        seed=ctx.seed,
        dtype=str(ctx.dtype).removeprefix("torch."),
        weights=weights_label(model),
        kv_cache=kv_label(kv_params),
        kv_bytes_per_token=kv_bytes_per_token(model, kv_params),
        page=PAGE_SIZE,
        mean_context=round(res["ctx_sum"] / case.b, 2),
        roofline_ms=round(roof, 6),
        bound=bound,
        goal_frac=case.goal,
        **{k: round(v, 1) for k, v in cost.items()},
    )
    if ctx.dry:
        base["dry_run"] = True
    e = dict(
        base,
        graphs=graphs,
        timed=(
            "graphs, async scheduling"
            if graphs
            else "eager, async scheduling (the model captures no CUDA graphs)"
        ),
        fused_fp8_branch=fused_branch,
        ms_median=round(med, 5),
        ms_min=round(min(res["ms"]), 5),
        ms_max=round(max(res["ms"]), 5),
        step_ms=[round(x, 4) for x in res["ms"]],
        frac_roofline=round(roof / ms, 4),
        tokens_per_s=round(case.b / ms * 1e3, 1),
        # the model's device time: the graph's replay alone, or (no graphs) one eager call
        replay_ms=round(rep, 5) if graphs else None,
        replay_frac_roofline=round(roof / rep, 4) if graphs else None,
        model_call_ms=None if graphs else round(rep, 5),
        model_call_frac_roofline=None if graphs else round(roof / rep, 4),
        host_ms=round(ms - rep, 5),
        eager_ms=round(ms_eager if graphs else ms, 5),
        x_eager=round(ms_eager / ms, 3) if graphs else None,
        sync_ms=round(ms_sync, 5) if graphs else None,
        x_sync=round(ms_sync / ms, 3) if graphs else None,
        graph_replays=res["replays"],
        prefill_steps=res["prefill_steps"],
        prefill_s=res["prefill_s"],
        engine_build_s=res["build_s"],
    )
    if prof is not None:  # kernels run back to back on one stream: the rest is idle time
        prof["replay_idle_us"] = round(rep * 1e3 - prof["kernel_us"], 2)
        e["profile"] = prof
    if comps is not None:
        e["components"] = comps
    mine = Record(SUITE, case.name, "pagedattn", ms, cost["bytes"], cost["flops"], e)
    ctx.records.append(mine)
    if graphs:
        e_eager = dict(
            base,
            ms_median=round(sorted(eager["ms"])[len(eager["ms"]) // 2], 5),
            step_ms=[round(x, 4) for x in eager["ms"]],
            frac_roofline=round(roof / ms_eager, 4),
            tokens_per_s=round(case.b / ms_eager * 1e3, 1),
            prefill_s=eager["prefill_s"],
        )
        ctx.records.append(
            Record(
                SUITE, case.name, "pagedattn-eager", ms_eager, cost["bytes"], cost["flops"], e_eager
            )  # fmt: skip
        )
    if case.hf:
        try:
            hf = hf_decode(ctx, case, model, cfg_dict, toks)
        except Exception as ex:  # noqa: BLE001 - the peer's failure is a record, not the end
            ctx.error(case, f"transformers failed: {type(ex).__name__}: {str(ex)[:300]}")
            return
        finally:
            _free(ctx)
        ours_tps = e["tokens_per_s"]
        mine.extra.update(
            transformers_tokens_per_s=hf["tokens_per_s"],
            x_transformers=round(ours_tps / hf["tokens_per_s"], 2),
            goal_x_transformers=X_HF_GOAL,
        )
        # (a dry run on a loaded CPU may time n tokens no slower than one: no fraction then)
        frac = round(roof / hf["step_ms"], 4) if hf["step_ms"] > 0 else None
        ctx.records.append(
            Record(
                SUITE,
                case.name,
                "transformers",
                hf["step_ms"],
                0.0,
                0.0,
                dict(base, **hf, frac_roofline=frac),
            )  # fmt: skip
        )


def _free(ctx: Ctx) -> None:
    gc.collect()
    if not ctx.dry:
        torch.cuda.empty_cache()


def run(records: list[Record], ceilings: dict, seed: int = 0, dry: bool = False,
        only: str | None = None) -> dict:  # fmt: skip
    """Every case (or those `only` selects: `common.selected`) into `records`, consecutive cases of
    one shape on one model; returns the run's metadata (seed, errors, seconds per case)."""
    ctx = Ctx(records, ceilings, seed, dry)
    seconds: dict[str, float] = {}
    build_s: dict[str, float] = {}
    t_all = time.perf_counter()
    model, model_shape = None, None
    for case in CASES:
        if not selected(case.name, only):
            continue
        c = shrink(case) if dry else case
        cfg_dict = hf_config_dict(c.shape, dry)
        t0 = time.perf_counter()
        try:
            if model_shape != c.shape:
                model = None
                _free(ctx)
                t_b = time.perf_counter()
                model = build_model(cfg_dict, ctx.dev, ctx.dtype, seed)
                ctx.sync()
                model_shape = c.shape
                build_s[c.shape] = round(time.perf_counter() - t_b, 2)
            run_case(ctx, c, model, cfg_dict)
        except Exception as e:  # noqa: BLE001 - keep the other cases' numbers
            import traceback

            traceback.print_exc()
            ctx.error(case, f"case failed: {type(e).__name__}: {str(e)[:300]}")
            model, model_shape = None, None
        seconds[case.name] = round(time.perf_counter() - t0, 2)
        print(f"[model] {case.name}: {seconds[case.name]:.1f} s  {_one_line(records, case)}")
        _free(ctx)
    return dict(
        suite=SUITE,
        seed=seed,
        dry_run=dry,
        errors=ctx.errors,
        model_build_seconds=build_s,
        case_seconds=seconds,
        total_seconds=round(time.perf_counter() - t_all, 1),
    )


def _f(x: float | None, spec: str, width: int) -> str:
    """x formatted, or '-' (a value the case does not have), right-aligned in width."""
    return f"{'-':>{width}}" if x is None else f"{x:>{width}{spec}}"


def _alone_ms(e: dict) -> float:
    """The model's own time a step: the graph's replay, or one eager model call."""
    return e["replay_ms"] if e.get("replay_ms") is not None else e["model_call_ms"]


def _one_line(records: list[Record], case: Case) -> str:
    rs = {r.impl: r for r in records if r.config == case.name}
    o = rs.get("pagedattn")
    if o is None:
        return "(no pagedattn record)"
    e = o.extra
    if e.get("graphs", True):
        s = (f"ours {o.ms:.3f} ms/step ({e['frac_roofline']:.2f} of roofline "
             f"{e['roofline_ms']:.3f} ms, replay {e['replay_ms']:.3f} ms), sync "
             f"{e['sync_ms']:.3f} ms, eager {e['eager_ms']:.3f} ms")  # fmt: skip
    else:
        s = (f"ours {o.ms:.3f} ms/step eager, no graphs ({e['frac_roofline']:.2f} of roofline "
             f"{e['roofline_ms']:.3f} ms, model call {e['model_call_ms']:.3f} ms)")  # fmt: skip
    if "x_transformers" in e:
        s += f", x{e['x_transformers']:.1f} transformers"
    return s


def table(records: list[Record]) -> str:
    """The short table: case, how its steps ran (graphs or eager), our ms a step (async
    scheduling), roofline ms, fraction, goal, tokens/s, the model alone (the graph's replay,
    or one eager model call), the synchronous and eager step loops, times transformers ('-'
    where the case has no such number: no goal, no graphs, no transformers run)."""
    lines = [
        f"{'case':<27} {'mode':>6} {'ours ms':>8} {'roof ms':>8} {'/roof':>6} {'goal':>5} "
        f"{'tok/s':>9} {'model ms':>8} {'sync ms':>8} {'eager ms':>9} {'x HF':>6}"
    ]
    for r in records:
        if r.suite != SUITE or r.impl != "pagedattn":
            continue
        e = r.extra
        mode = "graphs" if e.get("graphs", True) else "eager"
        lines.append(
            f"{r.config:<27} {mode:>6} {r.ms:>8.3f} {e['roofline_ms']:>8.3f} "
            f"{e['frac_roofline']:>6.2f} {_f(e['goal_frac'], '.2f', 5)} "
            f"{e['tokens_per_s']:>9.0f} {_alone_ms(e):>8.3f} {_f(e['sync_ms'], '.3f', 8)} "
            f"{e['eager_ms']:>9.3f} {_f(e.get('x_transformers'), '.1f', 6)}"
        )
    return "\n".join(lines)


def profile_lines(records: list[Record]) -> str:
    """The top kernels of each profiled case (us a step and share)."""
    lines = []
    for r in records:
        p = r.extra.get("profile") if r.impl == "pagedattn" else None
        if not p:
            continue
        what = "replay" if r.extra.get("graphs", True) else "model call"
        lines.append(
            f"{r.config}: {p['kernel_us']:.1f} us of kernels a step, "
            f"{p['replay_idle_us']:.1f} us of the {what} without one ({p['source']})"
        )
        for k in p["top"]:
            lines.append(
                f"  {k['share']:>6.1%} {k['us']:>9.1f} us x{k['calls']:<6g} {k['name'][:90]}"
            )
        c = r.extra.get("components")
        if c:
            lines.append(f"  by component ({c['source']}; {c['model_us']:.1f} us a call), each "
                         "against its own roofline:")  # fmt: skip
            for k in c["rows"]:
                frac = "-" if k["frac"] is None else f"{k['frac']:.2f}"
                lines.append(f"  {k['us']:>9.1f} us x{k['calls']:<4d} roofline "
                             f"{k['roofline_us']:>8.1f} us ({frac:>5})  {k['kind']}")  # fmt: skip
    return "\n".join(lines)


def plot(path: str, records: list[Record], env: dict, dry: bool) -> str:
    """Each case's roofline time over its step time (graphs, synchronous, eager, the model
    alone: a case without graphs has its eager step loop and its eager model call only),
    bars labelled with ms, the goal marked where the case has one; the PNG beside `path`."""
    import matplotlib  # noqa: PLC0415

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    mine = [r for r in records if r.suite == SUITE and r.impl == "pagedattn"]

    def graphed(r: Record) -> bool:
        return r.extra.get("graphs", True)

    series = [
        ("graphs, async scheduling (step loop)", lambda r: r.ms if graphed(r) else None),
        ("graphs, synchronous (step loop)", lambda r: r.extra["sync_ms"]),
        ("eager (step loop; async scheduling)", lambda r: r.extra["eager_ms"]),
        ("the model alone (graph replay, or one eager call)", lambda r: _alone_ms(r.extra)),
    ]
    fig, ax = plt.subplots(figsize=(11, 0.9 * max(len(mine), 1) + 1.6))
    h = 0.8 / len(series)
    for i, (label, get) in enumerate(series):
        pts = [(j + i * h, r, get(r)) for j, r in enumerate(mine)]
        pts = [(y, r, m) for y, r, m in pts if m is not None]  # a series the case lacks
        bars = ax.barh([y for y, _, _ in pts], [r.extra["roofline_ms"] / m for _, r, m in pts],
                       height=h, label=label, color=f"C{i}")  # fmt: skip
        for bar, (_, _, m) in zip(bars, pts):
            ax.text(bar.get_width(), bar.get_y() + bar.get_height() / 2, f" {m:.3f} ms",
                    va="center", fontsize=6)  # fmt: skip
    for j, r in enumerate(mine):
        if r.extra["goal_frac"] is not None:
            ax.plot([r.extra["goal_frac"]] * 2, [j - h / 2, j + 0.8 - h / 2], color="r", lw=0.8)
    ax.set_yticks([j + 0.4 - h / 2 for j in range(len(mine))])
    ax.set_yticklabels(
        [f"{r.config} [{r.extra['bound']}{'' if graphed(r) else ', eager'}]" for r in mine],
        fontsize=7,
    )
    ax.axvline(1.0, color="k", lw=0.5)
    ax.set_xlabel("roofline time / step time (roofline: max(weights + KV bytes / copy, FLOPs / "
                  "bf16 matmul), measured in the same run); red: the issue's goal")  # fmt: skip
    ax.invert_yaxis()
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_title(
        f"model decode steps: {env.get('device', '?')} {env.get('date', '')} torch "
        f"{env.get('torch', '')} triton {env.get('triton', '')}"
        + (" [CPU dry run: no timing claims]" if dry else ""),
        fontsize=8,
    )
    fig.tight_layout()
    out = path.rsplit(".", 1)[0] + ".png"
    fig.savefig(out, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return out


def run_and_save(out: str, env: dict, ceilings: dict, seed: int = 0, dry: bool = False,
                 only: str | None = None) -> list[Record]:  # fmt: skip
    """Run the suite, write `out` (JSON with the run's metadata) and its plot beside it, print
    the profiles and the short table last."""
    records: list[Record] = []
    meta = run(records, ceilings, seed, dry, only)
    save_and_report("model", out, env, ceilings, records, meta,
                    lambda: plot(out, records, env, dry))  # fmt: skip
    prof = profile_lines(records)
    if prof:
        print(prof)
    print(table(records))
    return records


def main(argv: list[str] | None = None) -> None:
    suite_main(argv, __doc__, "model", run_and_save, probe_flashinfer=False)


if __name__ == "__main__":
    main()
