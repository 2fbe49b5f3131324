#!/bin/sh
# `fpatc --time` over transformer blocks at several token counts: GPT-2's MLP (LayerNorm, GEMM +
# bias + GeLU, GEMM + bias + residual) and Llama's (RMSNorm, SwiGLU, GEMM + residual), weights as
# weights; and the same Llama block with gamma and W1 given at run time (where the cost model
# declines the norm's fusion). Prints one line per graph: the fused and unfused times and the
# speedup. Needs a GPU (fpatc exits 77 without one).
# usage: bench/time_blocks.sh FPATC WORK_DIR [T ...]   (default T: 1 7 333 4096)
set -e
fpatc=$1 work=$2
shift 2
tokens=${*:-1 7 333 4096}
mkdir -p "$work"
block() { # name T hidden ffn gamma_kind
  name=$1 t=$2 h=$3 f=$4 g=$5
  case $name in
  gpt2*) cat <<EOT
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
  *) cat <<EOT
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
printf '%-28s %6s %10s %10s %8s\n' graph T fused_ms unfused_ms speedup
for t in $tokens; do
  for spec in "gpt2_mlp 768 3072 weight" "gpt2_xl_mlp 1600 6400 weight" \
              "llama7b_mlp 4096 11008 weight" "llama7b_mlp_inputs 4096 11008 input"; do
    set -- $spec
    file="$work/$1_t$t.fgraph"
    block "$1" "$t" "$2" "$3" "$4" >"$file"
    log="$work/$1_t$t.log"
    rc=0
    "$fpatc" --time --no-reference --no-graphviz --out-dir "$work/out" "$file" >"$log" 2>&1 || rc=$?
    [ $rc = 77 ] && { echo "no GPU: skipped"; exit 77; }
    fused=$(sed -n 's/^  fused: [0-9]* kernels*, \([0-9.]*\) ms.*/\1/p' "$log")
    unfused=$(sed -n 's/^  unfused: [0-9]* kernels*, \([0-9.]*\) ms.*/\1/p' "$log")
    speed=$(sed -n 's/^  speedup of fusion: \([0-9.]*x\).*/\1/p' "$log")
    printf '%-28s %6s %10s %10s %8s%s\n' "$1" "$t" "$fused" "$unfused" "$speed" \
      "$([ $rc = 0 ] || echo "  (exit $rc, see $log)")"
  done
done
