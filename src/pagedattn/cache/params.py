"""KV cache parameters: shapes, dtypes, quantization and device layout.

`KVCacheParams` describes one model's paged KV cache. Its buffers are

    kv_blocks: [total_num_pages, kv_dim, num_layers, page_size, n_kv_heads_per_device, row_elems]
    kv_scales: [total_num_pages, kv_dim, num_layers, page_size, n_kv_heads_per_device, n_scales]

with `kv_dim` 2 (K and V) for MHA and 1 (one latent "head", K only) for MLA. For plain caches
`row_elems == head_dim`. Byte-packed FP8 formats (the rope-aware MLA row, FlashMLA's V32 row and
MODEL1 page) store uint8 rows whose length `row_elems` is the format's byte count per token.
A per-tensor FP8 cache keeps one static float32 scale per (K/V, layer): kv_scales `[kv_dim, L]`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

import numpy as np
import torch

from ..errors import INT32_MAX, InvalidArgumentError, check, check_bool, check_int
from ..fp8.blockwise import FP8_DTYPE

# FlashMLA's formats are fixed by its kernels; fp8/mla_formats.py holds their byte layouts.
from ..fp8.mla_formats import E8M0_DTYPE, MODEL1_BYTES, MODEL1_D_QK, V32_BYTES, V32_D_QK

QuantFormat = Literal[
    "blockwise", "per_tensor", "mla_rope_aware", "flashmla_v32", "flashmla_model1"
]
SCALE_DTYPES = (torch.float32, E8M0_DTYPE)
# The FlashMLA formats fix an MLA cache's head_dim (d_qk).
FLASHMLA_D_QK = {"flashmla_v32": V32_D_QK, "flashmla_model1": MODEL1_D_QK}


@dataclass(frozen=True)
class KVQuantConfig:
    """FP8 (e4m3) storage of the KV cache.

    format:
      - "blockwise": one scale per `granularity` head-dim elements (G divides head_dim).
        `granularity=None` means G = head_dim: one scale per token per head.
      - "per_tensor": one static float32 scale per (K or V, layer), set by the caller.
      - "mla_rope_aware": MLA row of (head_dim - rope_dim) e4m3 bytes + rope_dim bf16 values,
        one float32 scale per token (512 + 128 = 640 bytes for DeepSeek).
      - "flashmla_v32": FlashMLA's 656-byte row (d_qk 576).
      - "flashmla_model1": FlashMLA's MODEL1 page layout (d_qk 512).
    scale_dtype: float32 or float8_e8m0fnu (power-of-two scales). Fixed by the FlashMLA formats.

    A format that is not one of these strings, a granularity that is not an int in
    [1, 2**31 - 1] (or None), or a scale_dtype that is not one of these torch.dtypes raises
    `InvalidArgumentError` naming the field ("KVQuantConfig.<field>").
    """

    format: QuantFormat = "blockwise"
    granularity: int | None = None
    scale_dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        # Types first, so that no comparison below can raise a TypeError.
        allowed = ("blockwise", "per_tensor", "mla_rope_aware", "flashmla_v32", "flashmla_model1")
        check(
            isinstance(self.format, str) and self.format in allowed,
            "KVQuantConfig.format",
            f"one of {allowed}",
            repr(self.format),
        )
        check(
            isinstance(self.scale_dtype, torch.dtype) and self.scale_dtype in SCALE_DTYPES,
            "KVQuantConfig.scale_dtype",
            "torch.float32 or torch.float8_e8m0fnu",
            repr(self.scale_dtype),
        )
        if self.granularity is not None:
            g = check_int("KVQuantConfig.granularity", self.granularity, 1, INT32_MAX)
            object.__setattr__(self, "granularity", g)
            check(
                self.format == "blockwise",
                "KVQuantConfig.granularity",
                "None unless format='blockwise'",
                self.granularity,
            )
        if self.format in ("per_tensor", "mla_rope_aware", "flashmla_v32"):
            check(
                self.scale_dtype == torch.float32,
                "KVQuantConfig.scale_dtype",
                f"torch.float32 for format={self.format!r}",
                self.scale_dtype,
            )
        if self.format == "flashmla_model1":
            object.__setattr__(self, "scale_dtype", E8M0_DTYPE)

    # Named constructors -------------------------------------------------------------------
    @classmethod
    def blockwise(cls, granularity: int, scale_dtype: torch.dtype = torch.float32) -> KVQuantConfig:
        return cls("blockwise", granularity, scale_dtype)

    @classmethod
    def per_token(cls, scale_dtype: torch.dtype = torch.float32) -> KVQuantConfig:
        return cls("blockwise", None, scale_dtype)

    @classmethod
    def per_tensor(cls) -> KVQuantConfig:
        return cls("per_tensor")

    @classmethod
    def mla_rope_aware(cls) -> KVQuantConfig:
        return cls("mla_rope_aware")

    @classmethod
    def flashmla_v32(cls) -> KVQuantConfig:
        return cls("flashmla_v32")

    @classmethod
    def flashmla_model1(cls) -> KVQuantConfig:
        return cls("flashmla_model1", None, E8M0_DTYPE)


def _as_devices(devices: object) -> tuple:
    """`devices` (one device or a list/tuple of them) as a tuple of torch.device."""
    name = "KVCacheParams.devices"
    if isinstance(devices, (str, torch.device)):
        devices = [devices]
    check(
        isinstance(devices, (list, tuple)) and len(devices) >= 1,
        name,
        "a device or a non-empty list/tuple of devices (str or torch.device)",
        repr(devices),
    )
    out = []
    for d in devices:
        if isinstance(d, torch.device):
            out.append(d)
            continue
        check(
            isinstance(d, (str, int, np.integer)) and not isinstance(d, bool),
            name,
            "devices given as str, int or torch.device",
            repr(d),
        )
        try:
            out.append(torch.device(d))
        except (RuntimeError, TypeError, ValueError) as e:
            raise InvalidArgumentError(f"{name}: {d!r} is not a device ({e})") from None
    return tuple(out)


@dataclass(frozen=True)
class KVCacheParams:
    """One model's paged KV cache.

    dtype: the model's K/V dtype (bf16, fp16 or fp32); with `quantization`, storage is FP8.
    n_kv_heads: KV heads of the whole model (MLA: 1, the latent "head").
    head_dim: per-head dim (MLA: kv_lora_rank + rope_dim, 576 for DeepSeek V2/V3, 512 for V4).
    page_size: tokens per page, any int >= 1.
    num_q_heads: query heads of the model (required for MLA; defaults to n_kv_heads for MHA).
    devices: every device of one data-parallel group after another; tensor-parallel degree is
      len(devices) // data_parallel_degree.
    mla_rope_dim: rope part of an MLA row (64 for DeepSeek); in (0, head_dim) for MLA, any
      int >= 0 (unused) for MHA.
    is_mla / enable_prefix_caching / enable_dispatch_metadata / enable_speculative: bools.
    quantization: a `KVQuantConfig`, or None for caches stored in `dtype`.

    Every int field is a Python int (numpy integers are converted; bool, float and str are
    rejected) in [1, 2**31 - 1] (num_q_heads may also be None, mla_rope_dim may be 0); bool
    fields take only bools; `dtype` must be a torch.dtype and every device must parse as a
    torch.device. Any other value raises `InvalidArgumentError` naming the field
    ("KVCacheParams.<field>").
    """

    dtype: torch.dtype
    num_layers: int
    n_kv_heads: int
    head_dim: int
    page_size: int
    is_mla: bool = False
    num_q_heads: int | None = None
    devices: tuple = field(default=("cpu",))
    data_parallel_degree: int = 1
    enable_prefix_caching: bool = True
    quantization: KVQuantConfig | None = None
    mla_rope_dim: int = 64
    enable_dispatch_metadata: bool = True
    enable_speculative: bool = False

    def __post_init__(self) -> None:
        # Every field's type first (normalising numpy scalars), then values, then how the fields
        # fit together: no comparison below can meet a value of the wrong type.
        def put(name: str, v: object) -> None:
            object.__setattr__(self, name, v)

        check(
            isinstance(self.dtype, torch.dtype)
            and self.dtype in (torch.bfloat16, torch.float16, torch.float32),
            "KVCacheParams.dtype",
            "torch.bfloat16, torch.float16 or torch.float32",
            repr(self.dtype),
        )
        for name in ("num_layers", "n_kv_heads", "head_dim", "page_size", "data_parallel_degree"):
            put(name, check_int(f"KVCacheParams.{name}", getattr(self, name), 1, INT32_MAX))
        if self.num_q_heads is not None:
            put(
                "num_q_heads",
                check_int("KVCacheParams.num_q_heads", self.num_q_heads, 1, INT32_MAX),
            )
        put(
            "mla_rope_dim", check_int("KVCacheParams.mla_rope_dim", self.mla_rope_dim, 0, INT32_MAX)
        )
        for name in (
            "is_mla",
            "enable_prefix_caching",
            "enable_dispatch_metadata",
            "enable_speculative",
        ):
            put(name, check_bool(f"KVCacheParams.{name}", getattr(self, name)))
        put("devices", _as_devices(self.devices))
        check(
            self.quantization is None or isinstance(self.quantization, KVQuantConfig),
            "KVCacheParams.quantization",
            "a KVQuantConfig or None",
            repr(self.quantization),
        )
        dp = self.data_parallel_degree
        check(
            len(self.devices) % dp == 0,
            "KVCacheParams.data_parallel_degree",
            f"a divisor of len(devices)={len(self.devices)}",
            dp,
        )
        if self.is_mla:
            check(self.n_kv_heads == 1, "KVCacheParams.n_kv_heads", "1 for MLA", self.n_kv_heads)
            check(
                self.num_q_heads is not None,
                "KVCacheParams.num_q_heads",
                "an int >= 1 for MLA",
                self.num_q_heads,
            )
            check(
                0 < self.mla_rope_dim < self.head_dim,
                "KVCacheParams.mla_rope_dim",
                f"in (0, head_dim={self.head_dim})",
                self.mla_rope_dim,
            )
        else:
            if self.num_q_heads is None:
                put("num_q_heads", self.n_kv_heads)
            check(
                self.num_q_heads % self.n_kv_heads == 0,
                "KVCacheParams.num_q_heads",
                f"a multiple of n_kv_heads={self.n_kv_heads}",
                self.num_q_heads,
            )
            check(
                self.n_kv_heads % self.tp_degree == 0,
                "KVCacheParams.n_kv_heads",
                f"divisible by the tensor-parallel degree {self.tp_degree}",
                self.n_kv_heads,
            )
        self._check_quantization()

    def _check_quantization(self) -> None:
        q = self.quantization
        if q is None:
            return
        if q.format == "blockwise":
            g = q.granularity or self.head_dim
            check(
                self.head_dim % g == 0,
                "KVQuantConfig.granularity",
                f"a divisor of head_dim={self.head_dim}",
                g,
            )
        elif q.format == "mla_rope_aware":
            check(self.is_mla, "KVQuantConfig.format", "an MLA cache for 'mla_rope_aware'", "MHA")
        elif q.format in FLASHMLA_D_QK:
            d_qk = FLASHMLA_D_QK[q.format]
            check(
                self.is_mla and self.head_dim == d_qk,
                "KVQuantConfig.format",
                f"an MLA cache with head_dim {d_qk} for {q.format!r}",
                f"is_mla={self.is_mla}, head_dim={self.head_dim}",
            )

    # Derived layout ----------------------------------------------------------------------
    @property
    def kv_dim(self) -> int:
        """2 (K and V) for MHA, 1 (K only; V is a slice of K) for MLA."""
        return 1 if self.is_mla else 2

    @property
    def tp_degree(self) -> int:
        return len(self.devices) // self.data_parallel_degree

    @property
    def n_kv_heads_per_device(self) -> int:
        """MHA shards KV heads over the tensor-parallel group; MLA replicates its one head."""
        return self.n_kv_heads if self.is_mla else self.n_kv_heads // self.tp_degree

    @property
    def quant_format(self) -> str | None:
        return None if self.quantization is None else self.quantization.format

    @property
    def storage_dtype(self) -> torch.dtype:
        """dtype of `kv_blocks`."""
        f = self.quant_format
        if f is None:
            return self.dtype
        if f in ("blockwise", "per_tensor"):
            return FP8_DTYPE
        return torch.uint8

    @property
    def row_elems(self) -> int:
        """Last dim of `kv_blocks`: elements (bytes for packed formats) a token row takes."""
        f = self.quant_format
        latent = self.head_dim - self.mla_rope_dim
        if f == "mla_rope_aware":
            return latent + 2 * self.mla_rope_dim
        if f == "flashmla_v32":
            return V32_BYTES
        if f == "flashmla_model1":
            return MODEL1_BYTES
        return self.head_dim

    @property
    def scale_granularity(self) -> int | None:
        """G for blockwise formats (head-dim elements a scale covers)."""
        q = self.quantization
        if q is None or q.format != "blockwise":
            return None
        return q.granularity or self.head_dim

    @property
    def has_scale_buffer(self) -> bool:
        return self.quant_format in ("blockwise", "per_tensor", "mla_rope_aware")

    @property
    def scale_dtype(self) -> torch.dtype | None:
        return None if self.quantization is None else self.quantization.scale_dtype

    def blocks_shape(self, total_num_pages: int) -> tuple[int, ...]:
        return (
            total_num_pages,
            self.kv_dim,
            self.num_layers,
            self.page_size,
            self.n_kv_heads_per_device,
            self.row_elems,
        )

    def scales_shape(self, total_num_pages: int) -> tuple[int, ...] | None:
        f = self.quant_format
        if f == "blockwise":
            n = self.head_dim // self.scale_granularity
        elif f == "mla_rope_aware":
            n = 1
        elif f == "per_tensor":
            return (self.kv_dim, self.num_layers)
        else:
            return None
        return (*self.blocks_shape(total_num_pages)[:-1], n)

    def bytes_per_page(self) -> int:
        """Bytes one page takes on one device, scales included."""
        elem = torch.tensor([], dtype=self.storage_dtype).element_size()
        n = math.prod(self.blocks_shape(1)) * elem
        if self.quant_format in ("blockwise", "mla_rope_aware"):
            s = torch.tensor([], dtype=self.scale_dtype).element_size()
            n += math.prod(self.scales_shape(1)) * s
        return n

    def pages_for_memory(self, memory_bytes: int) -> int:
        """Pages that fit a per-device memory budget in bytes."""
        memory_bytes = check_int("memory_bytes", memory_bytes, 0)
        n = memory_bytes // self.bytes_per_page()
        if n < 1:
            raise InvalidArgumentError(
                f"memory_bytes: {memory_bytes} B is less than one page ({self.bytes_per_page()} B)"
            )
        return n

    def replica_devices(self, replica: int) -> tuple:
        """The tensor-parallel devices of data-parallel replica `replica` (in [0, dp))."""
        replica = check_int("replica", replica, 0, self.data_parallel_degree - 1)
        tp = self.tp_degree
        return self.devices[replica * tp : (replica + 1) * tp]
