// Session.cpp - one rank's share of an executable on the CPU (Session.h).

#define OMPI_SKIP_MPICXX 1
#include "parax/runtime/Session.h"

#include "parax/runtime/Communicator.h"
#include "parax/runtime/Executable.h"
#include "parax/runtime/Generator.h"
#include "parax/runtime/Grid.h"
#include "parax/runtime/MpiRing.h"
#include "parax/runtime/Runner.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <set>

namespace parax::runtime {

Status checkEveryWeightRead(const pxe::Executable &exe, const Checkpoint &weights, const std::string &path) {
  std::set<std::string> read;
  for (const auto &stage : exe.stages())
    for (const auto &buffer : stage.buffers())
      if (buffer.role() == pxe::PARAMETER) {
        std::vector<int64_t> whole(buffer.global_shape().begin(), buffer.global_shape().end());
        for (const std::string &name : checkpointNames(buffer.param_name(), whole)) read.insert(name);
      }
  std::vector<std::string> unused;
  for (const std::string &name : weights.tensorNames())
    if (!read.count(name)) unused.push_back(name);
  if (unused.empty()) return Status::ok();
  std::string listed;
  for (size_t k = 0; k < unused.size() && k < 8; ++k) listed += (k ? ", " : "") + unused[k];
  if (unused.size() > 8) listed += ", ... (" + std::to_string(unused.size()) + " in all)";
  return Status::error(path + ": the program reads no tensor named " + listed +
                       ": this checkpoint holds a model other than the one compiled (build the model from its "
                       "config.json)");
}

StatusOr<std::unique_ptr<Session>> Session::open(const SessionOptions &options) {
  std::unique_ptr<Session> s(new Session());
  auto loaded = loadExecutable(options.executable);
  if (!loaded.isOk()) return loaded.status();
  s->exe_ = std::move(loaded.value());
  const pxe::Executable &exe = s->exe_;
  const int64_t grid = gridSize(exe);
  int initialized = 0;
  MPI_Initialized(&initialized);
  s->mpi_ = initialized != 0;
  if (s->mpi_) {
    MPI_Comm_rank(MPI_COMM_WORLD, &s->rank_);
    MPI_Comm_size(MPI_COMM_WORLD, &s->size_);
  }
  if (grid != s->size_)
    return Status::error(options.executable + ": the executable's grid has " + std::to_string(grid) +
                         " ranks but " + (s->mpi_ ? "MPI started " + std::to_string(s->size_) :
                                                    std::string("MPI is not initialized (one rank)")) +
                         " (run it under mpirun -np " + std::to_string(grid) + ", MPI_Init before opening)");
  if (!(options.collectiveTimeout > 0))
    return Status::error("SessionOptions::collectiveTimeout must be a positive number of seconds");
  if (s->mpi_) s->waits_ = std::make_unique<StallWatchdog>(s->rank_, options.collectiveTimeout);
  if (s->size_ > 1) {
    std::vector<int64_t> shape(exe.grid().shape().begin(), exe.grid().shape().end());
    auto watched = s->waits_->watch("communicator set-up (MPI_Comm_split)");
    auto created = createMpiCommunicator(shape, options.collectiveTimeout);
    if (!created.isOk()) return created.status();
    s->comm_ = std::move(created.value());
  }
  auto opened = Checkpoint::open(options.weights);
  if (!opened.isOk()) return opened.status();
  s->weights_ = opened.value();
  s->weightsPath_ = options.weights;
  if (!options.allowUnusedWeights) {
    Status used = checkEveryWeightRead(exe, *s->weights_, options.weights);
    if (!used.isOk()) return used;
  }
  // This rank's place: its stage, its replica, whether it holds results.
  const auto &coords = exe.ranks(s->rank_).values();
  s->holdsResults_ = true;
  for (int i = 0; i < exe.grid().axis_names_size(); ++i) {
    const std::string &axis = exe.grid().axis_names(i);
    if (axis == "pp") {
      s->stage_ = static_cast<int>(coords[i]);
      s->holdsResults_ &= coords[i] + 1 == exe.grid().shape(i);
    } else if (axis == "dp") {
      s->replicas_ = exe.grid().shape(i);
      s->replica_ = coords[i];
    } else {
      s->holdsResults_ &= coords[i] == 0;
    }
  }
  for (const auto &buffer : exe.stages(0).buffers())
    if (buffer.role() == pxe::INPUT && buffer.input_index() == 0 && buffer.global_shape_size() > 0)
      s->batch_ = buffer.global_shape(0);
  return s;
}

Session::~Session() {
  trainer_.reset(); // its MPI communicators, then the executor's
  comm_.reset();
}

StatusOr<int64_t> Session::microbatches(int64_t rows) const {
  if (batch_ <= 0 || rows <= 0 || rows % (batch_ * replicas_))
    return Status::error("input #0 has " + std::to_string(rows) + " rows, not a multiple of the executable's batch " +
                         std::to_string(batch_) +
                         (replicas_ > 1 ? " times its " + std::to_string(replicas_) + " data-parallel replicas"
                                        : std::string()));
  return rows / (batch_ * replicas_);
}

std::vector<Tensor> Session::microbatch(const std::vector<Tensor> &inputs, int64_t m) const {
  const int64_t rows = inputs[0].shape[0];
  const int64_t micro = rows / (batch_ * replicas_);
  std::vector<Tensor> slice;
  for (const Tensor &t : inputs)
    slice.push_back(t.shape.empty() || t.shape[0] != rows ? t : t.rowBlock((replica_ * micro + m) * batch_, batch_));
  return slice;
}

Status Session::prepare(const std::vector<Tensor> &first) {
  if (prepared_) return executor_.setInputs(first);
  Status s = executor_.prepare(exe_, rank_, comm_.get(), *weights_, first);
  if (!s.isOk()) return s;
  prepared_ = true;
  // (Collective over the world: every rank prepares at the same call.)
  trainer_ = std::make_unique<Trainer>(exe_, rank_, mpi_, waits_.get());
  return Status::ok();
}

Status Session::runMicrobatches(const std::vector<Tensor> &inputs, int64_t micro, std::vector<Tensor> &outputs) {
  outputs.clear();
  for (int64_t m = 0; m < micro; ++m) {
    Status s = prepare(microbatch(inputs, m));
    if (s.isOk()) s = executor_.run();
    if (s.isOk()) s = trainer_->join(outputs, executor_.outputs());
    if (!s.isOk()) return s;
  }
  return Status::ok();
}

Status Session::run(const std::vector<Tensor> &inputs, std::vector<Tensor> &results) {
  if (inputs.empty() || inputs[0].shape.empty()) return Status::error("Session::run: no input #0 with rows");
  auto micro = microbatches(inputs[0].shape[0]);
  if (!micro.isOk()) return micro.status();
  // (only the holders return results: the last gathers go to them alone)
  executor_.setResultsOnHoldersOnly(true);
  Status s = runMicrobatches(inputs, micro.value(), results);
  if (!s.isOk()) return s;
  if (!holdsResults_) {
    results.clear();
    return Status::ok();
  }
  // A scalar result: the mean of its microbatches' values.
  const pxe::Stage &mine = exe_.stages(stage_);
  for (size_t k = 0; k < results.size() && static_cast<int>(k) < mine.outputs_size(); ++k)
    if (mine.buffers(mine.outputs(k)).shape_size() == 0 && !results[k].isInt && !results[k].f.empty()) {
      double mean = 0;
      for (float v : results[k].f) mean += v;
      results[k] = Tensor::floats({});
      results[k].f.assign(1, static_cast<float>(mean / static_cast<double>(micro.value())));
    }
  return Status::ok();
}

Status Session::trainStep(const std::vector<Tensor> &inputs, const OptimizerConfig &optimizer, StepReport &report) {
  if (inputs.empty() || inputs[0].shape.empty()) return Status::error("Session::trainStep: no input #0 with rows");
  if (optimizer.kind != "sgd" && optimizer.kind != "adamw")
    return Status::error("Session::trainStep: the optimizer must be \"sgd\" or \"adamw\", got \"" + optimizer.kind +
                         "\"");
  if (optimizer.zeroStage > 1)
    return Status::error("Session::trainStep: ZeRO stage " + std::to_string(optimizer.zeroStage) +
                         " splits the gradient sums on the CUDA backend's device optimizer; on the CPU ZeRO is "
                         "stage 1");
  if (optimizer.schedule != "constant" && optimizer.decaySteps <= 0)
    return Status::error("Session::trainStep: a " + optimizer.schedule +
                         " schedule needs decaySteps (the step it reaches minLr at)");
  if (optimizer.minLr > optimizer.lr) return Status::error("Session::trainStep: minLr is above lr");
  auto micro = microbatches(inputs[0].shape[0]);
  if (!micro.isOk()) return micro.status();
  const bool first = !prepared_;
  std::vector<Tensor> outputs;
  executor_.setResultsOnHoldersOnly(false); // (every rank's gradients)
  Status s = runMicrobatches(inputs, micro.value(), outputs);
  if (!s.isOk()) return s;
  const pxe::Stage &mine = exe_.stages(stage_);
  const bool last = stage_ + 1 == exe_.stages_size();
  if (first) {
    if (std::none_of(mine.output_grads().begin(), mine.output_grads().end(),
                     [](const std::string &g) { return !g.empty(); }))
      return Status::error("Session::trainStep: the executable returns no gradients (build it with "
                           "--parax-autodiff)");
    s = trainer_->bindParameters(executor_.hostBuffers());
    if (!s.isOk()) return s;
    for (int k = 0; k < mine.outputs_size() && last; ++k)
      if (lossOutput_ < 0 && !trainer_->isGrad(k) && mine.buffers(mine.outputs(k)).shape_size() == 0)
        lossOutput_ = k;
    if (last && lossOutput_ < 0)
      return Status::error("Session::trainStep: the executable returns no loss (a scalar result)");
  }
  // The same order as parax-run's step: average, apply, the moves of
  // parameters again, then the loss's mean over the replicas.
  s = trainer_->averageGradients(outputs, micro.value(), optimizer.zero);
  if (s.isOk()) s = trainer_->apply(optimizer, outputs, executor_.hostBuffers(), report.gradNorm);
  if (s.isOk()) s = executor_.hoistParameterMoves();
  if (!s.isOk()) return s;
  report.step = trainer_->steps();
  report.learningRate = trainer_->lastLearningRate();
  report.loss = 0;
  if (lossOutput_ >= 0) {
    for (float v : outputs[lossOutput_].f) report.loss += v;
    report.loss /= static_cast<double>(outputs[lossOutput_].f.size());
    s = trainer_->replicaMean(report.loss);
  }
  executor_.recycle(std::move(outputs));
  return s;
}

Status Session::generate(const Tensor &prompt, int64_t tokens, const Sampling &sampling, Tensor &sequence) {
  auto program = generationProgram(exe_);
  if (!program.isOk()) return program.status();
  const GenerationProgram &step = program.value();
  auto read = promptRows(prompt, tokens, step);
  if (!read.isOk()) return Status::error("Session::generate: " + read.status().message());
  PromptRows &p = read.value();
  auto micro = microbatches(p.rows);
  if (!micro.isOk()) return micro.status();
  Status s = prepare(generationInputs(step, p.sequence, p.width, replica_ * micro.value() * batch_, 0));
  if (!s.isOk()) return s;
  // Each microbatch its own KV caches (zeros: a new sequence).
  std::vector<Executor::CacheSet> caches(micro.value());
  std::vector<Runner> runners, none;
  for (Executor::CacheSet &held : caches) runners.push_back(runnerWithCaches(executor_, held));
  GenerationProgram noPrefill;
  Generator loop{exe_,          step,   noPrefill,     runners,    none,      size_,       replica_,
                 micro.value(), batch_, holdsResults_, p.sequence, p.lengths, p.rows,      p.length,
                 tokens,        0,      sampling,      -1,         false,     waits_.get()};
  if (size_ > 1)
    loop.barrier = [this](const char *which) {
      auto watched = waits_->watch(which);
      if (Status s = mpiBarrier(MPI_COMM_WORLD, which); !s.isOk()) {
        std::fprintf(stderr, "parax: %s\n", s.message().c_str());
        abortMpiJob();
      }
    };
  Generator::Result done;
  s = loop.run(done);
  if (!s.isOk()) return s;
  sequence = holdsResults_ && !done.results.empty() ? std::move(done.results[0]) : Tensor();
  return Status::ok();
}

} // namespace parax::runtime
