// Golden-test support: expectations written inside a test file, checked against diagnostics.
#pragma once

#include "fpat/support/Diagnostics.h"

#include <string>
#include <vector>

namespace fpat {

/// One `// expected-<severity>[@<line>] {{<message substring>}}` comment.
///   @+N / @-N  relative to the comment's line;  @N  absolute;  @*  any line;
///   @name:N    line N of another buffer whose name ends in `name`.
struct Expectation {
  Severity severity;
  int line = 0;     // 0 = any line
  std::string file; // empty = the file holding the comment
  std::string text;
  int commentLine = 0;
  bool matched = false;
};

/// Parses every expectation in `text`; malformed ones are reported into `problems`.
std::vector<Expectation> parseExpectations(const std::string& text,
                                           std::vector<std::string>& problems);

/// Matches the engine's diagnostics (and their notes) against the expectations of buffer
/// `fileId`. Returns human-readable problems; empty means the golden test passes.
std::vector<std::string> verifyDiagnostics(const DiagEngine& diags, int fileId);

} // namespace fpat
