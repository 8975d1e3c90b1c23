"""mla_decode_branch_fp8: the fused FP8 MLA decode branch of MAX (seed
`mla_decode_branch_fp8.txt`): q_nope @ w_uk, RoPE + RMSNorm of the new tokens written into the
cache, concat, MLA decode, @ w_uv (the five steps: `reference.py`).

`mla_decode_branch_fp8` keeps the seed's arguments (Pythonic names), builds one `BranchArgs`
from them, validates all of it before anything is written (metadata only, no host sync, but
for the host tensor kv_inputs.mla_num_partitions and weight scales that live on the CPU; step
4's arguments by `ops.mla`'s own checks; the cache's tensors against `params`) and
dispatches with `ops.dispatch.choose_backend`: "triton" (CUDA) ->
`triton_branch.mla_decode_branch_fp8_triton(args)`, "reference" (CPU) ->
`mla_decode_branch_fp8_reference(args)`. The Triton branch takes bf16/fp16 q; pages for the
new tokens must be allocated.
"""

from __future__ import annotations

import math
import numbers
from typing import NamedTuple

import torch

from ...cache.inputs import KVCacheInputsPerDevice
from ...cache.params import KVCacheParams
from ...errors import Lazy, check
from ...operands import RowOperand
from .._checks import (
    MAX_NUM_PARTITIONS,
    Described,
    check_granularities,
    check_out,
    check_scale,
    is_int,
    typed_binding,
)
from ..dispatch import choose_backend
from ..linear.checks import W_SCALE_DTYPES, check_weight_scale_values
from ..masks import Mask
from ..mla import MAX_D_V
from ..mla import validate_args as validate_mla_decode_args
from .args import BranchArgs
from .reference import mla_decode_branch_fp8_reference

#: dtypes of freqs_cis and kv_norm_gamma (read in float32).
FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _check_mask(a: BranchArgs) -> None:
    """'causal' / 'null' (or the Mask objects of those kinds)."""
    kind = a.mask_kind
    check(
        isinstance(kind, str) and kind in ("causal", "null"),
        "mask",
        "'causal', 'null' or a pagedattn.ops.masks Mask of those kinds",
        a.mask if isinstance(a.mask, str) else f"Mask(kind={kind!r})",
    )


