// The built-in matcher table, generated at build time by fpat-tblgen from patterns/all.fpat.
#include "fpat/match/Match.h"

namespace {
#include "BuiltinMatcherTable.inc"
} // namespace

namespace fpat::match {

const dsl::MatcherTable& builtinTable() {
  static const dsl::MatcherTable table = fpatBuiltinMatcherTable();
  return table;
}

} // namespace fpat::match
