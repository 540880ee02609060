// Trainer.cpp - gradients averaged and gathered, the optimizer (Trainer.h).

#define OMPI_SKIP_MPICXX 1
#include "parax/runtime/Trainer.h"

#include "parax/runtime/Communicator.h"
#include "parax/runtime/Executable.h"
#include "parax/runtime/MpiRing.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <set>
#include <sstream>

namespace parax::runtime {

namespace {

int64_t coordinate(const pxe::Executable &exe, int rank, const std::string &axis) {
  for (int i = 0; i < exe.grid().axis_names_size(); ++i)
    if (exe.grid().axis_names(i) == axis) return exe.ranks(rank).values(i);
  return 0;
}

std::vector<int64_t> coordinatesOf(const pxe::Executable &exe, int rank) {
  return {exe.ranks(rank).values().begin(), exe.ranks(rank).values().end()};
}

/// Copies `box` (a tensor) into `whole` at `start`.
void placeBox(const Tensor &box, const std::vector<int64_t> &start, Tensor &whole) {
  size_t rank = whole.shape.size();
  if (rank == 0) {
    whole.f = box.f;
    return;
  }
  int64_t inner = box.shape[rank - 1], rows = box.numel() / std::max<int64_t>(inner, 1);
  std::vector<int64_t> at(rank, 0); // the row's index in the box (last dimension 0)
  for (int64_t row = 0; row < rows; ++row) {
    int64_t offset = 0;
    for (size_t d = 0; d < rank; ++d) offset = offset * whole.shape[d] + start[d] + at[d];
    std::copy(box.f.begin() + row * inner, box.f.begin() + (row + 1) * inner, whole.f.begin() + offset);
    for (int64_t d = static_cast<int64_t>(rank) - 2; d >= 0; --d) {
      if (++at[d] < box.shape[d]) break;
      at[d] = 0;
    }
  }
}

/// A parameter buffer's checkpoint tensor as output_grads names it: the
/// name, a fused tensor's piece with "@<offset of each dimension>".
std::string pieceName(const pxe::Buffer &b) {
  std::string name = b.param_name();
  for (int d = 0; d < b.param_offset_size(); ++d) name += (d ? "," : "@") + std::to_string(b.param_offset(d));
  return name;
}

/// The grid axes along which the ranks of a parameter's stage hold the
/// same box of it (a mask): every axis but "pp", those it is split over
/// and those only coordinate 0 of which holds it.
unsigned shareAxes(const pxe::Executable &exe, const pxe::Buffer &param) {
  unsigned axes = 0;
  for (int i = 0; i < exe.grid().axis_names_size(); ++i) {
    const std::string &axis = exe.grid().axis_names(i);
    bool varies = axis == "pp" || std::find(param.partial().begin(), param.partial().end(), axis) != param.partial().end();
    for (const pxe::AxisList &split : param.split())
      varies = varies || std::find(split.axes().begin(), split.axes().end(), axis) != split.axes().end();
    if (!varies) axes |= 1u << i;
  }
  return axes;
}

/// The grid axes a buffer is a partial sum over, as a mask (an axis of one
/// rank sums nothing: left out).
unsigned partialAxes(const pxe::Executable &exe, const pxe::Buffer &buffer) {
  unsigned axes = 0;
  for (int i = 0; i < exe.grid().axis_names_size(); ++i)
    if (exe.grid().shape(i) > 1 && std::find(buffer.partial().begin(), buffer.partial().end(),
                                             exe.grid().axis_names(i)) != buffer.partial().end())
      axes |= 1u << i;
  return axes;
}

/// The parameter buffer of `stage` that gradient `name` (an output_grads
/// entry) updates, or nullptr.
const pxe::Buffer *parameterNamed(const pxe::Stage &stage, const std::string &name) {
  for (const pxe::Buffer &b : stage.buffers())
    if (b.role() == pxe::PARAMETER && pieceName(b) == name) return &b;
  return nullptr;
}

} // namespace

void appendRows(Tensor &into, const Tensor &part) {
  if (!into.shape.empty()) into.shape[0] += part.shape[0];
  into.f.insert(into.f.end(), part.f.begin(), part.f.end());
  into.i.insert(into.i.end(), part.i.begin(), part.i.end());
}

StallWatchdog::Scope Trainer::watch(const char *operation) {
  return waits_ ? waits_->watch(operation) : StallWatchdog::Scope(nullptr);
}

struct Trainer::Item {
  int stage;               // the stage whose ranks' boxes make the tensor
  int buffer;              // the box's buffer in that stage
  const Tensor *local;     // this rank's box (when it is in that stage)
  size_t whole;            // which of the whole tensors
  std::vector<int64_t> at; // where the buffer's whole tensor lies in it
  int writer;              // the rank that puts the whole tensor together
};

Trainer::Trainer(const pxe::Executable &exe, int rank, bool mpi, StallWatchdog *waits)
    : exe_(exe), rank_(rank), stage_(0), mpi_(mpi), waits_(waits) {
  for (int i = 0; i < exe.grid().axis_names_size(); ++i) {
    if (exe.grid().axis_names(i) == "pp") stage_ = static_cast<int>(exe.ranks(rank).values(i));
    if (exe.grid().axis_names(i) == "dp") {
      replicas_ = exe.grid().shape(i);
      replica_ = exe.ranks(rank).values(i);
    }
  }
  if (stage_ >= exe.stages_size()) stage_ = 0;
  const pxe::Stage &stage = exe.stages(stage_);
  gradOf_.assign(stage.output_grads().begin(), stage.output_grads().end());
  states_.resize(stage.outputs_size());
  paramOf_.assign(stage.outputs_size(), -1);
  countedInNorm_.assign(stage.outputs_size(), false);
  firstStage_.assign(stage.outputs_size(), false);
  shareOf_.assign(stage.outputs_size(), ShareGroup());
  partialOf_.assign(stage.outputs_size(), PartialSum());
  std::vector<int64_t> shape(exe.grid().shape().begin(), exe.grid().shape().end());
  unsigned dpAxes = 0; // (the data-parallel all-reduce's group, without ZeRO)
  for (int i = 0; i < exe.grid().axis_names_size(); ++i)
    if (exe.grid().axis_names(i) == "dp" && replicas_ > 1) dpAxes = 1u << i;
  // Every stage's share groups, and its gradients' all-reduce groups
  // without ZeRO (dp and the axes a gradient is a partial sum over): the
  // splits are collective over the world.
  std::set<unsigned> groups;
  for (int s = 0; s < exe.stages_size(); ++s) {
    const pxe::Stage &held = exe.stages(s);
    for (int k = 0; k < held.output_grads_size(); ++k) {
      const pxe::Buffer *param = held.output_grads(k).empty() ? nullptr : parameterNamed(held, held.output_grads(k));
      if (!param) continue; // (bindParameters names it)
      unsigned axes = shareAxes(exe, *param);
      GroupSplit g = groupSplit(shape, rank, axes);
      largestShareGroup_ = std::max(largestShareGroup_, g.members);
      if (g.members > 1) groups.insert(axes);
      unsigned partial = k < held.outputs_size() ? partialAxes(exe, held.buffers(held.outputs(k))) : 0u;
      if (partial) groups.insert(dpAxes | partial);
      if (s != stage_ || k >= stage.outputs_size()) continue;
      shareOf_[k] = {axes, g.members, g.key, MPI_COMM_NULL};
      int64_t ranks = groupSplit(shape, rank, partial).members;
      partialOf_[k] = {partial, ranks, groupSplit(shape, rank, dpAxes | partial).members / ranks,
                       MPI_COMM_NULL};
    }
  }
  // A stage's part of a gradient: the ranks of the stages returning its
  // result that differ from this one only along "pp" (ranks are in
  // row-major grid order: stage s's is this rank moved s - stage_ strides).
  partRanks_.assign(stage.outputs_size(), {});
  auto sources = resultSources(exe);
  int64_t ppStride = 1;
  int ppAxis = exe.grid().axis_names_size() - 1;
  for (; ppAxis >= 0 && exe.grid().axis_names(ppAxis) != "pp"; --ppAxis) ppStride *= exe.grid().shape(ppAxis);
  for (int k = 0; k < stage.outputs_size(); ++k) {
    if (!isStagePart(stage, k) || ppAxis < 0) continue; // (parts come from pipeline stages)
    std::set<int> holders;
    for (const ResultSource &source : sources[outputResult(stage, k)]) holders.insert(source.stage);
    for (int s : holders) partRanks_[k].push_back(static_cast<int>(rank + (s - stage_) * ppStride));
    partOutputs_.push_back(k);
  }
  std::sort(partOutputs_.begin(), partOutputs_.end(),
            [&](int a, int b) { return outputResult(stage, a) < outputResult(stage, b); });
  if (!mpi_) return;
  if (dpAxes) groups.insert(dpAxes);
  for (unsigned axes : groups) {
    // The ranks differing from this one only along `axes`, in grid order.
    GroupSplit g = groupSplit(shape, rank, axes);
    auto watched = watch("the optimizer's groups' set-up (MPI_Comm_split)");
    MPI_Comm_split(MPI_COMM_WORLD, static_cast<int>(g.color), static_cast<int>(g.key), &shareComms_[axes]);
  }
  if (dpAxes) replicaComm_ = shareComms_[dpAxes];
  for (ShareGroup &group : shareOf_)
    if (group.members > 1) group.comm = shareComms_[group.axes];
  for (PartialSum &sum : partialOf_) sum.comm = sum.axes ? shareComms_[dpAxes | sum.axes] : replicaComm_;
}

Trainer::~Trainer() {
  for (auto &[axes, comm] : shareComms_)
    if (comm != MPI_COMM_NULL) MPI_Comm_free(&comm);
}

Status Trainer::join(std::vector<Tensor> &into, std::vector<Tensor> part) const {
  if (into.empty()) { // (moved: a prefill's logits are a gigabyte)
    into = std::move(part);
    return Status::ok();
  }
  for (size_t k = 0; k < into.size() && k < part.size(); ++k) {
    if (!isGrad(k)) {
      appendRows(into[k], part[k]);
      continue;
    }
    if (part[k].shape != into[k].shape)
      return Status::error("the gradient of " + gradOf_[k] + " has shape " + part[k].shapeString() +
                           " in one microbatch and " + into[k].shapeString() + " in another");
    for (size_t e = 0; e < into[k].f.size(); ++e) into[k].f[e] += part[k].f[e];
  }
  return Status::ok();
}

Trainer::Chunk Trainer::chunkOf(size_t k, int64_t n) const {
  const ShareGroup &g = shareOf_[k];
  int64_t size = (n + g.members - 1) / g.members;
  int64_t begin = std::min(n, g.index * size);
  return {begin, std::min(n, begin + size), size};
}

Status Trainer::gatherChunks(size_t k, const std::vector<float> &mine, std::vector<float> &box, const char *what) {
  const ShareGroup &g = shareOf_[k];
  if (g.members == 1) {
    box = mine;
    return Status::ok();
  }
  Chunk c = chunkOf(k, static_cast<int64_t>(box.size()));
  std::vector<float> padded(c.size, 0.0f), all(c.size * g.members);
  std::copy(mine.begin(), mine.end(), padded.begin());
  auto watched = watch(what);
  if (MPI_Allgather(padded.data(), static_cast<int>(c.size), MPI_FLOAT, all.data(), static_cast<int>(c.size),
                    MPI_FLOAT, g.comm) != MPI_SUCCESS)
    return Status::error(std::string(what) + " (MPI_Allgather over the ranks holding the box) failed");
  std::copy(all.begin(), all.begin() + box.size(), box.begin());
  return Status::ok();
}

Status Trainer::allReduceOverReplicas(size_t k, float *data, size_t n) {
  MPI_Comm comm = k < partialOf_.size() ? partialOf_[k].comm : replicaComm_;
  if (comm == MPI_COMM_NULL) return Status::ok();
  auto watched = watch("the data-parallel gradient all-reduce (MPI_Allreduce over dp and the gradient's partial axes)");
  auto began = std::chrono::steady_clock::now();
  if (MPI_Allreduce(MPI_IN_PLACE, data, static_cast<int>(n), MPI_FLOAT, MPI_SUM, comm) != MPI_SUCCESS)
    return Status::error("the data-parallel gradient all-reduce failed");
  int ranks = 1;
  MPI_Comm_size(comm, &ranks);
  ReduceTally &tally = reduces_[{ranks, static_cast<int64_t>(sizeof(float) * n)}];
  tally.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - began).count();
  ++tally.calls;
  return Status::ok();
}

