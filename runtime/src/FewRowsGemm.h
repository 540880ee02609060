// FewRowsGemm.h - a projection of a few rows (a decode step of several
// sequences) that reads its weight once. Internal to the CPU executor.

#ifndef PARAX_RUNTIME_FEWROWSGEMM_H
#define PARAX_RUNTIME_FEWROWSGEMM_H

#include <cstdint>

namespace parax::runtime {

/// The most rows fewRowsTimesTransposed takes.
inline constexpr int64_t kFewRows = 16;

/// y[m, n] = x[m, k] · w[n, k]ᵀ (a weight stored [out, in], as Hugging Face
/// stores projections) for 2 <= m <= kFewRows, each weight row read once
/// for all m rows while they stay in cache: a general sgemm packs the
/// weight first, every call, or (oneDNN's, for a transposed weight) takes
/// a row at a time. AVX-512F where the CPU has it (6-8 weight rows
/// streamed at once, prefetched), else AVX2 and FMA, on the caller's
/// thread: Gemm.h calls it
/// where it beats oneDNN's sgemm (one thread, up to 8 rows). False (nothing
/// written) where it does not apply: other shapes or a CPU without AVX2/FMA.
bool fewRowsTimesTransposed(int64_t m, int64_t n, int64_t k, const float *x, const float *w, float *y);

/// y[n] = w[n, k] · x[k]: one row (a decode step of one sequence), bound by
/// the weight's read. AVX-512F, on the caller's thread: Gemm.h calls it on
/// one thread, where it reads the weight faster than oneDNN's sgemm
/// (docs/executable.md). False (nothing written) on a CPU without AVX-512F.
bool oneRowTimesTransposed(int64_t n, int64_t k, const float *x, const float *w, float *y);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_FEWROWSGEMM_H
