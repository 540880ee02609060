//===- Timeline.cpp - a planned training step's pipeline, simulated ------===//

#include "parax/Plan/Timeline.h"

#include "parax/runtime/PipelineSchedule.h"

#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/JSON.h"

#include <algorithm>

using namespace parax::plan;

llvm::Expected<PipelineTimeline> parax::plan::simulatePipeline(const Plan &plan) {
  const int64_t pp = plan.pp, v = plan.virtualStages, m = plan.microBatches;
  const int64_t stages = pp * v;
  if (static_cast<int64_t>(plan.stageForward.size()) != stages ||
      static_cast<int64_t>(plan.stageBackward.size()) != stages)
    return llvm::createStringError("the plan has no pass times of its %lld virtual stages (a training "
                                   "plan from the search has them)",
                                   static_cast<long long>(stages));
  // Each stage's passes in the runtime's order, as (microbatch, range).
  std::vector<std::vector<parax::runtime::PipelineRange>> ranges(pp);
  std::vector<std::vector<parax::runtime::PipelineItem>> order(pp);
  for (int64_t s = 0; s < pp; ++s) {
    ranges[s] = parax::runtime::trainingRanges(static_cast<int>(s), static_cast<int>(pp), static_cast<int>(v));
    auto steps = parax::runtime::pipelineSteps(ranges[s], std::string(toString(plan.schedule)), static_cast<int>(s),
                                               static_cast<int>(pp), m);
    if (!steps.isOk())
      return llvm::createStringError(llvm::formatv("stage {0}: {1}", s, steps.status().message()).str());
    for (const auto &step : steps.value())
      order[s].insert(order[s].end(), step.begin(), step.end());
  }
  // When each virtual stage's forward and backward pass of a microbatch
  // ended (negative: not yet).
  std::vector<std::vector<double>> forwardEnd(stages, std::vector<double>(m, -1)),
      backwardEnd(stages, std::vector<double>(m, -1));
  std::vector<size_t> next(pp, 0);
  std::vector<double> free(pp, 0);
  PipelineTimeline timeline;
  const double hop = plan.transferTime;
  size_t total = 0, done = 0;
  for (const auto &passes : order)
    total += passes.size();
  while (done < total) {
    bool progressed = false;
    for (int64_t s = 0; s < pp; ++s) {
      while (next[s] < order[s].size()) {
        const parax::runtime::PipelineItem &item = order[s][next[s]];
        const parax::runtime::PipelineRange &range = ranges[s][item.range];
        int64_t c = range.chunk * pp + s; // the virtual stage
        double ready = free[s];
        if (range.forward && c > 0) {
          double before = forwardEnd[c - 1][item.micro];
          if (before < 0)
            break;
          ready = std::max(ready, before + hop);
        }
        if (range.backward && !range.forward && c + 1 < stages) {
          double after = backwardEnd[c + 1][item.micro];
          if (after < 0)
            break;
          ready = std::max(ready, after + hop);
        }
        PipelineEvent event{s, range.chunk, item.micro, range.forward, range.backward, ready, ready};
        if (range.forward) {
          event.end += plan.stageForward[c];
          forwardEnd[c][item.micro] = event.end;
        }
        if (range.backward) {
          event.end += plan.stageBackward[c];
          backwardEnd[c][item.micro] = event.end;
        }
        free[s] = event.end;
        timeline.makespan = std::max(timeline.makespan, event.end);
        timeline.events.push_back(event);
        ++next[s];
        ++done;
        progressed = true;
      }
    }
    if (!progressed)
      return llvm::createStringError("the schedule waits on itself (no stage can run its next pass)");
  }
  return timeline;
}

llvm::Expected<PipelineTimeline> parax::plan::simulateInference(const Plan &plan) {
  const int64_t pp = plan.pp;
  if (static_cast<int64_t>(plan.stageForward.size()) != pp || !plan.stageBackward.empty())
    return llvm::createStringError(
        "the plan has no per-stage inference times (an inference plan from searchPlans has)");
  PipelineTimeline timeline;
  std::vector<double> free(pp, 0), arrived(plan.microBatches, 0);
  for (int64_t micro = 0; micro < plan.microBatches; ++micro)
    for (int64_t s = 0; s < pp; ++s) {
      double ready = std::max(free[s], s > 0 ? arrived[micro] + plan.transferTime : 0.0);
      PipelineEvent event{s, 0, micro, /*forward=*/true, /*backward=*/false, ready,
                          ready + plan.stageForward[s]};
      free[s] = arrived[micro] = event.end;
      timeline.makespan = std::max(timeline.makespan, event.end);
      timeline.events.push_back(event);
    }
  return timeline;
}

void parax::plan::writeChromeTrace(const Plan &plan, const PipelineTimeline &timeline,
                                   llvm::raw_ostream &os) {
  // Trace times are microseconds.
  auto us = [](double seconds) { return seconds * 1e6; };
  llvm::json::Array events;
  for (int64_t s = 0; s < plan.pp; ++s) {
    events.push_back(llvm::json::Object{
        {"name", "process_name"}, {"ph", "M"}, {"pid", s},
        {"args", llvm::json::Object{{"name", llvm::formatv("pipeline stage {0}", s).str()}}}});
    events.push_back(llvm::json::Object{
        {"name", "process_sort_index"}, {"ph", "M"}, {"pid", s}, {"args", llvm::json::Object{{"sort_index", s}}}});
  }
  for (const PipelineEvent &e : timeline.events) {
    std::string name = (e.forward && e.backward ? "FB" : e.forward ? "F" : "B") + std::to_string(e.micro);
    if (plan.virtualStages > 1)
      name += " c" + std::to_string(e.chunk);
    events.push_back(llvm::json::Object{
        {"name", name},
        {"cat", e.forward && e.backward ? "forward+backward" : e.forward ? "forward" : "backward"},
        {"ph", "X"},
        {"pid", e.stage},
        {"tid", 0},
        {"ts", us(e.start)},
        {"dur", us(e.end - e.start)},
        {"args", llvm::json::Object{{"microbatch", e.micro}, {"chunk", e.chunk}}}});
  }
  if (plan.tailTime > 0)
    for (int64_t s = 0; s < plan.pp; ++s)
      events.push_back(llvm::json::Object{{"name", "gradient sync + optimizer"},
                                          {"cat", "tail"},
                                          {"ph", "X"},
                                          {"pid", s},
                                          {"tid", 0},
                                          {"ts", us(timeline.makespan)},
                                          {"dur", us(plan.tailTime)}});
  llvm::json::Object trace{
      {"traceEvents", std::move(events)},
      {"displayTimeUnit", "ms"},
      {"otherData",
       llvm::json::Object{{"plan", plan.degrees()},
                          {"schedule", toString(plan.schedule)},
                          {"micro_batches", plan.microBatches},
                          {"virtual_stages", plan.virtualStages},
                          {"simulated_step_s", timeline.makespan + plan.tailTime},
                          {"formula_step_s", plan.stepTime}}}};
  os << llvm::formatv("{0:2}", llvm::json::Value(std::move(trace))) << "\n";
}
