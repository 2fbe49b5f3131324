#include "ir/text/Text.h"

#include <sstream>

namespace fpat::ir {

std::string printGraph(const Graph& g) {
  std::ostringstream os;
  os << "graph " << g.name() << " {\n";
  // Creation order is a valid topological order for anything built by the builder or
  // parser; fall back to a sort for graphs assembled by hand.
  std::vector<Vertex> order = g.vertices();
  if (auto topo = topologicalOrder(g)) {
    bool creationOk = true;
    for (Vertex v : order)
      for (Vertex u : g.operands(v))
        creationOk = creationOk && u < v;
    if (!creationOk)
      order = *topo;
  }
  for (Vertex v : order) {
    const Op& op = g.op(v);
    os << "  %" << op.name << " = " << opKindName(op.kind);
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
