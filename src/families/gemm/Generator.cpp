// The GEMM families' code generator part (gemm, norm_gemm, dual_gemm, norm_dual_gemm): picks
// the backend (wgmma, mma.sync, WMMA) and configuration, and compiles the fused op's epilogue
// tree into the kernel's Epilogue functor.
#include "Gemm.h"
#include "fpat/codegen/Family.h"
#include "fpat/codegen/Lowering.h"

#include <algorithm>
#include <cstdlib>
#include <sstream>

namespace fpat::codegen::detail {

namespace {

/// The body of a fused op's epilogue functor: one named value per node of its tree, in
/// evaluation order. Operands of shape [N] are read at the column, [M, N] at (row, col).
std::string epilogueBody(const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                         ActivationCode& acts) {
  const ir::Op& op = g.op(v);
  const ir::Epilogue& e = op.fused.epilogue;
  if (op.kind != ir::OpKind::Fused || e.identity())
    return "    return v;\n";
  const std::vector<ir::Vertex> ins = g.operands(v);
  std::ostringstream os;
  auto name = [](int i) { return "t" + std::to_string(i); };
  for (size_t i = 0; i < e.nodes.size(); ++i) {
    const ir::EpilogueNode& n = e.nodes[i];
    os << "    const float " << name(static_cast<int>(i)) << " = ";
    switch (n.kind) {
    case ir::EpiKind::Acc:
      os << (n.operand == 1 ? "w; // acc2\n" : "v; // acc\n");
      break;
    case ir::EpiKind::Operand: {
      const bool vec = g.op(ins.at(static_cast<size_t>(n.operand))).type.rank() == 1;
      os << "fpat::ldh(a.in[" << n.operand << "], " << (vec ? "col" : "row * a.N + col")
         << "); // $" << n.operand << (vec ? " [N]" : " [M, N]") << "\n";
      break;
    }
    case ir::EpiKind::BiasAdd:
    case ir::EpiKind::Add:
    case ir::EpiKind::Mul:
      os << name(n.lhs) << (n.kind == ir::EpiKind::Mul ? " * " : " + ") << name(n.rhs) << "; // "
         << (n.kind == ir::EpiKind::BiasAdd ? "bias_add"
             : n.kind == ir::EpiKind::Add   ? "add"
                                            : "mul")
         << "\n";
      break;
    case ir::EpiKind::Activation:
      os << callActivation(n.fn, n.params, name(n.lhs), ref(g, v), defs, acts) << ";\n";
      break;
    case ir::EpiKind::Rope: // kPairs: the kernels call pair() instead
      os << name(n.lhs) << ";\n    __trap(); // rope reads a column's partner: pair() only\n";
      break;
    }
  }
  os << "    return " << name(static_cast<int>(e.nodes.size()) - 1) << ";\n";
  return os.str();
}

/// A rope node's pair form (ir::EpiKind::Rope): columns col, col + 1 rotated where they lie in
/// [begin, end), their tables' entries at row % R and (col - begin) % d; branch-free, the
/// tables read at entry 0 outside the range.
std::string ropePair(const ir::Graph& g, ir::Vertex v, const ir::EpilogueNode& n,
                     const std::string& t, const std::string& x) {
  const std::vector<ir::Vertex> ins = g.operands(v);
  const ir::TensorDesc& tab = g.op(ins.at(static_cast<size_t>(n.operand))).type;
  const int64_t rows = tab.shape[0], d = tab.shape[1], m = g.op(v).type.shape[0];
  const auto b = static_cast<int64_t>(n.params.at("begin"));
  const auto e = static_cast<int64_t>(n.params.at("end"));
  // Rows and columns fit in 32 bits (a 32-bit remainder is a few instructions, a 64-bit one a
  // call).
  const std::string c =
      b == 0 ? "static_cast<int>(col)" : "static_cast<int>(col - " + std::to_string(b) + ")";
  const int64_t head = n.params.count("head") ? static_cast<int64_t>(n.params.at("head")) : d;
  const std::string j = c + " % " + std::to_string(head);
  std::ostringstream os;
  os << "    // rope, interleaved: columns [" << b << ", " << e << "), tables $" << n.operand
     << ", $" << n.operand2 << " [" << rows << ", " << d << "]"
     << (head != d ? ", the first " + std::to_string(d) + " of each " + std::to_string(head)
                   : std::string())
     << "\n"
     << "    const bool " << t << "in = static_cast<unsigned>(" << c << ") < " << e - b << "u"
     << (head != d ? " && " + j + " < " + std::to_string(d) : std::string()) << ";\n"
     << "    const int64_t " << t << "at = " << t << "in ? "
     << (rows == m ? std::string("row")
                   : "static_cast<int64_t>(static_cast<int>(row) % " + std::to_string(rows) + ")")
     << " * " << d << " + " << j << " : 0;\n"
     << "    const float2 " << t << "c = fpat::ldh2(a.in[" << n.operand << "], " << t << "at), "
     << t << "s = fpat::ldh2(a.in[" << n.operand2 << "], " << t << "at);\n"
     << "    const float2 " << t << " = " << t << "in ? make_float2(" << x << ".x * " << t
     << "c.x - " << x << ".y * " << t << "s.x, " << x << ".y * " << t << "c.y + " << x << ".x * "
     << t << "s.y) : " << x << ";\n";
  return os.str();
}

/// The same epilogue on two adjacent columns (col even, N even): operands load as one
/// 4-byte pair, halving the epilogue's load instructions. Kernels that store f16 pairs call it.
/// Operand `staged` (-1: none) is the pair `s` the kernel read from shared memory.
std::string epiloguePairBody(const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                             ActivationCode& acts, int staged, int result = -1) {
  const ir::Op& op = g.op(v);
  const ir::Epilogue& e = op.fused.epilogue;
  if (op.kind != ir::OpKind::Fused || e.identity())
    return "    return v;\n";
  const std::vector<ir::Vertex> ins = g.operands(v);
  std::ostringstream os;
  auto name = [](int i) { return "t" + std::to_string(i); };
  // With `result` (head()): the nodes but the last, less those only the last one reads.
  std::vector<bool> wanted(e.nodes.size(), result < 0);
  if (result >= 0) {
    wanted[static_cast<size_t>(result)] = true;
    for (size_t i = e.nodes.size() - 1; i-- > 0;)
      if (wanted[i])
        for (int c : {e.nodes[i].lhs, e.nodes[i].rhs})
          if (c >= 0)
            wanted[static_cast<size_t>(c)] = true;
  }
  for (size_t i = 0; i < e.nodes.size(); ++i) {
    if (!wanted[i])
      continue;
    const ir::EpilogueNode& n = e.nodes[i];
    if (n.kind == ir::EpiKind::Rope) {
      os << ropePair(g, v, n, name(static_cast<int>(i)), name(n.lhs));
      continue;
    }
    os << "    const float2 " << name(static_cast<int>(i)) << " = ";
    switch (n.kind) {
    case ir::EpiKind::Acc:
      os << (n.operand == 1 ? "w;\n" : "v;\n");
      break;
    case ir::EpiKind::Operand: {
      const bool vec = g.op(ins.at(static_cast<size_t>(n.operand))).type.rank() == 1;
      if (n.operand == staged)
        os << "s; // $" << n.operand << " [M, N], staged in shared memory by TMA\n";
      else
        os << "fpat::ldh2(a.in[" << n.operand << "], " << (vec ? "col" : "row * a.N + col")
           << ");\n";
      break;
    }
    case ir::EpiKind::BiasAdd:
    case ir::EpiKind::Add:
    case ir::EpiKind::Mul: {
      const char* o = n.kind == ir::EpiKind::Mul ? " * " : " + ";
      os << "make_float2(" << name(n.lhs) << ".x" << o << name(n.rhs) << ".x, " << name(n.lhs)
         << ".y" << o << name(n.rhs) << ".y);\n";
      break;
    }
    case ir::EpiKind::Rope: // above
      break;
    case ir::EpiKind::Activation: // .y: exp and division on the FMA pipe where kFma
      os << "make_float2("
         << callActivation(n.fn, n.params, name(n.lhs) + ".x", ref(g, v), defs, acts) << ", "
         << callActivation(n.fn, n.params, name(n.lhs) + ".y", ref(g, v), defs, acts, "kFma")
         << ");\n";
      break;
    }
  }
  os << "    return " << name(result >= 0 ? result : static_cast<int>(e.nodes.size()) - 1) << ";\n";
  return os.str();
}

/// Where the epilogue's last node adds the staged operand (node `staged`'s value) to a value
/// computed from the others: that value's node, else -1. The kernel then adds the two in f16
/// (or bf16) pairs after rounding the value, as the unfused path's add does: one instruction
/// per pair where the f32 add needs four (bench/RESULTS.md, session 19).
int stagedAddend(const ir::Epilogue& e, const std::vector<ir::Vertex>& ins, const ir::Graph& g,
                 int staged) {
  if (staged < 0 || e.nodes.empty() || e.nodes.back().kind != ir::EpiKind::Add)
    return -1;
  const ir::EpilogueNode& last = e.nodes.back();
  auto isStaged = [&](int i) {
    const ir::EpilogueNode& n = e.nodes.at(static_cast<size_t>(i));
    return n.kind == ir::EpiKind::Operand && n.operand == staged &&
           g.op(ins.at(static_cast<size_t>(n.operand))).type.rank() == 2;
  };
  if (isStaged(last.rhs) && !isStaged(last.lhs))
    return last.lhs;
  if (isStaged(last.lhs) && !isStaged(last.rhs))
    return last.rhs;
  return -1;
}

/// The operand an epilogue tile kernel has TMA load into its tile: the first [M, N] one.
int stagedOperand(const ir::Graph& g, ir::Vertex v) {
  const ir::Op& op = g.op(v);
  if (op.kind != ir::OpKind::Fused)
    return -1;
  const std::vector<ir::Vertex> ins = g.operands(v);
  for (const ir::EpilogueNode& n : op.fused.epilogue.nodes)
    if (n.kind == ir::EpiKind::Operand &&
        g.op(ins.at(static_cast<size_t>(n.operand))).type.rank() == 2)
      return n.operand;
  return -1;
}

/// Whether fused op `op`'s epilogue applies an activation: the costly part of an epilogue, which
/// the producer warpgroup's idle warps take over where the result tile is staged.
bool appliesActivation(const ir::Op& op) {
  return op.kind == ir::OpKind::Fused &&
         std::any_of(op.fused.epilogue.nodes.begin(), op.fused.epilogue.nodes.end(),
                     [](const ir::EpilogueNode& n) { return n.kind == ir::EpiKind::Activation; });
}

/// A deferred norm's statistics form: FPAT_NORM_STATS's loop or launch, else a launch where the
/// statistics warps apply deferred epilogues instead (`helpersBusy`) or the rows are short
/// (K < 2048: GPT-2's layernorm_gemm_bias 2048 x 2304 x 768 took 0.0353 ms with the grid's
/// statistics, 0.0270 with a launch, equal at M = 333; session 48, H100), else the grid's.
NormStats deferredStatsForm(bool helpersBusy, int64_t k) {
  const std::optional<NormStats> asked = normStatsFromEnv();
  if (asked == NormStats::Loop)
    return NormStats::Loop;
  if (asked == NormStats::Grid)
    return helpersBusy ? NormStats::Launch : NormStats::Grid;
  return asked == NormStats::Launch || helpersBusy || k < 2048 ? NormStats::Launch
                                                               : NormStats::Grid;
}

} // namespace

/// Every decision of the GEMM code generator for one op, as data: configuration, fallback,
/// where the epilogue runs, the split, padding and prepared copies, the kernel's name and the
/// unit's launch-relevant fields. Emitting the source and the launches reads it.
GemmPlan planGemm(const ir::Graph& g, ir::Vertex v, const CodegenOptions& o) {
  const ir::Op& op = g.op(v);
  const ir::KernelFamily* family = ir::familyOf(op);
  if (!family)
    throw CodegenError(ref(g, v) + ": no GEMM family computes this op");
  const families::gemm::Kind kind = families::gemm::kindOf(family->family);
  KernelUnit u;
  const std::vector<ir::Vertex> ins = g.operands(v);
  const std::string arch = "sm" + std::to_string(o.arch);
  const std::string where = [&] {
    auto it = o.sources.find(op.fused.pattern);
    return it == o.sources.end() ? std::string() : " [" + it->second + "]";
  }();
  const bool norm = kind.normalisesA;
  const int normKind = !norm                          ? 0
                       : op.fused.norm == "layernorm" ? 1
                       : op.fused.norm == "rmsnorm"   ? 2
                                                      : -1;
  if (normKind < 0)
    throw CodegenError(ref(g, v) + ": norm_gemm without a norm kind");
  const size_t bIdx = ir::gemmBIndex(op);
  if (ins.size() < ir::mainOperandCount(op))
    throw CodegenError(ref(g, v) + ": too few operands for its kernel family");
  // The dual families: one wgmma GEMM over Bg and Bu interleaved (copied when the weights are
  // uploaded), its epilogue combining each gate column with its up column. Elsewhere the
  // driver splits such an op into two GEMMs first (match::lowerForArch).
  const bool dual = kind.gemms == 2;
  if (dual && (o.arch != 90 || normKind == 1 || !preparesWeightB(g, v)))
    throw CodegenError(
        ref(g, v) + ": family " + family->name + " " +
        (o.arch != 90 ? "runs on the Hopper backend (sm_90) only, not sm_" + std::to_string(o.arch)
         : normKind == 1
             ? std::string("defers RMSNorm only, not layernorm")
             : std::string("needs its B operands (and gamma) to be weights, interleaved once when "
                           "they are uploaded")) +
        "; split it into two GEMMs (fpatc does where this applies)");
  const ir::TensorDesc& A = g.op(ins[0]).type;
  u.M = op.type.shape[0];
  u.N = op.type.shape[1];
  u.K = A.shape[1];
  u.eps = static_cast<float>(op.eps);
  u.transB = op.transposeB;
  u.vec = vectorLoads(u.M, u.N, u.K, u.transB);
  u.family = family->name;
  u.dual = dual;
  // The deferred norm where the Hopper backend runs this op; the cp.async kernels normalise A
  // as they load it, after a statistics launch of their own (needsRowStats).
  const bool deferrable = norm && defersNorm(g, v);
  // The wgmma backend where it applies; otherwise (or when a forced configuration asks for
  // it where it cannot run) the cp.async backends, with the reason in the generated file.
  GemmProblem problem = gemmProblemOf(g, v);
  const bool tmaOk = problem.tma && o.arch == 90;
  u.epilogueReads = problem.epilogueReads;
  u.tile = o.tile ? *o.tile : defaultTile(problem, o.arch, o.sms);
  std::string fallback;
  if (u.tile.wgmma() && (!tmaOk || !u.tile.runsRows(u.M))) {
    fallback = "fallback: " + u.tile.str() + " cannot run here (" +
               (norm && !deferrable
                    ? std::string("norm_gemm defers its norm to a wgmma kernel only where W, "
                                  "gamma and beta are weights")
                : o.arch != 90          ? "wgmma needs sm_90, not sm_" + std::to_string(o.arch)
                : !u.tile.runsRows(u.M) ? "its A box of " + std::to_string(u.tile.aRows) +
                                              " rows cannot hold M = " + std::to_string(u.M)
                : u.N % 8 != 0 ? "TMA needs N % 8 == 0 for a B [K, N] that is not a weight, N is " +
                                     std::to_string(u.N)
                               : std::string("a dimension exceeds 2^31")) +
               ")";
    problem.tma = tmaOk;
    u.tile = defaultTile(problem, o.arch, o.sms);
  }
  if (dual && !u.tile.wgmma()) {
    fallback = "fallback: " + u.tile.str() +
               " cannot run here (the dual GEMM has a wgmma kernel "
               "only)";
    u.tile = defaultTile(problem, o.arch, o.sms);
  }
  const TileConfig& t = u.tile;
  u.sm90a = t.wgmma();
  const bool deferNorm = deferrable && t.wgmma();
  u.needsRowStats = norm && !deferNorm;
  u.deferredNorm = deferNorm ? ir::normKindOf(op) : ir::NormKind::None;
  // The dual GEMM stores from registers (its epilogue writes half of the tile's columns).
  const bool epiTile = !dual && wgmmaEpilogueTile(t, u.N);
  const int64_t gemmN = u.gemmColumns();
  // Activations are the costly part of an epilogue (MUFU operations while the tensor cores
  // wait): those epilogues are deferred to the producer warpgroup's idle warps. An [M, N]
  // operand then comes to the helpers by TMA through a side buffer, where it fits (their own
  // loads fell behind). Cheap epilogues stay with the consumers (bench/RESULTS.md, session 10).
  const int staged = epiTile ? stagedOperand(g, v) : -1;
  const bool side = staged >= 0 && wgmmaSideBox(t, u.N);
  const char* deferEnv = std::getenv("FPAT_EPILOGUE_DEFER"); // an experiment's knob: 0 keeps
                                                             // activations with the consumers
  const bool defer = epiTile && (staged < 0 || side) && appliesActivation(op) &&
                     !(deferEnv && std::string(deferEnv) == "0");
  const int smemBytes = gemmSmemBytes(t, u.transB) + (epiTile ? t.bm * t.bn * 2 : 0) +
                        (defer && side ? t.bm * 128 : 0);
  // The last wave split in k, compiled in only where it is planned for this shape on o.sms SMs:
  // its code cost the kernels 0.2-0.6% where nothing was split (bench/RESULTS.md, session 12).
  const LastWaveSplit split =
      t.backend == Backend::Wgmma && t.cluster == 1
          ? lastWaveSplit(((u.M + t.bm - 1) / t.bm) * ((gemmN + t.bn - 1) / t.bn), o.sms,
                          (u.K + t.bk - 1) / t.bk)
          : LastWaveSplit{};
  // The deferred norm's statistics: read by the producer warpgroup's idle warps of the whole
  // grid (each row once, from global memory, beside the main loop), or, where those warps
  // apply deferred epilogues or with FPAT_NORM_STATS=launch, from a launch before the GEMM,
  // which the GEMM overlaps. The grid's form measured +6-7% over the plain GEMM for RMSNorm
  // where the launch cost +8-29% (H100, bench/RESULTS.md session 45). FPAT_NORM_STATS=loop
  // sums them from the A tiles of the main loop instead: their shared-memory reads beside the
  // MMAs cost more (sessions 26, 37, 40).
  u.normStats = deferNorm ? deferredStatsForm(defer, u.K) : NormStats::None;
  const bool statsInLoop = u.normStats == NormStats::Loop;
  const bool statsInGrid = u.normStats == NormStats::Grid;
  // Statistics from the kernel itself need every tile whole (the grid's counters are in the
  // split's workspace argument).
  u.splitLastWave = split.tiles > 0 && !statsInLoop && !statsInGrid;
  if (statsInGrid)
    u.scratchBytes = static_cast<size_t>(2 + (u.M + t.bm - 1) / t.bm) * sizeof(unsigned);
  // K % 8 != 0: TMA reads padded copies of A (and B [N, K]) that a first launch writes. A weight
  // B that TMA reads badly as given is read from a copy in [N, K] rows made when it is uploaded.
  const bool padK = t.wgmma() && wgmmaPadsK(u.K);
  u.preparedB = t.wgmma() && preparesWeightB(g, v);
  const bool kMajorB = u.transB || u.preparedB; // how the wgmma kernel reads B
  const bool padB = padK && u.transB && !u.preparedB;

  const std::string base = op.kind == ir::OpKind::Fused ? sanitize(op.fused.pattern) : "gemm";
  // The name tells apart every source one configuration generates: wgmma kernels store through
  // the epilogue tile or not depending on N, and split the last wave or not by shape.
  const std::string cfg =
      t.str() + (u.transB ? "_bt" : "") +
      (t.wgmma()
           ? std::string(epiTile ? "_tilestore" : "") + (u.splitLastWave ? "_splitk" : "") +
                 (padK ? "_padk" : "") + (u.preparedB && !deferNorm && !dual ? "_bprep" : "") +
                 (statsInLoop   ? "_statsloop"
                  : statsInGrid ? "_statsgrid"
                                : "")
       : u.vec ? "_vec"
               : "_any");
  u.name = "fpat_" + base + "_" + (t.wgmma() ? std::string("sm90a") : arch) + "_" + cfg;
  // The fallback and the op's split plan are said in the log line, not in the source: the
  // source describes the kernel (every op that needs it shares one cubin, whatever its shape),
  // the log line the op.
  const int64_t tileCount = ((u.M + t.bm - 1) / t.bm) * ((gemmN + t.bn - 1) / t.bn);
  const std::string plan = u.splitLastWave ? (split.tiles == tileCount ? "all " : "the last ") +
                                                 std::to_string(split.tiles) + " tiles in " +
                                                 std::to_string(split.pieces) + " k-pieces on " +
                                                 std::to_string(o.sms) + " SMs"
                                           : std::string();
  u.what = ref(g, v) + " = " + (op.kind == ir::OpKind::Fused ? op.fused.pattern : "gemm") + where +
           (fallback.empty() ? "" : " (" + fallback + ")") +
           (plan.empty() ? "" : " (" + plan + ")");
  GemmPlan p;
  p.unit = std::move(u);
  p.where = where;
  p.normKind = normKind;
  p.norm = norm;
  p.dual = dual;
  p.deferNorm = deferNorm;
  p.epiTile = epiTile;
  p.staged = staged;
  p.side = side;
  p.defer = defer;
  p.padK = padK;
  p.padB = padB;
  p.kMajorB = kMajorB;
  p.smemBytes = smemBytes;
  p.bIdx = bIdx;
  return p;
}

/// The generated file's header lines: what the kernel is and how it runs (shape-free: every
/// op of one configuration shares the kernel).
std::vector<std::string> headerLines(const GemmPlan& p, const ir::Op& op) {
  const KernelUnit& u = p.unit;
  const TileConfig& t = u.tile;
  const bool dual = p.dual, deferNorm = p.deferNorm, epiTile = p.epiTile, padK = p.padK,
             padB = p.padB, defer = p.defer, side = p.side, norm = p.norm;
  const int staged = p.staged, normKind = p.normKind;
  std::vector<std::string> lines;
  if (t.wgmma()) {
    const bool pp = t.backend == Backend::WgmmaPingPong;
    const int consumers = pp ? 2 : t.bm / t.wm;
    lines = {"family:   " + u.family + " (TMA + wgmma m64n" + std::to_string(t.bn) +
                 "k16, warp-specialized, persistent; f16 in, f32 accumulate)",
             "config:   CTA " + std::to_string(t.bm) + "x" + std::to_string(t.bn) + "x" +
                 std::to_string(t.bk) + ", " + std::to_string(consumers) + " consumer warpgroup" +
                 (consumers > 1 ? "s" : "") + (pp ? " taking alternate tiles (ping-pong)" : "") +
                 " + 1 producer, " + std::to_string(t.stages) + " stages" +
                 (t.aRows > 0 ? " holding A boxes of " + std::to_string(t.aRows) + " rows"
                              : std::string()) +
                 ", " +
                 (t.cluster > 1
                      ? "clusters of " + std::to_string(t.cluster) + " CTAs multicasting B, "
                      : std::string()) +
                 (t.rasterN ? "tiles in groups along N, " : "") + std::to_string(t.threads()) +
                 " threads" + (u.transB ? ", B is [N, K]" : ", B is [K, N]")};
    if (dual)
      // Shape-free, as the kernel is: kernels of one name must have one source.
      lines.push_back("dual:     one GEMM of twice the result's columns (each weight's padded "
                      "to 8) over a copy of the two weights interleaved in blocks of 8 "
                      "columns (acc's, then acc2's), made once when they are uploaded; the "
                      "epilogue combines each thread's acc and acc2 columns into " +
                      std::to_string(t.bn / 2) + " columns of the result per tile");
    if (deferNorm)
      lines.push_back(std::string("norm:     deferred: the GEMM reads the raw rows of x and a copy "
                                  "of B in [N, K] rows with gamma folded in, made once when the "
                                  "weights are uploaded; ") +
                      (u.normStats == NormStats::Launch
                           ? "a statistics launch before it (which it overlaps) gives each row's "
                       : u.normStats == NormStats::Grid
                           ? "the producer warpgroup's idle warps of every CTA read each row once "
                             "(rows dealt out by a counter) for its "
                           : "the producer's idle warps sum each row's statistics from the A "
                             "tiles of the main loop: ") +
                      (normKind == 1 ? "mean and rstd; acc = rstd (acc - mean colsum(B')) + "
                                       "beta W, the column terms also made at upload"
                                     : "rstd; acc = rstd acc") +
                      ", before the epilogue");
    else if (u.preparedB && !dual)
      lines.push_back(std::string("weight:   B is a weight, read from a copy in [N, K] rows of K "
                                  "rounded up to 8 made once, when it is uploaded (") +
                      (u.transB ? "K % 8 != 0" : "its [K, N] rows are not 128-byte multiples") +
                      ")");
    if (epiTile)
      lines.push_back("store:    through a " + std::to_string(t.bm) + "x" + std::to_string(t.bn) +
                      " shared-memory tile, by TMA" +
                      (staged >= 0
                           ? "; $" + std::to_string(staged) + " [M, N] loaded into it by TMA"
                           : std::string()));
    if (u.splitLastWave)
      lines.push_back("split:    the last wave's tiles in k-pieces as the shape's plan says, the "
                      "last piece adding the others' partial sums (FPAT_SPLIT_LAST_WAVE=0: whole "
                      "tiles)");
    if (padK)
      lines.push_back(std::string("pad:      K % 8 != 0: A") + (padB ? " and B [N, K]" : "") +
                      " copied first into rows of K rounded up to 8 (16-byte TMA strides)");
    if (defer)
      lines.push_back("defer:    the epilogue deferred to the producer's idle warps" +
                      (side ? ", $" + std::to_string(staged) + " coming to them in " +
                                  std::to_string(t.bm) + "x64 boxes by TMA"
                            : std::string()));
  } else {
    lines = {"family:   " + u.family +
                 (t.backend == Backend::MmaSync ? " (mma.sync m16n8k16" : " (WMMA") +
                 ", f16 in, f32 accumulate)" +
                 (norm ? ", A normalised on load (" + op.fused.norm + ")" : ""),
             "config:   CTA " + std::to_string(t.bm) + "x" + std::to_string(t.bn) + "x" +
                 std::to_string(t.bk) + ", warp " + std::to_string(t.wm) + "x" +
                 std::to_string(t.wn) + ", " + std::to_string(t.stages) + " stages, " +
                 std::to_string(t.threads()) + " threads, " +
                 (u.vec ? "16-byte loads" : "bounds-checked loads") +
                 (u.transB ? ", B is [N, K]" : ", B is [K, N]")};
  }
  lines.push_back("epilogue: " + (op.kind == ir::OpKind::Fused
                                      ? ir::printEpilogue(op.fused.epilogue)
                                      : std::string("acc")));
  return lines;
}

KernelUnit generateGemm(const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                        const CodegenOptions& o) {
  const GemmPlan p = planGemm(g, v, o);
  KernelUnit u = p.unit;
  const ir::Op& op = g.op(v);
  const std::vector<ir::Vertex> ins = g.operands(v);
  const TileConfig& t = u.tile;
  const bool dual = p.dual, deferNorm = p.deferNorm, epiTile = p.epiTile, padK = p.padK,
             padB = p.padB, defer = p.defer, side = p.side, norm = p.norm, kMajorB = p.kMajorB,
             statsInLoop = u.normStats == NormStats::Loop;
  const int staged = p.staged, normKind = p.normKind, smemBytes = p.smemBytes;
  const size_t bIdx = p.bIdx;
  const std::string& where = p.where;
  const int64_t gemmN = u.gemmColumns();
  ActivationCode acts;
  std::ostringstream body;
  // The dual GEMM's epilogue is dual() and dual1(), of both accumulators; the kernel never
  // calls the one-accumulator forms for it.
  const std::string never =
      "    __trap(); // the dual GEMM calls dual() and dual1()\n    return v;\n";
  const std::string epi = dual ? never : epilogueBody(g, v, defs, acts);
  const std::string dualPair = dual ? epiloguePairBody(g, v, defs, acts, -1) : std::string();
  const std::string dualOne = dual ? epilogueBody(g, v, defs, acts) : std::string();
  const std::vector<std::string> lines = headerLines(p, op);
  body << header(op.kind == ir::OpKind::Fused ? "pattern " + op.fused.pattern + where
                                              : std::string("gemm (not fused)"),
                 o, lines)
       << (t.wgmma() ? "#include \"fpat_wgmma.cuh\"\n" : "#include \"fpat_gemm.cuh\"\n");
  if (norm)
    body << "#include \"fpat_rowwise.cuh\"\n";
  const int deferredKind = deferNorm ? normKind : 0;
  body << "\n" << activationFunctions(acts, defs);
  body << (acts.fns.empty() ? "" : "\n") << "namespace {\n\n"
       << "struct Epilogue {\n"
       << "  __device__ __forceinline__ float operator()(float v, int64_t row, int64_t col,\n"
       << "                                              const FpatKernelArgs& a) const {\n"
       << "    (void)row;\n    (void)col;\n    (void)a;\n"
       << epi << "  }\n";
  const bool rope = op.kind == ir::OpKind::Fused && op.fused.epilogue.hasRope();
  if (rope)
    body << "  // The epilogue reads column pairs (rope): the kernels call pair() (N is even).\n"
         << "  static constexpr bool kPairs = true;\n";
  if (t.wgmma())
    body << "  // How fpat_wgmma.cuh runs it: through the TMA-stored tile; the [M, N] operand "
            "loaded\n"
         << "  // into that tile (-1: none); deferred to the producer warpgroup's idle warps.\n"
         << "  static constexpr bool kTile = " << (epiTile ? "true" : "false") << ";\n"
         << "  static constexpr int kStaged = " << staged << ";\n"
         << "  static constexpr bool kDefer = " << (defer ? "true" : "false") << ";\n"
         << "  // Whether the last wave may be split in k (planned for this shape).\n"
         << "  static constexpr bool kSplit = " << (u.splitLastWave ? "true" : "false") << ";\n"
         << "  // The deferred norm applied to the accumulator first: 0 none, 1 layernorm, 2 "
            "rmsnorm.\n"
         << "  static constexpr int kNorm = " << deferredKind << ";\n"
         << "  // Its row statistics summed by the consumers in the main loop (else: rowStats).\n"
         << "  static constexpr bool kNormStats = " << (statsInLoop ? "true" : "false") << ";\n"
         << (u.normStats == NormStats::Grid
                 ? "  // Its row statistics read by the statistics warps of the whole grid.\n"
                   "  static constexpr bool kNormGrid = true;\n"
                 : "");
  // Column pairs: every wgmma kernel stores through them; the others call them for kPairs.
  if (t.wgmma() || rope)
    body << (t.wgmma() ? "  // Column pairs; s: operand kStaged's pair, read from the tile. kFma: "
                         "the second\n  // element's exp and division on the FMA pipe "
                         "(fpat_common.cuh).\n"
                       : "  // Column pairs (kPairs); s: unused here.\n")
         << "  template <bool kFma = true>\n"
         << "  __device__ __forceinline__ float2 pair(float2 v, int64_t row, int64_t col,\n"
         << "                                         const FpatKernelArgs& a, float2 s) const {\n"
         << "    (void)row;\n    (void)col;\n    (void)a;\n    (void)s;\n"
         << (dual ? never : epiloguePairBody(g, v, defs, acts, t.wgmma() ? staged : -1)) << "  }\n";
  if (dual)
    body << "  // The dual GEMM (fpat_wgmma.cuh): v holds acc's column pair, w acc2's; dual1 is "
            "one\n"
         << "  // column, for odd N.\n"
         << "  static constexpr bool kDual = true;\n"
         << "  template <bool kFma = true>\n"
         << "  __device__ __forceinline__ float2 dual(float2 v, float2 w, int64_t row, int64_t "
            "col,\n"
         << "                                         const FpatKernelArgs& a) const {\n"
         << "    (void)row;\n    (void)col;\n    (void)a;\n"
         << dualPair << "  }\n"
         << "  __device__ __forceinline__ float dual1(float v, float w, int64_t row, int64_t col,\n"
         << "                                        const FpatKernelArgs& a) const {\n"
         << "    (void)row;\n    (void)col;\n    (void)a;\n"
         << dualOne << "  }\n";
  if (t.wgmma()) {
    const int addend =
        op.kind == ir::OpKind::Fused ? stagedAddend(op.fused.epilogue, ins, g, staged) : -1;
    body << "  // kAddStaged: the epilogue ends by adding operand kStaged; head() computes the "
            "rest,\n"
         << "  // and the kernel adds the two in element pairs after rounding head's value.\n"
         << "  static constexpr bool kAddStaged = " << (addend >= 0 ? "true" : "false") << ";\n";
    if (addend >= 0)
      body << "  template <bool kFma = true>\n"
           << "  __device__ __forceinline__ float2 head(float2 v, int64_t row, int64_t col,\n"
           << "                                         const FpatKernelArgs& a, float2 s) const "
              "{\n"
           << "    (void)row;\n    (void)col;\n    (void)a;\n    (void)s;\n"
           << epiloguePairBody(g, v, defs, acts, staged, addend) << "  }\n";
  }
  body << "};\n\n";
  if (t.wgmma()) {
    body << "using Tile = fpat::WgmmaTile<" << t.bm << ", " << t.bn << ", " << t.stages << ", "
         << (t.backend == Backend::WgmmaPingPong ? "true" : "false")
         << (t.cluster > 1 || t.rasterN || t.aRows > 0 ? ", " + std::to_string(t.cluster)
                                                       : std::string())
         << (t.rasterN || t.aRows > 0 ? t.rasterN ? ", true" : ", false" : "")
         << (t.aRows > 0 ? ", " + std::to_string(t.aRows) : std::string()) << ">;\n"
         << "// The launch's dynamic shared memory (computed on the host) must be the kernel's.\n"
         << "static_assert(fpat::wgmmaSmemBytes<Tile" << (epiTile ? ", true" : "")
         << (defer && side ? ", true" : "") << ">() == " << smemBytes
         << ", \"host and device disagree on shared memory\");\n\n} // namespace\n\n"
         << (padK ? "extern \"C\" __global__ void __launch_bounds__(256) " + u.name +
                        "_pad(const FpatKernelArgs a) {\n  fpat::padRows<" +
                        (padB ? "true" : "false") + ", " + std::to_string(bIdx) + ">(a);\n}\n\n"
                  : std::string())
         << (u.preparedB ? "extern \"C\" __global__ void __launch_bounds__(256) " + u.name +
                               "_prep(const FpatKernelArgs a) {\n  fpat::prepareWeightB<" +
                               (u.transB ? "false" : "true") + ", " + std::to_string(bIdx) +
                               (deferNorm || dual ? deferNorm ? ", true" : ", false" : "") +
                               (dual ? ", true" : "") + ">(a);\n}\n\n"
                         : std::string())
         << (deferNorm && normKind == 1
                 ? "extern \"C\" __global__ void __launch_bounds__(256) " + u.name +
                       "_prepcols(const FpatKernelArgs a) {\n  fpat::prepareNormColumns<" +
                       (u.transB ? "false" : "true") + ", " + std::to_string(bIdx) + ">(a);\n}\n\n"
                 : std::string())
         << (u.normStats == NormStats::Launch
                 ? "extern \"C\" __global__ void __launch_bounds__(256) " + u.name +
                       "_rowstats(const FpatKernelArgs a) {\n  fpat::deferredNormStats<" +
                       (normKind == 1 ? "true" : "false") + ">(a);\n}\n\n"
                 : std::string())
         << "extern \"C\" __global__ void "
         << (t.cluster > 1 ? "__cluster_dims__(" + std::to_string(t.cluster) + ", 1, 1) " : "")
         << "__launch_bounds__(" << t.threads() << ", 1) " << u.name
         << "(const __grid_constant__ FpatTmaArgs p) {\n"
         << "  fpat::gemmWgmma<Tile, " << (kMajorB ? "true" : "false") << ", Epilogue>(p);\n}\n";
    if (u.preparedB)
      u.launches.push_back({Launch::PreparedWeight, u.name + "_prep", 256, 0, {}});
    if (deferNorm && normKind == 1)
      u.launches.push_back({Launch::PreparedColumns, u.name + "_prepcols", 256, 0, {}});
    if (padK)
      u.launches.push_back({Launch::PaddedRows, u.name + "_pad", 256, 0, {}});
    // The statistics launch goes last before the GEMM, which overlaps it: the GEMM's main loop
    // needs only x and B, its epilogue waits for the statistics.
    if (u.normStats == NormStats::Launch)
      u.launches.push_back({Launch::Rows, u.name + "_rowstats", 256, 0, {}});
    Launch l{Launch::Persistent, u.name, t.threads(), smemBytes, {}};
    l.overlapsPrevious = u.normStats == NormStats::Launch;
    // Box shapes as fpat_wgmma.cuh loads them: A in BK x BM boxes (BK x aRows with a short A
    // box); B [N, K] in BK x BN boxes (half of them per CTA of a cluster), B [K, N] in
    // 64-column x BK boxes (its rows past K are TMA's zeros: no copy).
    l.tma.push_back({0, u.K, u.M, t.bk, t.stageRowsA(), padK ? 0 : -1});
    const int b = static_cast<int>(bIdx);
    l.tma.push_back(
        kMajorB ? TmaMap{b, u.K, gemmN, t.bk, t.bn / t.cluster, padB || u.preparedB ? 1 : -1}
                : TmaMap{b, u.N, u.K, 64, t.bk});
    // The epilogue tile: the staged operand in 64-column x BM boxes, the output stored in
    // 64 x 64 boxes (each consumer warpgroup its rows).
    if (epiTile) {
      l.tma.push_back(staged >= 0 ? TmaMap{staged, u.N, u.M, 64, t.bm}
                                  : TmaMap{TmaMap::kUnused, 0, 0, 64, 64});
      l.tma.push_back({TmaMap::kOutput, u.N, u.M, 64, 64});
    }
    u.launches.push_back(l);
    u.params = acts.params;
    u.source = body.str();
    return u;
  }
  body << "using Tile = fpat::GemmTile<" << t.bm << ", " << t.bn << ", " << t.bk << ", " << t.wm
       << ", " << t.wn << ", " << t.stages << ">;\n"
       << "// The launch's dynamic shared memory (computed on the host) must be the kernel's.\n"
       << "static_assert(fpat::gemmSmemBytes<Tile, " << (u.transB ? "true" : "false")
       << ">() == " << gemmSmemBytes(t, u.transB)
       << ", \"host and device disagree on shared memory\");\n\n} // namespace\n\n";
  if (norm) {
    body << "extern \"C\" __global__ void __launch_bounds__(256) " << u.name
         << "_rowstats(const FpatKernelArgs a) {\n"
         << "  fpat::rowStatsPass<" << (normKind == 1 ? "true" : "false") << ">(a);\n}\n\n";
    u.launches.push_back({Launch::Rows, u.name + "_rowstats", 256, 0, {}});
  }
  body << "extern \"C\" __global__ void __launch_bounds__(" << t.threads() << ") " << u.name
       << "(const FpatKernelArgs a) {\n"
       << "  fpat::gemm<Tile, " << (u.transB ? "true" : "false") << ", "
       << (u.vec ? "true" : "false") << ", " << normKind << ", Epilogue"
       << (t.backend == Backend::MmaSync ? ", true" : "") << ">(a);\n}\n";
  u.launches.push_back({Launch::GemmTiles, u.name, t.threads(), gemmSmemBytes(t, u.transB), {}});
  u.params = acts.params;
  u.source = body.str();
  return u;
}

} // namespace fpat::codegen::detail

