"""`ops.gluon_cluster.smem_offsets`: the shared offsets it reads from a compiled Gluon kernel's
TTGIR are the ones the kernel's PTX addresses (an offline sm_90 compile, in a subprocess: the
CPU test session runs Triton's interpreter, which does not compile)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from pagedattn.ops.gluon_imports import HAS_GLUON

_SCRIPT = r"""
import json, re, sys
from triton.backends.compiler import GPUTarget
from triton.compiler import compile as tcompile
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource
from triton.experimental.gluon.language.nvidia.hopper import mbarrier
from pagedattn.ops.gluon_cluster import smem_offsets

@gluon.jit
def k(X):
    lay: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    sh: gl.constexpr = gl.SwizzledSharedLayout(vec=1, per_phase=1, max_phase=1, order=[1, 0])
    big = gl.allocate_shared_memory(gl.float32, [64, 128], sh)
    bars = gl.allocate_shared_memory(gl.int64, [3, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bars.index(0), count=37)
    mbarrier.init(bars.index(2), count=41)
    r = gl.arange(0, 64, layout=gl.SliceLayout(1, lay))
    c = gl.arange(0, 32, layout=gl.SliceLayout(0, lay))
    x = gl.load(X + r[:, None] * 32 + c[None, :])
    big.slice(32, 32, dim=1).store(x)
    gl.store(X + r[:, None] * 32 + c[None, :], big.slice(32, 32, dim=1).load(lay) + 1.0)

ck = tcompile(GluonASTSource(k, {"X": "*fp32"}, {}, {}), target=GPUTarget("cuda", 90, 32),
              options=dict(num_warps=4))
offs = smem_offsets(ck.asm["ttgir"], ("big", "bars"))
try:
    smem_offsets(ck.asm["ttgir"], ("nothing",))
    missing = False
except KeyError as e:
    missing = "nothing" in str(e)
print(json.dumps(dict(offs=offs, missing=missing, ptx=ck.asm["ptx"], shared=ck.metadata.shared)))
"""


@pytest.mark.skipif(not HAS_GLUON, reason="needs Triton with Gluon")
def test_smem_offsets_match_the_compiled_kernels_addresses(tmp_path):
    script = tmp_path / "compile_probe.py"  # Triton reads a jit function's source from its file
    script.write_text(_SCRIPT)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    env["PYTHONPATH"] = os.pathsep.join([src, env.get("PYTHONPATH", "")])
    res = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300
    )
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    offs, ptx = out["offs"], out["ptx"]
    assert out["missing"], "a name that is not allocated must raise KeyError"
    big, bars = offs["big"], offs["bars"]
    # disjoint, inside the kernel's shared memory: 64 x 128 float32 and 3 barriers
    assert big + 64 * 128 * 4 <= bars or bars + 24 <= big
    assert max(big + 64 * 128 * 4, bars + 24) <= out["shared"]
    # the PTX inits barriers 0 and 2 (counts 37, 41) at global_smem + bars, + bars + 16
    for i, count in ((0, 37), (2, 41)):
        off = bars + 8 * i
        init = [ln for ln in ptx.splitlines() if "mbarrier.init.shared::cta.b64" in ln
                and ln.rstrip().endswith(f", {count};")]  # fmt: skip
        assert init, f"no init with count {count}"
        reg = init[0].split("[")[1].split("]")[0]
        assert f"global_smem+{off}]" in init[0] or any(
            f"{reg}, %r" in ln and ln.rstrip().endswith(f", {off};") for ln in ptx.splitlines()
        ), f"barrier {i} is not at global_smem + {off}"
