#include "fpat/runtime/Cuda.h"

#include <algorithm>
#include <dlfcn.h>
#include <mutex>

namespace fpat::cuda {
namespace {

// Entry points, resolved once. `_v2` names are the current ABI of the unsuffixed macros in
// cuda.h; the unsuffixed symbols are tried as a fallback.
struct Api {
  CUresult (*cuInit)(unsigned);
  CUresult (*cuDeviceGetCount)(int*);
  CUresult (*cuDeviceGet)(CUdevice*, int);
  CUresult (*cuDeviceGetName)(char*, int, CUdevice);
  CUresult (*cuDeviceGetAttribute)(int*, int, CUdevice);
  CUresult (*cuDeviceTotalMem)(size_t*, CUdevice);
  CUresult (*cuDevicePrimaryCtxRetain)(CUcontext*, CUdevice);
  CUresult (*cuCtxSetCurrent)(CUcontext);
  CUresult (*cuCtxSynchronize)();
  CUresult (*cuModuleLoadData)(CUmodule*, const void*);
  CUresult (*cuModuleUnload)(CUmodule);
  CUresult (*cuModuleGetFunction)(CUfunction*, CUmodule, const char*);
  CUresult (*cuFuncSetAttribute)(CUfunction, int, int);
  CUresult (*cuFuncGetAttribute)(int*, int, CUfunction);
  CUresult (*cuLaunchKernel)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                             unsigned, CUstream, void**, void**);
  CUresult (*cuMemAlloc)(CUdeviceptr*, size_t);
  CUresult (*cuMemFree)(CUdeviceptr);
  CUresult (*cuMemcpyHtoD)(CUdeviceptr, const void*, size_t);
  CUresult (*cuMemcpyDtoH)(void*, CUdeviceptr, size_t);
  CUresult (*cuMemcpyDtoD)(CUdeviceptr, CUdeviceptr, size_t);
  CUresult (*cuMemsetD16)(CUdeviceptr, unsigned short, size_t);
  CUresult (*cuMemGetInfo)(size_t*, size_t*);
  CUresult (*cuGetErrorString)(CUresult, const char**);
  CUresult (*cuEventCreate)(CUevent*, unsigned);
  CUresult (*cuEventRecord)(CUevent, CUstream);
  CUresult (*cuEventSynchronize)(CUevent);
  CUresult (*cuEventElapsedTime)(float*, CUevent, CUevent);
  CUresult (*cuEventDestroy)(CUevent);
  // Optional (CUDA 12+): cluster occupancy and TMA tensor maps for the Hopper backend, and
  // launches with attributes (programmatic dependent launch).
  CUresult (*cuLaunchKernelEx)(const void*, CUfunction, void**, void**);
  CUresult (*cuOccupancyMaxActiveClusters)(int*, CUfunction, const void*);
  CUresult (*cuTensorMapEncodeTiled)(void*, int, unsigned, void*, const uint64_t*, const uint64_t*,
                                     const unsigned*, const unsigned*, int, int, int, int);
};
Api api;

template <class F> bool resolve(void* lib, F& fn, const char* name, const char* alt = nullptr) {
  void* p = dlsym(lib, name);
  if (!p && alt)
    p = dlsym(lib, alt);
  fn = reinterpret_cast<F>(p);
  return p != nullptr;
}

} // namespace

Driver* Driver::get(std::string* why) {
  static std::once_flag once;
  static Driver* instance = nullptr;
  static std::string reason;
  std::call_once(once, [] {
    auto* d = new Driver();
    if (d->init(&reason))
      instance = d;
    else
      delete d;
  });
  if (!instance && why)
    *why = reason;
  return instance;
}

