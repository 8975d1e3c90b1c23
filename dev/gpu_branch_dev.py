"""Development bench for the Triton FP8 bmm and the fused MLA decode branch: correctness at
DeepSeek sizes against the reference, timings, short table last. Full numbers go to $OUT.

    python dev/gpu_branch_dev.py                 # on a GPU: tests, checks, timings
    python dev/gpu_branch_dev.py --compile-only  # any machine: offline sm_90 compiles
                                                 # (wgmma, shared memory, registers, spills)

bmm: DeepSeek's two per-head products, w_uk (n = kv_lora_rank 512, k = qk_nope 128) and w_uv
(n = v_head 128, k = 512), h_q 16 and 128, m = tokens. Against torch.bmm in bf16 on the same
shapes (weights bf16, activations contiguous: torch's best case). Bytes = fp8 weights + their
scales + bf16 activations in and out (bf16 bmm: bf16 weights). Every timing is
triton.testing.do_bench's median with the L2 flushed before each call (cold weights, as in a
decode step), inputs freshly drawn for each case. Variants override the tile heuristic
(`dataclasses.replace` of `fp8_bmm_config`'s choice, passed as `fp8_bmm_triton(config=...)`);
"pre" quantizes the activations in a separate pass.

branch: each piece timed alone (same inputs as the branch), the eager branch, and the branch
replayed from a CUDA graph (what a serving loop runs).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import subprocess
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src"))

import torch  # noqa: E402
from devtools import write_compiled  # noqa: E402

BF16, F32, E8M0 = torch.bfloat16, torch.float32, torch.float8_e8m0fnu
DEV = "cuda"  # "cpu" with --dry (Triton interpreter, tiny sizes, no timing)
DRY = False

BMM_VARIANTS = {
    "auto": {},
    "fused": {},  # prequant=False
    "bn64": dict(block_n=64),
    "bn128": dict(block_n=128),
    "w8": dict(num_warps=8),
    "s3": dict(num_stages=3),
    "noswap": dict(swap_ab=False, block_m=64, num_warps=4),
    "pre": {},  # prequant=True
}


# ------------------------------------------------------------------------------------------
# Offline compile (no GPU needed)
# ------------------------------------------------------------------------------------------
def _compile(module, call, outdir, tag):
    """sm_90 compile of the one launch `call` makes through `module`
    (`pagedattn.ops.offline`); writes ptx/ttgir/cubin/sass and returns a resource dict."""
    from pagedattn.ops import offline

    (launch,) = offline.capture(module, call)
    k = offline.compile_sm90(launch)
    res, _sass = write_compiled(k, outdir, tag)
    ptx = k.asm["ptx"]
    return dict(
        res,
        wgmma=sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m\d+n\d+k\d+\.\w+)", ptx))),
        mma_sync=len(re.findall(r"\bmma\.sync", ptx)),
    )  # fmt: skip


def compile_only(outdir):
    import pagedattn.ops.linear.triton_fp8_bmm as B
    import pagedattn.ops.mla_branch.triton_branch as T
    from pagedattn.operands import PagedOperand

    rows = []
    real_quant = B.quantize_activation_groups_triton
    B.quantize_activation_groups_triton = (
        lambda x, g: (  # no launch: only the GEMM compiles
            torch.empty(x.shape, dtype=torch.float8_e4m3fn),
            torch.empty(*x.shape[:2], -(-x.shape[2] // g), dtype=F32),
        )
    )
    for h_q in (16, 128):
        for which, (n, k) in (("w_uk", (512, 128)), ("w_uv", (128, 512))):
            for tokens in (1, 16, 64, 256):
                for var in ("auto", "fused", "pre"):
                    cfg = dataclasses.replace(
                        B.fp8_bmm_config(tokens, n, k, 128), **BMM_VARIANTS[var]
                    )
                    x = torch.empty(h_q, tokens, k, dtype=BF16)
                    w = torch.empty(h_q, n, k, dtype=torch.float8_e4m3fn)
                    ws = torch.empty(h_q, n // 128, k // 128, dtype=F32)
                    pre = {"pre": True, "fused": False}.get(var)
                    tag = f"bmm_{which}_h{h_q}_m{tokens}_{var}"
                    call = lambda: B.fp8_bmm_triton(x, w, ws, prequant=pre, config=cfg)
                    r = _compile(B, call, outdir, tag)
                    rows.append((tag, r))
                    print(tag, r, flush=True)
    B.quantize_activation_groups_triton = real_quant
    from pagedattn import KVCacheParams, KVQuantConfig
    from pagedattn.cache.buffers import allocate_buffers
    from pagedattn.cache.inputs import KVCacheInputsPerDevice

    for fmt, cfg, d_qk in (
        ("bf16", None, 576),
        ("rope_aware", KVQuantConfig.mla_rope_aware(), 576),
        ("g64", KVQuantConfig.blockwise(64), 576),
        ("v32", KVQuantConfig.flashmla_v32(), 576),
        ("model1", KVQuantConfig.flashmla_model1(), 512),
    ):
        params = KVCacheParams(BF16, 1, 1, d_qk, 64, is_mla=True, num_q_heads=128, quantization=cfg)
        bufs = allocate_buffers(params, 4)
        inputs = KVCacheInputsPerDevice(
            bufs.kv_blocks, torch.zeros(2, dtype=torch.int32), torch.zeros(2, 2, dtype=torch.int32),
            torch.zeros(1, 2, dtype=torch.int32), bufs.kv_scales,
        )  # fmt: skip
        kv = PagedOperand(inputs, params, 0, "k")
        q = torch.empty(2, 128, 192, dtype=BF16)
        qf = torch.empty(2, 128, d_qk, dtype=BF16)
        nkv = torch.empty(2, 1, d_qk, dtype=BF16)
        fr = torch.empty(4096, 64, dtype=F32)
        gam = torch.empty(d_qk - 64, dtype=BF16)
        offs = torch.tensor([0, 1, 2], dtype=torch.int32)
        tag = f"rope_store_{fmt}"
        r = _compile(
            T,
            lambda: T.rope_norm_store_triton(q, qf, nkv, fr, gam, 1e-6, kv, offs, qk_nope_dim=128),
            outdir, tag,
        )  # fmt: skip
        rows.append((tag, r))
        print(tag, r, flush=True)
    with open(os.path.join(outdir, "compile.json"), "w") as fh:
        json.dump(rows, fh, indent=1)


# ------------------------------------------------------------------------------------------
# GPU
# ------------------------------------------------------------------------------------------
def _bench(fn, rep=100):
    """Median GPU time (us) of `fn` replayed from a CUDA graph, L2 flushed before each replay
    (do_bench's cache clearing), so Python launch overhead is not counted."""
    import triton

    fn()
    if DRY:
        return 0.0
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    return triton.testing.do_bench(graph.replay, warmup=5, rep=rep, return_mode="median") * 1e3


def _close(out, ref, mag):
    """'' when every element of out is within max(8e-4, 2^-9 * sum|terms|) or 2/128 relative
    of ref (fp8 tensor-core accumulation, see tests/test_triton_fp8_bmm.py), else a message;
    `mag` is sum_k |x_k w_nk| for each output."""
    err = (out.float() - ref.float()).abs()
    bound = torch.maximum((2.0**-9 * mag).clamp_min(8e-4), ref.float().abs() * (2 / 128))
    bad = err > bound
    tight = int((err > (2.0**-14 * mag).clamp_min(8e-4)).sum())
    if bad.any() or torch.isnan(out).any():
        return (
            f"{int(bad.sum())}/{bad.numel()} out of bound, max err {float(err.max()):.3g}, "
            f"max err/bound {float((err / bound).max()):.3g}, {tight} over 2^-14 mag"
        )
    return ""


def bench_bmm(results, seed=0, sweep_tokens=(16, 64, 256), save=lambda: None):
    import pagedattn.ops.linear.triton_fp8_bmm as B
    from pagedattn.ops.linear import (
        dequantize_weight_blocks,
        fp8_bmm_reference,
        quantize_weight_blocks,
    )

    g = torch.Generator(device=DEV).manual_seed(seed)
    for h_q in (2,) if DRY else (16, 128):
        for which, (n, k) in (("w_uk", (512, 128)), ("w_uv", (128, 512))):
            for tokens in (1, 16, 70) if DRY else (1, 16, 64, 128, 256, 1024):
                sweep = tokens in sweep_tokens
                # Fresh data each case; x as the branch passes it (a transposed view).
                xt = torch.randn(tokens, h_q, k + 64, device=DEV, generator=g).to(BF16)
                x = xt[..., :k].transpose(0, 1)
                w = torch.randn(h_q, n, k, device=DEV, generator=g) / math.sqrt(k)
                wq, ws = quantize_weight_blocks(w, 128, 128, F32)
                w_bf = w.to(BF16)
                x_c = x.contiguous()
                # The reference on the CPU: PyTorch on CUDA divides by the scalar 448 as a
                # multiplication by its reciprocal, which rounds some quantization ties the
                # other way (the kernel is bit-exact with the CPU reference's quantization).
                xc, wqc, wsc = x.cpu(), wq.cpu(), ws.cpu()
                ref = fp8_bmm_reference(xc, wqc, wsc).to(DEV)
                wd = dequantize_weight_blocks(wqc, wsc)
                mag = (xc.float().abs() @ wd.abs().transpose(1, 2)).to(DEV)
                row = dict(which=which, h_q=h_q, tokens=tokens, n=n, k=k, bad={})
                for var, over in BMM_VARIANTS.items():
                    if (var == "noswap" and tokens > 64) or (var != "auto" and not sweep):
                        continue
                    cfg = dataclasses.replace(B.fp8_bmm_config(tokens, n, k, 128), **over)
                    pre = {"pre": True, "fused": False}.get(var)  # None: the heuristic's
                    msg = _close(B.fp8_bmm_triton(x, wq, ws, prequant=pre, config=cfg), ref, mag)
                    if msg:
                        row["bad"][var] = msg
                        print(f"  FAIL bmm {which} h{h_q} m{tokens} {var}: {msg}", flush=True)
                    row[var] = _bench(lambda: B.fp8_bmm_triton(x, wq, ws, prequant=pre, config=cfg))
                out = torch.empty(h_q, tokens, n, dtype=BF16, device=DEV)
                row["auto"] = _bench(lambda: B.fp8_bmm_triton(x, wq, ws, out=out), rep=200)
                row["torch_bf16"] = _bench(lambda: torch.bmm(x_c, w_bf.transpose(1, 2)), rep=200)
                w_bytes = h_q * n * k + ws.numel() * 4
                io = 2 * h_q * tokens * (k + n)
                row["fp8_bytes"], row["bf16_bytes"] = w_bytes + io, 2 * h_q * n * k + io
                row["flops"] = 2 * h_q * tokens * n * k
                results["bmm"].append(row)
                save()
                best = min((v, kk) for kk, v in row.items() if kk in BMM_VARIANTS)
                print(
                    f"bmm {which} h{h_q} m{tokens}: auto {row['auto']:.2f} us "
                    f"(best {best[1]} {best[0]:.2f}), torch bf16 {row['torch_bf16']:.2f} us; "
                    + " ".join(f"{kk}={row[kk]:.2f}" for kk in BMM_VARIANTS if kk in row),
                    flush=True,
                )


def make_branch_case(fmt, h_q, batch, s_k, q_len, ps=64, seed=0, sparse_topk=0):
    """A one-layer MLA cache (DeepSeek dims) with `batch` requests of s_k cached tokens,
    random contents in `fmt`, shuffled pages, plus the branch's other inputs."""
    from pagedattn import KVCacheParams, KVQuantConfig
    from pagedattn.cache.buffers import allocate_buffers
    from pagedattn.cache.inputs import KVCacheInputsPerDevice
    from pagedattn.fp8 import mla_formats as mf
    from pagedattn.ops.linear import make_freqs_cis, quantize_weight_blocks
    from pagedattn.testing import ragged_offsets

    cfg = {
        "bf16": None,
        "rope_aware": KVQuantConfig.mla_rope_aware(),
        "v32": KVQuantConfig.flashmla_v32(),
    }[fmt]
    g = torch.Generator(device=DEV).manual_seed(seed)
    d_qk, nope, rank, v_head = 576, 128, 512, 128
    params = KVCacheParams(BF16, 1, 1, d_qk, ps, is_mla=True, num_q_heads=h_q, quantization=cfg)
    seq = s_k + q_len
    per = -(-seq // ps)
    n_pages = batch * per + 1
    bufs = allocate_buffers(params, n_pages, device=DEV)
    n_tok = n_pages * ps
    x = torch.randn(n_tok, 1, d_qk, device=DEV, generator=g).to(BF16)
    flat = bufs.kv_blocks.view(n_tok, 1, -1)
    if cfg is None:
        flat.copy_(x)
    elif fmt == "rope_aware":
        raw, s = mf.pack_rope_aware(x)
        flat.copy_(raw)
        bufs.kv_scales.view(n_tok, 1, 1).copy_(s)
    else:
        flat.copy_(mf.pack_v32(x))
    perm = torch.randperm(n_pages - 1, device=DEV, generator=g).to(torch.int32)
    lut = torch.full((batch, per + 1), n_pages, dtype=torch.int32, device=DEV)
    lut[:, :per] = perm[: batch * per].view(batch, per)
    inputs = KVCacheInputsPerDevice(
        bufs.kv_blocks, torch.full((batch,), s_k, dtype=torch.int32, device=DEV), lut,
        torch.tensor([[q_len, s_k]], dtype=torch.int32), bufs.kv_scales,
    )  # fmt: skip
    tokens = batch * q_len
    q = torch.randn(tokens, h_q, nope + 64, device=DEV, generator=g).to(BF16)
    new_kv = torch.randn(tokens, 1, d_qk, device=DEV, generator=g).to(BF16)
    gamma = (1 + 0.2 * torch.randn(rank, device=DEV, generator=g)).to(BF16)
    w_uk, w_uk_s = quantize_weight_blocks(
        torch.randn(h_q, rank, nope, device=DEV, generator=g) / math.sqrt(nope)
    )
    w_uv, w_uv_s = quantize_weight_blocks(
        torch.randn(h_q, v_head, rank, device=DEV, generator=g) / math.sqrt(rank)
    )
    kw = dict(
        scale=1 / math.sqrt(d_qk), epsilon=1e-6, w_uk=w_uk, w_uk_scale=w_uk_s, w_uv=w_uv,
        w_uv_scale=w_uv_s, new_kv=new_kv,
    )  # fmt: skip
    if sparse_topk:
        t_b = torch.arange(tokens, device=DEV) // q_len
        j = torch.randint(0, seq, (tokens, sparse_topk), device=DEV, generator=g)
        enc = lut.long()[t_b[:, None], j // ps] * ps + j % ps
        kw.update(d_indices=enc.to(torch.int32))
    args = (q, ragged_offsets([q_len] * batch, DEV), make_freqs_cis(64, 65536, device=DEV),
            gamma, inputs, params, 0)  # fmt: skip
    return args, kw


def bench_branch(results, check_only=False, save=lambda: None):
    # Correctness at DeepSeek dims against the reference branch (byte copy of the cache).
    for fmt, h_q, sparse in (("bf16", 128, 0), ("rope_aware", 16, 0), ("v32", 128, 256)):
        try:
            _check_branch(results, fmt, h_q, sparse)
        except Exception as e:  # noqa: BLE001 - report and go on to the timings
            print(f"FAIL check branch {fmt} h{h_q}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            results["checks"].append(f"{fmt} h{h_q}: {type(e).__name__}: {str(e)[:300]}")
    if check_only:
        return
    _time_branch(results, save)


def _check_branch(results, fmt, h_q, sparse):
    """The Triton branch against the reference branch on a byte copy of the cache."""
    from pagedattn.ops.mla_branch import mla_decode_branch_fp8
    from pagedattn.testing import cos_diff

    args, kw = make_branch_case(fmt, h_q, 6, 700, 2, sparse_topk=sparse)
    inputs = args[4]
    twin = dataclasses.replace(
        inputs, kv_blocks=inputs.kv_blocks.clone(),
        kv_scales=None if inputs.kv_scales is None else inputs.kv_scales.clone(),
    )  # fmt: skip
    out = mla_decode_branch_fp8(*args, **kw, backend="triton")
    targs = (*args[:4], twin, *args[5:])
    ref = mla_decode_branch_fp8(*targs, **kw, backend="reference")
    nb = int((inputs.kv_blocks.view(torch.uint8) != twin.kv_blocks.view(torch.uint8)).sum())
    c = cos_diff(out, ref)
    err = float((out.float() - ref.float()).abs().max())
    line = (
        f"check branch {fmt} h{h_q} {'sparse' if sparse else 'dense'}: cos {c:.2e}, max err "
        f"{err:.3g} (|ref| max {float(ref.abs().max()):.3g}), cache bytes differing {nb}"
    )
    print(("" if c < 1e-3 else "FAIL ") + line, flush=True)
    results["checks"].append(line)


def _time_branch(results, save):
    cases = [
        ("dense bf16 h16 b128 4k", "bf16", 16, 128, 4096, 1, 0),
        ("dense rope-fp8 h16 b128 4k", "rope_aware", 16, 128, 4096, 1, 0),
        ("dense bf16 h128 b128 4k", "bf16", 128, 128, 4096, 1, 0),
        ("dense rope-fp8 h128 b128 4k", "rope_aware", 128, 128, 4096, 1, 0),
        ("sparse v32 h128 b64 sq2 topk2048", "v32", 128, 64, 8192, 2, 2048),
    ]
    if DRY:
        cases = [(n, f, min(h, 16), 2, 100, q, t // 64) for n, f, h, _b, _s, q, t in cases]
    for name, fmt, h_q, batch, s_k, q_len, topk in cases:
        try:
            _time_case(results, save, name, fmt, h_q, batch, s_k, q_len, topk)
        except Exception as e:  # noqa: BLE001 - report and go on
            print(f"FAIL branch {name}: {type(e).__name__}: {str(e)[:300]}", flush=True)
            if DRY:
                raise


def _time_case(results, save, name, fmt, h_q, batch, s_k, q_len, topk):
    import triton

    import pagedattn.ops.mla_branch.triton_branch as T
    from pagedattn import PagedOperand
    from pagedattn.ops.linear.triton_fp8_bmm import fp8_bmm_triton
    from pagedattn.ops.mla import mla_decode
    from pagedattn.ops.mla_branch import mla_decode_branch_fp8

    args, kw = make_branch_case(fmt, h_q, batch, s_k, q_len, sparse_topk=topk)
    q, offs, freqs, gamma, inputs, params, layer = args
    tokens = q.shape[0]
    kv = PagedOperand(inputs, params, layer, "k")
    q_full = torch.empty(tokens, h_q, 576, dtype=BF16, device=DEV)
    raw = torch.empty(tokens, h_q, 512, dtype=BF16, device=DEV)
    out = torch.empty(tokens, h_q, 128, dtype=BF16, device=DEV)
    dkw = dict(d_v=512, scale=kw["scale"], indices=kw.get("d_indices"))
    pieces = {
        "bmm_uk": lambda: fp8_bmm_triton(
            q[..., :128].transpose(0, 1), kw["w_uk"], kw["w_uk_scale"],
            out=q_full[..., :512].transpose(0, 1),
        ),
        "rope_store": lambda: T.rope_norm_store_triton(
            q, q_full, kw["new_kv"], freqs, gamma, 1e-6, kv, offs, qk_nope_dim=128
        ),
        "decode": lambda: mla_decode(q_full, kv, offs, **dkw, out=raw, backend="triton"),
        "bmm_uv": lambda: fp8_bmm_triton(
            raw.transpose(0, 1), kw["w_uv"], kw["w_uv_scale"], out=out.transpose(0, 1)
        ),
    }  # fmt: skip
    for f in pieces.values():
        f()
    row = dict(case=name, tokens=tokens, h_q=h_q)
    for p, f in pieces.items():
        row[p] = _bench(f, rep=200)
    branch = lambda: mla_decode_branch_fp8(*args, **kw, out=out, backend="triton")  # noqa: E731
    branch()
    row["eager"] = 0.0
    if not DRY:  # us, Python launch overhead included
        row["eager"] = 1e3 * triton.testing.do_bench(
            branch, warmup=5, rep=100, return_mode="median"
        )
    row["graph"] = _bench(branch, rep=200)
    results["branch"].append(row)
    save()
    print(
        f"branch {name}: " + ", ".join(f"{k} {row[k]:.1f}" for k in (*pieces, "eager", "graph"))
        + " us", flush=True,
    )  # fmt: skip


def run_tests(results, budget_s):
    """The two test files on the GPU (their CPU cases run on the GPU too), time-boxed."""
    t0 = time.time()
    try:
        p = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--maxfail=5", "-rf",
             "tests/test_triton_fp8_bmm.py", "tests/test_triton_branch.py"],
            capture_output=True, text=True, timeout=budget_s,
        )  # fmt: skip
        tail = p.stdout.strip().splitlines()[-25:]
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode() if isinstance(e.stdout, bytes) else (e.stdout or "")
        tail = out.strip().splitlines()[-5:] + [f"(tests stopped after {budget_s} s)"]
    results["tests"] = tail
    print("\n".join(tail), f"[{time.time() - t0:.0f} s]", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--out", default=os.environ.get("OUT", "/tmp/branch_bench"))
    ap.add_argument("--budget", type=int, default=225, help="seconds for the whole run")
    ap.add_argument("--skip", default="", help="comma list of: bmm, branch, tests")
    ap.add_argument("--dry", action="store_true", help="CPU dry run (interpreter, tiny sizes)")
    a = ap.parse_args()
    global DEV, DRY
    if a.dry:
        os.environ["TRITON_INTERPRET"] = "1"
        DEV, DRY = "cpu", True
    t0 = time.time()
    os.makedirs(a.out, exist_ok=True)
    if a.compile_only:
        compile_only(a.out)
        return
    import triton

    device = "cpu (dry run)" if DRY else torch.cuda.get_device_name()
    results = dict(device=device, torch=torch.__version__, triton=triton.__version__, bmm=[],
                   branch=[], checks=[])  # fmt: skip
    path = os.path.join(a.out, "gpu_branch_dev.json")

    def save():
        with open(path, "w") as fh:
            json.dump(results, fh, indent=1)

    if "bmm" not in a.skip:
        bench_bmm(results, save=save)
    print(f"[{time.time() - t0:.0f} s]", flush=True)
    if "branch" not in a.skip:
        bench_branch(results, save=save)
    print(f"[{time.time() - t0:.0f} s]", flush=True)
    left = a.budget - (time.time() - t0) - 5
    if "tests" not in a.skip and left > 20:
        run_tests(results, int(left))
    save()
    print(f"\n{results['device']}, torch {results['torch']}, triton {results['triton']}")
    print("bmm (us, graph replay, cold L2)  fp8 auto | best variant | torch bf16 | fp8 TB/s "
          "| TFLOP/s | speedup | failing variants")  # fmt: skip
    for r in results["bmm"]:
        ok = [(v, k) for k, v in r.items() if k in BMM_VARIANTS and k not in r["bad"]]
        best = min(ok, default=(float("nan"), "none"))
        t = max(r["auto"], 1e-9)
        tbs = r["fp8_bytes"] / (t * 1e-6) / 1e12
        tfl = r["flops"] / (t * 1e-6) / 1e12
        print(
            f"  {r['which']} h{r['h_q']:<3} m{r['tokens']:<5} {r['auto']:8.2f} | "
            f"{best[1]:>6} {best[0]:6.2f} | {r['torch_bf16']:8.2f} | {tbs:5.2f} | {tfl:6.1f} | "
            f"{r['torch_bf16'] / t:4.2f} | {','.join(r['bad']) or '-'}"
        )
    print("branch (us)  bmm_uk rope_store decode bmm_uv | sum | eager graph")
    for r in results["branch"]:
        s = sum(r[k] for k in ("bmm_uk", "rope_store", "decode", "bmm_uv"))
        print(
            f"  {r['case']:<34} {r['bmm_uk']:6.1f} {r['rope_store']:6.1f} {r['decode']:7.1f} "
            f"{r['bmm_uv']:6.1f} | {s:7.1f} | {r['eager']:7.1f} {r['graph']:7.1f}"
        )


if __name__ == "__main__":
    main()
