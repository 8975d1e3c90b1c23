"""Every kernel specialization that the GPU tests launch on an H100 (the MLA grid; the MHA
decode, split-K combine and prefills) compiles for sm_90, checked on any machine:
`tests/sm90_compile.py` captures each case's launches (`pagedattn.ops.offline`) and runs the
distinct specializations through Triton's front end, in a subprocess (this CPU session runs
Triton's interpreter, which does not compile).

A Python-level error in a kernel specialization that no CPU test runs (the interpreter runs the
portable kernels only) would otherwise show only on the GPU: 49540bc made the seesaw kernels
fail to compile for tiles of several tokens (dense V32 at h_q 1, 16 and 20), and only the full
GPU grid saw it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pagedattn.ops.gluon_imports import HAS_GLUON

HERE = os.path.dirname(os.path.abspath(__file__))


MODES = ["dense", "sparse", "persistent", "pages", "balanced", "mha", "layers"]
MLA_MODES = ("dense", "sparse", "persistent", "pages", "balanced")


def _expected(mode: str) -> tuple[set, int | None]:
    """(the kernels that `sm90_compile.py mode` must reach, its case count or None)."""
    if mode == "layers":  # the decoder layers' ops
        layers = {"_rms_norm_kernel", "_silu_mul_kernel", "_argmax_rows_kernel",
                  "_argmax_part_kernel", "_argmax_finish_kernel",
                  "_rope_qkv_kernel", "_store_kv_kernel", "_rope_store_kernel",
                  "_count_kernel", "_place_kernel", "_expert_mm_kernel",
                  "_moe_sum_kernel", "_keep_threshold_kernel", "_thr_stats_kernel",
                  "_thr_decide_kernel", "_thr_pass_kernel", "_unpack_step_rows_kernel"}  # fmt: skip
        return layers, None
    if mode == "mha":  # decode, its combines, the tl prefill, both Gluon prefills, the planner
        return {"_mha_decode_kernel", "_combine_kernel", "_worklist_combine_kernel",
                "_mha_prefill_kernel", "_mha_prefill_sm90", "_mha_prefill_ws",
                "_plan_kernel"}, None  # fmt: skip
    if mode == "persistent":  # PS_CASES x h_q {100, 128} x work order {1, 0}
        return {"_mla_decode_sm90_ps"}, 4 * 2 * 2
    if mode == "pages":  # V32 h_q 128, dense / sparse x 3 page sizes x s_q {1, 2}
        return {"_mla_decode_sm90_ss"}, 2 * 3 * 2  # (no split-K combine: capture_mla drops it)
    import sm90_compile as S

    if mode == "balanced":  # the balanced list, its runs and the seesaw's, and their combines
        # (split-K's where a kernel keeps a partition count): formats x h_q x s_q x tunings
        return {"_mla_decode_sm90_t", "_mla_decode_sm90_st", "_mla_decode_sm90_tw",
                "_mla_decode_sm90", "_mla_runs_combine_kernel", "_mla_worklist_combine_kernel",
                "_mla_combine_kernel"}, 2 * 2 * 2 * len(S.BALANCED_TUNINGS)  # fmt: skip

    # each Gluon sm_90 kernel serves some grid case, the portable kernel the rest: formats x
    # h_q x s_q x page sizes, and the rope-aware cases as on an H200
    served = {"_mla_decode_kernel", "_mla_decode_sm90", "_mla_decode_sm90_t",
              "_mla_decode_sm90_tw", "_mla_decode_sm90_ss"}  # fmt: skip
    if mode == "dense":
        served.add("_mla_decode_sm90_st")
    return served, 16 * 5 * 3 * 4 + len(S.H200_MLA_CASES)


@pytest.mark.skipif(not HAS_GLUON, reason="needs Triton with Gluon")
@pytest.mark.parametrize(
    "modes,cover",
    [(MLA_MODES, "pairs"), (("mha",), "pairs"), (("layers",), "pairs")]
    + [pytest.param((m,), "every", marks=pytest.mark.slow) for m in MODES],
    ids=lambda v: "+".join(v) if isinstance(v, tuple) else v,
)
def test_every_gpu_test_specialization_compiles_for_sm90(modes, cover):
    """The modes' distinct specializations: in `make test`, a pairwise covering set of each
    kernel's (`sm90_compile.pairwise_cover`: every value of every constexpr, pointer type and
    launch option, and every pair of them, that a specialization of the kernel has, over the
    MLA modes together: 149 of the MLA kernels' 756, 158 of mha's 546, 56 of the layers' 68;
    all of them took 344 of the 2-core suite's 1753 worker-s); each mode's all with the `slow`
    tests (`pytest -m slow`; `dev/gpu_tests_multi.sh` runs them on the GPU host's cores)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "..", "src"), env.get("PYTHONPATH", "")]
    )
    flags = ["--every"] if cover == "every" else []
    res = subprocess.run(
        [sys.executable, os.path.join(HERE, "sm90_compile.py"), *modes, *flags],
        capture_output=True, text=True, env=env, timeout=1800,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    assert 0 < out["compiled"] <= sum(out["kernels"].values())
    if cover == "every":
        assert out["compiled"] == sum(out["kernels"].values())
    served, cases = set(), 0
    for m in modes:
        kernels, n = _expected(m)
        served |= kernels
        cases = None if n is None or cases is None else cases + n
    if cases is not None:
        assert out["cases"] == cases
    assert served == set(out["kernels"]), out["kernels"]
    msgs = [f"{e['case']} {e['kernel']}: {e['cause']}\n{e['error']}" for e in out["errors"]]
    assert not msgs, f"{len(msgs)} specializations do not compile:\n" + "\n\n".join(msgs[:3])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["dense", "sparse", "balanced", "mha"])
