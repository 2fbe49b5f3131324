// Double-precision GEMM through the system's OpenBLAS when there is one, for the CPU
// reference: loaded with dlopen on first use, so fpat neither links nor needs it (the GPU
// machine has none; the reference then uses its own loops).
#pragma once

#include <cstddef>
#include <string>

namespace fpat::blas {

/// C[m, n] = A[m, k] * B, all row-major; B is [k, n], or [n, k] when `transB`. Returns false
/// when no BLAS could be loaded (or a size exceeds its 32-bit integers): nothing was written.
bool dgemm(bool transB, size_t m, size_t n, size_t k, const double* a, const double* b, double* c);

/// The general form: C = A op(B) + beta C with leading dimensions (row-major), for panels of
/// larger matrices.
bool dgemmInto(bool transB, size_t m, size_t n, size_t k, const double* a, size_t lda,
               const double* b, size_t ldb, double* c, size_t ldc, double beta);

/// What dgemm runs on: "OpenBLAS 0.3.21 ... (libopenblas.so.0)", or why there is no BLAS.
std::string describe();

} // namespace fpat::blas
