#!/bin/sh
# Runs the GPU suite (small shapes) under compute-sanitizer TOOL; exits 77 (skipped) when the
# tool or a GPU is missing.
# usage: sanitize.sh memcheck|racecheck TEST_GPU [I/N] [SUITE ARGS...]
# I/N runs shard I of N: every N-th of the suite's test cases in listing order, from the I-th.
# Racecheck over the whole suite outgrew a 10-minute device call; a shard fits one, and a test
# case added to the suite lands in one of the shards.
tool=$1 suite=$2
shift 2 # the rest goes to the suite (e.g. --run_test=NAME)
shard=
case $1 in
*/*)
  shard=$1
  shift
  ;;
esac
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
[ -n "$cs" ] || { echo "compute-sanitizer not found; skipped"; exit 77; }
cases=$("$suite" --list_content 2>&1) || { echo "sanitize.sh: '$suite' cannot list its tests"; exit 1; }
FPAT_GPU_QUICK=1 "$suite" --run_test=device_is_described >/dev/null 2>&1
[ $? -eq 77 ] && { echo "no GPU; skipped"; exit 77; }
if [ -n "$shard" ]; then
  i=${shard%/*} n=${shard#*/}
  case "$i$n" in
  '' | *[!0-9]*) echo "sanitize.sh: shard '$shard' is not I/N"; exit 1 ;;
  esac
  [ "$i" -ge 1 ] && [ "$i" -le "$n" ] || { echo "sanitize.sh: shard '$shard' is not I/N with 1 <= I <= N"; exit 1; }
  # Top-level test cases print as "name*" (enabled).
  cases=$(printf '%s\n' "$cases" | sed -n 's/^\([A-Za-z0-9_]*\)\*$/\1/p' |
    awk -v i="$i" -v n="$n" 'NR >= i && (NR - i) % n == 0' | paste -sd, -)
  [ -n "$cases" ] || { echo "sanitize.sh: shard $shard of the suite holds no test case"; exit 1; }
  echo "shard $shard: $cases"
  set -- "--run_test=$cases" "$@"
fi
FPAT_GPU_QUICK=1 "$cs" --tool "$tool" --error-exitcode 3 --print-limit 20 "$suite" \
  --log_level=test_suite "$@"
