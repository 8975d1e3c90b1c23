"""`ops.prepared.cached_launch`: the frozen launch per key that the small ops (the fused layer
ops, `store_kv`) take instead of Triton's binder.

On a CPU: the key holds every value a frozen launch inlines (the type and value of each
non-tensor argument, each tensor's dtype and 16-byte residue) and refuses other objects; the
interpreter's launches take `launch`. On CUDA (`-m gpu`): each op's hits equal the same op
through `ops.launch.launch`, bitwise, over new tensors, a misaligned view (its own key) and a
CUDA-graph replay with new data; `store_kv` writes the same cache bytes. (The ops' prepared
calls, which skip `cached_launch` on a hit, are off here: `test_prepared_ops` tests them.)
"""

from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"  # CPU CI: before triton is imported

from pagedattn.ops import prepared as PR  # noqa: E402


def test_launch_key_holds_what_a_launch_inlines(monkeypatch):
    monkeypatch.setattr(PR, "_cuda_device", lambda: 0)
    buf = torch.zeros(64, dtype=torch.float32)
    a, odd = buf[:16], buf[1:17]  # 16-byte aligned, and 4 bytes past it

    def key(*args, **kw):
        tensors = []
        return PR._launch_key("kernel", args, kw, tensors), tensors

    k1, t1 = key(a, 3, 0.5, BLOCK=16, FLAG=True)
    assert t1 == [a] and k1 == key(buf[16:32], 3, 0.5, BLOCK=16, FLAG=True)[0]
    assert k1 != key(odd, 3, 0.5, BLOCK=16, FLAG=True)[0]  # the residue
    assert k1 != key(a.double(), 3, 0.5, BLOCK=16, FLAG=True)[0]  # the dtype
    assert k1 != key(a, 4, 0.5, BLOCK=16, FLAG=True)[0]  # an int's value
    assert k1 != key(a, 3, 0.25, BLOCK=16, FLAG=True)[0]  # a float's value
    assert k1 != key(a, True, 0.5, BLOCK=16, FLAG=True)[0]  # True is not 3, 1 is not True
    assert key(a, 1, 0.5)[0] != key(a, True, 0.5)[0]
    assert k1 != key(a, 3, 0.5, BLOCK=32, FLAG=True)[0]  # a constexpr
    assert key(a, (1, 2))[0] is None and key(a, X=object())[0] is None


def test_interpreted_launches_take_launch(monkeypatch):
    """Under Triton's interpreter (no compiled kernel) nothing is cached."""
    if torch.cuda.is_available():
        pytest.skip("the interpreter's path (CPU)")
    from pagedattn.ops.fused import rms_norm

    PR._LAUNCHES.clear()
    x = torch.randn(3, 32)
    w = torch.randn(32)
    got = rms_norm(x, w, 1e-6, backend="triton")
    ref = rms_norm(x, w, 1e-6, backend="reference")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert not PR._LAUNCHES


def _no_prepared_ops(monkeypatch):
    """The ops' prepared calls (`PreparedOp`) off, so that every call reaches `cached_launch`
    (what these tests are about; `test_prepared_ops` tests the prepared calls)."""
    monkeypatch.setattr(PR.PreparedOp, "lookup", lambda self, key, src, before=None: PR.MISS)
    monkeypatch.setattr(PR.PreparedOp, "prepare",
                        lambda self, key, src, guarded, run, *rest: run())  # fmt: skip


def _with_plain_launches(monkeypatch, fn, *args):
    """fn(*args) with the fused ops and store_kv launching through `ops.launch.launch`."""
    from pagedattn.ops.fused import triton_fused
    from pagedattn.ops.launch import launch
    from pagedattn.ops.store_kv import triton_store

    with monkeypatch.context() as m:
        m.setattr(triton_fused, "cached_launch", launch)
        m.setattr(triton_store, "cached_launch", launch)
        return fn(*args)


def _same(a, b):
    a = a if isinstance(a, tuple) else (a,)
    b = b if isinstance(b, tuple) else (b,)
    for x, y in zip(a, b):
        assert x.shape == y.shape and x.dtype == y.dtype
        assert torch.equal(x, y)


@pytest.mark.gpu
def test_gpu_fused_ops_hit_and_equal_plain_launches(monkeypatch):
    from pagedattn.ops.fused import rms_norm, rope_qkv, silu_mul

    _no_prepared_ops(monkeypatch)
    PR._LAUNCHES.clear()
    bf = torch.bfloat16
    T, H, h_q, h_kv, d = 37, 2048, 8, 2, 64
    w = torch.randn(H, device="cuda").to(bf)
    calls = {
        "rms_norm": lambda x, r: rms_norm(x, w, 1e-5),
        "rms_norm+residual": lambda x, r: rms_norm(x, w, 1e-5, r),
        "rope_qkv": lambda x, r: rope_qkv(
            x[:, : (h_q + 2 * h_kv) * d], r[:, : d // 2], r[:, d // 2 : d], h_q, h_kv
        ),  # fmt: skip
        "silu_mul": lambda x, r: silu_mul(x),
    }
    for call in calls.values():
        for step in range(3):
            g = torch.Generator(device="cuda").manual_seed(step)
            flat = torch.randn(T * H + 8, device="cuda", generator=g).to(bf)
            x = flat[: T * H].view(T, H) if step < 2 else flat[1 : 1 + T * H].view(T, H)
            r = torch.randn(T, H, device="cuda", generator=g).to(bf)
            got = call(x, r)
            want = _with_plain_launches(monkeypatch, call, x, r)
            _same(got, want)
        # a hit captured in a CUDA graph, replayed with new data
        x = torch.randn(T, H, device="cuda").to(bf)
        r = torch.randn(T, H, device="cuda").to(bf)
        call(x, r)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = call(x, r)
        x.copy_(torch.randn_like(x))
        r.copy_(torch.randn_like(r))
        graph.replay()
        _same(out, _with_plain_launches(monkeypatch, call, x, r))
    # each op's aligned and misaligned keys were frozen (not left to `launch`)
    assert sum(e is not None for e in PR._LAUNCHES.values()) >= 2 * len(calls)


@pytest.mark.gpu
def test_gpu_store_kv_hits_write_the_same_bytes(monkeypatch):
    from pagedattn import KVCacheParams, store_kv
    from pagedattn.testing import make_paged_cache, ragged_offsets

    _no_prepared_ops(monkeypatch)
    PR._LAUNCHES.clear()
    params = KVCacheParams(torch.bfloat16, 2, 4, 64, 16, devices=["cuda"])
    g = torch.Generator().manual_seed(3)
    q_lens = [1, 1, 7, 1]
    cache = make_paged_cache(params, [40, 0, 100, 3], q_lens, generator=g, device="cuda")
    inp = cache.inputs
    offs = ragged_offsets(q_lens, "cuda")
    for step in range(3):
        inp.cache_lengths.copy_(torch.tensor([40 - step, step, 100 - 7 * step, 3],
                                             dtype=torch.int32))  # fmt: skip
        k = torch.randn(sum(q_lens), 4, 64, device="cuda").to(torch.bfloat16)
        v = torch.randn(sum(q_lens), 4, 64, device="cuda").to(torch.bfloat16)
        before = inp.kv_blocks.clone()
        store_kv(k, v, inp, params, 1, offs)
        got = inp.kv_blocks.clone()
        inp.kv_blocks.copy_(before)
        _with_plain_launches(monkeypatch, store_kv, k, v, inp, params, 1, offs)
        assert torch.equal(got.view(torch.int16), inp.kv_blocks.view(torch.int16))
    assert any(e is not None for e in PR._LAUNCHES.values())
