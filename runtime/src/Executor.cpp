// Executor.cpp - CPU kernels (fp32; OpenBLAS sgemm for matmuls) and the
// instruction loop. Semantics follow the parax op descriptions
// (docs/dialect/ParaxDialect.md).

#include "parax/runtime/Executor.h"
#include "parax/runtime/Executable.h"

#include "FewRowsGemm.h"
#include "VectorMath.h"
#include "GradientKernels.h"
#include "MoeKernels.h"

#include <cblas.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <numeric>

namespace parax::runtime {

namespace {

// Rows of the leading dims and the last dim.
std::pair<int64_t, int64_t> rowsCols(const Tensor &t) {
  int64_t cols = t.shape.empty() ? 1 : t.shape.back();
  return {t.numel() / std::max<int64_t>(cols, 1), cols};
}

// Splits `t` into `parts` equal pieces along `dim`, concatenated piece-major.
template <typename T>
std::vector<T> piecesAlong(const Tensor &t, const std::vector<T> &values, int dim, int parts) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= t.shape[d];
  for (size_t d = dim + 1; d < t.shape.size(); ++d) inner *= t.shape[d];
  int64_t len = t.shape[dim], chunk = len / parts;
  std::vector<T> out(t.numel());
  size_t k = 0;
  for (int p = 0; p < parts; ++p)
    for (int64_t o = 0; o < outer; ++o) { // (a piece's rows of one outer index are contiguous)
      const T *src = &values[(o * len + p * chunk) * inner];
      std::copy(src, src + chunk * inner, &out[k]);
      k += chunk * inner;
    }
  return out;
}

// The inverse: `parts` pieces (piece-major) joined along `dim` into `out`.
void joinAlong(const std::vector<float> &pieces, int dim, int parts, Tensor &out) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= out.shape[d];
  for (size_t d = dim + 1; d < out.shape.size(); ++d) inner *= out.shape[d];
  int64_t len = out.shape[dim], chunk = len / parts;
  size_t k = 0;
  for (int p = 0; p < parts; ++p)
    for (int64_t o = 0; o < outer; ++o) {
      std::copy(&pieces[k], &pieces[k] + chunk * inner, &out.f[(o * len + p * chunk) * inner]);
      k += chunk * inner;
    }
}

// The cross-entropy's mean: its divisor (with ignore_index, label_count's
// count, 1 where it is 0; else num_tokens or this rank's rows; over the
// loss's weight) and the label it skips.
struct CountedLabels {
  double divisor = 1;
  std::optional<int32_t> ignore;
  const Tensor *labels = nullptr;
  // Every counted label inside the vocabulary of V.
  Status check(int64_t V) const {
    for (size_t t = 0; t < labels->i.size(); ++t)
      if (int32_t label = labels->i[t]; (!ignore || label != *ignore) && (label < 0 || label >= V))
        return Status::error("label out of range at token " + std::to_string(t) + " (" + std::to_string(label) +
                             ", vocabulary " + std::to_string(V) +
                             (ignore ? ", ignore_index " + std::to_string(*ignore) : std::string()) + ")");
    return Status::ok();
  }
};
CountedLabels countedLabels(const Attrs &a, const Tensor &labels, const Tensor *count) {
  CountedLabels counted;
  counted.labels = &labels;
  if (count) {
    counted.divisor = count->f[0] > 0 ? static_cast<double>(count->f[0]) : 1.0; // (none counted: a loss of 0)
    counted.ignore = static_cast<int32_t>(attrInt(a, "ignore_index"));
  } else {
    counted.divisor = static_cast<double>(attrInt(a, "num_tokens", labels.numel()));
  }
  counted.divisor /= attrFloat(a, "weight", 1.0); // (a multi-token prediction depth's share)
  return counted;
}

// Whether `inst` only moves data (copies, cuts, lays out, zeroes).
bool movesData(const pxe::Instruction &inst) {
  static const char *const moves[] = {"slice",     "shard_slice", "to_partial", "reshape",
                                      "transpose", "broadcast",   "concat",     "position_embedding"};
  return std::find(std::begin(moves), std::end(moves), opName(inst)) != std::end(moves);
}

// Broadcasting index of `out` flat index k into `in` (same rank, dims 1 or equal).
int64_t broadcastIndex(const Tensor &in, const Tensor &out, int64_t k) {
  int64_t index = 0, stride = 1;
  for (int64_t d = out.shape.size() - 1; d >= 0; --d) {
    int64_t coord = k % out.shape[d];
    k /= out.shape[d];
    if (in.shape[d] != 1)
      index += coord * stride;
    stride *= in.shape[d];
  }
  return index;
}

} // namespace

struct Executor::Impl {
  Executor &e;
  const pxe::Executable &exe;
  std::vector<std::pair<int32_t, int32_t>> lentCaches; // (cache input, result) of in-place cache_updates

  unsigned axesMask(const std::vector<std::string> &axes, Status &status) {
    unsigned mask = 0;
    int last = -1;
    for (const std::string &axis : axes) {
      int index = -1;
      for (int i = 0; i < exe.grid().axis_names_size(); ++i)
        if (exe.grid().axis_names(i) == axis)
          index = i;
      if (index <= last) {
        std::string given, order;
        for (const std::string &a : axes)
          given += (given.empty() ? "" : ", ") + a;
        for (int i = 0; i < exe.grid().axis_names_size(); ++i)
          order += (i ? ", " : "") + exe.grid().axis_names(i);
        status = Status::error("collective axes [" + given + "] must be distinct grid axes in grid order (" +
                               order + ")");
        return 0;
      }
      last = index;
      mask |= 1u << index;
    }
    return mask;
  }

  // This rank's index within the group of `axes` (major to minor).
  int64_t groupIndex(const std::vector<std::string> &axes) {
    int64_t index = 0;
    for (const std::string &axis : axes)
      for (int i = 0; i < exe.grid().axis_names_size(); ++i)
        if (exe.grid().axis_names(i) == axis)
          index = index * exe.grid().shape(i) + e.coords_[i];
    return index;
  }

  int64_t groupSizeOf(const std::vector<std::string> &axes) {
    int64_t n = 1;
    for (const std::string &axis : axes)
      n *= axisSize(exe, axis);
    return n;
  }

  SequenceRows rowsOf(const Attrs &a, int64_t rows) { return sequenceRows(exe, e.coords_, a, rows); }

  int peerRank(const std::string &axis, int64_t peer) {
    int64_t rank = 0;
    for (int i = 0; i < exe.grid().axis_names_size(); ++i) {
      int64_t c = exe.grid().axis_names(i) == axis ? peer : e.coords_[i];
      rank = rank * exe.grid().shape(i) + c;
    }
    return static_cast<int>(rank);
  }

  Status needComm(int64_t groupSize) {
    if (groupSize > 1 && !e.comm_)
      return Status::error("a collective over several ranks needs a communicator");
    return Status::ok();
  }

  // Query s sees keys 0 .. position(s) + (T - S): its own position in the
  // whole sequence (a rank's part of it split over N ranks: T - N * S
  // earlier keys), or over a cache from a run-time position, 0 ..
  // position + s. Query head h reads KV head (headOffset + h) / group.
  StatusOr<AttentionGeometry> attentionGeometry(const pxe::Instruction &inst, const Tensor &q, const Tensor &k) {
    const Attrs &a = inst.attrs();
    int64_t S = q.shape[1], H = q.shape[2], T = k.shape[1], KH = k.shape[2];
    SequenceRows rows = rowsOf(a, S);
    int64_t edge = T - S * rows.pieces;
    int64_t floor = 0;
    if (inst.kind() == pxe::OP_ATTENTION && inst.operands_size() == 4 && attrFlag(a, "ring")) {
      // A ring's window (ring_cache_update): row r at position p - (T - S) + r; those of
      // negative position (the ring not yet full) are not seen.
      floor = std::max<int64_t>(0, T - S - e.buffers_[inst.operands(3)].i[0]);
    } else if (inst.kind() == pxe::OP_ATTENTION && inst.operands_size() == 4) { // (attention_grad's fourth: dout)
      rows = SequenceRows{e.buffers_[inst.operands(3)].i[0], 1, 1};
      edge = 0;
      if (rows.start < 0 || rows.start + S > T)
        return Status::error("position " + std::to_string(rows.start) + " + " + std::to_string(S) +
                             " queries exceed the " + std::to_string(T) + " keys");
    }
    AttentionGeometry g;
    g.scale = static_cast<float>(attrFloat(a, "scale"));
    bool causal = attrFlag(a, "causal");
    g.visible = [causal, rows, edge, T](int64_t s) { return causal ? std::min(T, rows.position(s) + edge + 1) : T; };
    g.window = attrInt(a, "window"); // (a sliding window: the last keys alone)
    g.floor = floor;
    g.softcap = attrFloat(a, "softcap"); // (Gemma 2: scores squashed into (-c, c))
    std::vector<std::string> headAxes = attrStrings(a, "head_axes");
    int64_t totalHeads = H;
    if (!headAxes.empty()) {
      g.headOffset = groupIndex(headAxes) * H;
      totalHeads = H * groupSizeOf(headAxes);
    }
    g.group = totalHeads / KH;
    return g;
  }


