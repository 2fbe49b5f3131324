#include "fpat/support/Process.h"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <poll.h>
#include <sstream>
#include <sys/stat.h>
#ifdef __linux__
#include <sys/prctl.h>
#endif
#include <sys/wait.h>
#include <unistd.h>

namespace fpat {

std::string findProgram(const std::string& program) {
  if (program.find('/') != std::string::npos)
    return access(program.c_str(), X_OK) == 0 ? program : "";
  const char* path = std::getenv("PATH");
  std::istringstream dirs(path ? path : "/usr/bin:/bin");
  std::string dir;
  while (std::getline(dirs, dir, ':')) {
    std::string full = (dir.empty() ? "." : dir) + "/" + program;
    struct stat st;
    if (stat(full.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(full.c_str(), X_OK) == 0)
      return full;
  }
  return "";
}

ProcessResult runProcess(const std::vector<std::string>& argv, double timeoutSeconds) {
  ProcessResult r;
  if (argv.empty())
    return r;
  int fds[2];
  if (pipe(fds) != 0)
    return r;
  const pid_t parent = getpid();
  pid_t pid = fork();
  if (pid < 0) {
    close(fds[0]);
    close(fds[1]);
    return r;
  }
  if (pid == 0) {
#ifdef __linux__
    // The child dies with us (an fpatc killed by the OOM killer leaves no nvcc running on).
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != parent)
      _exit(127); // we died before prctl took effect
#endif
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    close(fds[0]);
    close(fds[1]);
    std::vector<char*> args;
    for (const std::string& a : argv)
      args.push_back(const_cast<char*>(a.c_str()));
    args.push_back(nullptr);
    execvp(args[0], args.data());
    std::fprintf(stderr, "cannot run %s\n", args[0]);
    _exit(127);
  }
  close(fds[1]);
  char buf[4096];
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutSeconds);
  for (;;) {
    int wait = -1;
    if (timeoutSeconds > 0) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                            deadline - std::chrono::steady_clock::now())
                            .count();
      if (left <= 0) {
        // Out of time: the child (and whatever it started in its group) is killed.
        kill(pid, SIGKILL);
        r.timedOut = true;
        break;
      }
      wait = static_cast<int>(std::min<long long>(left, 1000));
    }
    pollfd p{fds[0], POLLIN, 0};
    const int ready = poll(&p, 1, wait);
    if (ready < 0 && errno == EINTR)
      continue;
    if (ready == 0)
      continue;
    const ssize_t n = ready > 0 ? read(fds[0], buf, sizeof buf) : -1;
    if (n <= 0)
      break;
    r.output.append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  r.exitCode = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

unsigned long long availableMemory() {
  if (const char* e = std::getenv("FPAT_MEMORY_LIMIT"); e && *e)
    return std::strtoull(e, nullptr, 10);
  std::ifstream in("/proc/meminfo");
  std::string key;
  unsigned long long kb = 0;
  std::string unit;
  while (in >> key >> kb >> unit)
    if (key == "MemAvailable:")
      return kb * 1024;
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), size = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && size > 0 ? static_cast<unsigned long long>(pages) * size : 0;
}

} // namespace fpat
