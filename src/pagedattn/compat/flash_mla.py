"""FlashMLA-compatible MLA decode running on `pagedattn.ops.mla.mla_decode`.

`get_mla_metadata` and `flash_mla_with_kvcache` keep the signatures and semantics of FlashMLA's
current Python interface (`flash_mla/flash_mla_interface.py`; docs/compat.md):

- q `[b, s_q, h_q, d_qk]` (d_qk 576 for DeepSeek V3/V3.2, 512 for V4), k_cache
  `[num_blocks, page_block_size, 1, d]` in q's dtype, or uint8/int8/float8_e4m3fn bytes in
  FlashMLA's FP8 layouts with `is_fp8_kvcache=True`: V32 (656 B a token, d_qk 576) or MODEL1
  (584 B a token, d_qk 512). The cache is viewed as a pagedattn operand in place (no copy),
  except MODEL1 caches whose block stride is not a multiple of 584 bytes (see below).
- Dense: `block_table [b, max_blocks]`, `cache_seqlens [b]` (tokens including the s_q new ones);
  with `causal`, query i of a request sees keys `< seqlen - s_q + i + 1`, else all `seqlen`.
- Sparse: `indices [b, s_q, topk]` int32 of `block * page_block_size + offset` (physical block
  ids, the encoding pagedattn uses too, so no conversion); -1 and any out-of-range value are
  skipped; `topk_length [b]` limits each request to its leftmost entries. Extra cache:
  `extra_k_cache` + `extra_indices_in_kvcache` (+ `extra_topk_length`), same softmax.
- `attn_sink [h_q]` float32 scales the output by `1 / (1 + exp(sink - lse))` (+inf gives 0).
- Returns `(out [b, s_q, h_q, head_dim_v], lse [b, h_q, s_q] float32)`: natural-log LSE over keys
  only (sink excluded); a query with no valid key gets out 0 and lse +inf (pagedattn's -inf is
  converted).

Beyond FlashMLA (documented extensions): any page size, BF16 sparse caches, sinks and extra
caches in dense mode, FP8 dense caches. MODEL1 caches whose block stride is not a multiple of
584 bytes (FlashMLA's reference allocator pads each block to a multiple of 576 bytes) are copied
into a compact layout on each call; pagedattn's own caches (`to_flashmla_cache`) never are.
"""

from __future__ import annotations

import dataclasses
import numbers

import torch

from ..errors import InvalidArgumentError, Lazy, check
from ..fp8.mla_formats import MODEL1_BYTES, MODEL1_D_QK, V32_BYTES, V32_D_QK
from ..operands import RowOperand
from ..ops._checks import DescribedValue as _describe
from ..ops._checks import check_int32, check_scale
from ..ops.mla import MAX_Q_PER_REQUEST, mla_decode
from . import UnsupportedFeatureError
from ._paging import paged_row_strides

FP8_CACHE_DTYPES = (torch.uint8, torch.int8, torch.float8_e4m3fn)
Q_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
D_QK_VALUES = (V32_D_QK, MODEL1_D_QK)  # 576, 512
_K_CACHE_SHAPE = "a [num_blocks, page_block_size, num_heads_k, head_dim] tensor"


@dataclasses.dataclass
class FlashMLASchedMeta:
    """FlashMLA's scheduler metadata, returned by `get_mla_metadata`.

    The first `flash_mla_with_kvcache` call records the problem's configuration; later calls
    with the same object must match it (as FlashMLA requires). pagedattn also keeps the
    call's static index tensors here, so a reused object allocates nothing per call.
    """

    @dataclasses.dataclass
    class Config:
        b: int
        s_q: int
        h_q: int
        page_block_size: int
        h_k: int

        causal: bool
        is_fp8_kvcache: bool
        topk: int | None

        extra_page_block_size: int | None
        extra_topk: int | None

    have_initialized: bool = False
    config: Config | None = None
    tile_scheduler_metadata: torch.Tensor | None = None  # FlashMLA's; unused by pagedattn
    num_splits: torch.Tensor | None = None  # FlashMLA's; unused by pagedattn
    _static: dict = dataclasses.field(default_factory=dict, repr=False, compare=False)

    def static(self, key: tuple, make) -> torch.Tensor:
        """A per-configuration constant tensor, made once."""
        t = self._static.get(key)
        if t is None:
            t = self._static[key] = make()
        return t


