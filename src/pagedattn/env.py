"""The package's `PAGEDATTN_*` environment variables, read in one place (layer 0).

Each is read when it is used (so a test may set it for one call), through `read(name)`, which
knows every variable the package reads; docs/env.md lists them with the test harness's own.

- `PAGEDATTN_BACKEND` ("triton" or "reference"): every op's backend (`ops.dispatch`);
- `PAGEDATTN_PDL` ("0" turns it off): programmatic dependent launch, on by default on sm_90
  (`ops.pdl`);
- `PAGEDATTN_MLA_TUNING`, `PAGEDATTN_MHA_TUNING` (a JSON object): fields of the MLA / MHA
  launch config that a development run overrides (`tuning_overrides`);
- `PAGEDATTN_INTERPRET_OVERFLOW` ("1" turns them on): Triton's interpreter checks every int32
  +, -, * for overflow, as a compiled kernel does only in Triton's debug mode
  (`ops._triton_interpreter`).

`triton_interpreter()` reads Triton's own `TRITON_INTERPRET` the way the package uses it (the
kernels run in Triton's interpreter: CPU runs of the Triton path).
"""

from __future__ import annotations

import json
import os
from typing import Any

from .errors import InvalidArgumentError

VARIABLES = ("BACKEND", "PDL", "MLA_TUNING", "MHA_TUNING", "MOE_TUNING", "INTERPRET_OVERFLOW")
PREFIX = "PAGEDATTN_"


def read(name: str) -> str | None:
    """The value of `PAGEDATTN_<name>` (None when unset or empty); `name` one of VARIABLES."""
    if name not in VARIABLES:
        raise InvalidArgumentError(f"name: expected one of {VARIABLES}, got {name!r}")
    return os.environ.get(PREFIX + name) or None


def tuning_overrides(family: str) -> dict[str, Any]:
    """The launch-config fields that `PAGEDATTN_<family>_TUNING` (a JSON object) overrides, for
    development runs of a variant before it becomes the default; lists become tuples. {} when
    unset. A value that is not a JSON object raises InvalidArgumentError."""
    spec = read(f"{family}_TUNING")
    if spec is None:
        return {}
    try:
        knobs = json.loads(spec)
    except json.JSONDecodeError as e:
        raise InvalidArgumentError(
            f"{PREFIX}{family}_TUNING: expected a JSON object, got {spec!r} ({e})"
        ) from None
    if not isinstance(knobs, dict):
        raise InvalidArgumentError(f"{PREFIX}{family}_TUNING: expected a JSON object, got {spec!r}")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in knobs.items()}


def triton_interpreter() -> bool:
    """Whether `TRITON_INTERPRET` is "1": Triton runs the kernels in its interpreter (on a CPU;
    tests/conftest.py sets it without CUDA). Triton reads it when a kernel is decorated; the
    package asks at call time (`ops.dispatch`, `ops.pdl`, `ops._triton_interpreter`)."""
    return os.environ.get("TRITON_INTERPRET") == "1"
