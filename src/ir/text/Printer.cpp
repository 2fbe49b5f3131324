#include "fpat/ir/text/Text.h"

#include <sstream>

namespace fpat::ir {

std::string printGraph(const Graph& g) {
  std::ostringstream os;
  os << "graph " << g.name() << " {\n";
  // Graphs with a cycle are printed in creation order; the validator reports the cycle.
  std::vector<Vertex> order = stableOrder(g).value_or(g.vertices());
  for (Vertex v : order) {
    const Op& op = g.op(v);
    os << "  %" << op.name << " = " << (op.weight ? "weight" : opKindName(op.kind));
    std::vector<Vertex> ins = g.operands(v);
    for (size_t i = 0; i < ins.size(); ++i)
      os << (i ? ", %" : " %") << g.op(ins[i]).name;
    std::string attrs = attrString(op);
    if (!attrs.empty())
      os << ' ' << attrs;
    os << " : " << op.type.str() << '\n';
  }
  if (!g.outputs().empty()) {
    os << "  output";
    for (size_t i = 0; i < g.outputs().size(); ++i)
      os << (i ? ", %" : " %") << g.op(g.outputs()[i]).name;
    os << '\n';
  }
  os << "}\n";
  return os.str();
}

} // namespace fpat::ir
