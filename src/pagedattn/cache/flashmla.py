"""One layer of an MLA cache as FlashMLA's `k_cache` argument, and back (host side, no kernels).

FlashMLA reads `[num_blocks, page_block_size, 1, bytes_per_token]`; a pagedattn MLA cache
(`kv_blocks`, `KVCacheParams.is_mla`) holds the same rows, so page ids, block tables and sparse
indices (`page * page_size + offset`) carry over unchanged. The byte layouts of the FP8 formats
(V32, MODEL1) are `fp8.mla_formats`'.
"""

from __future__ import annotations

import torch

from ..errors import check
from ..fp8.blockwise import FP8_DTYPE
from ..fp8.mla_formats import FLASHMLA_ALIGN, MODEL1_BLOCK_ALIGN, MODEL1_BYTES
from .params import KVCacheParams


def _check_mla_blocks(kv_blocks: torch.Tensor, params: KVCacheParams, layer_idx: int) -> None:
    check(params.is_mla, "params.is_mla", "True (FlashMLA caches are MLA caches)", False)
    fmt = params.quant_format
    check(
        fmt in (None, "flashmla_v32", "flashmla_model1"),
        "params.quantization",
        "None (bf16/fp16 cache), 'flashmla_v32' or 'flashmla_model1' (convert rope-aware rows "
        "with rope_aware_to_v32)",
        fmt,
    )
    check(
        isinstance(kv_blocks, torch.Tensor)
        and kv_blocks.ndim == 6
        and tuple(kv_blocks.shape) == params.blocks_shape(kv_blocks.shape[0])
        and kv_blocks.dtype == params.storage_dtype,
        "kv_blocks",
        f"a {params.storage_dtype} tensor of shape {params.blocks_shape(-1)} (-1: total_num_pages)",
        f"{tuple(kv_blocks.shape)} {kv_blocks.dtype}"
        if isinstance(kv_blocks, torch.Tensor)
        else type(kv_blocks),
    )
    check(
        isinstance(layer_idx, int) and 0 <= layer_idx < params.num_layers,
        "layer_idx",
        f"an int in [0, {params.num_layers})",
        layer_idx,
    )


def to_flashmla_cache(
    kv_blocks: torch.Tensor, params: KVCacheParams, layer_idx: int, *, copy: bool = False
) -> torch.Tensor:
    """One layer of an MLA cache as FlashMLA's `k_cache` argument of `flash_mla_with_kvcache`.

    Returns [total_num_pages, page_size, 1, bytes_per_token]: uint8 for the FP8 formats (pass
    `is_fp8_kvcache=True`; 656 bytes V32, 584 bytes MODEL1), params.dtype for an unquantized
    cache (576/512 values). Page ids, and so block tables and sparse indices
    `page * page_size + offset`, are the same as this cache's.

    copy=False: a view of kv_blocks (no copy; FlashMLA's reads see later writes). FlashMLA
    needs each block to be contiguous (stride(1) == bytes_per_token, true here) and, for its
    16-byte loads, every block to start 16-byte aligned. With MODEL1 (584-byte tokens) and an
    odd page_size some blocks are not: that raises InvalidArgumentError; use copy=True.
    copy=True: a fresh tensor laid out as FlashMLA's reference allocator does (MODEL1 block
    stride rounded up to a multiple of 576 bytes).
    FlashMLA's own kernels add limits of their own (dense bf16 decode: page_size 64).
    """
    _check_mla_blocks(kv_blocks, params, layer_idx)
    view = kv_blocks[:, 0, layer_idx]  # [P, page_size, 1, row_elems]
    fmt = params.quant_format
    if not copy:
        esz = view.element_size()
        aligned = (
            view.data_ptr() % FLASHMLA_ALIGN == 0 and (view.stride(0) * esz) % FLASHMLA_ALIGN == 0
        )
        check(
            aligned,
            "kv_blocks",
            f"FlashMLA blocks aligned to {FLASHMLA_ALIGN} bytes for a zero-copy view "
            "(MODEL1: an even page_size, or pass copy=True)",
            f"page_size={params.page_size}, block stride {view.stride(0) * esz} B, layer "
            f"{layer_idx} starting at {view.data_ptr() % FLASHMLA_ALIGN} mod {FLASHMLA_ALIGN}",
        )
        return view
    P, ps, H, D = view.shape
    if fmt == "flashmla_model1":
        block = ps * D
        stride0 = -(-block // MODEL1_BLOCK_ALIGN) * MODEL1_BLOCK_ALIGN
        buf = torch.empty(P, stride0, dtype=view.dtype, device=view.device)
        out = buf[:, :block].view(P, ps, H, D)
        out.copy_(view)
        return out
    return view.clone(memory_format=torch.contiguous_format)


def from_flashmla_cache(
    k_cache: torch.Tensor, kv_blocks: torch.Tensor, params: KVCacheParams, layer_idx: int
) -> None:
    """Write FlashMLA's `k_cache` ([total_num_pages, page_size, 1, bytes_per_token], uint8,
    int8 or float8_e4m3fn for the FP8 formats, params.dtype otherwise; any block stride)
    into layer `layer_idx` of kv_blocks. The inverse of `to_flashmla_cache`.
    """
    _check_mla_blocks(kv_blocks, params, layer_idx)
    dst = kv_blocks[:, 0, layer_idx]
    fmt = params.quant_format
    check(isinstance(k_cache, torch.Tensor), "k_cache", "a tensor", type(k_cache))
    check(
        tuple(k_cache.shape) == tuple(dst.shape),
        "k_cache",
        f"shape {tuple(dst.shape)} [num_blocks, page_block_size, 1, bytes_per_token]",
        tuple(k_cache.shape),
    )
    check(
        k_cache.device == kv_blocks.device, "k_cache.device", str(kv_blocks.device), k_cache.device
    )
    if fmt is None:
        check(k_cache.dtype == params.dtype, "k_cache.dtype", str(params.dtype), k_cache.dtype)
        dst.copy_(k_cache)
        return
    check(
        k_cache.dtype in (torch.uint8, torch.int8, FP8_DTYPE),
        "k_cache.dtype",
        "torch.uint8, torch.int8 or torch.float8_e4m3fn",
        k_cache.dtype,
    )
    check(k_cache.stride(-1) == 1, "k_cache.stride(-1)", "1", k_cache.stride(-1))
    if fmt == "flashmla_model1":
        # A MODEL1 block is page_size * 584 contiguous bytes (data, then the scale trailer).
        check(
            k_cache.stride(1) == MODEL1_BYTES,
            "k_cache.stride(1)",
            f"{MODEL1_BYTES} (each MODEL1 block contiguous)",
            k_cache.stride(1),
        )
    dst.copy_(k_cache.view(torch.uint8))
