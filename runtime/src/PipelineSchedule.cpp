//===- PipelineSchedule.cpp - pipeline stages' order of passes ------------===//

#include "parax/runtime/PipelineSchedule.h"
#include "parax/runtime/Executable.h"

#include <algorithm>
#include <map>

namespace parax::runtime {

StatusOr<std::vector<PipelineRange>> pipelineRanges(const pxe::Executable &exe, int stageIndex) {
  const pxe::Stage &stage = exe.stages(stageIndex);
  const int n = stage.instructions_size(), chunks = std::max(exe.schedule().chunks(), 1);
  const bool last = stageIndex + 1 == exe.stages_size();
  std::vector<int> starts = {0};
  if (chunks == 1) {
    int backward = backwardStart(stage);
    if (backward > 0) starts.push_back(backward);
  } else {
    for (int k = 1; k < n; ++k)
      if (stage.instructions(k).op() == "recv" && stage.instructions(k).attrs().count("range_start"))
        starts.push_back(k);
  }
  // Forward passes of chunks 0 .. c-1, then backward passes in reverse; the
  // last stage's last chunk runs both in one range. A program without a
  // backward pass (inference): only the forward ranges.
  const int forwardOnly = chunks, training = 2 * chunks - (last ? 1 : 0);
  const int count = static_cast<int>(starts.size());
  if (chunks > 1 && count != forwardOnly && count != training)
    return Status::error("pipeline stage " + std::to_string(stageIndex) + ": " + std::to_string(count) +
                         " ranges (recvs marked range_start, and the start) for " + std::to_string(chunks) +
                         " model chunks: expected " + std::to_string(forwardOnly) + " (forward only) or " +
                         std::to_string(training) + " (a training step)");
  std::vector<PipelineRange> ranges(count);
  for (int i = 0; i < count; ++i) {
    PipelineRange &r = ranges[i];
    r.begin = starts[i];
    r.end = i + 1 < count ? starts[i + 1] : n;
    if (chunks == 1) { // one range: the microbatch whole; two: forward, backward
      r.forward = i == 0;
      r.backward = count == 1 ? last : i == 1;
    } else if (i < chunks) {
      r.chunk = i;
      r.backward = count == training && last && i + 1 == chunks;
    } else {
      r.chunk = 2 * chunks - 1 - i - (last ? 1 : 0);
      r.forward = false;
      r.backward = true;
    }
  }
  return ranges;
}

StatusOr<PipelineSteps> pipelineSteps(const std::vector<PipelineRange> &ranges, const std::string &kind, int stage,
                                      int stages, int64_t micro) {
  PipelineSteps steps;
  const int count = static_cast<int>(ranges.size());
  int chunks = 0;
  for (const PipelineRange &r : ranges) chunks = std::max(chunks, r.chunk + 1);
  auto find = [&](int chunk, bool backward) {
    for (int i = 0; i < count; ++i)
      if (ranges[i].chunk == chunk && (backward ? ranges[i].backward && !ranges[i].forward : ranges[i].forward))
        return i;
    return -1; // the last stage's last chunk's backward: run with its forward
  };
  const bool trains = std::any_of(ranges.begin(), ranges.end(), [](const PipelineRange &r) { return r.backward; });
  if (chunks <= 1) {
    // One range: each microbatch whole. Two: forward then backward halves.
    if (count == 1 || !trains) {
      for (int64_t m = 0; m < micro; ++m)
        for (int i = 0; i < count; ++i) steps.push_back({{m, i}});
      return steps;
    }
    int64_t warmup = kind == "gpipe" ? micro : std::min<int64_t>(stages - 1 - stage, micro);
    for (int64_t m = 0; m < warmup; ++m) steps.push_back({{m, 0}});
    for (int64_t m = 0; m < micro; ++m) {
      if (m + warmup < micro) steps.push_back({{m + warmup, 0}});
      steps.push_back({{m, 1}});
    }
    return steps;
  }
  if (micro % stages != 0)
    return Status::error("interleaved 1F1B over " + std::to_string(stages) + " stages needs the microbatches (" +
                         std::to_string(micro) + ") to be a multiple of the stages");
  // The k-th forward (and backward) pass of every stage: microbatches in
  // groups of `stages`, each group through chunk 0, then 1, ... (backward:
  // the last chunk first).
  auto nth = [&](int64_t k, bool backward) {
    int64_t group = k / (stages * chunks), chunk = (k / stages) % chunks;
    PipelineItem item{group * stages + k % stages, find(backward ? chunks - 1 - static_cast<int>(chunk)
                                                                 : static_cast<int>(chunk),
                                                        backward)};
    return item;
  };
  const int64_t total = micro * chunks;
  if (!trains) { // forward only: each microbatch's chunks in turn
    for (int64_t m = 0; m < micro; ++m)
      for (int i = 0; i < count; ++i) steps.push_back({{m, i}});
    return steps;
  }
  const int64_t warmup = std::min<int64_t>(2 * (stages - 1 - stage) + static_cast<int64_t>(chunks - 1) * stages, total);
  auto add = [&](std::vector<PipelineItem> items) {
    std::vector<PipelineItem> kept;
    for (const PipelineItem &item : items)
      if (item.range >= 0) kept.push_back(item);
    if (!kept.empty()) steps.push_back(kept);
  };
  for (int64_t k = 0; k < warmup; ++k) add({nth(k, false)});
  for (int64_t k = 0; k + warmup < total; ++k) add({nth(k + warmup, false), nth(k, true)});
  for (int64_t k = std::max<int64_t>(total - warmup, 0); k < total; ++k) add({nth(k, true)});
  return steps;
}

int64_t microbatchesInFlight(const PipelineSteps &steps, const std::vector<PipelineRange> &ranges) {
  // A microbatch is in flight from its first range to its last (the
  // first range's backward pass, or the only range).
  int last = 0;
  for (int i = 0; i < static_cast<int>(ranges.size()); ++i)
    if (ranges[i].chunk == 0 && (ranges[i].backward || ranges.size() == 1)) last = i;
  if (ranges.size() > 1 && !std::any_of(ranges.begin(), ranges.end(), [](const PipelineRange &r) { return r.backward; }))
    last = static_cast<int>(ranges.size()) - 1; // forward only: its last chunk
  std::map<int64_t, bool> live;
  int64_t most = 1;
  for (const auto &step : steps)
    for (const PipelineItem &item : step) {
      live[item.micro] = true;
      most = std::max<int64_t>(most, static_cast<int64_t>(live.size()));
      if (item.range == last) live.erase(item.micro);
    }
  return most;
}

} // namespace parax::runtime
