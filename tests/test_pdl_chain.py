"""The PDL chain's contract (`ops.pdl.pdl_chain_kwargs`): a kernel launched with `launch_pdl`
may start while the kernel before it still runs, so each layer kernel of the chain must wait
(`griddepcontrol.wait`) before it reads or writes anything: its first statement is the wait.
Checked on the kernels' source (the GPU test `test_engine_cuda_graphs.py::
test_pdl_chain_changes_no_bit` checks the results bit for bit); the chain's arguments are
empty off CUDA, under the interpreter, and with PAGEDATTN_PDL=0."""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
import torch

from pagedattn.ops import pdl
from pagedattn.ops.fused import triton_fused as TF
from pagedattn.ops.mha import triton_decode as TD
from pagedattn.ops.store_kv import triton_rope_store as TRS
from pagedattn.ops.store_kv import triton_store as TS

CHAIN = {
    "rms_norm": (TF._rms_norm_kernel, "PDL"),
    "rope_qkv": (TF._rope_qkv_kernel, "PDL"),
    "silu_mul": (TF._silu_mul_kernel, "PDL"),
    "argmax_rows": (TF._argmax_rows_kernel, "PDL"),
    "rope_store_kv": (TRS._rope_store_kernel, "PDL"),
    "store_kv": (TS._store_kv_kernel, "PDL"),
    "mha decode": (TD._mha_decode_kernel, "PDL_WAIT"),
}
# The decode's arguments it may read before its wait where EARLY (the launch's inputs, which no
# kernel of the chain writes; K and V only through `l2_prefetch_rows`, a hint)
EARLY_READS = {
    "cache_lens", "q_offsets", "batch", "mask_param", "num_partitions", "K_off", "V_off",
    "K_lut", "stride_klut", "V_lut", "stride_vlut", "k_page_stride", "v_page_stride", "K", "V",
    "stride_kh", "stride_vh", "stride_kr", "stride_vr",
}  # fmt: skip


def _first_statement(kernel) -> ast.stmt:
    fn = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn))).body[0]
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return body[0]


def _is_wait(stmt, flag) -> bool:
    return isinstance(stmt, ast.Expr) and ast.unparse(stmt.value) == f"pdl_wait({flag})"


@pytest.mark.parametrize("name", sorted(CHAIN))
def test_chain_kernels_wait_first(name):
    kernel, flag = CHAIN[name]
    params = inspect.signature(kernel.fn).parameters
    assert flag in params and params[flag].default is False  # off unless the launch asks
    first = _first_statement(kernel)
    if name == "mha decode":  # without EARLY the wait is first (EARLY: the test below)
        assert ast.unparse(first.test) == "not EARLY" and _is_wait(first.body[0], flag)
        return
    assert _is_wait(first, flag), (name, ast.unparse(first))


def test_decode_reads_only_inputs_before_its_early_wait():
    """With EARLY the decode's statements before its wait (the plan's branch aside, which
    waits first) read only the launch's inputs (EARLY_READS) and store nothing."""
    fn = ast.parse(textwrap.dedent(inspect.getsource(TD._mha_decode_kernel.fn))).body[0]
    params = {  # the tensors and run-time ints (constexprs aside)
        n for n, p in inspect.signature(TD._mha_decode_kernel.fn).parameters.items()
        if "constexpr" not in str(p.annotation)
    }  # fmt: skip
    before = []
    for stmt in fn.body[1:]:  # (the docstring)
        if isinstance(stmt, ast.If) and ast.unparse(stmt.test) == "EARLY":
            assert any(_is_wait(s, "PDL_WAIT") for s in stmt.body)
            before.extend(s for s in stmt.body if not _is_wait(s, "PDL_WAIT"))
            break
        head = ast.unparse(stmt.body[0]) if isinstance(stmt, ast.If) else ""
        if ast.unparse(stmt).startswith("if PLAN:") and head.startswith("tl.static_assert("):
            # the plan (the planner launch's output) is read after the wait: never EARLY
            assert head.startswith("tl.static_assert(not EARLY")
            before.extend(stmt.orelse)
            continue
        before.append(stmt)
    else:
        raise AssertionError("no `if EARLY:` block holding the wait")
    names = {n.id for s in before for n in ast.walk(s) if isinstance(n, ast.Name)}
    assert names & params <= EARLY_READS, (names & params) - EARLY_READS
    calls = {ast.unparse(n.func) for s in before for n in ast.walk(s) if isinstance(n, ast.Call)}
    assert not {c for c in calls if "store" in c or "atomic" in c}, calls


def test_chain_kwargs_are_empty_off_cuda_and_when_turned_off(monkeypatch):
    monkeypatch.delenv("PAGEDATTN_PDL", raising=False)
    assert pdl.pdl_chain_kwargs(torch.zeros(1)) == {}
    monkeypatch.setenv("PAGEDATTN_PDL", "0")
    assert pdl.pdl_chain_kwargs(torch.zeros(1)) == {}


@pytest.mark.gpu
def test_chain_kwargs_on_sm90_by_default(monkeypatch):
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("needs an sm_90 CUDA device")
    monkeypatch.delenv("PAGEDATTN_PDL", raising=False)
    t = torch.zeros(1, device="cuda")
    assert pdl.pdl_chain_kwargs(t) == {"PDL": True, "launch_pdl": True}
    monkeypatch.setenv("PAGEDATTN_PDL", "0")
    assert pdl.pdl_chain_kwargs(t) == {}
