#!/bin/sh
# The README's second command: install what is missing, build, and run every test.
set -e
FPAT_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$FPAT_ROOT/scripts/deps.sh"
fpat_install_deps
cd "$FPAT_ROOT"
fpat_build
cd "${FPAT_BUILD_DIR:-build}"
exec ctest --output-on-failure -j "$(nproc)" "$@"
