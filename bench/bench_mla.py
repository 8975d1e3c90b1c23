"""MLA decode: pagedattn vs plain PyTorch vs FlashInfer (fa3 MLA), same data.

FLOPs per query row: 2 * keys * (d_qk + d_v). Bytes: the keys' cache rows once, plus q/out.
"""

from __future__ import annotations

import math

import torch
from common import Record, flashinfer, time_ms

from pagedattn import KVCacheInputsPerDevice, KVCacheParams, KVQuantConfig, PagedOperand, mla_decode
from pagedattn.cache import allocate_buffers

DENSE = [  # (batch, s_k, page, h_q)
    (128, 4096, 64, 16),
    (128, 8192, 64, 16),
    (128, 4096, 64, 128),
    (128, 8192, 64, 128),
]


def dense_config(fmt: str | None, b: int, s_k: int, page: int, h_q: int) -> str:
    """A dense MLA record's config name (fmt None: bf16)."""
    return f"{fmt or 'bf16'} b{b} sk{s_k} p{page} hq{h_q}"


def sparse_config(fmt: str | None, b: int, s_q: int, h_q: int, topk: int) -> str:
    """A sparse MLA record's config name (fmt None: bf16)."""
    return f"sparse {fmt or 'bf16'} b{b} sq{s_q} hq{h_q} topk{topk}"


def mla_cache(b, s_k, page, h_q, quant=None):
    p = KVCacheParams(
        torch.bfloat16,
        1,
        1,
        576,
        page,
        is_mla=True,
        num_q_heads=h_q,
        devices=["cuda"],
        quantization=quant,
    )
    pages_per = math.ceil(s_k / page)
    total = b * pages_per + 1
    buf = allocate_buffers(p, total)
    inp = KVCacheInputsPerDevice(
        kv_blocks=buf.kv_blocks,
        cache_lengths=torch.full((b,), s_k - 1, dtype=torch.int32, device="cuda"),
        lookup_table=torch.randperm(total - 1, device="cuda")
        .int()[: b * pages_per]
        .view(b, pages_per)
        .contiguous(),
        max_lengths=torch.tensor([[1, s_k - 1]], dtype=torch.int32),
        kv_scales=buf.kv_scales,
    )
    x = torch.randn(total * page, 1, 576, device="cuda", dtype=torch.bfloat16)
    op = PagedOperand(inp, p, 0, "k")
    rows = torch.arange(total * page, device="cuda")
    rows = (rows // page) * op.page_stride_rows + rows % page
    from pagedattn.ops.store_kv.reference import write_rows

    write_rows(op, rows, x)
    return p, inp, op


def torch_mla(q, inp, s_k, scale):
    b, h, _ = q.shape
    kv = inp.kv_blocks[:, 0, 0, :, 0]  # [P, page, 576]
    g = kv[inp.lookup_table.long()].flatten(1, 2)[:, :s_k]  # [b, s_k, 576]
    s = torch.einsum("bhd,bkd->bhk", q, g) * scale
    return torch.einsum("bhk,bkd->bhd", s.softmax(-1), g[..., :512])


def flashinfer_mla(fi, q, inp, b, s_k, page, h_q, scale):
    try:
        ws = torch.empty(256 * 2**20, dtype=torch.uint8, device="cuda")
        w = fi.mla.BatchMLAPagedAttentionWrapper(ws, backend="fa3")
        pages_per = inp.lookup_table.shape[1]
        qo = torch.arange(b + 1, dtype=torch.int32, device="cuda")
        kv_indptr = qo * pages_per
        kv_len = torch.full((b,), s_k, dtype=torch.int32, device="cuda")
        w.plan(
            qo,
            kv_indptr,
            inp.lookup_table.flatten(),
            kv_len,
            h_q,
            512,
            64,
            page,
            False,
            scale,
            torch.bfloat16,
            torch.bfloat16,
        )
        kv = inp.kv_blocks[:, 0, 0, :, 0]
        ckv, kpe = kv[..., :512].contiguous(), kv[..., 512:].contiguous()
        qn, qp = q[..., :512].contiguous(), q[..., 512:].contiguous()
        w.run(qn, qp, ckv, kpe)
        return time_ms(lambda: w.run(qn, qp, ckv, kpe))
    except Exception as e:
        print(f"[bench] flashinfer mla failed: {type(e).__name__}: {e}")
        return None


def run(records: list[Record]) -> None:
    fi = flashinfer()
    scale = 576**-0.5
    for fmt in (None, "mla_rope_aware"):
        for b, s_k, page, h_q in DENSE:
            if fmt and h_q != 16:
                continue
            quant = KVQuantConfig.mla_rope_aware() if fmt else None
            p, inp, op = mla_cache(b, s_k, page, h_q, quant)
            q = torch.randn(b, h_q, 576, device="cuda", dtype=torch.bfloat16)
            offs = torch.arange(b + 1, dtype=torch.int32, device="cuda")
            row = 640 + 4 if fmt else 1152
            nbytes = b * s_k * row + q.numel() * 2 + b * h_q * 512 * 2
            flops = 2 * b * h_q * s_k * (576 + 512)
            cfg = dense_config(fmt, b, s_k, page, h_q)
            out = torch.empty(b, h_q, 512, device="cuda", dtype=torch.bfloat16)
            ms = time_ms(lambda: mla_decode(q, op, offs, scale=scale, out=out))
            records.append(Record("mla", cfg, "pagedattn", ms, nbytes, flops))
            if fmt is None:
                if s_k == 4096 or h_q == 16:
                    ms = time_ms(lambda: torch_mla(q, inp, s_k, scale))
                    records.append(Record("mla", cfg, "torch", ms, nbytes, flops))
                if fi is not None:
                    ms = flashinfer_mla(fi, q, inp, b, s_k, page, h_q, scale)
                    if ms:
                        records.append(Record("mla", cfg, "flashinfer-fa3", ms, nbytes, flops))
            torch.cuda.empty_cache()
    bench_sparse(records)


def bench_sparse(records: list[Record]) -> None:
    """FlashMLA's sparse FP8 configuration: b128, h_q 128, s_q 2, topk 2048 (V32 rows)."""
    b, s_q, h_q, topk, page, s_k = 128, 2, 128, 2048, 64, 8192
    for fmt in ("flashmla_v32", None):
        quant = KVQuantConfig.flashmla_v32() if fmt else None
        p, inp, op = mla_cache(b, s_k, page, h_q, quant)
        tokens = b * s_q
        q = torch.randn(tokens, h_q, 576, device="cuda", dtype=torch.bfloat16)
        offs = torch.arange(b + 1, dtype=torch.int32, device="cuda") * s_q
        # top-k positions of each request, encoded block*page_size + offset
        pos = torch.stack([torch.randperm(s_k, device="cuda")[:topk] for _ in range(tokens)])
        bidx = torch.arange(tokens, device="cuda") // s_q
        blocks = inp.lookup_table.long()[bidx[:, None], pos // page]
        idx = (blocks * page + pos % page).int()
        row = 656 if fmt else 1152
        nbytes = tokens * topk * row
        flops = 2 * tokens * h_q * topk * (576 + 512)
        cfg = sparse_config(fmt, b, s_q, h_q, topk)
        out = torch.empty(tokens, h_q, 512, device="cuda", dtype=torch.bfloat16)
        ms = time_ms(lambda: mla_decode(q, op, offs, indices=idx, out=out, scale=576**-0.5))
        records.append(Record("mla-sparse", cfg, "pagedattn", ms, nbytes, flops))
        torch.cuda.empty_cache()
