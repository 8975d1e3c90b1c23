#!/usr/bin/env bash
# Device call: the blockwise-FP8 MLA fault repro (fixed in _tile_keys) and the GPU grid of the
# blockwise formats at h_q 20 and 128 (tl kernel, both tile shapes). Results under $OUT.
set -uo pipefail
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
for a in "g64 1" "g64 0"; do
    CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 bench/gpu_debug_mla_fp8.py $a 2>&1 | tail -2
done
timeout 280 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_triton_mla.py \
    -k "(fp8_g64 or fp8_g128 or fp8_g192) and (-20] or -128])" 2>&1 \
    | tee "$OUT/gpu_tests_blockwise.log" | grep -E "passed|failed|FAILED|Error|assert" | tail -20