Status Trainer::sumStageParts(std::vector<Tensor> &outputs) {
  if (!mpi_) return Status::ok();
  constexpr int kPartTag = 7301; // (apart from the pipeline's transfers)
  for (int k : partOutputs_) {
    const std::vector<int> &ranks = partRanks_[k];
    std::vector<float> &mine = outputs[k].f;
    if (mine.size() > static_cast<size_t>(INT_MAX))
      return Status::error("the stages' parts of " + gradOf_[k] + ": more than 2^31 - 1 values");
    std::vector<std::vector<float>> parts(ranks.size());
    std::vector<MPI_Request> requests;
    for (size_t j = 0; j < ranks.size(); ++j) {
      if (ranks[j] == rank_) continue;
      parts[j].resize(mine.size());
      requests.emplace_back();
      MPI_Irecv(parts[j].data(), static_cast<int>(mine.size()), MPI_FLOAT, ranks[j], kPartTag, MPI_COMM_WORLD,
                &requests.back());
      requests.emplace_back();
      MPI_Isend(mine.data(), static_cast<int>(mine.size()), MPI_FLOAT, ranks[j], kPartTag, MPI_COMM_WORLD,
                &requests.back());
    }
    {
      auto watched = watch("the sum of a gradient's parts over the stages holding its weight (MPI_Isend/MPI_Irecv)");
      if (MPI_Waitall(static_cast<int>(requests.size()), requests.data(), MPI_STATUSES_IGNORE) != MPI_SUCCESS)
        return Status::error("the sum of the stages' parts of " + gradOf_[k] + " failed");
    }
    std::vector<float> sum(mine.size(), 0.0f);
    for (size_t j = 0; j < ranks.size(); ++j) {
      const std::vector<float> &part = ranks[j] == rank_ ? mine : parts[j];
      for (size_t e = 0; e < sum.size(); ++e) sum[e] += part[e];
    }
    mine = std::move(sum);
  }
  return Status::ok();
}

