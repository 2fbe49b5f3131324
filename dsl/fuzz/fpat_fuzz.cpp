// libFuzzer target over the whole .fpat front end: parse, sema, library, matcher table.
// Any input must produce diagnostics or a result, never a crash, hang, leak or UB report.
#include "fpat/codegen/Activations.h"
#include "fpat/dsl/Matcher.h"

#include <cstddef>
#include <cstdint>
#include <string>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fpat::SourceManager sm;
  // A path that does not exist: includes resolve only through the patterns directory.
  int id = sm.addBuffer("/nonexistent/fuzz.fpat",
                        std::string(reinterpret_cast<const char*>(data), size));
  fpat::DiagEngine diags(sm);
  diags.setErrorLimit(100);
  fpat::dsl::CompileOptions opts;
  opts.includeDirs = {FPAT_FUZZ_PATTERNS_DIR}; // so that seeds' includes reach the prelude
  auto c = fpat::dsl::compileFpat(id, sm, diags, opts);
  if (c) {
    fpat::dsl::MatcherTable t = fpat::dsl::compileMatcherTable(c->library, sm, diags);
    (void)fpat::dsl::emitMatcherTableInc(t, "fuzz", "f");
    (void)fpat::codegen::emitEpilogueFunctions(c->library.activations, "fuzz");
    (void)fpat::dsl::printRecords(*c->records);
    for (const auto& a : c->library.activations)
      (void)a.compiled.eval(0.5, a.paramDefaults.data());
  }
  for (const auto& d : diags.diagnostics())
    (void)diags.render(d);
  return 0;
}
