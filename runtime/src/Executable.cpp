// Executable.cpp - loading and validating a .pxe file.

#include "parax/runtime/Executable.h"
#include "parax/runtime/PipelineSchedule.h"
#include "parax/runtime/Tensor.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

namespace parax::runtime {

namespace {

constexpr uint32_t kFormatVersion = 2;
constexpr int64_t kMaxElements = int64_t(1) << 40;

// Operand counts (at least, at most; -1: no limit) and result count of
// every op the runtime knows.
struct Arity {
  int minOperands, maxOperands, results;
};
const std::map<std::string, Arity> &arities() {
  static const std::map<std::string, Arity> table = {
      {"embedding", {2, 2, 1}},      {"position_embedding", {1, 2, 1}},
      {"linear", {2, 3, 1}},         {"rms_norm", {2, 2, 1}},
      {"head_linear", {2, 2, 1}},
      {"layer_norm", {3, 3, 1}},     {"rope", {1, 2, 1}},
      {"attention", {3, 4, 1}},      {"cache_update", {3, 3, 1}},
      {"ring_cache_update", {3, 3, 2}},
      {"add", {2, 2, 1}},            {"mul", {2, 2, 1}},
      {"silu", {1, 1, 1}},           {"sigmoid", {1, 1, 1}},        {"softcap", {1, 1, 1}},
      {"gelu", {1, 1, 1}},           {"swiglu", {2, 2, 1}},
      {"reshape", {1, 1, 1}},        {"transpose", {1, 1, 1}},
      {"slice", {1, 1, 1}},          {"concat", {1, -1, 1}},
      {"broadcast", {1, 1, 1}},      {"router", {2, 3, 2}},
      {"experts", {6, 6, 1}},        {"cross_entropy", {2, 4, 1}},
      {"logsumexp", {1, 1, 1}},
      {"all_reduce", {1, 1, 1}},     {"all_gather", {1, 1, 1}},
      {"reduce_scatter", {1, 1, 1}}, {"all_to_all", {1, 1, 1}},
      {"shard_slice", {1, 1, 1}},    {"to_partial", {1, 1, 1}},
      {"send", {1, 1, 0}},           {"recv", {0, 0, 1}},
      {"moe_dispatch", {3, 3, 3}},   {"moe_combine", {2, 2, 1}},
      // Gradients (--parax-autodiff).
      {"cross_entropy_grad", {2, 4, 1}}, {"linear_weight_grad", {2, 2, 1}},
      {"label_count", {1, 1, 1}},        {"shift", {1, 1, 1}},
      {"rms_norm_grad", {3, 3, 1}},      {"rms_norm_weight_grad", {2, 2, 1}},
      {"swiglu_grad", {3, 3, 1}},        {"attention_grad", {4, 4, 3}},
      {"embedding_grad", {2, 2, 1}},     {"sum_to", {1, 1, 1}},
      {"gelu_grad", {2, 2, 1}},          {"layer_norm_grad", {3, 3, 1}},
      {"layer_norm_weight_grad", {2, 2, 1}}, {"position_embedding_grad", {1, 1, 1}},
      {"sigmoid_grad", {2, 2, 1}},       {"router_grad", {3, 4, 1}},  {"softcap_grad", {2, 2, 1}},
      {"experts_grad", {7, 7, 5}},       {"router_load", {2, 3, 1}},
      {"router_aux_grad", {3, 3, 1}},    {"balance_loss", {2, 2, 1}},
  };
  return table;
}

Status fail(const std::string &where, const std::string &what) {
  return Status::error(where + ": " + what);
}

} // namespace

int positionOperand(const pxe::Instruction &inst) {
  const pxe::OpKind op = inst.kind();
  if (op == pxe::OP_CACHE_UPDATE || op == pxe::OP_RING_CACHE_UPDATE) return 2;
  if (op == pxe::OP_ATTENTION && inst.operands_size() == 4) return 3;
  if ((op == pxe::OP_ROPE || op == pxe::OP_POSITION_EMBEDDING) && inst.operands_size() == 2) return 1;
  return -1;
}

std::vector<int32_t> cacheStateInputs(const pxe::Stage &stage) {
  std::map<int32_t, int> reads;
  for (const pxe::Instruction &inst : stage.instructions())
    for (int32_t id : inst.operands()) ++reads[id];
  for (int32_t id : stage.outputs()) ++reads[id];
  std::vector<int32_t> state;
  for (const pxe::Instruction &inst : stage.instructions())
    if ((inst.kind() == pxe::OP_CACHE_UPDATE || inst.kind() == pxe::OP_RING_CACHE_UPDATE) &&
        inst.operands_size() == 3) {
      int32_t id = inst.operands(0);
      if (id >= 0 && id < stage.buffers_size() && stage.buffers(id).role() == pxe::INPUT && reads[id] == 1)
        state.push_back(id);
    }
  return state;
}

int64_t gridSize(const pxe::Executable &exe) {
  int64_t n = 1;
  for (int64_t s : exe.grid().shape())
    n *= s;
  return n;
}

int64_t axisSize(const pxe::Executable &exe, const std::string &axis) {
  for (int i = 0; i < exe.grid().axis_names_size(); ++i)
    if (exe.grid().axis_names(i) == axis)
      return exe.grid().shape(i);
  return 0;
}

StatusOr<unsigned> groupMask(const pxe::Executable &exe, const std::vector<std::string> &axes) {
  unsigned mask = 0;
  int last = -1;
  for (const std::string &axis : axes) {
    int index = -1;
    for (int i = 0; i < exe.grid().axis_names_size(); ++i)
      if (exe.grid().axis_names(i) == axis) index = i;
    if (index <= last) {
      std::string given, order;
      for (const std::string &a : axes) given += (given.empty() ? "" : ", ") + a;
      for (int i = 0; i < exe.grid().axis_names_size(); ++i) order += (i ? ", " : "") + exe.grid().axis_names(i);
      return Status::error("collective axes [" + given + "] must be distinct grid axes in grid order (" + order + ")");
    }
    last = index;
    mask |= 1u << index;
  }
  return mask;
}

int64_t groupSize(const pxe::Executable &exe, const std::vector<std::string> &axes) {
  int64_t n = 1;
  for (const std::string &axis : axes) n *= axisSize(exe, axis);
  return n;
}

int64_t groupIndex(const pxe::Executable &exe, const std::vector<int64_t> &coords,
                   const std::vector<std::string> &axes) {
  int64_t index = 0;
  for (const std::string &axis : axes)
    for (int i = 0; i < exe.grid().axis_names_size(); ++i)
      if (exe.grid().axis_names(i) == axis) index = index * exe.grid().shape(i) + coords[i];
  return index;
}

int peerRank(const pxe::Executable &exe, const std::vector<int64_t> &coords, const std::string &axis, int64_t peer) {
  int64_t rank = 0;
  for (int i = 0; i < exe.grid().axis_names_size(); ++i)
    rank = rank * exe.grid().shape(i) + (exe.grid().axis_names(i) == axis ? peer : coords[i]);
  return static_cast<int>(rank);
}

Status validatePipelineTransfers(const pxe::Executable &exe);

int outputResult(const pxe::Stage &stage, int k) {
  return stage.output_results_size() ? stage.output_results(k) : k;
}

bool isStagePart(const pxe::Stage &stage, int k) {
  return k < stage.output_stage_parts_size() && stage.output_stage_parts(k);
}

std::vector<int64_t> wholeShape(const pxe::Buffer &buffer) {
  if (buffer.global_shape_size())
    return {buffer.global_shape().begin(), buffer.global_shape().end()};
  return {buffer.shape().begin(), buffer.shape().end()};
}

StatusOr<std::vector<PipelineRange>> pipelineRanges(const pxe::Executable &exe, int stageIndex) {
  const pxe::Stage &stage = exe.stages(stageIndex);
  const int n = stage.instructions_size(), chunks = std::max(exe.schedule().chunks(), 1);
  const bool last = stageIndex + 1 == exe.stages_size();
  std::vector<int> starts = {0};
  if (chunks == 1) {
    int backward = backwardStart(stage);
    if (backward > 0) starts.push_back(backward);
    int tail = last ? tailStart(stage) : -1;
    if (tail > 0) { // the last stage's tail: its own range, after the next microbatch's forward pass
      starts.push_back(tail);
      std::vector<PipelineRange> ranges = {{0, tail, 0, true, true}, {tail, n, 0, false, true}};
      return ranges;
    }
  } else {
    for (int k = 1; k < n; ++k)
      if (opName(stage.instructions(k)) == "recv" && stage.instructions(k).attrs().count("range_start"))
        starts.push_back(k);
  }
  // Forward passes of chunks 0 .. c-1, then backward passes in reverse; the
  // last stage's last chunk runs both in one range. A program without a
  // backward pass (inference): only the forward ranges.
  // (In 64 bits: a hostile file's chunks may be near INT_MAX.)
  const int64_t forwardOnly = chunks, training = 2 * int64_t{chunks} - (last ? 1 : 0);
  const int64_t count = static_cast<int64_t>(starts.size());
  if (chunks > 1 && count != forwardOnly && count != training)
    return Status::error("pipeline stage " + std::to_string(stageIndex) + ": " + std::to_string(count) +
                         " ranges (recvs marked range_start, and the start) for " + std::to_string(chunks) +
                         " model chunks: expected " + std::to_string(forwardOnly) + " (forward only) or " +
                         std::to_string(training) + " (a training step)");
  // A training step's ranges have trainingRanges' shape; forward only, a
  // forward range a chunk.
  std::vector<PipelineRange> ranges = trainingRanges(stageIndex, exe.stages_size(), chunks);
  if (count != training) {
    ranges.assign(count, PipelineRange{});
    for (int i = 0; i < count; ++i) ranges[i].chunk = i;
  }
  for (int i = 0; i < count; ++i) {
    ranges[i].begin = starts[i];
    ranges[i].end = i + 1 < count ? starts[i + 1] : n;
  }
  return ranges;
}

int tailStart(const pxe::Stage &stage) {
  bool sentBack = false;
  for (int k = 0; k < stage.instructions_size(); ++k) {
    const pxe::Instruction &inst = stage.instructions(k);
    int64_t peer = attrInt(inst.attrs(), "peer", -1);
    if ((opName(inst) != "send" && opName(inst) != "recv") || peer < 0 || peer >= stage.index() ||
        attrStrings(inst.attrs(), "axes") != std::vector<std::string>{"pp"})
      continue;
    if (opName(inst) == "send") sentBack = true;
    else if (sentBack) return k;
  }
  return -1;
}

int backwardStart(const pxe::Stage &stage) {
  for (int k = 0; k < stage.instructions_size(); ++k) {
    const pxe::Instruction &inst = stage.instructions(k);
    if (opName(inst) == "recv" && attrInt(inst.attrs(), "peer", -1) > stage.index())
      return k;
  }
  return -1;
}

std::vector<std::vector<ResultSource>> resultSources(const pxe::Executable &exe) {
  std::vector<std::vector<ResultSource>> sources;
  for (int s = 0; s < exe.stages_size(); ++s)
    for (int k = 0; k < exe.stages(s).outputs_size(); ++k) {
      size_t result = static_cast<size_t>(outputResult(exe.stages(s), k));
      if (result >= sources.size()) sources.resize(result + 1);
      sources[result].push_back({s, k});
    }
  return sources;
}

std::vector<int64_t> boxStart(const pxe::Executable &exe, const std::vector<int64_t> &coordinates,
                              const pxe::Buffer &buffer) {
  const pxe::Grid &grid = exe.grid();
  std::vector<int64_t> start(buffer.shape_size(), 0);
  for (int d = 0; d < buffer.split_size() && d < buffer.shape_size(); ++d) {
    int64_t index = 0;
    for (const std::string &axis : buffer.split(d).axes())
      for (int i = 0; i < grid.axis_names_size(); ++i)
        if (grid.axis_names(i) == axis)
          index = index * grid.shape(i) + coordinates[i];
    start[d] = index * buffer.shape(d);
  }
  return start;
}

std::optional<ElementBlocks> elementBlocks(const CheckpointBox &box, const pxe::Buffer &buffer) {
  const int rank = static_cast<int>(box.shape.size());
  if (buffer.param_name().find("{e}") != std::string::npos || rank == 0 ||
      box.start.size() != box.shape.size() || buffer.shape_size() != rank)
    return std::nullopt;
  // The last dimension the box cuts (0 when it is whole): a block is the
  // box's extent there times the whole later dimensions.
  int cut = 0;
  for (int d = 0; d < rank; ++d)
    if (buffer.shape(d) != box.shape[d]) cut = d;
  ElementBlocks blocks;
  blocks.length = 1;
  for (int d = cut; d < rank; ++d) blocks.length *= buffer.shape(d);
  // Before it, at most one dimension with more than one element: the
  // blocks', a stride of the tensor's dimensions after it.
  for (int d = 0; d < cut; ++d) {
    if (buffer.shape(d) == 1) continue;
    if (blocks.count > 1) return std::nullopt;
    blocks.count = buffer.shape(d);
    blocks.stride = 1;
    for (int e = d + 1; e < rank; ++e) blocks.stride *= box.shape[e];
  }
  for (int d = 0; d < rank; ++d) blocks.first = blocks.first * box.shape[d] + box.start[d];
  if (blocks.count > 1 && blocks.stride == blocks.length) { // back to back: one run
    blocks.length *= blocks.count;
    blocks.count = 1;
  }
  if (blocks.count == 1) blocks.stride = 0;
  return blocks;
}

std::optional<HeldAt> heldAt(const CheckpointBox &wantedBox, const pxe::Buffer &wanted,
                             const CheckpointBox &heldBox, const pxe::Buffer &held) {
  if (numelOf(wantedBox.shape) != numelOf(heldBox.shape)) return std::nullopt;
  auto want = elementBlocks(wantedBox, wanted);
  auto have = elementBlocks(heldBox, held);
  if (!want || !have || have->count != 1 || want->first < have->first || want->end() > have->end())
    return std::nullopt;
  return HeldAt{want->first - have->first, want->count > 1 ? want->stride : 0, want->count};
}

CheckpointBox checkpointBox(const pxe::Executable &exe, const std::vector<int64_t> &coordinates,
                            const pxe::Buffer &buffer) {
  CheckpointBox box{wholeShape(buffer), boxStart(exe, coordinates, buffer)};
  if (buffer.param_offset_size()) {
    box.shape.assign(buffer.param_shape().begin(), buffer.param_shape().end());
    for (int d = 0; d < buffer.param_offset_size(); ++d)
      box.start[d] += buffer.param_offset(d);
  }
  return box;
}

namespace {

// A stage's outputs say which results they are: the last stage's may
// leave that out (its outputs are the results in order); an earlier
// stage returns only gradients (of the parameters it holds), and only a
// gradient may be a box of its result.
Status checkOutputResults(const pxe::Executable &exe, int s) {
  const pxe::Stage &stage = exe.stages(s);
  std::string where = "stages[" + std::to_string(s) + "]";
  bool last = s + 1 == exe.stages_size();
  if (stage.output_results_size() && stage.output_results_size() != stage.outputs_size())
    return fail(where + ".output_results", std::to_string(stage.output_results_size()) + " indices for " +
                                               std::to_string(stage.outputs_size()) + " outputs");
  if (!last && stage.outputs_size() && !stage.output_results_size())
    return fail(where + ".output_results", "an earlier pipeline stage's outputs must say which results they are");
  std::vector<int> seen;
  for (int k = 0; k < stage.outputs_size(); ++k) {
    int result = outputResult(stage, k);
    std::string ow = where + ".outputs[" + std::to_string(k) + "]";
    if (result < 0 || result >= (1 << 20))
      return fail(ow, "names result " + std::to_string(result) + ", out of range");
    if (std::find(seen.begin(), seen.end(), result) != seen.end())
      return fail(ow, "is result " + std::to_string(result) + " a second time");
    seen.push_back(result);
    bool grad = k < stage.output_grads_size() && !stage.output_grads(k).empty();
    if (!last && !grad)
      return fail(ow, "is result " + std::to_string(result) + ", not a gradient: only the last stage returns "
                                                             "the model's results");
    const pxe::Buffer &buffer = stage.buffers(stage.outputs(k));
    if (!grad && buffer.role() == pxe::TEMPORARY && buffer.global_shape_size())
      return fail(ow, "is a box of result " + std::to_string(result) +
                          ": only a gradient is returned in its parameter's split");
  }
  return Status::ok();
}

// Every result 0..R-1 comes from some stage, and stages that return the
// same one agree on what it is: the gradient of one tensor, one shape.
Status checkResultsCovered(const pxe::Executable &exe) {
  auto sources = resultSources(exe);
  for (size_t r = 0; r < sources.size(); ++r) {
    if (sources[r].empty())
      return fail("stages", "no stage returns result " + std::to_string(r));
    const ResultSource &first = sources[r][0];
    const pxe::Stage &a = exe.stages(first.stage);
    for (const ResultSource &other : sources[r]) {
      const pxe::Stage &b = exe.stages(other.stage);
      auto gradOf = [](const pxe::Stage &st, int k) {
        return k < st.output_grads_size() ? st.output_grads(k) : std::string();
      };
      if (gradOf(a, first.output) != gradOf(b, other.output) ||
          wholeShape(a.buffers(a.outputs(first.output))) != wholeShape(b.buffers(b.outputs(other.output))) ||
          isStagePart(a, first.output) != isStagePart(b, other.output))
        return fail("stages[" + std::to_string(other.stage) + "].outputs[" + std::to_string(other.output) + "]",
                    "is result " + std::to_string(r) + " but differs from stage " + std::to_string(first.stage) +
                        "'s (gradient name, shape or being a stage's part)");
    }
    if (isStagePart(exe.stages(first.stage), first.output) && sources[r].size() < 2)
      return fail("stages[" + std::to_string(first.stage) + "].outputs[" + std::to_string(first.output) + "]",
                  "is a stage's part of result " + std::to_string(r) + ", which no other stage returns");
  }
  return Status::ok();
}

} // namespace

// The grid, the ranks' coordinates, the schedule and the stages' count.
static Status validateGrid(const pxe::Executable &exe) {
  if (exe.format_version() != kFormatVersion)
    return fail("format_version", "is " + std::to_string(exe.format_version()) + ", this runtime reads " +
                                      std::to_string(kFormatVersion) +
                                      (exe.format_version() == 1
                                           ? " (format 1 named ops by strings: translate the IR again with this "
                                             "parax-translate)"
                                           : ""));
  const pxe::Grid &grid = exe.grid();
  if (grid.axis_names_size() != grid.shape_size())
    return fail("grid", "has " + std::to_string(grid.axis_names_size()) +
                            " axis names but " + std::to_string(grid.shape_size()) +
                            " sizes");
  std::set<std::string> axes;
  int64_t devices = 1;
  for (int i = 0; i < grid.shape_size(); ++i) {
    if (grid.shape(i) <= 0 || grid.shape(i) > (1 << 20))
      return fail("grid.shape[" + std::to_string(i) + "]", "must be in [1, 2^20]");
    if (!axes.insert(grid.axis_names(i)).second)
      return fail("grid.axis_names", "'" + grid.axis_names(i) + "' appears twice");
    devices *= grid.shape(i);
    if (devices > (1 << 24))
      return fail("grid", "has more than 2^24 ranks");
  }
  if (exe.ranks_size() != devices)
    return fail("ranks", "lists " + std::to_string(exe.ranks_size()) +
                             " ranks for a grid of " + std::to_string(devices));
  for (int r = 0; r < exe.ranks_size(); ++r) {
    const auto &c = exe.ranks(r).values();
    if (c.size() != grid.shape_size())
      return fail("ranks[" + std::to_string(r) + "]", "has the wrong number of coordinates");
    int64_t linear = 0;
    for (int i = 0; i < c.size(); ++i) {
      if (c[i] < 0 || c[i] >= grid.shape(i))
        return fail("ranks[" + std::to_string(r) + "]", "coordinate out of the grid");
      linear = linear * grid.shape(i) + c[i];
    }
    if (linear != r)
      return fail("ranks[" + std::to_string(r) + "]",
                  "coordinates are not row-major order (rank " + std::to_string(linear) + ")");
  }
  if (exe.schedule().zero_stage() < 0 || exe.schedule().zero_stage() > 3)
    return fail("schedule.zero_stage", "is " + std::to_string(exe.schedule().zero_stage()) + ", not 0 to 3");
  if (exe.stages_size() == 0)
    return fail("stages", "is empty");
  if (exe.schedule().chunks() < 0 || (exe.schedule().chunks() > 1 && exe.stages_size() < 2))
    return fail("schedule.chunks", "is " + std::to_string(exe.schedule().chunks()) +
                                       ": model chunks need two pipeline stages or more");
  for (int s = 0; s < exe.stages_size() && exe.schedule().chunks() > 1; ++s) {
    StatusOr<std::vector<PipelineRange>> ranges = pipelineRanges(exe, s);
    if (!ranges.isOk())
      return fail("stages[" + std::to_string(s) + "]", ranges.status().message());
  }
  int64_t pp = axisSize(exe, "pp");
  if (exe.stages_size() > 1 && pp != exe.stages_size())
    return fail("stages", std::to_string(exe.stages_size()) +
                              " stages need a grid axis 'pp' of that size");

  return Status::ok();
}

// Stage `stage`'s buffers (`where` names it): ids, dtypes, roles, shapes,
// and the boxes of parameters, inputs and split outputs; `defined` gets
// the buffers given before the first instruction (parameters, inputs).
static Status validateBuffers(const pxe::Executable &exe, const pxe::Stage &stage, const std::string &where,
                              std::vector<bool> &defined) {
  for (int b = 0; b < stage.buffers_size(); ++b) {
    const pxe::Buffer &buffer = stage.buffers(b);
    std::string bw = where + ".buffers[" + std::to_string(b) + "]";
    if (buffer.id() != b)
      return fail(bw + ".id", "is " + std::to_string(buffer.id()) + ", expected " + std::to_string(b));
    if (buffer.dtype() == pxe::DTYPE_UNSPECIFIED || !pxe::DType_IsValid(buffer.dtype()))
      return fail(bw + ".dtype", "is not a known dtype");
    if (!pxe::Role_IsValid(buffer.role()) || buffer.role() == pxe::ROLE_UNSPECIFIED)
      return fail(bw + ".role", "is not a known role");
    int64_t elements = 1;
    for (int64_t d : buffer.shape()) {
      if (d <= 0)
        return fail(bw + ".shape", "has a non-positive dimension");
      elements *= d;
      if (elements > kMaxElements)
        return fail(bw + ".shape", "is too large");
    }
    // A box of a whole tensor: a parameter's, an input's, or a split
    // output's (a gradient in its parameter's split).
    auto checkBox = [&]() -> Status {
      if (buffer.global_shape_size() != buffer.shape_size() ||
          buffer.split_size() != buffer.shape_size())
        return fail(bw, "global_shape and split need one entry per dimension");
      for (int d = 0; d < buffer.shape_size(); ++d) {
        int64_t parts = 1;
        for (const std::string &axis : buffer.split(d).axes()) {
          int64_t n = axisSize(exe, axis);
          if (!n)
            return fail(bw + ".split", "names unknown grid axis '" + axis + "'");
          parts *= n;
        }
        if (buffer.global_shape(d) != buffer.shape(d) * parts)
          return fail(bw + ".global_shape",
                      "dimension " + std::to_string(d) + " is not the local size times its split");
      }
      return Status::ok();
    };
    if (buffer.role() == pxe::TEMPORARY && (buffer.global_shape_size() || buffer.split_size())) {
      if (std::find(stage.outputs().begin(), stage.outputs().end(), b) == stage.outputs().end())
        return fail(bw + ".global_shape", "belongs on a parameter, an input or an output");
      if (Status box = checkBox(); !box.isOk())
        return box;
    }
    if (buffer.role() == pxe::PARAMETER || buffer.role() == pxe::INPUT) {
      defined[b] = true;
      if (buffer.role() == pxe::PARAMETER && buffer.param_name().empty())
        return fail(bw + ".param_name", "is empty");
      if (Status box = checkBox(); !box.isOk())
        return box;
      for (const std::string &axis : buffer.partial())
        if (!axisSize(exe, axis))
          return fail(bw + ".partial", "names unknown grid axis '" + axis + "'");
      if (buffer.param_offset_size() || buffer.param_shape_size()) {
        if (buffer.role() != pxe::PARAMETER || buffer.param_name().find("{e}") != std::string::npos)
          return fail(bw + ".param_offset", "belongs on a parameter that is not a stack of experts");
        if (buffer.param_offset_size() != buffer.shape_size() || buffer.param_shape_size() != buffer.shape_size())
          return fail(bw, "param_offset and param_shape need one entry per dimension");
        for (int d = 0; d < buffer.shape_size(); ++d)
          if (buffer.param_offset(d) < 0 ||
              buffer.param_offset(d) > buffer.param_shape(d) - buffer.global_shape(d))
            return fail(bw + ".param_offset", "dimension " + std::to_string(d) +
                                                  ": the piece lies outside the checkpoint tensor");
      }
    }
  }
  return Status::ok();
}

// Instruction k of `stage`: a known op, its operands computed before it
// and its results written once, its attributes' axes and its shapes.
static Status validateInstruction(const pxe::Executable &exe, const pxe::Stage &stage, int k,
                                  const std::string &where, std::vector<bool> &defined) {
  const pxe::Instruction &inst = stage.instructions(k);
  std::string iw = where + ".instructions[" + std::to_string(k) + "] (" +
                   (opName(inst).empty() ? "kind " + std::to_string(inst.kind()) : opName(inst)) + ")";
  auto arity = arities().find(opName(inst));
  if (arity == arities().end())
    return fail(iw + ".kind", "is not an op this runtime knows");
  const Arity &counts = arity->second;
  if (inst.operands_size() < counts.minOperands ||
      (counts.maxOperands >= 0 && inst.operands_size() > counts.maxOperands) ||
      inst.results_size() != counts.results)
    return fail(iw, "has the wrong number of operands or results");
  for (int32_t id : inst.operands())
    if (id < 0 || id >= stage.buffers_size() || !defined[id])
      return fail(iw + ".operands", "buffer " + std::to_string(id) +
                                        " is out of range or not yet computed");
  if (int p = positionOperand(inst); p >= 0) {
    const pxe::Buffer &position = stage.buffers(inst.operands(p));
    if ((position.dtype() != pxe::I32 && position.dtype() != pxe::I64) || position.shape_size() != 0)
      return fail(iw + ".operands", "the position (operand " + std::to_string(p) +
                                        ") must be an integer scalar");
  }
  for (int32_t id : inst.results()) {
    if (id < 0 || id >= stage.buffers_size())
      return fail(iw + ".results", "buffer " + std::to_string(id) + " is out of range");
    if (defined[id])
      return fail(iw + ".results", "buffer " + std::to_string(id) + " is written twice");
    if (stage.buffers(id).role() != pxe::TEMPORARY)
      return fail(iw + ".results", "buffer " + std::to_string(id) + " is not a temporary");
    defined[id] = true;
  }
  // (after the results' ids are checked: a mutant's result id past the
  // buffers was read here before, parax-pxe-fuzz 2026-12-01)
  if (opName(inst) == "cache_update") {
    const pxe::Buffer &cache = stage.buffers(inst.operands(0)), &update = stage.buffers(inst.operands(1));
    const pxe::Buffer &result = stage.buffers(inst.results(0));
    bool fits = cache.shape_size() == 4 && update.shape_size() == 4 &&
                result.shape_size() == 4 && update.shape(1) <= cache.shape(1);
    for (int d = 0; fits && d < 4; ++d)
      fits = result.shape(d) == cache.shape(d) && (d == 1 || update.shape(d) == cache.shape(d));
    if (!fits)
      return fail(iw, "the cache, the update and the result must be [B, C, heads, D], "
                      "[B, S <= C, heads, D] and the cache's shape");
  }
  if (inst.kind() == pxe::OP_RING_CACHE_UPDATE) {
    const pxe::Buffer &cache = stage.buffers(inst.operands(0)), &update = stage.buffers(inst.operands(1));
    const pxe::Buffer &window = stage.buffers(inst.results(0)), &result = stage.buffers(inst.results(1));
    bool fits = cache.shape_size() == 4 && update.shape_size() == 4 && window.shape_size() == 4 &&
                result.shape_size() == 4 && window.shape(1) == cache.shape(1) + update.shape(1);
    for (int d = 0; fits && d < 4; ++d)
      fits = result.shape(d) == cache.shape(d) &&
             (d == 1 || (window.shape(d) == cache.shape(d) && update.shape(d) == cache.shape(d)));
    if (!fits)
      return fail(iw, "the ring, the update, the window and the result must be [B, C, heads, D], "
                      "[B, S, heads, D], [B, C + S, heads, D] and the ring's shape");
  }
  for (const auto &[name, attr] : inst.attrs()) { // axes, head_axes, vocab_axes, ...
    bool namesAxes = name.size() >= 4 && name.compare(name.size() - 4, 4, "axes") == 0;
    if (namesAxes && attr.has_strings())
      for (const std::string &axis : attr.strings().values())
        if (!axisSize(exe, axis))
          return fail(iw + ".attrs[" + name + "]", "names unknown grid axis '" + axis + "'");
  }
  // Pipeline stages run different programs: a group spanning them
  // would wait for ranks that never join it (only send/recv cross).
  if (exe.stages_size() > 1 && opName(inst) != "send" && opName(inst) != "recv")
    for (const std::string &axis : attrStrings(inst.attrs(), "axes"))
      if (axis == "pp")
        return fail(iw + ".attrs[axes]", "a group over 'pp' spans pipeline stages, which run different "
                                         "programs: its ranks would wait forever");
  if (Status shapes = checkOpShapes(exe, stage, inst, iw); !shapes.isOk())
    return shapes;
  return Status::ok();
}

// Stage `stage`'s outputs and what they are (gradients, loss terms, stage
// parts), and its partial sums (gradient outputs only).
static Status validateOutputs(const pxe::Executable &exe, const pxe::Stage &stage, const std::string &where,
                              const std::vector<bool> &defined) {
  if (stage.output_grads_size() && stage.output_grads_size() != stage.outputs_size())
    return fail(where + ".output_grads", std::to_string(stage.output_grads_size()) + " names for " +
                                              std::to_string(stage.outputs_size()) + " outputs");
  for (int32_t id : stage.outputs())
    if (id < 0 || id >= stage.buffers_size() || !defined[id])
      return fail(where + ".outputs", "buffer " + std::to_string(id) + " is not computed");
  if (stage.output_terms_size() && stage.output_terms_size() != stage.outputs_size())
    return fail(where + ".output_terms", std::to_string(stage.output_terms_size()) + " terms for " +
                                              std::to_string(stage.outputs_size()) + " outputs");
  for (int k = 0; k < stage.output_terms_size(); ++k) {
    const std::string &term = stage.output_terms(k);
    if (term.empty()) continue;
    if (term != "balance" && term != "mtp")
      return fail(where + ".output_terms[" + std::to_string(k) + "]", "'" + term + "' is not a loss term "
                                                                        "(balance, mtp)");
    const pxe::Buffer &b = stage.buffers(stage.outputs(k));
    if (b.shape_size() != 0 || b.dtype() != pxe::F32)
      return fail(where + ".output_terms[" + std::to_string(k) + "]", "a loss term must be an f32 scalar");
  }
  if (stage.output_stage_parts_size() && stage.output_stage_parts_size() != stage.outputs_size())
    return fail(where + ".output_stage_parts", std::to_string(stage.output_stage_parts_size()) + " flags for " +
                                                   std::to_string(stage.outputs_size()) + " outputs");
  for (int k = 0; k < stage.output_stage_parts_size(); ++k)
    if (stage.output_stage_parts(k) && (k >= stage.output_grads_size() || stage.output_grads(k).empty()))
      return fail(where + ".output_stage_parts[" + std::to_string(k) + "]", "a stage's part of what is not a "
                                                                            "gradient");
  // A computed buffer that is a partial sum: a gradient output, which the
  // runtime sums over those axes with its data-parallel reduction.
  for (int32_t b = 0; b < stage.buffers_size(); ++b) {
    const pxe::Buffer &buffer = stage.buffers(b);
    if (buffer.role() != pxe::TEMPORARY || !buffer.partial_size()) continue;
    std::string bw = where + ".buffers[" + std::to_string(b) + "].partial";
    bool gradient = false;
    for (int k = 0; k < stage.outputs_size(); ++k)
      gradient = gradient || (stage.outputs(k) == b && k < stage.output_grads_size() && !stage.output_grads(k).empty());
    if (!gradient)
      return fail(bw, "a partial sum that is not a gradient output (the runtime adds up the partial sums of "
                      "gradients only)");
    for (const std::string &axis : buffer.partial()) {
      if (!axisSize(exe, axis)) return fail(bw, "names unknown grid axis '" + axis + "'");
      if (axis == "pp") return fail(bw, "a partial sum over 'pp' (pipeline stages run different programs)");
      for (const pxe::AxisList &split : buffer.split())
        if (std::find(split.axes().begin(), split.axes().end(), axis) != split.axes().end())
          return fail(bw, "'" + axis + "' both splits the box and sums it");
      if (std::count(buffer.partial().begin(), buffer.partial().end(), axis) > 1)
        return fail(bw, "names '" + axis + "' twice");
    }
  }
  return Status::ok();
}

Status validateExecutable(const pxe::Executable &exe) {
  if (Status grid = validateGrid(exe); !grid.isOk())
    return grid;
  for (int s = 0; s < exe.stages_size(); ++s) {
    const pxe::Stage &stage = exe.stages(s);
    std::string where = "stages[" + std::to_string(s) + "]";
    if (stage.index() != s)
      return fail(where + ".index", "is " + std::to_string(stage.index()));
    std::vector<bool> defined(stage.buffers_size(), false);
    if (Status buffers = validateBuffers(exe, stage, where, defined); !buffers.isOk())
      return buffers;
    for (int k = 0; k < stage.instructions_size(); ++k)
      if (Status inst = validateInstruction(exe, stage, k, where, defined); !inst.isOk())
        return inst;
    if (Status outputs = validateOutputs(exe, stage, where, defined); !outputs.isOk())
      return outputs;
    if (Status results = checkOutputResults(exe, s); !results.isOk())
      return results;
  }
  if (Status covered = checkResultsCovered(exe); !covered.isOk())
    return covered;
  return validatePipelineTransfers(exe);
}

// The stages' transfers run to their end: each stage's sends and receives,
// in program order, taken as rendezvous (a send waits for its receive, as
// NCCL's and a large MPI message's do), with the k-th send from s to t
// meeting the k-th receive of t from s. A program whose stages would each
// wait for another forever (a receive placed before the send its peer
// waits on) is refused, naming where every stage stops.
Status checkTransfersComplete(const pxe::Executable &exe) {
  struct Transfer {
    bool send;
    int peer;
    int k; // instruction index
  };
  int stages = exe.stages_size();
  std::vector<std::vector<Transfer>> order(stages);
  for (int s = 0; s < stages; ++s)
    for (int k = 0; k < exe.stages(s).instructions_size(); ++k) {
      const pxe::Instruction &inst = exe.stages(s).instructions(k);
      if ((opName(inst) == "send" || opName(inst) == "recv") && attrStrings(inst.attrs(), "axes") ==
                                                              std::vector<std::string>{"pp"})
        order[s].push_back({opName(inst) == "send", static_cast<int>(attrInt(inst.attrs(), "peer")), k});
    }
  std::vector<size_t> at(stages, 0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < stages; ++s) {
      if (at[s] >= order[s].size() || !order[s][at[s]].send) continue;
      int t = order[s][at[s]].peer;
      if (t >= 0 && t < stages && at[t] < order[t].size() && !order[t][at[t]].send && order[t][at[t]].peer == s) {
        ++at[s];
        ++at[t];
        moved = true;
      }
    }
  }
  std::string stuck;
  for (int s = 0; s < stages; ++s)
    if (at[s] < order[s].size()) {
      const Transfer &next = order[s][at[s]];
      stuck += (stuck.empty() ? "" : "; ") + std::string("stages[") + std::to_string(s) + "].instructions[" +
               std::to_string(next.k) + "] (" + (next.send ? "send to " : "recv from ") + "stage " +
               std::to_string(next.peer) + ")";
    }
  if (!stuck.empty())
    return fail("stages", "wait for each other forever: " + stuck);
  return Status::ok();
}

