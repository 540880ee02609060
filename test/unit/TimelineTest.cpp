//===- TimelineTest.cpp - the simulated pipeline against known makespans --===//
//
// simulatePipeline runs each stage's passes in parax-run's order. With
// equal stages and free transfers its makespan is the textbook one
// (Narayanan et al. 2021 §2.2): (m + p - 1) (F + B) for GPipe and 1F1B,
// (m + (p - 1) / v) (F + B) for interleaved 1F1B with v chunks a stage
// (F and B a whole stage's passes). A stage lighter than the others
// shortens the fill and drain; a transfer delays each crossing.

#include "parax/Plan/Timeline.h"

#include <gtest/gtest.h>

using namespace parax::plan;

namespace {

Plan pipeline(int64_t pp, int64_t v, int64_t m, Schedule schedule, double forward, double backward) {
  Plan plan = Plan::withDegrees(pp, 1, 1, 1, false);
  plan.virtualStages = v;
  plan.microBatches = m;
  plan.schedule = schedule;
  // A stage's F and B split evenly over its chunks.
  plan.stageForward.assign(pp * v, forward / v);
  plan.stageBackward.assign(pp * v, backward / v);
  return plan;
}

double makespan(const Plan &plan) {
  llvm::Expected<PipelineTimeline> timeline = simulatePipeline(plan);
  EXPECT_TRUE(bool(timeline)) << (timeline ? "" : llvm::toString(timeline.takeError()));
  return timeline ? timeline->makespan : -1;
}

TEST(TimelineTest, EqualStagesTakeTheTextbookMakespan) {
  for (int64_t pp : {1, 2, 4, 8})
    for (int64_t m : {1, 3, 8, 16}) {
      for (Schedule s : {Schedule::OneFOneB, Schedule::GPipe})
        EXPECT_DOUBLE_EQ(makespan(pipeline(pp, 1, m, s, 1.0, 2.0)), (m + pp - 1) * 3.0)
            << "pp " << pp << " m " << m << " " << toString(s).str();
      for (int64_t v : {2, 4}) {
        if (m % pp || pp == 1)
          continue;
        EXPECT_NEAR(makespan(pipeline(pp, v, m, Schedule::Interleaved, 1.0, 2.0)),
                    (m + (pp - 1.0) / v) * 3.0, 1e-9)
            << "pp " << pp << " v " << v << " m " << m;
      }
    }
}

TEST(TimelineTest, EveryPassOnceOnItsStageInTurn) {
  Plan plan = pipeline(4, 2, 8, Schedule::Interleaved, 1.0, 2.0);
  llvm::Expected<PipelineTimeline> timeline = simulatePipeline(plan);
  ASSERT_TRUE(bool(timeline));
  // 8 microbatches x 2 chunks x (forward, backward) on each of 4 stages,
  // the last stage's last chunk running its forward and backward as one.
  EXPECT_EQ(timeline->events.size(), size_t(4 * 8 * 2 * 2 - 8));
  std::vector<double> free(4, 0);
  for (const PipelineEvent &e : timeline->events) {
    EXPECT_GE(e.start, free[e.stage] - 1e-12); // one pass at a time a stage
    free[e.stage] = e.end;
  }
}

TEST(TimelineTest, ALighterStageShortensTheFillAndDrain) {
  // The last stage at half the others' cost: the formula's (m + p - 1)
  // slots of the slowest stage overstate the step by the drain it skips.
  Plan plan = pipeline(4, 1, 8, Schedule::OneFOneB, 1.0, 2.0);
  plan.stageForward[3] = 0.5;
  plan.stageBackward[3] = 1.0;
  double simulated = makespan(plan);
  EXPECT_LT(simulated, (8 + 3) * 3.0);
  EXPECT_GE(simulated, 8 * 3.0 + 3 * 1.5); // the slowest stage's own work, and a lighter stage's fill
}

TEST(TimelineTest, TransfersDelayEachCrossing) {
  // 1F1B, free passes but transfers of h: the first forward crosses p - 1
  // boundaries and its backward crosses them back.
  Plan plan = pipeline(4, 1, 1, Schedule::OneFOneB, 1.0, 2.0);
  plan.transferTime = 0.25;
  EXPECT_DOUBLE_EQ(makespan(plan), 4 * 3.0 + 2 * 3 * 0.25);
}

TEST(TimelineTest, APlanWithoutPassTimesIsRefused) {
  Plan plan = Plan::withDegrees(2, 1, 1, 1, false);
  llvm::Expected<PipelineTimeline> timeline = simulatePipeline(plan);
  ASSERT_FALSE(bool(timeline));
  EXPECT_NE(llvm::toString(timeline.takeError()).find("no pass times"), std::string::npos);
}

} // namespace

