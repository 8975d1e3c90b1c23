"""Paged MHA/GQA decode and prefill: pagedattn vs plain PyTorch vs FlashInfer, same data.

The cache is one layer of a `KVCacheParams` buffer, [P, 2, 1, page, h_kv, d], which is also
FlashInfer's NHD paged layout [P, 2, page, h_kv, d]: both read the very same bytes.
"""

from __future__ import annotations

import math

import torch
from common import Record, flashinfer, time_ms

from pagedattn import KVCacheInputsPerDevice, KVCacheParams, KVQuantConfig, PagedOperand, mha
from pagedattn.cache import allocate_buffers
from pagedattn.fp8 import quantize_blockwise

DECODE = [  # (batch, ctx, page, h_q, h_kv, d)
    (64, 4096, 16, 32, 8, 128),
    (64, 4096, 64, 32, 8, 128),
    (16, 16384, 64, 32, 8, 128),
    (128, 2048, 64, 32, 8, 128),
    (64, 4096, 1, 32, 8, 128),
    (64, 4096, 64, 32, 8, 96),
]


def paged_cache(b, ctx, page, h_kv, d, quant=None, dtype=torch.bfloat16):
    p = KVCacheParams(
        dtype, 1, h_kv, d, page, num_q_heads=h_kv, devices=["cuda"], quantization=quant
    )
    pages_per = math.ceil(ctx / page)
    total = b * pages_per + 1
    buf = allocate_buffers(p, total)
    kv = torch.randn(buf.kv_blocks.shape, device="cuda", dtype=torch.bfloat16)
    if quant is None:
        buf.kv_blocks.copy_(kv)
    else:
        q, s = quantize_blockwise(kv, quant.granularity or d, quant.scale_dtype)
        buf.kv_blocks.copy_(q)
        buf.kv_scales.copy_(s)
    del kv
    perm = torch.randperm(total - 1, device="cuda").int()[: b * pages_per]
    lut = perm.view(b, pages_per).contiguous()
    inp = KVCacheInputsPerDevice(
        kv_blocks=buf.kv_blocks,
        cache_lengths=torch.full((b,), ctx - 1, dtype=torch.int32, device="cuda"),
        lookup_table=lut,
        max_lengths=torch.tensor([[1, ctx - 1]], dtype=torch.int32),
        kv_scales=buf.kv_scales,
    )
    return p, inp


def torch_decode(q, inp, p, ctx, h_q):
    """Plain PyTorch: gather the pages, then SDPA with GQA."""
    b = q.shape[0]
    blocks = inp.kv_blocks[:, :, 0]  # [P, 2, page, h, d]
    g = blocks[inp.lookup_table.long()]  # [b, pages, 2, page, h, d]
    k = g[:, :, 0].flatten(1, 2)[:, :ctx].transpose(1, 2)
    v = g[:, :, 1].flatten(1, 2)[:, :ctx].transpose(1, 2)
    return torch.nn.functional.scaled_dot_product_attention(
        q.view(b, h_q, 1, -1), k, v, enable_gqa=True
    )


def bench_decode(records: list[Record], fi) -> None:
    for fp8 in (False, True):
        for b, ctx, page, h_q, h_kv, d in DECODE:
            if fp8 and (page == 1 or d != 128):
                continue
            quant = KVQuantConfig.per_token() if fp8 else None
            p, inp = paged_cache(b, ctx, page, h_kv, d, quant)
            cfg = f"{'fp8 ' if fp8 else ''}b{b} ctx{ctx} p{page} {h_q}/{h_kv} d{d}"
            q = torch.randn(b, h_q, d, device="cuda", dtype=torch.bfloat16)
            offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
            k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
            elem = 1 if fp8 else 2
            nbytes = 2 * b * ctx * h_kv * d * elem + 2 * q.numel() * 2
            if fp8:
                nbytes += 2 * b * ctx * h_kv * 4
            flops = 4 * b * h_q * ctx * d
            out = torch.empty_like(q)
            ms = time_ms(lambda: mha(q, k_op, v_op, offs, out=out))
            records.append(Record("decode", cfg, "pagedattn", ms, nbytes, flops))
            if not fp8:
                ms = time_ms(lambda: torch_decode(q, inp, p, ctx, h_q))
                records.append(Record("decode", cfg, "torch", ms, nbytes, flops))
            # FlashInfer's decode has no d96 kernel: its JIT build faults (illegal instruction).
            if fi is not None and not fp8 and d in (64, 128, 256):
                ms = flashinfer_decode(fi, q, inp, p, b, ctx, page, h_q, h_kv, d)
                if ms:
                    records.append(Record("decode", cfg, "flashinfer", ms, nbytes, flops))
            torch.cuda.empty_cache()


