// The .fgraph text form: printing and parsing IR graphs.
#pragma once

#include "fpat/ir/Graph.h"
#include "fpat/support/Diagnostics.h"

#include <optional>
#include <string>

namespace fpat::ir {

/// Prints `g` in the .fgraph form; `parseGraph(printGraph(g))` gives back an identical graph.
std::string printGraph(const Graph& g);

/// Parses buffer `fileId` of the diagnostics' source manager. Every syntax and semantic error
/// is reported to `diags`; returns nullopt when there was any.
std::optional<Graph> parseGraph(int fileId, DiagEngine& diags,
                                const ActivationSet& acts = ActivationSet::builtin());

} // namespace fpat::ir
