"""MLA decode cases and launches shared by the dev scripts (`gpu_mla_dev.py`, `host_cost.py`,
`mla_power_probe.py`, `profile_mla.py`).

- `make_case`: a one-layer MLA cache in any of the formats of `FMTS`, its queries and the work
  counted (DESIGN.md section 6: FLOPs = 2 * tokens * h_q * keys * (d_qk + d_v); bytes = each K
  row read once, scales included, + q + out).
- `launcher`: a no-argument call of `mla_decode_triton` on a case (the launch variant: `kw`'s
  `config`, else the shipped `MLATuning` with PAGEDATTN_MLA_TUNING's overrides, at each call).
- `capture`, `compile_offline`: the decode kernel's launch and its offline sm_90 compile (no
  GPU needed), with the resources and instruction counts of its SASS.
"""

from __future__ import annotations

import re

import torch
from devtools import write_compiled

from pagedattn import KVCacheParams, KVQuantConfig, PagedOperand
from pagedattn.cache.inputs import KVCacheInputsPerDevice
from pagedattn.fp8 import quantize_blockwise

FMTS = {
    "bf16": lambda: None,
    "rope_aware": KVQuantConfig.mla_rope_aware,
    "v32": KVQuantConfig.flashmla_v32,
    "model1": KVQuantConfig.flashmla_model1,
    "g64_e8m0": lambda: KVQuantConfig.blockwise(64, torch.float8_e8m0fnu),
    "per_token": KVQuantConfig.per_token,
    "g64_f32": lambda: KVQuantConfig.blockwise(64),
    "g128_e8m0": lambda: KVQuantConfig.blockwise(128, torch.float8_e8m0fnu),
    "g192_f32": lambda: KVQuantConfig.blockwise(192),
    "per_tensor": KVQuantConfig.per_tensor,
}


