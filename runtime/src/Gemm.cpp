// Gemm.cpp - Gemm.h.

#include "Gemm.h"

#include "FewRowsGemm.h"
#include "parax/runtime/Executor.h"

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>

namespace parax::runtime {

namespace {

int readThreads() {
  if (const char *set = std::getenv("OMP_NUM_THREADS"); set && *set)
    return std::max(1, omp_get_max_threads()); // as OpenMP parsed it
  long online = std::max(1L, sysconf(_SC_NPROCESSORS_ONLN));
  cpu_set_t mask;
  if (sched_getaffinity(0, sizeof mask, &mask) == 0 && CPU_COUNT(&mask) < online)
    return std::max(1, CPU_COUNT(&mask)); // bound: the cores it was given
  int local = 1;
  for (const char *name : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"})
    if (const char *value = std::getenv(name)) {
      local = std::max(1, std::atoi(value));
      break;
    }
  return std::max(1L, online / local);
}

// The most rows FewRowsGemm does faster than oneDNN's sgemm: measured on
// an Intel Xeon with AVX-512 (docs/executable.md) at hidden 1024 with 1024,
// 2816 and 32000 outputs: 2-8 rows 0.6-0.9x of oneDNN's time, 16 rows 0.8-1.3x.
constexpr int64_t kFewRowsFaster = 8;

// The widest product of a few rows and a stored (not transposed) matrix
// that FewRowsGemm's fewRowsTimes does faster than oneDNN's sgemm: on the
// AMD EPYC machine (2026-12-07, one thread, medians of 2,001 calls) 1-8
// rows times k x 64 took 0.54-0.99x oneDNN's time for k of 96 to 1,024;
// k x 128 and wider 0.84-1.35x (its column strips walk the matrix's rows
// once each), and one row times 1,024 x 32,000 3.4x.
constexpr int64_t kFewRowsTimesWidest = 64;

// The shortest inner dimension at which the transposed few-row kernels
// (a decode step's projections, its attention's scores) beat oneDNN's
// sgemm: each of their dot products ends in a horizontal sum, which a
// short one does not amortise. The AMD EPYC machine (2026-12-07, one
// thread, medians of 501 calls), against keys 256 or 1,024 floats apart:
// k = 64, 1-8 rows times 96 or 1,536 keys, 1.02-1.99x oneDNN's time;
// k = 128, 1,536 or 8,192 keys, 0.45-1.28x (0.45-0.88x at 8,192).
constexpr int64_t kFewRowsShortest = 128;

} // namespace

int gemmThreads() {
  static const int threads = readThreads();
  return threads;
}

void gemm(bool transA, bool transB, int64_t m, int64_t n, int64_t k, float alpha, const float *a, int64_t lda,
          const float *b, int64_t ldb, float beta, float *c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  int threads = gemmThreads();
  // A few rows on one thread: FewRowsGemm.h, alpha applied after.
  if (threads == 1 && !transA && beta == 0) {
    bool done = false;
    if (transB && m == 1 && k >= kFewRowsShortest)
      done = oneRowTimesTransposed(n, k, a, b, ldb, c);
    else if (transB && m <= kFewRowsFaster && k >= kFewRowsShortest && lda == k && ldc == n)
      done = fewRowsTimesTransposed(m, n, k, a, b, ldb, c);
    else if (!transB && m <= kFewRowsTimes && n <= kFewRowsTimesWidest)
      done = fewRowsTimes(m, n, k, a, lda, b, ldb, c, ldc);
    if (done) {
      if (alpha != 1)
        for (int64_t r = 0; r < m; ++r)
          for (int64_t j = 0; j < n; ++j) c[r * ldc + j] *= alpha;
      return;
    }
  }
  // OpenMP's thread count is each calling thread's own setting.
  thread_local int applied = 0;
  if (applied != threads) {
    omp_set_num_threads(threads);
    applied = threads;
  }
  dnnl_status_t status =
      dnnl_sgemm(transA ? 'T' : 'N', transB ? 'T' : 'N', m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  if (status != dnnl_success) { // strides the runtime computed itself: a bug, never an input's fault
    std::fprintf(stderr,
                 "parax: internal error: oneDNN refused sgemm %c%c m=%lld n=%lld k=%lld lda=%lld ldb=%lld ldc=%lld "
                 "(status %d)\n",
                 transA ? 'T' : 'N', transB ? 'T' : 'N', (long long)m, (long long)n, (long long)k, (long long)lda,
                 (long long)ldb, (long long)ldc, int(status));
    std::abort();
  }
}

std::string gemmKernels() {
  const char *isa = "SSE4.1";
  switch (dnnl_get_effective_cpu_isa()) {
  case dnnl_cpu_isa_avx512_core_amx: isa = "AVX-512 + AMX"; break;
  case dnnl_cpu_isa_avx512_core_bf16:
  case dnnl_cpu_isa_avx512_core_vnni:
  case dnnl_cpu_isa_avx512_core: isa = "AVX-512"; break;
  case dnnl_cpu_isa_avx2_vnni:
  case dnnl_cpu_isa_avx2: isa = "AVX2"; break;
  case dnnl_cpu_isa_avx: isa = "AVX"; break;
  default: break;
  }
  const dnnl_version_t *v = dnnl_version();
  int threads = gemmThreads();
  return "oneDNN " + std::to_string(v->major) + "." + std::to_string(v->minor) + "." + std::to_string(v->patch) +
         " sgemm, " + isa + " kernels, " + std::to_string(threads) + (threads == 1 ? " thread" : " threads");
}

} // namespace parax::runtime
