"""`ops.l2_prefetch`: the norms and silu * up asking the L2 for the next GEMM's weight.

A prefetch is a hint: the ops' results must not change with it (bit for bit on CUDA, eager and
in a captured graph; the model's logits too), a bad `prefetch` raises a typed error naming it
before anything runs, the bytes asked are bounded a program, and the sm_90 code issues the
prefetches before the PDL wait (the weight is not written by the step)."""

from __future__ import annotations

import pytest
import torch

from pagedattn.errors import InvalidArgumentError
from pagedattn.ops import l2_prefetch as L2
from pagedattn.ops.fused import rms_norm, silu_mul


def _dev() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


def _inputs(T, H, dev, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(T, H, generator=g).to(torch.bfloat16).to(dev)
    r = torch.randn(T, H, generator=g).to(torch.bfloat16).to(dev)
    w = torch.randn(H, generator=g).to(torch.bfloat16).to(dev)
    gu = (3 * torch.randn(T, 2 * H, generator=g)).to(torch.bfloat16).to(dev)
    nxt = torch.randn(3 * H, H, generator=g).to(torch.bfloat16).to(dev)
    x[T - 1, 3] = float("nan")  # a NaN row stays NaN either way
    gu[T // 2, 5] = float("inf")
    return x, r, w, gu, nxt


@pytest.mark.parametrize("T,H", [(1, 64), (5, 96), (64, 256)])
def test_results_do_not_depend_on_the_prefetch(T, H):
    x, r, w, gu, nxt = _inputs(T, H, _dev())
    for pf in (nxt, nxt.view(-1)[:100], nxt[:1]):
        a, ar = rms_norm(x, w, 1e-5, r, backend="triton")
        b, br = rms_norm(x, w, 1e-5, r, backend="triton", prefetch=pf)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        assert torch.equal(ar.view(torch.int16), br.view(torch.int16))
        a = rms_norm(x, w, 1e-5, backend="triton")
        b = rms_norm(x, w, 1e-5, backend="triton", prefetch=pf)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
        a = silu_mul(gu, backend="triton")
        b = silu_mul(gu, backend="triton", prefetch=pf)
        assert torch.equal(a.view(torch.int16), b.view(torch.int16))
    # the reference ignores it
    ref = rms_norm(x.float(), w.float(), 1e-5, backend="reference", prefetch=nxt)
    assert torch.equal(
        ref.nan_to_num(), rms_norm(x.float(), w.float(), 1e-5, backend="reference").nan_to_num()
    )


@pytest.mark.parametrize("backend", ["reference", "triton"])
def test_a_bad_prefetch_raises_naming_it(backend):
    x, r, w, gu, nxt = _inputs(4, 64, "cpu")
    for bad in ("weight", 3, nxt.t(), torch.empty(8, device="meta")):
        with pytest.raises(InvalidArgumentError, match="prefetch"):
            rms_norm(x, w, 1e-5, r, backend=backend, prefetch=bad)
        with pytest.raises(InvalidArgumentError, match="prefetch"):
            silu_mul(gu, backend=backend, prefetch=bad)


def test_prefetch_args_bound_the_bytes_a_program():
    cpu = torch.zeros(1)
    w = torch.zeros(1 << 22, dtype=torch.bfloat16)  # 8 MB
    assert L2.prefetch_args(w, cpu, 64)[1:] == (0, False)  # not on CUDA: nothing asked
    assert L2.prefetch_args(None, cpu, 64)[1:] == (0, False)
    saved = L2.l2_prefetch_enabled
    L2.l2_prefetch_enabled = lambda t: True
    try:
        assert L2.prefetch_args(w, cpu, 64)[1:] == (8 << 20, True)  # 128 KB a program
        assert L2.prefetch_args(w, cpu, 2)[1:] == (2 * L2.MAX_BYTES_A_PROGRAM, True)
        assert L2.prefetch_args(w, cpu, 0)[1:] == (0, False)
    finally:
        L2.l2_prefetch_enabled = saved


_SM90_PTX = """
import json, torch
from pagedattn.ops import l2_prefetch as L2, offline, prepared
from pagedattn.ops.fused import triton_fused as F
x = torch.randn(64, 2048).to(torch.bfloat16)
w = torch.ones(2048).to(torch.bfloat16)
nxt = torch.ones(6144, 2048).to(torch.bfloat16)
L2.l2_prefetch_enabled = lambda t: True  # (as on CUDA)
(launch,) = offline.capture(prepared, lambda: F.rms_norm_triton(x, w, 1e-5, x, prefetch=nxt),
                            _fast_path=lambda kernel, grid: False)
launch.kwargs["PDL"] = True
lines = [s.strip() for s in offline.compile_sm90(launch).asm["ptx"].splitlines()]
print(json.dumps(dict(
    pf=launch.kwargs["PF"], warps=launch.kwargs["num_warps"],
    pre=[i for i, s in enumerate(lines) if "prefetch.global.L2" in s],
    wait=[i for i, s in enumerate(lines) if s.startswith("griddepcontrol.wait")])))
"""


def test_sm90_code_prefetches_before_the_pdl_wait():
    """The offline sm_90 compile of rms_norm with a prefetch and PDL: 2,048 predicated
    `prefetch.global.L2` a program (8 a thread at 8 warps), all before `griddepcontrol.wait`."""
    pytest.importorskip("triton.experimental.gluon")
    import json
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    res = subprocess.run([sys.executable, "-c", _SM90_PTX], capture_output=True, text=True,
                         env=env, timeout=600)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    got = json.loads(res.stdout.strip().splitlines()[-1])
    assert got["pf"] is True
    assert len(got["pre"]) == 2048 // (32 * got["warps"]) and len(got["wait"]) == 1
    assert max(got["pre"]) < got["wait"][0]


def test_model_passes_its_prefetch_to_every_layer():
    import transformers
    from tiny_llama import tiny_common

    from pagedattn.models.layers import SwiGLUMLP
    from pagedattn.models.llama import DecoderForCausalLM, DecoderLayer

    m = DecoderForCausalLM(transformers.LlamaConfig(**tiny_common(64)), dtype=torch.float32)
    assert m.l2_prefetch == DecoderForCausalLM.l2_prefetch_bytes
    m.set_l2_prefetch(0)
    mods = [x for x in m.modules() if isinstance(x, (DecoderLayer, SwiGLUMLP))]
    assert mods and all(x.l2_prefetch == 0 for x in mods)
    m.set_l2_prefetch(1 << 20)
    assert all(x.l2_prefetch == 1 << 20 for x in mods)
    for bad in (-1, 1.5, "1"):
        with pytest.raises(InvalidArgumentError, match="nbytes"):
            m.set_l2_prefetch(bad)
    assert all(x.l2_prefetch == 1 << 20 for x in mods)  # unchanged by a rejected call


@pytest.mark.gpu
def test_prefetch_changes_no_bit_in_a_captured_graph():
    x, r, w, gu, nxt = _inputs(64, 2048, "cuda", seed=1)
    want = rms_norm(x, w, 1e-5, r)
    want_s = silu_mul(gu)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        rms_norm(x, w, 1e-5, r, prefetch=nxt)  # (compile and prepare outside the capture)
        silu_mul(gu, prefetch=nxt)
        with torch.cuda.graph(g, stream=s):
            out, rout = rms_norm(x, w, 1e-5, r, prefetch=nxt)
            out_s = silu_mul(gu, prefetch=nxt)
    torch.cuda.current_stream().wait_stream(s)
    for seed in (2, 3):  # new data, same buffers
        x2, r2, _, gu2, _ = _inputs(64, 2048, "cuda", seed=seed)
        x.copy_(x2)
        r.copy_(r2)
        gu.copy_(gu2)
        want = rms_norm(x, w, 1e-5, r)
        want_s = silu_mul(gu)
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out.view(torch.int16), want[0].view(torch.int16))
        assert torch.equal(rout.view(torch.int16), want[1].view(torch.int16))
        assert torch.equal(out_s.view(torch.int16), want_s.view(torch.int16))