// Sends and receives between pipeline stages pair up: stage s's sends to
// stage t, in order, match stage t's receives from s in number and size
// (otherwise a rank waits forever for a tensor that never comes), and run
// to their end (checkTransfersComplete).
Status validatePipelineTransfers(const pxe::Executable &exe) {
  int stages = exe.stages_size();
  // [from][to] -> element counts in program order, and where each is.
  std::vector<std::vector<std::vector<int64_t>>> sent(stages, std::vector<std::vector<int64_t>>(stages)),
      received = sent;
  std::vector<std::vector<std::vector<std::string>>> receivedAt(stages, std::vector<std::vector<std::string>>(stages)),
      sentAt = receivedAt;
  for (int s = 0; s < stages; ++s) {
    const pxe::Stage &stage = exe.stages(s);
    for (int k = 0; k < stage.instructions_size(); ++k) {
      const pxe::Instruction &inst = stage.instructions(k);
      if (opName(inst) != "send" && opName(inst) != "recv")
        continue;
      std::string iw = "stages[" + std::to_string(s) + "].instructions[" + std::to_string(k) + "] (" + opName(inst) + ")";
      std::vector<std::string> axes = attrStrings(inst.attrs(), "axes");
      if (axes.size() != 1)
        return fail(iw + ".attrs[axes]", "must name one grid axis");
      int64_t peer = attrInt(inst.attrs(), "peer", -1);
      if (peer < 0 || peer >= axisSize(exe, axes[0]))
        return fail(iw + ".attrs[peer]", "is " + std::to_string(peer) + ", outside axis '" + axes[0] + "'");
      if (axes[0] != "pp" || stages == 1)
        continue; // within a stage: every rank runs the same program
      if (peer == s)
        return fail(iw + ".attrs[peer]", "is the stage itself");
      bool sending = opName(inst) == "send";
      int32_t id = sending ? inst.operands(0) : inst.results(0);
      int64_t elements = 1;
      for (int64_t d : stage.buffers(id).shape()) elements *= d;
      (sending ? sent : received)[sending ? s : peer][sending ? peer : s].push_back(elements);
      (sending ? sentAt : receivedAt)[sending ? s : peer][sending ? peer : s].push_back(iw);
    }
  }
  for (int from = 0; from < stages; ++from)
    for (int to = 0; to < stages; ++to) {
      const auto &out = sent[from][to], &in = received[from][to];
      for (size_t i = 0; i < std::max(out.size(), in.size()); ++i) {
        if (i < out.size() && i < in.size() && out[i] == in[i])
          continue;
        std::string pair = "stage " + std::to_string(from) + " -> stage " + std::to_string(to);
        if (i >= in.size())
          return fail(sentAt[from][to][i], "has no matching recv in stages[" + std::to_string(to) + "] (" + pair +
                                                 "): a rank would wait forever");
        if (i >= out.size())
          return fail(receivedAt[from][to][i], "has no matching send in stages[" + std::to_string(from) + "] (" +
                                                     pair + "): a rank would wait forever");
        return fail(receivedAt[from][to][i], "receives " + std::to_string(in[i]) + " elements where " +
                                                 sentAt[from][to][i] + " sends " + std::to_string(out[i]));
      }
    }
  return checkTransfersComplete(exe);
}

