// The matcher runtime: runs a matcher table over the IR, selects matches, rewrites the graph
// into fused ops, and explains its decisions.
#pragma once

#include "fpat/dsl/Library.h"
#include "fpat/dsl/Matcher.h"
#include "fpat/ir/Graph.h"

#include <functional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

namespace fpat::match {

/// The table generated from patterns/ at build time.
const dsl::MatcherTable& builtinTable();

/// One selected match: pattern index into the table and the node recorded in each slot.
struct Match {
  size_t pattern = 0;
  std::vector<ir::Vertex> slots;
};

/// A candidate's estimated times (ms): its fused op, and the ops the fusion removes, unfused.
struct CandidateCost {
  double fused = 0;
  double parts = 0;
  std::string detail; // the parts, e.g. "layernorm 0.021 + gemm 0.190", and any caveat
  double saving() const { return parts - fused; }
};
using CostFn = std::function<CandidateCost(const Match&)>;

struct MatchOptions {
  std::set<std::string> disabled; // --disable-pattern
  std::set<std::string> only;     // --only-pattern (empty: all)
  bool explain = false;
  /// Set: every match at every root is a candidate, and the set chosen is the one of least
  /// total time (chooseByCost). Unset: greedy, the first pattern in table order at each root.
  CostFn cost;
};

/// For --explain: one pattern tried at one root, and why it failed ("" if it matched).
struct Attempt {
  ir::Vertex root;
  std::string pattern;
  std::string failure;
  double progress = 1;   // the share of the pattern's checks that passed before the failure
  std::string rootNeeds; // failed at the root's own op: the op the pattern's root needs
};

/// One candidate of a cost-based choice and what became of it.
struct Decision {
  Match match;
  CandidateCost cost;
  bool chosen = false;
  int lostTo = -1; // not chosen although it saves time: the chosen decision it overlaps
};

struct MatchResult {
  std::vector<Match> matches;      // in selection order
  std::vector<Attempt> attempts;   // only with explain
  std::vector<Decision> decisions; // by cost only: every candidate, in the order found
  size_t components = 0;           // by cost: groups of overlapping candidates
  size_t largestComponent = 0;     // candidates in the largest group
  bool exact = true;               // every group's search finished (see chooseByCost)
  std::string costModel;           // by cost: what the estimates are, for explain
};

/// Greedy (no opts.cost): tries every node as a root, in reverse topological order, and every
/// pattern in table order; the first pattern that matches and whose nodes are not fused yet is
/// selected. By cost: every pattern that matches at every root is a candidate, and chooseByCost
/// picks among them.
MatchResult findMatches(const ir::Graph& g, const dsl::MatcherTable& table,
                        const MatchOptions& opts = {});

/// The choice of least total time: a set of candidates that share no fused node (inputs may be
/// shared) maximising the sum of their savings (parts - fused), a candidate that saves nothing
/// never chosen. Overlapping candidates form groups (union-find over their nodes); each group
/// of up to 64 is searched exactly by branch and bound in order of saving (bound: the savings
/// still to come; the first leaf is the greedy set), at most 100000 steps, after which the best
/// set found stands and `exact` is false; a larger group is chosen greedily by saving (also not
/// exact). So the work is linear in the candidates for groups of bounded size, which is what
/// models have (a few candidates around each GEMM). Ties go to the earlier candidate. Fills
/// decisions' chosen and lostTo; returns the chosen indices in candidate order.
std::vector<size_t> chooseByCost(const dsl::MatcherTable& table, std::vector<Decision>& decisions,
                                 size_t* components = nullptr, size_t* largest = nullptr,
                                 bool* exact = nullptr);

/// The match alone as a graph of its own: its inputs (as inputs of the same type; weights stay
/// weights with their values), its nodes, and their fused op, whose vertex is put in `fused`.
/// What the cost model reads of a candidate without rewriting the whole graph.
ir::Graph fuseAlone(const ir::Graph& g, const dsl::MatcherTable& table, const Match& m,
                    ir::Vertex& fused);

/// The nodes a match's fused op replaces: its root and the internal nodes that nothing outside
/// the match reads (the others stay in the graph; see rewrite).
std::vector<ir::Vertex> replacedNodes(const ir::Graph& g, const dsl::MatcherTable& table,
                                      const Match& m);

/// Replaces each match by one fused op (named after its root, so users and outputs keep their
/// references). Internal nodes with users outside the match (patterns with single_use = false)
/// stay in the graph as well. The result is validated.
ir::Graph rewrite(const ir::Graph& g, const dsl::MatcherTable& table,
                  const std::vector<Match>& matches);

/// One rewrite made by raising: the pattern and the op (by name) it replaced.
struct RaiseStep {
  std::string pattern;
  std::string root;
  size_t ops = 0; // ops of the match that became the result
};

/// Raise rules that never stop rewriting (their results match them again).
class RaiseError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// Raising: runs `table` (compiled from `lib.raises`) over `g` until nothing more matches,
/// replacing each match by its result tree (the result's root takes the matched root's name;
/// intermediates that nothing else reads, and constants left unread, disappear). A match whose
/// result would not type-check, or whose attribute is not a scalar constant, is left alone.
/// Throws RaiseError when the rules are still rewriting after 16 passes.
ir::Graph raise(const ir::Graph& g, const dsl::MatcherTable& table, const dsl::PatternLibrary& lib,
                std::vector<RaiseStep>* steps = nullptr);

/// Weight rewrites: the same as raising with `table` compiled from `lib.rewrites`, run on the
/// raised graph. Their results' ops that read weights alone (ir::weightOnly) are computed once
/// per set of weights, when the weights are prepared.
ir::Graph applyRewrites(const ir::Graph& g, const dsl::MatcherTable& table,
                        const dsl::PatternLibrary& lib, std::vector<RaiseStep>* steps = nullptr);

/// For --explain: each raise rule's closest attempt on the raised graph (where it got past the
/// root's kind), closest first, and why it failed: the decompositions a user expected raised.
std::vector<Attempt> raiseNearMisses(const ir::Graph& raised, const dsl::MatcherTable& table);

/// The graph with every fused op whose kernel sm_`arch` lacks replaced by ops it has kernels
/// for, as the op's family says (match::FamilyMatcher::lowerFor; the dual GEMM, Hopper's, runs
/// as two GEMMs elsewhere). Returns the number of ops replaced in `count`.
ir::Graph lowerForArch(const ir::Graph& g, int arch, size_t* count = nullptr);

/// GEMMs merged by mergeSharedGemms: the activation they read, and their results (now
/// column slices of the merged GEMM), in order.
struct GemmMerge {
  std::string input;
  std::vector<std::string> results;
};

/// GEMMs that read one activation with weights of their own (and a bias_add of their own bias,
/// all or none of them), whose results only attention (as q, k, v) and rope read, in place
/// (ir::readInPlace), become one GEMM on their weights side by side and, after it, one
/// bias_add; each result is a column slice of it, keeping its name, which attention reads in
/// place (ir::isColumnView): Llama's, Mistral's and Qwen2's q, k and v projections run as
/// one, and the norm before them has one reader left, into which it can fuse. Weights with
/// values are joined here (those nothing else reads are dropped); weights [K, N] and biases
/// given at run time by concat ops, which run once with the weights; [N, K] weights given at
/// run time are left apart. Merges made go to `merged`. With `ropeEpilogues`, heads that only a
/// partial rotary and its concat read count as read in place (ropeIntoEpilogues makes them so).
ir::Graph mergeSharedGemms(const ir::Graph& g, std::vector<GemmMerge>* merged = nullptr,
                           bool ropeEpilogues = false);

/// A projection whose heads held their parts side by side, reordered by reorderHeadParts.
struct PartsReorder {
  std::string projection;
  int64_t parts = 0;
};

/// A projection viewed as heads [B, S, H, P d] whose every reader is a slice of one of the P
/// parts (GPT-NeoX's q, k and v side by side in each head), computed by a GEMM (and a
/// bias_add) on weights with values that only it reads: the weights' columns are reordered to
/// (part, head, d) and each part's slice becomes a slice of columns of the projection, seen as
/// heads, which attention can read in place (ir::isColumnView). BLOOM's [B, S, H, P, d] view
/// gets the same reorder at import. With `ropeEpilogues`, heads whose first part is roped and
/// put back beside the rest (partial rotary) are left for ropeIntoEpilogues, which makes them
/// views.
ir::Graph reorderHeadParts(const ir::Graph& g, std::vector<PartsReorder>* done = nullptr,
                           bool ropeEpilogues = false);

/// A projection whose ropes ropeIntoEpilogues took into its epilogue.
struct RopeFusion {
  std::string projection;
  std::vector<std::string> ropes; // their results, which now name views of its columns
  bool pairs = false;             // rotate_half: its weight's columns reordered to pairs
};

/// Ropes (tables: weights with values, the same for every head) whose x is heads of a plain
/// gemm's or a fused gemm / norm_gemm's columns that nothing else reads become a rope in that
/// op's epilogue (ir::EpiKind::Rope, on prepared tables [positions, d]); their readers read
/// the rotated columns in place. The epilogue rotates pairs of adjacent columns: for the
/// rotate_half form each rotated head's columns (i, i + d / 2) are reordered to (2i, 2i + 1)
/// in the weight and its [N] operands, which changes q and k alike and so no score, and is
/// done only where attention reads both q and k from such ropes. Fusions made go to `done`,
/// the ropes left apart, with the reason, to `kept`.
/// A rope left in a kernel of its own, and why.
struct RopeKept {
  std::string rope, why;
};
ir::Graph ropeIntoEpilogues(const ir::Graph& g, std::vector<RopeFusion>* done = nullptr,
                            std::vector<RopeKept>* kept = nullptr);

/// Removes ops (not inputs) whose value nothing reads and that are not outputs.
ir::Graph removeDeadOps(const ir::Graph& g);

/// Merges two tables (built-in first at equal benefit). A pattern name present in both is an
/// error: returns false and names it in `clash`.
bool mergeTables(const dsl::MatcherTable& a, const dsl::MatcherTable& b, dsl::MatcherTable& out,
                 std::string& clash);

/// The explanation printed by `fpatc --explain`.
std::string explain(const ir::Graph& g, const dsl::MatcherTable& table, const MatchResult& r);

} // namespace fpat::match
