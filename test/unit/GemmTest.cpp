// The CPU runtime's matrix products (runtime/src/Gemm.h) and the few-rows
// projection (FewRowsGemm.h) against sums in double: every transpose,
// alpha and beta, strides wider than the rows, column-major, and for the
// few-rows kernel every row count it takes and every remainder of its
// blocks (4 rows, 3 weight rows, 8 columns).

#include "Gemm.h"
#include "FewRowsGemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <utility>
#include <vector>

using namespace parax::runtime;

namespace {

// Sum over j < k of x[xAt(j)] * w[wAt(j)] in double, and the sum of the
// terms' magnitudes (the scale of a float sum's rounding).
template <typename XAt, typename WAt>
std::pair<double, double> product(int64_t k, const std::vector<float> &x, XAt xAt, const std::vector<float> &w,
                                  WAt wAt) {
  double sum = 0, size = 0;
  for (int64_t j = 0; j < k; ++j) {
    double term = double(x[xAt(j)]) * w[wAt(j)];
    sum += term;
    size += std::fabs(term);
  }
  return {sum, size};
}

} // namespace

TEST(FewRowsGemmTest, EqualsTheProductForEveryRowCountAndRemainder) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> draw(-1, 1);
  int checked = 0;
  // The kernel the CPU gets, then the AVX2 one on any CPU that has AVX2;
  // weight rows packed and strided.
  for (bool avx2 : {false, true})
  for (int64_t m = 2; m <= kFewRows; ++m)
    for (int64_t n : {1, 2, 3, 4, 5, 7, 11, 13, 17}) // (blocks of 3, 6 and 8 weight rows and what is left)
      for (int64_t k : {1, 7, 8, 9, 15, 17, 31, 64, 1030}) {
        int64_t ldw = k + (n % 2 ? 0 : 5);
        std::vector<float> x(m * k), w(n * ldw), y(m * n, NAN);
        for (float &v : x) v = draw(rng);
        for (float &v : w) v = draw(rng);
        bool done = avx2 ? fewRowsTimesTransposedAvx2(m, n, k, x.data(), w.data(), ldw, y.data())
                         : fewRowsTimesTransposed(m, n, k, x.data(), w.data(), ldw, y.data());
        if (!done)
          GTEST_SKIP() << "this CPU has no AVX2/FMA: sgemm does these";
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < n; ++c) {
            auto [want, size] = product(k, x, [&](int64_t j) { return r * k + j; }, w,
                                        [&](int64_t j) { return c * ldw + j; });
            ASSERT_NEAR(y[r * n + c], want, 1e-6 * size + 1e-7)
                << m << "x" << n << "x" << k << " ldw " << ldw << (avx2 ? " (AVX2)" : "") << " at " << r << ", "
                << c;
            ++checked;
          }
      }
  EXPECT_GT(checked, 0);
}

TEST(FewRowsGemmTest, OneRowEqualsTheProductForEveryRemainder) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> draw(-1, 1);
  int checked = 0;
  // (blocks of 8, 4 and 1 weight rows; 16 columns a step, the rest masked)
  for (int64_t n : {1, 3, 4, 5, 8, 9, 12, 13, 17, 31})
    for (int64_t k : {1, 7, 15, 16, 17, 64, 1030}) {
      std::vector<float> x(k), w(n * k), y(n + 1, NAN);
      for (float &v : x) v = draw(rng);
      for (float &v : w) v = draw(rng);
      if (!oneRowTimesTransposed(n, k, x.data(), w.data(), k, y.data()))
        GTEST_SKIP() << "this CPU has no AVX-512F: sgemm does one row";
      for (int64_t c = 0; c < n; ++c) {
        auto [want, size] = product(k, x, [](int64_t j) { return j; }, w, [&](int64_t j) { return c * k + j; });
        ASSERT_NEAR(y[c], want, 1e-6 * size + 1e-7) << n << "x" << k << " at " << c;
        ++checked;
      }
      EXPECT_TRUE(std::isnan(y[n])) << "wrote past its " << n << " results";
    }
  EXPECT_GT(checked, 0);
}

