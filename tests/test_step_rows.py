"""`ops.step_rows.unpack_step_rows`: the Triton kernel (the interpreter on the CPU, the GPU
under the gpu marker) writes what the reference writes, on poisoned buffers, for steps that
fill the bucket, leave pad rows, keep device-filled tokens or take the previous step's,
stage no lookup column and nothing at all (n < 0); bad arguments raise before anything is
written."""

from __future__ import annotations

import pytest
import torch

from pagedattn.errors import InvalidArgumentError
from pagedattn.ops.step_rows import KEEP, StagedRows, unpack_step_rows

POISON = -7


def _case(M, C, K, n, w, rows, dev, seed):
    g = torch.Generator().manual_seed(seed)
    L = StagedRows(M, C, K)
    stage = torch.randint(-(2**40), 2**40, (L.size + 5,), generator=g, dtype=torch.int64)
    stage[0], stage[1] = n, w
    at = L.rows_at
    if n > 0:
        stage[at : at + n] = torch.randint(0, 10**6, (n,), generator=g)
        ids = torch.randint(0, 50_000, (n,), generator=g)
        u = torch.rand(n, generator=g)
        ids[u < 0.3] = KEEP  # deferred, fed on the device before the unpack
        fed = u > 0.7  # deferred, taken from the previous step's tokens by the unpack
        ids[fed] = -1 - torch.randint(0, 6, (int(fed.sum()),), generator=g)
        stage[at + M : at + M + n] = ids
        stage[at + 2 * M : at + 2 * M + n] = torch.randint(0, 10**6, (n,), generator=g)
        stage[L.lut_at : L.lut_at + n * w] = torch.randint(0, 999, (n * w,), generator=g)
    bufs = dict(
        cache_lengths=torch.full((M,), POISON, dtype=torch.int32),
        lookup_table=torch.full((M, C), POISON, dtype=torch.int32),
        input_ids=torch.randint(0, 9, (M,), generator=g),
        positions=torch.full((M,), POISON, dtype=torch.int64),
        tokens=torch.randint(60_000, 70_000, (6,), generator=g),
        meta=torch.full((K,), POISON, dtype=torch.int64) if K else None,
    )
    pad = dict(
        pad_cache_length=torch.tensor(3, dtype=torch.int32),
        pad_lookup_row=torch.randint(0, 999, (C,), generator=g, dtype=torch.int32),
    )
    to = lambda t: None if t is None else t.to(dev)  # noqa: E731
    return L, stage.to(dev), {k: to(v) for k, v in bufs.items()}, {k: to(v) for k, v in pad.items()}


def _run(L, stage, bufs, pad, rows, backend):
    out = {k: None if v is None else v.clone() for k, v in bufs.items()}
    unpack_step_rows(stage, L, rows, out["cache_lengths"], out["lookup_table"], out["input_ids"],
                     out["positions"], out["tokens"], out["meta"], pad["pad_cache_length"],
                     pad["pad_lookup_row"], 999, backend=backend)  # fmt: skip
    return out


CASES = [  # M, C, K, n, w, rows
    (8, 5, 4, 8, 5, 8),  # the whole bucket, full width
    (8, 5, 4, 3, 2, 4),  # pad rows, narrow lookup
    (16, 70, 0, 5, 0, 9),  # no lookup column staged, no metadata, C over a block
    (16, 1100, 3, 2, 1100, 6),  # wide rows: columns in more than one block
    (4, 3, 4, 0, 0, 4),  # no real row
    (4, 3, 4, -1, 0, 4),  # n < 0: nothing written
]


def _check(L, stage, bufs, pad, rows, dev):
    ref = _run(L, stage, bufs, pad, rows, "reference")
    got = _run(L, stage, bufs, pad, rows, "triton")
    for k in ref:
        if ref[k] is not None:
            assert torch.equal(got[k].cpu(), ref[k].cpu()), k
    n, w = int(stage[0]), int(stage[1])
    if n < 0:  # nothing written
        for k, v in bufs.items():
            assert v is None or torch.equal(ref[k], v), k
        return
    # the reference against the layout, element by element
    st, at, M = stage.cpu(), L.rows_at, L.max_rows
    r = ref
    for i in range(rows):
        if i < n:
            assert int(r["cache_lengths"][i]) == int(st[at + i])
            tok = int(st[at + M + i])
            want = int(bufs["input_ids"][i]) if tok == KEEP else tok
            if KEEP < tok < 0:
                want = int(bufs["tokens"][-1 - tok])
            assert int(r["input_ids"][i]) == want
            assert int(r["positions"][i]) == int(st[at + 2 * M + i])
            row = r["lookup_table"][i].cpu()
            assert row[:w].tolist() == st[L.lut_at + i * w : L.lut_at + (i + 1) * w].tolist()
            assert (row[w:] == 999).all()
        else:
            assert int(r["cache_lengths"][i]) == 3
            assert int(r["input_ids"][i]) == 0 and int(r["positions"][i]) == 0
            assert torch.equal(r["lookup_table"][i], pad["pad_lookup_row"])
    assert (r["cache_lengths"][rows:] == POISON).all()  # rows past the bucket untouched
    assert (r["lookup_table"][rows:] == POISON).all()
    if r["meta"] is not None:
        assert r["meta"].tolist() == st[L.meta_at : L.meta_at + L.meta].tolist()


@pytest.mark.parametrize("case", CASES)
def test_unpack_step_rows_triton_equals_reference(case):
    M, C, K, n, w, rows = case
    L, stage, bufs, pad = _case(M, C, K, n, w, rows, "cpu", seed=n + C)
    _check(L, stage, bufs, pad, rows, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("case", CASES)
def test_gpu_unpack_step_rows(case):
    M, C, K, n, w, rows = case
    L, stage, bufs, pad = _case(M, C, K, n, w, rows, "cuda", seed=n + C)
    _check(L, stage, bufs, pad, rows, "cuda")


def test_unpack_step_rows_rejects_bad_arguments_before_writing():
    L, stage, bufs, pad = _case(8, 5, 4, 3, 2, 4, "cpu", seed=0)
    before = {k: v.clone() for k, v in bufs.items()}
    bad = [
        (dict(stage=stage[:10]), "stage"),
        (dict(rows=9), "rows"),
        (dict(lookup_table=bufs["lookup_table"][:, :4]), "lookup_table"),
        (dict(input_ids=bufs["input_ids"].to(torch.int32)), "input_ids"),
        (dict(tokens=bufs["tokens"][:0]), "tokens"),
        (dict(meta=None), "meta"),
        (dict(pad_lookup_row=pad["pad_lookup_row"][:2]), "pad_lookup_row"),
        (dict(layout=(8, 5, 4)), "layout"),
    ]
    for over, name in bad:
        kw = dict(stage=stage, layout=L, rows=4, **bufs, **pad, sentinel=999)
        kw.update(over)
        with pytest.raises(InvalidArgumentError, match=name):
            unpack_step_rows(**kw)
    for k, v in bufs.items():
        assert torch.equal(v, before[k]), k