  // The kernels (Executor::Impl::run calls them by index).
  using Kernel = Status (Impl::*)(const pxe::Instruction &, int variant);
  struct Entry {
    const char *op;
    Kernel run;
    int variant; // which of the kernel's ops (add 0, mul 1, ...)
  };
  static const Entry kKernels[];
  /// kKernels' index of `op`, -1 if it has no CPU kernel.
  static int kernelIndex(const std::string &op);
  /// Instruction k of the stage.
  Status run(int k);
  // An instruction's attributes, and its operands and results by place
  // (each kernel's first line: `auto [a, in, out] = io(inst);`).
  struct Pick {
    std::vector<Tensor> &b;
    const google::protobuf::RepeatedField<int32_t> &ids;
    Tensor &operator()(int k = 0) const { return b[ids[k]]; }
  };
  struct Io {
    const Attrs &a;
    Pick in, out;
  };
  Io io(const pxe::Instruction &inst) { return {inst.attrs(), {e.buffers_, inst.operands()}, {e.buffers_, inst.results()}}; }
  // A collective's group: its axes, their mask and size.
  struct Group {
    std::vector<std::string> axes;
    unsigned mask = 0;
    int64_t size = 1;
  };
  Status groupOf(const Attrs &a, bool needsComm, Group &group);
  Status runEmbedding(const pxe::Instruction &inst, int variant);
  Status runPositionEmbedding(const pxe::Instruction &inst, int variant);
  Status runLinear(const pxe::Instruction &inst, int variant);
  Status runHeadLinear(const pxe::Instruction &inst, int variant);
  Status runRmsNorm(const pxe::Instruction &inst, int variant);
  Status runRope(const pxe::Instruction &inst, int variant);
  Status runAttention(const pxe::Instruction &inst, int variant);
  Status runCacheUpdate(const pxe::Instruction &inst, int variant);
  Status runRingCacheUpdate(const pxe::Instruction &inst, int variant);
  // What a cache update writes: its cache input itself when that is the
  // generation loop's state (in place), else its result, a copy of it.
  Tensor &cacheTarget(const pxe::Instruction &inst, Tensor &cache, Tensor &y);
  // After an in-place update, the result takes the cache input's storage.
  void lendCache(const pxe::Instruction &inst, Tensor &cache, Tensor &y, int result);
  Status runAdd(const pxe::Instruction &inst, int variant);
  Status runSilu(const pxe::Instruction &inst, int variant);
  Status runSoftcap(const pxe::Instruction &inst, int variant);
  Status runSwiglu(const pxe::Instruction &inst, int variant);
  Status runReshape(const pxe::Instruction &inst, int variant);
  Status runTranspose(const pxe::Instruction &inst, int variant);
  Status runSlice(const pxe::Instruction &inst, int variant);
  Status runBalanceLoss(const pxe::Instruction &inst, int variant);
  Status runRouterAuxGrad(const pxe::Instruction &inst, int variant);
  Status runRouter(const pxe::Instruction &inst, int variant);
  Status runExperts(const pxe::Instruction &inst, int variant);
  Status runExpertsGrad(const pxe::Instruction &inst, int variant);
  Status runCrossEntropy(const pxe::Instruction &inst, int variant);
  Status runLogsumexp(const pxe::Instruction &inst, int variant);
  Status runLabelCount(const pxe::Instruction &inst, int variant);
  Status runShift(const pxe::Instruction &inst, int variant);
  Status runLinearWeightGrad(const pxe::Instruction &inst, int variant);
  Status runRmsNormGrad(const pxe::Instruction &inst, int variant);
  Status runRmsNormWeightGrad(const pxe::Instruction &inst, int variant);
  Status runSumTo(const pxe::Instruction &inst, int variant);
  Status runSoftcapGrad(const pxe::Instruction &inst, int variant);
  Status runSigmoidGrad(const pxe::Instruction &inst, int variant);
  Status runGeluGrad(const pxe::Instruction &inst, int variant);
  Status runPositionEmbeddingGrad(const pxe::Instruction &inst, int variant);
  Status runSwigluGrad(const pxe::Instruction &inst, int variant);
  Status runAttentionGrad(const pxe::Instruction &inst, int variant);
  Status runEmbeddingGrad(const pxe::Instruction &inst, int variant);
  Status runAllReduce(const pxe::Instruction &inst, int variant);
  Status runShardSlice(const pxe::Instruction &inst, int variant);
  Status runAllToAll(const pxe::Instruction &inst, int variant);
  Status runToPartial(const pxe::Instruction &inst, int variant);
  Status runSend(const pxe::Instruction &inst, int variant);
  Status runRecv(const pxe::Instruction &inst, int variant);
  Status runMoeDispatch(const pxe::Instruction &inst, int variant);

};

// Host memory this process may still take: the least of what its
// address-space limit leaves and what the system has available (bytes;
// a very large number when neither is known).
static double availableHostBytes(std::string &which) {
  double best = 1e300;
  struct rlimit limit;
  if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
    double used = 0;
    std::ifstream statm("/proc/self/statm");
    long pages = 0;
    if (statm >> pages)
      used = static_cast<double>(pages) * sysconf(_SC_PAGESIZE);
    best = static_cast<double>(limit.rlim_cur) - used;
    which = "what the process's address-space limit leaves";
  }
  std::ifstream meminfo("/proc/meminfo");
  std::string key;
  double kb = 0;
  while (meminfo >> key >> kb) {
    if (key == "MemAvailable:" && kb * 1024 < best) {
      best = kb * 1024;
      which = "MemAvailable";
    }
    meminfo.ignore(256, '\n');
  }
  return best;
}

Status Executor::prepare(const pxe::Executable &exe, int rank, Communicator *comm,
                         const Checkpoint &weights, const std::vector<Tensor> &inputs,
                         const LoadHooks *hooks) {
  exe_ = &exe;
  comm_ = comm;
  rank_ = rank;
  if (rank < 0 || rank >= exe.ranks_size())
    return Status::error("rank " + std::to_string(rank) + " is outside the grid");
  coords_.assign(exe.ranks(rank).values().begin(), exe.ranks(rank).values().end());
  stage_ = 0;
  for (int i = 0; i < exe.grid().axis_names_size(); ++i)
    if (exe.grid().axis_names(i) == "pp")
      stage_ = static_cast<int>(coords_[i]);
  if (stage_ >= exe.stages_size())
    stage_ = 0;
  stageProto_ = &exe.stages(stage_);
  if (!hooks) {
    // Every buffer is host memory here (4 bytes an element): refused with
    // the figures before anything is taken, not in an allocation.
    double needed = 0;
    for (const pxe::Buffer &buffer : stageProto_->buffers())
      needed += 4.0 * numelOf(std::vector<int64_t>(buffer.shape().begin(), buffer.shape().end()));
    std::string which;
    double available = availableHostBytes(which);
    if (needed > available) {
      char text[256];
      std::snprintf(text, sizeof text,
                    "rank %d (stage %d) needs %.2f GB of host memory for its buffers; %.2f GB are "
                    "available (%s)",
                    rank, stage_, needed / 1e9, available / 1e9, which.c_str());
      return Status::error(text);
    }
  }
  buffers_.assign(stageProto_->buffers_size(), Tensor());
  cacheState_ = cacheStateInputs(*stageProto_);
  // Instructions whose token ids or run-time position come from the inputs:
  // setInputs checks those values (the CUDA kernels cannot report them).
  readsCheckedInputs_.clear();
  for (int k = 0; k < stageProto_->instructions_size(); ++k) {
    const pxe::Instruction &inst = stageProto_->instructions(k);
    int checked = inst.kind() == pxe::OP_EMBEDDING ? 0 : positionOperand(inst);
    if (checked >= 0 && stageProto_->buffers(inst.operands(checked)).role() == pxe::INPUT)
      readsCheckedInputs_.push_back(k);
  }
  runsElsewhere_ = hooks != nullptr; // this executor will not run the stage itself
  // With hooks, parameters that moves of parameters read stay on the host
  // until prepare has run those moves.
  std::vector<bool> readByMoves(stageProto_->buffers_size(), false);
  for (const pxe::Instruction &inst : stageProto_->instructions())
    if (movesData(inst))
      for (int32_t id : inst.operands())
        readByMoves[id] = true;

  for (const pxe::Buffer &buffer : stageProto_->buffers()) {
    std::vector<int64_t> shape(buffer.shape().begin(), buffer.shape().end());
    bool isInt = buffer.dtype() == pxe::I32 || buffer.dtype() == pxe::I64;
    if (buffer.role() == pxe::TEMPORARY) {
      Tensor &t = buffers_[buffer.id()];
      if (!hooks) {
        t = isInt ? Tensor::ints(shape) : Tensor::floats(shape);
        continue;
      }
      t.shape = shape; // host memory only if prepare computes it
      t.isInt = isInt;
      continue;
    }
    bool zero = false;
    for (const std::string &axis : buffer.partial())
      for (int i = 0; i < exe.grid().axis_names_size(); ++i)
        if (exe.grid().axis_names(i) == axis && coords_[i] != 0)
          zero = true;
    Tensor &t = buffers_[buffer.id()];
    if (buffer.role() == pxe::INPUT)
      continue; // setInputs
    // A parameter; "{e}" names a stack of per-expert tensors along dim 0.
    if (hooks && hooks->alreadyHeld && !readByMoves[buffer.id()]) {
      t.shape = shape;
      t.isInt = isInt;
      if (hooks->alreadyHeld(buffer.id()))
        continue;
    }
    // This rank's box (of the piece, in a fused checkpoint tensor; of the
    // experts it holds, in a stack).
    CheckpointBox box = checkpointBox(exe, coords_, buffer);
    Status s = weights.readParameterBox(buffer.param_name(), box.shape, box.start, shape, t);
    if (!s.isOk())
      return s;
    if (t.isInt != isInt) // (same byte size, other kind: the kernels would read the wrong vector)
      return Status::error("checkpoint tensor '" + buffer.param_name() + "' holds " +
                           (t.isInt ? "integers" : "floats") + ", the program reads " +
                           (isInt ? "integers" : "floats") + " there");
    if (zero)
      std::fill(t.f.begin(), t.f.end(), 0.0f);
    if (hooks && hooks->parameterLoaded) {
      Status s = hooks->parameterLoaded(buffer.id());
      if (!s.isOk())
        return s;
      if (!readByMoves[buffer.id()] && !hooks->keepParameters)
        std::vector<float>().swap(t.f);
    }
  }
  Status s = hoistParameterMoves();
  if (!s.isOk())
    return s;
  return setInputs(inputs);
}

