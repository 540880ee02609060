// The generation loop's sampler (Generation.h): what it draws at the edges.

#include "parax/runtime/Generation.h"

#include <gtest/gtest.h>

#include <cmath>
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

TEST(Generation, TopPKeepsTheFewestHoldingThatShareMostLikelyFirst) {
  // Probabilities 0.5, 0.3, 0.15, 0.05 (ids 2, 0, 3, 1). top-p 0.79 keeps
  // ids 2 and 0 (0.5 + 0.3 reach it), drawn 5 : 3; 0.81 keeps id 3 too;
  // a top-p below the first keeps the most likely alone.
  std::vector<float> logits = {std::log(0.3f), std::log(0.05f), std::log(0.5f), std::log(0.15f)};
  auto counts = [&](Sampling sampling) {
    std::vector<int> seen(4, 0);
    for (int64_t position = 0; position < 20000; ++position)
      ++seen[sampleToken(logits.data(), 4, sampling, 1, position)];
    return seen;
  };
  std::vector<int> nucleus = counts(Sampling{1.0, 0, 5, 0.79});
  EXPECT_EQ(nucleus[1] + nucleus[3], 0);
  EXPECT_NEAR(nucleus[2] / 20000.0, 0.5 / 0.8, 0.02);
  std::vector<int> wider = counts(Sampling{1.0, 0, 5, 0.81});
  EXPECT_EQ(wider[1], 0);
  EXPECT_GT(wider[3], 0);
  std::vector<int> first = counts(Sampling{1.0, 0, 5, 0.1});
  EXPECT_EQ(first[2], 20000);
  // After top-k: 2 of the 3 kept by top-k 3 (0.5 + 0.3 of 0.95 hold 0.84).
  std::vector<int> both = counts(Sampling{1.0, 3, 5, 0.84});
  EXPECT_EQ(both[1] + both[3], 0);
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
