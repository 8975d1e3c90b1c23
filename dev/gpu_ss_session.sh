#!/bin/bash
# One device session for the seesaw MLA kernel (gluon_mla_ss): its correctness checks, timings
# against the key-split kernel (CASES matching $1, default the h_q 128 ones; "none" skips
# them), then the MLA GPU tests that reach it. Run from the repo root on the GPU machine.
. bench/probe_env.sh >/dev/null 2>&1
timeout 300 python3 bench/gpu_mla_dev.py --checks ss --cases "${1:-h128}" --out "$OUT" 2>&1 \
    | grep -v "^\[" | tail -24
timeout 280 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_triton_mla.py \
    tests/test_compat_flash_mla.py -rf \
    -k "(gpu_grid and (bf16-576 or v32-576)) or graph or (gpu and compat)" \
    2>&1 | tail -8