def get_mla_metadata(*args: object, **kwargs: object) -> tuple[FlashMLASchedMeta, None]:
    """A fresh `FlashMLASchedMeta` (filled by the first `flash_mla_with_kvcache` call).

    Arguments are accepted and ignored, as in FlashMLA (the old interface passed
    cache_seqlens, num_q_tokens_per_head_k, num_heads_k, ...). Returns (meta, None).
    """
    return FlashMLASchedMeta(), None


def _check_4d(t: object, name: str, expected: str) -> None:
    """`t` is a 4-D tensor; `expected` names its dims in the error message."""
    check(isinstance(t, torch.Tensor) and t.ndim == 4, name, expected, _describe(t))


def _mla_operand(
    k_cache: object,
    name: str,
    is_fp8: bool,
    d_qk: int,
    q_dtype: torch.dtype,
    cache_lengths: torch.Tensor,
    lut: torch.Tensor,
) -> RowOperand:
    """FlashMLA `k_cache [num_blocks, page_block_size, 1, d or bytes]` -> a paged RowOperand
    over the same memory (token `offset` of block `p` is row `p * page_stride_rows + offset`)."""
    _check_4d(k_cache, name, _K_CACHE_SHAPE)
    P, ps, hk, row = k_cache.shape
    check(hk == 1, Lazy(lambda: f"{name}.shape[2]"), "num_heads_k = 1 (one latent head)", hk)
    check(P >= 1 and ps >= 1, name, "at least one block of at least one token", k_cache.shape)
    check(
        k_cache.device == lut.device,
        Lazy(lambda: f"{name}.device"),
        Lazy(lambda: str(lut.device)),
        k_cache.device,
    )
    fmt, scale_dtype = None, None
    if is_fp8:
        check(
            k_cache.dtype in FP8_CACHE_DTYPES,
            Lazy(lambda: f"{name}.dtype"),
            Lazy(lambda: f"one of {FP8_CACHE_DTYPES} with is_fp8_kvcache=True"),
            k_cache.dtype,
        )
        raw = k_cache if k_cache.dtype == torch.uint8 else k_cache.view(torch.uint8)
        if row == V32_BYTES:
            fmt, want_d, scale_dtype = "flashmla_v32", V32_D_QK, torch.float32
        elif row == MODEL1_BYTES:
            fmt, want_d, scale_dtype = "flashmla_model1", MODEL1_D_QK, torch.float8_e8m0fnu
        else:
            raise InvalidArgumentError(
                f"{name}.shape[-1]: expected {V32_BYTES} (FlashMLA V32) or {MODEL1_BYTES} "
                f"(MODEL1) bytes a token with is_fp8_kvcache=True, got {row}"
            )
        check(
            d_qk == want_d,
            "q.shape[-1]",
            Lazy(lambda: f"{want_d} for a {row}-byte FP8 cache ({fmt})"),
            d_qk,
        )
    else:
        check(
            k_cache.dtype == q_dtype,
            Lazy(lambda: f"{name}.dtype"),
            Lazy(lambda: f"q.dtype={q_dtype} (or pass is_fp8_kvcache=True for an FP8 byte cache)"),
            k_cache.dtype,
        )
        check(
            row == d_qk,
            Lazy(lambda: f"{name}.shape[-1]"),
            Lazy(lambda: f"head_dim = q.shape[-1] = {d_qk}"),
            row,
        )
        raw = k_cache
    s0, s1, _, s3 = raw.stride()
    check(s3 == 1 or row == 1, Lazy(lambda: f"{name}.stride(-1)"), "1", Lazy(raw.stride))
    if fmt == "flashmla_model1" and (s1 != MODEL1_BYTES or s0 % MODEL1_BYTES):
        # A MODEL1 block is page_size * 584 contiguous bytes; FlashMLA's allocator pads the
        # block stride to a multiple of 576 bytes, which pagedattn's row addressing (page
        # stride in whole 584-byte rows) cannot express: copy into a compact layout.
        raw = raw.contiguous()
        s0, s1 = raw.stride(0), raw.stride(1)
    st, psr, n_rows = paged_row_strides(P, ps, s0, s1, name, "block", raw.stride())
    rows = raw.as_strided((n_rows, 1, row), (st, row, 1), raw.storage_offset())
    return RowOperand(
        rows,
        cache_lengths,
        lut=lut,
        page_size=ps,
        page_stride_rows=psr,
        head_dim=d_qk,
        quant_format=fmt,
        scale_dtype=scale_dtype,
        logical_dtype=q_dtype if fmt is None else torch.bfloat16,
        rope_dim=64 if fmt is not None else 0,
    )


