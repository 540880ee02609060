// The CPU executor's vector exp loops (runtime/src/VectorMath.h) against
// double-precision formulas, at every length remainder of their eight lanes
// and at arguments where exp overflows or underflows.

#include "VectorMath.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <vector>

using namespace parax::runtime;

TEST(VectorMathTest, SiluTimesIsTheFormulaAtEveryLengthAndExtreme) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> draw(-12, 12);
  for (int64_t n = 0; n <= 41; ++n) {
    std::vector<float> g(n), u(n), y(n, NAN), alone(n, NAN);
    for (int64_t k = 0; k < n; ++k) g[k] = draw(rng), u[k] = draw(rng);
    if (n > 3) g[0] = -200, g[1] = 200, g[2] = 0; // (exp overflows to inf, underflows to 0)
    siluTimes(g.data(), u.data(), y.data(), n);
    siluTimes(g.data(), nullptr, alone.data(), n);
    for (int64_t k = 0; k < n; ++k) {
      double s = g[k] / (1.0 + std::exp(-static_cast<double>(g[k])));
      EXPECT_NEAR(alone[k], s, 4e-7 * std::max(1.0, std::fabs(s))) << "n " << n << " k " << k;
      EXPECT_NEAR(y[k], s * u[k], 4e-7 * std::max(1.0, std::fabs(s * u[k]))) << "n " << n << " k " << k;
    }
  }
}

TEST(VectorMathTest, SwigluGradientIsTheFormulaAtEveryLengthAndExtreme) {
  std::mt19937 rng(4);
  std::uniform_real_distribution<float> draw(-12, 12);
  for (int64_t n = 0; n <= 41; ++n) {
    std::vector<float> g(n), u(n), dy(n), dGate(n, NAN), dUp(n, NAN);
    for (int64_t k = 0; k < n; ++k) g[k] = draw(rng), u[k] = draw(rng), dy[k] = draw(rng);
    if (n > 3) g[0] = -200, g[1] = 200, g[2] = 0; // (exp overflows to inf, underflows to 0)
    swigluGradient(g.data(), u.data(), dy.data(), 0, dGate.data(), n);
    swigluGradient(g.data(), u.data(), dy.data(), 1, dUp.data(), n);
    for (int64_t k = 0; k < n; ++k) {
      double x = g[k], s = 1 / (1 + std::exp(-x));
      double gate = dy[k] * u[k] * (s + x * s * (1 - s)), up = dy[k] * x * s;
      EXPECT_NEAR(dGate[k], gate, 1e-6 * std::max(1.0, std::fabs(dy[k] * u[k] * (1 + std::fabs(x)))))
          << "n " << n << " k " << k;
      EXPECT_NEAR(dUp[k], up, 1e-6 * std::max(1.0, std::fabs(dy[k] * x))) << "n " << n << " k " << k;
    }
  }
}

TEST(VectorMathTest, SoftmaxIsNormalisedExpOfTheShiftedRow) {
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> draw(-30, 30);
  for (int64_t n = 1; n <= 41; ++n) {
    std::vector<float> x(n);
    for (float &v : x) v = draw(rng);
    if (n > 2) x[n - 1] = -1000; // (a score far below: exp underflows to 0)
    std::vector<double> want(n);
    double top = *std::max_element(x.begin(), x.end()), sum = 0;
    for (int64_t t = 0; t < n; ++t) sum += want[t] = std::exp(x[t] - top);
    softmax(x.data(), n);
    double total = 0;
    for (int64_t t = 0; t < n; ++t) {
      EXPECT_NEAR(x[t], want[t] / sum, 1e-6 * std::max(1e-3, want[t] / sum)) << "n " << n << " t " << t;
      total += x[t];
    }
    EXPECT_NEAR(total, 1.0, 1e-6) << "n " << n;
  }
}
