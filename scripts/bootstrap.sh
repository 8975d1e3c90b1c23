#!/usr/bin/env bash
# Creates the virtual environment that `make demo` and `make test` use.
# - A machine whose python3 already has a CUDA build of torch (the GPU machines, which have no
#   network) reuses it: the new venv sees that interpreter's site-packages (through a .pth
#   file, which also works when python3 is itself a venv) and pagedattn is installed without
#   touching torch (src/ joins the path through the same .pth). PAGEDATTN_REUSE_TORCH=1
#   forces this path.
# - Anywhere else, torch==2.13.0 (the CPU wheel) is installed first, so that pip never pulls
#   the multi-gigabyte CUDA build.
set -euo pipefail
PY=${1:-python3}
VENV=${2:-.venv}
if [ "${PAGEDATTN_REUSE_TORCH:-0}" = 1 ] ||
    "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    sites=$("$PY" -c 'import site; print("\n".join(site.getsitepackages()))')
    "$PY" -m venv --system-site-packages "$VENV"
    purelib=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    # No network there and no build step needed: the .pth also puts this checkout's src/ on
    # the path (an editable install without pip).
    printf '%s\n' "$PWD/src" "$sites" > "$purelib/_host_site_packages.pth"
    exit 0
fi
"$PY" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip
"$VENV/bin/python" -m pip install -q "torch==2.13.0"
"$VENV/bin/python" -m pip install -q -e ".[test,bench]"
