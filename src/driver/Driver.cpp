#include "driver/Driver.h"

#include "dsl/Library.h"
#include "ir/Reference.h"
#include "ir/text/Text.h"
#include "match/Match.h"
#include "support/Process.h"
#include "support/Verify.h"

#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>

namespace fpat {
namespace fs = std::filesystem;

std::string builtinPatternsDir() {
  if (const char* env = std::getenv("FPAT_PATTERNS_DIR"); env && *env)
    return env;
  return FPAT_SOURCE_PATTERNS_DIR;
}

namespace {

std::string summary(const ir::Graph& g) {
  std::map<std::string, int> counts;
  for (ir::Vertex v : g.vertices())
    ++counts[ir::opKindName(g.op(v).kind)];
  std::string s = std::to_string(g.size()) + " ops (";
  bool first = true;
  for (auto& [k, n] : counts) {
    s += (first ? "" : ", ") + std::to_string(n) + " " + k;
    first = false;
  }
  return s + "), " + std::to_string(g.outputs().size()) + " output" +
         (g.outputs().size() == 1 ? "" : "s");
}

std::string fixed(double v, int prec) {
  std::ostringstream os;
  os << std::fixed << std::setprecision(prec) << v;
  return os.str();
}

std::string sci(double v) {
  std::ostringstream os;
  os << std::scientific << std::setprecision(2) << v;
  return os.str();
}

int writeGraphviz(const ir::Graph& g, const std::string& stem, const FpatcOptions& opts,
                  std::ostream& out, std::ostream& err) {
  std::error_code ec;
  fs::create_directories(opts.outDir, ec);
  if (ec) {
    err << "fpatc: error: cannot create directory '" << opts.outDir << "': " << ec.message()
        << '\n';
    return 1;
  }
  const std::string dotPath = (fs::path(opts.outDir) / (stem + ".dot")).string();
  {
    std::ofstream f(dotPath);
    ir::writeDot(g, f);
    if (!f) {
      err << "fpatc: error: cannot write '" << dotPath << "'\n";
      return 1;
    }
  }
  out << "  wrote " << dotPath << '\n';
  if (findProgram("dot").empty()) {
    out << "  skipped .svg: Graphviz 'dot' is not installed (apt-get install graphviz)\n";
    return 0;
  }
  const std::string svgPath = (fs::path(opts.outDir) / (stem + ".svg")).string();
  ProcessResult r = runProcess({"dot", "-Tsvg", dotPath, "-o", svgPath});
  if (r.exitCode != 0) {
    err << "fpatc: error: dot failed on '" << dotPath << "':\n" << r.output;
    return 1;
  }
  out << "  wrote " << svgPath << '\n';
  return 0;
}

/// Compiles one .fpat file into `sm`/`diags`; null on errors.
std::optional<dsl::Compilation> compilePatterns(const std::string& path, SourceManager& sm,
                                                DiagEngine& diags,
                                                const std::vector<std::string>& includeDirs) {
  std::string text;
  if (!readFile(path, text)) {
    diags.error({}, "cannot read pattern file '" + path + "'");
    return std::nullopt;
  }
  int id = sm.addBuffer(path, std::move(text));
  dsl::CompileOptions copts;
  copts.includeDirs = includeDirs;
  return dsl::compileFpat(id, sm, diags, copts);
}

/// Everything the pattern side contributes to a run.
struct Patterns {
  dsl::MatcherTable table;
  ir::ActivationSet activations;
  ir::ActivationLibrary reference;
  size_t userPatterns = 0;
};

bool loadPatterns(const FpatcOptions& opts, SourceManager& sm, DiagEngine& diags, Patterns& p,
                  std::ostream& err) {
  std::vector<std::string> includes = opts.includeDirs;
  includes.push_back(builtinPatternsDir());
  // The built-in activation bodies come from the .fpat sources; the built-in table was
  // generated from the same files at build time.
  auto builtin = compilePatterns((fs::path(builtinPatternsDir()) / "all.fpat").string(), sm,
                                 diags, includes);
  if (!builtin) {
    err << "fpatc: error: the built-in patterns in '" << builtinPatternsDir()
        << "' do not compile (set FPAT_PATTERNS_DIR?)\n";
    return false;
  }
  dsl::PatternLibrary lib = builtin->library;
  p.table = match::builtinTable();
  for (const std::string& file : opts.patternFiles) {
    auto user = compilePatterns(file, sm, diags, includes);
    if (!user)
      return false;
    // Only what the user's files add: whatever they include from the built-in files is
    // already in the built-in table.
    std::set<std::string> builtinFiles;
    for (const std::string& d : builtin->dependencies)
      builtinFiles.insert(fs::weakly_canonical(d).string());
    auto isBuiltin = [&](const SourceLoc& loc) {
      return builtinFiles.count(fs::weakly_canonical(sm.file(loc.file).name).string()) > 0;
    };
    dsl::PatternLibrary mine;
    for (const dsl::PatternDef& pd : user->library.patterns)
      if (!isBuiltin(pd.loc))
        mine.patterns.push_back(pd);
    bool clashed = false;
    for (const dsl::ActivationDef& a : user->library.activations) {
      if (isBuiltin(a.loc))
        continue;
      if (const dsl::ActivationDef* prev = lib.findActivation(a.name)) {
        diags.error(a.loc, "activation '" + a.name + "' is already defined");
        diags.note(prev->loc, "previous definition is here");
        clashed = true;
        continue;
      }
      lib.activations.push_back(a);
    }
    if (clashed)
      return false;
    dsl::MatcherTable userTable = dsl::compileMatcherTable(mine, sm, diags);
    dsl::MatcherTable merged;
    std::string clash;
    if (!match::mergeTables(p.table, userTable, merged, clash)) {
      for (const dsl::PatternDef& pd : mine.patterns)
        if (pd.name == clash)
          diags.error(pd.loc, "pattern '" + clash + "' is already defined by the built-in "
                                                    "patterns; choose another name");
      return false;
    }
    p.table = std::move(merged);
    p.userPatterns += mine.patterns.size();
  }
  p.activations = lib.activationSet();
  p.reference = lib.referenceActivations();
  return true;
}

struct Comparison {
  double maxAbs = 0, maxRel = 0;
  size_t nonFinite = 0;
};

/// Errors of `got` against `want`. Relative errors are taken against max(|want|, rms(want)),
/// so that elements near zero do not turn rounding noise into huge ratios.
Comparison compare(const ir::Tensor& got, const ir::Tensor& want) {
  Comparison c;
  const double rms = std::max(ir::stats(want).rms, 1e-30);
  for (size_t i = 0; i < want.data.size(); ++i) {
    double g = got.data[i], w = want.data[i];
    if (!std::isfinite(g) || !std::isfinite(w)) {
      ++c.nonFinite;
      continue;
    }
    double d = std::fabs(g - w);
    c.maxAbs = std::max(c.maxAbs, d);
    c.maxRel = std::max(c.maxRel, d / std::max(std::fabs(w), rms));
  }
  return c;
}

} // namespace

int runFpatc(const FpatcOptions& opts, std::ostream& out, std::ostream& err) {
  SourceManager sm;
  DiagEngine diags(sm, opts.verifyDiagnostics ? nullptr : &err);
  diags.setErrorLimit(opts.verifyDiagnostics ? 0 : opts.errorLimit);
  auto failed = [&] {
    diags.flush();
    err << diags.errorCount() << " error" << (diags.errorCount() == 1 ? "" : "s")
        << " generated.\n";
    return 1;
  };

  Patterns pats;
  if (!loadPatterns(opts, sm, diags, pats, err))
    return failed();
  if (opts.emit == "table") {
    out << dsl::disassemble(pats.table);
    return 0;
  }

  std::string text;
  if (!readFile(opts.input, text)) {
    err << "fpatc: error: cannot read '" << opts.input << "'\n";
    return 1;
  }
  const int fileId = sm.addBuffer(opts.input, std::move(text));
  std::optional<ir::Graph> g = ir::parseGraph(fileId, diags, pats.activations);
  diags.flush();
  if (opts.verifyDiagnostics) {
    auto problems = verifyDiagnostics(diags, fileId);
    for (const std::string& p : problems)
      err << opts.input << ": verify: " << p << '\n';
    if (!problems.empty())
      return 1;
    out << opts.input << ": " << diags.diagnostics().size() << " diagnostic(s) as expected\n";
    return 0;
  }
  if (!g)
    return failed();
  if (opts.emit == "fgraph") {
    out << ir::printGraph(*g);
    return 0;
  }

  auto problems = ir::validate(*g, pats.activations);
  if (opts.emit.empty()) {
    out << "== parse: " << opts.input << ": graph " << g->name() << ", " << summary(*g) << '\n';
    out << "== validate: " << (problems.empty() ? "ok" : "FAILED") << '\n';
  }
  for (const std::string& p : problems)
    err << "fpatc: error: " << p << '\n';
  if (!problems.empty())
    return 1;

  ir::Graph fused = *g;
  match::MatchResult mr;
  if (opts.fuse) {
    match::MatchOptions mopts;
    mopts.disabled = opts.disabled;
    mopts.only = opts.only;
    mopts.explain = opts.explain;
    for (const std::string& n : opts.disabled)
      if (std::none_of(pats.table.patterns.begin(), pats.table.patterns.end(),
                       [&](const dsl::PatternMeta& m) { return m.name == n; }))
        err << "fpatc: warning: --disable-pattern=" << n << ": no such pattern\n";
    for (const std::string& n : opts.only)
      if (std::none_of(pats.table.patterns.begin(), pats.table.patterns.end(),
                       [&](const dsl::PatternMeta& m) { return m.name == n; }))
        err << "fpatc: warning: --only-pattern=" << n << ": no such pattern\n";
    mr = match::findMatches(*g, pats.table, mopts);
    fused = match::rewrite(*g, pats.table, mr.matches);
    auto after = ir::validate(fused, pats.activations);
    for (const std::string& p : after)
      err << "fpatc: internal error: the fused graph is invalid: " << p << '\n';
    if (!after.empty())
      return 70;
  }
  if (opts.emit == "fused") {
    out << ir::printGraph(fused);
    return 0;
  }

  out << "== graph" << (opts.fuse ? " before fusion" : "") << "\n" << ir::printGraph(*g);
  if (opts.fuse) {
    out << "== fusion: " << pats.table.patterns.size() << " patterns ("
        << pats.table.patterns.size() - pats.userPatterns << " built-in, " << pats.userPatterns
        << " from --patterns), " << mr.matches.size() << " fused op"
        << (mr.matches.size() == 1 ? "" : "s") << "\n";
    if (opts.explain)
      out << match::explain(*g, pats.table, mr);
    else
      for (const match::Match& m : mr.matches) {
        const dsl::PatternMeta& meta = pats.table.patterns[m.pattern];
        out << "  %" << g->op(m.slots[0]).name << " = " << meta.name << " (" << meta.file << ":"
            << meta.line << ", " << meta.family << " kernel)\n";
      }
    out << "== graph after fusion: " << summary(fused) << "\n" << ir::printGraph(fused);
  }

  int rc = 0;
  if (opts.reference) {
    auto t0 = std::chrono::steady_clock::now();
    auto inputs = ir::randomInputs(*g, opts.seed);
    std::vector<ir::Tensor> vals = ir::evaluate(*g, inputs, pats.reference);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    out << "== reference: CPU, seeded random inputs (seed " << opts.seed << "), " << fixed(secs, 2)
        << " s\n";
    for (ir::Vertex v : g->outputs()) {
      ir::TensorStats s = ir::stats(vals[v]);
      out << "  output %" << g->op(v).name << " " << vals[v].desc.str() << ": min "
          << fixed(s.min, 4) << ", max " << fixed(s.max, 4) << ", mean " << fixed(s.mean, 4)
          << ", rms " << fixed(s.rms, 4) << ", non-finite " << s.nonFinite << '\n';
    }
    if (opts.fuse && !mr.matches.empty()) {
      // The fused graph evaluated with fused-op semantics (one rounding per fused op) must
      // agree with the unfused graph up to f16 rounding of the intermediates.
      std::vector<ir::Tensor> fv = ir::evaluate(fused, inputs, pats.reference);
      out << "  fused graph on the CPU vs the unfused graph:\n";
      for (size_t i = 0; i < g->outputs().size(); ++i) {
        const ir::Tensor& want = vals[g->outputs()[i]];
        const ir::Tensor& got = fv[fused.outputs()[i]];
        Comparison c = compare(got, want);
        const bool pass = c.nonFinite == 0 && c.maxRel <= 2e-2;
        out << "    %" << g->op(g->outputs()[i]).name << ": max abs err " << sci(c.maxAbs)
            << ", max rel err " << sci(c.maxRel) << " -> " << (pass ? "PASS" : "FAIL") << "\n";
        rc = pass ? rc : 1;
      }
    }
  }
  if (opts.graphviz) {
    out << "== graphviz\n";
    if (int r = writeGraphviz(*g, g->name(), opts, out, err))
      return r;
    if (opts.fuse)
      if (int r = writeGraphviz(fused, g->name() + ".fused", opts, out, err))
        return r;
  }
  return rc;
}

} // namespace fpat