TEST(FewRowsGemmTest, FewRowsTimesAStoredMatrixForEveryRowCountWidthAndStride) {
  // y = x · w for 1-8 rows of x (ldx apart) and w k rows of n (ldw apart),
  // y's rows ldy apart: blocks of 64 columns for one row, 32 for more, the
  // last masked; nothing written past n in a row, nor between the rows.
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> draw(-1, 1);
  int checked = 0;
  for (int64_t m = 1; m <= kFewRowsTimes; ++m)
    for (int64_t n : {1, 15, 16, 17, 31, 33, 63, 64, 65, 130, 200})
      for (int64_t k : {1, 5, 96})
        for (int64_t pad : {0, 3}) {
          int64_t ldw = n + pad, ldx = k + pad, ldy = n + pad + 1;
          std::vector<float> x(m * ldx), w(k * ldw), y(m * ldy, NAN);
          for (float &v : x) v = draw(rng);
          for (float &v : w) v = draw(rng);
          if (!fewRowsTimes(m, n, k, x.data(), ldx, w.data(), ldw, y.data(), ldy))
            GTEST_SKIP() << "this CPU has no AVX-512F: sgemm does these";
          for (int64_t r = 0; r < m; ++r) {
            for (int64_t c = 0; c < n; ++c) {
              auto [want, size] = product(k, x, [&](int64_t j) { return r * ldx + j; }, w,
                                          [&](int64_t j) { return j * ldw + c; });
              ASSERT_NEAR(y[r * ldy + c], want, 1e-6 * size + 1e-7)
                  << m << "x" << n << "x" << k << " ldw " << ldw << " at " << r << ", " << c;
              ++checked;
            }
            for (int64_t c = n; c < ldy; ++c)
              EXPECT_TRUE(std::isnan(y[r * ldy + c])) << "wrote past row " << r << "'s " << n << " results";
          }
        }
  EXPECT_GT(checked, 0);
  // Beyond its rows, or strides shorter than the rows: not its shape.
  std::vector<float> x(9 * 8, 1), w(8 * 8, 1), y(9 * 8);
  EXPECT_FALSE(fewRowsTimes(9, 8, 8, x.data(), 8, w.data(), 8, y.data(), 8));
  EXPECT_FALSE(fewRowsTimes(2, 8, 8, x.data(), 7, w.data(), 8, y.data(), 8));
  EXPECT_FALSE(fewRowsTimes(2, 8, 8, x.data(), 8, w.data(), 8, y.data(), 7));
}

TEST(FewRowsGemmTest, LeavesOtherShapesAlone) {
  std::vector<float> x(17 * 8, 1), w(8, 1), y(17, -1);
  EXPECT_FALSE(fewRowsTimesTransposed(1, 1, 8, x.data(), w.data(), 8, y.data())); // one row
  EXPECT_FALSE(fewRowsTimesTransposed(17, 1, 8, x.data(), w.data(), 8,
                                      y.data())); // past kFewRows
  EXPECT_FALSE(fewRowsTimesTransposed(2, 1, 8, x.data(), w.data(), 7, y.data())); // rows overlapping
  EXPECT_EQ(y[0], -1);                            // nothing written
}

namespace {

// Element (r, c) of op(M) for M stored row-major with row stride ld.
float at(const std::vector<float> &m, bool trans, int64_t ld, int64_t r, int64_t c) {
  return trans ? m[c * ld + r] : m[r * ld + c];
}

} // namespace

