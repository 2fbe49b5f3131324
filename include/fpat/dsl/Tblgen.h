// fpat-tblgen as a library: the tool's main only parses options and calls runTblgen.
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <vector>

namespace fpat::dsl {

struct ActivationDef;

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
  /// --gen-epilogues: lowers the activations of `input` to CUDA (codegen's
  /// emitEpilogueFunctions; the language itself knows no CUDA). Unset: that action fails.
  std::function<std::string(const std::vector<ActivationDef>&, const std::string& input)>
      genEpilogues;
  int errorLimit = 50;
};

/// Returns the exit code: 0 on success, 1 on errors in the input or when writing.
int runTblgen(const TblgenOptions& opts, std::ostream& out, std::ostream& err);

} // namespace fpat::dsl
