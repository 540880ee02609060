// Executable.h - loading and validating a .pxe file.
//
// The runtime never trusts the file: every id, shape, dtype, op name, arity,
// attribute and grid reference is checked before anything runs, and a bad
// file gets an error naming the field.

#ifndef PARAX_RUNTIME_EXECUTABLE_H
#define PARAX_RUNTIME_EXECUTABLE_H

#include "parax/runtime/PipelineSchedule.h"
#include "parax/runtime/Status.h"
#include "parax/runtime/executable.pb.h"

#include <algorithm>
#include <optional>
#include <string>
#include <vector>

namespace parax::runtime {

/// An op's name ("linear" for OP_LINEAR; "" for a kind this runtime does
/// not know), and the kind of a name (OP_UNKNOWN if none).
const std::string &opName(pxe::OpKind kind);
inline const std::string &opName(const pxe::Instruction &inst) { return opName(inst.kind()); }
pxe::OpKind opKind(const std::string &name);

/// Reads and validates `path`.
StatusOr<pxe::Executable> loadExecutable(const std::string &path);
/// Parses and validates an executable's bytes (`name`: what errors call it).
StatusOr<pxe::Executable> parseExecutable(const std::string &bytes, const std::string &name);

/// Validates a parsed executable (exposed for tests).
Status validateExecutable(const pxe::Executable &exe);

/// What `inst`'s kernels assume of its buffers (OpShapes.cpp): shapes that
/// fit each other and the op's attributes, integer ids and positions,
/// floating-point values; an error starting with `where` otherwise. Part of
/// validateExecutable (the instruction's buffer ids already checked).
Status checkOpShapes(const pxe::Executable &exe, const pxe::Stage &stage, const pxe::Instruction &inst,
                     const std::string &where);

/// The operand of `inst` that is a run-time position (a generation step's:
/// rope, position_embedding, attention, cache_update), or -1.
int positionOperand(const pxe::Instruction &inst);

/// The stage's inputs that a `cache_update` writes in place (its cache
/// operand, read by nothing else): a generation loop's KV caches. After a
/// step such an input's buffer holds the updated cache, and an input given
/// without values keeps it (Executor::setInputs).
std::vector<int32_t> cacheStateInputs(const pxe::Stage &stage);

/// Which of the program's results output `k` of `stage` is (a stage
/// without `output_results`: the k-th).
int outputResult(const pxe::Stage &stage, int k);

/// Whether output `k` of `stage` is the stage's part of a gradient that
/// several stages return a part of (`output_stage_parts`).
bool isStagePart(const pxe::Stage &stage, int k);

/// Where the program's results come from: for each result, every stage
/// output that returns it (or, a gradient in its parameter's split, each
/// rank's box of it; every stage holding the parameter returns it).
struct ResultSource {
  int stage, output;
};
std::vector<std::vector<ResultSource>> resultSources(const pxe::Executable &exe);

/// Where a pipeline stage's backward pass starts (a training step): its
/// first instruction that receives from a later stage (the gradient of what
/// it sent), or -1 (the last stage, a stage without a backward pass). The
/// instructions before it are the forward pass, and none after it is (the
/// partitioner places gradient ops after the forward ops, and a receive
/// right before its first reader).
int backwardStart(const pxe::Stage &stage);

/// Where the last stage's tail starts: its first receive from an earlier
/// stage after it sent one a gradient (a tied weight's sum over the stages
/// holding it, sent back by the first stage at the end of its backward
/// pass), or -1.
int tailStart(const pxe::Stage &stage);

/// The ranges a training step over pipeline stages runs `stage`'s program
/// in (PipelineSchedule.h): with one model chunk a stage, its forward and
/// backward pass (split at backwardStart; the last stage: one range, or
/// two when it has a tail, split at tailStart); with
/// interleaved chunks, each chunk's forward pass, then each chunk's
/// backward pass in reverse, each beginning at a recv marked
/// `range_start`. An error naming the stage when the marks do not give
/// each chunk's passes.
StatusOr<std::vector<PipelineRange>> pipelineRanges(const pxe::Executable &exe, int stage);

/// A buffer's whole tensor's shape: `global_shape`, or its own when whole.
std::vector<int64_t> wholeShape(const pxe::Buffer &buffer);

/// Where the box of `buffer` (split over the grid: a parameter, an input, a
/// split output) held by the rank at `coordinates` starts in its whole
/// tensor: per dimension, the chunk at its coordinate along the split axes
/// (major to minor).
std::vector<int64_t> boxStart(const pxe::Executable &exe, const std::vector<int64_t> &coordinates,
                              const pxe::Buffer &buffer);

/// The checkpoint tensor a parameter buffer is a box of: its shape (a
/// fused tensor's piece: the whole tensor's, `param_shape`), and where the
/// box of the rank at `coordinates` starts in it.
struct CheckpointBox {
  std::vector<int64_t> shape, start;
};
CheckpointBox checkpointBox(const pxe::Executable &exe, const std::vector<int64_t> &coordinates,
                            const pxe::Buffer &buffer);

/// Where a box's elements lie in its checkpoint tensor's row-major order:
/// `count` blocks of `length` elements, the first at `first`, each
/// `stride` after the one before (one block when they are one run).
struct ElementBlocks {
  int64_t first = 0, length = 0, stride = 0, count = 1;
  int64_t end() const { return first + (count - 1) * stride + length; }
  bool operator==(const ElementBlocks &o) const {
    return first == o.first && length == o.length && count == o.count && (count == 1 || stride == o.stride);
  }
};

/// The elements of its checkpoint tensor that parameter `buffer`'s box
/// `box` holds: one run when the box is cut on one dimension and whole on
/// the later ones; blocks when it is also cut on one earlier dimension (a
/// fused tensor's piece split over heads: DeepSeek-V3's kv_b_proj
/// [heads, 256, 512] has a key piece [heads, 128, 512], a block a head).
/// Nothing when the box is cut on more dimensions, and for a stack of
/// experts. A tensor declared in a refined shape (dimensions split, never
/// reordered: Checkpoint::readBox) keeps its elements' order, so boxes of
/// one tensor in differing shapes with the same blocks hold the same
/// values.
std::optional<ElementBlocks> elementBlocks(const CheckpointBox &box, const pxe::Buffer &buffer);

/// Where parameter `wanted` (its box `wantedBox`) lies in the memory of
/// parameter `held` (`heldBox`), a box of the same checkpoint tensor held
/// as one run of its elements: `offset` elements in, its `blocks` blocks
/// (when it is blocks) `blockStride` apart (0: one run). Nothing when `held` lacks
/// some of `wanted`'s elements, or when the two declare the tensor with
/// different numbers of elements (a program that takes another's memory
/// for a parameter never reads it from the checkpoint, which would refuse
/// the wrong size).
struct HeldAt {
  int64_t offset = 0, blockStride = 0, blocks = 1;
};
std::optional<HeldAt> heldAt(const CheckpointBox &wantedBox, const pxe::Buffer &wanted,
                             const CheckpointBox &heldBox, const pxe::Buffer &held);

/// Number of ranks of the executable's grid.
int64_t gridSize(const pxe::Executable &exe);

/// Size of a grid axis, or 0 when the grid has no such axis.
int64_t axisSize(const pxe::Executable &exe, const std::string &axis);

/// A collective's group, by the grid axes it spans (`axes`, as its `axes`
/// attribute lists them) -- the one implementation both executors use:
/// - groupMask: the axes as a mask (bit i: the grid's axis i); an error
///   unless they are distinct grid axes in grid order;
/// - groupSize: the ranks of the group;
/// - groupIndex: the place in it (major to minor) of the rank at `coords`;
/// - peerRank: the rank at `coords` but `peer` along `axis`.
StatusOr<unsigned> groupMask(const pxe::Executable &exe, const std::vector<std::string> &axes);
int64_t groupSize(const pxe::Executable &exe, const std::vector<std::string> &axes);
int64_t groupIndex(const pxe::Executable &exe, const std::vector<int64_t> &coords,
                   const std::vector<std::string> &axes);
int peerRank(const pxe::Executable &exe, const std::vector<int64_t> &coords, const std::string &axis, int64_t peer);

/// An instruction's attributes, read with defaults (validation has checked
/// the kinds): integers (booleans read as 0/1), floats, strings, string lists.
using Attrs = google::protobuf::Map<std::string, pxe::Attr>;
int64_t attrInt(const Attrs &a, const std::string &key, int64_t otherwise = 0);
double attrFloat(const Attrs &a, const std::string &key, double otherwise = 0);
std::string attrString(const Attrs &a, const std::string &key);
bool attrFlag(const Attrs &a, const std::string &key);
std::vector<std::string> attrStrings(const Attrs &a, const std::string &key);

/// Where the `rows` rows of an op split on the sequence over ranks
/// (`seq_axes`: context parallelism) lie in the whole sequence of `pieces`
/// x `rows`: row i is position start + i * stride. In blocks, the rank's
/// piece c along the axes starts at c * rows; dealt out cyclically
/// (`seq_cyclic`: the first axis, N1 ranks, this rank at c1 on it and at g
/// along the others), row i is (g * rows + i) * N1 + c1. Unsplit: 0, 1, 1.
struct SequenceRows {
  int64_t start = 0, stride = 1, pieces = 1;
  int64_t position(int64_t row) const { return start + row * stride; }
};
SequenceRows sequenceRows(const pxe::Executable &exe, const std::vector<int64_t> &coordinates, const Attrs &a,
                          int64_t rows);

/// A `rope` instruction's inverse frequencies (rotary_dim / 2 of them), with
/// its `scaling.*` attributes applied (none, linear, llama3).
StatusOr<std::vector<double>> ropeInverseFrequencies(const Attrs &a);

/// What a `rope` multiplies its rotated channels by: `scaling.attention_factor`
/// (LongRoPE's on a partially rotated head: the channels that turn alone),
/// else 1.
double ropeRotatedFactor(const Attrs &a);

/// The (token, choice) rows member j of an expert exchange receives, given
/// the members' counts (all[i * P + j]: the pairs member i routes to j).
template <typename Count> int64_t routedTo(const std::vector<Count> &all, int64_t P, int64_t j) {
  int64_t received = 0;
  for (int64_t i = 0; i < P; ++i) received += static_cast<int64_t>(all[i * P + j]);
  return received;
}

/// The values each block of member `me`'s all-to-all holds for rows of
/// `width`: to each member (the pairs `me` routes to it), or from each (the
/// pairs it routes to `me`).
template <typename Count>
std::vector<size_t> exchangeBlocks(const std::vector<Count> &all, int64_t P, int64_t me, int64_t width,
                                   bool toMembers) {
  std::vector<size_t> n(P);
  for (int64_t j = 0; j < P; ++j)
    n[j] = static_cast<size_t>(all[toMembers ? me * P + j : j * P + me]) * static_cast<size_t>(width);
  return n;
}

/// The most rows any member of an expert exchange receives, as a multiple
/// of a member's own `pairs`: the least expert capacity that holds it.
template <typename Count> double busiestRankLoad(const std::vector<Count> &all, int64_t P, int64_t pairs) {
  int64_t most = 0;
  for (int64_t j = 0; j < P; ++j) most = std::max(most, routedTo(all, P, j));
  return pairs > 0 ? static_cast<double>(most) / static_cast<double>(pairs) : 0.0;
}

/// An expert exchange (moe_dispatch, moe_combine) over P members whose
/// dispatch holds `capacity` rows a member, given the members' counts
/// (all[i * P + j]: the (token, choice) pairs member i routes to member j's
/// experts): an error naming the first member that would receive more,
/// else ok. Every member has the same counts, so all fail together.
template <typename Count>
Status expertCapacityCheck(const std::string &op, const std::vector<Count> &all, int64_t P, int64_t capacity) {
  for (int64_t j = 0; j < P; ++j) {
    int64_t received = routedTo(all, P, j);
    if (received > capacity)
      return Status::error(op + ": expert-parallel rank " + std::to_string(j) + " of " + std::to_string(P) +
                           " is routed " + std::to_string(received) + " (token, choice) rows, more than the " +
                           std::to_string(capacity) +
                           " its exchange holds (the router's choices are that unbalanced: plan with "
                           "a larger expert capacity, capacity= in the workload, or none to hold any routing)");
  }
  return Status::ok();
}

} // namespace parax::runtime

#endif // PARAX_RUNTIME_EXECUTABLE_H
