// libFuzzer target over the .fgraph front end: any input gives diagnostics or a graph, never a
// crash, hang, leak or UB report; and every graph it accepts prints to text that parses back
// to the same text (the round-trip property of every --emit stage).
#include "fpat/ir/text/Text.h"

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>

namespace {

const fpat::ir::ActivationSet& activations() {
  static const fpat::ir::ActivationSet acts = [] {
    fpat::ir::ActivationSet a = fpat::ir::ActivationSet::builtin();
    a.add("leaky_relu", {"slope"}); // as patterns/activations.fpat declares it
    return a;
  }();
  return acts;
}

std::optional<fpat::ir::Graph> parse(const std::string& text) {
  fpat::SourceManager sm;
  int id = sm.addBuffer("fuzz.fgraph", text);
  fpat::DiagEngine diags(sm);
  diags.setErrorLimit(100);
  auto g = fpat::ir::parseGraph(id, diags, activations());
  for (const auto& d : diags.diagnostics())
    (void)diags.render(d);
  return g;
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto g = parse(std::string(reinterpret_cast<const char*>(data), size));
  if (!g)
    return 0;
  (void)fpat::ir::validate(*g, activations());
  const std::string printed = fpat::ir::printGraph(*g);
  auto again = parse(printed);
  if (!again || fpat::ir::printGraph(*again) != printed)
    std::abort(); // a printed graph must parse back to itself
  return 0;
}