Status Trainer::meanOf(std::vector<Tensor> &outputs, int64_t micro, bool overReplicas) {
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!isGrad(k)) continue;
    std::vector<float> &g = outputs[k].f;
    if (overReplicas) {
      Status s = allReduceOverReplicas(k, g.data(), g.size());
      if (!s.isOk()) return s;
    }
    float scale = 1.0f / static_cast<float>(micro * (overReplicas ? copiesOf(k, false) : 1));
    for (float &v : g) v *= scale;
  }
  return Status::ok();
}

int64_t Trainer::copiesOf(size_t k, bool shares) const {
  const ShareGroup &g = shareOf_[k];
  return shares && g.members > 1 ? g.members / partialOf_[k].ranks : partialOf_[k].copies;
}

Status Trainer::meanOverReplicas(std::vector<Tensor> &outputs) { return meanOf(outputs, 1, true); }

Status Trainer::averageGradients(std::vector<Tensor> &outputs, int64_t micro, bool zeroShares) {
  Status summed = sumStageParts(outputs);
  if (!summed.isOk()) return summed;
  return meanOf(outputs, micro, !(zeroShares && largestShareGroup_ > 1));
}

Status Trainer::bindParameters(const std::vector<Tensor> &buffers) {
  const pxe::Stage &stage = exe_.stages(stage_);
  for (int k = 0; k < stage.outputs_size(); ++k) {
    if (!isGrad(k)) continue;
    const std::string &name = gradOf_[k];
    if (const pxe::Buffer *b = parameterNamed(stage, name)) paramOf_[k] = b->id();
    int p = paramOf_[k];
    const pxe::Buffer &out = stage.buffers(stage.outputs(k));
    std::string where = "stage " + std::to_string(stage_) + " output " + std::to_string(k) + " (the gradient of " +
                        name + ")";
    if (p < 0)
      return Status::error(where + ": the stage holds no such parameter to update (an executable "
                                   "partitioned before gradients stayed with their parameters? partition it again)");
    const pxe::Buffer &param = stage.buffers(p);
    if (buffers[p].shape != std::vector<int64_t>(out.shape().begin(), out.shape().end()) ||
        wholeShape(param) != wholeShape(out) || boxStart(exe_, coordinatesOf(exe_, rank_), param) !=
                                                    boxStart(exe_, coordinatesOf(exe_, rank_), out))
      return Status::error(where + ": its box is not the parameter's (the gradient must be returned in its "
                                   "parameter's split)");
    if (buffers[p].isInt) return Status::error(where + ": an integer parameter");
    countedInNorm_[k] = ownsBoxIgnoringReplica(k);
    firstStage_[k] = resultSources(exe_)[outputResult(stage, k)][0].stage == stage_;
  }
  return Status::ok();
}

