// fpat-tblgen: the pattern compiler. All the work is in the dsl library.
#include "fpat/codegen/Activations.h"
#include "fpat/dsl/Tblgen.h"
#include "fpat/support/CliError.h"

#include <CLI/CLI.hpp>
#include <iostream>

int main(int argc, char** argv) {
  using fpat::dsl::TblgenOptions;
  TblgenOptions opts;
  opts.genEpilogues = fpat::codegen::emitEpilogueFunctions;
  CLI::App app{"fpat-tblgen " FPAT_VERSION " - compile .fpat fusion patterns", "fpat-tblgen"};
  app.add_option("input", opts.input, "the .fpat file (- reads standard input)")->required();
  app.add_option("-I", opts.includeDirs, "directory searched by include \"...\"")
      ->allow_extra_args(false);
  app.add_option("-D", opts.defines,
                 "define NAME for the preprocessor (#ifdef NAME ... #else ... #endif)")
      ->allow_extra_args(false);
  app.add_option("-o", opts.output, "output file (default: stdout)");
  app.add_option("-d", opts.depfile, "write a make-style depfile of every file read");
  app.add_flag("--write-if-changed", opts.writeIfChanged, "leave outputs untouched when equal");
  auto* g = app.add_option_group("action", "what to generate (default --print-records)");
  g->add_flag_callback(
      "--print-records", [&] { opts.action = TblgenOptions::PrintRecords; },
      "print every class and def with its fields");
  g->add_flag_callback(
      "--dump-json", [&] { opts.action = TblgenOptions::DumpJson; }, "the records as JSON");
  g->add_flag_callback(
      "--gen-matcher-table", [&] { opts.action = TblgenOptions::GenMatcherTable; },
      "the matcher table as C++ (.inc)");
  g->add_flag_callback(
      "--gen-epilogues", [&] { opts.action = TblgenOptions::GenEpilogues; },
      "CUDA device functions lowered from the activation bodies");
  g->add_flag_callback(
      "--print-table", [&] { opts.action = TblgenOptions::PrintTable; },
      "a readable listing of the matcher byte code");
  g->add_flag_callback(
      "--check", [&] { opts.action = TblgenOptions::Check; },
      "only check: compile everything (the matcher table too) and report, write nothing");
  g->require_option(0, 1);
  app.add_option("--table-function", opts.tableFunction,
                 "name of the function --gen-matcher-table defines")
      ->capture_default_str();
  app.add_flag("--verify-diagnostics", opts.verifyDiagnostics,
               "check the file's expected-error comments instead of printing diagnostics");
  app.add_flag("--Werror", opts.warningsAsErrors, "treat warnings as errors");
  app.add_option("--error-limit", opts.errorLimit, "stop after this many errors (0: no limit)")
      ->capture_default_str();
  app.set_version_flag("--version", "fpat-tblgen " FPAT_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return fpat::reportCliError(app, e, argc, argv, "fpat-tblgen");
  }
  try {
    return fpat::dsl::runTblgen(opts, std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "fpat-tblgen: internal error: " << e.what() << "\n";
    return 70;
  }
}
