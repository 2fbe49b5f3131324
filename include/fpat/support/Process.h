// Running external programs (dot, nvcc) without a shell, so paths need no quoting.
#pragma once

#include <string>
#include <vector>

namespace fpat {

struct ProcessResult {
  int exitCode = -1;     // -1: could not be started
  std::string output;    // stdout and stderr together
  bool timedOut = false; // killed after the time it was given
};

/// Runs `argv[0]` (searched on PATH) with its arguments and waits for it, at most
/// `timeoutSeconds` when that is positive (then it is killed, and timedOut says so).
ProcessResult runProcess(const std::vector<std::string>& argv, double timeoutSeconds = 0);

/// Full path of `program` on PATH, or "" when it is not there.
std::string findProgram(const std::string& program);

/// Memory this process can still allocate without swapping: MemAvailable from /proc/meminfo
/// (Linux), else free physical pages; 0 when unknown. $FPAT_MEMORY_LIMIT (bytes) overrides it,
/// for tests and for machines shared with other jobs.
unsigned long long availableMemory();

} // namespace fpat