// An instruction that only moves data, all of whose operands are parameters
// (or results of such moves), gives the same result every step.
Status Executor::hoistParameterMoves() {
  std::vector<bool> fixed(stageProto_->buffers_size(), false);
  for (const pxe::Buffer &b : stageProto_->buffers())
    fixed[b.id()] = b.role() == pxe::PARAMETER;
  hoisted_.assign(stageProto_->instructions_size(), false);
  // Each instruction's kernel, found once (an op without one: an error
  // when it runs, as a backend with hooks may never run it here).
  kernels_.resize(stageProto_->instructions_size());
  for (int k = 0; k < stageProto_->instructions_size(); ++k)
    kernels_[k] = Impl::kernelIndex(opName(stageProto_->instructions(k)));
  Impl impl{*this, *exe_};
  for (int k = 0; k < stageProto_->instructions_size(); ++k) {
    const pxe::Instruction &inst = stageProto_->instructions(k);
    if (!movesData(inst) || inst.operands_size() == 0 ||
        !std::all_of(inst.operands().begin(), inst.operands().end(), [&](int32_t id) { return fixed[id]; }))
      continue;
    for (int32_t id : inst.results()) { // host memory a backend with hooks left out
      Tensor &t = buffers_[id];
      if (t.isInt && t.i.empty()) t.i.assign(t.numel(), 0);
      if (!t.isInt && t.f.empty()) t.f.assign(t.numel(), 0.0f);
    }
    Status s = impl.run(k);
    if (!s.isOk())
      return Status::error("stage " + std::to_string(stage_) + " instruction " + std::to_string(k) + " (" +
                           opName(inst) + "), run once at prepare: " + s.message());
    for (int32_t id : inst.results())
      fixed[id] = true;
    hoisted_[k] = true;
  }
  // What a microbatch keeps between its halves: inputs and temporaries,
  // not the results of the moves run here (swapActivations).
  activations_.clear();
  for (const pxe::Buffer &b : stageProto_->buffers())
    if ((b.role() == pxe::INPUT || (b.role() == pxe::TEMPORARY && !fixed[b.id()])) && !isCacheState(b.id()))
      activations_.push_back(b.id());
  return Status::ok();
}

size_t Executor::hoistedInstructions() const {
  return std::count(hoisted_.begin(), hoisted_.end(), true);
}


// Copies this rank's box of every model input into its input buffer; a
// KV cache that steps write in place (cacheStateInputs), given as a shape
// without values, keeps what its buffer holds (zeros at first).
Status Executor::setInputs(const std::vector<Tensor> &inputs) {
  for (const pxe::Buffer &buffer : stageProto_->buffers()) {
    if (buffer.role() != pxe::INPUT)
      continue;
    std::vector<int64_t> shape(buffer.shape().begin(), buffer.shape().end());
    std::vector<int64_t> global(buffer.global_shape().begin(), buffer.global_shape().end());
    bool isInt = buffer.dtype() == pxe::I32 || buffer.dtype() == pxe::I64;
    if (buffer.input_index() < 0 || buffer.input_index() >= static_cast<int>(inputs.size()))
      return Status::error("the executable wants input #" + std::to_string(buffer.input_index()) +
                           " but " + std::to_string(inputs.size()) + " were given");
    const Tensor &in = inputs[buffer.input_index()];
    if (in.shape != global)
      return Status::error("input #" + std::to_string(buffer.input_index()) + " has shape " +
                           in.shapeString() + ", the executable expects " +
                           Tensor{false, global, {}, {}}.shapeString());
    Tensor &t = buffers_[buffer.id()];
    if (!in.hasValues()) {
      if (!isCacheState(buffer.id()))
        return Status::error("input #" + std::to_string(buffer.input_index()) +
                             " has no values (only a KV cache that the steps write may keep its own)");
      if (!t.hasValues()) {
        t = runsElsewhere_ ? Tensor{false, shape, {}, {}} : Tensor::floats(shape);
      }
      continue;
    }
    std::vector<int64_t> start = runtime::boxStart(*exe_, coords_, buffer);
    t = isInt ? Tensor::ints(shape) : Tensor::floats(shape);
    std::vector<int64_t> index(shape.size(), 0), strides(shape.size(), 1);
    for (int64_t d = static_cast<int64_t>(shape.size()) - 2; d >= 0; --d)
      strides[d] = strides[d + 1] * global[d + 1];
    for (int64_t k = 0; k < t.numel(); ++k) {
      int64_t offset = 0;
      for (size_t d = 0; d < shape.size(); ++d)
        offset += (start[d] + index[d]) * strides[d];
      if (isInt)
        t.i[k] = in.isInt ? in.i[offset] : static_cast<int32_t>(in.f[offset]);
      else
        t.f[k] = in.isInt ? static_cast<float>(in.i[offset]) : in.f[offset];
      for (int64_t d = static_cast<int64_t>(shape.size()) - 1; d >= 0; --d) {
        if (++index[d] < shape[d])
          break;
        index[d] = 0;
      }
    }
  }
  return checkInputValues();
}

// Token ids an embedding reads from the inputs must lie inside its
// vocabulary (the global table's rows): the CUDA kernel, which cannot
// report, would give a token outside it a zero embedding. A generation
// step's run-time position must leave room for its tokens (in the cache,
// the attention's keys, the position table): the CUDA kernels rely on it.
Status Executor::checkInputValues() const {
  for (int k : readsCheckedInputs_) {
    const pxe::Instruction &inst = stageProto_->instructions(k);
    auto where = [&] {
      return " (stage " + std::to_string(stage_) + " instruction " + std::to_string(k) + ", " + opName(inst) + ")";
    };
    auto dim = [&](int32_t id, int d) { return stageProto_->buffers(id).shape(d); };
    if (inst.kind() == pxe::OP_EMBEDDING) {
      const pxe::Buffer &ids = stageProto_->buffers(inst.operands(0)), &table = stageProto_->buffers(inst.operands(1));
      const Tensor &values = buffers_[ids.id()];
      if (table.role() != pxe::PARAMETER || table.global_shape_size() != 2 ||
          values.i.size() != static_cast<size_t>(values.numel()))
        continue;
      int64_t vocab = table.global_shape(0);
      for (size_t t = 0; t < values.i.size(); ++t)
        if (values.i[t] < 0 || values.i[t] >= vocab)
          return Status::error("input #" + std::to_string(ids.input_index()) + ": token id " +
                               std::to_string(values.i[t]) + " (element " + std::to_string(t) +
                               " of this rank's part) is outside the vocabulary of " + std::to_string(vocab) +
                               where());
      continue;
    }
    const Tensor &position = buffers_[inst.operands(positionOperand(inst))];
    if (position.i.size() != 1)
      continue; // kept elsewhere (not a host input)
    int64_t at = position.i[0], tokens = 0, room = INT64_MAX;
    std::string what;
    if (at < 0)
      return Status::error("position " + std::to_string(at) + " is negative" + where());
    if (attrFlag(inst.attrs(), "ring") || inst.kind() == pxe::OP_RING_CACHE_UPDATE) {
      // (a ring holds any position)
    } else if (inst.kind() == pxe::OP_CACHE_UPDATE) {
      tokens = dim(inst.operands(1), 1), room = dim(inst.operands(0), 1), what = "a KV cache of";
    } else if (inst.kind() == pxe::OP_ATTENTION) {
      tokens = dim(inst.operands(0), 1), room = dim(inst.operands(1), 1), what = "attention over a KV cache of";
    } else if (inst.kind() == pxe::OP_POSITION_EMBEDDING) { // (rope: its position's sign alone)
      tokens = dim(inst.results(0), 1), room = dim(inst.operands(0), 0), what = "a position table of";
    }
    if (at + tokens > room)
      return Status::error("position " + std::to_string(at) + ": " + std::to_string(tokens) +
                           " token(s) from there do not fit " + what + " " + std::to_string(room) + where());
  }
  return Status::ok();
}

std::vector<std::vector<int64_t>> Executor::inputShapes() const {
  std::vector<std::vector<int64_t>> shapes;
  for (const pxe::Buffer &buffer : stageProto_->buffers())
    if (buffer.role() == pxe::INPUT) {
      if (shapes.size() <= static_cast<size_t>(buffer.input_index()))
        shapes.resize(buffer.input_index() + 1);
      shapes[buffer.input_index()].assign(buffer.global_shape().begin(),
                                          buffer.global_shape().end());
    }
  return shapes;
}

size_t Executor::instructionCount() const {
  return stageProto_ ? stageProto_->instructions_size() : 0;
}

