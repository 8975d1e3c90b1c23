"""store_kv: write new tokens' K/V into a paged cache; rope_store_kv: a layer's RoPE and that
write in one launch; gather_kv: read a request back.

Host path: a store_kv / rope_store_kv call that takes the Triton kernel (one launch) is
validated once per call signature (`ops.prepared.PreparedOp`, as `ops.fused`' ops): a later
call of the same signature (the same params (by value), layer_idx, heads, eps, backend,
environment and CUDA device; the same dtypes, devices, shapes and strides of every tensor,
the cache's included, and the same 16-byte alignment of their pointers; any tensors) skips
the metadata checks, the dispatch, the operands and Triton's binder and launches the frozen
kernel. The host-value checks of a CPU cache still run on every call, before the launch. A
call whose signature never validated takes the full path, so bad arguments raise exactly as
without the cache.
"""

from __future__ import annotations

import numpy as np
import torch

from ...cache.inputs import KVCacheInputsPerDevice
from ...cache.params import KVCacheParams
from ...errors import INT32_MAX, InvalidArgumentError, check, check_int
from ...operands import PagedOperand, paged_layer_tensors
from .._checks import describe
from ..dispatch import BACKENDS, choose_backend
from ..fused import check_rope_qkv, rope_qkv, rope_triton_ok
from ..prepared import MISS, UNPREPARED, PreparedOp, current_device, env_state
from .reference import store_kv_reference, target_rows

#: Output dtypes gather_kv dequantizes to.
GATHER_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _bad(name: str, expected: str, got: object) -> InvalidArgumentError:
    return InvalidArgumentError(f"{name}: expected {expected}, got {describe(got)}")


def _check_cache(inputs: object, params: object, layer_idx: object) -> tuple[int, int]:
    """inputs / params / layer_idx consistent: (layer_idx as an int, total_num_pages).
    Metadata only (no tensor values are read); messages are built only on failure."""
    if not isinstance(params, KVCacheParams):
        raise _bad("params", "a KVCacheParams", params)
    if not isinstance(inputs, KVCacheInputsPerDevice):
        raise _bad("inputs", "a KVCacheInputsPerDevice", inputs)
    layer = check_int("layer_idx", layer_idx, 0, params.num_layers - 1)
    blocks = inputs.kv_blocks
    shape = blocks.shape if isinstance(blocks, torch.Tensor) else ()
    pages = shape[0] if len(shape) == 6 else 0
    if not (
        pages >= 1
        and shape == params.blocks_shape(pages)
        and blocks.dtype == params.storage_dtype
        and blocks.is_contiguous()
    ):
        raise _bad(
            "inputs.kv_blocks",
            f"a contiguous {params.storage_dtype} tensor of shape "
            f"{params.blocks_shape(max(pages, 1))} (params' layout, >= 1 page)",
            blocks,
        )
    dev = blocks.device
    if params.has_scale_buffer:
        sc = inputs.kv_scales
        want = torch.float32 if params.quant_format == "per_tensor" else params.scale_dtype
        if not (
            isinstance(sc, torch.Tensor)
            and sc.shape == params.scales_shape(pages)
            and sc.dtype == want
            and sc.device == dev
            and sc.is_contiguous()
        ):
            raise _bad(
                "inputs.kv_scales",
                f"a contiguous {want} tensor of shape {params.scales_shape(pages)} on {dev}",
                sc,
            )
    cl = inputs.cache_lengths
    if not (
        isinstance(cl, torch.Tensor)
        and cl.dtype == torch.int32
        and cl.ndim == 1
        and cl.device == dev
        and (cl.shape[0] <= 1 or cl.stride(0) == 1)
    ):
        raise _bad("inputs.cache_lengths", f"a contiguous int32 [batch] tensor on {dev}", cl)
    lut = inputs.lookup_table
    if not (
        isinstance(lut, torch.Tensor)
        and lut.dtype == torch.int32
        and lut.ndim == 2
        and lut.shape[0] == cl.shape[0]
        and lut.device == dev
        and (lut.shape[1] <= 1 or lut.stride(1) == 1)
    ):
        raise _bad(
            "inputs.lookup_table",
            f"an int32 [{cl.shape[0]}, cols] tensor on {dev} (unit column stride)",
            lut,
        )
    return layer, pages


