#include "fpat/runtime/Nvcc.h"

#include "fpat/support/Diagnostics.h"
#include "fpat/support/Hash.h"
#include "fpat/support/Process.h"

#include <atomic>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <stdexcept>
#include <thread>
#include <unistd.h>

namespace fpat::runtime {
namespace fs = std::filesystem;

std::string defaultCacheDir() {
  if (const char* d = std::getenv("FPAT_CACHE_DIR"); d && *d)
    return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    return (fs::path(x) / "fpat").string();
  if (const char* h = std::getenv("HOME"); h && *h)
    return (fs::path(h) / ".cache" / "fpat").string();
  return (fs::temp_directory_path() / "fpat-cache").string();
}

std::string findNvcc(const NvccOptions& o) {
  if (!o.nvcc.empty())
    return findProgram(o.nvcc);
  if (const char* e = std::getenv("FPAT_NVCC"); e && *e)
    return findProgram(e);
  std::string p = findProgram("nvcc");
  if (p.empty()) {
    const char* home = std::getenv("CUDA_HOME");
    p = findProgram(std::string(home && *home ? home : "/usr/local/cuda") + "/bin/nvcc");
  }
  return p;
}

std::string nvccVersion(const std::string& nvcc) {
  static std::mutex mu;
  static std::map<std::string, std::string> memo;
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = memo.find(nvcc); it != memo.end())
    return it->second;
  std::string v;
  if (!nvcc.empty()) {
    ProcessResult r = runProcess({nvcc, "--version"});
    // The last line names the exact build ("Build cuda_13.0.r13.0/compiler.36424714_0").
    size_t p = r.output.rfind("Build ");
    v = p == std::string::npos ? r.output : r.output.substr(p);
    while (!v.empty() && (v.back() == '\n' || v.back() == '\r'))
      v.pop_back();
  }
  return memo[nvcc] = v;
}

void writeFileAtomic(const std::string& path, const std::string& data) {
  static std::atomic<unsigned> counter{0};
  const std::string tmp =
      path + ".tmp." + std::to_string(::getpid()) + "." + std::to_string(counter++);
  {
    std::ofstream f(tmp, std::ios::binary);
    f.write(data.data(), static_cast<std::streamsize>(data.size()));
    f.flush();
    if (!f)
      throw std::runtime_error("cannot write '" + tmp + "'");
  }
  std::error_code ec;
  fs::rename(tmp, path, ec);
  if (ec) {
    fs::remove(tmp, ec);
    throw std::runtime_error("cannot write '" + path + "'");
  }
}

std::vector<std::string> nvccFlagsFromEnvironment() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("FPAT_NVCC_FLAGS")) {
    std::istringstream in(env);
    for (std::string f; in >> f;)
      out.push_back(f);
  }
  return out;
}

std::string nvccIdentity(const std::string& nvcc, const std::vector<std::string>& extra) {
  std::string id = nvccVersion(nvcc);
  std::vector<std::string> flags = extra;
  for (const std::string& f : nvccFlagsFromEnvironment())
    flags.push_back(f);
  if (!flags.empty()) {
    id += " | flags";
    for (const std::string& f : flags)
      id += " " + f;
  }
  return id;
}

