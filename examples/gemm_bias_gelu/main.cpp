// The seed's README example through fpat's C++ API: x[1024, 4096] * w[4096, 4096] + bias -> GeLU
// becomes one gemm_bias_gelu kernel, which is generated, compiled, run on the GPU and checked
// against the CPU reference. Without a GPU it stops after compiling and exits with 77 (ctest:
// skipped).
#include "fpat/dsl/Library.h"
#include "fpat/ir/Builder.h"
#include "fpat/ir/Reference.h"
#include "fpat/ir/text/Text.h"
#include "fpat/match/Match.h"
#include "fpat/runtime/Pipeline.h"

#include <iostream>

using namespace fpat;

int main() {
  // 1. Build the graph.
  ir::GraphBuilder b("example");
  ir::Value x = b.input("x", {1024, 4096});
  ir::Value w = b.input("w", {4096, 4096});
  ir::Value bias = b.input("bias", {4096});
  ir::Value y = b.gemm(x, w, false, "y");
  ir::Value y2 = b.bias(y, bias, "y2");
  ir::Value y3 = b.activation(y2, "gelu", "y3");
  b.output(y3);
  ir::Graph g = b.build();

  // 2. Fuse with the built-in patterns: 3 ops -> 1 kernel.
  const dsl::MatcherTable& table = match::builtinTable();
  match::MatchResult matches = match::findMatches(g, table);
  ir::Graph fused = match::rewrite(g, table, matches.matches);
  std::cout << "fused " << matches.matches.size() << " pattern(s):\n" << ir::printGraph(fused);

  // 3. The activation bodies come from the built-in patterns/*.fpat, embedded in the library.
  SourceManager sm;
  DiagEngine diags(sm, &std::cerr);
  auto patterns = dsl::compileBuiltinPatterns(sm, diags);
  if (!patterns)
    return 1;

  // 4. Generate and compile, for the GPU if there is one.
  std::string why;
  cuda::Driver* gpu = cuda::Driver::get(&why);
  runtime::BuildOptions opts;
  opts.arch = gpu ? gpu->device().arch : 90;
  runtime::BuildResult built = runtime::buildKernels(fused, patterns->library.activations, opts);
  if (!built.error.empty()) {
    std::cerr << built.error << "\n";
    return 1;
  }
  for (const codegen::KernelUnit& u : built.graph.units)
    if (!u.launches.empty())
      std::cout << "kernel " << u.name << " (" << built.compiled << " compiled, " << built.cached
                << " cached)\n";
  if (!gpu) {
    std::cout << "execution skipped: " << why << "\n";
    return 77;
  }

  // 5. Run and validate against the CPU reference.
  auto inputs = ir::randomInputs(g, 1);
  auto want = ir::evaluate(g, inputs);
  runtime::Executor exec(*gpu, built.graph);
  runtime::RunResult r = exec.run(inputs);
  runtime::Agreement a = runtime::compareToReference(r.outputs[0], want[y3.v]);
  std::cout << gpu->device().name << ": " << r.milliseconds << " ms, max abs err " << a.maxAbs
            << ", max rel err " << a.maxRel << " -> " << (a.pass ? "Passed" : "Failed") << "\n";
  return a.pass ? 0 : 1;
}
