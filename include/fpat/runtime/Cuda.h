// The CUDA driver API, loaded at run time with dlopen: fpat binaries start and do all their
// non-GPU work on machines without a GPU or a driver, and say why execution is skipped.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace fpat::cuda {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
struct CUctx_st;
struct CUmod_st;
struct CUfunc_st;
struct CUevent_st;
struct CUstream_st;
using CUcontext = CUctx_st*;
using CUmodule = CUmod_st*;
using CUfunction = CUfunc_st*;
using CUevent = CUevent_st*;
using CUstream = CUstream_st*;

/// What the runtime needs to know about a device.
struct DeviceInfo {
  std::string name;
  int arch = 0; // 10 * major + minor, e.g. 90
  int sms = 0;
  int smemOptin = 0; // max dynamic + static shared memory per block (bytes)
  int maxThreadsPerBlock = 0;
  int regsPerBlock = 0;
  int l2Bytes = 0;
  size_t totalMem = 0;
};

class CudaError : public std::runtime_error {
public:
  using std::runtime_error::runtime_error;
};

/// The loaded driver with a current context on device 0. One per process.
class Driver {
public:
  /// The driver, or null with the reason in `why` (no libcuda, no device, init failure).
  static Driver* get(std::string* why);

  const DeviceInfo& device() const { return info_; }

  // Thin wrappers that throw CudaError with the driver's message.
  CUmodule loadModule(const std::string& image);
  void unloadModule(CUmodule m);
  CUfunction function(CUmodule m, const std::string& name);
  void setMaxDynamicSmem(CUfunction f, int bytes);
  int funcAttribute(CUfunction f, int attr);
  void launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, int smem,
              void* argBlock, size_t argBytes);
  /// The same, allowed to start before the launch ahead of it in the stream has finished
  /// (programmatic dependent launch): `f` waits for it where it reads its results
  /// (fpat::waitPriorGrid). A plain launch where the driver lacks cuLaunchKernelEx.
  void launchOverlapping(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, int smem,
                         void* argBlock);
  CUdeviceptr alloc(size_t bytes);
  void free(CUdeviceptr p);
  void copyToDevice(CUdeviceptr dst, const void* src, size_t bytes);
  void copyToHost(void* dst, CUdeviceptr src, size_t bytes);
  void copyOnDevice(CUdeviceptr dst, CUdeviceptr src, size_t bytes);
  void fill16(CUdeviceptr p, uint16_t value, size_t count);
  void synchronize();
  /// Whether the driver can encode TMA tensor maps (CUDA 12+ drivers).
  bool hasTensorMaps() const { return hasTensorMaps_; }
  /// How many clusters of `f` (its compile-time cluster size `clusterSize`) can be resident at
  /// once with `threads` threads and `smem` bytes of shared memory per CTA; 0 where the driver
  /// cannot say (before CUDA 12).
  int maxActiveClusters(CUfunction f, unsigned clusterSize, unsigned threads, int smem);
  /// Encodes a 2-D f16 tensor map with 128-byte swizzle and zero fill out of bounds into `map`
  /// (128 bytes, 64-byte aligned): `outer` rows of `inner` elements, rows `rowBytes` apart,
  /// boxes of boxInner x boxOuter elements.
  void encodeTensorMap(void* map, CUdeviceptr base, uint64_t inner, uint64_t outer,
                       uint64_t rowBytes, unsigned boxInner, unsigned boxOuter);
  CUevent createEvent();
  void destroyEvent(CUevent e);
  void record(CUevent e);
  float elapsedMs(CUevent start, CUevent stop); // synchronises on `stop`
  size_t freeMemory();

  static constexpr int kFuncNumRegs = 4;
  static constexpr int kFuncLocalBytes = 3;

private:
  Driver() = default;
  bool init(std::string* why);
  void check(CUresult r, const char* what);
  DeviceInfo info_;
  CUcontext ctx_ = nullptr;
  CUdevice dev_ = 0;
  void* lib_ = nullptr;
  bool hasTensorMaps_ = false;
};

} // namespace fpat::cuda