namespace {

/// The kernel headers, materialised once per content in <cache>/include/<hash>/.
std::string materialiseHeaders(const std::string& cache) {
  const fs::path dir = fs::path(cache) / "include" / codegen::kernelHeadersHash().substr(0, 16);
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw std::runtime_error("cannot create '" + dir.string() + "': " + ec.message());
  // Checked on every run, like the cubins: a header emptied or edited in the cache would make
  // every later compile fail (the folder's name says which headers it must hold, not what
  // they hold now). Reading them back costs about 1 ms.
  for (auto& [name, text] : codegen::kernelHeaders()) {
    std::string now;
    if (!readFile((dir / name).string(), now) || now != text)
      writeFileAtomic((dir / name).string(), std::string(text));
  }
  return dir.string();
}

CompiledKernel compileOne(const codegen::KernelUnit& u, const NvccOptions& o,
                          const std::string& nvcc, const std::string& version,
                          const std::string& cache, const std::string& include) {
  CompiledKernel k;
  k.name = u.name;
  // -prec-div=false: `/` in activation bodies compiles to PTX div.full.f32 (at most 2 float
  // ulps over the whole range) instead of IEEE division's slow-path branch per element; f16
  // outputs cannot tell (an f16 ulp is 2^13 float ulps; test_gpu checks gelu and silu within
  // one f16 ulp), and SiLU epilogues ran 1.15-1.23x faster on the H200 (bench/RESULTS.md,
  // session 5). Triton compiles `/` the same way.
  std::vector<std::string> flags = {"-std=c++17", "-O3", "-prec-div=false"};
  // wgmma and setmaxnreg exist only in the arch-specific sm_90a target; `-arch=sm_90a` would
  // also run a plain compute_90 pass that rejects them, so name the pair explicitly.
  if (u.sm90a)
    flags.insert(flags.end(), {"-gencode", "arch=compute_90a,code=sm_90a"});
  else
    flags.push_back("-arch=sm_" + std::to_string(o.arch));
  if (o.lineInfo)
    flags.push_back("-lineinfo");
  flags.insert(flags.end(), o.extraFlags.begin(), o.extraFlags.end());
  for (const std::string& f : nvccFlagsFromEnvironment())
    flags.push_back(f);
  std::string key = u.source + "\n" + codegen::kernelHeadersHash() + "\n" + version;
  for (const std::string& f : flags)
    key += "\n" + f;
  const std::string hash = sha256Hex(key).substr(0, 32);
  const fs::path dir = fs::path(cache) / "kernels";
  const fs::path stem = dir / (u.name + "-" + hash.substr(0, 12));
  k.sourcePath = stem.string() + ".cu";
  k.cubinPath = stem.string() + ".cubin";
  if (o.ptx)
    k.ptxPath = stem.string() + ".ptx";
  std::error_code ec;
  // A cache entry is the cubin plus a record of its size and content hash, written after it;
  // an entry that does not match its record (truncated, emptied, edited, or a write that never
  // finished) is compiled again.
  const std::string record = stem.string() + ".cubin.sha256";
  if (fs::exists(k.cubinPath, ec) && (!o.ptx || fs::exists(k.ptxPath, ec))) {
    std::string cubin, want;
    if (readFile(k.cubinPath, cubin) && readFile(record, want) &&
        want == std::to_string(cubin.size()) + " " + sha256Hex(cubin) + "\n") {
      k.cached = true;
      return k;
    }
    k.warning = "kernel cache entry '" + k.cubinPath + "' is damaged (" +
                (cubin.empty()             ? std::string("empty")
                 : !fs::exists(record, ec) ? "no size and hash record"
                                           : "its size or hash does not match the record") +
                "); compiling it again";
    fs::remove(k.cubinPath, ec);
    fs::remove(record, ec);
  }
  auto t0 = std::chrono::steady_clock::now();
  writeFileAtomic(k.sourcePath, u.source);
  auto build = [&](const char* mode, const std::string& out) {
    const std::string tmp =
        out + ".tmp." + std::to_string(::getpid()) + "." +
        std::to_string(std::hash<std::thread::id>()(std::this_thread::get_id()));
    std::vector<std::string> argv = {nvcc, mode, "-I", include};
    argv.insert(argv.end(), flags.begin(), flags.end());
    argv.insert(argv.end(), {"-o", tmp, k.sourcePath});
    ProcessResult r = runProcess(argv);
    // ptxas serializes wgmma it cannot keep asynchronous (accumulators indexed at run time,
    // C7510 and friends) and only warns: such a kernel runs at a fraction of its speed.
    if (r.exitCode == 0 && u.sm90a && r.output.find("wgmma") != std::string::npos &&
        r.output.find("serializ") != std::string::npos) {
      fs::remove(tmp, ec);
      k.error = "ptxas serialized the wgmma instructions of " + k.sourcePath + ":\n" + r.output;
      return false;
    }
    if (r.exitCode != 0) {
      fs::remove(tmp, ec);
      k.error = "nvcc failed on " + k.sourcePath + " (exit " + std::to_string(r.exitCode) + "):\n" +
                r.output;
      return false;
    }
    fs::rename(tmp, out, ec); // atomic publish: readers see a whole file or none
    if (ec) {
      k.error = "cannot write '" + out + "': " + ec.message();
      return false;
    }
    return true;
  };
  if (build("-cubin", k.cubinPath)) {
    std::string cubin;
    if (readFile(k.cubinPath, cubin))
      writeFileAtomic(record, std::to_string(cubin.size()) + " " + sha256Hex(cubin) + "\n");
    if (o.ptx)
      build("-ptx", k.ptxPath);
  }
  k.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return k;
}

} // namespace

