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
