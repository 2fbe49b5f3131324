// Helpers shared by the kernel families' code generators (internal to fpat_codegen).
#pragma once

#include "fpat/codegen/Codegen.h"

#include <map>
#include <string>
#include <vector>

namespace fpat::codegen::detail {

std::string ref(const ir::Graph& g, ir::Vertex v);
std::string sanitize(const std::string& s);

/// Device functions of the activations an op uses, and their parameter values: each use of
/// an activation with its own parameters gets its own block of a.params[].
struct ActivationCode {
  std::vector<float> params;            // values for a.params[], in order of first use
  std::vector<std::string> fns;         // activations used, in order of first use
  std::map<std::string, int> paramBase; // "fn(values)" -> index of its first parameter
};

/// Registers one use of `fn` with the given parameters (the rest take their defaults) and
/// returns the CUDA call on `arg`. `fma`, where not empty, is the call's template argument kFma
/// ("true", or a name in scope): exp and division on the FMA pipe (fpat_common.cuh).
std::string callActivation(const std::string& fn, const std::map<std::string, double>& given,
                           const std::string& arg, const std::string& who,
                           const dsl::PatternLibrary& lib, ActivationCode& code,
                           const std::string& fma = "");
void requireHalfPrecision(const ir::Graph& g, ir::Vertex v, int arch);
/// The comment block at the top of a generated file.
std::string header(const std::string& kernel, const CodegenOptions& o,
                   const std::vector<std::string>& lines);
std::string activationFunctions(const ActivationCode& code, const dsl::PatternLibrary& lib);

// One code generator per kernel family; `generate` picks the one for the op.
/// GEMM families (gemm, norm_gemm): the GEMM template with the epilogue compiled from the tree.
KernelUnit generateGemm(const ir::Graph& g, ir::Vertex v, const dsl::PatternLibrary& lib,
                        const CodegenOptions& o, const ir::FamilyInfo& family);
/// Row-wise norms (layernorm, rmsnorm) not fused into a GEMM.
KernelUnit generateRowwise(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o);
/// Elementwise ops (bias_add, activation, add, mul) not fused into a GEMM.
KernelUnit generateElementwise(const ir::Graph& g, ir::Vertex v, const dsl::PatternLibrary& lib,
                               const CodegenOptions& o);

} // namespace fpat::codegen::detail
