#!/bin/sh
# The README's second command: install what is missing, build, and run the tests.
set -e
FPAT_ROOT=$(cd "$(dirname "$0")/.." && pwd)
. "$FPAT_ROOT/scripts/deps.sh"
fpat_install_deps
cd "$FPAT_ROOT"
fpat_build
cd "${FPAT_BUILD_DIR:-build}"
# Without arguments, every test but the long ones (label `long`: the fuzzers' campaigns and
# every wgmma tile shape through nvcc), which `.ci/run` adds; with arguments, what they say
# (e.g. `-L long`, `-L gpu`).
[ $# -gt 0 ] || set -- -LE long
exec ctest --output-on-failure -j "$(nproc)" "$@"