def test_gpu_runs_the_specializations_compiled_offline(mode):
    """On an H100 or H200 the cases launch the kernels that the offline check compiles: for the
    first case of each (kernels, cluster size, cache format or MHA path) in
    `tests/sm90_compile.py` and every 40th (the balanced mode, the decode an engine gets and its
    combines: every case), the device's own dispatch and Triton's own compile
    give the cache hash that `ops.offline.cache_hash` finds for the same case captured on the
    CPU (the dispatchers' device checks left out, the MHA cases captured as on this chip; the
    cases that force an H200's choices are left out)."""
    import torch

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the offline check compiles for sm_90")
    import sm90_compile as S

    from pagedattn.cache.dispatch import fast_hbm
    from pagedattn.ops import offline
    from pagedattn.ops.launch import compiled_kernel
    from pagedattn.ops.pdl import pdl_as_on_sm90

    def cases():
        every = S.mha_cases() if mode == "mha" else S.mla_cases(mode)
        return [(n, f) for n, f in every if not n.endswith("H200")]

    picked, seen = {}, set()
    S.CHIP_H200 = fast_hbm("cuda")
    try:
        for i, (name, launches) in enumerate(cases()):
            with pdl_as_on_sm90():  # (as the GPU pass below launches them)
                made = launches()
            # one case a (kernels, cluster, cache format or MHA path) combination, and every 40th
            # (the balanced mode: every case)
            words = {"mha": 3, "balanced": None}.get(mode, 1)
            key = (tuple(m.name for m in made), max((m.cluster for m in made), default=1),
                   tuple(name.split()[:words]))  # fmt: skip
            if key not in seen or i % 40 == 0:
                seen.add(key)
                picked[i] = (name, [(m.name, offline.cache_hash(m)) for m in made])
        S.DEVICE = "cuda"
        with torch.device("cuda"):
            for i, (name, launches) in enumerate(cases()):
                if i in picked:
                    got = [(m.name, compiled_kernel(m.kernel, m.grid, *m.args, **m.kwargs).hash)
                           for m in launches()]  # fmt: skip
                    assert got == picked[i][1], name
    finally:
        S.DEVICE, S.CHIP_H200 = "cpu", False
    assert len(picked) >= 10, sorted(seen)


def test_the_offline_check_takes_the_gpu_grids_cache_formats():
    """`tests/sm90_compile.py` keeps its own copy of the MLA grid's formats (it runs where
    test_triton_mla, which turns the interpreter on, cannot be imported): the same names,
    quantizations and head dims."""
    import sm90_compile as S
    from test_triton_mla import FORMATS

    assert {k: (f(), dims) for k, (f, dims, _) in FORMATS.items()} == {
        k: (f(), dims) for k, (f, dims) in S.FORMATS.items()
    }


