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


def _first_statement(kernel) -> ast.stmt:
    fn = ast.parse(textwrap.dedent(inspect.getsource(kernel.fn))).body[0]
    body = fn.body
    if isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    return body[0]


@pytest.mark.parametrize("name", sorted(CHAIN))
def test_chain_kernels_wait_first(name):
    kernel, flag = CHAIN[name]
    params = inspect.signature(kernel.fn).parameters
    assert flag in params and params[flag].default is False  # off unless the launch asks
    first = _first_statement(kernel)
    call = first.value if isinstance(first, ast.Expr) else None
    assert isinstance(call, ast.Call) and ast.unparse(call) == f"pdl_wait({flag})", (
        name,
        ast.unparse(first),
    )


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
