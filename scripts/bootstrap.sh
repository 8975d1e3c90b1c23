#!/usr/bin/env bash
# Creates the virtual environment that `make demo` and `make test` use.
# - A machine whose python3 already has a CUDA build of torch (the GPU machines) reuses it
#   through --system-site-packages and installs pagedattn without touching torch.
# - Anywhere else, torch==2.13.0 (the CPU wheel) is installed first, so that pip never pulls
#   the multi-gigabyte CUDA build.
set -euo pipefail
PY=${1:-python3}
VENV=${2:-.venv}
if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    "$PY" -m venv --system-site-packages "$VENV"
    "$VENV/bin/python" -m pip install -q --no-deps --no-build-isolation -e .
    exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q -e ".[test,bench]" pytest-xdist
