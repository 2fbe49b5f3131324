// fpat-tblgen as a library: the tool's main only parses options and calls runTblgen.
#pragma once

#include <ostream>
#include <string>
#include <vector>

namespace fpat::dsl {

struct TblgenOptions {
  std::string input;
  std::vector<std::string> includeDirs;
  std::string output; // "" or "-": stdout
  std::string depfile;
  bool writeIfChanged = false;
  enum Action {
    PrintRecords,
    DumpJson,
    GenMatcherTable,
    GenEpilogues,
    PrintTable,
    Check // compile everything (matcher table included), write nothing
  } action = PrintRecords;
  std::vector<std::string> defines; // -D NAME
  std::string tableFunction = "fpatBuiltinMatcherTable";
  bool verifyDiagnostics = false;
  bool warningsAsErrors = false;
  int errorLimit = 50;
};

/// Returns the exit code: 0 on success, 1 on errors in the input or when writing.
int runTblgen(const TblgenOptions& opts, std::ostream& out, std::ostream& err);

} // namespace fpat::dsl
