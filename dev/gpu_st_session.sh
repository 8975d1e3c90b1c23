#!/bin/bash
# One device session for the TMA-fed seesaw (gluon_mla_st) and its variants (gpu_mla_dev.py
# VARIANTS; $1 a comma list, default st; each timed beside $2, default ss): each
# variant's correctness checks and timings in a process of its own (a variant that faults
# cannot take the others down), the DRAM bytes and L2 hit rate of each (Nsight Compute,
# s_k 8192), then the GPU tests that reach the kernel. Run from the repo root on the GPU.
. bench/probe_env.sh >/dev/null 2>&1
export PYTHONPATH=$PWD/src:${PYTHONPATH:-}
vs=${1:-st}
for v in ${vs//,/ }; do
    timeout 150 python3 bench/gpu_mla_dev.py --checks st --ss-variants "$v" \
        --cases "dense bf16 h128" --variants "$v|${2:-ss}" --shared L2 --out "$OUT/$v" \
        > "$OUT/$v.log" 2>&1
    echo "== $v (rc $?)"; grep -v "^\[\|^{" "$OUT/$v.log" | tail -14
done
for v in ${vs//,/ }; do
    timeout 60 ncu --metrics dram__bytes_read.sum,lts__t_sector_hit_rate.pct,gpu__time_duration.sum \
        --kernel-name regex:_mla_decode_sm90_st --launch-skip 2 --launch-count 1 \
        python3 bench/gpu_mla_dev.py --once "$v" --cases "dense bf16 h128 8k" 2>&1 \
        | grep -E "dram__|lts__|gpu__time" | sed "s/^/$v /"
done
timeout 280 python3 -m pytest -q -n 14 -p no:cacheprovider tests/test_triton_mla.py \
    tests/test_compat_flash_mla.py -rf \
    -k "seesaw_tile_boundaries or (gpu_grid and bf16-576) or graph or (gpu and compat)" \
    2>&1 | tail -6
