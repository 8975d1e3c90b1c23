"""Host-side split-K plan: how many KV partitions a decode launch uses, and the device facts
(capability, SM count, HBM class) that the plan and the launchers read, cached per device.

Pure host arithmetic, so that `PagedKVCacheManager.runtime_inputs` can fill
`attention_dispatch_metadata` and `mla_num_partitions` before a (captured) launch; the kernels
read the same numbers, so a CUDA graph and the kernel always agree.

Rule: a decode launch has `units` independent tiles (requests x KV heads for MHA, requests x
query-row tiles for MLA); each request's keys split into P partitions so that `units * P` fills
at most ONE wave of resident CTAs (`ctas_per_sm * SMs`: a partial second wave costs a whole
tile time), while each partition keeps >= `MIN_TOKENS_PER_PARTITION` keys. The resident CTAs a
SM and the rows of an MLA tile are facts of the kernels in `ops/` that the plan takes as inputs
(the constants below, each with its measurement); the history is docs/kernels/split_k_plan.md.
"""

from __future__ import annotations

import functools
import math

import torch

DEFAULT_NUM_SMS = 132  # H100 SXM; used when no CUDA device is visible (CPU, graph planning)
MIN_TOKENS_PER_PARTITION = 256  # below this, the combine pass costs more than it saves
MAX_PARTITIONS = 64
# Plan inputs (kernel facts; measurements in docs/kernels/split_k_plan.md): CTAs a SM, tile rows.
# H100, b16 ctx16384 32/8 heads d128: P 2 368.7 us, P 3 373.2, P 4 374.2.
MHA_CTAS_PER_SM = 2
# H200 (`fast_hbm`), b16 ctx16384: P 2 / 3 / 4 283 / 258 / 257 us (5 stages).
MHA_CTAS_PER_SM_FAST_HBM = 4
# FP8 K/V, H100, b16 ctx16384: P 2 268.1 us, P 4 208.6, P 8 254.6.
MHA_FP8_CTAS_PER_SM = 4
MLA_CTAS_PER_SM = 1  # the MLA decode kernels' shared memory holds one CTA a SM
MLA_HEADS_PER_TILE = 64  # query rows of one MLA tile (one wgmma M)
# gluon_mla_tw (rope-aware FP8, h_q <= 16): H100 b 128 P 1 0.129 ms, P 2 0.144.
MLA_FP8_SMALL_CTAS_PER_SM = 1
MLA_FP8_SMALL_ROWS = 16  # query rows of one gluon_mla_tw tile


@functools.cache
def _cuda_properties(index: int) -> tuple[tuple[int, int], int, int]:
    p = torch.cuda.get_device_properties(index)
    return (p.major, p.minor), p.multi_processor_count, p.total_memory


def _cuda_index(device: torch.device | str | None) -> int | None:
    d = torch.device(device) if device is not None else None
    if d is None or d.type != "cuda" or not torch.cuda.is_available():
        return None
    return d.index if d.index is not None else torch.cuda.current_device()


def cuda_capability(device: torch.device | str | None) -> tuple[int, int] | None:
    """(major, minor) compute capability of a CUDA device, None for any other device. Cached
    per device: a launch asks several times, and each uncached query cost the H100 host
    several us of an eager call (dev/host_cost.py)."""
    i = _cuda_index(device)
    return None if i is None else _cuda_properties(i)[0]


def num_sms(device: torch.device | str | None = None) -> int:
    """Multiprocessor count of a CUDA device (cached), or DEFAULT_NUM_SMS elsewhere."""
    i = _cuda_index(device)
    return DEFAULT_NUM_SMS if i is None else _cuda_properties(i)[1]


def fast_hbm(device: torch.device | str | None) -> bool:
    """Whether `device` is an sm_90 part with more than 100 GiB of HBM3e (H200 141 GB, GH200 144
    GB: ~4.8 TB/s against the H100's 3.35 over the same 132 SMs), where memory-bound decode
    keeps more bytes in flight a SM: `mha_num_partitions` aims at more CTAs and
    `ops.mha.selection.decode_config` at more pipeline stages (measurements there). False on any
    other device (cached)."""
    i = _cuda_index(device)
    if i is None:
        return False
    cap, _sms, mem = _cuda_properties(i)
    return cap == (9, 0) and mem > 100 * 2**30


def choose_num_partitions(
    units: int, max_cache_len: int, sms: int = DEFAULT_NUM_SMS, ctas_per_sm: int = 1
) -> int:
    """Split-K partitions for `units` independent tiles over `max_cache_len` keys: the most
    that still fit one wave of `ctas_per_sm * sms` CTAs (at least 1)."""
    units = max(int(units), 1)
    if max_cache_len <= MIN_TOKENS_PER_PARTITION:
        return 1
    want = (ctas_per_sm * sms) // units
    cap = max(1, max_cache_len // MIN_TOKENS_PER_PARTITION)
    return int(max(1, min(want, cap, MAX_PARTITIONS)))


def mha_num_partitions(
    batch: int,
    n_kv_heads: int,
    max_prompt_len: int,
    max_cache_len: int,
    sms: int,
    kv_bytes: int = 2,
    hbm3e: bool = False,
) -> int:
    """MHA: one tile per (request, KV head); prefill (prompt > 1) is not split. kv_bytes: bytes
    an element of the K/V storage (1 for FP8 caches); hbm3e: the device is `fast_hbm`."""
    if max_prompt_len > 1:
        return 1
    ctas = mha_ctas_per_sm(kv_bytes, hbm3e)
    return choose_num_partitions(batch * n_kv_heads, max_cache_len, sms, ctas)


def mha_ctas_per_sm(kv_bytes: int = 2, hbm3e: bool = False) -> int:
    """Resident CTAs a SM that one wave of the MHA decode kernel counts on (the constants
    above): by K/V element size (1: FP8) and HBM class."""
    if kv_bytes < 2:
        return MHA_FP8_CTAS_PER_SM
    return MHA_CTAS_PER_SM_FAST_HBM if hbm3e else MHA_CTAS_PER_SM


def mla_tile(
    num_q_heads: int, head_dim: int, rope_aware_fp8: bool, device: torch.device | str | None
) -> tuple[int, int]:
    """(resident CTAs a SM, query rows a tile) of the MLA decode kernel that serves a launch:
    the rope-aware FP8 register-operand kernel on sm_90 for h_q <= 16 and d_qk 576, else the
    64-row kernels."""
    sm90 = cuda_capability(device) == (9, 0)
    if sm90 and rope_aware_fp8 and head_dim == 576 and num_q_heads <= MLA_FP8_SMALL_ROWS:
        return MLA_FP8_SMALL_CTAS_PER_SM, MLA_FP8_SMALL_ROWS
    return MLA_CTAS_PER_SM, MLA_HEADS_PER_TILE


def mla_num_partitions(
    batch: int,
    num_q_heads: int,
    q_max_seq_len: int,
    max_cache_len: int,
    sms: int,
    ctas_per_sm: int = MLA_CTAS_PER_SM,
    tile_rows: int = MLA_HEADS_PER_TILE,
) -> int:
    """MLA: one tile per (request, `tile_rows` query rows); query rows are heads x query
    tokens (`mla_tile` gives the last two arguments)."""
    rows = num_q_heads * max(q_max_seq_len, 1)
    units = batch * math.ceil(rows / tile_rows)
    return choose_num_partitions(units, max_cache_len, sms, ctas_per_sm)