def _check_weight(
    a: BranchArgs, wn: str, shape: tuple[int, int | None, None], what: Lazy, device: torch.device
) -> None:
    """Weight `wn` of `a` ("w_uk" / "w_uv": e4m3 [h_q, n, k] of `shape`, None = any) and its
    block scales `wn`_scale ([h_q, ceil(n/n_gran), ceil(k/k_gran)] float32 or e8m0)."""
    w, ws, sn = getattr(a, wn), getattr(a, wn + "_scale"), wn + "_scale"
    ok = (
        isinstance(w, torch.Tensor)
        and w.dtype == torch.float8_e4m3fn
        and w.ndim == 3
        and all(s is None or w.shape[i] == s for i, s in enumerate(shape))
        and w.device == device
    )
    check(ok, wn, Lazy(lambda: f"a float8_e4m3fn {what} tensor on {device}"), Described(w))
    n, k = w.shape[1], w.shape[2]
    want = (w.shape[0], -(-n // a.n_gran), -(-k // a.k_gran))
    check(
        isinstance(ws, torch.Tensor)
        and tuple(ws.shape) == want
        and ws.dtype in W_SCALE_DTYPES
        and ws.device == device,
        sn,
        Lazy(
            lambda: (
                f"a tensor of shape {want} (h_q, ceil(n/n_gran), ceil(k/k_gran)) with dtype in "
                f"{W_SCALE_DTYPES} on {device}"
            )
        ),
        Described(ws),
    )
    check_weight_scale_values(ws, sn)


class _BufferSpec(NamedTuple):
    """The buffers `allocate_buffers(params)` makes, but for the page count."""

    blocks: tuple[int, ...]  # kv_blocks.shape[1:]
    storage_dtype: torch.dtype
    scales: tuple[int, ...] | None  # kv_scales.shape[1:] (per-tensor: the whole shape)
    scale_dtype: torch.dtype | None
    per_tensor: bool


_SPECS: dict[int, tuple[KVCacheParams, _BufferSpec]] = {}


def _buffer_spec(params: KVCacheParams) -> _BufferSpec:
    """`_BufferSpec` of params, memoised by identity (params are frozen; deriving the shapes
    from its properties cost several us a call)."""
    hit = _SPECS.get(id(params))
    if hit is not None and hit[0] is params:
        return hit[1]
    per_tensor = params.quant_format == "per_tensor"
    scales = params.scales_shape(1)
    spec = _BufferSpec(
        params.blocks_shape(1)[1:],
        params.storage_dtype,
        None if scales is None else (scales if per_tensor else scales[1:]),
        torch.float32 if per_tensor else params.scale_dtype,
        per_tensor,
    )
    if len(_SPECS) >= 64:
        _SPECS.clear()
    _SPECS[id(params)] = (params, spec)
    return spec


def _check_cache(params: KVCacheParams, kv_inputs: KVCacheInputsPerDevice) -> torch.device:
    """kv_inputs' tensors against `params` (the buffers `allocate_buffers(params)` makes, any
    page count; int32 cache lengths and lookup table on the blocks' device); returns the
    cache's device."""
    spec = _buffer_spec(params)
    blocks = kv_inputs.kv_blocks
    check(
        isinstance(blocks, torch.Tensor)
        and blocks.ndim == 6
        and blocks.shape[1:] == spec.blocks
        and blocks.dtype == spec.storage_dtype,
        "kv_inputs.kv_blocks",
        Lazy(
            lambda: (
                f"a {spec.storage_dtype} [pages, {', '.join(map(str, spec.blocks))}] tensor "
                "(the buffer of params)"
            )
        ),
        Described(blocks),
    )
    device = blocks.device
    if spec.scales is not None:
        scales = kv_inputs.kv_scales
        check(
            isinstance(scales, torch.Tensor)
            and (scales.shape if spec.per_tensor else scales.shape[1:]) == spec.scales
            and scales.shape[0] == (spec.scales[0] if spec.per_tensor else blocks.shape[0])
            and scales.dtype == spec.scale_dtype
            and scales.device == device,
            "kv_inputs.kv_scales",
            Lazy(
                lambda: (
                    f"a {spec.scale_dtype} tensor on {device} matching kv_blocks (the scale "
                    "buffer of params)"
                )
            ),
            Described(scales),
        )
    lengths, lut = kv_inputs.cache_lengths, kv_inputs.lookup_table
    check(
        isinstance(lengths, torch.Tensor)
        and lengths.dtype == torch.int32
        and lengths.ndim == 1
        and lengths.device == device,
        "kv_inputs.cache_lengths",
        Lazy(lambda: f"an int32 [batch] tensor on {device}"),
        Described(lengths),
    )
    check(
        isinstance(lut, torch.Tensor)
        and lut.dtype == torch.int32
        and lut.ndim == 2
        and lut.shape[0] == lengths.shape[0]
        and lut.device == device,
        "kv_inputs.lookup_table",
        Lazy(lambda: f"an int32 [batch={lengths.shape[0]}, cols] tensor on {device}"),
        Described(lut),
    )
    return device


def _check_mla_num_partitions(t: object) -> None:
    """kv_inputs.mla_num_partitions, read when num_partitions is None: a one-element integer
    tensor on the host holding an int in [1, MAX_NUM_PARTITIONS] (reading it costs no sync)."""
    name = "kv_inputs.mla_num_partitions"
    check(
        isinstance(t, torch.Tensor)
        and t.numel() >= 1
        and not t.is_floating_point()
        and not t.is_complex()
        and t.dtype != torch.bool
        and t.device.type == "cpu",
        name,
        "None or a one-element integer tensor on the host",
        Described(t),
    )
    v = int(t.reshape(-1)[0])
    check(
        1 <= v <= MAX_NUM_PARTITIONS, name, Lazy(lambda: f"a value in [1, {MAX_NUM_PARTITIONS}]"), v
    )


def _validate(a: BranchArgs) -> None:
    """Checks the branch's own arguments (step 4's: `ops.mla`'s checks, in the caller)."""
    q, params, kv_inputs, layer_idx = a.q, a.params, a.kv_inputs, a.layer_idx
    new_kv, freqs_cis, kv_norm_gamma, epsilon = a.new_kv, a.freqs_cis, a.kv_norm_gamma, a.epsilon
    check(
        isinstance(params, KVCacheParams) and params.is_mla,
        "params",
        "the KVCacheParams of an MLA cache (is_mla=True)",
        Described(params) if not isinstance(params, KVCacheParams) else "is_mla=False",
    )
    check(
        isinstance(kv_inputs, KVCacheInputsPerDevice),
        "kv_inputs",
        "a KVCacheInputsPerDevice",
        Described(kv_inputs),
    )
    check(
        is_int(layer_idx) and 0 <= layer_idx < params.num_layers,
        "layer_idx",
        Lazy(lambda: f"an int in [0, {params.num_layers})"),
        repr(layer_idx),
    )
    check_granularities(a.k_gran, a.n_gran)
    device = _check_cache(params, kv_inputs)
    if a.num_partitions is None and kv_inputs.mla_num_partitions is not None:
        _check_mla_num_partitions(kv_inputs.mla_num_partitions)
    rope_dim, d_qk = params.mla_rope_dim, params.head_dim
    rank = d_qk - rope_dim
    check(
        isinstance(q, torch.Tensor) and q.ndim == 3 and q.dtype == params.dtype,
        "q",
        Lazy(lambda: f"a {params.dtype} [tokens, h_q, qk_nope_dim + {rope_dim}] tensor"),
        Described(q),
    )
    check(
        q.device == device,
        "q.device",
        Lazy(lambda: f"the cache's device {device}"),
        Lazy(lambda: q.device),
    )
    tokens, h_q, _ = q.shape
    check(
        isinstance(a.input_row_offsets, torch.Tensor)
        and a.input_row_offsets.shape == (kv_inputs.cache_lengths.shape[0] + 1,),
        "input_row_offsets",
        Lazy(
            lambda: (
                f"a [batch + 1 = {kv_inputs.cache_lengths.shape[0] + 1}] tensor (batch: "
                "kv_inputs.cache_lengths)"
            )
        ),
        Described(a.input_row_offsets),
    )
    _check_weight(
        a,
        "w_uk",
        (h_q, rank, None),
        Lazy(lambda: f"[h_q={h_q}, kv_lora_rank={rank}, qk_nope_dim]"),
        device,
    )
    nope = a.w_uk.shape[2]
    check(nope >= 1, "w_uk", "a last dim qk_nope_dim >= 1", Lazy(lambda: tuple(a.w_uk.shape)))
    check(
        q.shape[2] == nope + rope_dim,
        "q",
        Lazy(
            lambda: (
                f"last dim qk_nope_dim + rope_dim = {nope} + {rope_dim} (w_uk.shape[2] + "
                "params.mla_rope_dim)"
            )
        ),
        Lazy(lambda: tuple(q.shape)),
    )
    _check_weight(
        a,
        "w_uv",
        (h_q, None, None),
        Lazy(lambda: f"[h_q={h_q}, v_head_dim, d_v <= {MAX_D_V}]"),
        device,
    )
    d_v = a.w_uv.shape[2]
    top = min(d_qk, MAX_D_V)
    check(
        1 <= d_v <= top,
        "w_uv",
        Lazy(lambda: f"last dim d_v in [1, {top}]"),
        Lazy(lambda: tuple(a.w_uv.shape)),
    )
    check(
        isinstance(new_kv, torch.Tensor)
        and tuple(new_kv.shape) == (tokens, 1, d_qk)
        and new_kv.dtype == params.dtype
        and new_kv.device == device,
        "new_kv",
        Lazy(
            lambda: (
                f"a {params.dtype} tensor of shape ({tokens}, 1, {d_qk}) on {device} (un-normed "
                "latent then un-roped k_rope of each new token)"
            )
        ),
        Described(new_kv),
    )
    check(
        isinstance(freqs_cis, torch.Tensor)
        and freqs_cis.ndim == 2
        and freqs_cis.shape[0] >= 1
        and freqs_cis.shape[1] == rope_dim
        and freqs_cis.dtype in FLOAT_DTYPES
        and freqs_cis.device == device,
        "freqs_cis",
        Lazy(
            lambda: (
                f"a [max_pos >= 1, {rope_dim}] tensor of (cos, sin) pairs with dtype in "
                f"{FLOAT_DTYPES} on {device}"
            )
        ),
        Described(freqs_cis),
    )
    check(
        isinstance(kv_norm_gamma, torch.Tensor)
        and tuple(kv_norm_gamma.shape) == (rank,)
        and kv_norm_gamma.dtype in FLOAT_DTYPES
        and kv_norm_gamma.device == device,
        "kv_norm_gamma",
        Lazy(lambda: f"a tensor of shape ({rank},) with dtype in {FLOAT_DTYPES} on {device}"),
        Described(kv_norm_gamma),
    )
    check_scale(a.scale, optional=False)
    check(
        isinstance(epsilon, numbers.Real)
        and not isinstance(epsilon, bool)
        and math.isfinite(epsilon)
        and epsilon >= 0,
        "epsilon",
        "a finite float >= 0",
        Lazy(lambda: repr(epsilon)),
    )
    check(
        isinstance(a.interleaved_rope, bool),
        "interleaved_rope",
        "a bool",
        Lazy(lambda: repr(a.interleaved_rope)),
    )


@typed_binding
def mla_decode_branch_fp8(
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
    mask: str | Mask = "causal",
    interleaved_rope: bool = True,
    d_indices: torch.Tensor | None = None,
    topk_lengths: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_kv: RowOperand | None = None,
    extra_d_indices: torch.Tensor | None = None,
    extra_topk_lengths: torch.Tensor | None = None,
    num_partitions: int | None = None,
    out: torch.Tensor | None = None,
    backend: str | None = None,
) -> torch.Tensor:
    """Fused FP8 MLA decode branch: q_nope @ w_uk, RoPE + RMSNorm of the new tokens written
    into the cache, concat, mla_decode, @ w_uv (MAX's `mla_decode_branch_fp8`).

    q: [tokens, h_q, qk_nope_dim + rope_dim] params.dtype (bf16): q_nope then the un-roped
      q_rope of each new token.
    input_row_offsets: [batch + 1] int32 prefix sums (seed: uint32).
    freqs_cis: float32 [max_pos, rope_dim] (cos, sin) pairs (`ops.linear.make_freqs_cis`;
      bf16/fp16/fp64 are read as float32).
    kv_norm_gamma: [kv_lora_rank] RMSNorm weight of the latent (kv_lora_rank =
      params.head_dim - params.mla_rope_dim), float32/bf16/fp16/fp64.
    kv_inputs, params, layer_idx: the paged MLA cache (seed: kv_collection + layer_idx); the
      new tokens are written at cache_lengths[b] + i (pages must be allocated). kv_inputs'
      buffers must be params' (`allocate_buffers(params, ...)`), layer_idx an int in
      [0, params.num_layers).
    scale: softmax scale of the decode, a finite float > 0. epsilon: RMSNorm epsilon, a
      finite float >= 0.
    w_uk: [h_q, kv_lora_rank, qk_nope_dim] e4m3, w_uk_scale [h_q, ceil(kv_lora_rank/n_gran),
      ceil(qk_nope_dim/k_gran)] float32 or e8m0.
    w_uv: [h_q, v_head_dim, d_v] e4m3 (d_v <= 512 = value dims of the decode, kv_lora_rank
      for DeepSeek V3), w_uv_scale [h_q, ceil(v_head_dim/n_gran), ceil(d_v/k_gran)].
      Weight scales must be finite and > 0: checked when they are on the CPU, trusted (no
      host sync) on a GPU, as `fp8_bmm` does.
    new_kv: [tokens, 1, head_dim] params.dtype, each new token's un-normed latent followed by
      its un-roped k_rope (seed: the `kv_input_fn` lambda).
    k_gran, n_gran: weight block / activation group sizes, ints in [1, 2^31 - 1] (seed:
      k/n_scale_granularity; m_scale_granularity is fixed at 1: one activation scale per row
      and k group).
    mask: 'causal' or 'null' (seed: mask_str); sparse decode applies no mask.
    interleaved_rope: RoPE pairs (2i, 2i+1) (DeepSeek) or (i, i + rope_dim/2).
    d_indices, topk_lengths: sparse decode (seed: sparse_mla=True, d_indices + indices_stride
      = d_indices.shape[1], topk_lengths), see `mla_decode`.
    attn_sink: [h_q] float32 (seed: attn_sink_ptr).
    extra_kv, extra_d_indices, extra_topk_lengths: the extra cache as an operand carrying its
      own scales (seed: extra_k + extra_scales_ptr, extra_indices_stride implicit).
    num_partitions: split-K partitions, None or an int in [1, 65535] (seed:
      num_partitions_in); None takes kv_inputs.mla_num_partitions (a one-element host tensor)
      when present (seed: scalar_args_buf), else the decode's choice.
    out: optional preallocated [tokens, h_q, v_head_dim] buffer in q.dtype (seed: output).
    backend: "triton" or "reference" (seed: target; DeviceContext is q's device).

    Returns out [tokens, h_q, v_head_dim] in q.dtype.

    Raises InvalidArgumentError naming the argument (a missing or unknown one included)
    before anything is written: the cache, out and every other argument are then unchanged.
    """
    a = BranchArgs(
        q, input_row_offsets, freqs_cis, kv_norm_gamma, kv_inputs, params, layer_idx, scale,
        epsilon, w_uk, w_uk_scale, w_uv, w_uv_scale, new_kv, k_gran, n_gran, mask,
        interleaved_rope, d_indices, topk_lengths, attn_sink, extra_kv, extra_d_indices,
        extra_topk_lengths, num_partitions, out,
    )  # fmt: skip
    _validate(a)
    _check_mask(a)
    tokens, h_q, _ = q.shape
    # Step 4's arguments, checked on a zero-copy stand-in for q_full [tokens, h_q, head_dim].
    q_full_spec = q[..., :1].expand(tokens, h_q, params.head_dim)
    validate_mla_decode_args(
        q_full_spec,
        a.cache(),
        input_row_offsets,
        **a.decode_kwargs(),
        num_partitions=num_partitions,
        out=None,
        names={
            "q_row_offsets": "input_row_offsets",
            "indices": "d_indices",
            "extra_indices": "extra_d_indices",
        },
    )
    check_out(out, (tokens, h_q, a.v_head_dim), q)
    if choose_backend(q.device, backend) == "triton":
        from .triton_branch import mla_decode_branch_fp8_triton

        return mla_decode_branch_fp8_triton(a)
    return mla_decode_branch_fp8_reference(a)


__all__ = ["BranchArgs", "mla_decode_branch_fp8", "mla_decode_branch_fp8_reference"]
