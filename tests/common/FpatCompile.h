// Compiling .fpat text in a test: the library and its diagnostics, rendered on failure.
#pragma once

#include "fpat/dsl/Library.h"

#include <boost/test/unit_test.hpp>
#include <memory>
#include <optional>
#include <string>

namespace fpat::testing {

/// The built-in patterns, as the source tree has them.
inline const std::string kPatterns = FPAT_SOURCE_DIR "/patterns";

struct Compiled {
  SourceManager sm;
  std::unique_ptr<DiagEngine> diags;
  std::optional<dsl::Compilation> c;
  std::string errors() const {
    std::string s;
    for (const Diagnostic& d : diags->diagnostics())
      s += diags->render(d);
    return s;
  }
};

inline std::unique_ptr<Compiled> compile(const std::string& text,
                                         const std::string& name = "t.fpat") {
  auto r = std::make_unique<Compiled>();
  int id = r->sm.addBuffer(name, text);
  r->diags = std::make_unique<DiagEngine>(r->sm);
  dsl::CompileOptions opts;
  opts.includeDirs = {kPatterns};
  r->c = dsl::compileFpat(id, r->sm, *r->diags, opts);
  return r;
}

inline std::unique_ptr<Compiled> compileBuiltin() {
  std::string text;
  BOOST_TEST_REQUIRE(readFile(kPatterns + "/all.fpat", text));
  return compile(text, kPatterns + "/all.fpat");
}

} // namespace fpat::testing
