#!/bin/sh
# Regenerates the committed goldens of the built-in patterns after an intended change.
# Review the diff before committing it.
set -e
cd "$(dirname "$0")/.."
tblgen=${FPAT_BUILD_DIR:-build}/dsl/fpat-tblgen
"$tblgen" patterns/all.fpat --print-records > tests/golden/builtin/records.txt
"$tblgen" patterns/all.fpat --print-table > tests/golden/builtin/table.txt
"$tblgen" patterns/all.fpat --gen-epilogues > tests/golden/builtin/epilogues.cuh
git diff --stat tests/golden/builtin
