#!/bin/sh
# Copies what the GPU machine needs from a build tree (executables, ctest files, no objects or
# CPU-only test binaries, test outputs), stripped, into another directory: about 25 MB, not 80.
# usage: scripts/stage-gpu-build.sh [BUILD_DIR [DEST]]   (defaults: build, build-gpu)
set -e
src=${1:-build} dest=${2:-build-gpu}
[ -f "$src/CMakeCache.txt" ] || { echo "stage-gpu-build: '$src' is not a build tree" >&2; exit 1; }
rm -rf "$dest" && mkdir -p "$dest"
tar -C "$src" --exclude='*.o' --exclude='*.a' --exclude='CMakeFiles' --exclude='fuzz' \
  --exclude='test_codegen' --exclude='test_dsl' --exclude='test_ir' --exclude='test_match' \
  --exclude='test_reference' --exclude='test_support' --exclude='test_text' --exclude='test_tune' \
  --exclude='fpat-bench-fusion' --exclude='test_editors' --exclude='tests/consumer' \
  --exclude='tests/relocated' --exclude='tests/bf16-cache' --exclude='Testing' -cf - . |
  tar -C "$dest" -xf -
for f in src/fpatc tests/test_gpu tests/fpat-check bench/fpat-bench-gemm bench/fpat-bench-attn dsl/fpat-tblgen \
  examples/example_gemm_bias_gelu; do
  [ -f "$dest/$f" ] && strip "$dest/$f"
done
du -sh "$dest"
# Results name the commit the bench was built from; a build of uncommitted changes says
# "<hash>-dirty", which no later reader can reproduce.
commit=$(sed -n 's/.*FPAT_COMMIT "\(.*\)"/\1/p' "$src/bench/FpatCommit.h" 2>/dev/null)
case "$commit" in
*-dirty) echo "stage-gpu-build: warning: built from uncommitted changes ($commit): commit, rebuild, stage again before results that matter" >&2 ;;
esac
