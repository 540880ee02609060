// VectorMath.cpp - exp-bound loops through libmvec (VectorMath.h).

#include "VectorMath.h"

#include <algorithm>
#include <cmath>
#include <immintrin.h>

// glibc's AVX2 expf of eight lanes (libmvec, GLIBC_2.22; x86_64 vector
// function ABI name: 'd' AVX2, 'N8' unmasked, eight lanes, 'v' a vector).
extern "C" __m256 _ZGVdN8v_expf(__m256 x);

namespace parax::runtime {
namespace {

bool haveAvx2() {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2;
}

__attribute__((target("avx2,fma"))) int64_t siluTimes8(const float *g, const float *u, float *y, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    __m256 v = _mm256_loadu_ps(g + k);
    __m256 s = _mm256_div_ps(v, _mm256_add_ps(one, _ZGVdN8v_expf(_mm256_sub_ps(zero, v))));
    _mm256_storeu_ps(y + k, u ? _mm256_mul_ps(s, _mm256_loadu_ps(u + k)) : s);
  }
  return k;
}

__attribute__((target("avx2,fma"))) int64_t swigluGradient8(const float *g, const float *u, const float *dy,
                                                            int operand, float *d, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f), zero = _mm256_setzero_ps();
  int64_t k = 0;
  for (; k + 8 <= n; k += 8) {
    __m256 v = _mm256_loadu_ps(g + k), grad = _mm256_loadu_ps(dy + k);
    __m256 s = _mm256_div_ps(one, _mm256_add_ps(one, _ZGVdN8v_expf(_mm256_sub_ps(zero, v))));
    __m256 out = operand == 0 ? _mm256_mul_ps(_mm256_mul_ps(grad, _mm256_loadu_ps(u + k)),
                                              _mm256_add_ps(s, _mm256_mul_ps(_mm256_mul_ps(v, s), _mm256_sub_ps(one, s))))
                              : _mm256_mul_ps(_mm256_mul_ps(grad, v), s);
    _mm256_storeu_ps(d + k, out);
  }
  return k;
}

// exp(x - shift) into `out` (null: not kept), their sum added to `sum`.
__attribute__((target("avx2,fma"))) int64_t expShifted8(const float *x, float *out, int64_t n, float shift,
                                                        double &sum) {
  const __m256 by = _mm256_set1_ps(shift);
  __m256d low = _mm256_setzero_pd(), high = _mm256_setzero_pd();
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) {
    __m256 e = _ZGVdN8v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + t), by));
    if (out) _mm256_storeu_ps(out + t, e);
    low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, _mm256_add_pd(low, high));
  sum += lanes[0] + lanes[1] + lanes[2] + lanes[3];
  return t;
}

__attribute__((target("avx2,fma"))) float max8(const float *x, int64_t n) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t t = 0;
  for (; t + 8 <= n; t += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + t));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, m);
  float best = lanes[0];
  for (int i = 1; i < 8; ++i) best = std::max(best, lanes[i]);
  for (; t < n; ++t) best = std::max(best, x[t]);
  return best;
}

} // namespace

void siluTimes(const float *g, const float *u, float *y, int64_t n) {
  int64_t k = haveAvx2() ? siluTimes8(g, u, y, n) : 0;
  for (; k < n; ++k) {
    float s = g[k] / (1.0f + std::exp(-g[k]));
    y[k] = u ? s * u[k] : s;
  }
}

void swigluGradient(const float *g, const float *u, const float *dy, int operand, float *d, int64_t n) {
  int64_t k = haveAvx2() ? swigluGradient8(g, u, dy, operand, d, n) : 0;
  for (; k < n; ++k) {
    float s = 1.0f / (1.0f + std::exp(-g[k]));
    d[k] = operand == 0 ? dy[k] * u[k] * (s + g[k] * s * (1.0f - s)) : dy[k] * g[k] * s;
  }
}

double expShifted(float *x, int64_t n, float shift) {
  double sum = 0;
  int64_t t = haveAvx2() ? expShifted8(x, x, n, shift, sum) : 0;
  for (; t < n; ++t) sum += x[t] = std::exp(x[t] - shift);
  return sum;
}

double expSum(const float *x, int64_t n, float shift) {
  double sum = 0;
  int64_t t = haveAvx2() ? expShifted8(x, nullptr, n, shift, sum) : 0;
  for (; t < n; ++t) sum += std::exp(x[t] - shift);
  return sum;
}

float largest(const float *x, int64_t n) {
  if (haveAvx2()) return max8(x, n);
  float best = -INFINITY;
  for (int64_t t = 0; t < n; ++t) best = std::max(best, x[t]);
  return best;
}

void softmax(float *x, int64_t n) {
  const float scale = static_cast<float>(1.0 / expShifted(x, n, largest(x, n)));
  for (int64_t t = 0; t < n; ++t) x[t] *= scale;
}

} // namespace parax::runtime