bool Trainer::ownsBoxIgnoringReplica(int output) const {
  const pxe::Stage &stage = exe_.stages(stage_);
  int result = outputResult(stage, output);
  if (resultSources(exe_)[result][0].stage != stage_) return false; // counted by the first stage returning it
  const pxe::Buffer &buffer = stage.buffers(stage.outputs(output));
  std::vector<int64_t> mine = boxStart(exe_, coordinatesOf(exe_, rank_), buffer);
  for (int q = 0; q < rank_; ++q)
    if (coordinate(exe_, q, "pp") == coordinate(exe_, rank_, "pp") &&
        coordinate(exe_, q, "dp") == replica_ && boxStart(exe_, coordinatesOf(exe_, q), buffer) == mine)
      return false;
  return true;
}

double sumOfSquares(const float *x, size_t n) {
  // (float partial sums of 1024 elements each, added in double: vectorised,
  // and as accurate as one double sum for a norm)
  double total = 0;
  for (size_t at = 0; at < n; at += 1024) {
    float part = 0;
    for (size_t e = at, end = std::min(n, at + 1024); e < end; ++e) part += x[e] * x[e];
    total += part;
  }
  return total;
}

void adamwUpdate(float *p, float *m, float *v, const float *g, size_t n, const AdamwFactors &f) {
  // Over contiguous arrays, no branch: the loop vectorises (Trainer.cpp is
  // built with -fno-math-errno for sqrt). The arithmetic in double, element
  // for element the CUDA backend's (OptimizerKernels.cuh, adamwElement):
  // the two optimizers agree to the bit (test_cuda_simt.py).
  const double keep = 1 - f.lr * f.decay;
  for (size_t e = 0; e < n; ++e) {
    double grad = f.clip * g[e];
    double mm = f.beta1 * m[e] + (1 - f.beta1) * grad;
    double vv = f.beta2 * v[e] + (1 - f.beta2) * grad * grad;
    m[e] = static_cast<float>(mm);
    v[e] = static_cast<float>(vv);
    double value = p[e] * keep;
    value -= f.lr * (mm / f.correction1) / (std::sqrt(vv / f.correction2) + f.eps);
    p[e] = static_cast<float>(value);
  }
}

double learningRate(const OptimizerConfig &c, int64_t step) {
  double t = static_cast<double>(step);
  if (c.warmupSteps > 0 && t <= c.warmupSteps) return c.lr * t / c.warmupSteps;
  if (c.schedule == "constant" || c.decaySteps <= c.warmupSteps) return c.lr;
  double progress = std::min(1.0, (t - c.warmupSteps) / static_cast<double>(c.decaySteps - c.warmupSteps));
  double fall = c.schedule == "cosine" ? 0.5 * (1 + std::cos(M_PI * progress)) : 1 - progress;
  return c.minLr + (c.lr - c.minLr) * fall;
}

std::vector<Trainer::Update> Trainer::updates(const OptimizerConfig &config) const {
  const pxe::Stage &stage = exe_.stages(stage_);
  std::vector<Update> all;
  for (int k = 0; k < stage.outputs_size(); ++k) {
    if (!isGrad(k)) continue;
    int64_t n = numelOf({stage.buffers(paramOf_[k]).shape().begin(), stage.buffers(paramOf_[k]).shape().end()});
    bool shares = sharesState(config);
    Chunk c = shares ? chunkOf(k, n) : Chunk{0, n, n};
    const ShareGroup &g = shareOf_[k];
    all.push_back({k, paramOf_[k], c.begin, c.end, c.size, decays(k), shares ? g.axes : 0u, shares ? g.members : 1,
                   shares ? g.index : 0, partialOf_[k].axes, copiesOf(k, shares), partRanks_[k]});
  }
  return all;
}

bool Trainer::decays(int k) const { return exe_.stages(stage_).buffers(paramOf_[k]).shape_size() >= 2; }

