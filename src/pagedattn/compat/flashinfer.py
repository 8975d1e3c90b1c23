"""FlashInfer-compatible paged attention wrappers running on `pagedattn.ops.mha.mha`.

`BatchDecodeWithPagedKVCacheWrapper` and `BatchPrefillWithPagedKVCacheWrapper` keep FlashInfer
0.6's constructor, `plan(...)` and `run(...)` signatures and conventions (docs/compat.md):

- Paged KV cache: one tensor `[P, 2, page, h_kv, d]` (NHD) / `[P, 2, h_kv, page, d]` (HND), or
  a `(k_cache, v_cache)` tuple of `[P, page, h_kv, d]` / `[P, h_kv, page, d]`. `run` views the
  K and V pages as pagedattn `RowOperand`s over the same memory (no copy, any page stride that
  is a multiple of the token stride).
- Page table: `indptr [b + 1]`, `indices [indptr[-1]]`, `last_page_len [b]`; request b has
  `kv_len = (pages - 1) * page_size + last_page_len` tokens (or `seq_lens[b]`), and its query
  tokens are the last `q_len` of them, so pagedattn's `cache_length = kv_len - q_len`. As in
  FlashInfer a request may hold fewer KV tokens than queries (none too): query i sits at
  `kv_len - q_len + i`, and one that sees no key gets out 0 and LSE -inf. The kernels take
  the negative cache length as is; on the reference backend `plan()` keeps the query rows
  that see a key (`_split_short_requests`) and `run()` gathers and scatters them.
- `window_left = w >= 0`: query at position p sees keys `p - w .. p` (w + 1 keys); causal
  windows map to `masks.sliding_window_causal(w + 1)`.
- `sinks [h_qo]`: join the softmax denominator; the returned LSE includes the sink. These are
  the semantics of FlashInfer's attention-sink variant (`BatchAttentionWithAttentionSinkWrapper`);
  FlashInfer 0.6.13's plain wrappers ignore `sinks` on Hopper (fa2/fa3), see docs/compat.md.
- FP8 e4m3 caches with per-tensor `k_scale` / `v_scale` (and `q_scale`): per-tensor operands.
- LSE: base 2 (`log2(sum 2^(s * log2 e))`), FlashInfer's convention; `lse_base="ln"` returns
  the natural log.

`plan()` does all host work (page tables, cache lengths, masks) once; `run()` checks metadata
only and launches work (no host sync, CUDA-graph friendly). With `use_cuda_graph=True` the
metadata lives in static buffers that later `plan()` calls refresh in place. Both wrappers keep
FlashInfer's signatures and share one body each for `__init__`, `plan` and `run`
(`_PagedWrapperBase`).

Errors: every bad argument raises `InvalidArgumentError` naming the caller's argument (a call
that does not bind included, `_args.typed_call`), before anything is written: a rejected
`plan()` keeps the previous plan (and the CUDA-graph buffers), a rejected `run()` writes no
byte. Page ids a request reads must lie in [0, num_pages) (negative: `plan()`; past the cache:
`run()`, from the plan's host maximum, no sync). An empty batch is refused.

Not supported (raise `UnsupportedFeatureError`): `logits_soft_cap > 0`, `pos_encoding_mode`
other than "NONE", NVFP4 caches (`kv_cache_sf`), e5m2 caches, custom-kernel `*args`/`jit_args`,
multi-item scoring (`prefix_len_ptr`, ...), `window_right != 0`.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch

from ..errors import InvalidArgumentError, check
from ..operands import RowOperand
from ..ops._checks import DescribedValue as _describe
from ..ops._checks import check_scale, is_positive_finite
from ..ops.constants import LOG2E_F
from ..ops.dispatch import BACKENDS
from ..ops.masks import Mask, causal, null, sliding_window_causal, tensor_mask
from ..ops.mha import mha
from . import UnsupportedFeatureError
from ._args import resolve_backend, typed_call
from ._paging import paged_row_strides

KV_LAYOUTS = ("NHD", "HND")
POS_ENCODING_MODES = ("NONE", "ROPE_LLAMA", "ALIBI")
FLASHINFER_BACKENDS = ("auto", "fa2", "fa3", "trtllm-gen", "cute-dsl", "cudnn", "cutile")
LSE_BASES = ("log2", "ln")
COMPUTE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8_KV_DTYPE = torch.float8_e4m3fn
INT32_MAX = 2**31 - 1  # page ids, lengths and window sizes are int32 in the kernels
# Lookup-table padding before the first run() tells the page count; run() rewrites it to
# `total_num_pages` (DESIGN.md's sentinel) as soon as it sees the cache.
_UNKNOWN_SENTINEL = 2**31 - 1

PagedKVCache = torch.Tensor | tuple[torch.Tensor, torch.Tensor]

# Arguments that FlashInfer's decode and prefill wrappers both take under the same name: each
# wrapper's __init__ and plan forward them from the call's `locals()` (`_by_name`) to the shared
# body, so the body has one parameter list and the wrappers keep FlashInfer's signatures.
# (run, called every step, forwards positionally: `locals()` cost it ~2 us a call.)
_INIT_ARGS = (
    "float_workspace_buffer",
    "kv_layout",
    "use_cuda_graph",
    "backend",
    "jit_args",
    "pagedattn_backend",
    "max_pages_per_request",
)
_PLAN_ARGS = (
    "num_qo_heads",
    "num_kv_heads",
    "page_size",
    "pos_encoding_mode",
    "window_left",
    "logits_soft_cap",
    "q_data_type",
    "kv_data_type",
    "o_data_type",
    "sm_scale",
    "seq_lens",
    "disable_split_kv",
    "non_blocking",
)


# Small helpers --------------------------------------------------------------------------------
def _by_name(call: dict[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The arguments `names` of a wrapper method's call (its `locals()`), to forward by name."""
    return {n: call[n] for n in names}


class _Names(NamedTuple):
    """The caller's names of the page-table arguments (they differ between the wrappers)."""

    indptr: str
    indices: str
    last_page_len: str
    head_dim: str
    q_lens: str


_DECODE_NAMES = _Names("indptr", "indices", "last_page_len", "head_dim", "q_len_per_req")
_PREFILL_NAMES = _Names(
    "paged_kv_indptr", "paged_kv_indices", "paged_kv_last_page_len", "head_dim_qk", "qo_indptr"
)


def _one_of(x: object, choices: tuple[str, ...], name: str) -> str:
    """A string argument from `choices` (anything else, an unhashable object or a tensor
    included, raises InvalidArgumentError naming `name`)."""
    check(isinstance(x, str) and x in choices, name, f"one of {choices}", _describe(x))
    return x


def _check_bool(x: object, name: str) -> bool:
    check(isinstance(x, bool), name, "a bool", _describe(x))
    return x


def _check_optional(x: object, name: str, kind: str) -> None:
    """An accepted-and-unused argument: None or a value of `kind` ("int", "float", "bool",
    "tensor")."""
    if x is None:
        return
    ok = {
        "int": isinstance(x, numbers.Integral) and not isinstance(x, bool),
        "float": isinstance(x, numbers.Real) and not isinstance(x, bool),
        "bool": isinstance(x, bool),
        "tensor": isinstance(x, torch.Tensor),
    }[kind]
    check(ok, name, f"None or a {kind} (accepted and unused)", _describe(x))