TEST(TimelineTest, InferenceRunsTheMicrobatchesThroughTheStages) {
  // Three stages of 1 s, four microbatches, 0.1 s a crossing: the last
  // microbatch leaves the first stage at 4 s and crosses twice, 2.2 s:
  // (m + p - 1) t + (p - 1) hop = 6.2 s. A stage is never busy twice at
  // once and a microbatch starts a stage only after it crossed.
  Plan plan = Plan::withDegrees(3, 1, 1, 1, false);
  plan.microBatches = 4;
  plan.stageForward = {1.0, 1.0, 1.0};
  plan.transferTime = 0.1;
  llvm::Expected<PipelineTimeline> timeline = simulateInference(plan);
  ASSERT_TRUE(bool(timeline)) << llvm::toString(timeline.takeError());
  EXPECT_NEAR(timeline->makespan, 6.2, 1e-12);
  EXPECT_EQ(timeline->events.size(), size_t(12));
  std::vector<double> free(3, 0), left(4, -1);
  for (const PipelineEvent &e : timeline->events) {
    EXPECT_TRUE(e.forward && !e.backward);
    EXPECT_GE(e.start, free[e.stage] - 1e-12);
    if (e.stage > 0) {
      EXPECT_GE(e.start, left[e.micro] + 0.1 - 1e-12);
    }
    free[e.stage] = left[e.micro] = e.end;
  }
  // A slower middle stage paces the rest: 1 + 4 x 2 + 1 + 2 x 0.1.
  plan.stageForward = {1.0, 2.0, 1.0};
  llvm::Expected<PipelineTimeline> paced = simulateInference(plan);
  ASSERT_TRUE(bool(paced));
  EXPECT_NEAR(paced->makespan, 10.2, 1e-12);
  // A training plan's times are not an inference step's.
  plan.stageBackward = {2.0, 2.0, 2.0};
  llvm::Expected<PipelineTimeline> training = simulateInference(plan);
  ASSERT_FALSE(bool(training));
  EXPECT_NE(llvm::toString(training.takeError()).find("no per-stage inference times"), std::string::npos);
}

TEST(TimelineTest, ThePlannersStepFormulaFollowsUnequalStages) {
  // pipelineTime (the planner's): the slowest stage's m microbatches, and
  // one microbatch through every other stage. Against the simulation, 1F1B
  // and GPipe: a lighter last stage, a heavier last (a head), a heavier
  // first (an embedding), a lighter middle one.
  struct Case {
    std::vector<double> forward, backward;
  };
  for (const Case &c : {Case{{1, 1, 1, 0.5}, {2, 2, 2, 1}}, Case{{1, 1, 1, 1.6}, {2, 2, 2, 2.9}},
                        Case{{1.4, 1, 1, 1}, {2.5, 2, 2, 2}}, Case{{1, 0.6, 1, 1}, {2, 1.3, 2, 2}}})
    for (int64_t m : {1, 4, 8})
      for (Schedule s : {Schedule::OneFOneB, Schedule::GPipe}) {
        Plan plan = pipeline(4, 1, m, s, 1, 2);
        plan.stageForward = c.forward;
        plan.stageBackward = c.backward;
        double slowest = 0, every = 0;
        for (size_t i = 0; i < 4; ++i) {
          slowest = std::max(slowest, c.forward[i] + c.backward[i]);
          every += c.forward[i] + c.backward[i];
        }
        double simulated = makespan(plan), formula = pipelineTime(double(m), 1, slowest, every);
        // Never below the simulated step (the later stages' share of the
        // first and last microbatch is charged whole, though the warm-up's
        // forwards fill part of it), within 13 % of it, and nearer it than
        // the equal-stage formula, (m + pp - 1) slots of the slowest,
        // which overstates these cases more.
        double equal = (m + 3) * slowest;
        SCOPED_TRACE(testing::Message() << "m " << m << " " << toString(s).str() << " stage times "
                                        << c.forward[0] + c.backward[0] << ", " << c.forward[1] + c.backward[1]
                                        << ", ..., " << c.forward[3] + c.backward[3]);
        EXPECT_GE(formula, simulated - 1e-9);
        EXPECT_LE(formula, 1.13 * simulated);
        EXPECT_LT(formula - simulated, equal - simulated);
      }
}
