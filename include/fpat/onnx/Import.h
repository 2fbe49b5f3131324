// The ONNX front end: a model as exporters write it (torch.onnx.export, opsets 13 and later)
// read into the IR. Initializers become weights with their values (scalars become constants);
// tensors of rank 3 and more are flattened to [rows, last dimension], which is exact for the
// row-wise ops an MLP block holds; shape-only ops (Reshape, Squeeze, Cast, ...) that keep the
// last dimension are dropped. What cannot be imported is reported, node by node.
#pragma once

#include "fpat/ir/Graph.h"

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace fpat::onnx {

struct ImportOptions {
  /// The element type every tensor gets; empty: as the model stores it (f32 or f16).
  std::optional<ir::DType> precision;
  /// Values of symbolic dimensions (`dim_param`), e.g. {"batch": 2, "seq": 128}.
  std::map<std::string, int64_t> dims;
  /// The folder of the model file, where its external data files are (models over 2 GB keep
  /// their weights there); empty: external data is an error (a model from standard input).
  std::string modelDir;
};

/// One problem found while importing, tied to the node it concerns (when there is one).
struct ImportProblem {
  std::string node;   // the node's name (or its first output's, for unnamed nodes)
  std::string opType; // the node's op type
  std::string message;
};

struct ImportResult {
  std::optional<ir::Graph> graph;      // set when there were no problems
  std::vector<ImportProblem> problems; // errors, in node order
  std::vector<std::string> notes;      // what the import did that a user should know
  ir::DType storedAs = ir::DType::F32; // the model's own element type
  int64_t opset = 0;                   // of the default domain
  // Graph inputs and outputs whose names fpat changed to make them value names (sanitised or
  // made unique): value name -> the name as the model writes it (--inputs and --outputs files
  // go by the model's names).
  std::map<std::string, std::string> sourceNames;
};

/// Reads a serialized ModelProto. Never throws for bad input: a truncated, malformed or
/// unsupported model gives problems instead.
ImportResult importModel(const std::string& bytes, const ImportOptions& opts,
                         const ir::ActivationSet& acts);

/// `g` with every value of type `t`, weights rounded to it (constants keep their exact value,
/// the reference rounds them where they are used; one beyond t's range becomes its largest
/// finite value of that sign). An f32 model imported once gives both the
/// model as exported and the graph that runs in half precision.
ir::Graph convertPrecision(const ir::Graph& g, ir::DType t);

/// Whether `bytes` looks like an ONNX model rather than .fgraph text (by its first bytes).
bool looksLikeOnnx(const std::string& path, const std::string& bytes);

/// The node op types the importer understands, for messages and documentation.
const std::vector<std::string>& supportedOpTypes();

} // namespace fpat::onnx
