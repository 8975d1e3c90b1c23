#!/usr/bin/env bash
# Sets up the GPU machine for benchmarks: FlashInfer from carried wheels (.whl), CUDA_HOME.
# Source it: `. dev/probe_env.sh` (the device machine has no network).
if ls .whl/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:${PYTHONPATH:-}
fi
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
if command -v nvcc >/dev/null 2>&1; then
    export CUDA_HOME=$(dirname "$(dirname "$(command -v nvcc)")")
fi