std::vector<Tensor> Executor::outputs() const {
  std::vector<Tensor> out;
  for (int32_t id : stageProto_->outputs()) {
    const Tensor &b = buffers_[id];
    if (!b.hasValues()) { // (a shape only)
      out.push_back(b);
      continue;
    }
    Tensor t = takeSpare(spare_, b.isInt, b.shape);
    std::copy(b.f.begin(), b.f.end(), t.f.begin());
    std::copy(b.i.begin(), b.i.end(), t.i.begin());
    out.push_back(std::move(t));
  }
  return out;
}

Status Executor::swapCacheState(CacheSet &held) {
  for (int32_t id : cacheState_) {
    const pxe::Buffer &mine = stageProto_->buffers(id);
    Tensor &buffer = buffers_[id];
    auto [it, added] = held.try_emplace(mine.input_index());
    if (added) it->second = Tensor::floats(buffer.shape);
    if (it->second.shape != buffer.shape)
      return Status::error("input #" + std::to_string(mine.input_index()) + ": a KV cache " +
                           it->second.shapeString() + " where this program keeps " + buffer.shapeString() +
                           " (plan both programs alike)");
    std::swap(buffer, it->second);
  }
  return Status::ok();
}

bool sameInputBox(const pxe::Buffer &a, const pxe::Buffer &b) {
  auto axes = [](const pxe::AxisList &l) { return std::vector<std::string>(l.axes().begin(), l.axes().end()); };
  if (a.role() != pxe::INPUT || b.role() != pxe::INPUT || a.input_index() != b.input_index() ||
      a.dtype() != b.dtype() || a.shape_size() != b.shape_size() || a.split_size() != b.split_size())
    return false;
  for (int d = 0; d < a.shape_size(); ++d)
    if (a.shape(d) != b.shape(d) || axes(a.split(d)) != axes(b.split(d)))
      return false;
  return true;
}

StatusOr<std::vector<int32_t>> Executor::greedyTokens() const {
  if (stageProto_->outputs_size() == 0)
    return Status::error("greedy tokens: this stage returns nothing");
  const Tensor &logits = buffers_[stageProto_->outputs(0)];
  if (logits.isInt || logits.shape.empty() || logits.f.empty())
    return Status::error("greedy tokens: the first result is not logits [..., vocab]");
  int64_t vocab = logits.shape.back();
  std::vector<int32_t> tokens(logits.numel() / vocab);
  for (size_t r = 0; r < tokens.size(); ++r) {
    const float *row = &logits.f[r * vocab];
    tokens[r] = static_cast<int32_t>(std::max_element(row, row + vocab) - row);
  }
  return tokens;
}

void Executor::releaseHostCopies(bool keepParameters) {
  for (const pxe::Buffer &b : stageProto_->buffers())
    if (b.role() != pxe::INPUT && !(keepParameters && b.role() == pxe::PARAMETER)) {
      Tensor &t = buffers_[b.id()];
      std::vector<float>().swap(t.f);
      std::vector<int32_t>().swap(t.i);
    }
  runsElsewhere_ = true;
}

void Executor::setProfiling(bool on) {
  profiling_ = on;
  if (stageProto_)
    seconds_.resize(stageProto_->instructions_size());
}

Status Executor::run() { return runRange(0, stageProto_ ? stageProto_->instructions_size() : 0); }


void Executor::swapActivations(std::vector<Tensor> &held) {
  bool fresh = held.empty();
  if (fresh)
    held.resize(buffers_.size());
  for (int32_t id : activations_) {
    if (fresh)
      held[id] = buffers_[id].isInt ? Tensor::ints(buffers_[id].shape) : Tensor::floats(buffers_[id].shape);
    std::swap(buffers_[id], held[id]);
  }
}

Status Executor::runRange(int begin, int end) {
  if (runsElsewhere_)
    return Status::error("the host copies of this stage were released: it runs on another backend");
  Impl impl{*this, *exe_};
  Status status = Status::ok();
  for (int k = std::max(begin, 0); k < std::min(end, stageProto_->instructions_size()) && status.isOk(); ++k) {
    if (hoisted_[k])
      continue;
    const pxe::Instruction &inst = stageProto_->instructions(k);
    auto started = std::chrono::steady_clock::now();
    Status s = impl.run(k);
    if (profiling_)
      seconds_[k].push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
    if (s.isOk() && comm_)
      s = comm_->progress(); // sends in flight move while this rank computes
    if (!s.isOk())
      status = Status::error("stage " + std::to_string(stage_) + " instruction " + std::to_string(k) + " (" +
                             opName(inst) + "): " + s.message());
  }
  // Caches that in-place cache_updates lent to their results go back to
  // their input buffers, however the run ended.
  for (auto [cache, result] : impl.lentCaches)
    std::swap(buffers_[cache].f, buffers_[result].f);
  return status;
}

// Each op's CPU kernel, by name: resolved once an instruction at prepare
// (Executor::kernels_), called without comparing names each step.
const Executor::Impl::Entry Executor::Impl::kKernels[] = {
    {"embedding", &Executor::Impl::runEmbedding, 0},
    {"position_embedding", &Executor::Impl::runPositionEmbedding, 0},
    {"linear", &Executor::Impl::runLinear, 0},
    {"head_linear", &Executor::Impl::runHeadLinear, 0},
    {"rms_norm", &Executor::Impl::runRmsNorm, 0},
    {"layer_norm", &Executor::Impl::runRmsNorm, 1},
    {"rope", &Executor::Impl::runRope, 0},
    {"attention", &Executor::Impl::runAttention, 0},
    {"cache_update", &Executor::Impl::runCacheUpdate, 0},
    {"ring_cache_update", &Executor::Impl::runRingCacheUpdate, 0},
    {"add", &Executor::Impl::runAdd, 0},
    {"mul", &Executor::Impl::runAdd, 1},
    {"silu", &Executor::Impl::runSilu, 0},
    {"sigmoid", &Executor::Impl::runSilu, 1},
    {"gelu", &Executor::Impl::runSilu, 2},
    {"softcap", &Executor::Impl::runSoftcap, 0},
    {"swiglu", &Executor::Impl::runSwiglu, 0},
    {"reshape", &Executor::Impl::runReshape, 0},
    {"transpose", &Executor::Impl::runTranspose, 0},
    {"slice", &Executor::Impl::runSlice, 0},
    {"concat", &Executor::Impl::runSlice, 1},
    {"broadcast", &Executor::Impl::runSlice, 2},
    {"balance_loss", &Executor::Impl::runBalanceLoss, 0},
    {"router_aux_grad", &Executor::Impl::runRouterAuxGrad, 0},
    {"router", &Executor::Impl::runRouter, 0},
    {"router_grad", &Executor::Impl::runRouter, 1},
    {"router_load", &Executor::Impl::runRouter, 2},
    {"experts", &Executor::Impl::runExperts, 0},
    {"experts_grad", &Executor::Impl::runExpertsGrad, 0},
    {"cross_entropy", &Executor::Impl::runCrossEntropy, 0},
    {"cross_entropy_grad", &Executor::Impl::runCrossEntropy, 1},
    {"logsumexp", &Executor::Impl::runLogsumexp, 0},
    {"label_count", &Executor::Impl::runLabelCount, 0},
    {"shift", &Executor::Impl::runShift, 0},
    {"linear_weight_grad", &Executor::Impl::runLinearWeightGrad, 0},
    {"rms_norm_grad", &Executor::Impl::runRmsNormGrad, 0},
    {"layer_norm_grad", &Executor::Impl::runRmsNormGrad, 1},
    {"rms_norm_weight_grad", &Executor::Impl::runRmsNormWeightGrad, 0},
    {"layer_norm_weight_grad", &Executor::Impl::runRmsNormWeightGrad, 1},
    {"sum_to", &Executor::Impl::runSumTo, 0},
    {"softcap_grad", &Executor::Impl::runSoftcapGrad, 0},
    {"sigmoid_grad", &Executor::Impl::runSigmoidGrad, 0},
    {"gelu_grad", &Executor::Impl::runGeluGrad, 0},
    {"position_embedding_grad", &Executor::Impl::runPositionEmbeddingGrad, 0},
    {"swiglu_grad", &Executor::Impl::runSwigluGrad, 0},
    {"attention_grad", &Executor::Impl::runAttentionGrad, 0},
    {"embedding_grad", &Executor::Impl::runEmbeddingGrad, 0},
    {"all_reduce", &Executor::Impl::runAllReduce, 0},
    {"shard_slice", &Executor::Impl::runShardSlice, 0},
    {"all_gather", &Executor::Impl::runShardSlice, 1},
    {"reduce_scatter", &Executor::Impl::runShardSlice, 2},
    {"all_to_all", &Executor::Impl::runAllToAll, 0},
    {"to_partial", &Executor::Impl::runToPartial, 0},
    {"send", &Executor::Impl::runSend, 0},
    {"recv", &Executor::Impl::runRecv, 0},
    {"moe_dispatch", &Executor::Impl::runMoeDispatch, 0},
    {"moe_combine", &Executor::Impl::runMoeDispatch, 1},
};

int Executor::Impl::kernelIndex(const std::string &op) {
  static const std::unordered_map<std::string, int> byName = [] {
    std::unordered_map<std::string, int> m;
    for (size_t k = 0; k < std::size(kKernels); ++k) m.emplace(kKernels[k].op, static_cast<int>(k));
    return m;
  }();
  auto found = byName.find(op);
  return found == byName.end() ? -1 : found->second;
}

