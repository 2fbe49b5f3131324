// What the GPU benchmarks share: checked CUDA calls, medians, and the provenance every result
// names (GPU, driver, nvcc, the commit the benchmark was built from).
#pragma once

#include "FpatCommit.h"
#include "fpat/runtime/Cuda.h"
#include "fpat/runtime/Nvcc.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

namespace fpat::bench {

#define CK(x)                                                                                      \
  do {                                                                                             \
    auto rc_ = (x);                                                                                \
    if (rc_ != 0) {                                                                                \
      std::fprintf(stderr, "%s:%d: %s failed (%d)\n", __FILE__, __LINE__, #x, int(rc_));           \
      std::exit(1);                                                                                \
    }                                                                                              \
  } while (0)

inline double median(std::vector<float> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Provenance {
  std::string gpu, driver, nvcc, commit;
};

inline Provenance provenance(const cuda::Driver& drv) {
  Provenance p;
  const cuda::DeviceInfo& d = drv.device();
  p.gpu = d.name + " (sm_" + std::to_string(d.arch) + ", " + std::to_string(d.sms) + " SMs)";
  // The kernel module's version ("580.159.04") where Linux shows it, and the CUDA version the
  // driver supports either way.
  std::ifstream proc("/proc/driver/nvidia/version");
  std::string line;
  if (std::getline(proc, line)) {
    std::istringstream words(line);
    for (std::string w; words >> w;)
      if (!w.empty() && std::isdigit(static_cast<unsigned char>(w[0])) &&
          w.find('.') != std::string::npos) {
        p.driver = w;
        break;
      }
  }
  int v = 0;
  if (cudaDriverGetVersion(&v) == cudaSuccess)
    p.driver += (p.driver.empty() ? "" : " ") + std::string("(CUDA ") + std::to_string(v / 1000) +
                "." + std::to_string(v % 1000 / 10) + ")";
  p.nvcc = "nvcc " + runtime::nvccIdentity(runtime::findNvcc({}), {});
  p.commit = FPAT_COMMIT;
  return p;
}

/// The GPU the benchmark runs on, made current; nullptr (after saying why: the caller exits
/// 77, which ctest counts as skipped) without one.
inline cuda::Driver* benchDriver() {
  std::string why;
  cuda::Driver* drv = cuda::Driver::get(&why);
  if (!drv) {
    std::printf("benchmark skipped: %s\n", why.c_str());
    return nullptr;
  }
  CK(cudaSetDevice(0));
  return drv;
}

} // namespace fpat::bench
