// FewRowsGemm.cpp - FewRowsGemm.h.
//
// Few rows (a decode step of several sequences), AVX-512: blocks of up to 4
// rows of x by 6 rows of w (8 for 1-2 rows of x), 16 columns a step, each
// weight row prefetched, so that 6-8 streams of the weight are
// in flight from DRAM at once; the weight rows stay in L1/L2 while every
// block of x's rows passes over them, so the weight streams from memory
// once. Each stream is prefetched 32 KB ahead into L2: nearer, or into L1,
// the loads waited on DRAM (docs/executable.md).
//
// AVX2 (no AVX-512): blocks of 4 rows of x by 3 rows of w: 12 accumulators
// of 8 floats, 3 weight and 4 x vectors loaded a step of 8 columns (16 of
// the 16 AVX2 registers).
//
// A few rows times a matrix as it is stored ([in, out]: a decode step's
// attention weights times its values, the query heads that share a KV
// head together): the matrix read once for all the rows, 64 columns of
// each row's result in registers (32 beyond 4 rows).
//
// One row of x (a decode step of one sequence) is a matrix-vector product
// bound by the weight's read: 8 weight rows streamed at once, 16 columns a
// step (AVX-512), each stream prefetched 32 KB ahead into L2.

#include "FewRowsGemm.h"

#include <immintrin.h>

namespace parax::runtime {

namespace {

__attribute__((target("avx2,fma"))) inline float sum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// y[r, c] for R rows of x (from `x`) and C rows of w (from `w`).
template <int R, int C>
__attribute__((target("avx2,fma"))) void block(const float *x, const float *w, int64_t k, int64_t ldw,
                                               float *y, int64_t n) {
  // (The loops over r and c unrolled whatever the optimisation level, so
  // that the accumulators stay in registers: at -O2 GCC kept them in
  // memory, a third of the speed.)
  __m256 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) acc[r][c] = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= k; j += 8) {
    __m256 wv[C];
#pragma GCC unroll 3
    for (int c = 0; c < C; ++c) wv[c] = _mm256_loadu_ps(w + c * ldw + j);
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m256 xv = _mm256_loadu_ps(x + r * k + j);
#pragma GCC unroll 3
      for (int c = 0; c < C; ++c) acc[r][c] = _mm256_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) {
      float s = sum8(acc[r][c]);
      for (int64_t t = j; t < k; ++t) s += x[r * k + t] * w[c * ldw + t];
      y[r * n + c] = s;
    }
}

// y[r, c] for R rows of x and C rows of w, AVX-512: 16 columns a step, the
// last ones masked, each weight row prefetched kAhead floats on (a prefetch
// past the weight's end is harmless: prefetches do not fault).
template <int R, int C>
__attribute__((target("avx512f"))) void block16(const float *x, const float *w, int64_t k, int64_t ldw,
                                                float *y, int64_t n) {
  constexpr int64_t kAhead = 8192; // floats: 32 KB a stream, into L2 (docs/executable.md)
  __m512 acc[R][C];
#pragma GCC unroll 4
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) acc[r][c] = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    __m512 wv[C];
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      _mm_prefetch(reinterpret_cast<const char *>(w + c * ldw + j + kAhead), _MM_HINT_T1);
      wv[c] = _mm512_loadu_ps(w + c * ldw + j);
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; ++r) {
      __m512 xv = _mm512_loadu_ps(x + r * k + j);
#pragma GCC unroll 8
      for (int c = 0; c < C; ++c) acc[r][c] = _mm512_fmadd_ps(xv, wv[c], acc[r][c]);
    }
  }
  if (j < k) {
    __mmask16 tail = static_cast<__mmask16>((1u << (k - j)) - 1);
    for (int c = 0; c < C; ++c) {
      __m512 wv = _mm512_maskz_loadu_ps(tail, w + c * ldw + j);
      for (int r = 0; r < R; ++r)
        acc[r][c] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(tail, x + r * k + j), wv, acc[r][c]);
    }
  }
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) y[r * n + c] = _mm512_reduce_add_ps(acc[r][c]);
}

// The AVX2 and AVX-512 blocks, for rowBlocks.
struct Avx2 {
  template <int R, int C>
  static void run(const float *x, const float *w, int64_t k, int64_t ldw, float *y, int64_t n) {
    block<R, C>(x, w, k, ldw, y, n);
  }
};
struct Avx512 {
  template <int R, int C>
  static void run(const float *x, const float *w, int64_t k, int64_t ldw, float *y, int64_t n) {
    block16<R, C>(x, w, k, ldw, y, n);
  }
};

