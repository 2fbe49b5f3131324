#include "fpat/driver/Driver.h"

#include "fpat/codegen/Codegen.h"
#include "fpat/cost/Cost.h"
#include "fpat/dsl/Library.h"
#include "fpat/ir/Reference.h"
#include "fpat/ir/Rows.h"
#include "fpat/ir/text/Text.h"
#include "fpat/match/Match.h"
#include "fpat/onnx/Import.h"
#include "fpat/runtime/Pipeline.h"
#include "fpat/support/Blas.h"
#include "fpat/support/Process.h"
#include "fpat/support/Verify.h"
#include "fpat/tune/Tuner.h"

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <map>
#include <set>
#include <sstream>
#include <unistd.h>

namespace fpat {
namespace fs = std::filesystem;

std::string builtinPatternsDir() {
  if (const char* env = std::getenv("FPAT_PATTERNS_DIR"); env && *env)
    return env;
  return "";
}

namespace {

/// Value name -> the name an ONNX model gives it, where fpat changed it (onnx::ImportResult).
using SourceNames = std::map<std::string, std::string>;

/// Writes `text` to `file`; false, with the reason, where it could not be written whole.
bool writeText(const fs::path& file, const std::string& text, std::ostream& err) {
  std::ofstream f(file, std::ios::binary);
  f << text;
  f.close();
  if (!f) {
    err << "fpatc: error: cannot write '" << file.string() << "'\n";
    return false;
  }
  return true;
}

// The CPU reference samples rows (of row-wise graphs) when its GEMMs would take more than
// this many multiply-adds, about 1-2 s with OpenBLAS on 2 cores and 10-20 s without it.
constexpr long double kSampleAboveMacs = 17179869184.0L; // 2^34
constexpr int64_t kAutoSampleRows = 64;
constexpr size_t kNoReferenceRows = 8; // the cheap check that --no-reference keeps

/// Multiply-adds of the graph's GEMMs (plain and fused).
long double referenceMacs(const ir::Graph& g) {
  long double macs = 0;
  for (ir::Vertex v : g.vertices()) {
    const ir::Op& op = g.op(v);
    if (op.kind != ir::OpKind::Gemm && op.kind != ir::OpKind::Fused)
      continue;
    const std::vector<ir::Vertex> ins = g.operands(v);
    if (ins.empty() || op.type.rank() != 2)
      continue;
    const ir::TensorDesc& a = g.op(ins[0]).type;
    if (a.rank() == 2)
      macs += static_cast<long double>(op.type.shape[0]) * op.type.shape[1] * a.shape[1];
  }
  return macs;
}

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

/// The .svg pictures are drawn for graphs of at most this many ops, by a `dot` given at most
/// FPAT_DOT_TIMEOUT seconds (default 20).
constexpr size_t kDotMaxOps = 1500;
double dotTimeout() {
  const char* e = std::getenv("FPAT_DOT_TIMEOUT");
  return e && *e ? std::strtod(e, nullptr) : 20.0; // checked by checkEnvironment
}

/// One comparison's line: the errors, the values that were not finite, and the verdict.
std::string verdict(const runtime::Agreement& c) {
  return "max abs err " + sci(c.maxAbs) + ", max rel err " + sci(c.maxRel) +
         (c.nonFinite ? ", " + std::to_string(c.nonFinite) + " non-finite (NaN or inf)" : "") +
         " -> " + (c.pass ? "PASS" : "FAIL");
}

/// Where non-finite values first appear in an evaluated graph (topological order): the op, how
/// many, and whether its operands were all finite (then it made them). "" when none are.
std::string firstNonFinite(const ir::Graph& g, const std::vector<ir::Tensor>& vals,
                           const ir::InputMap& inputs, const ir::InputMap& rows) {
  std::vector<size_t> bad(g.size(), 0);
  auto countOf = [&](ir::Vertex v) -> std::optional<size_t> {
    const ir::Tensor* t = vals[v].data.empty() ? nullptr : &vals[v];
    if (!t && g.op(v).kind == ir::OpKind::Input) {
      auto it = rows.find(g.op(v).name);
      if (it == rows.end())
        it = inputs.find(g.op(v).name);
      if (it == inputs.end())
        return std::nullopt;
      t = &it->second;
    }
    if (!t)
      return std::nullopt;
    return ir::stats(*t).nonFinite;
  };
  auto order = ir::topologicalOrder(g);
  if (!order)
    return "";
  for (ir::Vertex v : *order) {
    const std::optional<size_t> n = countOf(v);
    if (!n || *n == 0)
      continue;
    const ir::Op& op = g.op(v);
    std::string what = op.kind == ir::OpKind::Input        ? (op.weight ? "weight" : "input")
                       : op.kind == ir::OpKind::Activation ? "activation " + op.fn
                                                           : ir::opKindName(op.kind);
    std::string s = "the first non-finite values (NaN or inf) are those of %" + op.name + " (" +
                    what + " " + op.type.str() + "): " + std::to_string(*n) + " of " +
                    std::to_string(op.type.numel());
    if (op.kind != ir::OpKind::Input)
      s += "; its operands are finite: the " + std::string(ir::dtypeName(op.type.dtype)) +
           " result overflows or the op is undefined there";
    return s;
  }
  return "";
}

int writeGraphviz(const ir::Graph& g, const std::string& stem, const FpatcOptions& opts,
                  std::ostream& out, std::ostream& err,
                  const std::vector<ir::DotCluster>& clusters = {}) {
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
    ir::writeDot(g, f, clusters);
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
  // dot's layout grows much faster than the graph (a 250-op graph whose one weight feeds 50
  // GEMMs took over 200 s): the picture is bounded, so that the default run never waits on it.
  const std::string svgPath = (fs::path(opts.outDir) / (stem + ".svg")).string();
  const std::string byHand = "dot -Tsvg " + dotPath + " -o " + svgPath;
  if (g.size() > kDotMaxOps) {
    out << "  skipped .svg: " << g.size() << " ops, more than " << kDotMaxOps
        << " (Graphviz would take minutes); run '" << byHand << "' for it\n";
    return 0;
  }
  const double timeout = dotTimeout();
  out << std::flush;
  ProcessResult r = runProcess({"dot", "-Tsvg", dotPath, "-o", svgPath}, timeout);
  if (r.timedOut) {
    std::error_code rm;
    fs::remove(svgPath, rm);
    out << "  skipped .svg: Graphviz 'dot' did not finish in " << fixed(timeout, 0)
        << " s (FPAT_DOT_TIMEOUT); run '" << byHand << "' for it\n";
    return 0;
  }
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
  if (std::string why; !readFile(path, text, &why)) {
    diags.error({}, "cannot read pattern file '" + path + "': " + why);
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
  dsl::MatcherTable raiseTable;   // Raise patterns, run before fusion
  dsl::MatcherTable rewriteTable; // Rewrite patterns, run after raising
  dsl::PatternLibrary library;    // activation bodies, for codegen
  ir::ActivationSet activations;
  ir::ActivationLibrary reference;
  size_t userPatterns = 0;
};

bool loadPatterns(const FpatcOptions& opts, SourceManager& sm, DiagEngine& diags, Patterns& p,
                  std::ostream& err) {
  std::vector<std::string> includes = opts.includeDirs;
  // The built-in activation bodies come from the .fpat sources embedded in the binary (or
  // $FPAT_PATTERNS_DIR); the built-in table was generated from the same files at build time.
  const std::string dir = builtinPatternsDir();
  std::optional<dsl::Compilation> builtin;
  if (!dir.empty()) {
    includes.push_back(dir);
    builtin = compilePatterns((fs::path(dir) / "all.fpat").string(), sm, diags, includes);
  } else {
    builtin = dsl::compileBuiltinPatterns(sm, diags);
  }
  if (!builtin) {
    err << "fpatc: error: the built-in patterns"
        << (dir.empty() ? std::string() : " in '" + dir + "' (FPAT_PATTERNS_DIR)")
        << " do not compile\n";
    return false;
  }
  dsl::PatternLibrary lib = builtin->library;
  dsl::PatternLibrary earlier = builtin->library; // patterns of the files compiled so far
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
    // A built-in file may also be reached through the user's -I (the source tree's patterns/):
    // the same name with the same text is the same file.
    auto isBuiltin = [&](const SourceLoc& loc) {
      const SourceFile& f = sm.file(loc.file);
      const std::string_view* same = dsl::embeddedPattern(fs::path(f.name).filename().string());
      return builtinFiles.count(fs::weakly_canonical(f.name).string()) > 0 ||
             (dir.empty() && same && *same == f.text);
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
    // Raise and Rewrite rules share one namespace: --explain names them alike.
    auto addRule = [&](const dsl::PatternDef& r, std::vector<dsl::PatternDef>& into,
                       const char* what) {
      if (isBuiltin(r.loc))
        return;
      for (const std::vector<dsl::PatternDef>* rules : {&lib.raises, &lib.rewrites}) {
        auto prev = std::find_if(rules->begin(), rules->end(),
                                 [&](const dsl::PatternDef& d) { return d.name == r.name; });
        if (prev != rules->end()) {
          diags.error(r.loc, std::string(what) + " '" + r.name + "' is already defined");
          diags.note(prev->loc, "previous definition is here");
          clashed = true;
          return;
        }
      }
      into.push_back(r);
    };
    for (const dsl::PatternDef& r : user->library.raises)
      addRule(r, lib.raises, "raise");
    for (const dsl::PatternDef& r : user->library.rewrites)
      addRule(r, lib.rewrites, "rewrite");
    if (clashed)
      return false;
    dsl::MatcherTable userTable = dsl::compileMatcherTable(mine, sm, diags);
    dsl::warnShadowedBy(earlier, mine, diags); // built-in ones win ties: say so
    earlier.patterns.insert(earlier.patterns.end(), mine.patterns.begin(), mine.patterns.end());
    dsl::MatcherTable merged;
    std::string clash;
    if (!match::mergeTables(p.table, userTable, merged, clash)) {
      for (const dsl::PatternDef& pd : mine.patterns)
        if (pd.name == clash)
          diags.error(pd.loc, "pattern '" + clash +
                                  "' is already defined by the built-in "
                                  "patterns; choose another name");
      return false;
    }
    p.table = std::move(merged);
    p.userPatterns += mine.patterns.size();
  }
  dsl::PatternLibrary raises;
  raises.patterns = lib.raises;
  p.raiseTable = dsl::compileMatcherTable(raises, sm, diags);
  dsl::PatternLibrary rewrites;
  rewrites.patterns = lib.rewrites;
  p.rewriteTable = dsl::compileMatcherTable(rewrites, sm, diags);
  p.activations = lib.activationSet();
  p.reference = lib.referenceActivations();
  p.library = std::move(lib);
  return true;
}

/// How far a half-precision run of an f32 model may be from the model itself, relative to the
/// output's rms (compareToReference): f16 weights and intermediates each round by 2^-11, bf16
/// ones by 2^-8.
double modelTolerance(ir::DType t) {
  return t == ir::DType::BF16 ? 8e-2 : 3e-2;
}

/// Imports an ONNX model; problems are printed as `FILE: error: node 'N' (Op): message`.
bool importOnnx(const FpatcOptions& opts, const std::string& bytes, const Patterns& pats,
                std::optional<ir::Graph>& g, std::optional<ir::Graph>& model,
                std::vector<std::string>& notes, SourceNames& sourceNames, std::ostream& err) {
  onnx::ImportOptions io;
  io.dims = opts.dims;
  if (opts.input != "-") // external data files lie beside the model
    io.modelDir = fs::absolute(fs::path(opts.input)).parent_path().string();
  // Imported as stored (f32 or f16), then converted: an f32 model gives the graph that runs
  // and the model as exported (the oracle of the half-precision run) from one import.
  const std::optional<ir::DType> want =
      opts.precision.empty() ? std::optional<ir::DType>(ir::DType::F16) // the tensor cores'
                             : ir::parseDType(opts.precision);
  onnx::ImportResult r = onnx::importModel(bytes, io, pats.activations);
  const std::string file = inputName(opts.input);
  for (const onnx::ImportProblem& p : r.problems)
    err << file
        << ": error: " << (p.node.empty() ? "" : "node '" + p.node + "' (" + p.opType + "): ")
        << p.message << "\n";
  if (!r.problems.empty()) {
    if (std::any_of(r.problems.begin(), r.problems.end(), [](const onnx::ImportProblem& p) {
          return p.message.rfind("op type ", 0) == 0;
        })) {
      std::string list;
      for (const std::string& o : onnx::supportedOpTypes())
        list += (list.empty() ? "" : ", ") + o;
      err << file << ": note: fpat imports these op types: " << list << "\n";
    }
    err << r.problems.size() << " error" << (r.problems.size() == 1 ? "" : "s") << " generated.\n";
    return false;
  }
  notes = r.notes;
  sourceNames = r.sourceNames;
  notes.insert(
      notes.begin(),
      "ONNX opset " + std::to_string(r.opset) + ", " + ir::dtypeName(r.storedAs) + " model" +
          (*want != r.storedAs
               ? std::string(", run in ") + ir::dtypeName(*want) +
                     (opts.precision.empty() ? " (--precision f32 keeps f32: CPU only)" : "")
               : std::string()) +
          "; weights from its initializers");
  if (*want == r.storedAs) {
    g = std::move(r.graph);
  } else {
    g = onnx::convertPrecision(*r.graph, *want);
    if (r.storedAs == ir::DType::F32)
      model = std::move(r.graph);
  }
  // Weights that are not finite as the run holds them: NaN or inf in the model, or values
  // beyond the run's type (every output they reach fails its checks; say why up front).
  const ir::Graph* asExported = model ? &*model : nullptr;
  for (ir::Vertex v : g->vertices()) {
    const ir::Op& op = g->op(v);
    if (op.kind == ir::OpKind::Constant && asExported && v < asExported->size() &&
        asExported->op(v).value != op.value) {
      std::ostringstream os;
      os << std::setprecision(10) << "constant %" << op.name << ": " << asExported->op(v).value
         << " is beyond " << ir::dtypeName(op.type.dtype) << "'s range; the run uses " << op.value
         << " (as a mask's fill, the same: no weight in the softmax)";
      notes.push_back(os.str());
    }
    if (op.kind != ir::OpKind::Input || !op.data)
      continue;
    size_t bad = 0, inModel = 0;
    for (float x : *op.data)
      bad += !std::isfinite(x);
    if (bad == 0)
      continue;
    if (asExported && v < asExported->size() && asExported->op(v).name == op.name &&
        asExported->op(v).data)
      for (float x : *asExported->op(v).data)
        inModel += !std::isfinite(x);
    else
      inModel = bad;
    notes.push_back(
        "weight %" + op.name + ": " + std::to_string(bad) + " of " +
        std::to_string(op.data->size()) + " values are not finite in " +
        ir::dtypeName(op.type.dtype) + " (" + std::to_string(inModel) + " NaN or inf in the model" +
        (bad > inModel
             ? ", " + std::to_string(bad - inModel) + " beyond " + ir::dtypeName(op.type.dtype) +
                   "'s largest value" +
                   (op.type.dtype == ir::DType::F16 ? " (--precision bf16 keeps them)" : "")
             : std::string()) +
        ")");
  }
  return true;
}

/// The name a value's file goes by: the model's name for it where fpat changed it and it can
/// name a file, else the value's name.
std::string fileStem(const std::string& name, const SourceNames& sourceNames) {
  auto it = sourceNames.find(name);
  if (it == sourceNames.end())
    return name;
  const std::string& s = it->second;
  const bool usable = !s.empty() && s.size() <= 200 && s != "." && s != ".." &&
                      s.find_first_of(std::string("/\0", 2)) == std::string::npos;
  return usable ? s : name;
}

/// Replaces random inputs by DIR/NAME.f16 where that file exists: raw little-endian binary16,
/// row-major, exactly numel * 2 bytes. NAME is the input's name as the model writes it, or as
/// fpat names the value. A mask (an ONNX model's integer or bool input) is read from NAME.i64,
/// NAME.i32 or NAME.bool (one byte each) as the model's type is, or NAME.f16; its values must
/// be exact in the graph's type. `read` counts the inputs read; a folder where no file is named
/// after any input is an error (the run would silently use random inputs).
bool loadInputs(const ir::Graph& g, const std::string& dir, const SourceNames& sourceNames,
                std::map<std::string, ir::Tensor>& in, size_t& read, std::ostream& out,
                std::ostream& err) {
  read = 0;
  std::vector<std::string> expected;
  for (ir::Vertex v : g.vertices()) {
    const ir::Op& op = g.op(v);
    if (op.kind != ir::OpKind::Input)
      continue;
    // NAME.f16 or NAME.bf16, as the input's type says (f32 inputs cannot be read); a mask's
    // integer forms first.
    const std::string stem = fileStem(op.name, sourceNames);
    struct Form {
      std::string ext;
      size_t bytes; // per element
    };
    std::vector<Form> forms;
    if (op.mask)
      forms = {{".i64", 8}, {".i32", 4}, {".bool", 1}};
    forms.push_back({std::string(".") + ir::dtypeName(op.type.dtype), 2});
    std::error_code ec;
    fs::path file;
    Form form;
    for (const Form& f : forms) {
      for (const std::string& base : {stem, op.name}) {
        fs::path p = fs::path(dir) / (base + f.ext);
        if (file.empty() && fs::exists(p, ec)) {
          file = p;
          form = f;
        }
      }
      expected.push_back(stem + f.ext + " (" + op.type.str() + ")");
    }
    if (file.empty())
      continue;
    std::string bytes, why;
    const size_t want = static_cast<size_t>(op.type.numel()) * form.bytes;
    // A pipe or device is read to one byte past the size wanted: enough to say it is longer.
    const bool regular = fs::is_regular_file(file, ec);
    if (form.bytes == 2 && !ir::isHalfPrecision(op.type.dtype)) {
      err << "fpatc: error: " << file.string() << ": --inputs reads f16 and bf16 tensors, not "
          << ir::dtypeName(op.type.dtype) << " (%" << op.name << ")\n";
      return false;
    }
    const bool whole = readFile(file.string(), bytes, &why, regular ? kMaxInputBytes : want + 1);
    if (!whole && !why.empty() && why.find("longer than") == std::string::npos) {
      err << "fpatc: error: " << file.string() << ": " << why << "\n";
      return false;
    }
    const std::string what = form.bytes == 2 ? ir::dtypeName(op.type.dtype) : form.ext.substr(1);
    if (!whole || bytes.size() != want) {
      err << "fpatc: error: " << file.string() << ": expected " << want << " bytes of " << what
          << " for %" << op.name << " " << op.type.str() << ", found "
          << (whole ? std::to_string(bytes.size()) : "more") << "\n";
      return false;
    }
    ir::Tensor& t = in[op.name];
    for (size_t i = 0; i < t.data.size(); ++i) {
      const auto* p = reinterpret_cast<const unsigned char*>(bytes.data()) + i * form.bytes;
      uint64_t u = 0;
      for (size_t k = form.bytes; k-- > 0;)
        u = u << 8 | p[k];
      if (form.bytes == 2) {
        t.data[i] = ir::fromBits(static_cast<uint16_t>(u), op.type.dtype);
        continue;
      }
      // Two's complement of the file's width, then exactly what the graph's type holds.
      const double x = form.bytes == 8   ? static_cast<double>(static_cast<int64_t>(u))
                       : form.bytes == 4 ? static_cast<double>(static_cast<int32_t>(u))
                                         : static_cast<double>(u != 0);
      t.data[i] = static_cast<float>(ir::roundTo(x, op.type.dtype));
      if (static_cast<double>(t.data[i]) != x) {
        err << "fpatc: error: " << file.string() << ": element " << i << " of %" << op.name
            << " is " << static_cast<int64_t>(x) << ", which " << ir::dtypeName(op.type.dtype)
            << " cannot hold exactly (a mask holds 0s and 1s)\n";
        return false;
      }
    }
    out << "  input %" << op.name << " read from " << file.string() << "\n";
    ++read;
  }
  if (read == 0 && !expected.empty()) {
    err << "fpatc: error: --inputs '" << dir << "': no file there is named after an input\n"
        << "fpatc: note: the inputs' files would be:";
    for (const std::string& e : expected)
      err << " " << e;
    err << "\n";
    return false;
  }
  return true;
}

/// --expect DIR: each output NAME against DIR/NAME.f32 (raw little-endian f32, row-major), what
/// another framework computed on the same inputs: an independent oracle of the import itself,
/// which the checks against "the f32 model" (made by the same import) cannot be. The f32 model
/// agrees with it to f32 roundings (tolerance 1e-3); without one, the graph's reference does
/// to its own precision's. Returns 1 when a check fails or no file is found.
int checkExpected(const FpatcOptions& opts, const ir::Graph& g, const SourceNames& sourceNames,
                  const std::vector<ir::Tensor>& vals, const std::vector<ir::Tensor>& modelOutputs,
                  const std::optional<ir::RowSample>& sample, std::ostream& out,
                  std::ostream& err) {
  const bool model = !modelOutputs.empty();
  const ir::DType dt = g.op(g.outputs()[0]).type.dtype;
  const double tol = model ? 1e-3 : dt == ir::DType::F32 ? 1e-3 : modelTolerance(dt);
  out << "  " << (model ? "the f32 model" : "the graph") << " vs " << opts.expectDir
      << " (rel err <= " << sci(tol) << "):\n";
  int rc = 0;
  size_t found = 0;
  for (size_t i = 0; i < g.outputs().size(); ++i) {
    const ir::Op& op = g.op(g.outputs()[i]);
    const fs::path file = fs::path(opts.expectDir) / (fileStem(op.name, sourceNames) + ".f32");
    std::error_code ec;
    if (!fs::exists(file, ec)) {
      out << "    %" << op.name << ": no " << file.filename().string() << ", not checked\n";
      continue;
    }
    ++found;
    const size_t want = static_cast<size_t>(op.type.numel()) * 4;
    std::string bytes, why;
    if (!readFile(file.string(), bytes, &why, want + 1) || bytes.size() != want) {
      err << "fpatc: error: " << file.string() << ": "
          << (why.empty() || why.find("longer than") != std::string::npos
                  ? "expected " + std::to_string(want) + " bytes of f32 for %" + op.name + " " +
                        op.type.str() + ", found " +
                        (bytes.size() > want ? "more" : std::to_string(bytes.size()))
                  : why)
          << "\n";
      rc = 1;
      continue;
    }
    ir::Tensor t;
    t.desc = {op.type.shape, ir::DType::F32};
    t.data.resize(want / 4);
    std::memcpy(t.data.data(), bytes.data(), want); // little-endian hosts only, as --inputs
    const ir::Tensor expected = sample ? ir::sliceRows(t, sample->picked) : std::move(t);
    const ir::Tensor& got = model ? modelOutputs[i] : vals[g.outputs()[i]];
    const runtime::Agreement c = runtime::compareToReference(got, expected, tol);
    out << "    %" << op.name << ": " << verdict(c) << "\n";
    rc = c.pass ? rc : 1;
  }
  if (found == 0) {
    err << "fpatc: error: --expect '" << opts.expectDir
        << "': no file there is named after an output (NAME.f32)\n";
    return 1;
  }
  return rc;
}

/// Writes a tensor as raw little-endian binary16 (the format --inputs reads).
bool saveTensor(const ir::Tensor& t, const fs::path& file, std::ostream& err) {
  std::string bytes(t.data.size() * 2, '\0');
  for (size_t i = 0; i < t.data.size(); ++i) {
    uint16_t h = ir::toBits(t.data[i], t.desc.dtype);
    bytes[2 * i] = static_cast<char>(h & 0xff);
    bytes[2 * i + 1] = static_cast<char>(h >> 8);
  }
  std::ofstream f(file, std::ios::binary);
  f << bytes;
  if (!f) {
    err << "fpatc: error: cannot write " << file.string() << "\n";
    return false;
  }
  return true;
}

/// --time: the fused graph (its executor, inputs uploaded) and the same graph unfused (every
/// op its own kernel, fpat's plain GEMM for GEMMs), each timed in steady state: warm-up runs,
/// then the median of `opts.timeRuns`, inputs rotated over copies that exceed twice the L2 so
/// that no run finds the last one's data in cache; then each op's own time the same way.
int timeGraphs(const FpatcOptions& opts, cuda::Driver& drv, runtime::Executor& fusedEx,
               const ir::Graph& fused, const ir::Graph& original, const Patterns& pats,
               const runtime::BuildOptions& bopts, const std::map<std::string, ir::Tensor>& inputs,
               std::ostream& out, std::ostream& err) {
  const int warmup = 3, reps = opts.timeRuns;
  const size_t workingSet = 2 * static_cast<size_t>(std::max(drv.device().l2Bytes, 1 << 20));
  struct Timed {
    double median = 0, low = 0, high = 0;
    std::vector<std::pair<ir::Vertex, double>> ops;
  };
  auto measure = [&](runtime::Executor& ex) {
    std::vector<float> t = ex.time(warmup, reps, workingSet);
    std::sort(t.begin(), t.end());
    Timed r;
    r.median = t[t.size() / 2];
    r.low = t[t.size() / 10];
    r.high = t[t.size() - 1 - t.size() / 10];
    r.ops = ex.timeOps(warmup, reps, workingSet);
    return r;
  };
  out << "== time: " << drv.device().name << ", steady state: " << warmup
      << " warm-up runs, then the median of " << reps << " (inputs rotated over "
      << fusedEx.rotationsFor(workingSet)
      << " copies, twice the L2 in all)\n  timing the fused graph...\n"
      << std::flush;
  Timed f;
  Timed u;
  runtime::BuildResult ub;
  try {
    f = measure(fusedEx);
    out << "  compiling the unfused graph (every op its own kernel)...\n" << std::flush;
    runtime::BuildOptions uopts = bopts;
    uopts.tiles.clear();
    uopts.tile = nullptr;
    uopts.appendInDecode = false; // kv_append's copies too
    ub = runtime::buildKernels(original, pats.library.activations, uopts);
    if (!ub.error.empty()) {
      err << "fpatc: error: --time: the unfused graph: " << ub.error << "\n";
      return 1;
    }
    out << "  timing the unfused graph...\n" << std::flush;
    runtime::Executor ux(drv, ub.graph);
    ux.run(inputs, false);
    u = measure(ux);
  } catch (const std::exception& e) {
    err << "fpatc: error: --time: GPU execution failed: " << e.what() << "\n";
    return 1;
  }
  auto table = [&](const char* what, const ir::Graph& g, const Timed& t) {
    double sum = 0;
    for (const auto& [v, ms] : t.ops)
      sum += ms;
    out << "  " << what << ": " << t.ops.size() << " kernel" << (t.ops.size() == 1 ? "" : "s")
        << ", " << fixed(t.median, 4) << " ms (runs " << fixed(t.low, 4) << "-" << fixed(t.high, 4)
        << " ms, 10th-90th percentile; the ops timed apart sum to " << fixed(sum, 4) << " ms)\n";
    for (const auto& [v, ms] : t.ops) {
      const ir::Op& op = g.op(v);
      out << "    %" << op.name << " "
          << (op.kind == ir::OpKind::Fused        ? op.fused.pattern
              : op.kind == ir::OpKind::Activation ? op.fn
                                                  : ir::opKindName(op.kind))
          << " " << op.type.shapeStr() << ": " << fixed(ms, 4) << " ms\n";
    }
  };
  table("fused", fused, f);
  table("unfused", original, u);
  out << "  speedup of fusion: " << fixed(u.median / f.median, 2) << "x (" << fixed(u.median, 4)
      << " ms unfused / " << fixed(f.median, 4) << " ms fused)\n";
  return 0;
}

/// The configurations of the fused graph's tunable ops (GEMM tiles, flash-attention
/// variants): tuned now (fpatc tune, with a GPU), from the tuning cache, or the heuristic;
/// each also in bopts.tiles or bopts.flash. False where tuning failed (said on err).
bool chooseConfigs(const FpatcOptions& opts, cuda::Driver* drv, const std::string& why,
                   const ir::Graph& fused, const Patterns& pats, int arch,
                   runtime::BuildOptions& bopts, std::map<ir::Vertex, tune::Choice>& choices,
                   std::ostream& out, std::ostream& err) {
  tune::TuningCache cache(opts.tuneCache);
  const std::string nvccVer = runtime::nvccIdentity(runtime::findNvcc({}), opts.nvccFlags);
  std::vector<ir::Vertex> ops;
  for (ir::Vertex v : fused.vertices())
    if (tune::tunable(fused, v, arch))
      ops.push_back(v);
  if (opts.tune && !drv)
    out << "== tune: skipped: " << why << "; the heuristic picks every configuration\n";
  if (opts.tune && drv) {
    out << "== tune: " << ops.size() << " op" << (ops.size() == 1 ? "" : "s") << " on "
        << drv->device().name << ", results in " << cache.path() << "\n";
    auto t0 = std::chrono::steady_clock::now();
    tune::TuneOptions topts;
    topts.retune = opts.retune;
    topts.cacheDir = opts.cacheDir;
    topts.jobs = opts.jobs;
    topts.nvccFlags = opts.nvccFlags;
    topts.log = &out;
    for (size_t i = 0; i < ops.size(); ++i) {
      const ir::Op& op = fused.op(ops[i]);
      out << "  [" << i + 1 << "/" << ops.size() << "] %" << op.name << " "
          << (op.kind == ir::OpKind::Fused ? op.fused.pattern : ir::opKindName(op.kind)) << " "
          << op.type.shapeStr() << ":\n"
          << std::flush;
      try {
        tune::Choice c = tune::tune(*drv, fused, ops[i], pats.library.activations, cache, topts);
        choices[ops[i]] = c;
        double spent = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        out << "    => " << (c.source == "cache" ? "cached " : "best ") << c.configName() << " "
            << fixed(c.ms, 4) << " ms (heuristic " << fixed(c.heuristicMs, 4) << " ms)";
        if (c.source == "tuned")
          out << ", " << c.tried << " configs tried, " << c.rejected << " rejected";
        out << "; " << fixed(spent, 1) << " s so far, about "
            << fixed(spent / static_cast<double>(i + 1) * static_cast<double>(ops.size() - i - 1),
                     0)
            << " s left\n";
      } catch (const std::exception& e) {
        out << "failed\n";
        err << "fpatc: error: tuning %" << op.name << ": " << e.what() << "\n";
        return false;
      }
    }
  }
  for (ir::Vertex v : ops)
    if (!choices.count(v))
      choices[v] = tune::choose(fused, v, pats.library.activations, cache, arch, bopts.sms, nvccVer,
                                opts.retune);
  for (const std::string& w : cache.takeWarnings())
    err << "fpatc: warning: " << w << "\n";
  for (auto& [v, c] : choices)
    if (c.flash)
      bopts.flash[v] = *c.flash;
    else
      bopts.tiles[v] = c.config;
  return true;
}

/// --emit=cuda: each kernel's source (once per name) and the kernel headers into --out-dir,
/// the sources' paths on out. Returns the exit code.
int emitCuda(const FpatcOptions& opts, const ir::Graph& fused, const Patterns& pats,
             const runtime::BuildOptions& bopts, std::ostream& out, std::ostream& err) {
  codegen::CodegenOptions copts;
  copts.arch = bopts.arch;
  copts.sms = bopts.sms;
  copts.sources = bopts.patternSources;
  copts.appendInDecode = bopts.appendInDecode;
  std::error_code ec;
  fs::create_directories(opts.outDir, ec);
  std::set<std::string> written;
  try {
    for (ir::Vertex v : fused.vertices()) {
      auto tile = bopts.tiles.find(v);
      copts.tile = tile == bopts.tiles.end() ? nullptr : &tile->second;
      auto flash = bopts.flash.find(v);
      copts.flash = flash == bopts.flash.end() ? nullptr : &flash->second;
      codegen::KernelUnit u = codegen::generate(fused, v, pats.library.activations, copts);
      if (u.launches.empty() || !written.insert(u.name).second)
        continue;
      const fs::path file = fs::path(opts.outDir) / (u.name + ".cu");
      if (!writeText(file, u.source, err))
        return 1;
      out << file.string() << "\n";
    }
  } catch (const codegen::CodegenError& e) {
    err << "fpatc: error: " << e.what() << "\n";
    return 1;
  }
  for (auto& [name, text] : codegen::kernelHeaders())
    if (!writeText(fs::path(opts.outDir) / std::string(name), std::string(text), err))
      return 1;
  return 0;
}

/// Codegen, nvcc, execution and validation. Returns the exit code contribution.
int gpuStages(const FpatcOptions& opts, const ir::Graph& fusedIn, const Patterns& pats,
              const std::map<std::string, ir::Tensor>* inputs,
              const std::vector<ir::Tensor>* reference, const std::vector<int64_t>* sampledRows,
              const ir::Graph& original, const SourceNames& sourceNames, std::ostream& out,
              std::ostream& err, const std::vector<ir::Tensor>* modelOutputs = nullptr) {
  std::string why = !opts.run ? "--no-run" : "only --emit=" + opts.emit + " was asked for";
  cuda::Driver* drv = opts.run && opts.emit.empty() ? cuda::Driver::get(&why) : nullptr;
  const int arch = opts.arch ? opts.arch : drv ? drv->device().arch : 90;
  // Kernels some families have on one GPU only (the dual GEMM: sm_90) run as smaller ones.
  size_t splitCount = 0;
  const ir::Graph fused = match::lowerForArch(fusedIn, arch, &splitCount);
  if (splitCount > 0)
    out << "== split: " << splitCount << " fused op" << (splitCount == 1 ? "" : "s")
        << " into smaller kernels: sm_" << arch << " has no kernel of their family\n";
  runtime::BuildOptions bopts;
  bopts.arch = arch;
  bopts.sms = drv ? drv->device().sms : 132;
  bopts.cacheDir = opts.cacheDir;
  bopts.jobs = opts.jobs;
  bopts.ptx = opts.ptx;
  bopts.nvccFlags = opts.nvccFlags;
  for (const dsl::PatternMeta& m : pats.table.patterns)
    bopts.patternSources[m.name] = displayPath(m.file) + ":" + std::to_string(m.line);

  // Kernel configurations: tuned now (fpatc tune), from the tuning cache, or the heuristic.
  std::map<ir::Vertex, tune::Choice> choices;
  if (!chooseConfigs(opts, drv, why, fused, pats, arch, bopts, choices, out, err))
    return 1;
  if (opts.emit == "cuda")
    return emitCuda(opts, fused, pats, bopts, out, err);
  if (runtime::findNvcc({}).empty()) {
    out << "== nvcc: skipped: nvcc not found (install the CUDA toolkit, put nvcc on PATH or set "
           "FPAT_NVCC); nothing was compiled or run\n";
    return opts.requireGpu ? 77 : 0;
  }
  runtime::BuildResult built = runtime::buildKernels(fused, pats.library.activations, bopts);
  runtime::CompiledGraph& cg = built.graph;
  if (!built.error.empty() && built.kernels.empty()) { // code generation failed: no units
    err << "fpatc: error: " << built.error << (built.error.back() == '\n' ? "" : "\n");
    return 1;
  }
  size_t kernels = 0;
  std::set<std::string> names;
  for (const codegen::KernelUnit& u : cg.units)
    if (!u.launches.empty()) {
      ++kernels;
      names.insert(u.name);
    }
  out << "== codegen: " << kernels << " kernel" << (kernels == 1 ? "" : "s")
      << (names.size() < kernels ? " (" + std::to_string(names.size()) + " distinct)" : "")
      << " for sm_" << arch << (opts.arch || drv ? "" : " (no GPU here; pass --arch to choose)")
      << "\n";
  for (ir::Vertex v : fused.vertices()) {
    const codegen::KernelUnit& u = cg.units[v];
    if (ir::isColumnView(fused, v))
      out << "  %" << fused.op(v).name
          << " = slice: no kernel (its readers read its columns in place)\n";
    if (u.launches.empty()) {
      if (!u.what.empty()) // written by another op's kernel
        out << "  " << u.what << "\n";
      continue;
    }
    out << "  " << u.what << ": " << u.name;
    if (auto c = choices.find(v); c != choices.end())
      out << " (config " << (c->second.flash ? c->second.flash->str() : u.tile.str()) << ": "
          << c->second.source << ")";
    out << "\n";
  }
  for (const std::string& w : built.warnings)
    err << "fpatc: warning: " << w << "\n";
  std::set<std::string> distinct; // ops that share a kernel share its one nvcc run
  for (const runtime::CompiledKernel& k : built.kernels)
    distinct.insert(k.name);
  const int failed = static_cast<int>(distinct.size()) - built.compiled - built.cached;
  out << "== nvcc: " << built.compiled << " compiled, " << built.cached << " from the cache ("
      << (opts.cacheDir.empty() ? runtime::defaultCacheDir() : opts.cacheDir) << "), "
      << fixed(built.seconds, 1) << " s"
      << (failed ? ", " + std::to_string(failed) + " FAILED" : "") << "\n";
  if (failed) {
    err << "fpatc: error: " << built.error;
    std::vector<std::string> extra = opts.nvccFlags;
    for (const std::string& f : runtime::nvccFlagsFromEnvironment())
      extra.push_back(f);
    if (!extra.empty()) {
      err << "fpatc: note: nvcc ran with these extra flags (--nvcc-flag, FPAT_NVCC_FLAGS):";
      for (const std::string& f : extra)
        err << " " << f;
      err << "\n";
    }
    return 1;
  }
  if (!opts.run) {
    out << "== run: skipped (--no-run)\n";
    return 0;
  }
  if (!drv) {
    out << "== run: skipped: " << why << "; the kernels were compiled but not executed\n";
    if (opts.time)
      err << "fpatc: --time: no GPU to time on (" << why << ")\n";
    return opts.requireGpu || opts.time ? 77 : 0;
  }
  const cuda::DeviceInfo& dev = drv->device();
  if (dev.arch != arch) {
    out << "== run: skipped: kernels are for sm_" << arch << " but the GPU is sm_" << dev.arch
        << "\n";
    return opts.requireGpu ? 77 : 0;
  }
  runtime::RunResult rr;
  int timeRc = 0;
  try {
    runtime::Executor ex(*drv, cg);
    rr = ex.run(*inputs);
    if (opts.time)
      timeRc = timeGraphs(opts, *drv, ex, fused, original, pats, bopts, *inputs, out, err);
  } catch (const std::exception& e) {
    err << "fpatc: error: GPU execution failed: " << e.what() << "\n";
    return 1;
  }
  if (timeRc != 0)
    return timeRc;
  out << "== run: " << dev.name << " (sm_" << dev.arch << ", " << dev.sms
      << " SMs): " << rr.launches << " launches, " << fixed(rr.milliseconds, 3)
      << " ms, device memory " << fixed(static_cast<double>(rr.deviceBytes) / (1 << 20), 1)
      << " MiB (one buffer per value: " << fixed(static_cast<double>(rr.naiveBytes) / (1 << 20), 1)
      << " MiB)\n";
  if (!opts.outputsDir.empty()) {
    std::error_code ec;
    fs::create_directories(opts.outputsDir, ec);
    for (size_t i = 0; i < original.outputs().size(); ++i) {
      const fs::path file = fs::path(opts.outputsDir) /
                            (fileStem(original.op(original.outputs()[i]).name, sourceNames) + "." +
                             ir::dtypeName(rr.outputs[i].desc.dtype));
      if (!saveTensor(rr.outputs[i], file, err))
        return 1;
      out << "  wrote " << file.string() << "\n";
    }
  }
  // Without the reference (--no-reference), a few sampled rows still check the GPU where the
  // graph is row-wise: they cost next to nothing.
  std::vector<ir::Tensor> cheap;
  std::optional<ir::RowSample> few;
  if (!reference && inputs) {
    std::string whyNot;
    few = ir::sampleRows(original, kNoReferenceRows, &whyNot);
    if (!few) {
      out << "== validate: skipped (--no-reference; rows cannot be sampled: " << whyNot << ")\n";
      return 0;
    }
    const auto rows = ir::sliceInputs(original, *few, *inputs);
    cheap = ir::evaluate(few->graph, *inputs, pats.reference, {}, &rows);
    reference = &cheap;
    sampledRows = &few->picked;
  }
  if (!reference) {
    out << "== validate: skipped (--no-reference)\n";
    return 0;
  }
  out << "== validate: GPU vs CPU reference";
  if (sampledRows)
    out << " on " << sampledRows->size() << " sampled rows"
        << (few ? " (--no-reference: the full reference was skipped)" : "");
  out << " (pass: all finite, rel err <= "
      << sci(runtime::relTolerance(original.op(original.outputs()[0]).type.dtype)) << ")\n";
  int rc = 0;
  for (size_t i = 0; i < original.outputs().size(); ++i) {
    const ir::Tensor& want = (*reference)[original.outputs()[i]];
    const ir::Tensor got =
        sampledRows ? ir::sliceRows(rr.outputs[i], *sampledRows) : std::move(rr.outputs[i]);
    runtime::Agreement c = runtime::compareToReference(got, want);
    out << "  %" << original.op(original.outputs()[i]).name << " " << want.desc.str() << ": "
        << verdict(c) << "\n";
    rc = c.pass ? rc : 1;
    if (modelOutputs) // kept for the comparison with the f32 model below
      rr.outputs[i] = got;
  }
  if (modelOutputs) {
    const ir::DType dt = original.op(original.outputs()[0]).type.dtype;
    out << "== validate: GPU vs the f32 model as exported (pass: all finite, rel err <= "
        << sci(modelTolerance(dt)) << ": the run rounds weights and intermediates to "
        << ir::dtypeName(dt) << ")\n";
    for (size_t i = 0; i < original.outputs().size(); ++i) {
      runtime::Agreement c =
          runtime::compareToReference(rr.outputs[i], (*modelOutputs)[i], modelTolerance(dt));
      out << "  %" << original.op(original.outputs()[i]).name << ": " << verdict(c) << "\n";
      rc = c.pass ? rc : 1;
    }
  }
  return rc;
}

/// Why the host cannot hold what this run would put in memory, or "": the CPU reference keeps
/// every value of the graph (and of the fused graph) as f32, the random inputs twice (f32 and
/// the f16 bits uploaded to the GPU).
/// `where` is set to the largest value's definition, where the error points.
/// `ref` is the graph the reference evaluates: `g`, or its row sample.
std::string memoryProblem(const ir::Graph& g, const ir::Graph& ref, const FpatcOptions& opts,
                          SourceLoc& where) {
  long double inputs = 0, largest = 0, refAll = 0;
  std::string largestName;
  for (ir::Vertex v : g.vertices()) {
    const long double bytes = static_cast<long double>(g.op(v).type.numel()) * 4;
    if (g.op(v).kind == ir::OpKind::Input)
      inputs += bytes;
    if (bytes > largest) {
      largest = bytes;
      largestName = g.op(v).name;
      where = g.op(v).loc;
    }
  }
  for (ir::Vertex v : ref.vertices())
    refAll += static_cast<long double>(ref.op(v).type.numel()) * 4;
  const long double need = inputs * 1.5L + (opts.reference ? refAll * (opts.fuse ? 2 : 1) : 0);
  const unsigned long long have = availableMemory();
  if (have == 0 || need <= have)
    return "";
  auto gb = [](long double b) {
    return b >= 1e9L ? fixed(static_cast<double>(b / 1e9L), 1) + " GB"
                     : fixed(static_cast<double>(b / 1e6L), 1) + " MB";
  };
  return std::string(opts.reference ? "the CPU reference and the inputs need "
                                    : "the inputs need ") +
         "about " + gb(need) + " of memory (%" + largestName + " alone " + gb(largest) +
         " as f32); this machine has " + gb(have) + " available" +
         (opts.reference ? "; --no-reference skips the reference"
                         : "; --no-run compiles the kernels without them");
}

} // namespace

/// The environment variables fpatc reads, checked before anything runs: a value that means
/// nothing was once ignored without a word (FPAT_MEMORY_LIMIT=lots, FPAT_NVCC=/nonexistent).
bool checkEnvironment(std::ostream& err) {
  auto value = [](const char* name) -> std::string {
    const char* e = std::getenv(name);
    return e ? e : "";
  };
  bool ok = true;
  auto bad = [&](const char* name, const std::string& v, const std::string& want) {
    err << "fpatc: error: " << name << "='" << v << "': " << want << "\n";
    ok = false;
  };
  if (std::string v = value("FPAT_MEMORY_LIMIT"); !v.empty()) {
    char* end = nullptr;
    errno = 0;
    const unsigned long long n = std::strtoull(v.c_str(), &end, 10);
    if (v[0] == '-' || *end != '\0' || errno == ERANGE || n == 0)
      bad("FPAT_MEMORY_LIMIT", v, "expected a number of bytes, e.g. 8000000000");
  }
  if (std::string v = value("FPAT_DOT_TIMEOUT"); !v.empty()) {
    char* end = nullptr;
    const double t = std::strtod(v.c_str(), &end);
    if (*end != '\0' || !(t > 0 && t <= 86400))
      bad("FPAT_DOT_TIMEOUT", v, "expected seconds, more than 0 and at most 86400");
  }
  if (std::string v = value("FPAT_NVCC"); !v.empty() && findProgram(v).empty())
    bad("FPAT_NVCC", v, "no such program (unset it to use nvcc on PATH)");
  if (std::string v = value("FPAT_NORM_STATS"); !v.empty() && !codegen::normStatsFromEnv())
    bad("FPAT_NORM_STATS", v, "expected launch, loop or grid");
  if (std::string v = value("FPAT_FLASH"); !v.empty() && !codegen::FlashConfig::parse(v))
    bad("FPAT_FLASH", v,
        "expected a key block of 64, 128, 176 or 192, then each at most once any of o or s, p, "
        "r, d (with r) and t (with blocks of at most 128 keys)");
  if (std::string v = value("FPAT_DECODE_SPLITS");
      !v.empty() &&
      (v.find_first_not_of("0123456789") != std::string::npos || v.size() > 4 || std::stoi(v) == 0))
    bad("FPAT_DECODE_SPLITS", v, "expected a number of splits from 1 to 9999");
  for (const char* flag : {"FPAT_RETUNE", "FPAT_SPLIT_LAST_WAVE"})
    if (std::string v = value(flag); !v.empty() && v != "0" && v != "1")
      bad(flag, v, "expected 0 or 1");
  return ok;
}

/// The folders a run will read and write, checked before any long stage: a bad one is an
/// error at once, not after the reference and nvcc have run (or, for --emit=cuda, exit 0 with
/// nothing written).
bool checkFolders(const FpatcOptions& opts, std::ostream& err) {
  std::error_code ec;
  // Folders read from: there, and folders.
  for (const auto& [dir, option] :
       {std::pair{&opts.inputsDir, "--inputs"}, std::pair{&opts.expectDir, "--expect"}})
    if (!dir->empty() && !fs::is_directory(*dir, ec)) {
      err << "fpatc: error: " << option << " '" << *dir
          << "': " << (fs::exists(*dir, ec) ? "not a directory" : "no such directory") << "\n";
      return false;
    }
  auto writable = [&](const std::string& dir, const char* option) {
    if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
      err << "fpatc: error: " << option << " '" << dir << "': not a directory\n";
      return false;
    }
    fs::create_directories(dir, ec);
    if (ec || ::access(dir.c_str(), W_OK | X_OK) != 0) {
      err << "fpatc: error: " << option << " '" << dir
          << "': cannot write there: " << (ec ? ec.message() : std::strerror(errno)) << "\n";
      return false;
    }
    return true;
  };
  if ((opts.emit == "cuda" || (opts.emit.empty() && opts.graphviz)) &&
      !writable(opts.outDir, "--out-dir"))
    return false;
  if (!opts.outputsDir.empty() && !writable(opts.outputsDir, "--outputs"))
    return false;
  return true;
}

/// Fusion: by cost (the default: every match a candidate, the set of least estimated time) or
/// greedily (--fuse=always). False when the fused graph is invalid (an internal error).
bool fuseStage(const FpatcOptions& opts, const Patterns& pats, const ir::Graph& g,
               match::MatchResult& mr, ir::Graph& fused, std::vector<match::RopeFusion>& ropes,
               std::vector<match::RopeKept>& kept, std::ostream& err) {
  // The cost model's GPU: --arch, else the one here, else sm_90 (what fpatc compiles for).
  int costArch = opts.arch;
  if (!costArch && opts.fuse && !opts.fuseAlways && opts.compile && opts.run && opts.emit.empty())
    if (cuda::Driver* d = cuda::Driver::get(nullptr))
      costArch = d->device().arch;
  costArch = costArch ? costArch : 90;
  const cost::Calibration& calibration = cost::calibrationFor(costArch);
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
  // Kernels the tuner measured (on this arch, with these headers and this nvcc) stand in
  // for their estimates; --retune ignores them as it ignores the configurations.
  std::map<std::string, double> tuned;
  std::string nvccVer;
  if (!opts.fuseAlways && !opts.retune && !tune::retuneFromEnvironment()) {
    tune::TuningCache cache(opts.tuneCache);
    tuned = cache.measuredTimes();
    if (!tuned.empty()) {
      try {
        nvccVer = runtime::nvccIdentity(runtime::findNvcc({}), opts.nvccFlags);
      } catch (const std::exception&) {
        tuned.clear(); // no nvcc: no key to look them up by
      }
    }
  }
  const cost::MeasuredFn measured = [&](const ir::Graph& graph,
                                        ir::Vertex v) -> std::optional<double> {
    if (tuned.empty() || !tune::tunable(graph, v, costArch))
      return std::nullopt;
    auto it = tuned.find(tune::keyFor(graph, v, pats.library.activations, costArch, nvccVer).str());
    return it == tuned.end() ? std::nullopt : std::optional<double>(it->second);
  };
  if (!opts.fuseAlways)
    mopts.cost = [&](const match::Match& m) {
      return cost::candidateCost(g, pats.table, m, calibration, costArch, measured);
    };
  mr = match::findMatches(g, pats.table, mopts);
  if (mopts.cost)
    mr.costModel = std::string("estimates for ") + calibration.name +
                   (calibration.measured ? "" : ", not measured on such a GPU") +
                   (tuned.empty() ? "" : "; kernels in the tuning cache at their measured time");
  fused = match::rewrite(g, pats.table, mr.matches);
  if (!opts.noRopeEpilogue)
    fused = match::ropeIntoEpilogues(fused, &ropes, &kept);
  auto after = ir::validate(fused, pats.activations);
  for (const std::string& p : after)
    err << "fpatc: internal error: the fused graph is invalid: " << p << '\n';
  return after.empty();
}

/// The ropes taken into epilogues and those left apart (match::ropeIntoEpilogues).
struct RopeReport {
  const std::vector<match::RopeFusion>& done;
  const std::vector<match::RopeKept>& kept;
};

/// Says what fusion did: the matches made into fused ops (or, with --explain, every
/// pattern's attempts), the projections that rotate q and k in their epilogue and the ropes
/// left in kernels of their own, and the fused graph.
void printFusion(const FpatcOptions& opts, const Patterns& pats, const ir::Graph& g,
                 const match::MatchResult& mr, const RopeReport& ropes, const ir::Graph& fused,
                 std::ostream& out) {
  out << "== fusion: " << pats.table.patterns.size() << " patterns ("
      << pats.table.patterns.size() - pats.userPatterns << " built-in, " << pats.userPatterns
      << " from --patterns), " << mr.matches.size() << " fused op"
      << (mr.matches.size() == 1 ? "" : "s") << "\n";
  if (opts.explain)
    out << match::explain(g, pats.table, mr);
  else
    for (const match::Match& m : mr.matches) {
      const dsl::PatternMeta& meta = pats.table.patterns[m.pattern];
      out << "  %" << g.op(m.slots[0]).name << " = " << meta.name << " (" << meta.file << ":"
          << meta.line << ", " << meta.family << " kernel)\n";
    }
  const size_t taken = ropes.done.size(), apart = ropes.kept.size();
  if (taken > 0)
    out << "== rope: " << taken << " projection" << (taken == 1 ? "" : "s")
        << " rotating q and k in the epilogue (the rope kernels are gone)"
        << (apart ? ", " + std::to_string(apart) + " rope" + (apart == 1 ? "" : "s") + " left apart"
                  : "")
        << "\n";
  else if (apart > 0)
    out << "== rope: " << (apart == 1 ? "the rope stays" : "each rope stays")
        << " in a kernel of its own\n";
  for (const match::RopeFusion& r : ropes.done) {
    out << "  %" << r.projection << ":";
    for (const std::string& n : r.ropes)
      out << " %" << n;
    out << (r.pairs ? " (rotate_half: each head's columns reordered to pairs in the weight)" : "")
        << "\n";
  }
  for (const match::RopeKept& k : ropes.kept)
    out << "  %" << k.rope << " stays apart: " << k.why << "\n";
  out << "== graph after fusion: " << summary(fused) << "\n" << ir::printGraph(fused);
}

/// The values of the weights the fusion made (a rope's tables as rows, columns reordered),
/// which the inputs, made from the graph before fusion, lack.
void addMadeWeights(const ir::Graph& fused, ir::InputMap& inputs) {
  for (ir::Vertex v : fused.vertices())
    if (const ir::Op& op = fused.op(v); op.kind == ir::OpKind::Input && op.data)
      inputs.try_emplace(op.name, ir::Tensor{op.type, *op.data});
}

/// Applies the weight rewrites to `g` (steps in `rewrites`) and says what they did; 0, or the
/// exit code of a failure.
int rewriteWeights(const FpatcOptions& opts, const Patterns& pats, ir::Graph& g,
                   std::vector<match::RaiseStep>& rewrites, std::ostream& out, std::ostream& err) {
  if (!opts.fuse || opts.noRewrite || pats.library.rewrites.empty())
    return 0;
  try {
    g = match::applyRewrites(g, pats.rewriteTable, pats.library, &rewrites);
  } catch (const match::RaiseError& e) {
    err << "fpatc: error: " << e.what() << "\n";
    return 1;
  }
  auto after = ir::validate(g, pats.activations);
  for (const std::string& p : after)
    err << "fpatc: internal error: the rewritten graph is invalid: " << p << '\n';
  if (!after.empty())
    return 70;
  if (!opts.emit.empty() || (rewrites.empty() && !opts.explain))
    return 0;
  const std::vector<bool> fixed = ir::weightOnly(g);
  std::vector<ir::Vertex> folded;
  for (ir::Vertex v : g.vertices())
    if (fixed[v] && g.op(v).kind != ir::OpKind::Input && g.op(v).kind != ir::OpKind::Constant)
      folded.push_back(v);
  out << "== rewrite: " << rewrites.size() << " weight rewrite" << (rewrites.size() == 1 ? "" : "s")
      << ", " << folded.size() << " op" << (folded.size() == 1 ? "" : "s")
      << " computed once per set of weights\n";
  for (const match::RaiseStep& st : rewrites)
    out << "  %" << st.root << " = " << st.pattern << " (" << st.ops << " ops)\n";
  for (ir::Vertex v : folded)
    out << "  weights only: %" << g.op(v).name << " = " << g.op(v).kind << "\n";
  if (!opts.explain)
    return 0;
  // Where a rule came close: a value that is given at run time, a B in the other layout.
  std::vector<match::Attempt> near = match::raiseNearMisses(g, pats.rewriteTable);
  out << "  rewrite rules not applied, each at its closest attempt"
      << (near.empty() ? ": none came past an op's kind" : ", closest first:") << "\n";
  for (const match::Attempt& a : near) {
    auto meta = std::find_if(pats.rewriteTable.patterns.begin(), pats.rewriteTable.patterns.end(),
                             [&](const dsl::PatternMeta& m) { return m.name == a.pattern; });
    out << "    at %" << g.op(a.root).name << ": " << a.pattern << " (" << meta->file << ":"
        << meta->line << ", " << static_cast<int>(a.progress * 100)
        << "% of its checks): " << a.failure << "\n";
  }
  return 0;
}

/// Merges GEMMs that read one activation and whose results attention and rope read in place
/// (match::mergeSharedGemms: Llama's q, k and v projections) and says which; 0, or 70 where
/// the merged graph is invalid.
int mergeGemms(const FpatcOptions& opts, const Patterns& pats, ir::Graph& g,
               std::vector<match::GemmMerge>& merges, std::ostream& out, std::ostream& err) {
  if (!opts.fuse || opts.noRewrite)
    return 0;
  std::vector<match::PartsReorder> reordered;
  g = match::mergeSharedGemms(match::reorderHeadParts(g, &reordered, !opts.noRopeEpilogue), &merges,
                              !opts.noRopeEpilogue);
  auto after = ir::validate(g, pats.activations);
  for (const std::string& p : after)
    err << "fpatc: internal error: the merged graph is invalid: " << p << '\n';
  if (!after.empty())
    return 70;
  if (!opts.emit.empty())
    return 0;
  if (!reordered.empty())
    out << "== parts: " << reordered.size() << " projection" << (reordered.size() == 1 ? "" : "s")
        << " whose heads held their parts side by side reordered to (part, head, d), each part "
           "a slice of columns\n";
  for (const match::PartsReorder& r : reordered)
    out << "  %" << r.projection << ": " << r.parts << " parts\n";
  if (merges.empty())
    return 0;
  out << "== merge: " << merges.size() << " group" << (merges.size() == 1 ? "" : "s")
      << " of GEMMs on one activation made one GEMM, their results column views of it\n";
  for (const match::GemmMerge& m : merges) {
    out << "  %" << m.input << " @ [";
    for (size_t i = 0; i < m.results.size(); ++i)
      out << (i ? " | " : "") << "%" << m.results[i];
    out << "]\n";
  }
  return 0;
}

/// rewriteWeights, then mergeGemms.
int rewriteAndMerge(const FpatcOptions& opts, const Patterns& pats, ir::Graph& g,
                    std::vector<match::RaiseStep>& rewrites, std::vector<match::GemmMerge>& merges,
                    std::ostream& out, std::ostream& err) {
  const int rc = rewriteWeights(opts, pats, g, rewrites, out, err);
  return rc != 0 ? rc : mergeGemms(opts, pats, g, merges, out, err);
}

/// The CPU reference (sampled rows where exact) and the checks after it: the raised graph vs
/// the graph as given, the f16 graph vs the f32 model, the fused graph vs the unfused one.
/// Returns 1 when a check fails, else 0.
int referenceStage(const FpatcOptions& opts, const Patterns& pats, const ir::Graph& g,
                   const ir::Graph& given, bool raised, const std::optional<ir::Graph>& model,
                   const ir::Graph& fused, bool anyFused,
                   const std::optional<ir::RowSample>& sample, const std::string& notSampled,
                   const ir::InputMap& inputs, const std::string& inputsSaid,
                   std::vector<ir::Tensor>& vals, std::vector<ir::Tensor>& modelOutputs,
                   const SourceNames& sourceNames, std::ostream& out, std::ostream& err) {
  int rc = 0;
  auto t0 = std::chrono::steady_clock::now();
  const ir::Graph& refGraph = sample ? sample->graph : g;
  out << "== reference: CPU, " << inputsSaid;
  if (sample)
    out << ", " << sample->picked.size() << " of " << sample->rows
        << " rows (every output row depends on its own input rows only; --reference-rows 0 "
           "computes all)";
  else if (!notSampled.empty())
    out << ", every row (rows cannot be sampled: " << notSampled << ")";
  out << "; GEMMs on " << blas::describe() << "\n" << std::flush;
  // Progress: each op that takes a while, as it finishes.
  auto progress = [&](const ir::Graph& graph) {
    return [&out, &graph](ir::Vertex v, double secs) {
      if (secs >= 1.0)
        out << "  %" << graph.op(v).name << " (" << graph.op(v).kind << ", "
            << graph.op(v).type.str() << "): " << fixed(secs, 1) << " s\n"
            << std::flush;
    };
  };
  const auto rows = sample ? ir::sliceInputs(g, *sample, inputs) : ir::InputMap{};
  vals = ir::evaluate(refGraph, inputs, pats.reference, progress(refGraph), &rows);
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  out << "  done in " << fixed(secs, 2) << " s\n";
  bool nonFinite = false;
  for (ir::Vertex v : g.outputs()) {
    ir::TensorStats s = ir::stats(vals[v]);
    out << "  output %" << g.op(v).name << " " << vals[v].desc.str() << ": min " << fixed(s.min, 4)
        << ", max " << fixed(s.max, 4) << ", mean " << fixed(s.mean, 4) << ", rms "
        << fixed(s.rms, 4) << ", non-finite " << s.nonFinite << '\n';
    nonFinite = nonFinite || s.nonFinite > 0;
  }
  // Non-finite outputs fail every check below: say where they come from.
  if (nonFinite)
    if (std::string where = firstNonFinite(refGraph, vals, inputs, rows); !where.empty())
      out << "  note: " << where << "\n";
  // "done in" above is the reference alone; the checks below evaluate more graphs, each
  // timed (on a large model they took 10 s more, and the output said 0.9 s).
  std::vector<std::pair<std::string, double>> checkTimes;
  auto since = [](std::chrono::steady_clock::time_point t) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
  };
  if (raised) {
    // Raising must not change what the graph computes: the graph as given, evaluated with
    // its own (unraised) ops, on the same weights and inputs but with f32 intermediates, agrees
    // up to the raised graph's own roundings. (Rounded to f16 as they were given, a large
    // ALiBi bias added to the scores alone cost more than the tolerance: MPT at 333 tokens.)
    std::optional<ir::RowSample> givenSample;
    if (sample)
      givenSample = ir::sampleRows(given, sample->picked.size());
    if (!sample || (givenSample && givenSample->picked == sample->picked)) {
      const ir::Graph givenRef =
          onnx::convertPrecision(givenSample ? givenSample->graph : given, ir::DType::F32);
      auto widen = [](ir::InputMap in) {
        for (auto& [name, t] : in)
          t.desc.dtype = ir::DType::F32; // f16 and bf16 values are exact in f32
        return in;
      };
      std::map<std::string, ir::Tensor> in32 = widen(inputs);
      for (ir::Vertex v : given.vertices()) // weights the merges joined: the given graph's own
        if (const ir::Op& op = given.op(v);
            op.kind == ir::OpKind::Input && op.data && !in32.count(op.name))
          in32[op.name] = widen({{op.name, ir::Tensor{op.type, *op.data}}}).at(op.name);
      const auto givenRows =
          givenSample ? widen(ir::sliceInputs(given, *givenSample, inputs)) : ir::InputMap{};
      const auto tg = std::chrono::steady_clock::now();
      std::vector<ir::Tensor> gv =
          ir::evaluate(givenRef, in32, pats.reference, progress(givenRef), &givenRows);
      checkTimes.emplace_back("the graph as given", since(tg));
      out << "  raised graph on the CPU vs the graph as given:\n";
      for (size_t i = 0; i < g.outputs().size(); ++i) {
        runtime::Agreement c =
            runtime::compareToReference(vals[g.outputs()[i]], gv[given.outputs()[i]],
                                        runtime::relTolerance(vals[g.outputs()[i]].desc.dtype));
        out << "    %" << g.op(g.outputs()[i]).name << ": " << verdict(c) << "\n";
        rc = c.pass ? rc : 1;
      }
    }
  }
  if (model) {
    // The f32 model on the same inputs (its own f32 weights), the oracle of the f16 run.
    std::optional<ir::RowSample> modelSample;
    if (sample)
      modelSample = ir::sampleRows(*model, sample->picked.size());
    if (!sample || (modelSample && modelSample->picked == sample->picked)) {
      std::map<std::string, ir::Tensor> in32 = ir::randomInputs(*model, opts.seed);
      for (ir::Vertex v : model->vertices()) {
        const ir::Op& op = model->op(v);
        if (op.kind != ir::OpKind::Input || op.data)
          continue;
        ir::Tensor t = inputs.at(op.name); // the f16 run's values, exact in f32
        t.desc.dtype = ir::DType::F32;
        in32[op.name] = std::move(t);
      }
      const ir::Graph& modelRef = modelSample ? modelSample->graph : *model;
      const auto modelRows =
          modelSample ? ir::sliceInputs(*model, *modelSample, in32) : ir::InputMap{};
      const auto tm = std::chrono::steady_clock::now();
      std::vector<ir::Tensor> mv =
          ir::evaluate(modelRef, in32, pats.reference, progress(modelRef), &modelRows);
      checkTimes.emplace_back("the f32 model", since(tm));
      for (ir::Vertex o : model->outputs())
        modelOutputs.push_back(std::move(mv[o]));
      const ir::DType dt = g.op(g.outputs()[0]).type.dtype;
      out << "  the " << ir::dtypeName(dt)
          << " graph vs the f32 model (rel err <= " << sci(modelTolerance(dt)) << "):\n";
      for (size_t i = 0; i < g.outputs().size(); ++i) {
        runtime::Agreement c =
            runtime::compareToReference(vals[g.outputs()[i]], modelOutputs[i], modelTolerance(dt));
        out << "    %" << g.op(g.outputs()[i]).name << ": " << verdict(c) << "\n";
        rc = c.pass ? rc : 1;
      }
    }
  }
  if (anyFused) {
    // The fused graph evaluated with fused-op semantics (one rounding per fused op) must
    // agree with the unfused graph up to f16 rounding of the intermediates; on the same
    // sampled rows (fusion keeps a graph row-wise).
    std::optional<ir::RowSample> fusedSample;
    if (sample)
      fusedSample = ir::sampleRows(fused, sample->picked.size());
    if (sample && (!fusedSample || fusedSample->picked != sample->picked))
      throw std::logic_error("the fused graph's rows cannot be sampled as the graph's");
    const ir::Graph& fusedRef = fusedSample ? fusedSample->graph : fused;
    const auto fusedRows =
        fusedSample ? ir::sliceInputs(fused, *fusedSample, inputs) : ir::InputMap{};
    const auto tf = std::chrono::steady_clock::now();
    std::vector<ir::Tensor> fv =
        ir::evaluate(fusedRef, inputs, pats.reference, progress(fusedRef), &fusedRows);
    checkTimes.emplace_back("the fused graph", since(tf));
    out << "  fused graph on the CPU vs the unfused graph:\n";
    for (size_t i = 0; i < g.outputs().size(); ++i) {
      const ir::Tensor& want = vals[g.outputs()[i]];
      const ir::Tensor& got = fv[fused.outputs()[i]];
      runtime::Agreement c = runtime::compareToReference(got, want);
      const bool pass = c.pass;
      out << "    %" << g.op(g.outputs()[i]).name << ": " << verdict(c) << "\n";
      rc = pass ? rc : 1;
    }
  }
  if (!checkTimes.empty()) {
    out << "  the checks evaluated";
    for (size_t i = 0; i < checkTimes.size(); ++i)
      out << (i ? ", " : " ") << checkTimes[i].first << " in " << fixed(checkTimes[i].second, 2)
          << " s";
    out << "\n";
  }
  if (!opts.expectDir.empty()) {
    const int e = checkExpected(opts, g, sourceNames, vals, modelOutputs, sample, out, err);
    rc = rc ? rc : e;
  }
  return rc;
}

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

  if (!checkEnvironment(err) || !checkFolders(opts, err))
    return 1;
  Patterns pats;
  if (!loadPatterns(opts, sm, diags, pats, err))
    return failed();
  if (opts.emit == "table") {
    out << dsl::disassemble(pats.table);
    return 0;
  }

  std::string text;
  if (std::string why; !readInput(opts.input, text, &why)) {
    err << "fpatc: error: cannot read '" << inputName(opts.input) << "': " << why << "\n";
    return 1;
  }
  std::optional<ir::Graph> g;
  std::optional<ir::Graph> model; // an f32 ONNX model run in f16: the model as exported
  std::vector<std::string> importNotes;
  SourceNames sourceNames; // an ONNX model's names for inputs and outputs fpat renamed
  int fileId = -1;
  if (onnx::looksLikeOnnx(opts.input, text)) {
    if (opts.verifyDiagnostics) {
      err << "fpatc: error: --verify-diagnostics checks .fgraph files, not ONNX models\n";
      return 1;
    }
    const auto t0 = std::chrono::steady_clock::now();
    if (!importOnnx(opts, text, pats, g, model, importNotes, sourceNames, err))
      return 1;
    importNotes.insert(
        importNotes.begin(),
        "read " + fixed(static_cast<double>(text.size()) / 1e6, 1) + " MB in " +
            fixed(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 1) +
            " s");
  } else {
    fileId = sm.addBuffer(inputName(opts.input), std::move(text));
    g = ir::parseGraph(fileId, diags, pats.activations, opts.dims);
  }
  if (fileId >= 0 && !opts.precision.empty()) {
    diags.flush();
    err << "fpatc: error: --precision applies to ONNX models; an .fgraph file states its types\n";
    return 1;
  }
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
    out << "== " << (fileId < 0 ? "import" : "parse") << ": " << opts.input << ": graph "
        << g->name() << ", " << summary(*g) << '\n';
    for (const std::string& n : importNotes)
      out << "  note: " << n << '\n';
    out << "== validate: " << (problems.empty() ? "ok" : "FAILED") << '\n';
  }
  for (const std::string& p : problems)
    err << "fpatc: error: " << p << '\n';
  if (!problems.empty())
    return 1;

  // Raising: exporters' decompositions (GeLU, SiLU, RMSNorm, LayerNorm, bias adds) become the
  // IR's ops, so that fusion sees them. The reference checks the raised graph against the
  // graph as given (below), so a raise that changed the meaning would be caught.
  const ir::Graph given = *g;
  std::vector<match::RaiseStep> steps;
  if (opts.fuse && !opts.noRaise) {
    try {
      *g = match::raise(*g, pats.raiseTable, pats.library, &steps);
    } catch (const match::RaiseError& e) {
      err << "fpatc: error: " << e.what() << "\n";
      return 1;
    }
    auto after = ir::validate(*g, pats.activations);
    for (const std::string& p : after)
      err << "fpatc: internal error: the raised graph is invalid: " << p << '\n';
    if (!after.empty())
      return 70;
    if (opts.emit.empty() && !steps.empty()) {
      out << "== raise: " << steps.size() << " decomposition" << (steps.size() == 1 ? "" : "s")
          << " raised, " << g->size() << " ops left\n";
      for (const match::RaiseStep& st : steps)
        out << "  %" << st.root << " = " << st.pattern << " (" << st.ops << " ops)\n";
    }
    if (opts.explain && opts.emit.empty()) {
      // What raising left, where a rule came close: the decomposition a user expected raised.
      // (After rewriting, below: a rewrite's result is no decomposition.)
      std::vector<match::Attempt> near = match::raiseNearMisses(*g, pats.raiseTable);
      out << (steps.empty() ? "== raise: nothing raised\n" : "")
          << "  raise rules not applied, each at its closest attempt"
          << (near.empty() ? ": none came past an op's kind" : ", closest first:") << "\n";
      for (const match::Attempt& a : near) {
        auto meta = std::find_if(pats.raiseTable.patterns.begin(), pats.raiseTable.patterns.end(),
                                 [&](const dsl::PatternMeta& m) { return m.name == a.pattern; });
        out << "    at %" << g->op(a.root).name << ": " << a.pattern << " (" << meta->file << ":"
            << meta->line << ", " << static_cast<int>(a.progress * 100)
            << "% of its checks): " << a.failure << "\n";
      }
    }
  }

  // Weight rewrites and merged projections (each checked against the graph as given).
  std::vector<match::RaiseStep> rewrites;
  std::vector<match::GemmMerge> merges;
  if (int rc = rewriteAndMerge(opts, pats, *g, rewrites, merges, out, err); rc != 0)
    return rc;

  // What cannot work is said before any work is done. The GPU kernels take f16 or bf16 only:
  // f32 graphs can be fused and checked on the CPU (--no-compile), not compiled.
  if (opts.compile || opts.emit == "cuda") {
    for (ir::Vertex v : g->vertices())
      if (g->op(v).kind == ir::OpKind::Input && !ir::isHalfPrecision(g->op(v).type.dtype))
        diags.error(g->op(v).loc,
                    "input '%" + g->op(v).name + "' is " + g->op(v).type.str() +
                        ": fpat's GPU kernels take f16 or bf16 tensors only (use --no-compile to "
                        "fuse and check an f32 graph on the CPU)");
    if (diags.errorCount() > 0)
      return failed();
  }
  // The CPU reference computes sampled rows where that is exact (row-wise graphs) and all of
  // them would take long: it is the oracle, not the product.
  std::optional<ir::RowSample> sample;
  std::string notSampled;
  if (opts.reference && opts.emit.empty()) {
    const int64_t rows = opts.referenceRows >= 0                ? opts.referenceRows
                         : referenceMacs(*g) > kSampleAboveMacs ? kAutoSampleRows
                                                                : 0;
    if (rows > 0) {
      sample = ir::sampleRows(*g, static_cast<size_t>(rows), &notSampled);
      if (sample && sample->picked.size() == static_cast<size_t>(sample->rows))
        sample.reset(); // that is every row
    }
  }
  // Inputs are needed by the reference and by a run on the GPU; neither: none are made (a
  // graph too large for host memory still fuses and compiles with --no-reference --no-run).
  const bool needInputs = opts.reference || (opts.compile && opts.run);
  if (opts.emit.empty() && needInputs) {
    SourceLoc where;
    if (std::string why = memoryProblem(*g, sample ? sample->graph : *g, opts, where);
        !why.empty()) {
      diags.error(where, why);
      return failed();
    }
  }

  ir::Graph fused = *g;
  match::MatchResult mr;
  std::vector<match::RopeFusion> ropes;
  std::vector<match::RopeKept> kept;
  if (opts.fuse && !fuseStage(opts, pats, *g, mr, fused, ropes, kept, err))
    return 70;
  if (opts.emit == "fused") {
    out << ir::printGraph(fused);
    return 0;
  }
  if (opts.emit == "cuda")
    return gpuStages(opts, fused, pats, nullptr, nullptr, nullptr, *g, sourceNames, out, err);

  out << "== graph" << (opts.fuse ? " before fusion" : "") << "\n" << ir::printGraph(*g);
  if (opts.fuse)
    printFusion(opts, pats, *g, mr, {ropes, kept}, fused, out);

  int rc = 0;
  auto inputs = needInputs ? ir::randomInputs(*g, opts.seed) : ir::InputMap{};
  size_t inputsRead = 0;
  if (!opts.inputsDir.empty() &&
      !loadInputs(*g, opts.inputsDir, sourceNames, inputs, inputsRead, out, err))
    return 1;
  if (needInputs)
    addMadeWeights(fused, inputs);
  size_t inputCount = 0;
  for (ir::Vertex v : g->vertices())
    inputCount += g->op(v).kind == ir::OpKind::Input;
  // What the run computes on, said as it is: files, random values, or both.
  const std::string inputsSaid =
      inputsRead == 0 ? "seeded random inputs (seed " + std::to_string(opts.seed) + ")"
      : inputsRead == inputCount
          ? "inputs from " + opts.inputsDir
          : std::to_string(inputsRead) + " of " + std::to_string(inputCount) + " inputs from " +
                opts.inputsDir + ", the rest seeded random (seed " + std::to_string(opts.seed) +
                ")";
  std::vector<ir::Tensor> vals;
  std::vector<ir::Tensor> modelOutputs; // the f32 model's, per output (sampled like vals)
  if (opts.reference)
    rc = referenceStage(opts, pats, *g, given, steps.size() + rewrites.size() + merges.size() > 0,
                        model, fused, opts.fuse && !mr.matches.empty(), sample, notSampled, inputs,
                        inputsSaid, vals, modelOutputs, sourceNames, out, err);
  if (opts.compile) {
    // A failure found on the CPU wins over a skip (77) or a pass from the GPU stages.
    const int gpu = gpuStages(opts, fused, pats, &inputs, opts.reference ? &vals : nullptr,
                              sample ? &sample->picked : nullptr, *g, sourceNames, out, err,
                              modelOutputs.empty() ? nullptr : &modelOutputs);
    rc = rc ? rc : gpu;
  }
  if (opts.graphviz) {
    out << "== graphviz\n";
    if (int r = writeGraphviz(*g, g->name(), opts, out, err))
      return r;
    // After fusion: the original ops, each fused op drawn as a box around the ops it absorbed,
    // labelled with its pattern and where the pattern is defined.
    if (opts.fuse) {
      std::vector<ir::DotCluster> clusters;
      for (const match::Match& m : mr.matches) {
        const dsl::PatternMeta& meta = pats.table.patterns[m.pattern];
        ir::DotCluster c;
        c.label = "%" + g->op(m.slots[0]).name + " = " + meta.name + " (" + displayPath(meta.file) +
                  ":" + std::to_string(meta.line) + ", family " + meta.family + ")";
        for (size_t k = 0; k < m.slots.size(); ++k)
          if (meta.slots[k].role != dsl::SlotInfo::Input &&
              std::find(c.members.begin(), c.members.end(), m.slots[k]) == c.members.end())
            c.members.push_back(m.slots[k]);
        clusters.push_back(std::move(c));
      }
      if (int r = writeGraphviz(*g, g->name() + ".fused", opts, out, err, clusters))
        return r;
    }
  }
  return rc;
}

} // namespace fpat