int removeStaleTemporaries(const std::string& dir) {
  int removed = 0;
  std::error_code ec;
  const auto now = fs::file_time_type::clock::now();
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    const size_t at = name.find(".tmp.");
    if (at == std::string::npos)
      continue;
    const long pid = std::strtol(name.c_str() + at + 5, nullptr, 10);
    const bool dead = pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH;
    std::error_code tec;
    const auto age = now - fs::last_write_time(it->path(), tec);
    if ((dead || (!tec && age > std::chrono::hours(24))) && fs::remove(it->path(), tec))
      ++removed;
  }
  return removed;
}

std::vector<CompiledKernel> compileAll(const std::vector<codegen::KernelUnit>& units,
                                       const NvccOptions& o) {
  const std::string nvcc = findNvcc(o);
  if (nvcc.empty())
    throw std::runtime_error("nvcc not found: install the CUDA toolkit, put nvcc on PATH or set "
                             "FPAT_NVCC");
  const std::string version = nvccVersion(nvcc);
  const std::string cache = o.cacheDir.empty() ? defaultCacheDir() : o.cacheDir;
  std::error_code ec;
  fs::create_directories(fs::path(cache) / "kernels", ec);
  if (ec)
    throw std::runtime_error("cannot create the kernel cache in '" + cache + "': " + ec.message());
  const std::string include = materialiseHeaders(cache);
  removeStaleTemporaries((fs::path(cache) / "kernels").string());

  // Distinct units only (the same source under the same name compiles once). A name is the
  // kernel's entry point: two different sources under one name would clash in a module.
  std::vector<const codegen::KernelUnit*> todo;
  std::map<std::string, size_t> index;
  for (const codegen::KernelUnit& u : units) {
    if (u.launches.empty())
      continue;
    auto [it, fresh] = index.emplace(u.name, todo.size());
    if (fresh)
      todo.push_back(&u);
    else if (todo[it->second]->source != u.source)
      throw std::logic_error("two different kernels are named " + u.name);
  }
  std::vector<CompiledKernel> done(todo.size());
  std::atomic<size_t> next{0};
  unsigned jobs = o.jobs > 0 ? static_cast<unsigned>(o.jobs) : std::thread::hardware_concurrency();
  jobs = std::max(1u, std::min<unsigned>(jobs, static_cast<unsigned>(todo.size())));
  std::vector<std::thread> pool;
  for (unsigned j = 0; j < jobs; ++j)
    pool.emplace_back([&] {
      for (size_t i; (i = next++) < todo.size();)
        done[i] = compileOne(*todo[i], o, nvcc, version, cache, include);
    });
  for (std::thread& t : pool)
    t.join();
  std::vector<CompiledKernel> out;
  for (const codegen::KernelUnit& u : units)
    if (!u.launches.empty())
      out.push_back(done[index.at(u.name)]);
  return out;
}

} // namespace fpat::runtime
