#!/bin/bash
# Usage (device tool, from the checkout, build staged: scripts/stage-gpu-build.sh build build-gpu):
#   run "bash docs/perf-log/results/session54-call-decode-append.sh", carry ["build-gpu"]
# session 54's call 2 (not run: no GPU lent; for the next session): the decode kernel writing kv_append's caches: correctness, A/B, sanitizers
here=$PWD
mkdir -p /work 2>/dev/null; [ -e /work/main ] || ln -sfn "$here" /work/main
ln -sfn build-gpu build
cd /work/main/build
L=${LIMIT:-570}; t0=$(date +%s)
left() { echo $(( L - ($(date +%s) - t0) )); }
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version --format=csv > $OUT/gpu.txt 2>&1
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
echo "end: $(left) s left" >> $OUT/progress.txt
