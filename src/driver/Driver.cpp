#include "driver/Driver.h"

#include "ir/Reference.h"
#include "ir/text/Text.h"
#include "support/Process.h"
#include "support/Verify.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>

namespace fpat {
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

int writeGraphviz(const ir::Graph& g, const FpatcOptions& opts, std::ostream& out,
                  std::ostream& err) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(opts.outDir, ec);
  if (ec) {
    err << "fpatc: error: cannot create directory '" << opts.outDir << "': " << ec.message()
        << '\n';
    return 1;
  }
  const std::string dotPath = (fs::path(opts.outDir) / (g.name() + ".dot")).string();
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
  const std::string svgPath = (fs::path(opts.outDir) / (g.name() + ".svg")).string();
  ProcessResult r = runProcess({"dot", "-Tsvg", dotPath, "-o", svgPath});
  if (r.exitCode != 0) {
    err << "fpatc: error: dot failed on '" << dotPath << "':\n" << r.output;
    return 1;
  }
  out << "  wrote " << svgPath << '\n';
  return 0;
}

} // namespace

int runFpatc(const FpatcOptions& opts, std::ostream& out, std::ostream& err) {
  std::string text;
  if (!readFile(opts.input, text)) {
    err << "fpatc: error: cannot read '" << opts.input << "'\n";
    return 1;
  }
  SourceManager sm;
  const int fileId = sm.addBuffer(opts.input, std::move(text));
  DiagEngine diags(sm, opts.verifyDiagnostics ? nullptr : &err);
  diags.setErrorLimit(opts.verifyDiagnostics ? 0 : opts.errorLimit);
  std::optional<ir::Graph> g = ir::parseGraph(fileId, diags);
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
  if (!g) {
    err << diags.errorCount() << " error" << (diags.errorCount() == 1 ? "" : "s")
        << " generated.\n";
    return 1;
  }

  if (opts.emit == "fgraph") {
    out << ir::printGraph(*g);
    return 0;
  }
  if (opts.emit == "dot") {
    ir::writeDot(*g, out);
    return 0;
  }

  out << "== parse: " << opts.input << ": graph " << g->name() << ", " << summary(*g) << '\n';
  auto problems = ir::validate(*g);
  out << "== validate: " << (problems.empty() ? "ok" : "FAILED") << '\n';
  for (const std::string& p : problems)
    out << "  " << p << '\n';
  if (!problems.empty())
    return 1;
  out << "== graph\n" << ir::printGraph(*g);

  if (opts.reference) {
    auto t0 = std::chrono::steady_clock::now();
    auto inputs = ir::randomInputs(*g, opts.seed);
    std::vector<ir::Tensor> vals = ir::evaluate(*g, inputs);
    double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    double flops = 0;
    for (ir::Vertex v : g->vertices())
      if (g->op(v).kind == ir::OpKind::Gemm) {
        auto ins = g->operands(v);
        flops += 2.0 * static_cast<double>(g->op(v).type.numel()) *
                 static_cast<double>(g->op(ins[0]).type.shape[1]);
      }
    out << "== reference: CPU, inputs uniform in [-1, 1) with seed " << opts.seed << ", "
        << fixed(secs, 2) << " s (" << fixed(flops / 1e9, 2) << " GFLOP in gemms)\n";
    for (ir::Vertex v : g->outputs()) {
      ir::TensorStats s = ir::stats(vals[v]);
      out << "  output %" << g->op(v).name << " " << vals[v].desc.str() << ": min "
          << fixed(s.min, 4) << ", max " << fixed(s.max, 4) << ", mean " << fixed(s.mean, 4)
          << ", rms " << fixed(s.rms, 4) << ", non-finite " << s.nonFinite << '\n';
    }
  }
  if (opts.graphviz) {
    out << "== graphviz\n";
    if (int rc = writeGraphviz(*g, opts, out, err))
      return rc;
  }
  return 0;
}

} // namespace fpat