namespace fpat::codegen {

bool defersNorm(const ir::Graph& g, ir::Vertex v) {
  const ir::Op& op = g.op(v);
  const auto kind = families::gemm::kindOf(op);
  if (!kind || !kind->normalisesA || ir::normKindOf(op) == ir::NormKind::None)
    return false;
  const std::vector<ir::Vertex> ins = g.operands(v);
  const size_t bIdx = ir::gemmBIndex(op);
  if (ins.size() <= bIdx)
    return false;
  // gamma (and beta) and W: weights, the first two vectors, W a matrix.
  for (size_t i = 1; i <= bIdx; ++i) {
    const ir::Op& w = g.op(ins[i]);
    if (!ir::isWeightOnly(g, ins[i]) || w.type.rank() != (i == bIdx ? 2 : 1))
      return false;
  }
  return true;
}

std::optional<NormStats> normStatsFromEnv() {
  const char* e = std::getenv("FPAT_NORM_STATS");
  const std::string form = e ? e : "";
  if (form == "launch")
    return NormStats::Launch;
  if (form == "loop")
    return NormStats::Loop;
  if (form == "grid")
    return NormStats::Grid;
  return std::nullopt;
}

NormStats expectedNormStats(const ir::Graph& g, ir::Vertex v) {
  if (!defersNorm(g, v))
    return NormStats::None;
  const ir::Op& op = g.op(v);
  const auto kind = families::gemm::kindOf(op);
  // planGemm's `defer` without a tile: an activation where the result tile is staged (not the
  // dual GEMM's, N % 8 == 0).
  const ir::TensorDesc& a = g.op(g.operands(v)[0]).type;
  return detail::deferredStatsForm(detail::appliesActivation(op) && kind && kind->gemms == 1 &&
                                       op.type.shape[1] % 8 == 0,
                                   a.shape.back());
}

size_t preparedBBytes(const KernelUnit& u) {
  const size_t n = static_cast<size_t>(u.gemmColumns()), k = static_cast<size_t>(paddedK(u.K));
  const size_t pitch = static_cast<size_t>(normColumnsPitch(u.N));
  return n * k * 2 + (u.deferredNorm == ir::NormKind::LayerNorm ? 2 * pitch * sizeof(float) : 0);
}

bool preparesWeightB(const ir::Graph& g, ir::Vertex v) {
  const ir::Op& op = g.op(v);
  const auto kind = families::gemm::kindOf(op);
  if (kind && kind->gemms == 2) { // Bg and Bu interleaved into one copy
    const std::vector<ir::Vertex> ins = g.operands(v);
    const size_t bIdx = ir::gemmBIndex(op);
    if (ins.size() < bIdx + 2 || (kind->normalisesA && !defersNorm(g, v)))
      return false;
    for (size_t i = bIdx; i < bIdx + 2; ++i) {
      if (!ir::isWeightOnly(g, ins[i]) || g.op(ins[i]).type.rank() != 2)
        return false;
    }
    return true;
  }
  if (kind && kind->normalisesA)
    return defersNorm(g, v); // gamma is folded into a copy of B
  if (!kind || !kind->hasWgmmaPath)
    return false;
  const std::vector<ir::Vertex> ins = g.operands(v);
  const size_t bIdx = ir::gemmBIndex(op);
  if (ins.size() <= bIdx)
    return false;
  if (!ir::isWeightOnly(g, ins[bIdx]) || g.op(ins[bIdx]).type.rank() != 2)
    return false;
  const int64_t n = op.type.shape[1], k = g.op(ins[0]).type.shape[1];
  return op.transposeB ? wgmmaPadsK(k) : n % 64 != 0;
}

GemmProblem gemmProblemOf(const ir::Graph& g, ir::Vertex v) {
  const ir::Op& op = g.op(v);
  const auto kind = families::gemm::kindOf(op);
  const int64_t k = g.op(g.operands(v).at(0)).type.shape[1];
  // A prepared weight B is [N, K] to the wgmma kernels; the cp.async ones read it as given.
  const bool prepared = preparesWeightB(g, v);
  if (kind && kind->gemms == 2) { // one GEMM over the interleaved copy, on sm_90 only
    GemmProblem p = gemmProblem(op.type.shape[0], dualColumns(op.type.shape[1]), k, true);
    p.tma = prepared;
    p.epilogueReads = !op.fused.epilogue.operands().empty();
    return p;
  }
  GemmProblem p = gemmProblem(op.type.shape[0], op.type.shape[1], k, op.transposeB || prepared);
  p.vec = vectorLoads(p.m, p.n, k, op.transposeB);
  // A deferred norm leaves the main loop a plain GEMM's (on the Hopper backend).
  const bool deferred = defersNorm(g, v);
  p.norm = kind && kind->normalisesA && !deferred;
  p.tma = p.tma && kind && (kind->hasWgmmaPath || deferred) && !p.norm;
  p.epilogueReads = op.kind == ir::OpKind::Fused && !op.fused.epilogue.operands().empty();
  return p;
}

} // namespace fpat::codegen

