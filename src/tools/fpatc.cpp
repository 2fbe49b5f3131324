// fpatc: the graph compiler driver. All the work is in the driver library.
#include "fpat/driver/Driver.h"
#include "fpat/support/CliError.h"

#include <CLI/CLI.hpp>
#include <iostream>
#include <string>
#include <vector>

int main(int argc, char** argv) {
  fpat::FpatcOptions opts;
  // `fpatc tune GRAPH [options]` is `fpatc GRAPH --tune [options]`.
  std::vector<char*> args(argv, argv + argc);
  if (args.size() > 1 && std::string(args[1]) == "tune") {
    opts.tune = true;
    args.erase(args.begin() + 1);
  }
  argc = static_cast<int>(args.size());
  argv = args.data();
  CLI::App app{"fpatc " FPAT_VERSION " - fuse, generate, compile, run and validate an fpat graph\n"
               "(`fpatc tune GRAPH [OPTIONS]` is `fpatc GRAPH --tune [OPTIONS]`)",
               "fpatc"};
  app.footer("Environment:\n"
             "  FPAT_CACHE_DIR       kernel cache directory (default ~/.cache/fpat)\n"
             "  FPAT_TUNE_CACHE      tuning cache file (default <cache dir>/tuning.json)\n"
             "  FPAT_RETUNE=1        ignore cached tuning results\n"
             "  FPAT_NVCC            the nvcc to run (default: nvcc on PATH, then CUDA's)\n"
             "  FPAT_NVCC_FLAGS      more nvcc flags, separated by spaces (after --nvcc-flag's)\n"
             "  FPAT_PATTERNS_DIR    read the built-in .fpat files from this directory instead\n"
             "                       of the copies embedded in fpatc\n"
             "  FPAT_KERNEL_HEADERS  replace the embedded kernel headers with this directory's\n"
             "  FPAT_SPLIT_LAST_WAVE=0  keep every GEMM tile whole (no k-split of the last wave)\n"
             "  FPAT_FLASH           a variant of the sm_90 flash-attention kernel, e.g. 128s\n"
             "                       (experiments; DEVELOPERS.md)\n"
             "  FPAT_DECODE_SPLITS   the flash decode kernel's number of key splits\n"
             "                       (experiments; DEVELOPERS.md)\n"
             "  FPAT_MEMORY_LIMIT    bytes of host memory the CPU reference may use\n"
             "                       (default: MemAvailable)\n"
             "  FPAT_DOT_TIMEOUT     seconds Graphviz may take for each .svg (default 20; graphs\n"
             "                       of more than 1500 ops get their .dot only)");
  app.add_option("graph", opts.input,
                 "the .fgraph file or ONNX model (.onnx; - reads standard input)")
      ->required();
  bool quiet = false;
  app.add_flag("-q,--quiet", quiet,
               "print only diagnostics; the exit code says whether every stage and check passed");
  app.add_option("--patterns", opts.patternFiles,
                 "a .fpat file of extra activations and patterns (repeatable)")
      ->allow_extra_args(false);
  app.add_option("-I", opts.includeDirs, "include directory for --patterns files")
      ->allow_extra_args(false);
  app.add_flag("--explain", opts.explain, "say, for every root, which patterns failed and why");
  app.add_option("--disable-pattern", opts.disabled, "never use this pattern (repeatable)")
      ->allow_extra_args(false);
  app.add_option("--only-pattern", opts.only, "use only these patterns (repeatable)")
      ->allow_extra_args(false);
  bool noFuse = false, noCompile = false, noRun = false, noReference = false, noGraphviz = false;
  app.add_flag("--no-fuse", noFuse, "skip raising and fusion");
  std::string fuseMode = "cost";
  app.add_option("--fuse", fuseMode,
                 "which matches become fused ops: cost (default: the set of least estimated "
                 "time; a fusion slower than its parts is declined) or always (every match, "
                 "greedily by pattern benefit)")
      ->check(CLI::IsMember({"cost", "always"}))
      ->capture_default_str();
  app.add_flag("--no-raise", opts.noRaise,
               "skip the raising patterns (exporters' decompositions stay as they are)");
  app.add_flag("--no-rewrite", opts.noRewrite,
               "skip the weight rewrites (Rewrite patterns: algebra over weights computed once, "
               "when the weights are prepared), the merge of projections that read one "
               "activation (q, k, v) and the reorder of parts side by side in heads (GPT-NeoX's "
               "q, k, v)");
  app.add_flag("--no-rope-epilogue", opts.noRopeEpilogue,
               "keep rotary embeddings in kernels of their own (by default a rope of a "
               "projection's q or k columns runs in that projection's epilogue)");
  app.add_option("--precision", opts.precision,
                 "ONNX models: the element type to run in: f16 (default) or bf16 on the tensor "
                 "cores, f32 as the model is (the CPU only)")
      ->check(CLI::IsMember({"f16", "f32", "bf16"}));
  std::vector<std::string> dims;
  app.add_option("--dim", dims,
                 "the size of an ONNX model's symbolic dimension or of an .fgraph file's named "
                 "one (f16[T, 4096]), NAME=SIZE (repeatable), e.g. --dim seq=128");
  app.add_option("--seed", opts.seed, "seed of the random inputs")
      ->capture_default_str()
      ->check(fpat::atLeast(0));
  app.add_option("--inputs", opts.inputsDir,
                 "read input NAME from DIR/NAME.f16 (or .bf16: raw little-endian, as the input's "
                 "type) when it exists; NAME as an ONNX model writes it, or the value's name");
  app.add_option("--outputs", opts.outputsDir,
                 "write each GPU output NAME to DIR/NAME.f16 (or .bf16)");
  app.add_option("--expect", opts.expectDir,
                 "check each output NAME on the CPU against DIR/NAME.f32 (raw little-endian f32, "
                 "e.g. what torch computes on the --inputs); an ONNX model's f32 form is "
                 "compared, else the graph itself");
  app.add_option("--out-dir", opts.outDir, "directory for generated files")->capture_default_str();
  app.add_option("--emit", opts.emit, "print one stage and stop")
      ->check(CLI::IsMember({"fgraph", "fused", "table", "cuda"}));
  std::string arch;
  app.add_option("--arch", arch, "compile for sm_ARCH, e.g. sm_90 or 90 (default: the GPU's)");
  app.add_flag("--no-compile", noCompile, "stop before code generation");
  app.add_flag("--no-run", noRun, "stop after compiling the kernels");
  app.add_flag("--require-gpu", opts.requireGpu,
               "exit with 77 (a skipped test for ctest) when there is no GPU to run on");
  app.add_flag("--time", opts.time,
               "time the fused graph and the same graph unfused on the GPU (steady state, "
               "median of runs, each kernel apart) and print the speedup; exits 77 without a GPU");
  app.add_option("--time-runs", opts.timeRuns, "timed runs of each graph for --time")
      ->capture_default_str()
      ->check(fpat::atLeast(3));
  app.add_flag("--tune", opts.tune,
               "measure kernel configurations (GEMM tiles, flash-attention variants) on the GPU "
               "first (= fpatc tune)");
  app.add_flag("--retune", opts.retune, "ignore cached tuning results (also: FPAT_RETUNE=1)");
  app.add_option("--tune-cache", opts.tuneCache,
                 "tuning cache file (default: $FPAT_TUNE_CACHE or <cache dir>/tuning.json)");
  app.add_flag("--ptx", opts.ptx, "keep PTX next to each cubin in the cache");
  app.add_option("-j,--jobs", opts.jobs, "parallel nvcc processes (default: one per core)")
      ->check(fpat::atLeast(1));
  app.add_option("--nvcc-flag", opts.nvccFlags,
                 "pass this flag to nvcc after fpat's own, e.g. --nvcc-flag=-Xptxas=-v "
                 "(repeatable; part of the kernel and tuning cache keys)")
      ->allow_extra_args(false);
  app.add_option("--cache-dir", opts.cacheDir,
                 "kernel cache (default: $FPAT_CACHE_DIR or ~/.cache/fpat)");
  app.add_flag("--no-reference", noReference,
               "skip the CPU reference evaluation (the GPU is still checked on 8 sampled rows "
               "where the graph is row-wise)");
  app.add_option("--reference-rows", opts.referenceRows,
                 "compute the CPU reference on this many sampled rows (0: all; default: all, "
                 "or 64 when its GEMMs exceed 2^34 multiply-adds); exact for row-wise graphs")
      ->check(fpat::atLeast(0));
  app.add_flag("--no-graphviz", noGraphviz, "do not write .dot/.svg");
  app.add_flag("--verify-diagnostics", opts.verifyDiagnostics,
               "check the file's expected-error comments instead of printing diagnostics");
  app.add_option("--error-limit", opts.errorLimit, "stop after this many errors (0: no limit)")
      ->capture_default_str()
      ->check(fpat::atLeast(0));
  app.set_version_flag("--version", "fpatc " FPAT_VERSION);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return fpat::reportCliError(app, e, argc, argv, "fpatc");
  }
  for (const std::string& d : dims) {
    const size_t eq = d.find('=');
    const std::string size = eq == std::string::npos ? "" : d.substr(eq + 1);
    if (eq == 0 || eq == std::string::npos || size.empty() || size.size() > 12 ||
        size.find_first_not_of("0123456789") != std::string::npos || std::stoll(size) < 1) {
      std::cerr << "fpatc: error: --dim " << d << ": expected NAME=SIZE with SIZE >= 1, e.g. "
                << "--dim seq=128\n";
      return 2;
    }
    const auto [it, fresh] = opts.dims.emplace(d.substr(0, eq), std::stoll(size));
    if (!fresh && it->second != std::stoll(size)) {
      std::cerr << "fpatc: error: --dim " << d << ": " << it->first << " is already given as "
                << it->second << "\n";
      return 2;
    }
  }
  if (opts.time && (noRun || noCompile || !opts.emit.empty())) {
    std::cerr << "fpatc: error: --time runs the graph on the GPU; it cannot be combined with "
              << (noRun       ? "--no-run"
                  : noCompile ? "--no-compile"
                              : "--emit")
              << "\n";
    return 2;
  }
  opts.fuse = !noFuse;
  opts.fuseAlways = fuseMode == "always";
  opts.compile = !noCompile;
  opts.run = !noRun;
  opts.reference = !noReference;
  opts.graphviz = !noGraphviz;
  if (!arch.empty()) {
    std::string digits = arch.rfind("sm_", 0) == 0 ? arch.substr(3) : arch;
    if (digits.empty() || digits.size() > 3 ||
        digits.find_first_not_of("0123456789") != std::string::npos || std::stoi(digits) < 75) {
      std::cerr << "fpatc: error: --arch " << arch << ": expected sm_75 or newer, e.g. sm_90\n";
      return 2;
    }
    opts.arch = std::stoi(digits);
  }
  std::ostream nowhere(nullptr); // a stream without a buffer discards what it is given
  try {
    return fpat::runFpatc(opts, quiet ? nowhere : std::cout, std::cerr);
  } catch (const std::exception& e) {
    std::cerr << "fpatc: internal error: " << e.what() << '\n';
    return 70;
  }
}