@pytest.mark.skipif(not HAS_GLUON, reason="needs Triton with Gluon")
@pytest.mark.parametrize("mode", ["dense", "sparse"])
@pytest.mark.parametrize("ps,ps_c", [(1, 1), (16, 16), (64, 64), (128, 128), (3, 0), (48, 0)])
def test_v32_cluster_launch_constants(mode, ps, ps_c):
    """A V32 launch at h_q 128 takes the 2-CTA cluster kernel with its producer's tile step as
    measured (`tuning.SeesawTuning`: one store a half, int32 rows, 200 / 104 registers) and the page
    size as a compile-time constant where it is a power of two, else a run-time value (PS_C 0;
    the "pages" suite above compiles those); sparse launches cp.async q (SS_QASYNC), dense
    ones do not (measured slower there)."""
    import sm90_compile as S

    (launch,) = S.grid_launches(mode, "v32", 576, 128, 2, ps)
    kw = launch.kwargs
    assert (launch.name, launch.cluster) == ("_mla_decode_sm90_ss", 2)
    assert kw["PS_C"] == ps_c and kw["SS_ADDR"] and kw["SS_CROSS"]
    assert kw["SS_DEQ1"] and kw["SS_SPLITCP"] == (mode == "dense")
    assert (kw["CONSUMER_REGS"], kw["PRODUCER_REGS"]) == (200, 104)
    assert kw["SS_QASYNC"] == (mode == "sparse")


@pytest.mark.skipif(not HAS_GLUON, reason="needs Triton with Gluon")
def test_serving_step_layouts_share_their_binaries():
    """Mixed steps whose request count, lookup-table width and split point differ (one
    request-count class) launch the same sm_90 binaries as an H200 picks them, and their
    decode part the decode graph's; MLA decode, which specializes on both, launches only
    binaries that the decode graphs and the engine's warm-up compile (`tests/jit_keys.py`):
    each new binary met while serving was a compile mid-stream, ~5 s for a Gluon prefill
    variant (before `ops.specialize`, these layouts gave 3 prefill, 3 decode and 2 combine
    binaries, the graph's included)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "..", "src"), env.get("PYTHONPATH", "")]
    )
    res = subprocess.run([sys.executable, os.path.join(HERE, "jit_keys.py")],
                         capture_output=True, text=True, env=env, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    steps = json.loads(res.stdout.strip().splitlines()[-1])
    mla = steps.pop("mla")
    start = set(mla["start"])
    missed = {k: [h for h in v if h not in start] for k, v in mla["served"].items()}
    assert not any(missed.values()), {k: v for k, v in missed.items() if v}
    assert len(start) >= 10  # (it does cover the classes: 1..40 requests at 8 widths)
    graph = steps.pop("graph decode b16")
    planned = {k: steps.pop(k) for k in list(steps) if k.startswith("planned")}
    # (the balanced decode merges its split rows in its own launch: no combine launch)
    with_plan = {"_mha_decode_kernel", "_mha_prefill_ws", "_plan_kernel"}
    for name in with_plan:  # served planned steps launch the warm-up's planned binaries
        assert len({step[name] for step in planned.values()}) == 1, (name, planned)
    assert all(set(step) == with_plan for step in planned.values()), planned
    kernels = {"_mha_decode_kernel", "_mha_prefill_ws"}
    for name in kernels:
        hashes = {step[name] for step in steps.values()}
        assert len(hashes) == 1, (name, steps)
    first = next(iter(steps.values()))
    assert graph["_mha_decode_kernel"] == first["_mha_decode_kernel"], (graph, first)
    assert all(set(step) == kernels for step in steps.values()), steps
    one = next(iter(planned.values()))
    assert one["_mha_decode_kernel"] != graph["_mha_decode_kernel"]  # (PLAN: its own binary)


def test_pairwise_cover_holds_every_pair_of_values():
    """The covering set of `sm90_compile.pairwise_cover` holds every feature and every pair of
    features that some specialization holds, and fewer specializations than all where they
    repeat; a specialization with a pair no other has is always in it."""
    import itertools

    import sm90_compile as S

    vals = [("w", 4), ("w", 8)], [("st", 2), ("st", 3)], [("ps", 1), ("ps", 16), ("ps", 64)]
    specs = [set(c) for c in itertools.product(*vals)] * 2  # 12 distinct, each twice
    specs.append({("w", 4), ("st", 2), ("ps", 128)})  # ps 128 only here
    chosen = S.pairwise_cover(specs)
    got = [specs[i] for i in chosen]
    pairs = lambda f: f | {(a, b) for a in f for b in f if a < b}  # noqa: E731
    assert set().union(*map(pairs, got)) == set().union(*map(pairs, specs))
    assert len(specs) - 1 in chosen and len(chosen) < len(specs) // 2 + 1