namespace fpat::families {

namespace {

class GemmGenerator final : public codegen::FamilyGenerator {
public:
  explicit GemmGenerator(ir::Family) {}

  codegen::KernelUnit generate(const ir::Graph& g, ir::Vertex v, dsl::Activations defs,
                               const codegen::CodegenOptions& o) const override {
    return codegen::detail::generateGemm(g, v, defs, o);
  }

  std::optional<codegen::TuningProblem> tuning(const ir::Graph& g, ir::Vertex v) const override {
    // From the op alone (what the kernel computes and its shape), without generating code.
    const ir::Op& op = g.op(v);
    codegen::TuningProblem t;
    t.problem = codegen::gemmProblemOf(g, v);
    const int64_t m = op.type.shape.at(0), n = op.type.shape.at(1),
                  k = g.op(g.operands(v).at(0)).type.shape.at(1);
    t.m = m;
    t.n = n;
    t.k = k;
    t.signature = std::string(ir::familyOf(op)->name) + ":" +
                  (op.kind == ir::OpKind::Fused ? op.fused.pattern : "gemm");
    if (op.kind == ir::OpKind::Fused)
      t.signature += "," + ir::printEpilogue(op.fused.epilogue);
    if (!op.fused.norm.empty())
      t.signature += ":" + op.fused.norm;
    t.signature += std::string(op.transposeB ? ":bt" : "") +
                   (codegen::vectorLoads(m, n, k, op.transposeB) ? ":vec" : ":any") +
                   (codegen::preparesWeightB(g, v) ? ":bprep" : "");
    return t;
  }
};

} // namespace

const codegen::FamilyGenerator& gemmGenerator(ir::Family id) {
  return gemm::partFor<GemmGenerator>(id);
}

} // namespace fpat::families
