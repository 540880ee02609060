//===- PipelineScheduleTest.cpp - pipeline schedules never deadlock -------===//
//
// runtime::pipelineSteps on every stage of a pipeline, with the CUDA
// backend's communication: a step's leading receives in one group with the
// sends the step before held (CudaExecutor::exchange), a group completing
// once each of its transfers' peers has posted the matching one, sends
// waiting for their receives (as NCCL's may). Every schedule must run to
// its end, pair each channel's sends with its receives in order, and run
// each microbatch's ranges once each, in program order.

#include "parax/runtime/Executable.h"
#include "parax/runtime/PipelineSchedule.h"

#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

using namespace parax::runtime;
using namespace parax;

namespace {

// A transfer: (sending?, peer, what: {virtual stage sending, gradient?, microbatch}).
using What = std::tuple<int, bool, int64_t>;
struct Transfer {
  bool send;
  int peer;
  What what;
};

struct Simulated {
  bool completes = true, inOrder = true, eachRangeOnce = true;
};

// With `tied` (one chunk): a weight on the first and the last stage, as
// the partitioner orders its transfers: the last stage sends its gradient
// of it after its activation gradient, the first receives it with the one
// that begins its backward half and sends the sum back at the end, which
// the last stage receives in its tail (a range of its own).
Simulated simulate(int stages, int chunks, int64_t micro, const std::string &kind, bool tied = false) {
  const int last = stages * chunks - 1;
  std::vector<std::vector<std::vector<Transfer>>> groups(stages);
  Simulated result;
  const What part = {stages + 1, true, 0}, sum = {stages + 2, false, 0};
  auto of = [](What what, int64_t m) { return What{std::get<0>(what), std::get<1>(what), m}; };
  for (int s = 0; s < stages; ++s) {
    std::vector<PipelineRange> ranges = trainingRanges(s, stages, chunks);
    if (tied && s == last) ranges = {{0, 1, 0, true, true}, {1, 2, 0, false, true}};
    StatusOr<PipelineSteps> steps = pipelineSteps(ranges, kind, s, stages, micro);
    EXPECT_TRUE(steps.isOk()) << steps.status().message();
    if (!steps.isOk()) return {false, false, false};
    std::map<int64_t, int> next; // per microbatch, the range it runs next
    std::vector<Transfer> held;
    for (const auto &step : steps.value()) {
      std::vector<Transfer> group = held, sends;
      held.clear();
      for (const PipelineItem &item : step) {
        const PipelineRange &r = ranges[item.range];
        if (next[item.micro]++ != item.range) result.eachRangeOnce = false;
        int vs = r.chunk * stages + s;
        if (tied && vs == last && item.range == 1) { // the tail
          group.push_back({false, 0, of(sum, item.micro)});
          continue;
        }
        if (r.forward && vs > 0) group.push_back({false, (vs - 1) % stages, {vs - 1, false, item.micro}});
        if (!r.forward && vs < last) group.push_back({false, (vs + 1) % stages, {vs + 1, true, item.micro}});
        if (r.forward && !r.backward && vs < last) sends.push_back({true, (vs + 1) % stages, {vs, false, item.micro}});
        if (r.backward && vs > 0) sends.push_back({true, (vs - 1) % stages, {vs, true, item.micro}});
        if (tied && vs == last) sends.push_back({true, 0, of(part, item.micro)});
        if (tied && vs == 0 && r.backward) {
          group.push_back({false, last, of(part, item.micro)});
          sends.push_back({true, last, of(sum, item.micro)});
        }
      }
      if (!group.empty()) groups[s].push_back(group);
      held = sends;
    }
    if (!held.empty()) groups[s].push_back(held);
    for (const auto &[m, n] : next)
      if (n != static_cast<int>(ranges.size())) result.eachRangeOnce = false;
    if (static_cast<int64_t>(next.size()) != micro) result.eachRangeOnce = false;
  }
  // Each channel's sends and receives pair up in order.
  for (int a = 0; a < stages; ++a)
    for (int b = 0; b < stages; ++b) {
      std::vector<What> sent, received;
      for (const auto &g : groups[a])
        for (const Transfer &t : g)
          if (t.send && t.peer == b) sent.push_back(t.what);
      for (const auto &g : groups[b])
        for (const Transfer &t : g)
          if (!t.send && t.peer == a) received.push_back(t.what);
      if (sent != received) result.inOrder = false;
    }
  // Groups complete once every transfer's match is posted (issued in a
  // group at or before the peer's current one).
  std::vector<size_t> at(stages, 0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int s = 0; s < stages; ++s) {
      if (at[s] == groups[s].size()) continue;
      bool ready = true;
      for (const Transfer &t : groups[s][at[s]]) {
        bool posted = false;
        for (size_t g = 0; g <= at[t.peer] && g < groups[t.peer].size() && !posted; ++g)
          for (const Transfer &u : groups[t.peer][g])
            posted = posted || (u.send != t.send && u.peer == s && u.what == t.what);
        ready = ready && posted;
      }
      if (ready) {
        ++at[s];
        progress = true;
      }
    }
  }
  for (int s = 0; s < stages; ++s) result.completes = result.completes && at[s] == groups[s].size();
  return result;
}

