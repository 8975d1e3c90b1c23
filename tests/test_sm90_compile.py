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


@pytest.mark.skipif(not HAS_GLUON, reason="needs Triton with Gluon")
@pytest.mark.parametrize("mode", ["dense", "sparse", "mha"])
def test_every_gpu_test_specialization_compiles_for_sm90(mode):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(HERE, "..", "src"), env.get("PYTHONPATH", "")]
    )
    res = subprocess.run(
        [sys.executable, os.path.join(HERE, "sm90_compile.py"), mode],
        capture_output=True, text=True, env=env, timeout=900,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    if mode == "mha":  # decode, its combine, the tl prefill and both Gluon prefills
        served = {"_mha_decode_kernel", "_combine_kernel", "_mha_prefill_kernel",
                  "_mha_prefill_sm90", "_mha_prefill_ws"}  # fmt: skip
    else:  # each Gluon sm_90 kernel serves some grid case, the portable kernel the rest
        assert out["cases"] == 16 * 5 * 3 * 4  # formats x h_q x s_q x page sizes
        served = {"_mla_decode_kernel", "_mla_decode_sm90", "_mla_decode_sm90_t",
                  "_mla_decode_sm90_tw", "_mla_decode_sm90_ss"}  # fmt: skip
        if mode == "dense":
            served.add("_mla_decode_sm90_st")
    assert served == set(out["kernels"]), out["kernels"]
    msgs = [f"{e['case']} {e['kernel']}: {e['cause']}\n{e['error']}" for e in out["errors"]]
    assert not msgs, f"{len(msgs)} specializations do not compile:\n" + "\n\n".join(msgs[:3])
