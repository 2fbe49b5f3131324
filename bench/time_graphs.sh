#!/bin/sh
# `fpatc --time` (the fused graph against the same graph unfused, on the GPU) over:
#   blocks:   GPT-2's MLP (LayerNorm, GEMM + bias + GeLU, GEMM + bias + residual) at d 768 and
#             1600, Llama-7B's (RMSNorm, SwiGLU, GEMM + residual), weights as weights; and the
#             same Llama block with gamma and the gate/up weights given at run time (where the
#             cost model declines the norm's fusion), at each token count T;
#   examples: examples/*.fgraph as written;
#   onnx:     tests/onnx/models/*.onnx as exported, and the dynamic-axes exports at each T.
# Prints one line per graph: fused and unfused times (medians) and the speedup; each run's log
# is kept in WORK_DIR. Needs a GPU (fpatc exits 77 without one). Run from the source root.
# usage: bench/time_graphs.sh FPATC WORK_DIR [blocks|examples|onnx|all] [T ...]
#        (default: all, T = 1 7 333 4096)
set -e
fpatc=$1 work=$2
shift 2
what=all
case ${1:-} in blocks | examples | onnx | all) what=$1 && shift ;; esac
tokens=${*:-1 7 333 4096}
mkdir -p "$work"

block() { # name T hidden ffn gamma_kind
  name=$1 t=$2 h=$3 f=$4 g=$5
  case $name in
  gpt2*)
    cat <<EOT
graph $name {
  %x = input : f16[$t, $h]
  %ln_g = $g : f16[$h]
  %ln_b = $g : f16[$h]
  %w1 = $g : f16[$h, $f]
  %b1 = weight : f16[$f]
  %w2 = weight : f16[$f, $h]
  %b2 = weight : f16[$h]
  %n = layernorm %x, %ln_g, %ln_b {eps = 1e-05}
  %h = gemm %n, %w1
  %hb = bias_add %h, %b1
  %a = activation %hb {fn = gelu}
  %d = gemm %a, %w2
  %db = bias_add %d, %b2
  %y = add %db, %x
  output %y
}
EOT
    ;;
  *)
    cat <<EOT
graph $name {
  %x = input : f16[$t, $h]
  %g = $g : f16[$h]
  %wg = $g : f16[$h, $f]
  %wu = $g : f16[$h, $f]
  %wd = weight : f16[$f, $h]
  %n = rmsnorm %x, %g {eps = 1e-06}
  %gate = gemm %n, %wg
  %up = gemm %n, %wu
  %s = activation %gate {fn = silu}
  %m = mul %s, %up
  %d = gemm %m, %wd
  %y = add %d, %x
  output %y
}
EOT
    ;;
  esac
}

# timeit NAME T FILE [FPATC ARGS...]: one line of the table.
timeit() {
  name=$1 t=$2 file=$3
  shift 3
  log="$work/${name}_t$t.log"
  rc=0
  "$fpatc" --time --no-reference --no-graphviz --out-dir "$work/out" "$@" "$file" >"$log" 2>&1 || rc=$?
  [ $rc = 77 ] && { echo "no GPU: skipped"; exit 77; }
  fused=$(sed -n 's/^  fused: \([0-9]* kernels*\), \([0-9.]*\) ms.*/\2 (\1)/p' "$log")
  unfused=$(sed -n 's/^  unfused: \([0-9]* kernels*\), \([0-9.]*\) ms.*/\2 (\1)/p' "$log")
  speed=$(sed -n 's/^  speedup of fusion: \([0-9.]*x\).*/\1/p' "$log")
  printf '%-30s %6s %22s %22s %8s%s\n' "$name" "$t" "$fused" "$unfused" "$speed" \
    "$([ $rc = 0 ] || echo "  (exit $rc, see $log)")"
}

printf '%-30s %6s %22s %22s %8s\n' graph T fused_ms unfused_ms speedup
if [ $what = all ] || [ $what = blocks ]; then
  for t in $tokens; do
    for spec in "gpt2_mlp 768 3072 weight" "gpt2_xl_mlp 1600 6400 weight" \
      "llama7b_mlp 4096 11008 weight" "llama7b_mlp_inputs 4096 11008 input"; do
      set -- $spec
      block "$1" "$t" "$2" "$3" "$4" >"$work/$1_t$t.fgraph"
      timeit "$1" "$t" "$work/$1_t$t.fgraph"
    done
  done
fi
if [ $what = all ] || [ $what = examples ]; then
  for f in examples/*.fgraph; do
    timeit "$(basename "$f" .fgraph)" - "$f"
  done
fi
if [ $what = all ] || [ $what = onnx ]; then
  for f in tests/onnx/models/*.onnx; do
    case $f in
    *_dyn_*) for t in $tokens; do
      timeit "$(basename "$f" .onnx)" "$t" "$f" --dim batch=1 --dim seq="$t"
    done ;;
    *) timeit "$(basename "$f" .onnx)" 100 "$f" ;;
    esac
  done
fi