TEST(PipelineSchedule, InterleavedNeverDeadlocksAndPairsInOrder) {
  for (int stages = 2; stages <= 6; ++stages)
    for (int chunks = 2; chunks <= 4; ++chunks)
      for (int64_t micro = stages; micro <= 4 * stages; micro += stages) {
        Simulated r = simulate(stages, chunks, micro, "interleaved");
        EXPECT_TRUE(r.completes && r.inOrder && r.eachRangeOnce)
            << stages << " stages, " << chunks << " chunks, " << micro << " microbatches: completes "
            << r.completes << ", in order " << r.inOrder << ", each range once " << r.eachRangeOnce;
      }
}

TEST(PipelineSchedule, OneFOneBNeverDeadlocksAndPairsInOrder) {
  for (int stages = 2; stages <= 6; ++stages)
    for (int64_t micro = 1; micro <= 9; ++micro) {
      Simulated r = simulate(stages, 1, micro, "1f1b");
      EXPECT_TRUE(r.completes && r.inOrder && r.eachRangeOnce) << stages << " stages, " << micro << " microbatches";
    }
}

TEST(PipelineSchedule, ATiedWeightsSumReachesTheLastStagesTail) {
  // The last stage's tail runs after its next microbatch's range: the
  // first stage sends the sum after its next forward half.
  for (int stages = 2; stages <= 6; ++stages)
    for (int64_t micro = 1; micro <= 9; ++micro) {
      Simulated r = simulate(stages, 1, micro, "1f1b", /*tied=*/true);
      EXPECT_TRUE(r.completes && r.inOrder && r.eachRangeOnce)
          << stages << " stages, " << micro << " microbatches: completes " << r.completes << ", in order "
          << r.inOrder << ", each range once " << r.eachRangeOnce;
    }
}

TEST(PipelineSchedule, GPipeDeadlocksUnderRendezvousSends) {
  // Why the CUDA backend runs a plan's GPipe as 1F1B: the last stage sends
  // microbatch 0's gradient while stage 0 still sends activations (with
  // enough microbatches; bench/pipeline_p2p_model.py: 30 of 45 shapes).
  EXPECT_TRUE(simulate(2, 1, 2, "gpipe").completes);
  EXPECT_FALSE(simulate(2, 1, 4, "gpipe").completes);
}

TEST(PipelineSchedule, InterleavedNeedsMicrobatchesInGroupsOfTheStages) {
  StatusOr<PipelineSteps> steps = pipelineSteps(trainingRanges(0, 2, 2), "interleaved", 0, 2, 3);
  ASSERT_FALSE(steps.isOk());
  EXPECT_NE(steps.status().message().find("needs the microbatches (3) to be a multiple of the stages"),
            std::string::npos);
}

TEST(PipelineSchedule, InterleavedHoldsMoreMicrobatchesThanOneFOneB) {
  // Stage 0 of 4, 8 microbatches: 1F1B holds 4; interleaved with two
  // chunks, its warm-up of 2 x 3 + 4 chunk passes reaches microbatch 5,
  // and the steady state's forward passes run ahead of the backward ones
  // by that much (every microbatch of the two groups at once).
  auto held = [](int chunks, const std::string &kind) {
    std::vector<PipelineRange> ranges = trainingRanges(0, 4, chunks);
    return microbatchesInFlight(pipelineSteps(ranges, kind, 0, 4, 8).value(), ranges);
  };
  EXPECT_EQ(held(1, "1f1b"), 4);
  EXPECT_EQ(held(2, "interleaved"), 8);
}