Status Executor::Impl::run(int k) {
  const pxe::Instruction &inst = e.stageProto_->instructions(k);
  int kernel = k < static_cast<int>(e.kernels_.size()) ? e.kernels_[k] : kernelIndex(opName(inst));
  if (kernel < 0)
    return Status::error("no CPU kernel for '" + opName(inst) + "'");
  const Entry &entry = kKernels[kernel];
  return (this->*entry.run)(inst, entry.variant);
}

Status Executor::Impl::groupOf(const Attrs &a, bool needsComm, Group &group) {
  group.axes = attrStrings(a, "axes");
  Status maskStatus = Status::ok();
  group.mask = axesMask(group.axes, maskStatus);
  if (!maskStatus.isOk()) return maskStatus;
  group.size = groupSizeOf(group.axes);
  return needsComm ? needComm(group.size) : Status::ok();
}

// embedding
Status Executor::Impl::runEmbedding(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &ids = in(0), &table = in(1), &y = out();
  int64_t h = table.shape[1], rows = table.shape[0], offset = 0;
  float scale = static_cast<float>(attrFloat(a, "scale", 1.0)); // (Gemma's sqrt(hidden))
  std::vector<std::string> axes = attrStrings(a, "vocab_axes");
  if (!axes.empty())
    offset = groupIndex(axes) * rows;
  for (int64_t t = 0; t < ids.numel(); ++t) {
    int64_t id = ids.i[t] - offset;
    if (!axes.empty() && (id < 0 || id >= rows)) {
      std::fill(&y.f[t * h], &y.f[t * h] + h, 0.0f);
      continue;
    }
    if (id < 0 || id >= rows)
      return Status::error("token id " + std::to_string(ids.i[t]) + " is outside the vocabulary of " + std::to_string(rows));
    std::copy(&table.f[id * h], &table.f[id * h] + h, &y.f[t * h]);
    if (scale != 1.0f)
      for (int64_t c = 0; c < h; ++c) y.f[t * h + c] *= scale;
  }
  return Status::ok();
}

// position_embedding
Status Executor::Impl::runPositionEmbedding(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &table = in(0), &y = out();
  int64_t s = y.shape[1], h = y.shape[2];
  // Rows offset + position(i) (a rank's positions of the sequence), or
  // from a run-time position.
  SequenceRows rows = inst.operands_size() == 2 ? SequenceRows{in(1).i[0], 1, 1} : rowsOf(a, s);
  int64_t offset = inst.operands_size() == 2 ? 0 : attrInt(a, "offset");
  int64_t last = offset + rows.position(s - 1);
  if (offset + rows.start < 0 || last >= table.shape[0])
    return Status::error("positions " + std::to_string(offset + rows.start) + " .. " + std::to_string(last) +
                         " exceed the table's " + std::to_string(table.shape[0]) + " rows");
  for (int64_t i = 0; i < s; ++i)
    std::copy(&table.f[(offset + rows.position(i)) * h], &table.f[(offset + rows.position(i) + 1) * h],
              &y.f[i * h]);
  return Status::ok();
}

// linear
Status Executor::Impl::runLinear(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &w = in(1), &y = out();
  bool t = attrFlag(a, "transpose_w");
  auto [m, k] = rowsCols(x);
  int64_t n = y.shape.back();
  if (m == 1) // one row (a decode step of one sequence): a GEMV reads W without packing it
    cblas_sgemv(CblasRowMajor, t ? CblasNoTrans : CblasTrans, t ? n : k, t ? k : n, 1.0f, w.f.data(),
                t ? k : n, x.f.data(), 1, 0.0f, y.f.data(), 1);
  else if (!t || !fewRowsTimesTransposed(m, n, k, x.f.data(), w.f.data(), y.f.data())) // (a few rows: the weight read once)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, t ? CblasTrans : CblasNoTrans, m, n, k,
                1.0f, x.f.data(), k, w.f.data(), t ? k : n, 0.0f, y.f.data(), n);
  if (inst.operands_size() == 3) {
    Tensor &bias = in(2);
    for (int64_t r = 0; r < m; ++r)
      for (int64_t c = 0; c < n; ++c)
        y.f[r * n + c] += bias.f[c];
  }
  return Status::ok();
}

// head_linear
Status Executor::Impl::runHeadLinear(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  // Head g of every row through W[g]: one GEMM a head, its rows G * in apart.
  Tensor &x = in(0), &w = in(1), &y = out();
  bool t = attrFlag(a, "transpose_w");
  int64_t g = x.shape[x.shape.size() - 2], k = x.shape.back(), n = y.shape.back(), m = x.numel() / (g * k);
  for (int64_t h = 0; h < g; ++h)
    cblas_sgemm(CblasRowMajor, CblasNoTrans, t ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, x.f.data() + h * k,
                g * k, w.f.data() + h * k * n, t ? k : n, 0.0f, y.f.data() + h * n, g * n);
  return Status::ok();
}

// rms_norm, layer_norm
Status Executor::Impl::runRmsNorm(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &w = in(1), &y = out();
  auto [rows, h] = rowsCols(x);
  double eps = attrFloat(a, "eps");
  float offset = static_cast<float>(attrFloat(a, "offset")); // (Gemma's 1 + w)
  bool layer = variant == 1;
  const float *bias = layer ? in(2).f.data() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const float *xr = &x.f[r * h];
    float *yr = &y.f[r * h];
    double mean = 0, var = 0;
    if (layer) {
      for (int64_t c = 0; c < h; ++c) mean += xr[c];
      mean /= h;
    }
    for (int64_t c = 0; c < h; ++c) var += (xr[c] - mean) * (xr[c] - mean);
    var /= h;
    float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
    float centre = static_cast<float>(mean);
    for (int64_t c = 0; c < h; ++c)
      yr[c] = (xr[c] - centre) * inv * (w.f[c] + offset) + (bias ? bias[c] : 0.0f);
  }
  return Status::ok();
}

// rope
Status Executor::Impl::runRope(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &y = out();
  int64_t B = x.shape[0], S = x.shape[1], H = x.shape[2], D = x.shape[3];
  int64_t rot = attrInt(a, "rotary_dim");
  // Row s at position offset + position(s) (a rank's positions of the
  // sequence), or from a run-time position.
  SequenceRows rows = inst.operands_size() == 2 ? SequenceRows{in(1).i[0], 1, 1} : rowsOf(a, S);
  int64_t offset = inst.operands_size() == 2 ? 0 : attrInt(a, "position_offset");
  bool interleaved = attrFlag(a, "interleaved"), inverse = attrFlag(a, "inverse");
  StatusOr<std::vector<double>> frequencies = ropeInverseFrequencies(a);
  if (!frequencies.isOk())
    return frequencies.status();
  const std::vector<double> &invFreq = frequencies.value();
  double factor = ropeRotatedFactor(a); // (the rotated channels', LongRoPE's on a partial rotary)
  y.f = x.f;
  // A position's cos and sin, computed once for its heads (and rows).
  std::vector<float> cosines(rot / 2), sines(rot / 2);
  for (int64_t s = 0; s < S; ++s) {
    for (int64_t i = 0; i < rot / 2; ++i) {
      double angle = static_cast<double>(offset + rows.position(s)) * invFreq[i];
      cosines[i] = static_cast<float>(factor * std::cos(angle));
      sines[i] = static_cast<float>(factor * (inverse ? -std::sin(angle) : std::sin(angle)));
    }
    for (int64_t bb = 0; bb < B; ++bb)
      for (int64_t h = 0; h < H; ++h) {
        float *v = &y.f[((bb * S + s) * H + h) * D];
        for (int64_t i = 0; i < rot / 2; ++i) {
          int64_t p = interleaved ? 2 * i : i, q = interleaved ? 2 * i + 1 : i + rot / 2;
          float x0 = v[p], x1 = v[q], c = cosines[i], sn = sines[i];
          v[p] = x0 * c - x1 * sn;
          v[q] = x1 * c + x0 * sn;
        }
      }
  }
  return Status::ok();
}