// The names, by kind, from the schema's enum: OP_LINEAR -> "linear".
static const std::vector<std::string> &opNames() {
  static const std::vector<std::string> names = [] {
    const google::protobuf::EnumDescriptor *kinds = pxe::OpKind_descriptor();
    int most = 0;
    for (int i = 0; i < kinds->value_count(); ++i) most = std::max(most, kinds->value(i)->number());
    std::vector<std::string> byKind(most + 1);
    for (int i = 0; i < kinds->value_count(); ++i) {
      std::string name = kinds->value(i)->name().substr(3); // (after OP_)
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      if (kinds->value(i)->number() != pxe::OP_UNKNOWN) byKind[kinds->value(i)->number()] = name;
    }
    return byKind;
  }();
  return names;
}

const std::string &opName(pxe::OpKind kind) {
  static const std::string none;
  const std::vector<std::string> &names = opNames();
  return kind >= 0 && static_cast<size_t>(kind) < names.size() ? names[kind] : none;
}

pxe::OpKind opKind(const std::string &name) {
  const std::vector<std::string> &names = opNames();
  for (size_t k = 1; k < names.size(); ++k)
    if (!name.empty() && names[k] == name) return static_cast<pxe::OpKind>(k);
  return pxe::OP_UNKNOWN;
}

