#!/bin/sh
# Exits 77 (ctest: skipped) when no NVIDIA driver or GPU is present; otherwise requires that
# nvidia-smi lists at least one GPU.
if ! command -v nvidia-smi >/dev/null 2>&1; then
  echo "no nvidia-smi: no GPU driver on this machine; skipped"
  exit 77
fi
out=$(nvidia-smi -L 2>&1) || { echo "nvidia-smi found no device: $out; skipped"; exit 77; }
echo "$out"
echo "$out" | grep -q "^GPU [0-9]*:" || { echo "nvidia-smi listed no GPU"; exit 1; }
