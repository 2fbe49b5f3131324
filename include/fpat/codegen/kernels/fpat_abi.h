// The one argument block every generated kernel takes, shared by the host runtime (C++) and
// the kernels (CUDA). Passed by value as the kernel's only parameter (FpatTmaArgs: below).
#pragma once

#include <stdint.h>

// Operands, and what a kernel reads beyond them (codegen::KernelUnit::extraIns): the decode
// kernel that writes kv_append's caches reads the caches' operands too.
#define FPAT_MAX_INPUTS 12
// Shared memory per block with the opt-in on sm_90 (227 KB): the Hopper kernels' static checks
// and the code generator's plans of them.
#define FPAT_SM90_SMEM_BYTES 232448
#define FPAT_MAX_PARAMS 8

// Input kinds of the elementwise family.
#define FPAT_IN_FULL 0   // same shape as the output: element i
#define FPAT_IN_ROWVEC 1 // a [N] vector broadcast over rows: element i % N
#define FPAT_IN_COLVEC 2 // an [M, 1] column broadcast over columns: element i / N
#define FPAT_IN_SCALAR 3 // one value broadcast everywhere: element 0

typedef struct FpatKernelArgs {
  void* out;                       // [M, N] f16 output
  const void* in[FPAT_MAX_INPUTS]; // operands, in the fused op's operand order, then extraIns
  void* scratch[2];                // norm_gemm: per-row mean and rstd (f32, [M]); wgmma: the
                                   // workspace and flags of the last wave split in k
  void* padded[2];                 // wgmma with K % 8 != 0: A and B [N, K] in rows of K
                                   // rounded up to 8 elements, which TMA can read; [1]: a
                                   // weight B prepared as [N, K] rows of that pitch
  void* rowStats[2];               // wgmma norm_gemm (deferred norm): per-row mean and rstd
                                   // (f32, [M]), written by the statistics launch
  int64_t M, N, K;                 // output rows and columns; reduction length
  float eps;                       // layernorm / rmsnorm
  float params[FPAT_MAX_PARAMS];   // activation parameters, in declaration order
} FpatKernelArgs;

// Kernels of the Hopper backend (fpat_wgmma.cuh) read A and B through TMA tensor maps, which
// the host encodes (cuTensorMapEncodeTiled) and passes ahead of the argument block in one
// __grid_constant__ parameter. Same size and alignment as CUDA's CUtensorMap.
typedef struct FpatTensorMap {
  alignas(64) uint64_t opaque[16];
} FpatTensorMap;

typedef struct FpatTmaArgs {
  FpatTensorMap a, b; // A [M, K]; B [N, K] or [K, N]
  FpatTensorMap c, d; // epilogue tile kernels: the [M, N] operand staged by TMA; the output
  FpatKernelArgs k;
  // The last wave split in k (codegen::lastWaveSplit for this launch's grid): the last
  // splitTiles tiles run as splitPieces ranges of k-tiles each; 0 tiles: every tile whole.
  int32_t splitTiles, splitPieces;
} FpatTmaArgs;