StatusOr<pxe::Executable> loadExecutable(const std::string &path) {
  struct stat info;
  if (stat(path.c_str(), &info) == 0 && !S_ISREG(info.st_mode))
    return PARAX_ERROR(path + ": not a file (an executable is a .pxe file)");
  std::ifstream in(path, std::ios::binary);
  if (!in)
    return PARAX_ERROR(path + ": cannot open the executable");
  std::stringstream bytes;
  bytes << in.rdbuf();
  return parseExecutable(bytes.str(), path);
}

StatusOr<pxe::Executable> parseExecutable(const std::string &bytes, const std::string &name) {
  pxe::Executable exe;
  if (!exe.ParseFromString(bytes))
    return PARAX_ERROR(name + ": not a parax executable (protobuf parse failed)");
  Status status = validateExecutable(exe);
  if (!status.isOk())
    return Status::error(name + ": " + status.message());
  return exe;
}

int64_t attrInt(const Attrs &a, const std::string &key, int64_t otherwise) {
  auto it = a.find(key);
  if (it == a.end())
    return otherwise;
  return it->second.has_b() ? it->second.b() : it->second.i();
}

double attrFloat(const Attrs &a, const std::string &key, double otherwise) {
  auto it = a.find(key);
  return it == a.end() ? otherwise : it->second.f();
}

