// The generation loop's sampler (Generation.h): what it draws at the edges.

#include "parax/runtime/Generation.h"

#include <gtest/gtest.h>

#include <vector>

using namespace parax::runtime;

namespace {

TEST(Generation, GreedyTakesTheFirstOfEqualMaxima) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(sampleToken(logits.data(), 4, Sampling{}, 0, 0), 1);
}

TEST(Generation, TopOneIsGreedyWhateverTheTemperature) {
  std::vector<float> logits = {0.5f, 2.0f, -1.0f, 3.0f};
  for (int64_t position = 0; position < 50; ++position)
    EXPECT_EQ(sampleToken(logits.data(), 4, Sampling{5.0, 1, 7}, 3, position), 3);
}

TEST(Generation, DrawsStayInsideTheTopKAndFollowTheSoftmax) {
  // logits ln 1, ln 3 and two far below: over the top 2, token 1 three times
  // as often as token 0; never 2 or 3.
  std::vector<float> logits = {0.0f, 1.0986123f, -30.0f, -31.0f};
  int counts[4] = {0, 0, 0, 0};
  for (int64_t position = 0; position < 20000; ++position)
    ++counts[sampleToken(logits.data(), 4, Sampling{1.0, 2, 11}, 0, position)];
  EXPECT_EQ(counts[2] + counts[3], 0);
  EXPECT_NEAR(counts[1] / 20000.0, 0.75, 0.02);
}

TEST(Generation, TheUniformIsReproducibleAndDependsOnEachCoordinate) {
  double u = sampleUniform(42, 3, 17);
  EXPECT_GE(u, 0.0);
  EXPECT_LT(u, 1.0);
  EXPECT_EQ(u, sampleUniform(42, 3, 17));
  EXPECT_NE(u, sampleUniform(43, 3, 17));
  EXPECT_NE(u, sampleUniform(42, 4, 17));
  EXPECT_NE(u, sampleUniform(42, 3, 18));
}

} // namespace
