//===- Timeline.h - a planned training step's pipeline, simulated --------===//
//
// The planner costs a pipeline by formula: (m + p - 1) slots of the slowest
// stage (interleaved: m + (p - 1) / v), every transfer exposed. This runs
// the schedule itself instead: each stage takes its passes in the order
// parax-run runs them (runtime::pipelineSteps), each pass as long as the
// plan costs its virtual stage's layers, a forward pass starting when the
// previous virtual stage's has ended and its activations crossed, a
// backward pass when the next one's has. The events give a timeline
// (Chrome's trace format, for chrome://tracing or ui.perfetto.dev) and a
// makespan to hold the formula against: equal stages give the formula's
// bubble; a stage lighter than the slowest shortens the fill and drain,
// which the formula charges at the slowest stage's pace.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_PLAN_TIMELINE_H
#define PARAX_PLAN_TIMELINE_H

#include "parax/Plan/Planner.h"

#include "llvm/Support/Error.h"
#include "llvm/Support/raw_ostream.h"

#include <vector>

namespace parax::plan {

struct PipelineEvent {
  int64_t stage = 0, chunk = 0, micro = 0;
  bool forward = false, backward = false; // (both: the last virtual stage's one pass)
  double start = 0, end = 0;              // seconds from the step's start
};

struct PipelineTimeline {
  std::vector<PipelineEvent> events; // in the order they were scheduled
  double makespan = 0;               // the last pass's end
};

/// The training step of `plan` (stageForward, stageBackward and
/// transferTime set: a training plan from searchPlans) with its stages in
/// the runtime's order. An error for a plan without those times, or a
/// schedule the runtime refuses.
llvm::Expected<PipelineTimeline> simulatePipeline(const Plan &plan);

/// An inference step of `plan` (prefill or decode; stageForward, one
/// microbatch's time on each stage, and transferTime set): the
/// microbatches through the stages in order, each stage taking the next
/// as soon as it is free and the microbatch has crossed from the stage
/// before. Decode steps repeat this for each position.
llvm::Expected<PipelineTimeline> simulateInference(const Plan &plan);

/// `timeline` as Chrome trace events: a process per pipeline stage, a
/// complete event per pass ("F3" / "B3" / "FB3": microbatch 3; "c1": model
/// chunk 1 when interleaved), then what follows the pipeline (the tied
/// weight's exchange, the exposed gradient sync and the optimizer).
void writeChromeTrace(const Plan &plan, const PipelineTimeline &timeline,
                      llvm::raw_ostream &os);

} // namespace parax::plan

#endif // PARAX_PLAN_TIMELINE_H
