#!/bin/bash
# Session 54's device calls, not run (no GPU was lent): for the next session. With the build
# staged (scripts/stage-gpu-build.sh build build-gpu; keep bench/fpat-bench-gemm for "bars"),
# through the device tool: run "bash docs/perf-log/results/session54-gpu-calls.sh MODE", carry
# ["build-gpu"]. MODE append: the decode kernel writing kv_append's caches (correctness, the A/B,
# sanitizers); bars: issue 41's and 38's bars (stops at once unless on an H200 or ANY_GPU=1).
here=$PWD
mkdir -p /work 2>/dev/null; [ -e /work/main ] || ln -sfn "$here" /work/main
ln -sfn build-gpu build
cd /work/main/build
L=${LIMIT:-570}; t0=$(date +%s)
left() { echo $(( L - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1

append() {
  ( timeout 240 ./tests/test_gpu --run_test=attention_reads_a_kv_cache,attention_reads_a_token_major_cache --log_level=test_suite > $OUT/a_cache.log 2>&1; echo "rc $?" >> $OUT/a_cache.log ) &
  ( FPAT_DECODE_APPEND=1 timeout 240 ctest -FS onnx_made -L gpu -R "_kv_|kvpad|llama3_8b|attention23_kv" -j3 --output-on-failure > $OUT/b_kv_ctest.log 2>&1 ) &
  wait
  echo "after A,B: $(left) s left" >> $OUT/progress.txt
  for p in 65535 16383 4095; do
    for ap in 1 0; do
      [ $(left) -gt 150 ] || break
      FPAT_DECODE_APPEND=$ap timeout 60 ./src/fpatc --time --no-graphviz --dim P=$p ../examples/models/llama3_8b_decode.fgraph > $OUT/c_p${p}_append$ap.log 2>&1; echo "rc $?" >> $OUT/c_p${p}_append$ap.log
    done
  done
  echo "after C: $(left) s left" >> $OUT/progress.txt
  [ $(left) -gt 150 ] && timeout 140 ./bench/fpat-bench-attn --no-prefill --append --reps 30 --csv $OUT/e_steps.csv > $OUT/e_steps.log 2>&1; echo "rc $?" >> $OUT/e_steps.log
  [ $(left) -gt 60 ] && FPAT_DECODE_APPEND=1 timeout $(( $(left) - 10 )) ctest -R "gpu.sanitizer.attention" --output-on-failure > $OUT/d_san.log 2>&1
}

bars() {
  grep -q H200 $OUT/gpu.txt || [ -n "$ANY_GPU" ] || { echo "not an H200: stopped" >> $OUT/progress.txt; return; }
  nvcc -arch=sm_90 -O3 -o /tmp/readbw ../docs/perf-log/results/readbw.cu && timeout 60 /tmp/readbw > $OUT/a_readbw.log 2>&1
  echo "after readbw: $(left)" >> $OUT/progress.txt
  timeout 150 ./bench/fpat-bench-attn --no-prefill --cache --reps 50 --csv $OUT/b_decode.csv > $OUT/b_decode.log 2>&1; echo "rc $?" >> $OUT/b_decode.log
  echo "after decode: $(left)" >> $OUT/progress.txt
  timeout 120 python3 ../bench/torch_attn.py --d 128 > $OUT/c_torch_attn.log 2>&1; echo "rc $?" >> $OUT/c_torch_attn.log
  echo "after torch: $(left)" >> $OUT/progress.txt
  timeout 130 ./bench/fpat-bench-attn --no-decode --d 128 --csv $OUT/d_prefill.csv > $OUT/d_prefill.log 2>&1; echo "rc $?" >> $OUT/d_prefill.log
  echo "after prefill: $(left)" >> $OUT/progress.txt
  [ $(left) -gt 60 ] && { timeout $(( $(left) - 15 )) ./bench/fpat-bench-gemm --only gemm,rmsnorm_gemm,layernorm_gemm --no-ffn --candidates 1 --rounds 3 --csv $OUT/e_norms.csv --svg /dev/null > $OUT/e_norms.log 2>&1; echo "rc $?" >> $OUT/e_norms.log; }
}

case "$1" in
append) append ;;
bars) bars ;;
*) echo "usage: session54-gpu-calls.sh append|bars" >&2; exit 2 ;;
esac
echo "end: $(left) s left" >> $OUT/progress.txt
