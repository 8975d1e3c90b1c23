"""Fixtures' bodies shared by the prepared-call tests (test_prepared_launch for `mha`,
test_prepared_mla for `mla_decode`): each test module passes its op's Triton module (with
`PREPARED` and `_full_path`)."""

from __future__ import annotations

from pagedattn.ops import prepared as PR


def fresh_prepared(module):
    """An empty prepared-call cache and no workspaces around a test (a generator fixture body)."""
    module.PREPARED.cache.clear()
    PR.release_workspaces()
    yield
    module.PREPARED.cache.clear()


def count_full_paths(monkeypatch, module) -> list:
    """A list that grows by one per full-path run (a miss or an unprepared call) of the op."""
    calls = []
    inner = module._full_path

    def counted(*a, **kw):
        calls.append(1)
        return inner(*a, **kw)

    monkeypatch.setattr(module, "_full_path", counted)
    return calls


# --------------------------------------------------------------------------------------------
# The compiled form of a prepared call, checked on any machine (its C launcher a recorder)
# --------------------------------------------------------------------------------------------
def launch_types(kernel, values) -> list:
    """Triton's specialized types, as its binder writes them, of a launch's bound values."""
    import inspect

    import torch

    params = inspect.signature(kernel.fn).parameters.values()
    return ["constexpr" if "constexpr" in str(p.annotation)
            else "*" + str(v.dtype) if isinstance(v, torch.Tensor)
            else "fp32" if isinstance(v, float) else "i32"
            for p, v in zip(params, values)]  # fmt: skip


def bound_values(kernel, args, kwargs) -> list:
    """A launch's arguments in parameter order, defaults applied (the binder's values)."""
    import inspect

    sig = inspect.signature(kernel.fn)
    b = sig.bind(*args, **{k: x for k, x in kwargs.items() if k in sig.parameters})
    b.apply_defaults()
    return list(b.arguments.values())


class StubCompiled:
    """The parts of a CompiledKernel a generated launch reads."""

    function, packed_metadata, name = 11, (4, 1, 0), "stub"


def recording_build(seen: list):
    """A `PreparedLaunch.build` that makes the compiled form of a recorded (interpreted)
    launch whose C launcher appends its arguments to `seen`."""

    def build(rec, sources, descriptors=False):
        values = bound_values(rec.kernel, rec.args, rec.kwargs)
        return PR.PreparedLaunch.generated(
            values, launch_types(rec.kernel, values), sources, rec.grid, rec.kernel,
            StubCompiled, (lambda *a: seen.append(a), False, False),
        )  # fmt: skip

    return build


def assert_launched_as(seen: list, want: list, stream: int, pointer_of) -> None:
    """Each recorded C launch in `seen` has the grid, stream, function, metadata and bound
    values of the full path's launch in `want` (same order), pointers `pointer_of(tensor)`
    (None: the tensor's own data_ptr)."""
    import inspect

    import torch

    assert len(seen) == len(want)
    for a, m in zip(seen, want):
        grid = tuple(m.grid) + (1,) * (3 - len(m.grid))
        assert a[:3] == grid and a[3] == stream and a[4] == StubCompiled.function
        assert a[9] == StubCompiled.packed_metadata
        values = bound_values(m.kernel, m.args, m.kwargs)
        names = list(inspect.signature(m.kernel.fn).parameters)
        assert len(a) - 13 == len(values)
        for name, x, y in zip(names, a[13:], values):
            if not isinstance(y, torch.Tensor):
                assert x == y, name
            else:
                p = pointer_of(y)
                assert x == (y.data_ptr() if p is None else p), name
