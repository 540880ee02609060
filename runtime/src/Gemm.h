// Gemm.h - the CPU runtime's matrix products, every kernel's and the SIMT
// emulator's cuBLAS's: oneDNN's sgemm, whose just-in-time kernels follow
// the instruction sets the CPU reports (AVX-512, AVX2, ...) rather than a
// table of CPU models -- OpenBLAS 0.3.21, used before, ran its generic SSE3
// kernels on an Intel Xeon it did not know, at a fifth of oneDNN's speed
// (docs/executable.md) -- and FewRowsGemm for a decode step of a few
// sequences. Internal to the runtime.

#ifndef PARAX_RUNTIME_GEMM_H
#define PARAX_RUNTIME_GEMM_H

#include <cstdint>

namespace parax::runtime {

/// C[m, n] = alpha · op(A) · op(B) + beta · C, every matrix row-major
/// (op(A) is m × k, op(B) k × n; lda, ldb, ldc their row strides as
/// stored). C is not read where beta is 0.
void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
          const float *b, int64_t ldb, float beta, float *c, int64_t ldc);

/// The same product, every matrix column-major (cuBLAS's convention):
/// row-major Cᵀ = op(B)ᵀ · op(A)ᵀ.
inline void gemmColumnMajor(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float *a,
                            int64_t lda, const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  gemm(transB, transA, n, m, k, alpha, b, ldb, a, lda, beta, c, ldc);
}

/// The threads each product uses: OMP_NUM_THREADS where it is set (oneDNN
/// runs on OpenMP); otherwise the cores this process is bound to where
/// mpirun (or taskset) bound it, else the online cores shared evenly among
/// the ranks mpirun started on this node (OMPI_COMM_WORLD_LOCAL_SIZE,
/// MPI_LOCALNRANKS), so that ranks sharing a machine do not oversubscribe
/// it. Read once.
int gemmThreads();

} // namespace parax::runtime

#endif // PARAX_RUNTIME_GEMM_H