def flashinfer_decode(fi, q, inp, p, b, ctx, page, h_q, h_kv, d):
    try:
        ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
        w = fi.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
        pages_per = inp.lookup_table.shape[1]
        indptr = torch.arange(b + 1, dtype=torch.int32, device="cuda") * pages_per
        indices = inp.lookup_table.flatten()
        last = torch.full((b,), (ctx - 1) % page + 1, dtype=torch.int32, device="cuda")
        w.plan(
            indptr,
            indices,
            last,
            h_q,
            h_kv,
            d,
            page,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
        )
        cache = inp.kv_blocks[:, :, 0]
        w.run(q, cache)
        return time_ms(lambda: w.run(q, cache))
    except Exception as e:
        print(f"[bench] flashinfer decode failed: {type(e).__name__}: {e}")
        return None


def bench_prefill(records: list[Record], fi) -> None:
    """Causal prefill, 8 sequences of 4096 new tokens, 32 heads d128 (ragged K/V operand)."""
    from pagedattn import RaggedOperand

    nseq, n, h, d = 8, 4096, 32, 128
    q = torch.randn(nseq * n, h, d, device="cuda", dtype=torch.bfloat16)
    k = torch.randn_like(q)
    v = torch.randn_like(q)
    offs = torch.arange(nseq + 1, dtype=torch.int32, device="cuda") * n
    flops = nseq * 4 * h * d * n * n / 2
    cfg = f"causal {nseq}x{n} h{h} d{d}"
    ko, vo = RaggedOperand(k, offs), RaggedOperand(v, offs)
    out = torch.empty_like(q)
    ms = time_ms(lambda: mha(q, ko, vo, offs, out=out), warmup=5, rep=30)
    records.append(Record("prefill", cfg, "pagedattn", ms, 0, flops))
    qd, kd, vd = (x.view(nseq, n, h, d).transpose(1, 2) for x in (q, k, v))
    ms = time_ms(
        lambda: torch.nn.functional.scaled_dot_product_attention(qd, kd, vd, is_causal=True)
    )
    records.append(Record("prefill", cfg, "torch-sdpa", ms, 0, flops))
    if fi is not None:
        try:
            ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
            w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
            w.plan(offs, offs, h, h, d, causal=True, q_data_type=torch.bfloat16)
            w.run(q, k, v)
            ms = time_ms(lambda: w.run(q, k, v), warmup=5, rep=30)
            records.append(Record("prefill", cfg, "flashinfer", ms, 0, flops))
        except Exception as e:
            print(f"[bench] flashinfer prefill failed: {type(e).__name__}: {e}")


def bench_paged_prefill(records: list[Record], fi, page: int) -> None:
    """Causal prefill over a paged cache with pages of `page` tokens (the new tokens' K/V
    already stored): 8 sequences of 4096 tokens, 32 q / 8 kv heads, d128."""
    nseq, n, h, h_kv, d = 8, 4096, 32, 8, 128
    p, inp = paged_cache(nseq, n, page, h_kv, d)
    inp.cache_lengths.zero_()
    q = torch.randn(nseq * n, h, d, device="cuda", dtype=torch.bfloat16)
    offs = torch.arange(nseq + 1, dtype=torch.int32, device="cuda") * n
    flops = nseq * 4 * h * d * n * n / 2
    cfg = f"causal {nseq}x{n} p{page} {h}/{h_kv} d{d}"
    k_op, v_op = PagedOperand(inp, p, 0, "k"), PagedOperand(inp, p, 0, "v")
    out = torch.empty_like(q)
    ms = time_ms(lambda: mha(q, k_op, v_op, offs, out=out), warmup=5, rep=30)
    records.append(Record("prefill", cfg, "pagedattn", ms, 0, flops))
    if fi is not None:
        try:
            ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
            w = fi.BatchPrefillWithPagedKVCacheWrapper(ws, "NHD")
            pages_per = inp.lookup_table.shape[1]
            indptr = torch.arange(nseq + 1, dtype=torch.int32, device="cuda") * pages_per
            last = torch.full((nseq,), (n - 1) % page + 1, dtype=torch.int32, device="cuda")
            w.plan(offs, indptr, inp.lookup_table.flatten(), last, h, h_kv, d, page,
                   causal=True, q_data_type=torch.bfloat16)  # fmt: skip
            cache = inp.kv_blocks[:, :, 0]
            w.run(q, cache)
            ms = time_ms(lambda: w.run(q, cache), warmup=5, rep=30)
            records.append(Record("prefill", cfg, "flashinfer", ms, 0, flops))
        except Exception as e:
            print(f"[bench] flashinfer paged prefill failed: {type(e).__name__}: {e}")


