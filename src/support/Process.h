// Running external programs (dot, nvcc) without a shell, so paths need no quoting.
#pragma once

#include <string>
#include <vector>

namespace fpat {

struct ProcessResult {
  int exitCode = -1;  // -1: could not be started
  std::string output; // stdout and stderr together
};

/// Runs `argv[0]` (searched on PATH) with its arguments and waits for it.
ProcessResult runProcess(const std::vector<std::string>& argv);

/// Full path of `program` on PATH, or "" when it is not there.
std::string findProgram(const std::string& program);

} // namespace fpat
