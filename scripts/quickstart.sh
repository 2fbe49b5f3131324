#!/bin/sh
# The README's first command: install what is missing, build, and run the main job.
set -e
FPAT_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$FPAT_ROOT/scripts/deps.sh"
fpat_install_deps
cd "$FPAT_ROOT"
fpat_build
exec "${FPAT_BUILD_DIR:-build}/src/fpatc" examples/ffn_swiglu.fgraph "$@"
