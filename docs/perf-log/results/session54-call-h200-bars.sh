#!/bin/bash
# Usage (device tool, from the checkout, build staged: scripts/stage-gpu-build.sh build build-gpu):
#   run "bash docs/perf-log/results/session54-call-h200-bars.sh", carry ["build-gpu"]; ANY_GPU=1 runs it on an H100 too
# session 54, call 1: issue 41's and 38's bars on whatever GPU comes (H200 wanted)
here=$PWD
mkdir -p /work 2>/dev/null; [ -e /work/main ] || ln -sfn "$here" /work/main
ln -sfn build-gpu build
cd /work/main/build
L=${LIMIT:-570}; t0=$(date +%s)
left() { echo $(( L - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
grep -q H200 $OUT/gpu.txt || [ -n "$ANY_GPU" ] || { echo "not an H200: stopped" >> $OUT/progress.txt; exit 0; }
nvcc -arch=sm_90 -O3 -o /tmp/readbw ../docs/perf-log/results/readbw.cu && timeout 60 /tmp/readbw > $OUT/a_readbw.log 2>&1
echo "after readbw: $(left)" >> $OUT/progress.txt
timeout 150 ./bench/fpat-bench-attn --no-prefill --cache --reps 50 --csv $OUT/b_decode.csv > $OUT/b_decode.log 2>&1; echo "rc $?" >> $OUT/b_decode.log
echo "after decode: $(left)" >> $OUT/progress.txt
timeout 120 python3 ../bench/torch_attn.py --d 128 > $OUT/c_torch_attn.log 2>&1; echo "rc $?" >> $OUT/c_torch_attn.log
echo "after torch: $(left)" >> $OUT/progress.txt
timeout 130 ./bench/fpat-bench-attn --no-decode --d 128 --csv $OUT/d_prefill.csv > $OUT/d_prefill.log 2>&1; echo "rc $?" >> $OUT/d_prefill.log
echo "after prefill: $(left)" >> $OUT/progress.txt
[ $(left) -gt 60 ] && { timeout $(( $(left) - 15 )) ./bench/fpat-bench-gemm --only gemm,rmsnorm_gemm,layernorm_gemm --no-ffn --candidates 1 --rounds 3 --csv $OUT/e_norms.csv --svg /dev/null > $OUT/e_norms.log 2>&1; echo "rc $?" >> $OUT/e_norms.log; }
echo "end: $(left)" >> $OUT/progress.txt