def _as_dtype(x: object, name: str) -> torch.dtype:
    """FlashInfer accepts a torch.dtype or its name ("float16", "bfloat16", ...)."""
    if isinstance(x, torch.dtype):
        return x
    if isinstance(x, str):
        d = getattr(torch, x, None)
        if isinstance(d, torch.dtype):
            return d
    raise InvalidArgumentError(f"{name}: expected a torch.dtype or its name, got {_describe(x)}")


def _as_int(x: object, name: str, lo: int, hi: int = INT32_MAX) -> int:
    check(
        isinstance(x, numbers.Integral) and not isinstance(x, bool) and lo <= int(x) <= hi,
        name,
        f"an int in [{lo}, {hi}]",
        _describe(x),
    )
    return int(x)


def _host_ints(t: object, name: str, length: int | None = None) -> torch.Tensor:
    """A 1-D integer tensor (any device) -> int64 CPU copy (plan-time host work)."""
    check(
        isinstance(t, torch.Tensor)
        and t.ndim == 1
        and not t.is_floating_point()
        and not t.is_complex()
        and t.dtype != torch.bool
        and t.device.type != "meta",
        name,
        "a 1-D integer tensor (on any device with data)",
        _describe(t),
    )
    if length is not None:
        check(t.shape[0] == length, name, f"length {length}", _describe(t))
    return t.detach().to("cpu", torch.int64)


def _scale_parts(s: object, name: str, device: torch.device) -> tuple[float, torch.Tensor | None]:
    """A FlashInfer calibration scale (None, a float or a one-element tensor) -> (host factor,
    device tensor factor or None). A float must be finite and > 0 (q_scale and k_scale fold
    into the softmax scale); a tensor's value lives on the device and is not read."""
    if s is None:
        return 1.0, None
    if isinstance(s, numbers.Real) and not isinstance(s, bool):
        check(is_positive_finite(s), name, "a finite float > 0 (or a one-element tensor)", s)
        return float(s), None
    check(
        isinstance(s, torch.Tensor)
        and s.numel() == 1
        and s.is_floating_point()
        and s.device == device,
        name,
        f"None, a float or a one-element floating tensor on {device}",
        _describe(s),
    )
    return 1.0, s.reshape(())


