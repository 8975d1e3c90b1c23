#!/usr/bin/env bash
# Second device call: locate the MLA FP8 fault, H7's GPU tests, then the benchmark.
set -uo pipefail
. bench/probe_env.sh
export PYTHONUNBUFFERED=1
for a in "none 1" "tok 1" "g64 1" "g64 0" "g128e8 1"; do
    CUDA_LAUNCH_BLOCKING=1 timeout 60 python3 bench/gpu_debug_mla_fp8.py $a 2>&1 | tail -3
done
timeout 150 python3 -m pytest -q -m gpu -x -p no:cacheprovider tests/test_triton_fp8_bmm.py \
    tests/test_triton_branch.py tests/test_triton_mha.py tests/test_triton_store.py 2>&1 \
    | tee "$OUT/gpu_tests2.log" | grep -E "passed|failed|FAILED|Error" | tail -8
timeout 250 python3 bench/run_all.py --out "$OUT/results.json" 2>&1 | tee "$OUT/bench.log" \
    | grep -v "^\[bench\] {" | grep -v "^ \|^Traceback\|^Search\|^CUDA\|^For\|^Compile" | tail -30
