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
  As in FlashMLA, `seqlen` may be below s_q (0 included): a query that sees no key gets out 0
  and lse +inf. The kernels take the negative cache length `seqlen - s_q` as it is; the
  reference backend (which takes none) attends the same keys through sparse indices.
- Sparse: `indices [b, s_q, topk]` int32 of `block * page_block_size + offset` (physical block
  ids, the encoding pagedattn uses too, so no conversion); -1 and any out-of-range value are
  skipped; `topk_length [b]` limits each request to its leftmost entries. Extra cache:
  `extra_k_cache` + `extra_indices_in_kvcache` (+ `extra_topk_length`), same softmax.
- `attn_sink [h_q]` float32 scales the output by `1 / (1 + exp(sink - lse))` (+inf gives 0).
- Returns `(out [b, s_q, h_q, head_dim_v], lse [b, h_q, s_q] float32)`: natural-log LSE over keys
  only (sink excluded); a query with no valid key gets out 0 and lse +inf (pagedattn's -inf is
  converted; NaN stays NaN).
- Errors: every bad argument raises `InvalidArgumentError` naming it (a call that does not bind
  included), before the metadata object or anything else is written; b = 0 and s_q = 0 are
  refused (FlashMLA asserts a positive batch).

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
from ..ops.mla import MAX_D_V, MAX_Q_PER_REQUEST, mla_decode
from . import UnsupportedFeatureError
from ._args import resolve_backend, typed_call
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


@dataclasses.dataclass(slots=True)
class _CacheRows:
    """A checked FlashMLA k_cache viewed as pagedattn rows [n_rows, 1, row] (no copy, except
    padded MODEL1 blocks): token `offset` of block `p` is row `p * page_stride_rows + offset`."""

    rows: torch.Tensor
    num_blocks: int
    page_size: int
    page_stride_rows: int
    fmt: str | None
    scale_dtype: torch.dtype | None