std::string attrString(const Attrs &a, const std::string &key) {
  auto it = a.find(key);
  return it == a.end() ? "" : it->second.s();
}

bool attrFlag(const Attrs &a, const std::string &key) {
  auto it = a.find(key);
  return it != a.end() && it->second.b();
}

std::vector<std::string> attrStrings(const Attrs &a, const std::string &key) {
  auto it = a.find(key);
  if (it == a.end())
    return {};
  return {it->second.strings().values().begin(), it->second.strings().values().end()};
}

SequenceRows sequenceRows(const pxe::Executable &exe, const std::vector<int64_t> &coordinates, const Attrs &a,
                          int64_t rows) {
  std::vector<std::string> axes = attrStrings(a, "seq_axes");
  // The group index of `from ..` of the axes (major to minor), and its size.
  auto group = [&](size_t from, int64_t &size) {
    int64_t index = 0;
    size = 1;
    for (size_t k = from; k < axes.size(); ++k)
      for (int i = 0; i < exe.grid().axis_names_size(); ++i)
        if (exe.grid().axis_names(i) == axes[k] && i < static_cast<int>(coordinates.size())) {
          index = index * exe.grid().shape(i) + coordinates[i];
          size *= exe.grid().shape(i);
        }
    return index;
  };
  SequenceRows r;
  if (axes.empty()) return r;
  int64_t all = 1, inner = 1;
  int64_t piece = group(0, all);
  r.pieces = all;
  if (!attrFlag(a, "seq_cyclic")) {
    r.start = piece * rows;
    return r;
  }
  int64_t rest = group(1, inner), first = all / inner; // N1 = the first axis's size
  r.stride = first;
  r.start = rest * rows * first + piece / inner;      // c1 = piece / (the others' size)
  return r;
}

