// Row sampling for the CPU reference. In a row-wise graph, every value either carries the rows
// of the token dimension (activations: GEMM A operands, norm inputs, elementwise operands of the
// output's shape) or is read whole (weights: GEMM B operands, biases, norm scales), so output
// row i depends only on row i of the row-carrying inputs. The reference can then compute a few
// rows of a real-size block instead of all of them, and still be exact for those rows.
#pragma once

#include "fpat/ir/Reference.h"

#include <optional>
#include <set>

namespace fpat::ir {

struct RowSample {
  int64_t rows = 0;            // M: the row count of every row-carrying value
  std::vector<int64_t> picked; // the sampled rows, ascending, first and last included
  Graph graph;                 // the graph with M replaced by picked.size()
  std::set<Vertex> carrying;   // the row-carrying values (the same vertices in both graphs)
};

/// `count` evenly spaced rows of `g` (all of them when M <= count), or nullopt with the reason
/// in `why` when the graph is not row-wise (a value needed both as rows and whole, outputs that
/// are not rows, or row-carrying values with different row counts).
std::optional<RowSample> sampleRows(const Graph& g, size_t count, std::string* why = nullptr);

/// The picked rows of each row-carrying input: with `inputs` for the others, the inputs of
/// `s.graph` (evaluate's `overrides`; weights are not copied).
std::map<std::string, Tensor> sliceInputs(const Graph& g, const RowSample& s,
                                          const std::map<std::string, Tensor>& inputs);

/// Rows `rows` of a row-major tensor with at least that many rows.
Tensor sliceRows(const Tensor& t, const std::vector<int64_t>& rows);

} // namespace fpat::ir