// Every row of x against the C weight rows at w: blocks of 4 rows, then
// the 3, 2 or 1 left.
template <typename Block, int C>
void rowBlocks(int64_t m, const float *x, const float *w, int64_t k, int64_t ldw, float *y, int64_t n) {
  int64_t r = 0;
  for (; r + 4 <= m; r += 4) Block::template run<4, C>(x + r * k, w, k, ldw, y + r * n, n);
  switch (m - r) {
  case 3: Block::template run<3, C>(x + r * k, w, k, ldw, y + r * n, n); break;
  case 2: Block::template run<2, C>(x + r * k, w, k, ldw, y + r * n, n); break;
  case 1: Block::template run<1, C>(x + r * k, w, k, ldw, y + r * n, n); break;
  default: break;
  }
}

__attribute__((target("avx2,fma"))) void fewRows(int64_t m, int64_t n, int64_t k, const float *x,
                                                 const float *w, int64_t ldw, float *y) {
  int64_t c = 0;
  for (; c + 3 <= n; c += 3) rowBlocks<Avx2, 3>(m, x, w + c * ldw, k, ldw, y + c, n);
  if (n - c == 2) rowBlocks<Avx2, 2>(m, x, w + c * ldw, k, ldw, y + c, n);
  else if (n - c == 1) rowBlocks<Avx2, 1>(m, x, w + c * ldw, k, ldw, y + c, n);
}

// C weight rows a block: 6 (4 x 6 accumulators, 6 weight vectors and one
// of x: 31 of the 32 registers), 8 for 2 rows (25).
template <int C>
__attribute__((target("avx512f"))) void fewRows16(int64_t m, int64_t n, int64_t k, const float *x,
                                                  const float *w, int64_t ldw, float *y) {
  int64_t c = 0;
  for (; c + C <= n; c += C) rowBlocks<Avx512, C>(m, x, w + c * ldw, k, ldw, y + c, n);
  for (; c < n; ++c) rowBlocks<Avx512, 1>(m, x, w + c * ldw, k, ldw, y + c, n);
}

// y[c] = x · w[c] for C rows of w; 16 columns a step, the last ones masked.
template <int C>
__attribute__((target("avx512f"))) void rowsOfW(const float *x, const float *w, int64_t k, int64_t ldw, float *y) {
  constexpr int64_t kAhead = 8192; // floats: 32 KB a stream, into L2
  __m512 acc[C];
#pragma GCC unroll 8
  for (int c = 0; c < C; ++c) acc[c] = _mm512_setzero_ps();
  int64_t j = 0;
  for (; j + 16 <= k; j += 16) {
    __m512 xv = _mm512_loadu_ps(x + j);
#pragma GCC unroll 8
    for (int c = 0; c < C; ++c) {
      _mm_prefetch(reinterpret_cast<const char *>(w + c * ldw + j + kAhead), _MM_HINT_T1);
      acc[c] = _mm512_fmadd_ps(xv, _mm512_loadu_ps(w + c * ldw + j), acc[c]);
    }
  }
  if (j < k) {
    __mmask16 tail = static_cast<__mmask16>((1u << (k - j)) - 1);
    __m512 xv = _mm512_maskz_loadu_ps(tail, x + j);
    for (int c = 0; c < C; ++c) acc[c] = _mm512_fmadd_ps(xv, _mm512_maskz_loadu_ps(tail, w + c * ldw + j), acc[c]);
  }
  for (int c = 0; c < C; ++c) y[c] = _mm512_reduce_add_ps(acc[c]);
}

__attribute__((target("avx512f"))) void oneRow(int64_t n, int64_t k, const float *x, const float *w,
                                               int64_t ldw, float *y) {
  int64_t c = 0;
  for (; c + 8 <= n; c += 8) rowsOfW<8>(x, w + c * ldw, k, ldw, y + c);
  for (; c + 4 <= n; c += 4) rowsOfW<4>(x, w + c * ldw, k, ldw, y + c);
  for (; c < n; ++c) rowsOfW<1>(x, w + c * ldw, k, ldw, y + c);
}