def _check_int32(t: object, name: str, shape: tuple[int | None, ...], dev: torch.device) -> None:
    """`ops._checks.check_int32`, the expected shape ([b, *, ...]) as its description."""
    dims = Lazy(lambda: "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]")
    check_int32(t, name, shape, dims, dev)


def flash_mla_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    block_table: torch.Tensor | None,
    cache_seqlens: torch.Tensor | None,
    head_dim_v: int,
    tile_scheduler_metadata: FlashMLASchedMeta | torch.Tensor | None = None,
    num_splits: torch.Tensor | None = None,
    softmax_scale: float | None = None,
    causal: bool = False,
    is_fp8_kvcache: bool = False,
    indices: torch.Tensor | None = None,
    attn_sink: torch.Tensor | None = None,
    extra_k_cache: torch.Tensor | None = None,
    extra_indices_in_kvcache: torch.Tensor | None = None,
    topk_length: torch.Tensor | None = None,
    extra_topk_length: torch.Tensor | None = None,
    *,
    backend: str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """MLA decode with FlashMLA's interface (see the module docstring for the semantics).

    q: [b, s_q, h_q, d_qk] bf16 (fp16/fp32 accepted), d_qk 576 or 512, s_q <= 8
      (MAX_Q_PER_REQUEST).
    k_cache: [num_blocks, page_block_size, 1, d_qk] (q's dtype) or FP8 bytes (V32 656 /
      MODEL1 584 per token) with is_fp8_kvcache=True.
    block_table: [b, max_blocks] int32; cache_seqlens: [b] int32 (dense mode; both may be None
      in sparse mode). Dense mode needs cache_seqlens[i] >= s_q.
    head_dim_v: V dims (the first head_dim_v of K; 512 for DeepSeek).
    tile_scheduler_metadata: from get_mla_metadata (reused across calls of one configuration),
      None, or an old-interface tensor (ignored). num_splits: None (or an old-interface
      tensor, ignored).
    softmax_scale: None = 1/sqrt(d_qk). causal: dense only.
    indices: sparse mode, [b, s_q, topk] int32 block * page_block_size + offset.
    attn_sink: [h_q] float32. extra_k_cache / extra_indices_in_kvcache [b, s_q, extra_topk] /
      topk_length, extra_topk_length [b] int32: see the module docstring.
    backend: pagedattn backend override ("triton" / "reference"; default by device).
    Returns (out [b, s_q, h_q, head_dim_v] q.dtype, lse [b, h_q, s_q] float32).
    """
    _check_4d(q, "q", "a [batch_size, seq_len_q, num_heads_q, head_dim] tensor")
    check(q.dtype in Q_DTYPES, "q.dtype", Lazy(lambda: f"one of {Q_DTYPES}"), q.dtype)
    b, s_q, h_q, d_qk = q.shape
    check(b >= 1 and s_q >= 1 and h_q >= 1, "q", "non-empty dims", Lazy(lambda: tuple(q.shape)))
    check(d_qk in D_QK_VALUES, "q.shape[-1]", Lazy(lambda: f"one of {D_QK_VALUES}"), d_qk)
    check(
        isinstance(head_dim_v, numbers.Integral)
        and not isinstance(head_dim_v, bool)
        and 1 <= head_dim_v <= d_qk,
        "head_dim_v",
        Lazy(lambda: f"an int in [1, {d_qk}] (512 for DeepSeek)"),
        _describe(head_dim_v),
    )
    head_dim_v = int(head_dim_v)
    check(
        num_splits is None or isinstance(num_splits, torch.Tensor),
        "num_splits",
        "None (FlashMLA's current interface) or an old-interface tensor",
        _describe(num_splits),
    )
    check(isinstance(causal, bool), "causal", "a bool", _describe(causal))
    check(isinstance(is_fp8_kvcache, bool), "is_fp8_kvcache", "a bool", _describe(is_fp8_kvcache))
    check_scale(softmax_scale, "softmax_scale", describe_got=True)
    if isinstance(tile_scheduler_metadata, FlashMLASchedMeta):
        meta = tile_scheduler_metadata
    else:
        check(
            tile_scheduler_metadata is None or isinstance(tile_scheduler_metadata, torch.Tensor),
            "tile_scheduler_metadata",
            "a FlashMLASchedMeta from get_mla_metadata(), None, or an old-interface tensor",
            _describe(tile_scheduler_metadata),
        )
        meta = FlashMLASchedMeta()  # one-shot: nothing to check against or reuse
    sparse = indices is not None
    if sparse and causal:
        raise InvalidArgumentError(
            "causal: expected False when indices is given (sparse attention has no causal mask)"
        )
    dev = q.device
    _check_4d(k_cache, "k_cache", _K_CACHE_SHAPE)
    has_extra = extra_k_cache is not None
    if has_extra:
        _check_4d(
            extra_k_cache, "extra_k_cache", "a [num_blocks, page_block_size, 1, head_dim] tensor"
        )
    topk = indices.shape[-1] if isinstance(indices, torch.Tensor) else None
    extra_topk = (
        extra_indices_in_kvcache.shape[-1]
        if isinstance(extra_indices_in_kvcache, torch.Tensor)
        else None
    )
    config = FlashMLASchedMeta.Config(
        b,
        s_q,
        h_q,
        k_cache.shape[1],
        k_cache.shape[2],
        causal,
        is_fp8_kvcache,
        topk,
        extra_k_cache.shape[1] if has_extra else None,
        extra_topk,
    )
    if not meta.have_initialized:
        meta.have_initialized = True
        meta.config = config
    elif meta.config != config:
        diff = [
            f"{f.name}: {getattr(meta.config, f.name)!r} -> {getattr(config, f.name)!r}"
            for f in dataclasses.fields(config)
            if getattr(meta.config, f.name) != getattr(config, f.name)
        ]
        raise InvalidArgumentError(
            "tile_scheduler_metadata: expected the configuration of its first call (reuse a "
            f"FlashMLASchedMeta only for identical shapes and flags), got {'; '.join(diff)}"
        )

    q_row_offsets = meta.static(
        ("q_row_offsets", dev, b, s_q),
        lambda: torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32, device=dev),
    )
    if sparse:
        _check_int32(indices, "indices", (b, s_q, None), dev)
        if topk_length is not None:
            _check_int32(topk_length, "topk_length", (b,), dev)
        cache_lengths = meta.static(
            ("zeros", dev, b), lambda: torch.zeros(b, dtype=torch.int32, device=dev)
        )
        if block_table is None:
            n_blocks = k_cache.shape[0]  # a one-column table of sentinels: never read
            lut = meta.static(
                ("sentinel_lut", dev, b, n_blocks),
                lambda: torch.full((b, 1), n_blocks, dtype=torch.int32, device=dev),
            )
        else:
            _check_int32(block_table, "block_table", (b, None), dev)
            lut = block_table
    else:
        check(
            topk_length is None,
            "topk_length",
            "None unless indices is given (sparse mode)",
            _describe(topk_length),
        )
        check(
            block_table is not None and cache_seqlens is not None,
            "block_table / cache_seqlens",
            "both given in dense mode (indices is None)",
            Lazy(lambda: f"{_describe(block_table)}, {_describe(cache_seqlens)}"),
        )
        _check_int32(block_table, "block_table", (b, None), dev)
        _check_int32(cache_seqlens, "cache_seqlens", (b,), dev)
        cache_lengths = cache_seqlens - s_q  # pagedattn counts tokens before the step
        lut = block_table
    kv = _mla_operand(k_cache, "k_cache", is_fp8_kvcache, d_qk, q.dtype, cache_lengths, lut)

    extra_kv = x_idx = None
    if has_extra:
        _check_int32(extra_indices_in_kvcache, "extra_indices_in_kvcache", (b, s_q, None), dev)
        if extra_topk_length is not None:
            _check_int32(extra_topk_length, "extra_topk_length", (b,), dev)
        n_x = extra_k_cache.shape[0]
        x_lut = meta.static(
            ("sentinel_lut", dev, b, n_x),
            lambda: torch.full((b, 1), n_x, dtype=torch.int32, device=dev),
        )
        extra_kv = _mla_operand(
            extra_k_cache, "extra_k_cache", is_fp8_kvcache, d_qk, q.dtype, cache_lengths, x_lut
        )
        x_idx = extra_indices_in_kvcache.reshape(b * s_q, extra_topk)
    else:
        for nm, t in (
            ("extra_indices_in_kvcache", extra_indices_in_kvcache),
            ("extra_topk_length", extra_topk_length),
        ):
            check(t is None, nm, "None unless extra_k_cache is given", _describe(t))

    if attn_sink is not None:
        check(
            isinstance(attn_sink, torch.Tensor)
            and attn_sink.dtype == torch.float32
            and tuple(attn_sink.shape) == (h_q,),
            "attn_sink",
            f"a float32 tensor of shape ({h_q},)",
            _describe(attn_sink),
        )
    if s_q > MAX_Q_PER_REQUEST:
        raise UnsupportedFeatureError(
            f"q.shape[1]: pagedattn's MLA decode takes at most {MAX_Q_PER_REQUEST} query "
            f"tokens a request (MTP / speculative verify), got s_q={s_q}"
        )
    out, lse = mla_decode(
        q.reshape(b * s_q, h_q, d_qk),
        kv,
        q_row_offsets,
        d_v=head_dim_v,
        scale=softmax_scale,
        causal=causal,
        indices=indices.reshape(b * s_q, topk) if sparse else None,
        topk_lengths=topk_length,
        extra_kv=extra_kv,
        extra_indices=x_idx,
        extra_topk_lengths=extra_topk_length if has_extra else None,
        attn_sink=attn_sink,
        backend=backend,
    )
    out = out.view(b, s_q, h_q, head_dim_v)
    # FlashMLA's [b, h_q, s_q] LSE, +inf where no key is valid, in one kernel (a transposing
    # copy, an -inf test and a masked fill took three launches)
    lse_t = torch.empty(b, h_q, s_q, dtype=lse.dtype, device=lse.device)
    torch.nan_to_num(
        lse.view(b, s_q, h_q).transpose(1, 2),
        nan=float("nan"),
        posinf=float("inf"),
        neginf=float("inf"),
        out=lse_t,
    )
    return out, lse_t


__all__ = ["FlashMLASchedMeta", "flash_mla_with_kvcache", "get_mla_metadata"]
