// FewRowsGemm.h - a projection of a few rows (a decode step of several
// sequences) that reads its weight once. Internal to the CPU executor.

#ifndef PARAX_RUNTIME_FEWROWSGEMM_H
#define PARAX_RUNTIME_FEWROWSGEMM_H

#include <cstdint>

namespace parax::runtime {

/// The most rows fewRowsTimesTransposed takes.
inline constexpr int64_t kFewRows = 16;

/// y[m, n] = x[m, k] · w[n, k]ᵀ (a weight stored [out, in], as Hugging Face
/// stores projections; its rows ldw >= k apart, x's k and y's n) for
/// 2 <= m <= kFewRows, each weight row read once
/// for all m rows while they stay in cache: a general sgemm packs the
/// weight first, every call, or (oneDNN's, for a transposed weight) takes
/// a row at a time. AVX-512F where the CPU has it (6-8 weight rows
/// streamed at once, prefetched), else AVX2 and FMA, on the caller's
/// thread: Gemm.h calls it
/// where it beats oneDNN's sgemm (one thread, up to 8 rows). False (nothing
/// written) where it does not apply: other shapes or a CPU without AVX2/FMA.
bool fewRowsTimesTransposed(int64_t m, int64_t n, int64_t k, const float *x, const float *w, int64_t ldw,
                            float *y);

/// The same product through the AVX2 kernel whatever else the CPU has (the
/// tests' way to check it on an AVX-512 machine).
bool fewRowsTimesTransposedAvx2(int64_t m, int64_t n, int64_t k, const float *x, const float *w, int64_t ldw,
                                float *y);

/// y[n] = w[n, k] · x[k] (w's rows ldw >= k apart): one row (a decode step
/// of one sequence, or a decode step's query against its keys), bound by
/// the weight's read. AVX-512F, on the caller's thread: Gemm.h calls it on
/// one thread, where it reads the weight faster than oneDNN's sgemm
/// (docs/executable.md). False (nothing written) on a CPU without AVX-512F.
bool oneRowTimesTransposed(int64_t n, int64_t k, const float *x, const float *w, int64_t ldw, float *y);

/// The most rows fewRowsTimes takes.
inline constexpr int64_t kFewRowsTimes = 8;

/// y[m, n] = x[m, k] · w[k, n] (w stored [in, out], rows ldw >= n apart; x's
/// rows ldx >= k apart, y's ldy >= n) for 1 <= m <= kFewRowsTimes: a few
/// rows times a matrix as it is stored, each of its rows read once for all
/// of them -- a decode step's attention weights times its values, the
/// query heads that share a KV head together -- where a library's sgemm
/// call costs more than the arithmetic (Gemm.h calls it for n <= 64).
/// AVX-512F, on the caller's thread. False (nothing written) for other
/// shapes or on a CPU without AVX-512F.
bool fewRowsTimes(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                  float *y, int64_t ldy);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_FEWROWSGEMM_H