// y[r, c] = x[r] · w[:, c] for R rows of x (ldx apart) and w k rows of n
// (ldw apart), 16 Q columns of y at once: R x Q accumulators, each row of
// w's Q vectors loaded once and added into every row of y with that row's
// x[j] broadcast, so that w is read once whatever R; the last columns
// masked.
template <int R, int Q>
__attribute__((target("avx512f"))) void rowsOfRows(int64_t n, int64_t k, const float *x, int64_t ldx,
                                                   const float *w, int64_t ldw, float *y, int64_t ldy) {
  for (int64_t c = 0; c < n; c += 16 * Q) {
    __mmask16 mask[Q];
#pragma GCC unroll 4
    for (int q = 0; q < Q; ++q) {
      int64_t left = n - c - 16 * q;
      mask[q] = left >= 16 ? __mmask16(0xFFFF) : left > 0 ? static_cast<__mmask16>((1u << left) - 1) : 0;
    }
    __m512 acc[R][Q];
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) acc[r][q] = _mm512_setzero_ps();
    for (int64_t j = 0; j < k; ++j) {
      __m512 wv[Q];
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) wv[q] = _mm512_maskz_loadu_ps(mask[q], w + j * ldw + c + 16 * q);
#pragma GCC unroll 8
      for (int r = 0; r < R; ++r) {
        __m512 xv = _mm512_set1_ps(x[r * ldx + j]);
#pragma GCC unroll 4
        for (int q = 0; q < Q; ++q) acc[r][q] = _mm512_fmadd_ps(xv, wv[q], acc[r][q]);
      }
    }
    // (every loop over r and q unrolled, this one too: else GCC keeps the
    // accumulators in memory, stored every step, at -O2)
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
      for (int q = 0; q < Q; ++q) _mm512_mask_storeu_ps(y + r * ldy + c + 16 * q, mask[q], acc[r][q]);
  }
}

// 1-4 rows: 64 columns at once (at most 16 accumulators, 4 vectors of w);
// 5-8 rows: 32 (2 vectors of w).
__attribute__((target("avx512f"))) void rowsTimes(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx,
                                                  const float *w, int64_t ldw, float *y, int64_t ldy) {
  switch (m) {
  case 1: rowsOfRows<1, 4>(n, k, x, ldx, w, ldw, y, ldy); break;
  case 2: rowsOfRows<2, 4>(n, k, x, ldx, w, ldw, y, ldy); break;
  case 3: rowsOfRows<3, 4>(n, k, x, ldx, w, ldw, y, ldy); break;
  case 4: rowsOfRows<4, 4>(n, k, x, ldx, w, ldw, y, ldy); break;
  case 5: rowsOfRows<5, 2>(n, k, x, ldx, w, ldw, y, ldy); break;
  case 6: rowsOfRows<6, 2>(n, k, x, ldx, w, ldw, y, ldy); break;
  case 7: rowsOfRows<7, 2>(n, k, x, ldx, w, ldw, y, ldy); break;
  default: rowsOfRows<8, 2>(n, k, x, ldx, w, ldw, y, ldy); break;
  }
}

bool supported() {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2;
}

} // namespace

bool oneRowTimesTransposed(int64_t n, int64_t k, const float *x, const float *w, int64_t ldw, float *y) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (n < 1 || k < 1 || ldw < k || !avx512) return false;
  oneRow(n, k, x, w, ldw, y);
  return true;
}

bool fewRowsTimes(int64_t m, int64_t n, int64_t k, const float *x, int64_t ldx, const float *w, int64_t ldw,
                  float *y, int64_t ldy) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (m < 1 || m > kFewRowsTimes || n < 1 || k < 1 || ldx < k || ldw < n || ldy < n || !avx512) return false;
  rowsTimes(m, n, k, x, ldx, w, ldw, y, ldy);
  return true;
}

bool fewRowsTimesTransposedAvx2(int64_t m, int64_t n, int64_t k, const float *x, const float *w, int64_t ldw,
                                float *y) {
  if (m < 2 || m > kFewRows || n < 1 || k < 1 || ldw < k || !supported()) return false;
  fewRows(m, n, k, x, w, ldw, y);
  return true;
}

bool fewRowsTimesTransposed(int64_t m, int64_t n, int64_t k, const float *x, const float *w, int64_t ldw,
                            float *y) {
  static const bool avx512 = __builtin_cpu_supports("avx512f");
  if (m < 2 || m > kFewRows || n < 1 || k < 1 || ldw < k || !supported()) return false;
  if (avx512 && m <= 2)
    fewRows16<8>(m, n, k, x, w, ldw, y);
  else if (avx512)
    fewRows16<6>(m, n, k, x, w, ldw, y);
  else
    fewRows(m, n, k, x, w, ldw, y);
  return true;
}

} // namespace parax::runtime
