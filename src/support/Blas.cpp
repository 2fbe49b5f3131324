#include "fpat/support/Blas.h"

#include <climits>
#include <dlfcn.h>
#include <mutex>

namespace fpat::blas {
namespace {

// CBLAS's interface (cblas.h), declared here so that no BLAS headers are needed to build.
constexpr int kRowMajor = 101, kNoTrans = 111, kTrans = 112;
using Dgemm = void (*)(int, int, int, int, int, int, double, const double*, int, const double*, int,
                       double, double*, int);
using Config = char* (*)();

struct Library {
  Dgemm dgemm = nullptr;
  std::string description;
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    const char* name = "libopenblas.so.0";
    void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      l.description = std::string("no BLAS (") + name + " not found)";
      return l;
    }
    l.dgemm = reinterpret_cast<Dgemm>(dlsym(h, "cblas_dgemm"));
    if (!l.dgemm) {
      l.description = std::string("no BLAS (") + name + " has no cblas_dgemm)";
      return l;
    }
    auto config = reinterpret_cast<Config>(dlsym(h, "openblas_get_config"));
    // "OpenBLAS 0.3.21 NO_LAPACKE DYNAMIC_ARCH ...": its name and version are enough.
    std::string what = config ? config() : "OpenBLAS";
    if (size_t sp = what.find(' '); sp != std::string::npos)
      what = what.substr(0, what.find(' ', sp + 1));
    l.description = what + " (" + name + ")";
    return l;
  }();
  return lib;
}

} // namespace

bool dgemmInto(bool transB, size_t m, size_t n, size_t k, const double* a, size_t lda,
               const double* b, size_t ldb, double* c, size_t ldc, double beta) {
  const Library& lib = library();
  for (size_t v : {m, n, k, lda, ldb, ldc})
    if (v > INT_MAX)
      return false;
  if (!lib.dgemm)
    return false;
  lib.dgemm(kRowMajor, kNoTrans, transB ? kTrans : kNoTrans, static_cast<int>(m),
            static_cast<int>(n), static_cast<int>(k), 1.0, a, static_cast<int>(lda), b,
            static_cast<int>(ldb), beta, c, static_cast<int>(ldc));
  return true;
}

bool dgemm(bool transB, size_t m, size_t n, size_t k, const double* a, const double* b, double* c) {
  return dgemmInto(transB, m, n, k, a, k, b, transB ? k : n, c, n, 0.0);
}

std::string describe() {
  return library().description;
}

} // namespace fpat::blas