// attention
Status Executor::Impl::runAttention(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &q = in(0), &k = in(1), &v = in(2), &y = out();
  int64_t B = q.shape[0], S = q.shape[1], H = q.shape[2], D = q.shape[3];
  // The values: v's first DV channels of its VW (all of them, unless value_dim).
  int64_t T = k.shape[1], KH = k.shape[2], DV = y.shape[3], VW = v.shape[3];
  StatusOr<AttentionGeometry> geometry = attentionGeometry(inst, q, k);
  if (!geometry.isOk())
    return geometry.status();
  const AttentionGeometry &geo = geometry.value();
  float scale = geo.scale;
  const auto &visibleOf = geo.visible;
  int64_t headOffset = geo.headOffset, group = geo.group;
  // Blocks of a head's queries: scores = scale * Q K^T over the keys the
  // block's last query sees (sgemm), masked and normalised row by row
  // (sums in double), then Y = P V (sgemm). Rows of q and y are strided
  // by the heads, those of k and v by the KV heads.
  constexpr int64_t kBlock = 64;
  std::vector<float> scores(std::min(kBlock, S) * T);
  for (int64_t bb = 0; bb < B; ++bb)
    for (int64_t h = 0; h < H; ++h) {
      int64_t kh = (headOffset + h) / group;
      const float *keys = &k.f[(bb * T * KH + kh) * D], *values = &v.f[(bb * T * KH + kh) * VW];
      for (int64_t s0 = 0; s0 < S; s0 += kBlock) {
        int64_t block = std::min(kBlock, S - s0);
        int64_t seen = visibleOf(s0 + block - 1); // by the block's last query
        float *yBlock = &y.f[((bb * S + s0) * H + h) * DV];
        if (seen <= 0) { // (no key: a program the validator lets through has one)
          for (int64_t r = 0; r < block; ++r) std::fill(yBlock + r * H * DV, yBlock + r * H * DV + DV, 0.0f);
          continue;
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, block, seen, D, scale, &q.f[((bb * S + s0) * H + h) * D],
                    H * D, keys, KH * D, 0.0f, scores.data(), seen);
        for (int64_t r = 0; r < block; ++r) {
          float *row = &scores[r * seen];
          int64_t visible = visibleOf(s0 + r), first = geo.first(s0 + r);
          geo.capScores(row + first, visible - first);
          if (visible > first) softmax(row + first, visible - first);
          std::fill(row, row + first, 0.0f);
          std::fill(row + visible, row + seen, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, block, DV, seen, 1.0f, scores.data(), seen, values,
                    KH * VW, 0.0f, yBlock, H * DV);
      }
    }
  return Status::ok();
}

// cache_update
Status Executor::Impl::runCacheUpdate(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  // In place when the cache is an input only this reads (a generation
  // loop's state: the buffer then holds the updated cache), then copied.
  Tensor &cache = in(0), &update = in(1), &y = out();
  int64_t C = cache.shape[1], S = update.shape[1], at = in(2).i[0];
  if (at < 0 || at + S > C)
    return Status::error("position " + std::to_string(at) + ": " + std::to_string(S) +
                         " new row(s) do not fit the cache of " + std::to_string(C));
  Tensor &target = cacheTarget(inst, cache, y);
  int64_t row = cache.shape[2] * cache.shape[3];
  for (int64_t bb = 0; bb < cache.shape[0]; ++bb)
    std::copy(&update.f[bb * S * row], &update.f[(bb + 1) * S * row], &target.f[(bb * C + at) * row]);
  if (&target == &cache) lendCache(inst, cache, y, 0);
  return Status::ok();
}

Tensor &Executor::Impl::cacheTarget(const pxe::Instruction &inst, Tensor &cache, Tensor &y) {
  if (e.isCacheState(inst.operands(0))) return cache;
  y.f = cache.f;
  return y;
}

void Executor::Impl::lendCache(const pxe::Instruction &inst, Tensor &cache, Tensor &y, int result) {
  // The result takes the cache's storage for the rest of the run (no copy
  // of the whole cache a step); run() hands it back. A result the stage
  // outputs must outlive the run, so it gets a copy.
  const auto &outputs = e.stageProto_->outputs();
  if (std::find(outputs.begin(), outputs.end(), inst.results(result)) != outputs.end()) {
    y.f = cache.f;
  } else {
    std::swap(y.f, cache.f);
    lentCaches.emplace_back(inst.operands(0), inst.results(result));
  }
}

// ring_cache_update: the window (the ring's tokens at positions p - C ..
// p - 1, row t mod C holding position t, oldest first, then the update's
// rows), then the update written into the ring (its last C rows), in place
// as cache_update's.
Status Executor::Impl::runRingCacheUpdate(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &ring = in(0), &update = in(1), &window = out(0), &y = out(1);
  int64_t C = ring.shape[1], S = update.shape[1], at = in(2).i[0];
  if (at < 0) return Status::error("position " + std::to_string(at) + " is negative");
  int64_t row = ring.shape[2] * ring.shape[3];
  auto rowOf = [row](std::vector<float> &t, int64_t r) { return t.begin() + r * row; };
  for (int64_t bb = 0; bb < ring.shape[0]; ++bb) {
    for (int64_t r = 0; r < C; ++r) { // (negative positions: a row no query sees)
      int64_t slot = ((at - C + r) % C + C) % C;
      std::copy(rowOf(ring.f, bb * C + slot), rowOf(ring.f, bb * C + slot + 1), rowOf(window.f, bb * (C + S) + r));
    }
    std::copy(rowOf(update.f, bb * S), rowOf(update.f, (bb + 1) * S), rowOf(window.f, bb * (C + S) + C));
  }
  Tensor &target = cacheTarget(inst, ring, y);
  for (int64_t bb = 0; bb < ring.shape[0]; ++bb)
    for (int64_t i = std::max<int64_t>(0, S - C); i < S; ++i)
      std::copy(rowOf(update.f, bb * S + i), rowOf(update.f, bb * S + i + 1), rowOf(target.f, bb * C + (at + i) % C));
  if (&target == &ring) lendCache(inst, ring, y, 1);
  return Status::ok();
}

// add, mul
Status Executor::Impl::runAdd(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &l = in(0), &r = in(1), &y = out();
  bool add = variant == 0;
  int64_t n = y.numel();
  float *to = y.f.data();
  // Operands of the result's shape (a residual add, SwiGLU's product) or
  // holding its trailing dimensions (a bias) read by a flat index; any
  // other broadcast through broadcastIndex.
  auto trailing = [&](const Tensor &t) { // 1s, then the result's dimensions
    if (t.shape.size() != y.shape.size() || t.numel() == 0)
      return false;
    size_t d = 0;
    while (d < t.shape.size() && t.shape[d] == 1)
      ++d;
    return std::equal(t.shape.begin() + d, t.shape.end(), y.shape.begin() + d);
  };
  if (trailing(l) && trailing(r)) {
    const float *x = l.f.data(), *z = r.f.data();
    int64_t nx = l.numel(), nz = r.numel();
    if (nx == n && nz == n) {
      if (add) for (int64_t k = 0; k < n; ++k) to[k] = x[k] + z[k];
      else for (int64_t k = 0; k < n; ++k) to[k] = x[k] * z[k];
    } else {
      for (int64_t base = 0; base < n; base += std::min(nx, nz)) { // rows of the smaller one
        int64_t row = std::min(nx, nz);
        const float *xr = x + (nx == n ? base : base % nx), *zr = z + (nz == n ? base : base % nz);
        if (add) for (int64_t k = 0; k < row; ++k) to[base + k] = xr[k] + zr[k];
        else for (int64_t k = 0; k < row; ++k) to[base + k] = xr[k] * zr[k];
      }
    }
    return Status::ok();
  }
  for (int64_t k = 0; k < n; ++k) {
    float x = l.f[broadcastIndex(l, y, k)], z = r.f[broadcastIndex(r, y, k)];
    to[k] = add ? x + z : x * z;
  }
  return Status::ok();
}

// silu, sigmoid, gelu
Status Executor::Impl::runSilu(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &y = out();
  if (variant == 0) { // silu
    siluTimes(x.f.data(), nullptr, y.f.data(), x.numel());
    return Status::ok();
  }
  bool tanhApprox = attrString(a, "approximate") == "tanh";
  for (int64_t k = 0; k < x.numel(); ++k) {
    float v = x.f[k];
    if (variant == 1)
      y.f[k] = 1.0f / (1.0f + std::exp(-v));
    else if (tanhApprox)
      y.f[k] = 0.5f * v * (1.0f + std::tanh(0.7978845608028654f * (v + 0.044715f * v * v * v)));
    else
      y.f[k] = 0.5f * v * (1.0f + std::erf(v * 0.7071067811865476f));
  }
  return Status::ok();
}

// softcap
Status Executor::Impl::runSoftcap(const pxe::Instruction &inst, int) {
  // cap · tanh(x / cap) (Gemma 2's logits)
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &y = out();
  double cap = attrFloat(a, "cap");
  for (int64_t k = 0; k < x.numel(); ++k) y.f[k] = static_cast<float>(cap * std::tanh(x.f[k] / cap));
  return Status::ok();
}

// swiglu
Status Executor::Impl::runSwiglu(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &g = in(0), &u = in(1), &y = out();
  siluTimes(g.f.data(), u.f.data(), y.f.data(), g.numel());
  return Status::ok();
}

// reshape
Status Executor::Impl::runReshape(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  out().f = in(0).f;
  out().i = in(0).i;
  return Status::ok();
}

// transpose
Status Executor::Impl::runTranspose(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &y = out();
  auto it = a.find("permutation");
  if (it == a.end()) return Status::error("transpose without permutation");
  std::vector<int64_t> perm(it->second.ints().values().begin(), it->second.ints().values().end());
  int rank = x.shape.size();
  std::vector<int64_t> xs(rank, 1);
  for (int d = rank - 2; d >= 0; --d) xs[d] = xs[d + 1] * x.shape[d + 1];
  std::vector<int64_t> index(rank, 0);
  for (int64_t k = 0; k < y.numel(); ++k) {
    int64_t offset = 0;
    for (int d = 0; d < rank; ++d) offset += index[d] * xs[perm[d]];
    y.f[k] = x.f[offset];
    for (int d = rank - 1; d >= 0; --d) {
      if (++index[d] < y.shape[d]) break;
      index[d] = 0;
    }
  }
  return Status::ok();
}

// slice, concat, broadcast
Status Executor::Impl::runSlice(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &y = out();
  if (variant == 2) {
    Tensor &x = in(0);
    for (int64_t k = 0; k < y.numel(); ++k) y.f[k] = x.f[broadcastIndex(x, y, k)];
    return Status::ok();
  }
  int dim = static_cast<int>(attrInt(a, "dim"));
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < dim; ++d) outer *= y.shape[d];
  for (size_t d = dim + 1; d < y.shape.size(); ++d) inner *= y.shape[d];
  if (variant == 0) {
    Tensor &x = in(0);
    int64_t start = attrInt(a, "start"), len = x.shape[dim], n = y.shape[dim];
    for (int64_t o = 0; o < outer; ++o)
      std::copy(&x.f[(o * len + start) * inner], &x.f[(o * len + start + n) * inner],
                &y.f[o * n * inner]);
    return Status::ok();
  }
  int64_t total = y.shape[dim], at = 0;
  for (int k = 0; k < inst.operands_size(); ++k) {
    Tensor &x = in(k);
    int64_t n = x.shape[dim];
    for (int64_t o = 0; o < outer; ++o)
      std::copy(&x.f[o * n * inner], &x.f[(o + 1) * n * inner], &y.f[(o * total + at) * inner]);
    at += n;
  }
  return Status::ok();
}