Status Trainer::beginStep(const OptimizerConfig &config, const std::vector<double> &squares, StepFactors &factors,
                           double &gradNorm) {
  ++step_;
  bool shares = zeroShares_ = sharesState(config);
  double total = 0;
  for (size_t k = 0; k < squares.size() && k < countedInNorm_.size(); ++k)
    if (isGrad(k) && (shares ? firstStage_[k] : countedInNorm_[k] && replica_ == 0)) total += squares[k];
  if (mpi_ && exe_.ranks_size() > 1) {
    auto watched = watch("the gradients' global norm (MPI_Allreduce)");
    if (MPI_Allreduce(MPI_IN_PLACE, &total, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD) != MPI_SUCCESS)
      return Status::error("the gradients' global norm (MPI_Allreduce) failed");
  }
  gradNorm = std::sqrt(total);
  if (!std::isfinite(gradNorm)) {
    // (every rank sees the same all-reduced norm: all stop or skip alike)
    if (!config.skipNonfinite)
      return Status::error("optimizer step " + std::to_string(step_) + ": the gradients are not finite (their "
                           "global norm is " + std::to_string(gradNorm) + "): stopped before the update, no "
                           "weight changed (--skip-nonfinite skips such a step instead)");
    --step_; // (the step's update is not applied: the schedule does not advance)
    ++skipped_;
    factors.skip = true;
    return Status::ok();
  }
  factors.clip = config.clipNorm > 0 && gradNorm > config.clipNorm ? config.clipNorm / (gradNorm + 1e-6) : 1.0;
  factors.lr = lr_ = learningRate(config, step_);
  factors.correction1 = 1 - std::pow(config.beta1, static_cast<double>(step_));
  factors.correction2 = 1 - std::pow(config.beta2, static_cast<double>(step_));
  return Status::ok();
}

Status Trainer::apply(const OptimizerConfig &config, std::vector<Tensor> &outputs, std::vector<Tensor> &buffers,
                       double &gradNorm) {
  bool shares = sharesState(config);
  // Each gradient's share this rank updates: the whole box, or (ZeRO) the
  // replica's chunk of it, reduced over the replicas.
  std::vector<std::vector<float>> share(outputs.size()); // (ZeRO's reduced chunks)
  std::vector<std::pair<const float *, size_t>> gradOf(outputs.size(), {nullptr, 0});
  std::vector<double> squares(outputs.size(), 0.0);
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!isGrad(k)) continue;
    std::vector<float> &g = outputs[k].f;
    const ShareGroup &group = shareOf_[k];
    if (shares && group.members > 1) {
      // Summed over the group: dp's replicas, each box `members / replicas`
      // times (equal copies, or partial sums over partialOf_'s axes), so
      // the mean divides by the copies of the whole sum.
      Chunk c = chunkOf(k, static_cast<int64_t>(g.size()));
      std::vector<float> padded(c.size * group.members, 0.0f);
      std::copy(g.begin(), g.end(), padded.begin());
      share[k].assign(c.size, 0.0f);
      auto watched = watch("the ZeRO gradient reduce-scatter (a ring over the ranks holding the box)");
      if (Status ring = ringReduceScatter(padded.data(), share[k].data(), c.size, group.comm, ringSend_, ringReceived_);
          !ring.isOk())
        return Status::error("the ZeRO gradient reduce-scatter failed: " + ring.message());
      for (float &v : share[k]) v /= static_cast<float>(copiesOf(k, true));
      share[k].resize(c.end - c.begin);
      gradOf[k] = {share[k].data(), share[k].size()};
    } else {
      gradOf[k] = {g.data(), g.size()}; // (read in place, not copied)
    }
    squares[k] = sumOfSquares(gradOf[k].first, gradOf[k].second);
  }
  StepFactors f;
  Status begun = beginStep(config, squares, f, gradNorm);
  if (!begun.isOk() || f.skip) return begun;
  const double clip = f.clip, lr = f.lr, correction1 = f.correction1, correction2 = f.correction2;
  const double b1 = config.beta1, b2 = config.beta2;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!isGrad(k)) continue;
    const float *grad = gradOf[k].first;
    Tensor &param = buffers[paramOf_[k]];
    float *p = param.f.data() + (shares ? chunkOf(k, param.numel()).begin : 0);
    // Weight decay on matrices only (not on norms' weights and biases).
    double decay = decays(static_cast<int>(k)) ? config.weightDecay : 0.0;
    size_t n = gradOf[k].second;
    if (config.kind == "sgd") {
      for (size_t e = 0; e < n; ++e) {
        double g = clip * grad[e] + decay * p[e];
        p[e] = static_cast<float>(p[e] - lr * g);
      }
    } else { // adamw
      State &st = states_[k];
      if (st.m.size() != n) {
        st.m.assign(n, 0.0f);
        st.v.assign(n, 0.0f);
      }
      adamwUpdate(p, st.m.data(), st.v.data(), grad, n,
                  AdamwFactors{clip, b1, b2, lr, decay, config.eps, correction1, correction2});
    }
    if (shares) { // every replica's updated chunk back into every replica's box
      Status st = gatherChunks(k, std::vector<float>(p, p + n), param.f, "the ZeRO parameter all-gather");
      if (!st.isOk()) return st;
    }
  }
  return Status::ok();
}

size_t Trainer::stateBytes() const {
  size_t bytes = 0;
  for (const State &s : states_) bytes += (s.m.size() + s.v.size()) * sizeof(float);
  return bytes;
}

Status Trainer::replicaMean(double &value) {
  if (replicaComm_ == MPI_COMM_NULL) return Status::ok();
  auto watched = watch("the loss's mean over the replicas (MPI_Allreduce over dp)");
  MPI_Allreduce(MPI_IN_PLACE, &value, 1, MPI_DOUBLE, MPI_SUM, replicaComm_);
  value /= static_cast<double>(replicas_);
  return Status::ok();
}

