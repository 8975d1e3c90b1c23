"""Shared fixtures. GPU tests carry `@pytest.mark.gpu` and are skipped without CUDA."""

from __future__ import annotations

import os

import torch

# Without CUDA, Triton kernels run in the interpreter. The variable must be set before any
# module decorates a kernel (whichever test module xdist imports first), so set it here.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def gen() -> torch.Generator:
    """A fresh, randomly seeded generator (the seed is printed on failure)."""
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    print(f"seed={seed}")
    return torch.Generator().manual_seed(seed)