// balance_loss
Status Executor::Impl::runBalanceLoss(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  out().f.assign(1, static_cast<float>(
                        balanceLoss(in(0), in(1), attrFloat(a, "coefficient"), attrInt(a, "num_tokens"),
                                    attrInt(a, "num_sequences", 1))));
  return Status::ok();
}

// router_aux_grad
Status Executor::Impl::runRouterAuxGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  routerAuxGrad(in(0), in(1), in(2), attrString(a, "score_func") == "sigmoid", attrFloat(a, "coefficient"),
                attrInt(a, "num_tokens"), attrInt(a, "num_sequences", 1), out());
  return Status::ok();
}

// router, router_grad, router_load
Status Executor::Impl::runRouter(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Routing routing;
  routing.topK = attrInt(a, "top_k");
  routing.groups = attrInt(a, "num_groups", 1);
  routing.topkGroups = attrInt(a, "topk_groups", 1);
  routing.sigmoid = attrString(a, "score_func") == "sigmoid";
  routing.normalize = attrFlag(a, "normalize");
  routing.scaling = attrFloat(a, "scaling_factor", 1.0);
  if (variant == 0) {
    router(in(0), in(1), inst.operands_size() == 3 ? &in(2) : nullptr, routing, out(0), out(1));
    if (inst.operands_size() == 3) { // a correction bias: its experts' choices counted
      std::vector<double> &counts = e.expertCounts_[inst.operands(2)];
      counts.resize(in(2).numel());
      for (int32_t expert : out(1).i)
        if (expert >= 0 && expert < static_cast<int32_t>(counts.size())) counts[expert] += 1;
    }
  }
  else if (variant == 2)
    routerLoad(in(0), in(1), inst.operands_size() == 3 ? &in(2) : nullptr, routing, attrFlag(a, "scores"), out());
  else
    routerGrad(in(0), in(1), inst.operands_size() == 4 ? &in(3) : nullptr, in(2), routing, out());
  return Status::ok();
}

// experts
Status Executor::Impl::runExperts(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  experts(in(0), in(1), in(2), in(3), in(4), in(5), out());
  return Status::ok();
}

// experts_grad
Status Executor::Impl::runExpertsGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  expertsGrad(in(0), in(1), in(2), in(3), in(4), in(5), in(6), out(0), out(1), out(2), out(3), out(4));
  return Status::ok();
}

// cross_entropy, cross_entropy_grad
Status Executor::Impl::runCrossEntropy(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  const std::string &op = opName(inst); // (for messages)
  // After the labels: label_count's count (rank 0), then a vocab-parallel
  // op's lse (this rank's logits the vocabulary's columns offset ..).
  Tensor &logits = in(0), &labels = in(1);
  const Tensor *count = nullptr, *lse = nullptr;
  for (int k = 2; k < inst.operands_size(); ++k)
    (in(k).shape.empty() ? count : lse) = &in(k);
  std::vector<std::string> vocabAxes = attrStrings(a, "vocab_axes");
  auto [tokens, V] = rowsCols(logits);
  int64_t offset = lse ? groupIndex(vocabAxes) * V : 0;
  CountedLabels counted = countedLabels(a, labels, count);
  if (Status st = counted.check(lse ? V * groupSizeOf(vocabAxes) : V); !st.isOk()) return st;
  if (variant == 1) {
    crossEntropyGrad(logits, labels, counted.divisor, counted.ignore, out(), lse, offset);
    return Status::ok();
  }
  double total = 0;
  for (int64_t t = 0; t < tokens; ++t) {
    int64_t label = labels.i[t];
    if (counted.ignore && label == *counted.ignore) continue;
    const float *l = &logits.f[t * V];
    if (lse) { // the term of a label this rank holds
      if (label >= offset && label < offset + V) total += lse->f[t] - l[label - offset];
      continue;
    }
    total += rowExp(l, V).logSumExp() - l[label];
  }
  out().f[0] = static_cast<float>(total / counted.divisor); // (a rank's part of the mean)
  return Status::ok();
}

// logsumexp
Status Executor::Impl::runLogsumexp(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  auto [rows, n] = rowsCols(in(0));
  for (int64_t r = 0; r < rows; ++r) {
    RowExp row = rowExp(&in(0).f[r * n], n);
    out().f[r] = static_cast<float>(std::isinf(row.max) ? row.max : row.logSumExp());
  }
  return Status::ok();
}

// label_count
Status Executor::Impl::runLabelCount(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  int32_t ignore = static_cast<int32_t>(attrInt(a, "ignore_index"));
  out().f.assign(1, e.labelCount_ ? *e.labelCount_
                                  : static_cast<float>(std::count_if(in(0).i.begin(), in(0).i.end(),
                                                                     [&](int32_t label) { return label != ignore; })));
  return Status::ok();
}

// shift
Status Executor::Impl::runShift(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  const Tensor &x = in(0);
  int64_t S = x.shape[1], shift = attrInt(a, "shift");
  auto fill = static_cast<int32_t>(attrInt(a, "fill"));
  Tensor &y = out();
  for (int64_t r = 0; r < x.shape[0]; ++r)
    for (int64_t s = 0; s < S; ++s)
      y.i[r * S + s] = s + shift < S ? x.i[r * S + s + shift] : fill;
  return Status::ok();
}

// linear_weight_grad
Status Executor::Impl::runLinearWeightGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  linearWeightGrad(in(0), in(1), attrFlag(a, "transpose_w"), out());
  return Status::ok();
}

// rms_norm_grad, layer_norm_grad
Status Executor::Impl::runRmsNormGrad(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  normGrad(in(0), in(1), in(2), attrFloat(a, "eps"), variant == 1, out(), attrFloat(a, "offset"));
  return Status::ok();
}

// rms_norm_weight_grad, layer_norm_weight_grad
Status Executor::Impl::runRmsNormWeightGrad(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  normWeightGrad(in(0), in(1), attrFloat(a, "eps"), variant == 1, out());
  return Status::ok();
}

// sum_to
Status Executor::Impl::runSumTo(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  sumTo(in(0), out());
  return Status::ok();
}

// softcap_grad
Status Executor::Impl::runSoftcapGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &dy = in(1), &dx = out();
  double cap = attrFloat(a, "cap");
  for (int64_t k = 0; k < x.numel(); ++k) {
    double t = std::tanh(x.f[k] / cap);
    dx.f[k] = static_cast<float>(dy.f[k] * (1 - t * t));
  }
  return Status::ok();
}

// sigmoid_grad
Status Executor::Impl::runSigmoidGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &x = in(0), &dy = in(1), &dx = out();
  for (int64_t k = 0; k < x.numel(); ++k) {
    float s = 1.0f / (1.0f + std::exp(-x.f[k]));
    dx.f[k] = dy.f[k] * s * (1.0f - s);
  }
  return Status::ok();
}

// gelu_grad
Status Executor::Impl::runGeluGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  geluGrad(in(0), in(1), attrString(a, "approximate") == "tanh", out());
  return Status::ok();
}

// position_embedding_grad
Status Executor::Impl::runPositionEmbeddingGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &dy = in(0), &table = out();
  int64_t s = dy.shape[1], h = dy.shape[2];
  SequenceRows rows = rowsOf(a, s); // (the validator keeps them inside the table)
  int64_t offset = attrInt(a, "offset");
  std::fill(table.f.begin(), table.f.end(), 0.0f);
  for (int64_t i = 0; i < s; ++i)
    std::copy(&dy.f[i * h], &dy.f[(i + 1) * h], &table.f[(offset + rows.position(i)) * h]);
  return Status::ok();
}

// swiglu_grad
Status Executor::Impl::runSwigluGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  swigluGrad(in(0), in(1), in(2), static_cast<int>(attrInt(a, "operand")), out());
  return Status::ok();
}

// attention_grad
Status Executor::Impl::runAttentionGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  StatusOr<AttentionGeometry> geometry = attentionGeometry(inst, in(0), in(1));
  if (!geometry.isOk())
    return geometry.status();
  attentionGrad(in(0), in(1), in(2), in(3), geometry.value(), out(0), out(1), out(2));
  return Status::ok();
}

// embedding_grad
Status Executor::Impl::runEmbeddingGrad(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Tensor &ids = in(0), &table = out();
  std::vector<std::string> axes = attrStrings(a, "vocab_axes");
  int64_t offset = axes.empty() ? 0 : groupIndex(axes) * table.shape[0];
  if (axes.empty())
    for (int32_t id : ids.i)
      if (id < 0 || id >= table.shape[0])
        return Status::error("token id " + std::to_string(id) + " is outside the vocabulary of " +
                             std::to_string(table.shape[0]));
  embeddingGrad(ids, in(1), offset, table, static_cast<float>(attrFloat(a, "scale", 1.0)));
  return Status::ok();
}

