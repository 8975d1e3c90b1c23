"""Shared fixtures. GPU tests carry `@pytest.mark.gpu` and are skipped without CUDA."""

from __future__ import annotations

import os

# PAGEDATTN_TEST_GPUS=0,1,2 (GPUs of one host, for `pytest -n` in one device call): xdist
# worker gwK runs on the (K mod 3)-th of them. CUDA reads the variable as it starts (below).
if os.environ.get("PAGEDATTN_TEST_GPUS") and os.environ.get("PYTEST_XDIST_WORKER"):
    _gpus = os.environ["PAGEDATTN_TEST_GPUS"].split(",")
    _k = int(os.environ["PYTEST_XDIST_WORKER"].removeprefix("gw"))
    os.environ["CUDA_VISIBLE_DEVICES"] = _gpus[_k % len(_gpus)]

import torch  # noqa: E402

# xdist workers share the host's cores: torch's intra-op threads (one a core by default, their
# OpenMP threads spinning between ops) in every worker would oversubscribe them, so each
# worker takes its share (measured 2026-11-28 on 2 cores and on a 64-core GPU host:
# docs/performance.md).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    _share = (_cores or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    torch.set_num_threads(max(1, _share))

# Without CUDA, Triton kernels run in the interpreter. The variable must be set before any
# module decorates a kernel (whichever test module xdist imports first), so set it here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import inspect  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

from pagedattn import testing as _testing  # noqa: E402


def _log_margins(path: str) -> None:
    """PAGEDATTN_TOL_LOG=path: every assert_close appends how much of its bounds it used
    (worst element's min(err / abs_tol, rel_err / rel_tol), cosine difference / cos_tol;
    1 fails) as a JSON line, to find tests whose random inputs run close to the bounds."""
    inner = _testing.assert_close
    sig = inspect.signature(inner)

    def logged(*args, **kwargs):
        a = sig.bind(*args, **kwargs)
        a.apply_defaults()
        try:
            inner(*a.args, **a.kwargs)
        finally:
            t = a.arguments
            o, r = t["out"].double().cpu(), t["ref"].double().cpu()
            err, rel = _testing.element_errors(o, r)
            used = torch.minimum(err / max(t["abs_tol"], 1e-300), rel / max(t["rel_tol"], 1e-300))
            used = used.nan_to_num(nan=math.inf)  # NaN where the reference is finite: fails
            row = dict(test=os.environ.get("PYTEST_CURRENT_TEST", "?"), name=t["name"],
                       elem=float(used.max()) if used.numel() else 0.0,
                       cos=_testing.cos_diff(o, r) / max(t["cos_tol"], 1e-300))  # fmt: skip
            with open(path, "a") as f:
                f.write(json.dumps(row) + "\n")

    _testing.assert_close = logged


if os.environ.get("PAGEDATTN_TOL_LOG"):
    _log_margins(os.environ["PAGEDATTN_TOL_LOG"])


# PAGEDATTN_MLA_TUNING='{"field": value, ...}' (development): the tests run with those
# `MLATuning` fields (lists become tuples; `mla_decode_triton` reads the variable at each call),
# to check a launch variant of the MLA kernels before it becomes the default. Checked here, in
# every xdist worker, so that an unknown field fails the run at once (InvalidArgumentError).
if os.environ.get("PAGEDATTN_MLA_TUNING"):
    from pagedattn.ops.mla import tuning as _mla_tuning

    _mla_tuning.from_env()


if os.environ.get("PAGEDATTN_TEST_TIMES"):
    import triton

    _COMPILES = {"n": 0, "s": 0.0, "hits": 0}  # Triton compiles in this process

    def _count_compile(*, src, metadata, metadata_group, times, cache_hit) -> None:
        """`triton.knobs.compilation.listener`: a disk-cache hit, or a compile and its
        seconds."""
        if cache_hit:
            _COMPILES["hits"] += 1
        else:
            _COMPILES["n"] += 1
            _COMPILES["s"] += times.total / 1e6  # (times.total: microseconds)

    triton.knobs.compilation.listener = _count_compile

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(item, nextitem):
        """PAGEDATTN_TEST_TIMES=path: a JSON line a test, appended as it ends (also when a run
        is cut short): its node id, xdist worker, wall seconds, and the Triton compiles it made
        (count, seconds) and disk-cache hits; to find where a GPU run's time goes."""
        t0, c0 = time.perf_counter(), dict(_COMPILES)
        yield
        row = dict(test=item.nodeid, worker=os.environ.get("PYTEST_XDIST_WORKER", "main"),
                   s=round(time.perf_counter() - t0, 2), compiles=_COMPILES["n"] - c0["n"],
                   compile_s=round(_COMPILES["s"] - c0["s"], 2),
                   cache_hits=_COMPILES["hits"] - c0["hits"])  # fmt: skip
        with open(os.environ["PAGEDATTN_TEST_TIMES"], "a") as fh:
            fh.write(json.dumps(row) + "\n")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen() -> torch.Generator:
    """A fresh, randomly seeded generator (the seed is printed on failure; PAGEDATTN_SEED=N
    replays it)."""
    seed = os.environ.get("PAGEDATTN_SEED")
    seed = int(seed) if seed else int(torch.randint(0, 2**31 - 1, ()).item())
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)


@pytest.fixture(scope="module")
def one_thread():
    """Tiny models: torch's intra-op threads only spin (10x slower on a busy 2-core host).
    Modules of tiny-model tests use it with `pytestmark = pytest.mark.usefixtures(...)`."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
