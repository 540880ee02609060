// PipelineSchedule.h - the order in which a pipeline stage runs its
// microbatches' forward and backward passes in a training step.
//
// A stage's program (one microbatch) is cut into ranges of instructions:
// with one model chunk a stage, its forward pass (up to backwardStart) and
// its backward pass (the last stage: one range, and its tail, the receives
// of a tied weight's gradient summed on the first stage, in a second); with interleaved chunks,
// each chunk's forward pass, then each chunk's backward pass in reverse
// (a range begins at a recv marked `range_start`; the last stage's last
// chunk: forward and backward in one range). The schedule lists the steps
// of one training step: each step one or two (microbatch, range) items.
// A backend runs a step's items in order; the CUDA backend issues the
// receives that begin a step's ranges, with the sends the step before left
// at its end, as one group (NCCL's sends may wait for their receives:
// bench/pipeline_p2p_model.py shows these groups never deadlock).

#ifndef PARAX_RUNTIME_PIPELINESCHEDULE_H
#define PARAX_RUNTIME_PIPELINESCHEDULE_H

#include "parax/runtime/Status.h"

#include <string>
#include <vector>

namespace parax::runtime {

struct PipelineRange {
  int begin = 0, end = 0; // instructions [begin, end)
  int chunk = 0;          // the model chunk (0 .. chunks-1)
  bool forward = true, backward = false; // which passes it holds (both: the last stage's last chunk)
};

/// (runtime::pipelineRanges, in Executable.h, reads them from a stage.)

struct PipelineItem {
  int64_t micro = 0; // the microbatch
  int range = 0;     // into pipelineRanges
};
using PipelineSteps = std::vector<std::vector<PipelineItem>>;

/// One training step's steps on stage `stage` of `stages` over `micro`
/// microbatches: `kind` "1f1b" (PipeDream-flush: a stage before the last
/// runs as many forward passes as stages follow it, then one forward and
/// one backward in turn, then the backward passes left), "gpipe" (every
/// forward pass first), or interleaved (ranges of several chunks:
/// Megatron-LM's interleaved 1F1B, which needs `micro` a multiple of
/// `stages`; each steady step one forward and one backward range).
StatusOr<PipelineSteps> pipelineSteps(const std::vector<PipelineRange> &ranges, const std::string &kind,
                                      int stage, int stages, int64_t micro);

/// How many microbatches are in flight at once (begun, their last range
/// not yet run) under `steps`: the activation sets a stage keeps. They
/// begin and end in order, so microbatch m may use set m % inFlight.
int64_t microbatchesInFlight(const PipelineSteps &steps, const std::vector<PipelineRange> &ranges);

/// Per model chunk, how many microbatches hold its activations at once
/// under `steps` (from the chunk's forward range to the end of its backward
/// range; they begin and end in order, so microbatch m may use the chunk's
/// slot m % count). With one chunk: microbatchesInFlight.
std::vector<int64_t> chunksInFlight(const PipelineSteps &steps, const std::vector<PipelineRange> &ranges);

/// The ranges of a training step's program on stage `stage` of `stages`
/// with `chunks` model chunks a stage, by shape alone (range r holds
/// instructions [r, r + 1)): what pipelineRanges gives a partitioned
/// program, for costing a schedule before there is one.
std::vector<PipelineRange> trainingRanges(int stage, int stages, int chunks);

/// How a stack holds the activations of the chunk passes in flight:
/// `Slots`, a slot a microbatch in each chunk, as many as that chunk ever
/// holds at once (parax's runtime: chunksInFlight); `Peak`, each pass's
/// own allocation, freed after its backward (a caching allocator, as
/// Megatron-LM's interleaved schedule runs): the most passes at once.
enum class InFlightMemory { Slots, Peak };

/// Microbatches' worth of activations stage `stage` holds at once under a
/// schedule (`kind` as pipelineSteps; chunks > 1: interleaved), each chunk
/// a 1/chunks share of the stage's layers: what the planner costs. For
/// interleaved schedules the counts stop growing at 2 x stages
/// microbatches (test/unit/PipelineScheduleTest.cpp), so longer schedules
/// are counted at that length. One chunk: the two forms agree.
double activationsInFlight(const std::string &kind, int stage, int stages, int chunks, int64_t micro,
                           InFlightMemory memory = InFlightMemory::Slots);

} // namespace parax::runtime

#endif
