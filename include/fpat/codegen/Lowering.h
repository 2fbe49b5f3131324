// Helpers shared by the kernel families' code generators (internal to fpat_codegen).
#pragma once

#include "fpat/codegen/Codegen.h"

#include <map>
#include <optional>
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
                           const std::string& arg, const std::string& who, dsl::Activations defs,
                           ActivationCode& code, const std::string& fma = "");
void requireHalfPrecision(const ir::Graph& g, ir::Vertex v, int arch);
/// The comment block at the top of a generated file.
std::string header(const std::string& kernel, const CodegenOptions& o,
                   const std::vector<std::string>& lines);
std::string activationFunctions(const ActivationCode& code, dsl::Activations defs);

/// Every decision of the GEMM code generator for one op (planGemm), as data.
struct GemmPlan {
  KernelUnit unit;        // M, N, K, tile, name, what and the launch-relevant flags; no source yet
  std::string where;      // " [file:line]" of the pattern, or empty
  int normKind = 0;       // 0 none, 1 layernorm, 2 rmsnorm
  bool norm = false;      // the family normalises A (norm_gemm)
  bool dual = false;      // two GEMMs over one A (dual_gemm, norm_dual_gemm)
  bool deferNorm = false; // the norm applied in the wgmma epilogue (weights prepared)
  bool epiTile = false;   // the epilogue goes through the TMA-stored shared-memory tile
  int staged = -1;        // the [M, N] operand loaded into that tile (-1: none)
  bool side = false;      // the staged operand reaches the deferred epilogue in TMA boxes
  bool defer = false;     // the epilogue runs on the producer warpgroup's idle warps
  bool padK = false;      // K % 8 != 0: A (and B [N, K]) copied into padded rows first
  bool padB = false;      // B among those copies
  bool kMajorB = false;   // the wgmma kernel reads B as [N, K]
  int smemBytes = 0;      // the wgmma launch's dynamic shared memory
  size_t bIdx = 0;        // B's operand index
};
GemmPlan planGemm(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o);

/// GEMM families (src/families/gemm/): the GEMM template with the epilogue compiled from the
/// tree.
KernelUnit generateGemm(const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                        const CodegenOptions& o);
// Kernels of ops no family computes; `generate` picks the family's generator or one of these.
/// Row-wise norms (layernorm, rmsnorm) not fused into a GEMM.
KernelUnit generateRowwise(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o);
/// Elementwise ops (bias_add, activation, add, mul) not fused into a GEMM.
KernelUnit generateElementwise(const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                               const CodegenOptions& o);

/// Attention's ops not raised into a fused kernel: slice, attn_qk, attn_pv, and attention's
/// CUDA-core kernel (one warp per query row).
KernelUnit generateAttentionOp(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o);

/// What attention's bias operand is to the flash kernel: nothing the softmax sees (a scalar,
/// a tensor of zeros), a causal mask (a weight of 0 and <= -1e9 values, bottom-right
/// aligned, Sk >= Sq: recognised from its values, read no more), or a tensor read per score.
enum class FlashMask { None, Causal, Bias };
FlashMask flashMask(const ir::Graph& g, ir::Vertex bias, const ir::AttnShape& s);
/// Whether the flash-attention kernel (sm_90a) computes an attention of these sizes.
bool flashAttentionFits(const ir::AttnShape& s, int arch);
/// Whether the decode kernel takes it: at most 8 query rows per KV head (Sq times the query
/// heads sharing one).
bool flashDecodeFits(const ir::AttnShape& s);
/// The split-KV decode kernel and, with more than one split, its merge (fpat_flash.cuh);
/// `bias` holds the bias's strides over [B, H, Sq, Sk].
KernelUnit generateFlashDecode(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o,
                               const ir::AttnShape& s, const int64_t (&bias)[4], FlashMask mask);
/// The element strides of an operand of shape `s` over a rank-4 result it broadcasts to
/// (NumPy: trailing dimensions aligned; 0 where it repeats).
std::array<int64_t, 4> broadcastStrides(const std::vector<int64_t>& s);
/// The flash-attention kernel; `bias` holds the bias's strides over [B, H, Sq, Sk].
KernelUnit generateFlashAttention(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o,
                                  const ir::AttnShape& s, const int64_t (&bias)[4], FlashMask mask);
/// The flash kernel's configuration: `chosen` (the tuner's), else FPAT_FLASH's, else the
/// heuristic's; each made one the kernel implements at these sizes (fitted).
FlashConfig flashConfig(const ir::AttnShape& s, FlashMask mask, const FlashConfig* chosen);
FlashConfig fitted(FlashConfig f, const ir::AttnShape& s);
/// b2_h8_kv2_q333_k333_d128_causal: an attention's sizes and mask in kernel names.
std::string sizesName(const ir::AttnShape& s, FlashMask mask);
/// The same, and for a bias tensor its strides over [B, H, Sq, Sk]: the flash kernel's sizes.
std::string flashSizesName(const ir::AttnShape& s, FlashMask mask, const int64_t (&bias)[4]);
/// The row pitches (elements) of an attention's q, k and v buffers (ir::rowPitch: a column
/// view of a fused QKV projection is read in place), and "_p<q>_<k>_<v>" for kernel names whose
/// source holds them where one differs from its operand's width ("" where none does).
struct AttnPitches {
  int64_t q = 0, k = 0, v = 0;
  bool dense = true; // every pitch is its operand's width
  std::string suffix() const;
  /// The Dims members qPitch, kPitch and vPitch.
  std::string members() const;
};
AttnPitches attnPitches(const ir::Graph& g, ir::Vertex v);
/// FPAT_FLASH's configuration, or nullopt (unset, or not one: fpatc refuses those).
std::optional<FlashConfig> flashFromEnvironment();

/// A decode step's caches written by the decode kernel itself: attention's k and v are
/// kv_append results (head-major caches [B, Hkv, past + fresh, d]) that nothing else reads but
/// the graph's outputs, so the kernel reads the past rows and new tokens and writes the caches
/// as it goes; kv_append launches nothing (one read and one write of the cache, not two of each
/// and a read). For now only with FPAT_DECODE_APPEND=1: it has not yet run on a GPU.
struct DecodeAppend {
  ir::Vertex k = 0,
             v = 0; // the kv_append ops whose results hold K and V (one where one holds both)
  int64_t past = 0, fresh = 0;
  // Token-major caches [B*P, E] (kv_append {batch}: GPTBigCode's K and V side by side), K and V
  // column views of the result, their first columns kCol and vCol; else head-major, both 0.
  bool rows = false;
  int64_t kCol = 0, vCol = 0;
};
/// `whyNot`: where the attention runs on the decode kernel over caches but they are copied, why.
std::optional<DecodeAppend> decodeAppend(const ir::Graph& g, ir::Vertex attention,
                                         const CodegenOptions& o, std::string* whyNot = nullptr);
/// The attention whose decode kernel writes kv_append `v`'s result (decodeAppend), if one does;
/// else why a decode kernel reading it does not (`whyNot`, left alone where none reads it).
std::optional<ir::Vertex> appendedBy(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o,
                                     std::string* whyNot = nullptr);

} // namespace fpat::codegen::detail
