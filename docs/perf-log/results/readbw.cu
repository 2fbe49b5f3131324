// Plain HBM read rate (probe, not kept): 16-byte streaming loads, grid-stride, CUDA events
// around one launch, buffers rotated past 2x L2; prints best and median GB/s per size.
#include <algorithm>
#include <cstdio>
#include <vector>
__global__ void rd(const int4* __restrict__ p, size_t n, int* sink) {
  int4 acc = {0, 0, 0, 0};
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
    int4 v = __ldcs(p + i);
    acc.x ^= v.x; acc.y ^= v.y; acc.z ^= v.z; acc.w ^= v.w;
  }
  if ((acc.x ^ acc.y ^ acc.z ^ acc.w) == 0x12345678) *sink = 1;
}
int main() {
  int sms; cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  const size_t sizes[] = {size_t(16) << 20, size_t(64) << 20, size_t(256) << 20, size_t(512) << 20};
  int* sink; cudaMalloc(&sink, 4);
  for (size_t bytes : sizes) {
    const int nbuf = 4; std::vector<int4*> bufs(nbuf);
    for (auto& b : bufs) { cudaMalloc(&b, bytes); cudaMemset(b, 1, bytes); }
    cudaEvent_t e0, e1; cudaEventCreate(&e0); cudaEventCreate(&e1);
    double bestAll = 0; int bestG = 0, bestT = 0; double medBest = 0;
    for (int threads : {256, 512, 1024})
      for (int per : {1, 2, 4, 8}) {
        int grid = sms * per * (1024 / threads) / (per > 4 ? 2 : 1);
        std::vector<float> ms;
        for (int r = 0; r < 33; ++r) {
          cudaEventRecord(e0);
          rd<<<grid, threads>>>(bufs[r % nbuf], bytes / 16, sink);
          cudaEventRecord(e1); cudaEventSynchronize(e1);
          float t; cudaEventElapsedTime(&t, e0, e1); if (r >= 3) ms.push_back(t);
        }
        std::sort(ms.begin(), ms.end());
        double best = bytes / (ms[0] * 1e6), med = bytes / (ms[ms.size() / 2] * 1e6);
        if (med > medBest) { medBest = med; bestAll = best; bestG = grid; bestT = threads; }
      }
    printf("%zu MB: median %.0f GB/s (best %.0f) grid %d x %d\n", bytes >> 20, medBest, bestAll, bestG, bestT);
    for (auto b : bufs) cudaFree(b);
  }
  return 0;
}