bool Driver::init(std::string* why) {
  lib_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (!lib_) {
    *why = "no CUDA driver (libcuda.so.1 not found)";
    return false;
  }
  bool ok = resolve(lib_, api.cuInit, "cuInit") &&
            resolve(lib_, api.cuDeviceGetCount, "cuDeviceGetCount") &&
            resolve(lib_, api.cuDeviceGet, "cuDeviceGet") &&
            resolve(lib_, api.cuDeviceGetName, "cuDeviceGetName") &&
            resolve(lib_, api.cuDeviceGetAttribute, "cuDeviceGetAttribute") &&
            resolve(lib_, api.cuDeviceTotalMem, "cuDeviceTotalMem_v2", "cuDeviceTotalMem") &&
            resolve(lib_, api.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain") &&
            resolve(lib_, api.cuCtxSetCurrent, "cuCtxSetCurrent") &&
            resolve(lib_, api.cuCtxSynchronize, "cuCtxSynchronize") &&
            resolve(lib_, api.cuModuleLoadData, "cuModuleLoadData") &&
            resolve(lib_, api.cuModuleUnload, "cuModuleUnload") &&
            resolve(lib_, api.cuModuleGetFunction, "cuModuleGetFunction") &&
            resolve(lib_, api.cuFuncSetAttribute, "cuFuncSetAttribute") &&
            resolve(lib_, api.cuFuncGetAttribute, "cuFuncGetAttribute") &&
            resolve(lib_, api.cuLaunchKernel, "cuLaunchKernel") &&
            resolve(lib_, api.cuMemAlloc, "cuMemAlloc_v2", "cuMemAlloc") &&
            resolve(lib_, api.cuMemFree, "cuMemFree_v2", "cuMemFree") &&
            resolve(lib_, api.cuMemcpyHtoD, "cuMemcpyHtoD_v2", "cuMemcpyHtoD") &&
            resolve(lib_, api.cuMemcpyDtoH, "cuMemcpyDtoH_v2", "cuMemcpyDtoH") &&
            resolve(lib_, api.cuMemcpyDtoD, "cuMemcpyDtoD_v2", "cuMemcpyDtoD") &&
            resolve(lib_, api.cuMemsetD16, "cuMemsetD16_v2", "cuMemsetD16") &&
            resolve(lib_, api.cuMemGetInfo, "cuMemGetInfo_v2", "cuMemGetInfo") &&
            resolve(lib_, api.cuGetErrorString, "cuGetErrorString") &&
            resolve(lib_, api.cuEventCreate, "cuEventCreate") &&
            resolve(lib_, api.cuEventRecord, "cuEventRecord") &&
            resolve(lib_, api.cuEventSynchronize, "cuEventSynchronize") &&
            resolve(lib_, api.cuEventElapsedTime, "cuEventElapsedTime_v2", "cuEventElapsedTime") &&
            resolve(lib_, api.cuEventDestroy, "cuEventDestroy_v2", "cuEventDestroy");
  if (!ok) {
    *why = "the CUDA driver lacks an entry point fpat needs (driver too old?)";
    return false;
  }
  hasTensorMaps_ = resolve(lib_, api.cuTensorMapEncodeTiled, "cuTensorMapEncodeTiled");
  resolve(lib_, api.cuOccupancyMaxActiveClusters, "cuOccupancyMaxActiveClusters");
  resolve(lib_, api.cuLaunchKernelEx, "cuLaunchKernelEx");
  const char* msg = nullptr;
  if (CUresult r = api.cuInit(0); r != 0) {
    api.cuGetErrorString(r, &msg);
    *why = std::string("cuInit failed: ") + (msg ? msg : "unknown error");
    return false;
  }
  int count = 0;
  if (api.cuDeviceGetCount(&count) != 0 || count == 0) {
    *why = "the CUDA driver sees no GPU";
    return false;
  }
  api.cuDeviceGet(&dev_, 0);
  char name[256] = {};
  api.cuDeviceGetName(name, sizeof name, dev_);
  info_.name = name;
  int major = 0, minor = 0;
  api.cuDeviceGetAttribute(&major, 75, dev_);
  api.cuDeviceGetAttribute(&minor, 76, dev_);
  info_.arch = major * 10 + minor;
  api.cuDeviceGetAttribute(&info_.sms, 16, dev_);
  api.cuDeviceGetAttribute(&info_.smemOptin, 97, dev_);
  api.cuDeviceGetAttribute(&info_.maxThreadsPerBlock, 1, dev_);
  api.cuDeviceGetAttribute(&info_.regsPerBlock, 12, dev_);
  api.cuDeviceGetAttribute(&info_.l2Bytes, 38, dev_);
  api.cuDeviceTotalMem(&info_.totalMem, dev_);
  if (CUresult r = api.cuDevicePrimaryCtxRetain(&ctx_, dev_); r != 0) {
    api.cuGetErrorString(r, &msg);
    *why = std::string("cannot create a CUDA context: ") + (msg ? msg : "unknown error");
    return false;
  }
  api.cuCtxSetCurrent(ctx_);
  return true;
}

void Driver::check(CUresult r, const char* what) {
  if (r == 0)
    return;
  const char* msg = nullptr;
  api.cuGetErrorString(r, &msg);
  throw CudaError(std::string(what) + ": " + (msg ? msg : "CUDA error " + std::to_string(r)));
}

CUmodule Driver::loadModule(const std::string& image) {
  CUmodule m = nullptr;
  check(api.cuModuleLoadData(&m, image.data()), "cuModuleLoadData");
  return m;
}
void Driver::unloadModule(CUmodule m) {
  check(api.cuModuleUnload(m), "cuModuleUnload");
}
CUfunction Driver::function(CUmodule m, const std::string& name) {
  CUfunction f = nullptr;
  check(api.cuModuleGetFunction(&f, m, name.c_str()), ("kernel " + name).c_str());
  return f;
}
void Driver::setMaxDynamicSmem(CUfunction f, int bytes) {
  check(api.cuFuncSetAttribute(f, 8, bytes), "cuFuncSetAttribute(max dynamic shared memory)");
}
int Driver::funcAttribute(CUfunction f, int attr) {
  int v = 0;
  check(api.cuFuncGetAttribute(&v, attr, f), "cuFuncGetAttribute");
  return v;
}
void Driver::launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, int smem,
                    void* argBlock, size_t argBytes) {
  // One parameter (the argument block), passed by address; its size comes from the kernel.
  (void)argBytes;
  void* params[] = {argBlock};
  check(api.cuLaunchKernel(f, gx, gy, gz, bx, 1, 1, static_cast<unsigned>(smem), nullptr, params,
                           nullptr),
        "cuLaunchKernel");
}
void Driver::launchOverlapping(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                               int smem, void* argBlock) {
  if (!api.cuLaunchKernelEx) {
    launch(f, gx, gy, gz, bx, smem, argBlock, 0);
    return;
  }
  // cuda.h's CUlaunchAttribute (id, padding to 8 bytes, a 64-byte value) and CUlaunchConfig;
  // CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6, its value an int.
  struct Attr {
    int id;
    char pad[4];
    union {
      char bytes[64];
      int allowed;
    } value;
  } attr{};
  attr.id = 6;
  attr.value.allowed = 1;
  struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    Attr* attrs;
    unsigned numAttrs;
  } config = {gx, gy, gz, bx, 1, 1, static_cast<unsigned>(smem), nullptr, &attr, 1};
  void* params[] = {argBlock};
  check(api.cuLaunchKernelEx(&config, f, params, nullptr), "cuLaunchKernelEx");
}
int Driver::maxActiveClusters(CUfunction f, unsigned clusterSize, unsigned threads, int smem) {
  if (!api.cuOccupancyMaxActiveClusters)
    return 0;
  // cuda.h's CUlaunchConfig, without attributes: the cluster size is the kernel's own.
  struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    CUstream hStream;
    void* attrs;
    unsigned numAttrs;
  } config = {clusterSize * static_cast<unsigned>(std::max(1, info_.sms)),
              1,
              1,
              threads,
              1,
              1,
              static_cast<unsigned>(smem),
              nullptr,
              nullptr,
              0};
  int n = 0;
  return api.cuOccupancyMaxActiveClusters(&n, f, &config) == 0 ? n : 0;
}
void Driver::encodeTensorMap(void* map, CUdeviceptr base, uint64_t inner, uint64_t outer,
                             uint64_t rowBytes, unsigned boxInner, unsigned boxOuter) {
  if (!hasTensorMaps_)
    throw CudaError("the CUDA driver cannot encode TMA tensor maps (cuTensorMapEncodeTiled)");
  // cuda.h's enumerators: CU_TENSOR_MAP_DATA_TYPE_FLOAT16 = 6, INTERLEAVE_NONE = 0,
  // SWIZZLE_128B = 3, L2_PROMOTION_L2_256B = 3, FLOAT_OOB_FILL_NONE = 0 (zeros).
  const uint64_t dims[2] = {inner, outer};
  const uint64_t strides[1] = {rowBytes};
  const unsigned box[2] = {boxInner, boxOuter};
  const unsigned elementStrides[2] = {1, 1};
  check(api.cuTensorMapEncodeTiled(map, 6, 2, reinterpret_cast<void*>(base), dims, strides, box,
                                   elementStrides, 0, 3, 3, 0),
        "cuTensorMapEncodeTiled");
}
CUdeviceptr Driver::alloc(size_t bytes) {
  CUdeviceptr p = 0;
  check(api.cuMemAlloc(&p, bytes ? bytes : 16), "cuMemAlloc");
  return p;
}
void Driver::free(CUdeviceptr p) {
  if (p)
    check(api.cuMemFree(p), "cuMemFree");
}
void Driver::copyToDevice(CUdeviceptr dst, const void* src, size_t bytes) {
  check(api.cuMemcpyHtoD(dst, src, bytes), "cuMemcpyHtoD");
}
void Driver::copyToHost(void* dst, CUdeviceptr src, size_t bytes) {
  check(api.cuMemcpyDtoH(dst, src, bytes), "cuMemcpyDtoH");
}
void Driver::copyOnDevice(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
  check(api.cuMemcpyDtoD(dst, src, bytes), "cuMemcpyDtoD");
}
void Driver::fill16(CUdeviceptr p, uint16_t value, size_t count) {
  check(api.cuMemsetD16(p, value, count), "cuMemsetD16");
}
void Driver::synchronize() {
  check(api.cuCtxSynchronize(), "kernel execution");
}
CUevent Driver::createEvent() {
  CUevent e = nullptr;
  check(api.cuEventCreate(&e, 0), "cuEventCreate");
  return e;
}
void Driver::destroyEvent(CUevent e) {
  check(api.cuEventDestroy(e), "cuEventDestroy");
}
void Driver::record(CUevent e) {
  check(api.cuEventRecord(e, nullptr), "cuEventRecord");
}
float Driver::elapsedMs(CUevent start, CUevent stop) {
  check(api.cuEventSynchronize(stop), "cuEventSynchronize");
  float ms = 0;
  check(api.cuEventElapsedTime(&ms, start, stop), "cuEventElapsedTime");
  return ms;
}
size_t Driver::freeMemory() {
  size_t f = 0, t = 0;
  check(api.cuMemGetInfo(&f, &t), "cuMemGetInfo");
  return f;
}

} // namespace fpat::cuda
