#!/bin/sh
# Runs fpatc on GRAPH under compute-sanitizer TOOL (memcheck, racecheck): every kernel of the
# graph, one launch each; fails on any report. Exits 77 (skipped) without the tool or a GPU.
# usage: sanitize_fpatc.sh memcheck|racecheck FPATC GRAPH
tool=$1 fpatc=$2 graph=$3
cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
[ -n "$cs" ] || { echo "compute-sanitizer not found; skipped"; exit 77; }
"$fpatc" --require-gpu --no-graphviz "$graph" >/dev/null 2>&1 # compiles; says if a GPU is there
rc=$?
[ $rc -eq 77 ] && { echo "no GPU; skipped"; exit 77; }
[ $rc -eq 0 ] || { echo "sanitize_fpatc.sh: fpatc failed on $graph (exit $rc) without the tool"; exit 1; }
exec "$cs" --tool "$tool" --error-exitcode 1 "$fpatc" --require-gpu --no-graphviz "$graph"