// all_reduce
Status Executor::Impl::runAllReduce(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Group g;
  if (Status s = groupOf(a, true, g); !s.isOk())
    return s;
  out().f = in(0).f;
  return g.size == 1 ? Status::ok() : e.comm_->allReduce(out().f.data(), out().f.size(), g.mask);
}

// shard_slice, all_gather, reduce_scatter
Status Executor::Impl::runShardSlice(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  // (shard_slice only needs this rank's place in the group)
  Group g;
  if (Status s = groupOf(a, variant != 0, g); !s.isOk())
    return s;
  int dim = static_cast<int>(attrInt(a, "dim"));
  Tensor &x = in(0), &y = out();
  if (variant == 0) {
    int64_t index = groupIndex(g.axes), n = y.numel();
    auto keep = [&](const auto &values, auto &into) {
      auto pieces = piecesAlong(x, values, dim, g.size);
      std::copy(pieces.begin() + index * n, pieces.begin() + (index + 1) * n, into.begin());
    };
    if (x.isInt)
      keep(x.i, y.i); // (labels dealt out)
    else
      keep(x.f, y.f);
    return Status::ok();
  }
  if (variant == 1) {
    // (scratch kept between steps: a prefill's gathered logits are tens
    // of MB, faulted in and zeroed afresh each step before)
    // Along the outermost dimension that is not 1 the pieces are the
    // result's layout: gathered straight into it.
    bool inPlace = std::all_of(y.shape.begin(), y.shape.begin() + dim, [](int64_t d) { return d == 1; });
    std::vector<float> &pieces = inPlace ? y.f : e.gatherScratch_;
    pieces.resize(x.numel() * g.size);
    Status s = g.size == 1 ? (pieces = x.f, Status::ok())
                      : e.comm_->allGather(x.f.data(), x.numel(), pieces.data(), g.mask);
    if (!s.isOk()) return s;
    if (!inPlace) joinAlong(pieces, dim, g.size, y);
    return Status::ok();
  }
  if (g.size == 1) { y.f = piecesAlong(x, x.f, dim, g.size); return Status::ok(); }
  // (likewise: along the outermost dimension not 1, x is its pieces)
  if (std::all_of(x.shape.begin(), x.shape.begin() + dim, [](int64_t d) { return d == 1; }))
    return e.comm_->reduceScatter(x.f.data(), y.f.data(), y.numel(), g.mask);
  std::vector<float> pieces = piecesAlong(x, x.f, dim, g.size);
  return e.comm_->reduceScatter(pieces.data(), y.f.data(), y.numel(), g.mask);
}

// all_to_all
Status Executor::Impl::runAllToAll(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Group g;
  if (Status s = groupOf(a, true, g); !s.isOk())
    return s;
  int split = static_cast<int>(attrInt(a, "split_dim")), concat = static_cast<int>(attrInt(a, "concat_dim"));
  Tensor &x = in(0), &y = out();
  std::vector<float> pieces = piecesAlong(x, x.f, split, g.size), received(pieces.size());
  Status s = g.size == 1 ? (received = pieces, Status::ok())
                    : e.comm_->allToAll(pieces.data(), received.data(), x.numel() / g.size, g.mask);
  if (!s.isOk()) return s;
  joinAlong(received, concat, g.size, y);
  return Status::ok();
}

// to_partial
Status Executor::Impl::runToPartial(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Group g;
  if (Status s = groupOf(a, false, g); !s.isOk())
    return s;
  out().f = in(0).f;
  if (groupIndex(g.axes) != 0) std::fill(out().f.begin(), out().f.end(), 0.0f);
  return Status::ok();
}

// send
Status Executor::Impl::runSend(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Group g;
  if (Status s = groupOf(a, true, g); !s.isOk())
    return s;
  return e.comm_->send(in(0).f.data(), in(0).numel(), peerRank(g.axes.at(0), attrInt(a, "peer")));
}

// recv
Status Executor::Impl::runRecv(const pxe::Instruction &inst, int) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  Group g;
  if (Status s = groupOf(a, true, g); !s.isOk())
    return s;
  return e.comm_->recv(out().f.data(), out().numel(), peerRank(g.axes.at(0), attrInt(a, "peer")));
}

// moe_dispatch, moe_combine
Status Executor::Impl::runMoeDispatch(const pxe::Instruction &inst, int variant) {
  [[maybe_unused]] auto [a, in, out] = io(inst);
  const std::string &op = opName(inst); // (for messages)
  Group g;
  if (Status s = groupOf(a, true, g); !s.isOk())
    return s;
  int64_t E = attrInt(a, "num_experts"), local = E / g.size;
  Tensor &idx = in(variant == 0 ? 2 : 1);
  int64_t pairs = idx.numel(), K = idx.shape.back();
  // This rank's (token, choice) pairs leave grouped by the member owning
  // their expert, in order; the members' counts, all-gathered, size each
  // block (an all-to-all of the routed rows only).
  if (pairs >= (int64_t(1) << 24)) // (the counts travel as floats)
    return Status::error(op + ": more than 2^24 (token, choice) pairs on a rank");
  std::vector<float> counts(g.size, 0.0f), all(g.size * g.size);
  for (int64_t k = 0; k < pairs; ++k) {
    if (idx.i[k] < 0 || idx.i[k] >= E)
      return Status::error(op + ": (token, choice) pair " + std::to_string(k) + " chose expert " +
                           std::to_string(idx.i[k]) + ", outside the " + std::to_string(E) + " experts");
    counts[idx.i[k] / local] += 1;
  }
  Status s = g.size == 1 ? (all = counts, Status::ok()) : e.comm_->allGather(counts.data(), g.size, all.data(), g.mask);
  if (!s.isOk()) return s;
  const int64_t me = groupIndex(g.axes);
  const int64_t capacity = (variant == 0 ? out(0) : in(0)).shape[0];
  if (g.size > 1 && variant == 0)
    e.busiestExpertLoad_ = std::max(e.busiestExpertLoad_, busiestRankLoad(all, g.size, pairs));
  if (Status full = expertCapacityCheck(op, all, g.size, capacity); !full.isOk()) return full;
  // Where each of this rank's pairs sits among the rows it sends.
  std::vector<int64_t> sendAt(g.size, 0), at(pairs);
  for (int64_t d = 1; d < g.size; ++d) sendAt[d] = sendAt[d - 1] + static_cast<int64_t>(all[me * g.size + d - 1]);
  for (int64_t k = 0; k < pairs; ++k) at[k] = sendAt[idx.i[k] / local]++;
  auto sizes = [&](int64_t width, bool toMembers) { return exchangeBlocks(all, g.size, me, width, toMembers); };
  const int64_t received = routedTo(all, g.size, me); // rows that arrive here
  if (variant == 0) {
    // Rows [h features, weight, local expert] go out; they arrive block
    // after block (member 0's first) at the top of the results, the rest
    // unused (expert -1).
    Tensor &x = in(0), &w = in(1), &rows = out(0), &rw = out(1), &re = out(2);
    int64_t h = x.shape.back(), width = h + 2;
    std::vector<float> sendBuf(pairs * width), recvBuf(received * width);
    for (int64_t k = 0; k < pairs; ++k) {
      float *row = &sendBuf[at[k] * width];
      std::copy(&x.f[(k / K) * h], &x.f[(k / K) * h] + h, row);
      row[h] = w.f[k];
      row[h + 1] = static_cast<float>(idx.i[k] % local);
    }
    s = g.size == 1 ? (recvBuf = sendBuf, Status::ok())
               : e.comm_->allToAllv(sendBuf.data(), sizes(width, true), recvBuf.data(), sizes(width, false), g.mask);
    if (!s.isOk()) return s;
    std::fill(rows.f.begin(), rows.f.end(), 0.0f);
    std::fill(rw.f.begin(), rw.f.end(), 0.0f);
    std::fill(re.i.begin(), re.i.end(), -1);
    for (int64_t r = 0; r < received; ++r) {
      const float *row = &recvBuf[r * width];
      std::copy(row, row + h, &rows.f[r * h]);
      rw.f[r] = row[h];
      re.i[r] = static_cast<int32_t>(row[h + 1]);
    }
    return Status::ok();
  }
  // The rows that arrived go back to their members, as they came.
  Tensor &rows = in(0), &y = out();
  int64_t h = rows.shape.back();
  std::vector<float> back(pairs * h);
  s = g.size == 1 ? (std::copy(rows.f.begin(), rows.f.begin() + received * h, back.begin()), Status::ok())
             : e.comm_->allToAllv(rows.f.data(), sizes(h, false), back.data(), sizes(h, true), g.mask);
  if (!s.isOk()) return s;
  // Each pair's row back in its place, summed per token (or, per_choice,
  // kept per pair).
  std::fill(y.f.begin(), y.f.end(), 0.0f);
  int64_t perRow = attrFlag(a, "per_choice") ? 1 : K;
  for (int64_t k = 0; k < pairs; ++k)
    for (int64_t c = 0; c < h; ++c) y.f[(k / perRow) * h + c] += back[at[k] * h + c];
  return Status::ok();
}

} // namespace parax::runtime
