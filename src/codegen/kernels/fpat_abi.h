// The one argument block every generated kernel takes, shared by the host runtime (C++) and
// the kernels (CUDA). Passed by value as the kernel's only parameter.
#pragma once

#include <stdint.h>

#define FPAT_MAX_INPUTS 8
#define FPAT_MAX_PARAMS 8

// Input kinds of the elementwise family.
#define FPAT_IN_FULL 0   // same shape as the output: element i
#define FPAT_IN_ROWVEC 1 // a [N] vector broadcast over rows: element i % N

typedef struct FpatKernelArgs {
  void* out;                       // [M, N] f16 output
  const void* in[FPAT_MAX_INPUTS]; // operands, in the fused op's operand order
  void* scratch[2];                // norm_gemm: per-row mean and rstd (f32, [M])
  int64_t M, N, K;                 // output rows and columns; reduction length
  float eps;                       // layernorm / rmsnorm
  float params[FPAT_MAX_PARAMS];   // activation parameters, in declaration order
} FpatKernelArgs;
