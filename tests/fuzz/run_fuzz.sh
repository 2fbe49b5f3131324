#!/bin/sh
# Builds the .fpat front end with clang, libFuzzer, ASan and UBSan in a build tree of its own and
# fuzzes it for SECONDS. Exits 77 (ctest: skipped) when clang or its fuzzer runtime is missing.
# usage: run_fuzz.sh SOURCE_DIR WORK_DIR SECONDS
set -e
src=$1 work=$2 secs=${3:-60}
command -v clang++ >/dev/null 2>&1 || { echo "clang++ not found; skipped"; exit 77; }
printf 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }\n' \
  > /tmp/fpat_fuzz_probe.cpp
if ! clang++ -fsanitize=fuzzer /tmp/fpat_fuzz_probe.cpp -o /tmp/fpat_fuzz_probe 2>/dev/null; then
  echo "clang's libFuzzer runtime is missing (apt-get install libclang-rt-14-dev); skipped"
  exit 77
fi
mkdir -p "$work"
cmake -S "$src" -B "$work/build" -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DFPAT_FUZZ=ON -DBUILD_TESTING=OFF >"$work/configure.log" 2>&1 ||
  { cat "$work/configure.log"; exit 1; }
cmake --build "$work/build" --target fpat_fuzz -j "$(nproc)" >"$work/build.log" 2>&1 ||
  { tail -50 "$work/build.log"; exit 1; }
# Seed corpus: the built-in patterns and every golden .fpat file.
rm -rf "$work/corpus" && mkdir -p "$work/corpus"
for f in "$src"/patterns/*.fpat "$src"/tests/golden/fpat/*.fpat "$src"/tests/golden/records/*.fpat \
         "$src"/examples/custom_activation/*.fpat; do
  cp "$f" "$work/corpus/$(echo "$f" | tr '/' '_')"
done
cd "$work"
status=0
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  ./build/dsl/fpat_fuzz -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=4096 \
  -print_final_stats=1 corpus >fuzz.log 2>&1 || status=$?
tail -25 fuzz.log
ls crash-* leak-* timeout-* oom-* 2>/dev/null && { echo "fuzzer found a problem"; exit 1; }
exit $status
