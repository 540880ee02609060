//===- PipelineSchedule.cpp - pipeline stages' order of passes ------------===//

#include "parax/runtime/PipelineSchedule.h"

#include <algorithm>
#include <set>

namespace parax::runtime {

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
    // (The last stage's tail waits for the first stage's backward pass of
    // its microbatch, which that stage runs after its next forward pass:
    // the tail comes after the next microbatch's range.)
    int64_t ahead = ranges[0].backward ? 1 : stages - 1 - stage;
    int64_t warmup = kind == "gpipe" ? micro : std::min<int64_t>(ahead, micro);
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
  std::set<int64_t> live;
  int64_t most = 1;
  for (const auto &step : steps)
    for (const PipelineItem &item : step) {
      live.insert(item.micro);
      most = std::max<int64_t>(most, static_cast<int64_t>(live.size()));
      if (item.range == last) live.erase(item.micro);
    }
  return most;
}

namespace {

/// The most microbatches holding each chunk's activations at once, and the
/// most chunk passes holding theirs at once over every chunk together.
struct ChunkPasses {
  std::vector<int64_t> perChunk;
  int64_t together = 1;
};

ChunkPasses liveChunkPasses(const PipelineSteps &steps, const std::vector<PipelineRange> &ranges) {
  int chunks = 0;
  for (const PipelineRange &r : ranges) chunks = std::max(chunks, r.chunk + 1);
  if (chunks <= 1) {
    int64_t n = microbatchesInFlight(steps, ranges);
    return {{n}, n};
  }
  // Chunk c's first range (its forward) and last (its backward, or the
  // merged range of the last stage's last chunk).
  std::vector<int> firstOf(chunks, -1), lastOf(chunks, -1);
  for (int i = 0; i < static_cast<int>(ranges.size()); ++i) {
    if (firstOf[ranges[i].chunk] < 0) firstOf[ranges[i].chunk] = i;
    lastOf[ranges[i].chunk] = i;
  }
  std::vector<std::set<int64_t>> live(chunks);
  ChunkPasses most{std::vector<int64_t>(chunks, 1), 1};
  int64_t together = 0;
  for (const auto &step : steps)
    for (const PipelineItem &item : step) {
      int c = ranges[item.range].chunk;
      if (item.range == firstOf[c]) together += live[c].insert(item.micro).second;
      most.perChunk[c] = std::max<int64_t>(most.perChunk[c], static_cast<int64_t>(live[c].size()));
      most.together = std::max(most.together, together);
      if (item.range == lastOf[c]) together -= static_cast<int64_t>(live[c].erase(item.micro));
    }
  return most;
}

} // namespace

std::vector<int64_t> chunksInFlight(const PipelineSteps &steps, const std::vector<PipelineRange> &ranges) {
  return liveChunkPasses(steps, ranges).perChunk;
}

std::vector<PipelineRange> trainingRanges(int stage, int stages, int chunks) {
  const bool last = stage + 1 == stages;
  std::vector<PipelineRange> ranges;
  auto add = [&](int chunk, bool forward, bool backward) {
    int k = static_cast<int>(ranges.size());
    ranges.push_back({k, k + 1, chunk, forward, backward});
  };
  if (chunks <= 1) {
    if (last) {
      add(0, true, true);
    } else {
      add(0, true, false);
      add(0, false, true);
    }
    return ranges;
  }
  for (int c = 0; c < chunks; ++c) add(c, true, last && c + 1 == chunks);
  for (int c = chunks - (last ? 2 : 1); c >= 0; --c) add(c, false, true);
  return ranges;
}

double activationsInFlight(const std::string &kind, int stage, int stages, int chunks, int64_t micro,
                           InFlightMemory memory) {
  if (chunks > 1) micro = std::min<int64_t>(micro, 2 * stages);
  std::vector<PipelineRange> ranges = trainingRanges(stage, stages, chunks);
  StatusOr<PipelineSteps> steps = pipelineSteps(ranges, kind, stage, stages, micro);
  if (!steps.isOk()) return static_cast<double>(micro); // (every microbatch: the most there can be)
  ChunkPasses counts = liveChunkPasses(steps.value(), ranges);
  const double chunkCount = static_cast<double>(counts.perChunk.size());
  if (memory == InFlightMemory::Peak) return static_cast<double>(counts.together) / chunkCount;
  double total = 0;
  for (int64_t n : counts.perChunk) total += static_cast<double>(n);
  return total / chunkCount;
}

} // namespace parax::runtime