std::vector<std::pair<int, std::vector<int64_t>>> Trainer::holders(const Item &item) const {
  const pxe::Buffer &buffer = exe_.stages(item.stage).buffers(item.buffer);
  std::vector<std::pair<int, std::vector<int64_t>>> boxes;
  std::vector<std::vector<int64_t>> seen;
  for (int q = 0; q < exe_.ranks_size(); ++q) {
    if (coordinate(exe_, q, "pp") != item.stage || coordinate(exe_, q, "dp") != 0) continue;
    std::vector<int64_t> start = boxStart(exe_, coordinatesOf(exe_, q), buffer);
    if (std::find(seen.begin(), seen.end(), start) != seen.end()) continue;
    seen.push_back(start);
    for (size_t dim = 0; dim < start.size(); ++dim) start[dim] += item.at[dim];
    boxes.emplace_back(q, std::move(start));
  }
  return boxes;
}

Status Trainer::gather(const std::vector<Item> &items, std::vector<Tensor> &whole) {
  auto watched = watch("gathering whole tensors from their boxes on the writer");
  for (const Item &item : items) {
    int writer = item.writer;
    const pxe::Buffer &buffer = exe_.stages(item.stage).buffers(item.buffer);
    for (const auto &[q, start] : holders(item)) {
      if (q == rank_ && rank_ == writer) {
        placeBox(*item.local, start, whole[item.whole]);
      } else if (q == rank_) {
        MPI_Send(item.local->f.data(), static_cast<int>(item.local->f.size()), MPI_FLOAT, writer, 7,
                 MPI_COMM_WORLD);
      } else if (rank_ == writer) {
        Tensor box = Tensor::floats({buffer.shape().begin(), buffer.shape().end()});
        MPI_Recv(box.f.data(), static_cast<int>(box.f.size()), MPI_FLOAT, q, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        placeBox(box, start, whole[item.whole]);
      }
    }
  }
  return Status::ok();
}

Status Trainer::gatherGradients(const std::vector<Tensor> &outputs, int writer, std::map<int, Tensor> &whole) {
  auto sources = resultSources(exe_);
  std::vector<Item> items;
  std::vector<int> results;
  std::vector<Tensor> tensors;
  for (size_t r = 0; r < sources.size(); ++r) {
    const ResultSource &from = sources[r][0];
    const pxe::Stage &stage = exe_.stages(from.stage);
    if (from.output >= stage.output_grads_size() || stage.output_grads(from.output).empty()) continue;
    const pxe::Buffer &buffer = stage.buffers(stage.outputs(from.output));
    std::vector<int64_t> shape = wholeShape(buffer);
    items.push_back({from.stage, buffer.id(), from.stage == stage_ ? &outputs[from.output] : nullptr, tensors.size(),
                     std::vector<int64_t>(shape.size(), 0), writer});
    tensors.push_back(rank_ == writer ? Tensor::floats(shape) : Tensor());
    results.push_back(static_cast<int>(r));
  }
  Status s = gather(items, tensors);
  if (!s.isOk()) return s;
  if (rank_ == writer)
    for (size_t i = 0; i < results.size(); ++i) whole[results[i]] = std::move(tensors[i]);
  return Status::ok();
}

std::vector<Trainer::Item> Trainer::parameterItems(const std::vector<Tensor> &buffers,
                                                    std::vector<std::string> &names,
                                                    std::vector<std::vector<int64_t>> &shapes) const {
  std::vector<Item> items;
  std::vector<std::string> pieces;
  for (int s = 0; s < exe_.stages_size(); ++s)
    for (const pxe::Buffer &b : exe_.stages(s).buffers()) {
      if (b.role() != pxe::PARAMETER || b.dtype() == pxe::I32 || b.dtype() == pxe::I64) continue;
      if (std::find(pieces.begin(), pieces.end(), pieceName(b)) != pieces.end()) continue; // an earlier stage's
      pieces.push_back(pieceName(b));
      size_t index = std::find(names.begin(), names.end(), b.param_name()) - names.begin();
      if (index == names.size()) {
        names.push_back(b.param_name());
        shapes.push_back(checkpointBox(exe_, coordinatesOf(exe_, rank_), b).shape);
      }
      std::vector<int64_t> at(shapes[index].size(), 0);
      for (int d = 0; d < b.param_offset_size(); ++d) at[d] = b.param_offset(d);
      items.push_back({s, b.id(), s == stage_ ? &buffers[b.id()] : nullptr, index, at, 0});
    }
  return items;
}

Status Trainer::gatherParameters(const std::vector<Tensor> &buffers, int writer,
                                  std::map<std::string, Tensor> &whole, const std::string &suffix,
                                  Layout *layout) {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<Item> items = parameterItems(buffers, names, shapes);
  // Whole tensor i's writer: `writer`, or (kEveryRank) rank i mod the ranks.
  int ranks = exe_.ranks_size();
  auto writerOfTensor = [&](size_t i) { return writer == kEveryRank ? static_cast<int>(i % ranks) : writer; };
  for (Item &item : items) item.writer = writerOfTensor(item.whole);
  std::vector<Tensor> tensors(names.size());
  for (size_t i = 0; i < names.size(); ++i)
    if (writerOfTensor(i) == rank_) tensors[i] = Tensor::floats(shapes[i]);
  Status st = gather(items, tensors);
  if (!st.isOk()) return st;
  for (size_t i = 0; i < names.size(); ++i) {
    if (layout) {
      for (const std::string &name : checkpointNames(names[i] + suffix, shapes[i]))
        layout->writer[name] = writerOfTensor(i);
      layout->bytes += 4 * static_cast<uint64_t>(numelOf(shapes[i]));
    }
    if (writerOfTensor(i) == rank_) putParameter(names[i] + suffix, std::move(tensors[i]), whole);
  }
  return Status::ok();
}

void Trainer::parameterBoxes(const std::vector<Tensor> &buffers, const std::string &suffix,
                              BoxCheckpoint &into) const {
  wholeBoxes(buffers, suffix, {}, into);
}

Status Trainer::parameterChunkBoxes(const std::vector<Tensor> &buffers, const std::vector<std::vector<float>> &chunks,
                                     BoxCheckpoint &into) const {
  const pxe::Stage &stage = exe_.stages(stage_);
  std::vector<bool> updated(stage.buffers_size(), false);
  for (int k = 0; k < stage.outputs_size(); ++k) {
    if (!isGrad(k)) continue;
    const pxe::Buffer &param = stage.buffers(paramOf_[k]);
    Chunk c = chunkOf(k, numelOf(std::vector<int64_t>(param.shape().begin(), param.shape().end())));
    size_t given = k < static_cast<int>(chunks.size()) ? chunks[k].size() : 0;
    if (given != static_cast<size_t>(std::max<int64_t>(c.end - c.begin, 0)))
      return Status::error("a box-wise checkpoint of " + param.param_name() + ": " + std::to_string(given) +
                           " values of its chunk on rank " + std::to_string(rank_) + " where ZeRO gives it " +
                           std::to_string(std::max<int64_t>(c.end - c.begin, 0)));
    updated[paramOf_[k]] = true;
  }
  chunkBoxes("", [&](int k) { return chunks[k].data(); }, into);
  wholeBoxes(buffers, "", updated, into);
  return Status::ok();
}

void Trainer::wholeBoxes(const std::vector<Tensor> &buffers, const std::string &suffix,
                          const std::vector<bool> &skipped, BoxCheckpoint &into) const {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
  for (const Item &item : parameterItems(buffers, names, shapes)) {
    if (item.stage == stage_ && item.buffer < static_cast<int>(skipped.size()) && skipped[item.buffer]) continue;
    const pxe::Buffer &buffer = exe_.stages(item.stage).buffers(item.buffer);
    std::vector<int64_t> size(buffer.shape().begin(), buffer.shape().end());
    for (const auto &[q, start] : holders(item))
      if (q == rank_)
        putParameterBox(names[item.whole] + suffix, shapes[item.whole], start, size, q,
                                 item.local->f.data(), into);
  }
}

Status Trainer::gatherRecords(std::vector<SavedBox> &records) {
  if (!mpi_) return Status::ok();
  auto csv = [](const std::vector<int64_t> &dims) {
    std::string text;
    for (int64_t d : dims) text += std::to_string(d) + ",";
    return text;
  };
  std::string mine;
  for (const SavedBox &r : records)
    mine += r.name + "\t" + csv(r.shape) + "\t" + csv(r.start) + "\t" + csv(r.size) + "\t" +
            std::to_string(r.writer) + "\t" + std::to_string(r.begin) + "\t" + std::to_string(r.end) + "\n";
  int ranks = exe_.ranks_size(), length = static_cast<int>(mine.size());
  std::vector<int> lengths(ranks), offsets(ranks, 0);
  auto watched = watch("gathering a box-wise checkpoint's records on rank 0");
  if (MPI_Gather(&length, 1, MPI_INT, lengths.data(), 1, MPI_INT, 0, MPI_COMM_WORLD) != MPI_SUCCESS)
    return Status::error("gathering a box-wise checkpoint's records (MPI_Gather) failed");
  for (int q = 1; q < ranks; ++q) offsets[q] = offsets[q - 1] + lengths[q - 1];
  std::string all(rank_ == 0 ? offsets[ranks - 1] + lengths[ranks - 1] : 0, '\0');
  if (MPI_Gatherv(mine.data(), length, MPI_CHAR, all.data(), lengths.data(), offsets.data(), MPI_CHAR, 0,
                  MPI_COMM_WORLD) != MPI_SUCCESS)
    return Status::error("gathering a box-wise checkpoint's records (MPI_Gatherv) failed");
  if (rank_ != 0) return Status::ok();
  records.clear();
  std::istringstream lines(all);
  std::string line;
  while (std::getline(lines, line)) {
    std::istringstream fields(line);
    std::string name, shape, start, size, writer, begin, end;
    std::getline(fields, name, '\t');
    std::getline(fields, shape, '\t');
    std::getline(fields, start, '\t');
    std::getline(fields, size, '\t');
    std::getline(fields, writer, '\t');
    std::getline(fields, begin, '\t');
    std::getline(fields, end);
    auto dims = [](const std::string &text) {
      std::vector<int64_t> out;
      std::istringstream parts(text);
      for (std::string d; std::getline(parts, d, ',');) out.push_back(std::stoll(d));
      return out;
    };
    records.push_back({name, dims(shape), dims(start), dims(size), std::stoi(writer), std::stoll(begin),
                       std::stoll(end)});
  }
  return Status::ok();
}

// Each gradient's moment `which` (0: m, 1: v) as its parameter's box, in a
// vector indexed like the stage's buffers: under ZeRO the replicas'
// chunks gathered back into the box first (every replica takes part).
Status Trainer::stateBoxes(int which, std::vector<Tensor> &boxes) {
  const pxe::Stage &stage = exe_.stages(stage_);
  boxes.assign(stage.buffers_size(), Tensor());
  for (int k = 0; k < stage.outputs_size(); ++k) {
    if (!isGrad(k)) continue;
    const pxe::Buffer &param = stage.buffers(paramOf_[k]);
    const std::vector<float> &mine = which == 0 ? states_[k].m : states_[k].v;
    Tensor box = Tensor::floats({param.shape().begin(), param.shape().end()});
    if (zeroShares_) {
      Status st = gatherChunks(k, mine, box.f, "gathering the ZeRO optimizer state");
      if (!st.isOk()) return st;
    } else if (mine.size() == box.f.size()) {
      box.f = mine;
    }
    boxes[paramOf_[k]] = std::move(box);
  }
  return Status::ok();
}

Status Trainer::gatherState(int writer, std::map<std::string, Tensor> &whole, Layout *layout) {
  if (step_ == 0) return Status::error("--save-optimizer: no optimizer step ran, so there is no state");
  for (int which = 0; which < 2; ++which) {
    std::vector<Tensor> boxes;
    Status s = stateBoxes(which, boxes);
    if (s.isOk()) s = gatherParameters(boxes, writer, whole, which == 0 ? ".exp_avg" : ".exp_avg_sq", layout);
    if (!s.isOk()) return s;
  }
  int stepWriter = writer == kEveryRank ? 0 : writer;
  if (layout) {
    layout->writer["optimizer.step"] = stepWriter;
    layout->bytes += 4;
  }
  if (rank_ == stepWriter) {
    Tensor step = Tensor::floats({1});
    step.f[0] = static_cast<float>(step_);
    whole["optimizer.step"] = step;
  }
  return Status::ok();
}

Status Trainer::optimizerStateBoxes(BoxCheckpoint &into) {
  if (step_ == 0) return Status::error("--save-optimizer: no optimizer step ran, so there is no state");
  for (int which = 0; which < 2; ++which) {
    const char *suffix = which == 0 ? ".exp_avg" : ".exp_avg_sq";
    if (!zeroShares_) { // whole boxes, the first rank holding each writes it
      std::vector<Tensor> boxes;
      Status s = stateBoxes(which, boxes);
      if (!s.isOk()) return s;
      parameterBoxes(boxes, suffix, into);
      continue;
    }
    // ZeRO: every rank its own chunk of each box, nothing gathered.
    chunkBoxes(suffix, [&](int k) { return moment(k, which).data(); }, into);
  }
  if (rank_ == 0) {
    float step = static_cast<float>(step_);
    putParameterBox("optimizer.step", {1}, {0}, {1}, 0, &step, into);
  }
  return Status::ok();
}

void Trainer::chunkBoxes(const std::string &suffix, const std::function<const float *(int k)> &values,
                          BoxCheckpoint &into) const {
  const pxe::Stage &stage = exe_.stages(stage_);
  for (int k = 0; k < stage.outputs_size(); ++k) {
    if (!isGrad(k) || !firstStage_[k]) continue;
    const pxe::Buffer &param = stage.buffers(paramOf_[k]);
    std::vector<int64_t> size(param.shape().begin(), param.shape().end());
    int64_t n = numelOf(size);
    Chunk c = chunkOf(k, n);
    if (c.begin >= c.end) continue;
    CheckpointBox where = checkpointBox(exe_, coordinatesOf(exe_, rank_), param);
    bool whole = c.begin == 0 && c.end == n;
    putParameterBox(param.param_name() + suffix, where.shape, where.start, size, rank_, values(k), into,
                             whole ? 0 : c.begin, whole ? -1 : c.end);
  }
}

Status Trainer::loadState(const Checkpoint &file, const std::string &path, bool zero) {
  const pxe::Stage &stage = exe_.stages(stage_);
  Tensor step;
  Status s = file.readBox("optimizer.step", {1}, {0}, {1}, step);
  if (!s.isOk()) return Status::error(path + ": no optimizer step count (" + s.message() + ")");
  if (!(step.f[0] >= 0) || step.f[0] != std::floor(step.f[0]) || step.f[0] > 1e9)
    return Status::error(path + ": optimizer.step is " + std::to_string(step.f[0]) + ", not a count of steps");
  step_ = static_cast<int64_t>(step.f[0]);
  bool shares = zero && largestShareGroup_ > 1;
  zeroShares_ = shares;
  for (int k = 0; k < stage.outputs_size(); ++k) {
    if (!isGrad(k)) continue;
    const pxe::Buffer &b = stage.buffers(paramOf_[k]);
    CheckpointBox where = checkpointBox(exe_, coordinatesOf(exe_, rank_), b);
    std::vector<int64_t> shape(b.shape().begin(), b.shape().end());
    for (int which = 0; which < 2; ++which) {
      Tensor box;
      std::string name = b.param_name() + (which == 0 ? ".exp_avg" : ".exp_avg_sq");
      s = file.readParameterBox(name, where.shape, where.start, shape, box);
      if (!s.isOk()) return Status::error(path + ": " + s.message());
      if (box.isInt) return Status::error(path + ": '" + name + "' holds integers, not a moment");
      // A moment AdamW could not have made: NaN or infinite, or a negative
      // second moment (its square root is NaN): every update would be.
      for (size_t e = 0; e < box.f.size(); ++e)
        if (!std::isfinite(box.f[e]) || (which == 1 && box.f[e] < 0))
          return Status::error(path + ": '" + name + "' holds " + std::to_string(box.f[e]) + " at element " +
                               std::to_string(e) + " of this rank's box: " +
                               (which == 1 && std::isfinite(box.f[e]) ? "a negative second moment"
                                                                      : "not a finite number"));
      Chunk c = shares ? chunkOf(k, box.numel()) : Chunk{0, box.numel(), box.numel()};
      (which == 0 ? states_[k].m : states_[k].v).assign(box.f.begin() + c.begin, box.f.begin() + c.end);
    }
  }
  return Status::ok();
}

} // namespace parax::runtime
