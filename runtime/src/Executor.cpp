// Executor.cpp - the CPU executor: buffers placed and weights read at
// prepare, each instruction's kernel resolved once (kKernels), then the
// instruction loop. The kernels (fp32; oneDNN's sgemm for matmuls, Gemm.h), one
// file an op family, are in runtime/src/kernels/; their semantics follow the
// parax op descriptions (docs/dialect/ParaxDialect.md).

#include "ExecutorImpl.h"

#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <fstream>

namespace parax::runtime {

namespace {

// Whether `inst` only moves data (copies, cuts, lays out, zeroes).
bool movesData(const pxe::Instruction &inst) {
  static const char *const moves[] = {"slice",     "shard_slice", "to_partial", "reshape",
                                      "transpose", "broadcast",   "concat",     "position_embedding"};
  return std::find(std::begin(moves), std::end(moves), opName(inst)) != std::end(moves);
}

} // namespace

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
  // Outputs that every run writes afresh (a temporary no cache update
  // writes, not a move run once here, named once among the outputs) are
  // handed over by outputs() rather than copied.
  handedOver_.assign(stageProto_->buffers_size(), false);
  std::vector<int> named(stageProto_->buffers_size(), 0), written(stageProto_->buffers_size(), 0);
  for (int32_t id : stageProto_->outputs()) ++named[id];
  for (const pxe::Instruction &inst : stageProto_->instructions()) {
    bool inPlace = inst.kind() == pxe::OP_CACHE_UPDATE || inst.kind() == pxe::OP_RING_CACHE_UPDATE;
    for (int32_t id : inst.results()) written[id] += inPlace ? 2 : 1;
  }
  for (const pxe::Buffer &b : stageProto_->buffers())
    handedOver_[b.id()] = !runsElsewhere_ && b.role() == pxe::TEMPORARY && !fixed[b.id()] && !isCacheState(b.id()) &&
                          named[b.id()] == 1 && written[b.id()] == 1;
  // The last instruction reading each buffer (-1: none).
  std::vector<int> lastRead(stageProto_->buffers_size(), -1);
  for (int k = 0; k < stageProto_->instructions_size(); ++k)
    for (int32_t id : stageProto_->instructions(k).operands())
      lastRead[id] = k;
  markReshapesInPlace(fixed, named, written, lastRead);
  markGathersToHolders(named, lastRead);
  return Status::ok();
}

// An all-gather over model axes (not "dp", not "pp": its group's first
// rank is then its replica's holder of results) whose result is an output
// and no instruction's operand: setResultsOnHoldersOnly lets it gather onto
// that rank alone (a TP prefill's logits: half the bytes moved, none into
// the other ranks).
void Executor::markGathersToHolders(const std::vector<int> &named, const std::vector<int> &lastRead) {
  gathersToFirst_.assign(stageProto_->buffers_size(), false);
  for (const pxe::Instruction &inst : stageProto_->instructions()) {
    if (inst.kind() != pxe::OP_ALL_GATHER || inst.results_size() != 1) continue;
    std::vector<std::string> axes = attrStrings(inst.attrs(), "axes");
    bool modelAxes = std::none_of(axes.begin(), axes.end(), [](const std::string &a) { return a == "dp" || a == "pp"; });
    int32_t y = inst.results(0);
    gathersToFirst_[y] = modelAxes && named[y] > 0 && lastRead[y] < 0;
  }
}

// A reshape whose operand is read last there takes the operand's storage
// (a swap) instead of copying it: both temporaries each run writes once,
// the operand no output and no cache. (A sharded program's logits pass
// through two such reshapes: 7.7 ms of a CP2 prefill of 1,024 tokens.)
void Executor::markReshapesInPlace(const std::vector<bool> &fixed, const std::vector<int> &named,
                                   const std::vector<int> &written, const std::vector<int> &lastRead) {
  reshapeTakes_.assign(stageProto_->buffers_size(), false);
  if (runsElsewhere_)
    return;
  auto plain = [&](int32_t id) {
    const pxe::Buffer &b = stageProto_->buffers(id);
    return b.role() == pxe::TEMPORARY && !fixed[id] && !isCacheState(id) && written[id] == 1;
  };
  for (int k = 0; k < stageProto_->instructions_size(); ++k) {
    const pxe::Instruction &inst = stageProto_->instructions(k);
    if (hoisted_[k] || opName(inst) != "reshape" || inst.operands_size() != 1 || inst.results_size() != 1)
      continue;
    int32_t x = inst.operands(0), y = inst.results(0);
    reshapeTakes_[y] = x != y && plain(x) && plain(y) && named[x] == 0 && lastRead[x] == k;
  }
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

std::vector<Tensor> Executor::outputs() {
  std::vector<Tensor> out;
  for (int32_t id : stageProto_->outputs()) {
    Tensor &b = buffers_[id];
    if (!b.hasValues()) { // (a shape only)
      out.push_back(b);
      continue;
    }
    Tensor t = takeSpare(spare_, b.isInt, b.shape);
    if (id < static_cast<int32_t>(handedOver_.size()) && handedOver_[id]) {
      std::swap(t, b); // the next run writes the spare's memory
    } else {
      std::copy(b.f.begin(), b.f.end(), t.f.begin());
      std::copy(b.i.begin(), b.i.end(), t.i.begin());
    }
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
    // (the clock read only when profiling: a read is a third of the
    // dispatch of a one-element add, bench/runtime.sh)
    auto started = profiling_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
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
  StatusOr<unsigned> mask = groupMask(exe, group.axes);
  if (!mask.isOk()) return mask.status();
  group.mask = mask.value();
  group.size = groupSize(exe, group.axes);
  return needsComm ? needComm(group.size) : Status::ok();
}

} // namespace parax::runtime
