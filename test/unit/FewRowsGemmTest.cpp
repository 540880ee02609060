// The few-rows projection (runtime/src/FewRowsGemm.h) against a sum in
// double, over every row count it takes and shapes with every remainder of
// its blocks (4 rows, 3 weight rows, 8 columns).

#include "FewRowsGemm.h"

#include <cblas.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

using namespace parax::runtime;

TEST(FewRowsGemmTest, EqualsTheProductForEveryRowCountAndRemainder) {
  openblas_set_num_threads(1);
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> draw(-1, 1);
  int checked = 0;
  for (int64_t m = 2; m <= kFewRows; ++m)
    for (int64_t n : {1, 2, 3, 4, 5, 7, 11})
      for (int64_t k : {1, 7, 8, 9, 17, 64, 1030}) {
        std::vector<float> x(m * k), w(n * k), y(m * n, NAN);
        for (float &v : x) v = draw(rng);
        for (float &v : w) v = draw(rng);
        if (!fewRowsTimesTransposed(m, n, k, x.data(), w.data(), y.data()))
          GTEST_SKIP() << "this CPU has no AVX2/FMA: sgemm does these";
        for (int64_t r = 0; r < m; ++r)
          for (int64_t c = 0; c < n; ++c) {
            double want = 0, size = 0;
            for (int64_t j = 0; j < k; ++j) {
              want += double(x[r * k + j]) * w[c * k + j];
              size += std::fabs(double(x[r * k + j]) * w[c * k + j]);
            }
            ASSERT_NEAR(y[r * n + c], want, 1e-6 * size + 1e-7) << m << "x" << n << "x" << k << " at " << r << ", " << c;
            ++checked;
          }
      }
  EXPECT_GT(checked, 0);
}

TEST(FewRowsGemmTest, LeavesOtherShapesAndThreadedRunsToSgemm) {
  openblas_set_num_threads(1);
  std::vector<float> x(17 * 8, 1), w(8, 1), y(17, -1);
  EXPECT_FALSE(fewRowsTimesTransposed(1, 1, 8, x.data(), w.data(), y.data()));  // one row: sgemv's
  EXPECT_FALSE(fewRowsTimesTransposed(17, 1, 8, x.data(), w.data(), y.data())); // past kFewRows
  openblas_set_num_threads(2);
  EXPECT_FALSE(fewRowsTimesTransposed(4, 1, 8, x.data(), w.data(), y.data())); // sgemm splits it
  EXPECT_EQ(y[0], -1); // nothing written
  openblas_set_num_threads(1);
}
