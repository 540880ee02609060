// BufferPlan.cpp - greedy-by-size placement of temporaries in one arena.

#include "parax/runtime/BufferPlan.h"

#include <algorithm>
#include <numeric>

namespace parax::runtime {

BufferPlan planBuffers(const std::vector<BufferLifetime> &buffers, size_t alignment) {
  BufferPlan plan;
  size_t n = buffers.size();
  plan.offsets.assign(n, 0);
  auto aligned = [&](size_t bytes) { return (bytes + alignment - 1) / alignment * alignment; };
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  // Largest first; ties by first use, so the plan does not depend on sort
  // stability.
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (buffers[a].bytes != buffers[b].bytes) return buffers[a].bytes > buffers[b].bytes;
    return a < b;
  });
  std::vector<size_t> placed; // in order of offset
  for (size_t b : order) {
    const BufferLifetime &me = buffers[b];
    size_t size = aligned(std::max<size_t>(me.bytes, 1));
    plan.unsharedBytes += size;
    // The lowest gap among the placed buffers live at the same time.
    size_t offset = 0;
    for (size_t p : placed) {
      const BufferLifetime &other = buffers[p];
      if (other.last < me.first || me.last < other.first) continue; // never live together
      size_t otherEnd = plan.offsets[p] + aligned(std::max<size_t>(other.bytes, 1));
      if (plan.offsets[p] >= offset + size) break; // fits before this one (placed is by offset)
      offset = std::max(offset, otherEnd);
    }
    plan.offsets[b] = offset;
    plan.arenaBytes = std::max(plan.arenaBytes, offset + size);
    placed.insert(std::upper_bound(placed.begin(), placed.end(), b,
                                   [&](size_t x, size_t y) { return plan.offsets[x] < plan.offsets[y]; }),
                  b);
  }
  // The lower bound: live bytes per instruction, by a sweep over the
  // lifetimes' ends.
  std::vector<std::pair<int, long long>> events; // (instruction, +bytes at first / -bytes after last)
  for (const BufferLifetime &b : buffers) {
    long long size = static_cast<long long>(aligned(std::max<size_t>(b.bytes, 1)));
    events.push_back({b.first, size});
    events.push_back({b.last + 1, -size});
  }
  std::sort(events.begin(), events.end()); // at one instruction, ends (negative) first
  long long live = 0;
  for (const auto &[at, delta] : events) {
    live += delta;
    if (live > 0 && static_cast<size_t>(live) > plan.peakLiveBytes) {
      plan.peakLiveBytes = static_cast<size_t>(live);
      plan.peakInstruction = at;
    }
  }
  return plan;
}

} // namespace parax::runtime
