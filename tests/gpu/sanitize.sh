#!/bin/sh
# Runs the GPU suite (small shapes) under compute-sanitizer TOOL; exits 77 (skipped) when the
# tool or a GPU is missing. usage: sanitize.sh memcheck|racecheck TEST_GPU [SUITE ARGS...]
tool=$1 suite=$2
shift 2 # the rest goes to the suite (e.g. --run_test=NAME)
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
[ -n "$cs" ] || { echo "compute-sanitizer not found; skipped"; exit 77; }
"$suite" --list_content >/dev/null 2>&1
FPAT_GPU_QUICK=1 "$suite" --run_test=device_is_described >/dev/null 2>&1
[ $? -eq 77 ] && { echo "no GPU; skipped"; exit 77; }
FPAT_GPU_QUICK=1 "$cs" --tool "$tool" --error-exitcode 3 --print-limit 20 "$suite" \
  --log_level=test_suite "$@"
