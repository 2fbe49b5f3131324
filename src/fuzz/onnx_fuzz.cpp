// libFuzzer target over the ONNX front end: any bytes give import problems or a valid graph,
// never a crash, hang, leak or UB report; and an imported graph survives raising with the
// built-in Raise patterns, staying valid.
#include "fpat/dsl/Library.h"
#include "fpat/match/Match.h"
#include "fpat/onnx/Import.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace {

struct Builtins {
  fpat::SourceManager sm;
  fpat::DiagEngine diags{sm};
  fpat::dsl::PatternLibrary lib;
  fpat::dsl::MatcherTable raises;
};

const Builtins& builtins() {
  static const Builtins* b = [] {
    auto* x = new Builtins;
    auto c = fpat::dsl::compileBuiltinPatterns(x->sm, x->diags);
    if (!c)
      std::abort();
    x->lib = c->library;
    fpat::dsl::PatternLibrary r;
    r.patterns = x->lib.raises;
    x->raises = fpat::dsl::compileMatcherTable(r, x->sm, x->diags);
    return x;
  }();
  return *b;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const Builtins& b = builtins();
  fpat::onnx::ImportOptions opts;
  opts.dims = {{"batch", 2}, {"seq", 3}};
  auto r = fpat::onnx::importModel(std::string(reinterpret_cast<const char*>(data), size), opts,
                                   b.lib.activationSet());
  if (!r.graph)
    return 0;
  if (!fpat::ir::validate(*r.graph, b.lib.activationSet()).empty())
    std::abort(); // the importer promised a valid graph
  fpat::ir::Graph raised = fpat::match::raise(*r.graph, b.raises, b.lib);
  if (!fpat::ir::validate(raised, b.lib.activationSet()).empty())
    std::abort();
  return 0;
}
