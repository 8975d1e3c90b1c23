"""`pagedattn.ops.moe` (the routed experts' plan, grouped products and token sums): both
backends (Triton under TRITON_INTERPRET=1 on the CPU, natively with `-m gpu`) against a
float64 oracle written here from the definition (DESIGN.md section 5's rule), on adversarial
routings (every row on one expert, empty experts, a single token, out-of-range ids, more rows
than one chunk of the plan's kernels), FP8 weight blocks of several shapes, strided weights,
NaN rows; the plans equal element for element; bad arguments raise typed errors naming them;
the models' fused experts against their loops; on CUDA a captured plan + products replaying
new routings."""

from __future__ import annotations

import pytest
import torch

from pagedattn.errors import InvalidArgumentError
from pagedattn.ops.moe import MoEPlan, expert_matmul, moe_block_m, moe_plan, moe_sum
from pagedattn.ops.moe.reference import moe_plan_reference
from pagedattn.ops.moe.triton_moe import moe_plan_triton
from pagedattn.testing import assert_close

BACKENDS = ["reference", "triton"]
TOL = {  # a few roundings of O(1) values (the bf16 interpreter truncates: doubled below)
    torch.float32: (1e-4, 1e-5, 1e-9),
    torch.bfloat16: (2e-2, 2 / 128, 1e-4),
    torch.float16: (4e-3, 4e-3, 1e-5),
}


def _dev() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _close(out, ref, dtype, name):
    a, r, c = TOL[dtype]
    if dtype != torch.float32 and not out.is_cuda:
        a, r = 2 * a, 2 * r
    assert_close(out, ref, abs_tol=a, rel_tol=r, cos_tol=c, name=name)


def _routings(T: int, k: int, E: int, g: torch.Generator):
    rows = [torch.randperm(E, generator=g)[:k] for _ in range(T)]
    yield "random", torch.stack(rows) if T else torch.zeros(0, k, dtype=torch.long)
    yield "one expert", torch.full((T, k), E - 1)  # every other expert empty
    yield "repeats", torch.randint(0, min(2, E), (T, k), generator=g)  # a token twice on one expert


def _check_plan_invariants(plan: MoEPlan, ids: torch.Tensor) -> None:
    """Every slot row once, in its expert's blocks, ascending within an expert; padding and the
    unused tail marked; capacity as documented."""
    n, bm, E = plan.num_rows, plan.block_m, plan.num_experts
    rows = plan.sorted_rows.cpu().long().view(-1, bm)
    be = plan.block_experts.cpu().long()
    flat = ids.flatten().cpu().long()
    seen = []
    for b in range(be.shape[0]):
        real = rows[b][rows[b] < n]
        if be[b] < 0:
            assert real.numel() == 0
            continue
        want = torch.where((flat < 0) | (flat >= E), E, flat)[real]
        assert torch.equal(want, torch.full_like(want, int(be[b])))
        seen.append(real)
    order = torch.cat(seen) if seen else torch.zeros(0, dtype=torch.long)
    assert torch.equal(order.sort().values, torch.arange(n))
    used = be[be >= 0]
    assert torch.equal(used, used.sort().values)  # experts in increasing id
    assert (be[used.numel() :] == -1).all()  # the unused blocks are the tail


@pytest.mark.parametrize("T,k,E,bm", [(0, 2, 4, 16), (1, 1, 1, 16), (7, 3, 5, 16),
                                      (40, 6, 16, 32), (700, 2, 3, 64),
                                      (300, 2, 3, 128)])  # fmt: skip
def test_plan_backends_equal_and_valid(T, k, E, bm):
    g = torch.Generator().manual_seed(T * 7 + k)
    for name, ids in _routings(T, k, E, g):
        for dt in (torch.int64, torch.int32):
            a = moe_plan(ids.to(dt), E, block_m=bm, backend="reference")
            b = moe_plan(ids.to(dt), E, block_m=bm, backend="triton")
            assert torch.equal(a.sorted_rows, b.sorted_rows), name
            assert torch.equal(a.block_experts, b.block_experts), name
            assert a.capacity == b.capacity and b.num_rows == T * k and b.top_k == k
            _check_plan_invariants(b, ids)