TEST(PipelineSchedule, EachChunkHoldsItsOwnMicrobatches) {
  // Stage 0 of 4, two chunks, 8 microbatches: chunk 0's forward passes run
  // ahead of its backward ones by every microbatch of two groups, chunk
  // 1's by one group -- 6 microbatches' worth of a stage's activations
  // (Megatron-LM's count of chunk passes at once: 5.5), not 8.
  std::vector<PipelineRange> ranges = trainingRanges(0, 4, 2);
  PipelineSteps steps = pipelineSteps(ranges, "interleaved", 0, 4, 8).value();
  EXPECT_EQ(chunksInFlight(steps, ranges), (std::vector<int64_t>{8, 4}));
  EXPECT_DOUBLE_EQ(activationsInFlight("interleaved", 0, 4, 2, 8), 6.0);
  // The last stage holds its last chunk one microbatch at a time.
  ranges = trainingRanges(3, 4, 2);
  EXPECT_EQ(chunksInFlight(pipelineSteps(ranges, "interleaved", 3, 4, 8).value(), ranges),
            (std::vector<int64_t>{5, 1}));
  // 1F1B: as many as stages from here on; GPipe: all.
  EXPECT_DOUBLE_EQ(activationsInFlight("1f1b", 1, 4, 1, 8), 3.0);
  EXPECT_DOUBLE_EQ(activationsInFlight("1f1b", 1, 4, 1, 8, InFlightMemory::Peak), 3.0);
  EXPECT_DOUBLE_EQ(activationsInFlight("gpipe", 1, 4, 1, 8), 8.0);
}

TEST(PipelineSchedule, ACachingAllocatorHoldsTheMostChunkPassesAtOnce) {
  // Korthikanti et al. 2022 (arXiv 2205.05198, section 4.2.3): the first
  // stage of an interleaved schedule holds p (1 + (p - 1) / (p v))
  // microbatches' worth of its layers; Megatron-LM's warm-up of
  // 2 (p - 1) + (v - 1) p chunk passes plus the steady state's one more,
  // over v. p = 4, v = 2: 11 passes, 5.5 (the slots: 6); p = 16, v = 4:
  // 79 passes, 19.75.
  auto korthikanti = [](double p, double v) { return p * (1 + (p - 1) / (p * v)); };
  EXPECT_DOUBLE_EQ(activationsInFlight("interleaved", 0, 4, 2, 8, InFlightMemory::Peak), korthikanti(4, 2));
  EXPECT_DOUBLE_EQ(activationsInFlight("interleaved", 0, 16, 4, 32, InFlightMemory::Peak), korthikanti(16, 4));
  EXPECT_DOUBLE_EQ(activationsInFlight("interleaved", 0, 16, 4, 64, InFlightMemory::Peak), korthikanti(16, 4));
  // A later stage warms up by 2 passes fewer a stage after the first.
  EXPECT_DOUBLE_EQ(activationsInFlight("interleaved", 3, 4, 2, 8, InFlightMemory::Peak), (2 * 0 + 4 + 1) / 2.0);
  EXPECT_LT(activationsInFlight("interleaved", 0, 16, 4, 32, InFlightMemory::Peak),
            activationsInFlight("interleaved", 0, 16, 4, 32));
}

TEST(PipelineSchedule, InterleavedCountsStopGrowingAtTwoGroups) {
  // What lets the planner cost a long schedule at 2 x stages microbatches.
  for (int stages = 2; stages <= 8; ++stages)
    for (int chunks : {2, 3, 4, 8})
      for (int stage = 0; stage < stages; ++stage) {
        std::vector<PipelineRange> ranges = trainingRanges(stage, stages, chunks);
        auto counts = [&](int64_t micro) {
          return chunksInFlight(pipelineSteps(ranges, "interleaved", stage, stages, micro).value(), ranges);
        };
        EXPECT_EQ(counts(2 * stages), counts(7 * stages)) << stages << " stages, " << chunks << " chunks, stage " << stage;
      }
}

} // namespace