def mla_prefill_inputs(nseq, n, prefix, h, d_qk, d_v, device, dtype=torch.bfloat16):
    """DeepSeek's expanded MLA prefill (issue 58): nseq chunks of n new tokens over `prefix`
    cached ones, h heads, K [nope | rope] of d_qk and V of d_v per head, as the model's
    `_expanded` builds them (each request's whole context, ragged). Returns q, k, v, the query
    offsets, the key offsets and the RowOperands (prefix as the cache length)."""
    from pagedattn.operands import RowOperand

    ctx = prefix + n
    q = torch.randn(nseq * n, h, d_qk, device=device, dtype=dtype)
    k = torch.randn(nseq * ctx, h, d_qk, device=device, dtype=dtype)
    v = torch.randn(nseq * ctx, h, d_v, device=device, dtype=dtype)
    q_offs = torch.arange(nseq + 1, dtype=torch.int32, device=device) * n
    kv_offs = torch.arange(nseq + 1, dtype=torch.int32, device=device) * ctx
    lens = torch.full((nseq,), prefix, dtype=torch.int32, device=device)
    starts = kv_offs[:-1].contiguous()
    ops = RowOperand(k, lens, row_offsets=starts), RowOperand(v, lens, row_offsets=starts)
    return q, k, v, q_offs, kv_offs, ops


def bench_mla_prefill(records: list[Record], fi) -> None:
    """The expanded MLA prefill of DeepSeek-V3 (128 heads, d_qk 192, d_v 128, causal) of 8
    chunks of 2048 tokens over a 2048-token prefix, against FlashInfer's ragged prefill with
    head_dim_qk=192, head_dim_vo=128 on the same tensors (its causal mask aligns the queries
    to the end of the keys: the same prefix semantics)."""
    from pagedattn.ops.masks import causal

    nseq, n, prefix, h, d_qk, d_v = 8, 2048, 2048, 128, 192, 128
    q, k, v, q_offs, kv_offs, (k_op, v_op) = mla_prefill_inputs(
        nseq, n, prefix, h, d_qk, d_v, "cuda"
    )
    flops = nseq * 2 * h * (d_qk + d_v) * (n * prefix + n * n / 2)
    cfg = f"MLA expanded causal {nseq}x{n} over {prefix} h{h} d{d_qk}/{d_v}"
    out = torch.empty(nseq * n, h, d_v, device="cuda", dtype=torch.bfloat16)
    ms = time_ms(lambda: mha(q, k_op, v_op, q_offs, mask=causal(), out=out), warmup=5, rep=30)
    records.append(Record("prefill", cfg, "pagedattn", ms, 0, flops))
    if fi is not None:
        try:
            ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
            w = fi.BatchPrefillWithRaggedKVCacheWrapper(ws, "NHD")
            w.plan(q_offs, kv_offs, h, h, d_qk, head_dim_vo=d_v, causal=True,
                   q_data_type=torch.bfloat16)  # fmt: skip
            w.run(q, k, v)
            ms = time_ms(lambda: w.run(q, k, v), warmup=5, rep=30)
            records.append(Record("prefill", cfg, "flashinfer", ms, 0, flops))
        except Exception as e:
            print(f"[bench] flashinfer MLA prefill failed: {type(e).__name__}: {e}")


def run(records: list[Record]) -> None:
    fi = flashinfer()
    bench_decode(records, fi)
    bench_prefill(records, fi)
    for page in (16, 64):  # cp.async gathers / TMA boxes in the Gluon sm_90 kernel
        bench_paged_prefill(records, fi, page)
    bench_mla_prefill(records, fi)