def test_out_of_range_ids_give_nan_rows():
    """On the device the ids are not read on the host: a row routed outside [0, E) goes to the
    last bucket and comes out NaN, the other rows untouched (both backends; the public op
    refuses such ids on CPU tensors)."""
    g = torch.Generator().manual_seed(3)
    E, k = 4, 2
    ids = torch.randint(0, E, (6, k), generator=g)
    ids[1, 0], ids[4, 1] = -1, E  # out of range both ways
    with pytest.raises(InvalidArgumentError, match="topk_ids"):
        moe_plan(ids, E)
    x = torch.randn(6, 32, generator=g)
    w = torch.randn(E, 24, 32, generator=g)
    a, b = moe_plan_reference(ids, E, 16), moe_plan_triton(ids, E, 16)
    assert torch.equal(a.sorted_rows, b.sorted_rows)
    assert torch.equal(a.block_experts, b.block_experts)
    _check_plan_invariants(b, ids)
    for backend, plan in (("reference", a), ("triton", b)):
        y = expert_matmul(x, w, plan, backend=backend)
        bad = torch.zeros(12, dtype=torch.bool)
        bad[[2, 9]] = True
        assert y[bad].isnan().all() and not y[~bad].isnan().any(), backend
        _close(y[~bad], _oracle(x, w, ids.clamp(0, E - 1), k)[~bad], torch.float32, backend)