def _unpack_paged_kv_cache(cache: object, layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    """One [P, 2, ...] tensor or a (k, v) tuple -> (k_cache, v_cache) 4-D views (no copy)."""
    page_shape = "[P, page, h_kv, d]" if layout == "NHD" else "[P, h_kv, page, d]"
    if isinstance(cache, (tuple, list)):
        check(len(cache) == 2, "paged_kv_cache", "a (k_cache, v_cache) pair", len(cache))
        k, v = cache
        for nm, t in (("k_cache", k), ("v_cache", v)):
            check(
                isinstance(t, torch.Tensor) and t.ndim == 4,
                f"paged_kv_cache.{nm}",
                f"a 4-D {page_shape} tensor ({layout})",
                _describe(t),
            )
        return k, v
    check(
        isinstance(cache, torch.Tensor) and cache.ndim == 5 and cache.shape[1] == 2,
        "paged_kv_cache",
        f"a (k_cache, v_cache) tuple or one 5-D tensor "
        f"{'[P, 2, page, h_kv, d]' if layout == 'NHD' else '[P, 2, h_kv, page, d]'}",
        _describe(cache),
    )
    return cache[:, 0], cache[:, 1]


@dataclass
class _CacheView:
    """K or V pages viewed as pagedattn rows: rows [n_rows, h_kv, d] (strided, no copy) with
    row(page, offset) = page * page_stride_rows + offset."""

    rows: torch.Tensor
    page_stride_rows: int
    num_pages: int
    page_size: int
    heads: int
    dim: int


def _cache_view(c: torch.Tensor, layout: str, name: str) -> _CacheView:
    if layout == "NHD":
        P, ps, H, D = c.shape
        sp, st, sh, sd = c.stride()
    else:
        P, H, ps, D = c.shape
        sp, sh, st, sd = c.stride()
    check(P >= 1 and ps >= 1 and H >= 1 and D >= 1, name, "non-empty pages", _describe(c))
    check(sd == 1 or D == 1, f"{name}.stride()", "a head dim of stride 1", c.stride())
    st, psr, n_rows = paged_row_strides(P, ps, sp, st, name, "page", c.stride())
    rows = c.as_strided((n_rows, H, D), (st, sh, 1), c.storage_offset())
    return _CacheView(rows, psr, P, ps, H, D)


def _short_list(t: torch.Tensor) -> object:
    """A host int tensor for an error message (its first 8 values when long)."""
    return t.tolist() if t.shape[0] <= 16 else f"{t[:8].tolist()} ..."


def _split_short_requests(
    q_offs: torch.Tensor, q_lens: torch.Tensor, kv_lens: torch.Tensor, causal_rows: bool
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The reference backend's view of a batch where some request has fewer KV tokens than
    queries (its cache length kv - q would be negative, which the kernels take and the
    reference does not): the same attention over only the query rows that see a key.

    A request with kv >= q stays whole. Of a short one, under a causal mask (window or not)
    query i sits at kv - q + i: its last kv queries form a request of cache length 0 and the
    first q - kv see no key; otherwise (no mask, a tensor mask) every query sees the kv keys
    (through its mask row), one request of cache length kv - 1 each, none when kv = 0.

    Returns (kept rows [n] int64, the request each new request reads [m], their cache lengths
    [m], their query counts [m]); the kept rows are ascending, each new request's contiguous.
    """
    keep: list[int] = []
    req: list[int] = []
    cls: list[int] = []
    qls: list[int] = []
    for b, (r0, ql, kl) in enumerate(zip(q_offs.tolist(), q_lens.tolist(), kv_lens.tolist())):
        if kl >= ql:
            keep.extend(range(r0, r0 + ql))
            req.append(b)
            cls.append(kl - ql)
            qls.append(ql)
        elif kl == 0:
            continue
        elif causal_rows:
            keep.extend(range(r0 + ql - kl, r0 + ql))
            req.append(b)
            cls.append(0)
            qls.append(kl)
        else:
            keep.extend(range(r0, r0 + ql))
            req.extend([b] * ql)
            cls.extend([kl - 1] * ql)
            qls.extend([1] * ql)
    i64 = torch.int64
    return (
        torch.tensor(keep, dtype=i64),
        torch.tensor(req, dtype=i64),
        torch.tensor(cls, dtype=i64),
        torch.tensor(qls, dtype=i64),
    )


def _unpack_bits(packed: torch.Tensor, n: int) -> torch.Tensor:
    """Little-endian bits of a uint8 vector -> bool [n]."""
    bits = (packed.to(torch.int32).unsqueeze(-1) >> torch.arange(8)) & 1
    return bits.flatten()[:n].bool()


# The plan --------------------------------------------------------------------------------------
@dataclass
class _Plan:
    """Everything `run()` needs, on the wrapper's device (and a few host ints)."""

    batch: int
    total_q: int
    num_qo_heads: int
    num_kv_heads: int
    head_dim_qk: int
    head_dim_vo: int
    page_size: int
    q_dtype: torch.dtype
    kv_dtype: torch.dtype
    o_dtype: torch.dtype
    compute_dtype: torch.dtype
    sm_scale: float | None
    window_left: int
    mask: Mask
    lut: torch.Tensor  # [requests, cols] int32
    pad_mask: torch.Tensor  # [requests, cols] bool: the padding entries of lut
    cache_lengths: torch.Tensor  # [requests] int32 (kv_len - q_len: negative when kv < q)
    q_row_offsets: torch.Tensor  # [requests + 1] int32
    num_partitions: int | None
    backend: str  # the pagedattn backend, resolved by plan()
    max_page: int  # the largest page id a request reads (-1: none), checked by run()
    max_page_at: str  # where it is, for run()'s message: "indices[7]"
    # Reference backend with a request shorter than its queries (it takes no negative cache
    # length): the query rows that see a key, and the requests above describe only them.
    keep_rows: torch.Tensor | None = None


def _check_graph_buffers(**buffers: object) -> None:
    """CUDA-graph mode: every static metadata buffer is a 1-D tensor (checked in order)."""
    for nm, t in buffers.items():
        check(
            isinstance(t, torch.Tensor) and t.ndim == 1,
            nm,
            "a 1-D tensor in CUDA-graph mode",
            _describe(t),
        )


class _PagedWrapperBase:
    """Shared plan/run machinery of the two FlashInfer wrappers."""

    _api = "wrapper"

    @typed_call
    def run_return_lse(
        self, q: torch.Tensor, paged_kv_cache: PagedKVCache, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`run(..., return_lse=True)` (`run` is each wrapper's own)."""
        return self.run(  # type: ignore[attr-defined]
            q, paged_kv_cache, *args, return_lse=True, **kwargs
        )

    def _init_common(
        self,
        fixed_batch_size: int,
        indices_capacity: int,
        *,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str,
        use_cuda_graph: bool,
        backend: str,
        jit_args: Any,
        pagedattn_backend: str | None,
        max_pages_per_request: int | None,
    ) -> None:
        """`__init__`'s checks and state, shared by both wrappers; `fixed_batch_size` and
        `indices_capacity` are the CUDA-graph buffers' batch size and page capacity."""
        check(
            isinstance(float_workspace_buffer, torch.Tensor)
            and float_workspace_buffer.device.type in ("cpu", "cuda"),
            "float_workspace_buffer",
            "a CPU or CUDA torch.Tensor (its device is the wrapper's device)",
            _describe(float_workspace_buffer),
        )
        _one_of(kv_layout, KV_LAYOUTS, "kv_layout")
        _check_bool(use_cuda_graph, "use_cuda_graph")
        _one_of(backend, FLASHINFER_BACKENDS, "backend")
        check(
            pagedattn_backend is None
            or (type(pagedattn_backend) is str and pagedattn_backend in BACKENDS),
            "pagedattn_backend",
            f"None or one of {BACKENDS}",
            _describe(pagedattn_backend),
        )
        if max_pages_per_request is not None:
            _as_int(max_pages_per_request, "max_pages_per_request", 1)
        if jit_args is not None:
            raise UnsupportedFeatureError(
                "jit_args: custom JIT attention variants are FlashInfer-specific; pagedattn "
                "supports sinks, windows and custom masks through plan()/run() arguments"
            )
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        self._kv_layout = kv_layout
        self._use_cuda_graph = use_cuda_graph
        self._backend = backend
        self._pagedattn_backend = pagedattn_backend
        self._plan: _Plan | None = None
        self._sentinel = _UNKNOWN_SENTINEL
        # Per-tensor FP8 scales: static device scalars, written by run().
        self._k_scale = torch.ones((), dtype=torch.float32, device=self.device)
        self._v_scale = torch.ones((), dtype=torch.float32, device=self.device)
        self._fixed_batch_size = fixed_batch_size
        self._mask_buf: torch.Tensor | None = None
        if use_cuda_graph:
            cols = indices_capacity if max_pages_per_request is None else max_pages_per_request
            cols = _as_int(cols, "max_pages_per_request", 1)
            B = fixed_batch_size
            dev = self.device
            self._lut_buf = torch.full((B, cols), self._sentinel, dtype=torch.int32, device=dev)
            self._pad_buf = torch.ones((B, cols), dtype=torch.bool, device=dev)
            self._cl_buf = torch.zeros(B, dtype=torch.int32, device=dev)
            self._qoff_buf = torch.zeros(B + 1, dtype=torch.int32, device=dev)
            self._indices_capacity = indices_capacity

    # FlashInfer API surface shared by both wrappers -------------------------------------
    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @typed_call
    def reset_workspace_buffer(
        self, float_workspace_buffer: torch.Tensor, int_workspace_buffer: torch.Tensor
    ) -> None:
        """Accepted for compatibility; pagedattn keeps no state in the workspace buffers."""
        check(
            isinstance(float_workspace_buffer, torch.Tensor)
            and float_workspace_buffer.device == self.device,
            "float_workspace_buffer",
            f"a tensor on {self.device}",
            _describe(float_workspace_buffer),
        )
        check(
            isinstance(int_workspace_buffer, torch.Tensor),
            "int_workspace_buffer",
            "a tensor",
            _describe(int_workspace_buffer),
        )
        self._float_workspace_buffer = float_workspace_buffer

    @typed_call
    def end_forward(self) -> None:
        """Deprecated in FlashInfer; no effect."""

    # plan --------------------------------------------------------------------------------
    def _plan_impl(
        self,
        *,
        names: _Names,
        q_lens: torch.Tensor | None,
        q_len_per_req: int,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        causal_mask: bool,
        window_left: int,
        logits_soft_cap: float | None,
        pos_encoding_mode: str,
        q_data_type: Any,
        kv_data_type: Any,
        o_data_type: Any,
        sm_scale: float | None,
        seq_lens: torch.Tensor | None,
        disable_split_kv: bool,
        non_blocking: bool,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
    ) -> None:
        """The plan body of both wrappers: their `plan()` translate FlashInfer's arguments
        (q_lens None: `q_len_per_req` queries a request) and call it. Host work only. Every
        check comes before the first write: a rejected plan() leaves the previous plan (and
        the CUDA-graph buffers) as they were."""
        # Scalars and features -------------------------------------------------------------
        num_qo_heads = _as_int(num_qo_heads, "num_qo_heads", 1)
        num_kv_heads = _as_int(num_kv_heads, "num_kv_heads", 1)
        check(
            num_qo_heads % num_kv_heads == 0,
            "num_qo_heads",
            f"a multiple of num_kv_heads={num_kv_heads}",
            num_qo_heads,
        )
        head_dim_qk = _as_int(head_dim_qk, names.head_dim, 1)
        head_dim_vo = head_dim_qk if head_dim_vo is None else _as_int(head_dim_vo, "head_dim_vo", 1)
        page_size = _as_int(page_size, "page_size", 1)
        check(
            isinstance(window_left, numbers.Integral)
            and not isinstance(window_left, bool)
            and -1 <= window_left < INT32_MAX,
            "window_left",
            f"-1 (no window) or an int in [0, {INT32_MAX - 1}]",
            _describe(window_left),
        )
        window_left = int(window_left)
        _one_of(pos_encoding_mode, POS_ENCODING_MODES, "pos_encoding_mode")
        if pos_encoding_mode != "NONE":
            raise UnsupportedFeatureError(
                f"pos_encoding_mode={pos_encoding_mode!r}: pagedattn does not apply RoPE/ALiBi "
                "inside attention; apply RoPE to q/k before store_kv and use 'NONE'"
            )
        if logits_soft_cap is not None:
            check(
                isinstance(logits_soft_cap, numbers.Real)
                and not isinstance(logits_soft_cap, bool)
                and logits_soft_cap >= 0,
                "logits_soft_cap",
                "None or a float >= 0",
                _describe(logits_soft_cap),
            )
            if logits_soft_cap > 0:
                raise UnsupportedFeatureError(
                    f"logits_soft_cap={logits_soft_cap}: soft-capping (cap * tanh(s / cap)) "
                    "is not implemented by pagedattn's attention kernels"
                )
        if sm_scale is not None:
            check_scale(sm_scale, "sm_scale", describe_got=True)
            sm_scale = float(sm_scale)
        _check_bool(disable_split_kv, "disable_split_kv")
        _check_bool(non_blocking, "non_blocking")

        q_dtype = _as_dtype(q_data_type, "q_data_type")
        kv_dtype = q_dtype if kv_data_type is None else _as_dtype(kv_data_type, "kv_data_type")
        o_dtype = q_dtype if o_data_type is None else _as_dtype(o_data_type, "o_data_type")
        if q_dtype in COMPUTE_DTYPES:
            compute = q_dtype
        elif q_dtype == FP8_KV_DTYPE:
            check(
                o_dtype in COMPUTE_DTYPES,
                "o_data_type",
                f"one of {COMPUTE_DTYPES} with an FP8 query (the query is widened to it, exactly)",
                o_dtype,
            )
            compute = o_dtype
        else:
            raise UnsupportedFeatureError(
                f"q_data_type={q_dtype}: expected bfloat16, float16, float32 or float8_e4m3fn"
            )
        check(o_dtype in COMPUTE_DTYPES, "o_data_type", f"one of {COMPUTE_DTYPES}", o_dtype)
        if kv_dtype == torch.float8_e5m2 or kv_dtype == torch.uint8:
            raise UnsupportedFeatureError(
                f"kv_data_type={kv_dtype}: pagedattn reads bf16/fp16/fp32 or FP8 e4m3 caches "
                "(no e5m2, no NVFP4)"
            )
        check(
            kv_dtype == compute or kv_dtype == FP8_KV_DTYPE,
            "kv_data_type",
            f"{compute} (the query's compute dtype) or torch.float8_e4m3fn",
            kv_dtype,
        )
        backend = resolve_backend(self.device, self._pagedattn_backend, "pagedattn_backend")

        # Page table -> lookup table, cache lengths ----------------------------------------
        last = _host_ints(last_page_len, names.last_page_len)
        batch = last.shape[0]
        check(
            batch >= 1,
            names.last_page_len,
            "at least one request (FlashInfer plans batches of >= 1 request)",
            _describe(last_page_len),
        )
        if self._use_cuda_graph:
            check(
                batch == self._fixed_batch_size,
                names.last_page_len,
                f"{self._fixed_batch_size} requests, the batch size fixed by the CUDA-graph "
                "buffers given to __init__",
                f"{batch} requests",
            )
        ip = _host_ints(indptr, names.indptr, batch + 1)
        idx = _host_ints(indices, names.indices)
        n_pages = ip[1:] - ip[:-1]
        check(
            bool((n_pages >= 0).all()) and int(ip[0]) >= 0 and int(ip[-1]) <= idx.shape[0],
            names.indptr,
            f"non-decreasing offsets into {names.indices} (length {idx.shape[0]})",
            _short_list(ip),
        )
        used = idx[int(ip[0]) : int(ip[-1])]  # the page ids the requests read
        max_page, max_page_at = -1, ""
        if used.numel():
            k = int(used.argmin())
            if int(used[k]) < 0:
                at = f"{names.indices}[{int(ip[0]) + k}]"
                raise InvalidArgumentError(f"{at}: expected a page id >= 0, got {int(used[k])}")
            k = int(used.argmax())
            max_page, max_page_at = int(used[k]), f"{names.indices}[{int(ip[0]) + k}]"
        check(
            bool(((last >= 0) & (last <= page_size)).all()),
            names.last_page_len,
            f"values in [0, page_size={page_size}]",
            _short_list(last),
        )
        if seq_lens is None:
            kv_lens = (n_pages - 1).clamp_min(0) * page_size + last
            kv_name = names.last_page_len
        else:
            kv_lens = _host_ints(seq_lens, "seq_lens", batch)
            kv_name = "seq_lens"
        bad = (kv_lens < 0) | (kv_lens > n_pages * page_size)
        if bool(bad.any()):
            b = int(torch.nonzero(bad)[0])
            raise InvalidArgumentError(
                f"{kv_name}[{b}]: expected a KV length in [0, pages * page_size = "
                f"{int(n_pages[b])} * {page_size}] for request {b} ({names.indptr} gives it "
                f"{int(n_pages[b])} pages), got {int(kv_lens[b])}"
            )
        if q_lens is None:
            q_lens = torch.full((batch,), q_len_per_req, dtype=torch.int64)
        cols = max(int(n_pages.max()), 1)
        if self._use_cuda_graph:
            cap = self._lut_buf.shape[1]
            check(
                idx.shape[0] <= self._indices_capacity,
                names.indices,
                f"at most {self._indices_capacity} entries (the paged_kv_indices buffer)",
                idx.shape[0],
            )
            check(
                cols <= cap,
                names.indptr,
                f"at most {cap} pages a request (max_pages_per_request of this CUDA-graph wrapper)",
                f"{cols} pages",
            )
            cols = cap
        if not idx.numel():
            idx = torch.zeros(1, dtype=torch.int64)  # every lookup-table entry is padding
        col = torch.arange(cols, dtype=torch.int64)
        valid = col[None, :] < n_pages[:, None]
        src = (ip[:-1, None] + col[None, :]).clamp(max=idx.shape[0] - 1)
        lut = torch.where(valid, idx[src], torch.full_like(src, self._sentinel)).to(torch.int32)
        q_offs = torch.zeros(batch + 1, dtype=torch.int64)
        q_offs[1:] = q_lens.cumsum(0)
        total_q = int(q_offs[-1])
        # Queries are the last q_len tokens of their request's KV: query i sits at position
        # kv_len - q_len + i, negative when the request has fewer KV tokens than queries (as
        # in FlashInfer, such a query sees no key under the causal mask).
        cache_lengths = kv_lens - q_lens

        # Mask --------------------------------------------------------------------------------
        width = cols * page_size
        mask_host = None
        tensor_kind = custom_mask is not None or packed_custom_mask is not None
        if tensor_kind:
            mask_host = self._custom_mask_rows(
                custom_mask, packed_custom_mask, q_lens, kv_lens, width
            )
            if window_left >= 0:
                mask_host &= self._window_rows(q_lens, kv_lens, window_left, width)
        elif causal_mask:
            mask = causal() if window_left < 0 else sliding_window_causal(window_left + 1)
        elif window_left < 0:
            mask = null()
        else:  # FlashInfer's non-causal window bounds the left side only
            mask_host = self._window_rows(q_lens, kv_lens, window_left, width)

        keep_rows = None
        if backend == "reference" and bool((cache_lengths < 0).any()):
            keep, req, cache_lengths, q_lens = _split_short_requests(
                q_offs, q_lens, kv_lens, causal_mask and not tensor_kind
            )
            lut, valid = lut[req], valid[req]
            q_offs = torch.cat([torch.zeros(1, dtype=torch.int64), q_lens.cumsum(0)])
            if mask_host is not None:
                mask_host = mask_host[keep]
            keep_rows = keep
        static = self._use_cuda_graph and keep_rows is None
        if static and mask_host is not None and self._mask_buf is not None:
            check(
                total_q <= self._mask_buf.shape[0] and width <= self._mask_buf.shape[1],
                names.q_lens,
                f"at most {self._mask_buf.shape[0]} query rows (the first plan's, with a "
                "tensor mask under CUDA graphs)",
                f"{total_q} rows",
            )

        # To the device (nothing above wrote any state) ----------------------------------------
        dev = self.device
        nb = non_blocking
        cache_lengths = cache_lengths.to(torch.int32)
        if static:
            self._lut_buf.copy_(lut, non_blocking=nb)
            self._pad_buf.copy_(~valid, non_blocking=nb)
            self._cl_buf.copy_(cache_lengths, non_blocking=nb)
            self._qoff_buf.copy_(q_offs.to(torch.int32), non_blocking=nb)
            lut_d, pad_d, cl_d, qoff_d = self._lut_buf, self._pad_buf, self._cl_buf, self._qoff_buf
            if mask_host is not None:
                if self._mask_buf is None:
                    self._mask_buf = torch.zeros((total_q, width), dtype=torch.bool, device=dev)
                buf = self._mask_buf[:total_q]
                buf.zero_()
                buf[:, :width].copy_(mask_host, non_blocking=nb)
                mask = tensor_mask(buf)
        else:
            lut_d = lut.to(dev, non_blocking=nb)
            pad_d = (~valid).to(dev, non_blocking=nb)
            cl_d = cache_lengths.to(dev, non_blocking=nb)
            qoff_d = q_offs.to(torch.int32).to(dev, non_blocking=nb)
            if mask_host is not None:
                mask = tensor_mask(mask_host.to(dev, non_blocking=nb))
            if keep_rows is not None:
                keep_rows = keep_rows.to(dev, non_blocking=nb)

        self._plan = _Plan(
            batch=batch,
            total_q=total_q,
            num_qo_heads=num_qo_heads,
            num_kv_heads=num_kv_heads,
            head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_vo,
            page_size=page_size,
            q_dtype=q_dtype,
            kv_dtype=kv_dtype,
            o_dtype=o_dtype,
            compute_dtype=compute,
            sm_scale=sm_scale,
            window_left=window_left,
            mask=mask,
            lut=lut_d,
            pad_mask=pad_d,
            cache_lengths=cl_d,
            q_row_offsets=qoff_d,
            num_partitions=1 if disable_split_kv else None,
            backend=backend,
            max_page=max_page,
            max_page_at=max_page_at,
            keep_rows=keep_rows,
        )

    @staticmethod
    def _window_rows(
        q_lens: torch.Tensor, kv_lens: torch.Tensor, window_left: int, width: int
    ) -> torch.Tensor:
        """bool [total_q, width]: key j visible iff j >= (kv_len - q_len + i) - window_left and
        j < kv_len (FlashInfer's left-window rule, no right bound)."""
        rows = []
        j = torch.arange(width)
        for ql, kl in zip(q_lens.tolist(), kv_lens.tolist()):
            q_abs = kl - ql + torch.arange(ql)
            rows.append((j[None, :] >= (q_abs - window_left)[:, None]) & (j[None, :] < kl))
        return torch.cat(rows) if rows else torch.zeros(0, width, dtype=torch.bool)

    @staticmethod
    def _custom_mask_rows(
        custom_mask: torch.Tensor | None,
        packed_custom_mask: torch.Tensor | None,
        q_lens: torch.Tensor,
        kv_lens: torch.Tensor,
        width: int,
    ) -> torch.Tensor:
        """FlashInfer's flattened per-request [q_len, kv_len] masks (bool, or bit-packed
        little-endian per request) -> bool [total_q, width]."""
        sizes = (q_lens * kv_lens).tolist()
        if packed_custom_mask is not None:
            check(
                isinstance(packed_custom_mask, torch.Tensor)
                and packed_custom_mask.dtype == torch.uint8,
                "packed_custom_mask",
                "a 1-D uint8 tensor (segment-packed little-endian bits)",
                _describe(packed_custom_mask),
            )
            packed = packed_custom_mask.detach().reshape(-1).cpu()
            nbytes = [-(-n // 8) for n in sizes]
            check(
                packed.shape[0] == sum(nbytes),
                "packed_custom_mask",
                f"{sum(nbytes)} bytes (ceil(q_len * kv_len / 8) per request)",
                packed.shape[0],
            )
            segs, off = [], 0
            for n, nb in zip(sizes, nbytes):
                segs.append(_unpack_bits(packed[off : off + nb], n))
                off += nb
        else:
            check(
                isinstance(custom_mask, torch.Tensor)
                and custom_mask.dtype == torch.bool
                and custom_mask.numel() == sum(sizes),
                "custom_mask",
                f"a bool tensor of sum(q_len * kv_len) = {sum(sizes)} elements",
                _describe(custom_mask),
            )
            flat = custom_mask.detach().reshape(-1).cpu()
            segs = list(torch.split(flat, sizes))
        rows = []
        for seg, ql, kl in zip(segs, q_lens.tolist(), kv_lens.tolist()):
            r = torch.zeros(ql, width, dtype=torch.bool)
            r[:, :kl] = seg.reshape(ql, kl)
            rows.append(r)
        return torch.cat(rows) if rows else torch.zeros(0, width, dtype=torch.bool)

    # run ---------------------------------------------------------------------------------
    def _operand(
        self,
        view: _CacheView,
        plan: _Plan,
        fp8: bool,
        scale_buf: torch.Tensor,
        head_dim: int,
    ) -> RowOperand:
        return RowOperand(
            view.rows,
            plan.cache_lengths,
            lut=plan.lut,
            page_size=plan.page_size,
            page_stride_rows=view.page_stride_rows,
            head_dim=head_dim,
            scales=scale_buf if fp8 else None,
            quant_format="per_tensor" if fp8 else None,
            scale_dtype=torch.float32 if fp8 else None,
            logical_dtype=plan.compute_dtype,
        )

    def _run_impl(
        self,
        q: torch.Tensor,
        paged_kv_cache: PagedKVCache,
        args: tuple,
        q_scale: object,
        k_scale: object,
        v_scale: object,
        out: torch.Tensor | None,
        lse: torch.Tensor | None,
        return_lse: bool,
        window_left: int | None,
        sinks: torch.Tensor | None,
        kv_cache_sf: object,
        lse_base: str,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """The run body of both wrappers. Every check comes before the first write (the
        lookup table's sentinel, the FP8 scale scalars, `out`, `lse`): a rejected run()
        changes nothing."""
        p = self._plan
        if p is None:
            raise InvalidArgumentError(f"{self._api}.run: call plan() before run()")
        if args:
            raise UnsupportedFeatureError(
                f"{self._api}.run: extra positional arguments are for FlashInfer's custom "
                f"kernels and are not supported (got {len(args)})"
            )
        if kv_cache_sf is not None:
            raise UnsupportedFeatureError("kv_cache_sf: NVFP4 KV caches are not supported")
        _one_of(lse_base, LSE_BASES, "lse_base")
        _check_bool(return_lse, "return_lse")
        if window_left is not None:
            check(
                isinstance(window_left, numbers.Integral)
                and not isinstance(window_left, bool)
                and window_left == p.window_left,
                "window_left",
                f"None or the planned value {p.window_left} (re-plan to change it)",
                _describe(window_left),
            )
        dev = self.device
        check(
            isinstance(q, torch.Tensor)
            and tuple(q.shape) == (p.total_q, p.num_qo_heads, p.head_dim_qk)
            and q.dtype == p.q_dtype
            and q.device == dev,
            "q",
            f"a {p.q_dtype} tensor of shape {(p.total_q, p.num_qo_heads, p.head_dim_qk)} on "
            f"{dev} (as planned)",
            _describe(q),
        )
        k_c, v_c = _unpack_paged_kv_cache(paged_kv_cache, self._kv_layout)
        views = []
        for nm, c, d in (("k_cache", k_c, p.head_dim_qk), ("v_cache", v_c, p.head_dim_vo)):
            check(
                c.dtype == p.kv_dtype and c.device == dev,
                f"paged_kv_cache.{nm}",
                f"a {p.kv_dtype} tensor on {dev} (kv_data_type of plan())",
                _describe(c),
            )
            view = _cache_view(c, self._kv_layout, f"paged_kv_cache.{nm}")
            check(
                (view.page_size, view.heads, view.dim) == (p.page_size, p.num_kv_heads, d),
                f"paged_kv_cache.{nm}",
                f"page_size {p.page_size}, {p.num_kv_heads} KV heads and head dim {d} "
                f"({self._kv_layout} layout, as planned)",
                _describe(c),
            )
            views.append(view)
        kv_view, vv_view = views
        check(
            kv_view.num_pages == vv_view.num_pages,
            "paged_kv_cache",
            "as many V pages as K pages",
            f"{kv_view.num_pages} and {vv_view.num_pages}",
        )
        num_pages = kv_view.num_pages
        if p.max_page >= num_pages:
            raise InvalidArgumentError(
                f"{p.max_page_at}: expected a page id in [0, {num_pages}) (the pages of "
                f"paged_kv_cache), got {p.max_page}"
            )

        fp8 = p.kv_dtype == FP8_KV_DTYPE
        scale = p.sm_scale if p.sm_scale is not None else 1.0 / math.sqrt(p.head_dim_qk)
        qf, qt = _scale_parts(q_scale, "q_scale", dev)
        kf, kt = _scale_parts(k_scale, "k_scale", dev)
        vf, vt = _scale_parts(v_scale, "v_scale", dev)
        scale *= qf
        if not fp8:
            for nm, t in (("q_scale", qt), ("k_scale", kt)):
                if t is not None:
                    raise UnsupportedFeatureError(
                        f"{nm}: a tensor scale with a {p.kv_dtype} cache would need a host "
                        "sync; pass a Python float"
                    )
            scale *= kf
        check(
            is_positive_finite(scale),
            "sm_scale * q_scale" + ("" if fp8 else " * k_scale"),
            "a finite float > 0 (the softmax scale)",
            scale,
        )

        if sinks is not None:
            check(
                isinstance(sinks, torch.Tensor)
                and tuple(sinks.shape) == (p.num_qo_heads,)
                and sinks.is_floating_point()
                and sinks.device == dev,
                "sinks",
                f"a float tensor of shape ({p.num_qo_heads},) on {dev}",
                _describe(sinks),
            )
            sinks = sinks.float()
        out_shape = (p.total_q, p.num_qo_heads, p.head_dim_vo)
        if out is not None:
            check(
                isinstance(out, torch.Tensor)
                and tuple(out.shape) == out_shape
                and out.dtype == p.o_dtype
                and out.device == dev,
                "out",
                f"a {p.o_dtype} tensor of shape {out_shape} on {dev}",
                _describe(out),
            )
        if lse is not None:
            check(
                isinstance(lse, torch.Tensor)
                and tuple(lse.shape) == out_shape[:2]
                and lse.dtype == torch.float32
                and lse.device == dev,
                "lse",
                f"a float32 tensor of shape {out_shape[:2]} on {dev}",
                _describe(lse),
            )

        # Every argument is checked: write the sentinel and the FP8 scales, launch -----------
        if num_pages != self._sentinel:  # DESIGN.md: padding entries hold total_num_pages
            p.lut.masked_fill_(p.pad_mask, num_pages)
            self._sentinel = num_pages
        post_v: tuple[float, torch.Tensor | None] = (1.0, None)
        if fp8:
            self._k_scale.fill_(kf)
            for t in (kt, qt):
                if t is not None:
                    self._k_scale.mul_(t)
            self._v_scale.fill_(vf)
            if vt is not None:
                self._v_scale.mul_(vt)
        else:
            post_v = (vf, vt)
        kop = self._operand(kv_view, p, fp8, self._k_scale, p.head_dim_qk)
        vop = self._operand(vv_view, p, fp8, self._v_scale, p.head_dim_vo)

        qc = q if q.dtype == p.compute_dtype else q.to(p.compute_dtype)
        attn = dict(
            mask=p.mask,
            scale=scale,
            sinks=sinks,
            num_partitions=p.num_partitions,
            return_lse=return_lse,
            backend=p.backend,
        )
        direct = out is not None and out.dtype == p.compute_dtype and p.keep_rows is None
        if p.keep_rows is None:
            res = mha(qc, kop, vop, p.q_row_offsets, out=out if direct else None, **attn)
            o, l = res if return_lse else (res, None)
        else:  # reference backend, a request shorter than its queries: rows that see a key
            o = torch.zeros(out_shape, dtype=p.compute_dtype, device=dev)
            l = None
            if return_lse:
                l = torch.full(out_shape[:2], float("-inf"), dtype=torch.float32, device=dev)
            if p.keep_rows.numel():
                qk = qc.index_select(0, p.keep_rows)
                res = mha(qk, kop, vop, p.q_row_offsets, **attn)
                o_k, l_k = res if return_lse else (res, None)
                o.index_copy_(0, p.keep_rows, o_k)
                if return_lse:
                    l.index_copy_(0, p.keep_rows, l_k)
        if post_v[0] != 1.0:
            o.mul_(post_v[0])
        if post_v[1] is not None:
            o.mul_(post_v[1])
        if out is not None and not direct:
            out.copy_(o)
            o = out
        elif o.dtype != p.o_dtype:
            o = o.to(p.o_dtype)
        if not return_lse:
            return o
        if sinks is not None:  # FlashInfer's sink variants fold the sink into the LSE
            l = torch.logaddexp(l, sinks)
        if lse_base == "log2":
            l = l * LOG2E_F
        if lse is not None:
            lse.copy_(l)
            l = lse
        return o, l


# Decode --------------------------------------------------------------------------------------
class BatchDecodeWithPagedKVCacheWrapper(_PagedWrapperBase):
    """FlashInfer's batch decode wrapper over a paged KV cache, on pagedattn.

    Queries: `[batch * q_len_per_req, h_qo, d]`, the last `q_len_per_req` tokens of each request
    (causal among themselves when > 1). See the module docstring and docs/compat.md.
    """

    _api = "BatchDecodeWithPagedKVCacheWrapper"

    @typed_call
    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        use_tensor_cores: bool = False,
        paged_kv_indptr_buffer: torch.Tensor | None = None,
        paged_kv_indices_buffer: torch.Tensor | None = None,
        paged_kv_last_page_len_buffer: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
        *,
        pagedattn_backend: str | None = None,
        max_pages_per_request: int | None = None,
    ) -> None:
        """float_workspace_buffer: any tensor on the target device (pagedattn needs no
        workspace). kv_layout: "NHD" or "HND". use_cuda_graph: keep plan metadata in static
        buffers; then paged_kv_indptr_buffer [B + 1], paged_kv_indices_buffer [max pages] and
        paged_kv_last_page_len_buffer [B] fix the batch size B and the page capacity (pagedattn
        keeps its own metadata; these are not written). use_tensor_cores, backend: accepted
        (pagedattn picks its kernels). pagedattn_backend: "triton"/"reference" override.
        max_pages_per_request: CUDA-graph lookup-table width (default: the indices buffer's
        length).
        """
        _check_bool(use_tensor_cores, "use_tensor_cores")
        _check_bool(use_cuda_graph, "use_cuda_graph")
        fixed, cap = 0, 0
        if use_cuda_graph:
            _check_graph_buffers(
                paged_kv_indptr_buffer=paged_kv_indptr_buffer,
                paged_kv_indices_buffer=paged_kv_indices_buffer,
                paged_kv_last_page_len_buffer=paged_kv_last_page_len_buffer,
            )
            fixed = paged_kv_last_page_len_buffer.shape[0]
            check(
                fixed >= 1 and paged_kv_indptr_buffer.shape[0] == fixed + 1,
                "paged_kv_indptr_buffer",
                f"batch_size + 1 = {fixed + 1} entries",
                _describe(paged_kv_indptr_buffer),
            )
            cap = paged_kv_indices_buffer.shape[0]
        self._use_tensor_cores = use_tensor_cores
        self._init_common(fixed, cap, **_by_name(locals(), _INIT_ARGS))

    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    @typed_call
    def plan(
        self,
        indptr: torch.Tensor,
        indices: torch.Tensor,
        last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim: int,
        page_size: int,
        pos_encoding_mode: str = "NONE",
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        q_data_type: str | torch.dtype = "float16",
        kv_data_type: str | torch.dtype | None = None,
        o_data_type: str | torch.dtype | None = None,
        data_type: str | torch.dtype | None = None,
        sm_scale: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        non_blocking: bool = True,
        block_tables: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
        q_len_per_req: int = 1,
        *,
        window_right: int = 0,
    ) -> None:
        """Plan a decode step (host work; not inside a CUDA graph).

        indptr [b + 1], indices [indptr[-1]], last_page_len [b]: integer page table (any
        device). num_qo_heads % num_kv_heads == 0; head_dim; page_size >= 1.
        window_left: -1 or w >= 0 (keys p - w .. p). sm_scale: None = 1/sqrt(head_dim).
        q/kv/o_data_type (or the deprecated data_type): dtypes run() will see.
        seq_lens [b]: KV lengths overriding last_page_len. q_len_per_req: queries a request.
        disable_split_kv: one split-K partition. rope_scale, rope_theta, block_tables and
        fixed_split_size are accepted and unused.
        """
        _check_optional(rope_scale, "rope_scale", "float")
        _check_optional(rope_theta, "rope_theta", "float")
        _check_optional(block_tables, "block_tables", "tensor")
        _check_optional(fixed_split_size, "fixed_split_size", "int")
        check(
            isinstance(window_right, numbers.Integral) and not isinstance(window_right, bool),
            "window_right",
            "0 (an int)",
            _describe(window_right),
        )
        if window_right != 0:
            raise UnsupportedFeatureError(
                f"window_right={window_right}: only causal (window_right=0) decode is supported"
            )
        if data_type is not None:  # deprecated alias: q and kv dtypes not given otherwise
            _as_dtype(data_type, "data_type")
            if q_data_type is None or (isinstance(q_data_type, str) and q_data_type == "float16"):
                q_data_type = data_type
            if kv_data_type is None:
                kv_data_type = data_type
        self._plan_impl(
            names=_DECODE_NAMES,
            q_lens=None,
            q_len_per_req=_as_int(q_len_per_req, "q_len_per_req", 1),
            indptr=indptr,
            indices=indices,
            last_page_len=last_page_len,
            head_dim_qk=head_dim,
            causal_mask=True,
            **_by_name(locals(), _PLAN_ARGS),
        )

    begin_forward = plan

    @typed_call
    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: PagedKVCache,
        *args: Any,
        q_scale: float | torch.Tensor | None = None,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
        q_len_per_req: int | None = None,
        skip_softmax_threshold_scale_factor: float | None = None,
        kv_cache_sf: Any = None,
        lse_base: str = "log2",
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Decode attention: q [b * q_len_per_req, h_qo, d] -> out [same, h_qo, d]
        (o_data_type), and with return_lse the float32 [b * q_len_per_req, h_qo] LSE (base 2,
        or natural with lse_base="ln"; includes the sink when sinks are given).

        k_scale / v_scale / q_scale: per-tensor calibration scales (float or one-element
        tensor; tensors need an FP8 cache). sinks: [h_qo] logits. out / lse: preallocated
        outputs. enable_pdl and skip_softmax_threshold_scale_factor are accepted and unused
        (exact attention).
        """
        _check_optional(enable_pdl, "enable_pdl", "bool")
        _check_optional(
            skip_softmax_threshold_scale_factor, "skip_softmax_threshold_scale_factor", "float"
        )
        if q_len_per_req is not None:
            _as_int(q_len_per_req, "q_len_per_req", 1)
        if q_len_per_req is not None and self._plan is not None and isinstance(q, torch.Tensor):
            check(
                q.shape[0] == self._plan.batch * q_len_per_req,
                "q_len_per_req",
                f"q.shape[0] / batch = {q.shape[0]} / {self._plan.batch}",
                q_len_per_req,
            )
        return self._run_impl(
            q, paged_kv_cache, args, q_scale, k_scale, v_scale, out, lse, return_lse,
            window_left, sinks, kv_cache_sf, lse_base,
        )  # fmt: skip


# Prefill -------------------------------------------------------------------------------------
class BatchPrefillWithPagedKVCacheWrapper(_PagedWrapperBase):
    """FlashInfer's batch prefill/append wrapper over a paged KV cache, on pagedattn.

    Ragged queries `[qo_indptr[-1], h_qo, d_qk]`; request b's queries are the last
    `qo_indptr[b+1] - qo_indptr[b]` tokens of its KV. See docs/compat.md.
    """

    _api = "BatchPrefillWithPagedKVCacheWrapper"

    @typed_call
    def __init__(
        self,
        float_workspace_buffer: torch.Tensor,
        kv_layout: str = "NHD",
        use_cuda_graph: bool = False,
        qo_indptr_buf: torch.Tensor | None = None,
        paged_kv_indptr_buf: torch.Tensor | None = None,
        paged_kv_indices_buf: torch.Tensor | None = None,
        paged_kv_last_page_len_buf: torch.Tensor | None = None,
        custom_mask_buf: torch.Tensor | None = None,
        mask_indptr_buf: torch.Tensor | None = None,
        backend: str = "auto",
        jit_args: list[Any] | None = None,
        *,
        pagedattn_backend: str | None = None,
        max_pages_per_request: int | None = None,
    ) -> None:
        """As FlashInfer: with use_cuda_graph, qo_indptr_buf [B + 1], paged_kv_indptr_buf
        [B + 1], paged_kv_indices_buf [max pages] and paged_kv_last_page_len_buf [B] fix the
        batch size and page capacity (pagedattn keeps its own static metadata; these and the
        custom-mask buffers are not written). pagedattn_backend / max_pages_per_request: see
        `BatchDecodeWithPagedKVCacheWrapper`.
        """
        _check_bool(use_cuda_graph, "use_cuda_graph")
        fixed, cap = 0, 0
        if use_cuda_graph:
            _check_graph_buffers(
                qo_indptr_buf=qo_indptr_buf,
                paged_kv_indptr_buf=paged_kv_indptr_buf,
                paged_kv_indices_buf=paged_kv_indices_buf,
                paged_kv_last_page_len_buf=paged_kv_last_page_len_buf,
            )
            fixed = qo_indptr_buf.shape[0] - 1
            check(
                fixed >= 1
                and paged_kv_indptr_buf.shape[0] == fixed + 1
                and paged_kv_last_page_len_buf.shape[0] == fixed,
                "paged_kv_indptr_buf / paged_kv_last_page_len_buf",
                f"batch_size + 1 = {fixed + 1} and batch_size = {fixed} entries",
                f"{_describe(paged_kv_indptr_buf)}, {_describe(paged_kv_last_page_len_buf)}",
            )
            cap = paged_kv_indices_buf.shape[0]
        self._init_common(fixed, cap, **_by_name(locals(), _INIT_ARGS))

    @typed_call
    def plan(
        self,
        qo_indptr: torch.Tensor,
        paged_kv_indptr: torch.Tensor,
        paged_kv_indices: torch.Tensor,
        paged_kv_last_page_len: torch.Tensor,
        num_qo_heads: int,
        num_kv_heads: int,
        head_dim_qk: int,
        page_size: int,
        head_dim_vo: int | None = None,
        custom_mask: torch.Tensor | None = None,
        packed_custom_mask: torch.Tensor | None = None,
        causal: bool = False,
        pos_encoding_mode: str = "NONE",
        use_fp16_qk_reduction: bool = False,
        sm_scale: float | None = None,
        window_left: int = -1,
        logits_soft_cap: float | None = None,
        rope_scale: float | None = None,
        rope_theta: float | None = None,
        q_data_type: str | torch.dtype = "float16",
        kv_data_type: str | torch.dtype | None = None,
        o_data_type: str | torch.dtype | None = None,
        non_blocking: bool = True,
        prefix_len_ptr: torch.Tensor | None = None,
        token_pos_in_items_ptr: torch.Tensor | None = None,
        token_pos_in_items_len: int = 0,
        max_item_len_ptr: torch.Tensor | None = None,
        seq_lens: torch.Tensor | None = None,
        seq_lens_q: torch.Tensor | None = None,
        block_tables: torch.Tensor | None = None,
        max_token_per_sequence: int | None = None,
        max_sequence_kv: int | None = None,
        fixed_split_size: int | None = None,
        disable_split_kv: bool = False,
    ) -> None:
        """Plan a prefill/append step (host work; not inside a CUDA graph).

        qo_indptr [b + 1]: query prefix sums. paged_kv_indptr / paged_kv_indices /
        paged_kv_last_page_len: the page table. head_dim_vo: V head dim (None = head_dim_qk).
        custom_mask (bool, flattened per-request [q_len, kv_len]) or packed_custom_mask
        (uint8, bits packed little-endian per request) replace `causal`. causal: query i of a
        request sees keys <= kv_len - q_len + i. window_left: -1 or w >= 0 (left bound
        p - w; with causal=False there is no right bound). Other arguments as FlashInfer;
        use_fp16_qk_reduction, rope_*, seq_lens_q, block_tables, max_token_per_sequence,
        max_sequence_kv and fixed_split_size are accepted and unused.
        """
        for nm, t in (
            ("prefix_len_ptr", prefix_len_ptr),
            ("token_pos_in_items_ptr", token_pos_in_items_ptr),
            ("max_item_len_ptr", max_item_len_ptr),
        ):
            if t is not None:
                raise UnsupportedFeatureError(f"{nm}: multi-item scoring is not supported")
        _check_bool(causal, "causal")
        _check_bool(use_fp16_qk_reduction, "use_fp16_qk_reduction")
        for nm, x, kind in (
            ("rope_scale", rope_scale, "float"),
            ("rope_theta", rope_theta, "float"),
            ("seq_lens_q", seq_lens_q, "tensor"),
            ("block_tables", block_tables, "tensor"),
            ("max_token_per_sequence", max_token_per_sequence, "int"),
            ("max_sequence_kv", max_sequence_kv, "int"),
            ("fixed_split_size", fixed_split_size, "int"),
            ("token_pos_in_items_len", token_pos_in_items_len, "int"),
        ):
            _check_optional(x, nm, kind)
        qo = _host_ints(qo_indptr, "qo_indptr")
        check(qo.shape[0] >= 2, "qo_indptr", "batch + 1 >= 2 entries", _describe(qo_indptr))
        q_lens = qo[1:] - qo[:-1]
        check(
            int(qo[0]) == 0 and bool((q_lens >= 0).all()),
            "qo_indptr",
            "non-decreasing prefix sums starting at 0",
            qo.tolist() if qo.shape[0] <= 17 else f"{qo[:8].tolist()} ...",
        )
        check(
            paged_kv_last_page_len is not None
            and isinstance(paged_kv_last_page_len, torch.Tensor)
            and paged_kv_last_page_len.ndim == 1
            and paged_kv_last_page_len.shape[0] == q_lens.shape[0],
            "paged_kv_last_page_len",
            f"a 1-D tensor of batch = {q_lens.shape[0]} entries (qo_indptr has batch + 1)",
            _describe(paged_kv_last_page_len),
        )
        self._plan_impl(
            names=_PREFILL_NAMES,
            q_lens=q_lens,
            q_len_per_req=1,
            indptr=paged_kv_indptr,
            indices=paged_kv_indices,
            last_page_len=paged_kv_last_page_len,
            head_dim_qk=head_dim_qk,
            head_dim_vo=head_dim_vo,
            causal_mask=causal,
            custom_mask=custom_mask,
            packed_custom_mask=packed_custom_mask,
            **_by_name(locals(), _PLAN_ARGS),
        )

    begin_forward = plan

    @typed_call
    def run(
        self,
        q: torch.Tensor,
        paged_kv_cache: PagedKVCache,
        *args: Any,
        q_scale: float | torch.Tensor | None = None,
        k_scale: float | torch.Tensor | None = None,
        v_scale: float | torch.Tensor | None = None,
        out: torch.Tensor | None = None,
        lse: torch.Tensor | None = None,
        return_lse: bool = False,
        enable_pdl: bool | None = None,
        window_left: int | None = None,
        sinks: torch.Tensor | None = None,
        kv_cache_sf: Any = None,
        skip_softmax_threshold_scale_factor: float | None = None,
        lse_base: str = "log2",
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Prefill/append attention: q [qo_indptr[-1], h_qo, d_qk] -> out [same, h_qo, d_vo]
        (o_data_type), and with return_lse the float32 [qo_indptr[-1], h_qo] LSE (base 2, or
        natural with lse_base="ln"; includes the sink when sinks are given). Other arguments
        as `BatchDecodeWithPagedKVCacheWrapper.run`.
        """
        _check_optional(enable_pdl, "enable_pdl", "bool")
        _check_optional(
            skip_softmax_threshold_scale_factor, "skip_softmax_threshold_scale_factor", "float"
        )
        return self._run_impl(
            q, paged_kv_cache, args, q_scale, k_scale, v_scale, out, lse, return_lse,
            window_left, sinks, kv_cache_sf, lse_base,
        )  # fmt: skip


__all__ = [
    "BatchDecodeWithPagedKVCacheWrapper",
    "BatchPrefillWithPagedKVCacheWrapper",
    "UnsupportedFeatureError",
]