// Row counts 1 (a decode step), 2-8 (the few-rows kernel's), 9-64 and
// 300 (oneDNN's), with and without transposes, alpha and beta, and every
// leading dimension wider than its rows.
TEST(GemmTest, EqualsTheProductForEveryTransposeAlphaBetaAndStride) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> draw(-1, 1);
  int checked = 0;
  for (int64_t m : {1, 2, 5, 8, 9, 64, 300})
    for (int64_t n : {1, 3, 33})
      for (int64_t k : {1, 17, 260})
        for (int form = 0; form < 12; ++form) {
          // (forms 8-11: alpha without beta, padded: the few-row kernels
          // scale after)
          bool ta = form & 1, tb = form & 2, wide = form & 4 || form >= 8;
          float alpha = wide ? 0.5f : 1.0f, beta = wide && form < 8 ? -2.0f : 0.0f;
          int64_t pad = wide ? 3 : 0;
          int64_t lda = (ta ? m : k) + pad, ldb = (tb ? k : n) + pad, ldc = n + pad;
          std::vector<float> a((ta ? k : m) * lda), b((tb ? n : k) * ldb), c(m * ldc);
          for (float &v : a) v = draw(rng);
          for (float &v : b) v = draw(rng);
          for (float &v : c) v = beta == 0 ? NAN : draw(rng); // beta 0: C is not read
          std::vector<float> before = c;
          gemm(ta, tb, m, n, k, alpha, a.data(), lda, b.data(), ldb, beta, c.data(), ldc);
          for (int64_t r = 0; r < m; ++r)
            for (int64_t col = 0; col < n; ++col) {
              double want = 0, size = 0;
              for (int64_t j = 0; j < k; ++j) {
                double term = double(at(a, ta, lda, r, j)) * at(b, tb, ldb, j, col);
                want += term;
                size += std::fabs(term);
              }
              want = alpha * want + (beta == 0 ? 0.0 : beta * double(before[r * ldc + col]));
              ASSERT_NEAR(c[r * ldc + col], want, 1e-5 * (size + std::fabs(want)) + 1e-6)
                  << m << "x" << n << "x" << k << " ta " << ta << " tb " << tb << " wide " << wide << " at " << r
                  << ", " << col;
              ++checked;
            }
          for (int64_t r = 0; r < m && pad; ++r) // the padding past each row of C untouched
            for (int64_t col = n; col < ldc; ++col) // (NaN where beta is 0: C not to be read)
              ASSERT_TRUE(c[r * ldc + col] == before[r * ldc + col] ||
                          (std::isnan(c[r * ldc + col]) && std::isnan(before[r * ldc + col])));
        }
  EXPECT_GT(checked, 0);
}

// cuBLAS's convention (the SIMT emulator's): column-major A (m x k), B
// (k x n), C (m x n).
TEST(GemmTest, ColumnMajorIsTheSameProductStoredByColumns) {
  const int64_t m = 3, n = 4, k = 5;
  std::vector<float> a(m * k), b(k * n), c(m * n, NAN);
  for (int64_t i = 0; i < m * k; ++i) a[i] = float(i % 7) - 3;
  for (int64_t i = 0; i < k * n; ++i) b[i] = float(i % 5) - 2;
  gemmColumnMajor(false, false, m, n, k, 1.0f, a.data(), m, b.data(), k, 0.0f, c.data(), m);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t col = 0; col < n; ++col) {
      float want = 0;
      for (int64_t j = 0; j < k; ++j) want += a[j * m + r] * b[col * k + j];
      EXPECT_EQ(c[col * m + r], want) << r << ", " << col; // small integers: exact
    }
}

TEST(GemmTest, NothingToDoLeavesCAlone) {
  std::vector<float> a(4, 1), b(4, 1), c(4, 7);
  gemm(false, false, 0, 2, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2);
  gemm(false, false, 2, 0, 2, 1.0f, a.data(), 2, b.data(), 2, 0.0f, c.data(), 2);
  for (float v : c) EXPECT_EQ(v, 7);
  EXPECT_GE(gemmThreads(), 1);
}