def make_case(mode, fmt, d_qk, b, s_k, h_q, s_q, ps, topk=2048, device="cuda", seed=0, shared="",
              poison=False):  # fmt: skip
    """A one-layer MLA cache with b requests of s_k cached keys (random values, quantized into
    `fmt`), s_q new query tokens each; shuffled pages. Sparse: topk random valid indices per
    token (-1 padded where fewer keys). shared "L2": every request reads request 0's pages (an
    L2-resident working set, every CTA on the same lines); "L2own": each request cycles over its
    own first 4 pages (L2-resident, the CTAs on distinct lines); "none" (sparse): every index
    invalid, so no key is loaded and the time is the kernel's compute schedule alone (the FLOPs
    counted are those of topk keys).
    poison (BF16): NaN in every cache slot no request references. Returns (q, kv,
    q_row_offsets, kwargs, work)."""
    g = torch.Generator(device="cpu").manual_seed(seed)
    params = KVCacheParams(
        torch.bfloat16, 1, 1, d_qk, ps, is_mla=True, num_q_heads=h_q,
        quantization=FMTS[fmt](), devices=(device,),
    )  # fmt: skip
    seq = s_k + s_q
    pages_per = -(-seq // ps)
    n_pages = b * pages_per + 1
    blocks = torch.empty(params.blocks_shape(n_pages), dtype=params.storage_dtype, device=device)
    shape = params.scales_shape(n_pages)
    scales = None
    n_tok = n_pages * ps
    x = torch.randn(n_tok, d_qk, device=device, dtype=torch.bfloat16)
    f = params.quant_format
    flat = blocks.view(n_tok, -1) if f != "flashmla_model1" else None
    if f is None:
        flat.copy_(x)
    elif f == "blockwise":
        q8, s = quantize_blockwise(x.float(), params.scale_granularity, params.scale_dtype)
        flat.copy_(q8)
        scales = s.view(*shape)
    elif f == "per_tensor":
        scales = torch.full(shape, 0.0125, device=device)
        flat.copy_((x.float() / 0.0125).clamp(-448, 448).to(torch.float8_e4m3fn))
    else:
        from pagedattn.fp8 import mla_formats as mf

        if f == "mla_rope_aware":
            raw, s = mf.pack_rope_aware(x)
            flat.copy_(raw)
            scales = s.reshape(shape)
        elif f == "flashmla_v32":
            flat.copy_(mf.pack_v32(x))
        else:
            data, sb = mf.pack_model1_tokens(x.view(n_tok, 1, d_qk))
            page = blocks.view(n_pages, ps * 584)
            page[:, : ps * 576].copy_(data.view(n_pages, ps * 576))
            page[:, ps * 576 :].copy_(sb.view(n_pages, ps * 8))
    perm = torch.randperm(n_pages - 1, generator=g).to(device=device, dtype=torch.int32)
    lut = perm[: b * pages_per].view(b, pages_per).contiguous()
    if shared == "L2":
        lut[:] = lut[0].clone()
    if shared == "L2own":  # each request cycles over its own first 4 pages (~21 MB at b 128)
        lut[:] = lut[:, torch.arange(pages_per, device=device) % min(4, pages_per)].clone()
    if poison and f is None:
        pos = torch.arange(seq, pages_per * ps, device=device)
        flat[(lut.long()[:, pos // ps] * ps + pos % ps).flatten()] = float("nan")
        flat[(n_pages - 1) * ps :] = float("nan")
    cl = torch.full((b,), s_k, dtype=torch.int32, device=device)
    inputs = KVCacheInputsPerDevice(
        blocks, cl, lut, torch.tensor([[s_q, s_k]], dtype=torch.int32), scales
    )
    kv = PagedOperand(inputs, params, 0, "k")
    tokens = b * s_q
    q = torch.randn(tokens, h_q, d_qk, device=device, dtype=torch.bfloat16)
    offs = torch.arange(0, tokens + 1, s_q, device=device, dtype=torch.int32)
    kw = {}
    keys = s_k + (s_q + 1) / 2
    if mode == "sparse":
        pos = torch.rand(tokens, s_k + s_q, generator=g).argsort(dim=1)[:, :topk].to(device)
        bi = torch.arange(tokens, device=device) // s_q
        enc = lut.long()[bi[:, None], pos // ps] * ps + pos % ps
        idx = enc.to(torch.int32)
        if idx.shape[1] < topk:
            pad = torch.full((tokens, topk - idx.shape[1]), -1, dtype=torch.int32, device=device)
            idx = torch.cat([idx, pad], 1)
        if shared == "none":
            idx.fill_(-1)
        kw = dict(indices=idx.contiguous())
        keys = min(topk, s_k + s_q)
    row_bytes = blocks[0, 0, 0, 0, 0].numel() * blocks.element_size()
    if scales is not None and f != "per_tensor":
        row_bytes += scales[0, 0, 0, 0, 0].numel() * scales.element_size()
    d_v = 512
    flops = 2 * tokens * h_q * keys * (d_qk + d_v)
    kv_bytes = (b * (s_k + s_q) if mode == "dense" else tokens * keys) * row_bytes
    io = q.numel() * 2 + tokens * h_q * d_v * 2
    return q, kv, offs, kw, dict(flops=flops, bytes=kv_bytes + io, pool=blocks.numel())


def capture(call, sm90=False):
    """The decode kernel's launch that `call` makes (`pagedattn.ops.offline.capture`; the
    split-K combine skipped), with the Gluon sm_90 paths taken where sm90 (as on an H100:
    the tuning picks among them) and the portable tl kernel elsewhere."""
    import pagedattn.ops.mla.triton_mla as M
    from pagedattn.ops import offline

    (launch,) = offline.capture(
        M,
        call,
        _use_sm90_path=lambda *a: sm90,
        mla_combine_triton=lambda *a, **k: None,
        mla_worklist_combine_triton=lambda *a, **k: None,
        mla_runs_combine_triton=lambda *a, **k: None,
    )
    return launch


def compile_offline(launch, outdir, tag):
    """sm_90 compile of a captured launch (`pagedattn.ops.offline.compile_sm90`); writes
    ptx/ttgir/cubin/sass and returns a resource dict."""
    from pagedattn.ops import offline

    k = offline.compile_sm90(launch)
    res, sass = write_compiled(k, outdir, tag)
    ptx = k.asm["ptx"]
    return dict(
        res, HGMMA=sass.count("HGMMA"), HMMA=sass.count("HMMA"), LDGSTS=sass.count("LDGSTS"),
        LDG128=sass.count("LDG.E.128"), STL=len(re.findall(r"\bSTL\b", sass)),
        wgmma=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+)", ptx))),
    )  # fmt: skip


def launcher(q, kv, offs, kw, P):
    """A no-argument call of `mla_decode_triton` on a case (q, kv, offs, kw of `make_case`) with
    P partitions (None: the heuristic's), writing one preallocated output; returns (out, lse)."""
    from pagedattn.ops.mla.triton_mla import mla_decode_triton

    out = torch.empty(q.shape[0], q.shape[1], 512, dtype=q.dtype, device=q.device)
    return lambda: mla_decode_triton(q, kv, offs, num_partitions=P, out=out, **kw)
