// The .fgraph text form: printing and parsing IR graphs.
#pragma once

#include "fpat/ir/Graph.h"
#include "fpat/support/Diagnostics.h"

#include <cstdint>
#include <map>
#include <optional>
#include <string>

namespace fpat::ir {

/// Prints `g` in the .fgraph form; `parseGraph(printGraph(g))` gives back an identical graph.
std::string printGraph(const Graph& g);

/// Parses buffer `fileId` of the diagnostics' source manager. Every syntax and semantic error
/// is reported to `diags`; returns nullopt when there was any. `dims` sizes the named
/// dimensions of tensor types (`f16[T, 4096]`); names it does not use are ignored, as ONNX
/// symbolic dimensions' are.
std::optional<Graph> parseGraph(int fileId, DiagEngine& diags,
                                const ActivationSet& acts = ActivationSet::builtin(),
                                const std::map<std::string, int64_t>& dims = {});

} // namespace fpat::ir
