// Temporaries sharing one arena: buffers live at the same time never
// overlap, and the arena is no smaller than what is live at once.

#include "parax/runtime/BufferPlan.h"

#include <gtest/gtest.h>

#include <random>

using parax::runtime::BufferLifetime;
using parax::runtime::BufferPlan;
using parax::runtime::planBuffers;

namespace {

// Every pair of buffers live at the same time lies in disjoint bytes.
void expectNoOverlap(const std::vector<BufferLifetime> &buffers, const BufferPlan &plan) {
  for (size_t a = 0; a < buffers.size(); ++a) {
    EXPECT_EQ(plan.offsets[a] % 256, 0u) << "buffer " << a;
    EXPECT_LE(plan.offsets[a] + buffers[a].bytes, plan.arenaBytes) << "buffer " << a;
    for (size_t b = a + 1; b < buffers.size(); ++b) {
      bool together = !(buffers[a].last < buffers[b].first || buffers[b].last < buffers[a].first);
      bool apart = plan.offsets[a] + buffers[a].bytes <= plan.offsets[b] ||
                   plan.offsets[b] + buffers[b].bytes <= plan.offsets[a];
      EXPECT_TRUE(!together || apart) << "buffers " << a << " and " << b;
    }
  }
}

} // namespace

TEST(BufferPlan, AChainNeedsTwoBuffers) {
  // x0 -> x1 -> x2 -> ...: each instruction reads one and writes the next.
  std::vector<BufferLifetime> chain;
  for (int k = 0; k < 10; ++k) chain.push_back({1000, k, k + 1});
  BufferPlan plan = planBuffers(chain, 256);
  expectNoOverlap(chain, plan);
  EXPECT_EQ(plan.arenaBytes, 2u * 1024);
  EXPECT_EQ(plan.peakLiveBytes, 2u * 1024);
  EXPECT_EQ(plan.unsharedBytes, 10u * 1024);
  EXPECT_EQ(plan.peakInstruction, 1); // (x0 and x1 live from there on)
}

TEST(BufferPlan, SaysWhereThePeakIs) {
  // 1 KiB live throughout; 3 KiB more during instructions 4 to 6 only.
  std::vector<BufferLifetime> all = {{1024, 0, 9}, {1024, 2, 3}, {3072, 4, 6}, {1024, 7, 9}};
  BufferPlan plan = planBuffers(all, 256);
  EXPECT_EQ(plan.peakLiveBytes, 4u * 1024);
  EXPECT_EQ(plan.peakInstruction, 4);
}

TEST(BufferPlan, BuffersLiveTogetherNeverShare) {
  std::vector<BufferLifetime> all = {{100, 0, 5}, {200, 0, 5}, {300, 0, 5}};
  BufferPlan plan = planBuffers(all, 256);
  expectNoOverlap(all, plan);
  EXPECT_EQ(plan.arenaBytes, 3u * 256 + 256); // 300 rounds up to 512
}

TEST(BufferPlan, ASmallBufferFillsAGap) {
  // A large buffer early and one late share; a small one live throughout
  // goes after the larger ones, not between them.
  std::vector<BufferLifetime> buffers = {{4096, 0, 1}, {4096, 2, 3}, {256, 0, 3}};
  BufferPlan plan = planBuffers(buffers, 256);
  expectNoOverlap(buffers, plan);
  EXPECT_EQ(plan.offsets[0], plan.offsets[1]);
  EXPECT_EQ(plan.arenaBytes, 4096u + 256);
}

TEST(BufferPlan, RandomProgramsAreSafeAndAboveTheirLowerBound) {
  std::mt19937 random(7);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<BufferLifetime> buffers;
    int instructions = 40;
    for (int b = 0; b < 60; ++b) {
      int first = random() % instructions;
      int last = first + random() % 8;
      buffers.push_back({static_cast<size_t>(1 + random() % 100000), first, last});
    }
    BufferPlan plan = planBuffers(buffers, 256);
    expectNoOverlap(buffers, plan);
    EXPECT_GE(plan.arenaBytes, plan.peakLiveBytes);
    EXPECT_LE(plan.arenaBytes, plan.unsharedBytes);
  }
}
