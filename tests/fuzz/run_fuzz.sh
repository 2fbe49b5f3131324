#!/bin/sh
# Builds a libFuzzer target with clang, ASan and UBSan in a build tree of its own and fuzzes it
# for SECONDS (or RUNS inputs). Exits 77 (ctest: skipped) when clang or its fuzzer runtime is
# missing. Targets: fpat_fuzz (the .fpat front end), fgraph_fuzz (the .fgraph front end and its
# print/parse round trip), fusion_fuzz (fusion over random graphs against the unfused graph),
# onnx_fuzz (ONNX import and raising).
# usage: run_fuzz.sh SOURCE_DIR WORK_DIR SECONDS [TARGET] [RUNS]
set -e
src=$1 work=$2 secs=${3:-60} target=${4:-fpat_fuzz} runs=${5:--1}
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
cmake --build "$work/build" --target "$target" -j "$(nproc)" >"$work/build-$target.log" 2>&1 ||
  { tail -50 "$work/build-$target.log"; exit 1; }
# Seed corpus: for the .fpat target the built-in patterns and every golden .fpat file; for the
# .fgraph target the examples and every golden .fgraph file; fusion starts from nothing (its
# input is a recipe of bytes, not text).
corpus="$work/corpus-$target"
rm -rf "$corpus" && mkdir -p "$corpus"
case $target in
fpat_fuzz) seeds="$src/patterns/*.fpat $src/tests/golden/fpat/*.fpat $src/tests/golden/records/*.fpat
                  $src/examples/custom_activation/*.fpat" ;;
fgraph_fuzz) seeds="$src/examples/*.fgraph $src/examples/*/*.fgraph $src/tests/golden/fgraph/*.fgraph
                    $src/tests/golden/explain/*.fgraph $src/tests/cli/inputs/*.fgraph" ;;
onnx_fuzz) seeds="$src/tests/onnx/models/*.onnx" ;;
*) seeds="" ;;
esac
for f in $seeds; do
  cp "$f" "$corpus/$(echo "$f" | tr '/' '_')"
done
bin=$(find "$work/build" -name "$target" -type f -perm -u+x | head -1)
rm -f "$work/$target"-crash-* "$work/$target"-leak-* "$work/$target"-timeout-* "$work/$target"-oom-*
cd "$work"
status=0
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
  "$bin" -max_total_time="$secs" -runs="$runs" -max_len=4096 -timeout=10 -rss_limit_mb=4096 \
  -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 -artifact_prefix="$work/$target-" \
  "$corpus" >"$target.log" 2>&1 || status=$?
tail -25 "$target.log"
# A finding fails the test: libFuzzer's own exit code for one is 77, which ctest would read as
# "skipped" (session 45's fgraph finding passed CI that way), and ls fails when any pattern is
# unmatched, so each artifact is looked for on its own.
found=0
for f in "$work/$target"-crash-* "$work/$target"-leak-* "$work/$target"-timeout-* \
  "$work/$target"-oom-*; do
  [ -e "$f" ] && { echo "fuzzer found a problem: $f"; found=1; }
done
[ $found -eq 0 ] || exit 1
[ $status -ne 77 ] || exit 1
exit $status