def _oracle(x, w, ids, k, *, scale=None, blk=None, bias=None, rw=None, act=None, slots=False):
    """float64 y [T * k, N] from the definition, one slot row at a time."""
    out = []
    for r in range(ids.numel()):
        t, s = divmod(r, k)
        e = int(ids[t, s])
        a = x[r if slots else t].double()
        we = w[e].double()
        if scale is not None:
            bn, bk = blk
            s_ = scale[e].double().repeat_interleave(bn, 0).repeat_interleave(bk, 1)
            we = we * s_[: we.shape[0], : we.shape[1]]
        h = we @ a
        if bias is not None:
            h = h + bias[e].double()
        if act == "silu_mul":
            gte, up = h.chunk(2)
            h = gte * torch.sigmoid(gte) * up
        if rw is not None:
            h = h * float(rw[t, s])
        out.append(h)
    n = w.shape[1] // 2 if act == "silu_mul" else w.shape[1]
    return torch.stack(out) if out else torch.zeros(0, n, dtype=torch.float64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("T,k,E,N,K", [(1, 1, 2, 16, 16), (9, 2, 4, 40, 72), (5, 3, 6, 96, 130)])
def test_expert_matmul_against_oracle(backend, dtype, T, k, E, N, K):
    g = torch.Generator().manual_seed(T * 31 + N)
    dev = _dev()
    ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
    bm = moe_block_m(T * k, E)
    plan = moe_plan(ids.to(dev), E, block_m=bm, backend=backend)
    w = (torch.randn(E, N, K, generator=g) / K**0.5).to(dtype)
    bias = torch.randn(E, N, generator=g).to(dtype)
    rw = torch.rand(T, k, generator=g)
    xs = torch.randn(T * k, K, generator=g).to(dtype)
    xt = torch.randn(T, K, generator=g).to(dtype)
    if T > 2:
        xt[1, 5] = float("nan")  # token 1's rows NaN, no other row
    wt = w.transpose(1, 2).contiguous().transpose(1, 2)  # an [E, K, N] layout's view
    d = lambda *ts: [t.to(dev) for t in ts]  # noqa: E731
    X, XS, W, WT, B, RW = d(xt, xs, w, wt, bias, rw)
    cases = [
        ("token rows, silu_mul, bias, weights", X, W,
         dict(activation="silu_mul", bias=B, row_weights=RW),
         dict(act="silu_mul", bias=bias, rw=rw), xt),
        ("slot rows, strided w", XS, WT, {}, dict(slots=True), xs),
        ("token rows, f32 out", X, W, dict(out_dtype=torch.float32), {}, xt),
    ]  # fmt: skip
    for name, x_, w_, kw, okw, xo in cases:
        y = expert_matmul(x_, w_, plan, backend=backend, **kw)
        n_out = N // 2 if "activation" in kw else N
        assert y.shape == (T * k, n_out) and y.dtype == kw.get("out_dtype", dtype)
        _close(y, _oracle(xo, w, ids, k, **okw), dtype, name)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("bm", [32, 64, 128])
def test_expert_matmul_wide_blocks(backend, bm):
    """Blocks of 32 to 128 rows (prefill chunks: the `wide` / `wide128` launch shapes), with
    the SwiGLU."""
    g = torch.Generator().manual_seed(bm)
    dev = _dev()
    T, k, E, N, K = 90, 2, 3, 48, 80
    ids = torch.randint(0, E, (T, k), generator=g)
    x = torch.randn(T, K, generator=g)
    w = torch.randn(E, N, K, generator=g) / K**0.5
    plan = moe_plan(ids.to(dev), E, block_m=bm, backend=backend)
    y = expert_matmul(x.to(dev), w.to(dev), plan, activation="silu_mul", backend=backend)
    _close(y, _oracle(x, w, ids, k, act="silu_mul"), torch.float32, f"block {bm}")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("blk", [(128, 128), (32, 16), (24, 48)])
def test_expert_matmul_fp8_blocks(backend, blk):
    """FP8 e4m3 weights with per-block float32 scales (partial last blocks included): the
    product of x with the dequantized weight, to float32 accumulation."""
    g = torch.Generator().manual_seed(blk[0] + blk[1])
    dev = _dev()
    T, k, E, N, K = 6, 2, 3, 80, 144
    ids = torch.randint(0, E, (T, k), generator=g)
    w = (torch.randn(E, N, K, generator=g) * 8).to(torch.float8_e4m3fn)
    scale = torch.rand(E, -(-N // blk[0]), -(-K // blk[1]), generator=g) / 64 + 1e-3
    for dtype in (torch.bfloat16, torch.float32):
        x = torch.randn(T, K, generator=g).to(dtype)
        plan = moe_plan(ids.to(dev), E, backend=backend)
        y = expert_matmul(
            x.to(dev), w.to(dev), plan, w_scale=scale.to(dev), w_block=blk,
            activation="silu_mul", out_dtype=torch.float32, backend=backend,
        )  # fmt: skip
        ref = _oracle(x, w, ids, k, scale=scale, blk=blk, act="silu_mul")
        _close(y, ref, torch.float32 if dtype == torch.float32 else torch.float16, str(dtype))


@pytest.mark.parametrize("backend", BACKENDS)
def test_moe_sum(backend):
    g = torch.Generator().manual_seed(0)
    for T, k, N in ((0, 2, 8), (1, 1, 5), (7, 6, 300), (3, 4, 2100)):
        y = torch.randn(T * k, N, generator=g)
        if T > 2:
            y[k + 1, 3] = float("inf")
            y[2 * k, 0] = float("nan")
        ref = y.double().view(T, k, N).sum(1)
        for dt in (torch.float32, torch.bfloat16):
            out = moe_sum(y.to(_dev()), k, out_dtype=dt, backend=backend)
            _close(out, ref, dt, f"moe_sum {T} {k} {N}")


def test_bad_arguments_name_themselves():
    ids = torch.tensor([[0, 1], [1, 2]])
    plan = moe_plan(ids, 3)
    x, w = torch.randn(2, 8), torch.randn(3, 4, 8)
    bad = [
        ("topk_ids", lambda: moe_plan(ids.float(), 3)),
        ("topk_ids", lambda: moe_plan(ids[0], 3)),
        ("num_experts", lambda: moe_plan(ids, 0)),
        ("block_m", lambda: moe_plan(ids, 3, block_m=24)),
        ("block_m", lambda: moe_plan(ids, 3, block_m=8)),
        ("plan", lambda: expert_matmul(x, w, "plan")),
        ("x", lambda: expert_matmul(torch.randn(3, 8), w, plan)),
        ("x", lambda: expert_matmul(torch.randn(2, 9), w, plan)),
        ("w", lambda: expert_matmul(x, torch.randn(3, 5, 8), plan, activation="silu_mul")),
        ("w", lambda: expert_matmul(x, torch.randn(2, 4, 8), plan)),
        ("w", lambda: expert_matmul(x, w.double(), plan)),
        ("w", lambda: expert_matmul(x, w, plan, w_scale=torch.ones(3, 1, 1))),
        ("activation", lambda: expert_matmul(x, w, plan, activation="gelu")),
        ("bias", lambda: expert_matmul(x, w, plan, bias=torch.randn(3, 5))),
        ("row_weights", lambda: expert_matmul(x, w, plan, row_weights=torch.ones(2, 2).half())),
        ("out_dtype", lambda: expert_matmul(x, w, plan, out_dtype=torch.float16)),
        ("w_block", lambda: expert_matmul(x, w.to(torch.float8_e4m3fn), plan,
                                          w_scale=torch.ones(3, 1, 1), w_block=(4, 8))),
        ("w_scale", lambda: expert_matmul(x, w.to(torch.float8_e4m3fn), plan,
                                          w_scale=torch.ones(3, 2, 1))),
        ("y", lambda: moe_sum(torch.randn(3, 4), 2, out_dtype=torch.float32)),
        ("top_k", lambda: moe_sum(torch.randn(4, 4), 0, out_dtype=torch.float32)),
        ("out_dtype", lambda: moe_sum(torch.randn(4, 4), 2, out_dtype=torch.int32)),
        ("backend", lambda: moe_plan(ids, 3, backend="cuda")),
    ]  # fmt: skip
    for name, call in bad:
        with pytest.raises(InvalidArgumentError, match=name):
            call()


# The models' experts -------------------------------------------------------------------------
def _deepseek_experts(dtype, fp8=None, seed=0):
    transformers = pytest.importorskip("transformers")  # noqa: F841
    from tiny_llama import tiny_deepseek_config

    from pagedattn.models import ModelConfig
    from pagedattn.models.deepseek import DeepseekExperts

    hf = tiny_deepseek_config()
    if fp8 is not None:
        hf.quantization_config = {"quant_method": "fp8", "weight_block_size": list(fp8),
                                  "activation_scheme": "dynamic"}  # fmt: skip
    ex = DeepseekExperts(ModelConfig.from_hf(hf), dtype)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in ex.named_parameters():
            v = torch.randn(p.shape, generator=g) * 0.2
            p.copy_(v.abs() / 64 + 1e-3 if "scale" in name else v)
    return ex


@pytest.mark.parametrize("backend", BACKENDS)
def test_deepseek_fused_experts_equal_the_loop(backend, monkeypatch):
    """DeepseekExperts.forward_fused (the path CUDA models take) against forward_loop, plain
    float32 weights, each backend (the interpreter's on the CPU); and with FP8 blocks against
    the float64 oracle on the dequantized weights (the loop quantizes the activations, the
    fused path does not)."""
    from pagedattn.models import layers

    monkeypatch.setenv("PAGEDATTN_BACKEND", backend)
    ex = _deepseek_experts(torch.float32)
    g = torch.Generator().manual_seed(1)
    T = 9
    x = torch.randn(T, 64, generator=g)
    w = torch.rand(T, 2, generator=g)
    for name, ids in _routings(T, 2, 4, g):
        ids = ids.clamp(max=3)
        _close(ex.forward_fused(x, w, ids), ex.forward_loop(x, w, ids), torch.float32, name)
    assert not layers.fused_experts_ok(torch.device("cpu"), torch.float32)
    fx = _deepseek_experts(torch.float32, fp8=(16, 32), seed=2)
    ids = torch.randint(0, 4, (T, 2), generator=g)
    y = fx.forward_fused(x, w, ids)
    gu = _oracle(x, fx.gate_up_proj, ids, 2, scale=fx.gate_up_proj_scale_inv, blk=(16, 32))
    gate, up = gu.chunk(2, dim=-1)
    h = (gate * torch.sigmoid(gate) * up).float()
    dn = _oracle(h, fx.down_proj, ids, 2, scale=fx.down_proj_scale_inv, blk=(16, 32), rw=w,
                 slots=True)  # fmt: skip
    _close(y, dn.view(T, 2, -1).sum(1), torch.float32, "fp8 experts")


@pytest.mark.parametrize("backend", BACKENDS)
def test_gpt_oss_fused_experts_equal_the_loop(backend, monkeypatch):
    """GptOssExperts.forward_fused (gate_up / down in the checkpoint's [E, in, out] layout,
    biases, the clamped interleaved SwiGLU between the products) against forward_loop."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("PAGEDATTN_BACKEND", backend)
    from test_moe_experts import _moe

    moe = _moe(torch.float32, "cpu", seed=5)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(11, 64, generator=g)
    scores, experts = moe.router(x)
    _close(moe.experts.forward_fused(x, scores, experts),
           moe.experts.forward_loop(x, scores, experts), torch.float32, "gpt-oss")  # fmt: skip


# CUDA -------------------------------------------------------------------------------------------
@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graph_replays_new_routings():
    """A DeepSeek-V2-Lite-sized layer (64 experts top-6, hidden 2048, inter 1408, bf16) at
    decode: plan + products + sum captured once, replayed with new ids and weights written into
    the static inputs, equals the eager call bit for bit and the float32 reference within bf16
    roundings; no host sync in the call."""
    torch.manual_seed(0)
    T, k, E, H, I = 64, 6, 64, 2048, 1408
    dev = "cuda"
    wgu = (torch.randn(E, 2 * I, H, device=dev) / H**0.5).bfloat16()
    wd = (torch.randn(E, H, I, device=dev) / I**0.5).bfloat16()
    x = torch.randn(T, H, device=dev).bfloat16()
    ids = torch.stack([torch.randperm(E, device=dev)[:k] for _ in range(T)])
    rw = torch.rand(T, k, device=dev)

    def layer(backend=None):
        plan = moe_plan(ids, E, block_m=moe_block_m(T * k, E), backend=backend)
        h = expert_matmul(x, wgu, plan, activation="silu_mul", backend=backend)
        y = expert_matmul(h, wd, plan, row_weights=rw, out_dtype=torch.float32, backend=backend)
        return y, moe_sum(y, k, out_dtype=torch.bfloat16, backend=backend)

    torch.cuda.set_sync_debug_mode("error")
    try:
        layer()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            y, out = layer()
    finally:
        torch.cuda.set_sync_debug_mode(0)
    for seed in range(3):
        g = torch.Generator(device=dev).manual_seed(seed)
        ids.copy_(torch.stack([torch.randperm(E, device=dev, generator=g)[:k] for _ in range(T)]))
        if seed == 2:
            ids.copy_(torch.randint(0, 3, (T, k), device=dev, generator=g))  # crowded experts
        x.copy_(torch.randn(T, H, device=dev, generator=g).bfloat16())
        rw.copy_(torch.rand(T, k, device=dev, generator=g))
        graph.replay()
        eager_y, eager = layer()
        assert torch.equal(out, eager) and torch.equal(y, eager_y)
        # the rows before the token sums (a sum of a crowded token's rows can cancel: a
        # rounding of its terms is then far above the sum's own)
        ref_y, _ = layer("reference")
        _close(y, ref_y, torch.bfloat16, f"replay {seed}")
        _close(out, moe_sum(y, k, out_dtype=torch.bfloat16, backend="reference"),
               torch.bfloat16, f"sum {seed}")  # fmt: skip
