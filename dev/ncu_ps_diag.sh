#!/usr/bin/env bash
# Where the persistent V32 kernel (gluon_mla_ps) waits longer than gluon_mla_ss: one Nsight
# Compute report a variant (sparse V32 b 128 s_q 2 h_q 128 top-k 2048, one launch, clocks left
# as found) with warp-state samples a SASS instruction (bench/ncu_profile.sh with HOT=30).
#   [VARIANTS="ss ss_ps_g256t ss_ps"] bash bench/ncu_ps_diag.sh
# Writes $OUT/<variant>.ncu-rep, <variant>_hot.txt (the digest) and <variant>.err (ncu's log).
set -u
. bench/probe_env.sh >/dev/null 2>&1
dir=${OUT:-/tmp}
for v in ${VARIANTS:-ss ss_ps_g256t ss_ps}; do
    HOT=30 timeout 240 bash bench/ncu_profile.sh "$v" "_mla_decode_sm90_(ss|ps)" \
        python3 bench/profile_mla.py sparse v32 128 2 8192 auto "$v" >"$dir/${v}_hot.txt" 2>&1
    head -60 "$dir/${v}_hot.txt"
done