def _check_host_values(
    q_row_offsets: torch.Tensor, inputs: KVCacheInputsPerDevice, page_size: int, total: int
) -> None:
    """The index values, when they are on the CPU: q_row_offsets a ragged partition of the
    `total` new tokens, cache lengths >= 0, every new token within the lookup table's reach
    and on a page id in [0, total_num_pages). numpy views (no copies) of the CPU tensors."""
    offs = q_row_offsets.numpy().astype(np.int64)
    if offs[0] != 0:
        raise InvalidArgumentError(f"q_row_offsets: expected q_row_offsets[0] == 0, got {offs[0]}")
    n = np.diff(offs)
    if (n < 0).any():
        b = int(np.flatnonzero(n < 0)[0])
        raise InvalidArgumentError(
            f"q_row_offsets: expected non-decreasing prefix sums, got "
            f"q_row_offsets[{b + 1}] = {offs[b + 1]} < q_row_offsets[{b}] = {offs[b]}"
        )
    if offs[-1] != total:
        raise InvalidArgumentError(
            f"q_row_offsets: expected q_row_offsets[-1] == k_new.shape[0] = {total}, got {offs[-1]}"
        )
    cl = inputs.cache_lengths.numpy().astype(np.int64)
    if (cl < 0).any():
        b = int(np.flatnonzero(cl < 0)[0])
        raise InvalidArgumentError(
            f"inputs.cache_lengths: expected lengths >= 0, got {cl[b]} for request {b}"
        )
    lut = inputs.lookup_table.numpy()
    cols = lut.shape[1]
    reach = cols * page_size
    end = cl + n
    writes = n > 0
    over = writes & (end > reach)
    if over.any():
        b = int(np.flatnonzero(over)[0])
        raise InvalidArgumentError(
            f"q_row_offsets: expected request {b}'s {n[b]} new tokens at positions "
            f"[{cl[b]}, {end[b]}) to fit the lookup table's reach of {reach} tokens "
            f"(inputs.lookup_table: {cols} pages of {page_size}), got {end[b]} tokens; "
            "alloc() them first"
        )
    if not writes.any():
        return
    pages = inputs.kv_blocks.shape[0]
    col = np.arange(cols)
    need = (col >= (cl // page_size)[:, None]) & (col <= ((end - 1) // page_size)[:, None])
    bad = need & writes[:, None] & ((lut < 0) | (lut >= pages))
    if bad.any():
        b, c = (int(i) for i in np.argwhere(bad)[0])
        raise InvalidArgumentError(
            f"inputs.lookup_table: expected page ids in [0, {pages}) where request {b}'s new "
            f"tokens land, got {lut[b, c]} at column {c}; alloc() them first"
        )


def _check_store(k_new, v_new, inputs, params, layer_idx, q_row_offsets, backend):
    """`store_kv`'s checks (its docstring), all before a byte is written: (layer index, whether
    Triton runs it, whether the index values were checked on the host)."""
    layer, _ = _check_cache(inputs, params, layer_idx)
    H, D = params.n_kv_heads_per_device, params.head_dim
    dev = inputs.kv_blocks.device
    want = (H, D)
    for name, x in (("k_new", k_new), ("v_new", v_new)):
        if name == "v_new" and params.is_mla:
            if x is not None:
                raise _bad("v_new", "None for an MLA cache", x)
            continue
        if not (
            isinstance(x, torch.Tensor)
            and x.ndim == 3
            and x.shape[1:] == want
            and x.dtype == params.dtype
            and x.device == dev
        ):
            raise _bad(name, f"a {params.dtype} [total_tokens, {H}, {D}] tensor on {dev}", x)
    if v_new is not None and v_new.shape != k_new.shape:
        raise _bad("v_new", f"shape {tuple(k_new.shape)} (k_new's)", v_new)
    batch = inputs.cache_lengths.shape[0]
    if not (
        isinstance(q_row_offsets, torch.Tensor)
        and q_row_offsets.dtype == torch.int32
        and q_row_offsets.shape == (batch + 1,)
        and q_row_offsets.device == dev
        and (batch == 0 or q_row_offsets.stride(0) == 1)
    ):
        raise _bad(
            "q_row_offsets",
            f"a contiguous int32 tensor of shape ({batch + 1},) on {dev}",
            q_row_offsets,
        )
    if k_new.shape[0] > INT32_MAX:
        raise _bad("k_new", "at most 2**31 - 1 tokens", k_new)
    if not (backend is None or (isinstance(backend, str) and backend in BACKENDS)):
        raise InvalidArgumentError(f"backend: expected None or one of {BACKENDS}, got {backend!r}")
    use_triton = choose_backend(k_new.device, backend) == "triton"
    checked = dev.type == "cpu"
    if checked:
        _check_host_values(q_row_offsets, inputs, params.page_size, k_new.shape[0])
    return layer, use_triton, checked


# The ops' prepared calls (per process, bounded: `ops.prepared.PreparedOp`).
PREPARED_STORE_KV = PreparedOp()
PREPARED_ROPE_STORE_KV = PreparedOp()


def _prepared_hit(prepared: PreparedOp, signature, args: tuple, inputs, params, q_row_offsets,
                  x):  # fmt: skip
    """The result of `prepared`'s entry for a call (MISS where it has none, is unprepared, is
    off or torch.compile traces): `signature(*args)` gives its key and sources, and a CPU
    cache's host values are checked first (`_host_check`, for x's rows). Arguments the
    signature cannot read give MISS: the full path reports them."""
    if not prepared.active or torch.compiler.is_compiling():
        return MISS
    try:
        key, src, _ = signature(*args)
        before = _host_check(inputs, params, q_row_offsets, x.shape[0])
    except Exception:  # noqa: BLE001 - the full path raises the typed error
        return MISS
    hit = prepared.lookup(key, src, before)
    return MISS if hit is UNPREPARED else hit


def _cache_signature(inputs, params, layer_idx, backend, x) -> tuple[tuple, list]:
    """The key and sources of the cache arguments that store_kv / rope_store_kv share: params
    (a frozen dataclass, by value), the inputs' type and which of its tensors exist, backend,
    the environment and x's CUDA device; sources kv_blocks, kv_scales (guarded, not read),
    the layer's K / V rows and scales (`operands.paged_layer_tensors`: a layer is its views'
    pointers, so every layer of a step shares one entry; an eager mixed step of a new token
    count otherwise missed once a layer), cache_lengths, lookup_table."""
    sc = inputs.kv_scales
    key = (params, type(inputs), sc is None, backend, env_state(), current_device(x))
    return key, [inputs.kv_blocks, sc, *paged_layer_tensors(inputs, params, layer_idx),
                 inputs.cache_lengths, inputs.lookup_table]  # fmt: skip


def _store_signature(k_new, v_new, inputs, params, layer_idx, q_row_offsets, backend):
    """(key, sources, guarded) of a store_kv call; sources the cache's, q_row_offsets, k_new,
    v_new."""
    key, src = _cache_signature(inputs, params, layer_idx, backend, k_new)
    src += [q_row_offsets, k_new, v_new]
    key += (v_new is None,)
    return key, src, tuple(i for i, t in enumerate(src) if t is not None)


def _host_check(inputs, params, q_row_offsets, total):
    """The host-value checks of a call on a CPU cache (`_check_host_values`), or None."""
    if inputs.kv_blocks.device.type != "cpu":
        return None
    return lambda: _check_host_values(q_row_offsets, inputs, params.page_size, total)


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
    cache's FP8 format when it has one (every format, packed MLA ones included).

    k_new, v_new: [total_new_tokens, n_kv_heads_per_device, head_dim] (MHA) in params.dtype,
      on the cache's device; MLA: k_new [total, 1, head_dim] (latent then rope), v_new None.
    inputs: the cache (kv_blocks / kv_scales in params' layout; cache_lengths [batch] and
      lookup_table [batch, cols] int32 on the cache's device).
    layer_idx: an int in [0, params.num_layers).
    q_row_offsets: [batch + 1] int32 prefix sums of new tokens per request, on the cache's
      device. The pages must be allocated (PagedKVCacheManager.alloc) before.
    backend: None (Triton on CUDA, the reference elsewhere), "triton" or "reference".

    Checks, all before any byte is written (InvalidArgumentError naming the argument):
    - always (metadata only, no host sync): the types, shapes, dtypes and devices above,
      layer_idx, backend, and inputs consistent with params;
    - when the index tensors are on the CPU (their values are on the host: a CPU cache, the
      manager's CPU path), their values too: q_row_offsets[0] == 0, non-decreasing,
      q_row_offsets[-1] == k_new.shape[0]; cache_lengths >= 0; cache_length + new tokens
      <= lookup_table.shape[1] * page_size (the table's reach); every page id the new
      tokens land on in [0, total_num_pages) (not the sentinel, not negative).
    On a GPU the values stay on the device (no sync): both backends then skip each token
    outside its request's q_row_offsets range, at a negative position, past the table's
    reach, or on a page id outside [0, total_num_pages), so nothing outside the pages the
    lookup table gives is written, scales included (rules: `reference.py`).
    """
    args = (k_new, v_new, inputs, params, layer_idx, q_row_offsets, backend)
    if _prepared_hit(PREPARED_STORE_KV, _store_signature, args, inputs, params, q_row_offsets,
                     k_new) is not MISS:  # fmt: skip
        return
    layer, use_triton, checked = _check_store(
        k_new, v_new, inputs, params, layer_idx, q_row_offsets, backend
    )
    k_op = PagedOperand(inputs, params, layer, "k")
    v_op = None if params.is_mla else PagedOperand(inputs, params, layer, "v")
    if use_triton:
        from .triton_store import store_kv_triton

        def run():
            store_kv_triton(k_new, v_new, k_op, v_op, q_row_offsets)

        if k_new.shape[0] == 0 or torch.compiler.is_compiling():
            return run()
        key, src, guarded = _store_signature(k_new, v_new, inputs, params, layer_idx,
                                             q_row_offsets, backend)  # fmt: skip
        PREPARED_STORE_KV.prepare(key, src, guarded, run, ())
    else:
        store_kv_reference(k_new, v_new, k_op, v_op, q_row_offsets, checked=checked)


def rope_store_kv(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    h_q: int,
    h_kv: int,
    inputs: KVCacheInputsPerDevice,
    params: KVCacheParams,
    layer_idx: int,
    q_row_offsets: torch.Tensor,
    *,
    q_norm: torch.Tensor | None = None,
    k_norm: torch.Tensor | None = None,
    eps: float = 0.0,
    backend: str | None = None,
) -> torch.Tensor:
    """`ops.fused.rope_qkv` of a fused q|k|v row block, then `store_kv` of its k and v: returns
    q [T, h_q, d]; the cache holds k (RoPE'd) and v at `cache_lengths[b] + i` of layer_idx.

    The arguments and their checks are those two ops' (all before any byte is written; k/v
    are qkv's column blocks from h_q * d and from (h_q + h_kv) * d, which must match the
    cache's heads and head dim: a mismatch names them k_new / v_new, as store_kv does).
    On CUDA (backend "triton") a cache of qkv's dtype without quantization, d a power of
    two, takes one launch (`triton_rope_store`: the decode step's RoPE and cache write were
    two launches of ~2.5 us each a layer on the H200, Llama-3.2-1B b64); every other case
    runs the two ops, so the results are theirs."""
    args = (qkv, cos, sin, h_q, h_kv, inputs, params, layer_idx, q_row_offsets, q_norm, k_norm,
            eps, backend)  # fmt: skip
    hit = _prepared_hit(PREPARED_ROPE_STORE_KV, _rope_store_signature, args, inputs, params,
                        q_row_offsets, qkv)  # fmt: skip
    if hit is not MISS:
        return hit
    d = check_rope_qkv(qkv, cos, sin, h_q, h_kv, q_norm, k_norm)
    T = qkv.shape[0]
    k_view = qkv[:, h_q * d : (h_q + h_kv) * d].unflatten(1, (h_kv, d))
    v_view = qkv[:, (h_q + h_kv) * d :].unflatten(1, (h_kv, d))
    if params.is_mla:
        raise InvalidArgumentError("params: rope_store_kv writes an MHA cache (is_mla False)")
    layer, use_triton, _ = _check_store(
        k_view, v_view, inputs, params, layer_idx, q_row_offsets, backend
    )
    fused = (
        use_triton
        and params.quantization is None
        and params.storage_dtype == qkv.dtype
        and params.page_size > 0
        and rope_triton_ok(backend, qkv, cos, sin, d)
        and T <= INT32_MAX
    )
    if not fused:
        q, k, v = rope_qkv(qkv, cos, sin, h_q, h_kv, q_norm=q_norm, k_norm=k_norm, eps=eps,
                           backend=backend)  # fmt: skip
        store_kv(k, v, inputs, params, layer, q_row_offsets, backend=backend)
        return q
    from .triton_rope_store import rope_store_kv_triton  # noqa: PLC0415

    k_op = PagedOperand(inputs, params, layer, "k")
    v_op = PagedOperand(inputs, params, layer, "v")

    def run():
        return rope_store_kv_triton(qkv, cos, sin, h_q, h_kv, q_norm, k_norm, eps, k_op, v_op,
                                    q_row_offsets)  # fmt: skip

    if T == 0 or torch.compiler.is_compiling():
        return run()
    key, src, guarded = _rope_store_signature(
        qkv, cos, sin, h_q, h_kv, inputs, params, layer_idx, q_row_offsets, q_norm, k_norm, eps,
        backend,
    )  # fmt: skip
    return PREPARED_ROPE_STORE_KV.prepare(key, src, guarded, run, (len(src) - 1,))


def _rope_store_signature(qkv, cos, sin, h_q, h_kv, inputs, params, layer_idx, q_row_offsets,
                          q_norm, k_norm, eps, backend):  # fmt: skip
    """(key, sources, guarded) of a rope_store_kv call; sources the cache's, q_row_offsets,
    qkv, cos, sin, q_norm, k_norm, q."""
    key, src = _cache_signature(inputs, params, layer_idx, backend, qkv)
    key += (type(h_q), h_q, type(h_kv), h_kv, type(eps), eps, q_norm is None, k_norm is None)
    src += [q_row_offsets, qkv, cos, sin, q_norm, k_norm, None]
    return key, src, tuple(i for i, t in enumerate(src) if t is not None)


def gather_kv(
    inputs: KVCacheInputsPerDevice,
    params: KVCacheParams,
    layer_idx: int,
    batch_idx: int,
    num_tokens: int,
    out_dtype: torch.dtype = torch.float32,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Tokens 0..num_tokens-1 of request `batch_idx`, dequantized, in logical order:
    (K [num_tokens, heads, head_dim], V or None for MLA). For tests and debugging.

    layer_idx in [0, num_layers), batch_idx in [0, batch), num_tokens in [0, the lookup
    table's reach]: ints (not bools); out_dtype one of float16/bfloat16/float32/float64.
    A token on a page id outside [0, total_num_pages) (the sentinel, a negative entry): an
    InvalidArgumentError on the CPU; on a GPU (no sync) it reads as NaN.
    """
    layer, _ = _check_cache(inputs, params, layer_idx)
    batch = inputs.cache_lengths.shape[0]
    b = check_int("batch_idx", batch_idx, 0, batch - 1)
    reach = inputs.lookup_table.shape[1] * params.page_size
    n = check_int("num_tokens", num_tokens, 0, reach)
    check(
        out_dtype in GATHER_DTYPES if isinstance(out_dtype, torch.dtype) else False,
        "out_dtype",
        f"one of {GATHER_DTYPES}",
        repr(out_dtype),
    )
    dev = inputs.kv_blocks.device
    pos = torch.arange(n, device=dev)
    ops = [PagedOperand(inputs, params, layer, "k")]
    if not params.is_mla:
        ops.append(PagedOperand(inputs, params, layer, "v"))
    rows, ok = target_rows(ops[0], b, pos, torch.ones(n, dtype=torch.bool, device=dev))
    if dev.type == "cpu":
        if n and not bool(ok.all()):
            c = int((~ok).nonzero()[0]) // params.page_size
            raise InvalidArgumentError(
                f"inputs.lookup_table: expected page ids in [0, {inputs.kv_blocks.shape[0]}) "
                f"for request {b}'s first {n} tokens, got {int(inputs.lookup_table[b, c])} "
                f"at column {c}"
            )
        out = [op.load_rows(rows, out_dtype) for op in ops]
    else:
        safe = torch.where(ok, rows, 0)
        out = [
            torch.where(ok[:, None, None], op.load_rows(safe, out_dtype), float("nan"))
            for op in ops
        ]
    return out[0], (out[1] if len(out) > 1 else None)