def _cache_rows(
    k_cache: object, name: str, is_fp8: bool, d_qk: int, q_dtype: torch.dtype, dev: torch.device
) -> _CacheRows:
    """Check a FlashMLA `k_cache [num_blocks, page_block_size, 1, d or bytes]` (on `dev`) and
    view it as rows. Raises InvalidArgumentError naming `name`; reads no value."""
    _check_4d(k_cache, name, _K_CACHE_SHAPE)
    P, ps, hk, row = k_cache.shape
    check(hk == 1, Lazy(lambda: f"{name}.shape[2]"), "num_heads_k = 1 (one latent head)", hk)
    check(P >= 1 and ps >= 1, name, "at least one block of at least one token", k_cache.shape)
    check(
        k_cache.device == dev,
        Lazy(lambda: f"{name}.device"),
        Lazy(lambda: f"q.device={dev}"),
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
    return _CacheRows(rows, P, ps, psr, fmt, scale_dtype)


def _operand(
    c: _CacheRows, d_qk: int, q_dtype: torch.dtype, cache_lengths: torch.Tensor, lut: torch.Tensor
) -> RowOperand:
    """A paged RowOperand over checked cache rows."""
    return RowOperand(
        c.rows,
        cache_lengths,
        lut=lut,
        page_size=c.page_size,
        page_stride_rows=c.page_stride_rows,
        head_dim=d_qk,
        quant_format=c.fmt,
        scale_dtype=c.scale_dtype,
        logical_dtype=q_dtype if c.fmt is None else torch.bfloat16,
        rope_dim=64 if c.fmt is not None else 0,
    )


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
    c = _cache_rows(k_cache, name, is_fp8, d_qk, q_dtype, lut.device)
    return _operand(c, d_qk, q_dtype, cache_lengths, lut)


def _check_int32(t: object, name: str, shape: tuple[int | None, ...], dev: torch.device) -> None:
    """`ops._checks.check_int32`, the expected shape ([b, *, ...]) as its description."""
    dims = Lazy(lambda: "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]")
    check_int32(t, name, shape, dims, dev)


def _check_dense_values(
    cache_seqlens: torch.Tensor, block_table: torch.Tensor, page_size: int, num_blocks: int
) -> list[int]:
    """Host checks of a dense call's device values (only where they are free: CPU tensors, or
    the reference backend, which reads them anyway): each `cache_seqlens[i]` in
    [0, block_table.shape[1] * page_block_size], and the block ids of the tokens a request
    reads in [0, num_blocks). Returns the sequence lengths."""
    lens = cache_seqlens.tolist()
    cap = block_table.shape[1] * page_size
    for i, n in enumerate(lens):
        if not 0 <= n <= cap:
            raise InvalidArgumentError(
                f"cache_seqlens[{i}]: expected a length in [0, block_table.shape[1] * "
                f"page_block_size = {cap}], got {n}"
            )
    bt = block_table.detach().to("cpu", torch.int64)
    need = torch.arange(bt.shape[1])[None, :] < torch.tensor(
        [-(-n // page_size) for n in lens], dtype=torch.int64
    ).view(-1, 1)
    bad = need & ((bt < 0) | (bt >= num_blocks))
    if bool(bad.any()):
        i, j = (int(x) for x in torch.nonzero(bad)[0])
        raise InvalidArgumentError(
            f"block_table[{i}, {j}]: expected a block id in [0, num_blocks = {num_blocks}) "
            f"for a token request {i} reads (cache_seqlens[{i}] = {lens[i]}), got {int(bt[i, j])}"
        )
    return lens


def _dense_as_sparse(
    lens: list[int], block_table: torch.Tensor, s_q: int, causal: bool, page_size: int
) -> torch.Tensor:
    """Sparse indices [b * s_q, width] equivalent to dense FlashMLA attention (reference backend,
    a request with fewer keys than queries): query i of request r sees its first
    `seqlen - s_q + i + 1` (causal) or `seqlen` keys, none when that is <= 0; the entries
    past them are -1. (The kernels take negative cache lengths directly.)"""
    b = len(lens)
    n = torch.tensor(lens, dtype=torch.int64).view(b, 1)
    i = torch.arange(s_q, dtype=torch.int64).view(1, s_q)
    vis = (n - s_q + i + 1 if causal else n.expand(b, s_q)).clamp_min(0)  # [b, s_q]
    width = max(int(vis.max()), 1)
    j = torch.arange(width, dtype=torch.int64)
    bt = block_table.detach().to("cpu", torch.int64)
    cols = (j // page_size).clamp(max=bt.shape[1] - 1)
    enc = bt[:, cols] * page_size + j % page_size  # [b, width]
    idx = torch.where(j.view(1, 1, -1) < vis.unsqueeze(-1), enc.unsqueeze(1), -1)
    return idx.reshape(b * s_q, width).to(block_table.device, torch.int32)


@typed_call
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

    q: [b, s_q, h_q, d_qk] bf16 (fp16/fp32 accepted), b >= 1, 1 <= s_q <= 8
      (MAX_Q_PER_REQUEST), d_qk 576 or 512.
    k_cache: [num_blocks, page_block_size, 1, d_qk] (q's dtype) or FP8 bytes (V32 656 /
      MODEL1 584 per token) with is_fp8_kvcache=True.
    block_table: [b, max_blocks] int32; cache_seqlens: [b] int32 (dense mode; both may be None
      in sparse mode). cache_seqlens[i] may be below s_q, 0 included: query j of request i
      sees keys `< cache_seqlens[i] - s_q + j + 1` (causal) or `< cache_seqlens[i]`, and a
      query that sees none gets out 0 and lse +inf.
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

    Raises InvalidArgumentError (UnsupportedFeatureError for s_q > 8) naming the argument
    before anything is written: a rejected call leaves `tile_scheduler_metadata` as it was.
    Device values are checked on the host only where that is free (CPU tensors, or the
    reference backend): cache_seqlens in [0, block_table.shape[1] * page_block_size] and the
    block ids of the tokens read in [0, num_blocks); on CUDA the kernels guard them.
    """
    # Scalars, flags and q ------------------------------------------------------------------
    _check_4d(q, "q", "a [batch_size, seq_len_q, num_heads_q, head_dim] tensor")
    check(q.dtype in Q_DTYPES, "q.dtype", Lazy(lambda: f"one of {Q_DTYPES}"), q.dtype)
    b, s_q, h_q, d_qk = q.shape
    check(b >= 1 and s_q >= 1 and h_q >= 1, "q", "non-empty dims", Lazy(lambda: tuple(q.shape)))
    check(d_qk in D_QK_VALUES, "q.shape[-1]", Lazy(lambda: f"one of {D_QK_VALUES}"), d_qk)
    if s_q > MAX_Q_PER_REQUEST:
        raise UnsupportedFeatureError(
            f"q.shape[1]: pagedattn's MLA decode takes at most {MAX_Q_PER_REQUEST} query "
            f"tokens a request (MTP / speculative verify), got s_q={s_q}"
        )
    check(
        isinstance(head_dim_v, numbers.Integral)
        and not isinstance(head_dim_v, bool)
        and 1 <= head_dim_v <= min(d_qk, MAX_D_V),
        "head_dim_v",
        Lazy(lambda: f"an int in [1, {min(d_qk, MAX_D_V)}] (512 for DeepSeek)"),
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
    check(dev.type in ("cpu", "cuda"), "q.device", "a CPU or CUDA device", dev)
    backend = resolve_backend(dev, backend, "backend")

    # Caches ----------------------------------------------------------------------------------
    main = _cache_rows(k_cache, "k_cache", is_fp8_kvcache, d_qk, q.dtype, dev)
    has_extra = extra_k_cache is not None
    extra = None
    if has_extra:
        extra = _cache_rows(extra_k_cache, "extra_k_cache", is_fp8_kvcache, d_qk, q.dtype, dev)
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
    # Index tensors ---------------------------------------------------------------------------
    lens = None
    if sparse:
        _check_int32(indices, "indices", (b, s_q, None), dev)
        if topk_length is not None:
            _check_int32(topk_length, "topk_length", (b,), dev)
        if block_table is not None:
            _check_int32(block_table, "block_table", (b, None), dev)
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
        check(
            block_table.shape[1] >= 1,
            "block_table",
            "at least one column",
            Lazy(lambda: tuple(block_table.shape)),
        )
        if dev.type == "cpu" or backend == "reference":
            lens = _check_dense_values(cache_seqlens, block_table, main.page_size, main.num_blocks)
    if has_extra:
        _check_int32(extra_indices_in_kvcache, "extra_indices_in_kvcache", (b, s_q, None), dev)
        if extra_topk_length is not None:
            _check_int32(extra_topk_length, "extra_topk_length", (b,), dev)
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
            and tuple(attn_sink.shape) == (h_q,)
            and attn_sink.device == dev,
            "attn_sink",
            Lazy(lambda: f"a float32 tensor of shape ({h_q},) on {dev}"),
            _describe(attn_sink),
        )

    if meta.have_initialized and meta.config != config:
        diff = [
            f"{f.name}: {getattr(meta.config, f.name)!r} -> {getattr(config, f.name)!r}"
            for f in dataclasses.fields(config)
            if getattr(meta.config, f.name) != getattr(config, f.name)
        ]
        raise InvalidArgumentError(
            "tile_scheduler_metadata: expected the configuration of its first call (reuse a "
            f"FlashMLASchedMeta only for identical shapes and flags), got {'; '.join(diff)}"
        )

    # Every argument is checked: record the configuration, build the operands, launch --------
    if not meta.have_initialized:
        meta.have_initialized = True
        meta.config = config
    q_row_offsets = meta.static(
        ("q_row_offsets", dev, b, s_q),
        lambda: torch.arange(0, (b + 1) * s_q, s_q, dtype=torch.int32, device=dev),
    )
    # The reference takes no negative cache length: a request shorter than s_q is attended
    # through sparse indices of the same keys.
    emulate = not sparse and backend == "reference" and min(lens) < s_q
    zeros = None
    if sparse or has_extra or emulate:
        zeros = meta.static(
            ("zeros", dev, b), lambda: torch.zeros(b, dtype=torch.int32, device=dev)
        )
    mla_indices, mla_causal = None, causal
    if sparse:
        cache_lengths = zeros
        mla_indices = indices.reshape(b * s_q, topk)
        if block_table is None:
            n_blocks = main.num_blocks  # a one-column table of sentinels: never read
            lut = meta.static(
                ("sentinel_lut", dev, b, n_blocks),
                lambda: torch.full((b, 1), n_blocks, dtype=torch.int32, device=dev),
            )
        else:
            lut = block_table
    elif emulate:
        cache_lengths, lut = zeros, block_table
        mla_indices = _dense_as_sparse(lens, block_table, s_q, causal, main.page_size)
        mla_causal = False
    else:
        # pagedattn counts the tokens before the step; a request shorter than s_q gets a
        # negative length, whose early queries the kernels give no key (FlashMLA's rule).
        cache_lengths = cache_seqlens - s_q
        lut = block_table
    kv = _operand(main, d_qk, q.dtype, cache_lengths, lut)

    extra_kv = x_idx = None
    if has_extra:
        n_x = extra.num_blocks
        x_lut = meta.static(
            ("sentinel_lut", dev, b, n_x),
            lambda: torch.full((b, 1), n_x, dtype=torch.int32, device=dev),
        )
        extra_kv = _operand(extra, d_qk, q.dtype, zeros, x_lut)
        x_idx = extra_indices_in_kvcache.reshape(b * s_q, extra_topk)
    out, lse = mla_decode(
        q.reshape(b * s_q, h_q, d_qk),
        kv,
        q_row_offsets,
        d_v=head_dim_v,
        scale=softmax_scale,
        causal=mla_causal,
        indices=mla_indices,
        topk_lengths=topk_length,
        extra_kv=extra_kv,
        extra_indices=x_idx,
        extra_topk_lengths=extra_topk_length if has_extra else None,
        attn_sink=attn_sink,
        backend=backend,
    )
    out = out.view(b, s_q, h_q, head_dim_v)
    # FlashMLA's [b, h_q, s_q] LSE, +inf where no key is valid (NaN stays NaN), in one kernel
    # (a transposing copy, an -inf test and a masked fill took three launches)
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
