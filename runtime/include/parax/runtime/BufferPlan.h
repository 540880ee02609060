// BufferPlan.h - temporaries that share one block of memory.
//
// A step's temporaries are live from the instruction that writes the first
// to the last that reads them; two whose lifetimes do not meet may use the
// same memory. planBuffers places each at an offset of one arena so that
// buffers live at the same time never overlap (greedy by size, largest
// first, at the lowest offset that fits, as TFLite's simple planner does).
// No plan can use less than the most bytes live at one instruction.

#ifndef PARAX_RUNTIME_BUFFERPLAN_H
#define PARAX_RUNTIME_BUFFERPLAN_H

#include <cstddef>
#include <vector>

namespace parax::runtime {

struct BufferLifetime {
  size_t bytes = 0;
  int first = 0, last = 0; // instructions, inclusive: live during both
};

struct BufferPlan {
  std::vector<size_t> offsets; // per buffer, multiples of the alignment
  size_t arenaBytes = 0;       // the block they all fit in
  size_t unsharedBytes = 0;    // one block each instead (aligned)
  size_t peakLiveBytes = 0;    // the most bytes live at one instruction: a lower bound
  int peakInstruction = -1;    // the first instruction where that many are live
};

BufferPlan planBuffers(const std::vector<BufferLifetime> &buffers, size_t alignment);

} // namespace parax::runtime

#endif // PARAX_RUNTIME_BUFFERPLAN_H