double ropeRotatedFactor(const Attrs &a) {
  return a.count("scaling.attention_factor") ? attrFloat(a, "scaling.attention_factor") : 1.0;
}

StatusOr<std::vector<double>> ropeInverseFrequencies(const Attrs &a) {
  int64_t rot = attrInt(a, "rotary_dim");
  double theta = attrFloat(a, "theta");
  std::vector<double> invFreq(rot / 2);
  for (int64_t i = 0; i < rot / 2; ++i)
    invFreq[i] = 1.0 / std::pow(theta, 2.0 * i / rot);
  std::string scaling = attrString(a, "scaling.rope_type");
  if (scaling == "llama3") {
    double factor = attrFloat(a, "scaling.factor"), low = attrFloat(a, "scaling.low_freq_factor"),
           high = attrFloat(a, "scaling.high_freq_factor");
    double old = static_cast<double>(attrInt(a, "scaling.original_max_position_embeddings"));
    for (double &f : invFreq) {
      double wavelen = 2 * M_PI / f;
      if (wavelen > old / low) {
        f /= factor;
      } else if (wavelen >= old / high) {
        double smooth = (old / wavelen - low) / (high - low);
        f = (1 - smooth) * f / factor + smooth * f;
      }
    }
  } else if (scaling == "linear") {
    for (double &f : invFreq) f /= attrFloat(a, "scaling.factor");
  } else if (scaling == "yarn") {
    // YaRN (Peng et al. 2023): channels of fewer rotations than beta_slow
    // over the original context interpolated (f / factor), of more than
    // beta_fast kept, a linear ramp between (by channel index).
    double factor = attrFloat(a, "scaling.factor");
    double old = static_cast<double>(attrInt(a, "scaling.original_max_position_embeddings"));
    auto channel = [&](double rotations) {
      return rot * std::log(old / (rotations * 2 * M_PI)) / (2 * std::log(theta));
    };
    double low = std::max(std::floor(channel(attrFloat(a, "scaling.beta_fast"))), 0.0);
    double high = std::min(std::ceil(channel(attrFloat(a, "scaling.beta_slow"))), rot - 1.0);
    if (low == high) high += 0.001;
    for (int64_t i = 0; i < rot / 2; ++i) {
      double ramp = std::clamp((i - low) / (high - low), 0.0, 1.0);
      invFreq[i] = invFreq[i] / factor * ramp + invFreq[i] * (1 - ramp);
    }
  } else if (scaling == "longrope") {
    // LongRoPE (Phi-3): each channel's frequency divided by its own
    // factor (the short or the long list, chosen at build by the
    // program's positions).
    auto it = a.find("scaling.ext_factors");
    if (it == a.end() || !it->second.has_floats() ||
        it->second.floats().values_size() != static_cast<int>(invFreq.size()))
      return Status::error("longrope scaling needs ext_factors: " + std::to_string(invFreq.size()) +
                           " numbers (one a pair of rotated channels)");
    for (size_t i = 0; i < invFreq.size(); ++i) {
      double factor = it->second.floats().values(static_cast<int>(i));
      if (!std::isfinite(factor) || factor <= 0)
        return Status::error("longrope scaling: ext_factors[" + std::to_string(i) +
                             "] must be a finite positive number");
      invFreq[i] /= factor;
    }
  } else if (!scaling.empty()) {
    return Status::error("rope scaling '" + scaling + "' is not implemented by the runtime");
  }
  return invFreq;
}

} // namespace parax::runtime
