// parax-run - run a .pxe executable on CPU ranks under mpirun.
//
//   mpirun -np N parax-run model.pxe --weights W.safetensors \
//       --input tokens.npy [--input labels.npy] --output logits.npy [--steps K]
//   mpirun -np N parax-run step.pxe --weights W.safetensors [--prefill chunk.pxe] \
//       --input prompt.npy --generate K --output tokens.npy [--output logits.npy]
//   mpirun -np N parax-run train.pxe --weights W.safetensors --input tokens.npy \
//       --input labels.npy --optimizer adamw --lr 1e-3 --steps K --save-weights OUT.safetensors
//
// N must equal the executable's grid size. Every rank loads only its slice of
// the weights; the last stage's rank with all other coordinates 0 writes the
// outputs. A failing rank prints its error with its rank and ends the job.

#define OMPI_SKIP_MPICXX 1
#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/Communicator.h"
#include "parax/runtime/Executable.h"
#include "parax/runtime/Executor.h"
#include "parax/runtime/Generation.h"
#include "parax/runtime/PipelineSchedule.h"
#include "parax/runtime/StallWatchdog.h"

#include "GenerationLoop.h"
#include "Options.h"
#include "Grid.h"
#include "Runner.h"
#include "RunProfile.h"
#include "Training.h"
#ifdef PARAX_WITH_CUDA
#include "parax/runtime/CudaExecutor.h"
#endif

#include <mpi.h>
#include <sys/stat.h>

#include <algorithm>
#include <array>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <fstream>
#include <limits>
#include <memory>
#include <new>
#include <random>
#include <set>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

using namespace parax::runtime;
using namespace parax::run;

namespace {


#ifdef PARAX_WITH_CUDA
/// One optimizer step on the device: the step's gradient sums averaged
/// there, the global norm from their squares, the update applied.
Status deviceStep(CudaExecutor &gpu, Training &training, const OptimizerConfig &config,
                  const std::vector<Training::Update> &updates, int64_t micro, double &gradNorm) {
  auto squares = gpu.averageGradients(micro);
  if (!squares.isOk()) return squares.status();
  std::vector<double> perOutput;
  for (size_t i = 0; i < updates.size(); ++i) {
    perOutput.resize(std::max<size_t>(perOutput.size(), updates[i].output + 1), 0.0);
    perOutput[updates[i].output] = squares.value()[i];
  }
  Training::StepFactors f;
  Status s = training.beginStep(config, perOutput, f, gradNorm);
  if (!s.isOk() || f.skip) return s;
  CudaExecutor::OptimizerStep step{f.lr, config.beta1, config.beta2, config.eps, config.weightDecay,
                                   f.clip, f.correction1, f.correction2, {}};
  for (const Training::Update &u : updates) step.decays.push_back(u.decays);
  return gpu.applyOptimizer(step);
}
#endif

/// What the run summary says of ZeRO: the stage, and what of it the host
/// optimizer does not do.
std::string zeroSummary(const OptimizerConfig &optimizer, bool shares, bool onDevice) {
  if (!optimizer.zero) return "";
  if (!shares) return " (ZeRO: no box held by more than one rank, nothing to split)";
  std::string said = " (ZeRO-" + std::to_string(optimizer.zeroStage);
  if (optimizer.zeroStage >= 2 && !onDevice)
    said += std::string("; the host optimizer keeps whole gradient sums") +
            (optimizer.zeroStage >= 3 ? " and parameters" : "") + ", as ZeRO-1";
  return said + ")";
}

} // namespace

/// A checkpoint tensor no stage of `exe` reads is a model other than the
/// program's (a bias, a layer, a norm it does not build): refused, named.
void refuseUnusedWeights(const parax::pxe::Executable &exe, const Checkpoint &ckpt, const std::string &weights,
                         const std::function<void(const std::string &)> &die) {
  std::set<std::string> read;
  for (const auto &stage : exe.stages())
    for (const auto &buffer : stage.buffers())
      if (buffer.role() == parax::pxe::PARAMETER) {
        std::vector<int64_t> whole(buffer.global_shape().begin(), buffer.global_shape().end());
        for (const std::string &name : checkpointNames(buffer.param_name(), whole))
          read.insert(name);
      }
  std::vector<std::string> unused;
  for (const std::string &name : ckpt.tensorNames())
    if (!read.count(name)) unused.push_back(name);
  if (!unused.empty()) {
    std::string listed;
    for (size_t k = 0; k < unused.size() && k < 8; ++k) listed += (k ? ", " : "") + unused[k];
    if (unused.size() > 8) listed += ", ... (" + std::to_string(unused.size()) + " in all)";
    die(weights + ": the program reads no tensor named " + listed +
        ": this checkpoint holds a model other than the one compiled (build the model from its "
        "config.json), or pass --allow-unused-weights to run without them");
  }
}

/// --generate's prompts and programs: the step (and the prefill program
/// for the prompt's whole chunks), every row's tokens [rows, prompt +
/// generate] with its prompt in, and each row's prompt length (its tokens
/// before the first -1).
struct Prompts {
  GenerationProgram step, prefill;
  StatusOr<parax::pxe::Executable> prefillExe = parax::pxe::Executable();
  int64_t promptLength = 0, chunks = 0;
  std::vector<int32_t> sequence;      // [rows, promptLength + generate], on every rank
  std::vector<int64_t> promptLengths; // each row's: its tokens before the first -1
};

Prompts readPrompts(const std::vector<Tensor> &inputTensors, const parax::pxe::Executable &exe, int64_t rows,
                    long generate, const std::string &prefillPath,
                    const std::function<void(const std::string &)> &die) {
  Prompts p;
  if (inputTensors.size() != 1) die("--generate takes one --input: the prompt's tokens [rows, L]");
  const Tensor &prompt = inputTensors[0];
  if (!prompt.isInt || prompt.shape.size() != 2)
    die("--generate: the prompt must be integer tokens [rows, L], got " + prompt.shapeString());
  auto checked = generationProgram(exe);
  if (!checked.isOk()) die(checked.status().message());
  p.step = checked.value();
  p.promptLength = prompt.shape[1];
  if (p.promptLength + generate - 1 > p.step.capacity)
    die("the prompt's " + std::to_string(p.promptLength) + " tokens and " + std::to_string(generate) +
        " generated ones need " + std::to_string(p.promptLength + generate - 1) +
        " cache rows; the step's caches hold " + std::to_string(p.step.capacity) +
        " (build it with a larger --cache)");
  int64_t width = p.promptLength + generate;
  p.sequence.assign(rows * width, -1);
  p.promptLengths.assign(rows, p.promptLength);
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t *row = &prompt.i[r * p.promptLength];
    int64_t length = std::find_if(row, row + p.promptLength, [](int32_t t) { return t < 0; }) - row;
    for (int64_t t = length; t < p.promptLength; ++t)
      if (row[t] != -1)
        die("--generate: prompt row " + std::to_string(r) + " has token " + std::to_string(row[t]) +
            " at position " + std::to_string(t) + ", after the -1 that ends it (a shorter prompt is " +
            "padded with -1 at its end)");
    if (length == 0) die("--generate: prompt row " + std::to_string(r) + " is empty (it starts with -1)");
    p.promptLengths[r] = length;
    std::copy(row, row + length, &p.sequence[r * width]);
  }
  if (!prefillPath.empty()) {
    p.prefillExe = loadExecutable(prefillPath);
    if (!p.prefillExe.isOk()) die(p.prefillExe.status().message());
    auto pairs = prefillProgram(p.prefillExe.value(), exe, p.step);
    if (!pairs.isOk()) die(pairs.status().message());
    p.prefill = pairs.value();
    // Whole chunks of the shortest prompt; the rest of the prompts goes a token a step.
    p.chunks = *std::min_element(p.promptLengths.begin(), p.promptLengths.end()) / p.prefill.tokens;
  }
  return p;
}

/// Started by an MPI launcher (Open MPI, MPICH, PMIx, Slurm)? A single rank
/// started by hand runs without MPI: no launcher daemon is needed then.
bool launchedByMpi() {
  for (const char *name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"})
    if (std::getenv(name))
      return true;
  return false;
}

/// PARAX_COLLECTIVE_TIMEOUT (or PARAX_NCCL_TIMEOUT) in seconds; 0 when set
/// but not a positive number (main then says so), 300 when unset.
double collectiveTimeoutFromEnv() {
  const char *text = std::getenv("PARAX_COLLECTIVE_TIMEOUT");
  if (!text) text = std::getenv("PARAX_NCCL_TIMEOUT");
  if (!text) return 300;
  double seconds = std::atof(text);
  return seconds > 0 ? seconds : 0;
}

/// This process's rank as the launcher set it, before MPI_Init.
int launcherRank() {
  for (const char *name : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK", "SLURM_PROCID"})
    if (const char *value = std::getenv(name))
      return std::atoi(value);
  return 0;
}

/// Logits [rows, p, vocab] grown to [rows, positions, vocab], NaN after p.
void padPositions(Tensor &t, int64_t positions) {
  int64_t rows = t.shape[0], have = t.shape[1], vocab = t.shape[2];
  if (have == positions) return;
  std::vector<float> grown(rows * positions * vocab, std::numeric_limits<float>::quiet_NaN());
  for (int64_t r = 0; r < rows; ++r)
    std::copy(t.f.begin() + r * have * vocab, t.f.begin() + (r + 1) * have * vocab,
              grown.begin() + r * positions * vocab);
  t.f = std::move(grown);
  t.shape[1] = positions;
}

/// A scalar result (the loss) that collected several values: their mean.
void meanOfScalars(std::vector<Tensor> &results) {
  for (Tensor &r : results)
    if (r.shape.empty() && r.f.size() > 1) {
      double sum = 0;
      for (float v : r.f) sum += v;
      r.f.assign(1, static_cast<float>(sum / r.f.size()));
    }
}

/// A result tensor between ranks: its kind and shape, then its values.
void sendTensor(const Tensor &t, int to) {
  std::vector<int64_t> header = {t.isInt ? 1 : 0};
  header.insert(header.end(), t.shape.begin(), t.shape.end());
  MPI_Send(header.data(), static_cast<int>(header.size()), MPI_INT64_T, to, 0, MPI_COMM_WORLD);
  if (t.isInt)
    MPI_Send(t.i.data(), static_cast<int>(t.i.size()), MPI_INT32_T, to, 1, MPI_COMM_WORLD);
  else
    MPI_Send(t.f.data(), static_cast<int>(t.f.size()), MPI_FLOAT, to, 1, MPI_COMM_WORLD);
}

Tensor receiveTensor(int from) {
  MPI_Status status;
  MPI_Probe(from, 0, MPI_COMM_WORLD, &status);
  int count = 0;
  MPI_Get_count(&status, MPI_INT64_T, &count);
  std::vector<int64_t> header(count);
  MPI_Recv(header.data(), count, MPI_INT64_T, from, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  Tensor t;
  t.isInt = header[0] != 0;
  t.shape.assign(header.begin() + 1, header.end());
  if (t.isInt) {
    t.i.resize(t.numel());
    MPI_Recv(t.i.data(), static_cast<int>(t.i.size()), MPI_INT32_T, from, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  } else {
    t.f.resize(t.numel());
    MPI_Recv(t.f.data(), static_cast<int>(t.f.size()), MPI_FLOAT, from, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
  }
  return t;
}

int main(int argc, char **argv) {
  // An allocation that fails past prepare's check (the optimizer's state,
  // a gathered result): a named error, not an abort.
  std::set_new_handler([] {
    std::fputs("parax-run: out of host memory (an allocation failed; the program's buffers, its "
               "optimizer state and the results need more than this process may take)\n",
               stderr);
    std::_Exit(1);
  });
  const bool mpi = launchedByMpi();
  int rank = 0, size = 1;
  // How long one wait for the other ranks may take before the job ends
  // naming the rank and the operation: NCCL's watchdog, and MPI's
  // (StallWatchdog). Checked once the error can be reported (below).
  const double collectiveTimeout = collectiveTimeoutFromEnv();
  // Every point where a rank waits for all the others outside a collective
  // (MPI's start-up and shut-down, communicator set-up, the barriers around
  // each step) is watched like the collectives are: a rank that stalls there
  // ends the job, naming what the others were waiting in.
  std::unique_ptr<StallWatchdog> waits;
  if (mpi) {
    waits = std::make_unique<StallWatchdog>(launcherRank(), collectiveTimeout > 0 ? collectiveTimeout : 300);
    auto watched = waits->watch("MPI start-up (MPI_Init)");
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
  }
  auto finalize = [&] {
    if (!mpi) return;
    auto watched = waits->watch("MPI shut-down (MPI_Finalize)");
    MPI_Finalize();
  };
  auto die = [&](const std::string &message) {
    std::fprintf(stderr, "parax-run: rank %d: %s\n", rank, message.c_str());
    std::fflush(stderr);
    if (size > 1)
      MPI_Abort(MPI_COMM_WORLD, 1);
    finalize();
    std::exit(1);
  };

  Options opt = parseOptions(argc, argv, die);
  if (opt.help) {
    finalize();
    return 0;
  }
  const bool trains = opt.trains();
  if (!(collectiveTimeout > 0)) {
    const char *name = std::getenv("PARAX_COLLECTIVE_TIMEOUT") ? "PARAX_COLLECTIVE_TIMEOUT" : "PARAX_NCCL_TIMEOUT";
    die(std::string(name) + "=" + std::getenv(name) + ": not a positive number of seconds");
  }

  StatusOr<parax::pxe::Executable> exe = loadExecutable(opt.model);
  if (!exe.isOk()) die(exe.status().message());
  // The plan's ZeRO stage: AdamW's states split over the ranks holding
  // each box (1), the gradient sums too (2) and the parameters between
  // their uses (3) -- 2 and 3 on the CUDA backend's device optimizer.
  if (trains && !opt.zeroGiven && opt.optimizer.kind == "adamw" && exe.value().schedule().zero_stage() >= 1) {
    opt.optimizer.zeroStage = exe.value().schedule().zero_stage();
    opt.optimizer.zero = true;
  }
  int64_t grid = gridSize(exe.value());
  if (grid != size)
    die("the executable's grid has " + std::to_string(grid) + " ranks but mpirun started " +
        std::to_string(size) + " (use mpirun -np " + std::to_string(grid) + ")");

  std::vector<int64_t> shape(exe.value().grid().shape().begin(), exe.value().grid().shape().end());
  std::unique_ptr<Communicator> comm;
  if (size > 1 && opt.device == "cpu") {
    auto watched = waits->watch("communicator set-up (MPI_Comm_split)");
    auto created = createMpiCommunicator(shape, collectiveTimeout);
    if (!created.isOk()) die(created.status().message());
    comm = std::move(created.value());
  }
  auto ckpt = Checkpoint::open(opt.weights);
  if (!ckpt.isOk()) die(ckpt.status().message());
  if (!opt.allowUnusedWeights) refuseUnusedWeights(exe.value(), *ckpt.value(), opt.weights, die);
  std::vector<Tensor> inputTensors;
  for (const std::string &path : opt.inputs) {
    auto t = readNpy(path);
    if (!t.isOk()) die(t.status().message());
    inputTensors.push_back(std::move(t.value()));
  }

  // Data parallelism: the replicas (coordinates along "dp") take equal
  // shares of the inputs' rows, in order; microbatches: a share holding k
  // times the executable's batch runs as k microbatches, each flowing
  // through the pipeline stages in turn.
  const auto &coords = exe.value().ranks(rank).values();
  int64_t replicas = 1, replica = 0;
  int replicaAxis = -1; // the grid axis "dp"
  for (int i = 0; i < exe.value().grid().axis_names_size(); ++i)
    if (exe.value().grid().axis_names(i) == "dp") {
      replicas = exe.value().grid().shape(i);
      replica = coords[i];
      replicaAxis = i;
    }
  int64_t micro = 1, rows = 0;
  int64_t exeBatch = 0;
  for (const auto &buffer : exe.value().stages(0).buffers())
    if (buffer.role() == parax::pxe::INPUT && buffer.input_index() == 0 &&
        buffer.global_shape_size() > 0)
      exeBatch = buffer.global_shape(0);
  int64_t blocks = 1, block = 0; // --step-rows: the steps' blocks of rows, the current one
  if (!inputTensors.empty() && exeBatch > 0 && !inputTensors[0].shape.empty()) {
    rows = inputTensors[0].shape[0];
    if (opt.stepRows > 0) {
      if (rows % opt.stepRows)
        die("--step-rows " + std::to_string(opt.stepRows) + " does not divide input #0's " + std::to_string(rows) +
            " rows");
      blocks = rows / opt.stepRows;
      rows = opt.stepRows;
    }
    if (rows % (exeBatch * replicas))
      die(std::string(opt.stepRows > 0 ? "--step-rows takes " : "input #0 has ") + std::to_string(rows) + " rows, not a multiple of the executable's batch " +
          std::to_string(exeBatch) +
          (replicas > 1 ? " times its " + std::to_string(replicas) +
                              " data-parallel replicas (each takes an equal share of whole batches)"
                        : std::string()));
    micro = rows / (exeBatch * replicas);
  }
  // --generate: the step at position t feeds every row's token t (the
  // prompt's, then the ones generated); the KV caches are given as shapes
  // without values, so each stage keeps its own where it runs. With
  // --prefill, the prompt's whole chunks go through that program instead.
  Prompts prompts;
  if (opt.generate > 0) prompts = readPrompts(inputTensors, exe.value(), rows, opt.generate, opt.prefillPath, die);
  GenerationProgram &step = prompts.step, &prefill = prompts.prefill;
  StatusOr<parax::pxe::Executable> &prefillExe = prompts.prefillExe;
  int64_t &promptLength = prompts.promptLength, &chunks = prompts.chunks;
  std::vector<int32_t> &sequence = prompts.sequence;
  std::vector<int64_t> &promptLengths = prompts.promptLengths;
  // Microbatch m of this replica: rows (replica * micro + m) * batch ..
  auto firstRowOf = [&](int64_t m) { return (replica * micro + m) * exeBatch; };
  auto inputsAt = [&](const GenerationProgram &program, int64_t t, int64_t m) {
    return generationInputs(program, sequence, promptLength + opt.generate, firstRowOf(m), t);
  };

  auto microbatch = [&](int64_t j) {
    std::vector<Tensor> slice;
    for (const Tensor &t : inputTensors) {
      if (t.shape.empty() || t.shape[0] != rows * blocks) {
        slice.push_back(t);
        continue;
      }
      slice.push_back(t.rowBlock(block * rows + (replica * micro + j) * exeBatch, exeBatch));
    }
    return slice;
  };

  // The backend: the CPU executor, or the CUDA one (one GPU per rank, the
  // local rank's; NCCL communicators when there are several ranks).
  // --generate over several microbatches a replica: each has its own KV
  // caches and its own runner of the step (and of the prefill program), so
  // that the pipeline stages work on different microbatches at once.
  const int64_t programs = opt.generate > 0 ? micro : 1;
  Executor cpu, cpuPrefill;
  std::vector<Executor::CacheSet> caches(programs); // the CPU backend's, per microbatch
  std::vector<Runner> runners(programs), prefills(programs); // per microbatch
  std::string sharing; // what the programs share
  int stageIndex = 0;
  size_t instructions = 0, hoisted = 0;
#ifdef PARAX_WITH_CUDA
  // The step may borrow the prefill's memory, and microbatch m's programs
  // microbatch 0's weights: lenders are declared (and prepared) first.
  std::vector<std::unique_ptr<CudaExecutor>> gpuPrefills, gpus;
  NcclCommunicator *nccl = nullptr;
#endif
  Status s = Status::ok();
  if (opt.device == "cpu") {
    s = cpu.prepare(exe.value(), rank, comm.get(), *ckpt.value(), opt.generate > 0 ? inputsAt(step, 0, 0) : microbatch(0));
    if (!s.isOk()) die(s.message());
    if (chunks > 0) {
      s = cpuPrefill.prepare(prefillExe.value(), rank, comm.get(), *ckpt.value(), inputsAt(prefill, 0, 0));
      if (!s.isOk()) die("--prefill: " + s.message());
    }
    // One executor a program; each run takes its microbatch's caches.
    for (int64_t m = 0; m < programs; ++m) {
      runners[m] = opt.generate > 0 ? runnerWithCaches(cpu, caches[m]) : runnerOf(cpu);
      if (chunks > 0) prefills[m] = runnerWithCaches(cpuPrefill, caches[m]);
    }
    if (!opt.profilePath.empty()) cpu.setProfiling(true);
    stageIndex = cpu.stage();
    instructions = cpu.instructionCount();
    hoisted = cpu.hoistedInstructions();
  } else {
#ifdef PARAX_WITH_CUDA
    int devices = cudaDeviceCount();
    if (devices == 0) die("--device cuda: no CUDA device");
    // The GPU: the rank's index among the ranks on its node (MPI-3's shared
    // memory split: whatever launched it -- mpirun, srun, a hostfile),
    // modulo the node's devices.
    int localRank = rank;
    if (mpi) {
      MPI_Comm node;
      if (MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node) == MPI_SUCCESS) {
        MPI_Comm_rank(node, &localRank);
        MPI_Comm_free(&node);
      }
    }
    int gpuIndex = localRank % devices;
    if (mpi) { // under a launcher even one rank gets NCCL (collectives over groups of one)
      auto watched = waits->watch("NCCL set-up");
      auto created = createNcclCommunicator(shape, rank, size, gpuIndex, collectiveTimeout);
      if (!created.isOk()) die(created.status().message());
      nccl = created.value();
      if (rank == 0 && isHostStaged(nccl))
        std::fprintf(stderr, "parax-run: %d ranks share %d GPU(s): collectives go through host "
                             "memory and MPI, not NCCL\n", size, devices);
    }
    using Share = CudaExecutor::Share;
    size_t sharedParameters = 0, stepParameters = 0, sharedCaches = 0, borrowedWeights = 0, sharedMoves = 0;
    for (int64_t m = 0; m < programs; ++m) {
      // Microbatch m > 0 borrows microbatch 0's weights; the step borrows
      // its prefill program's weights and caches.
      if (chunks > 0) {
        gpuPrefills.push_back(std::make_unique<CudaExecutor>());
        s = gpuPrefills[m]->prepare(prefillExe.value(), rank, nccl, *ckpt.value(), inputsAt(prefill, 0, m),
                                    gpuIndex, m > 0 ? gpuPrefills[0].get() : nullptr, Share::Weights);
        if (!s.isOk()) die("--prefill: " + s.message());
        prefills[m] = runnerOf(*gpuPrefills[m]);
        if (m > 0) borrowedWeights += gpuPrefills[m]->sharedParameters();
        sharedMoves += gpuPrefills[m]->sharedMoves();
      }
      gpus.push_back(std::make_unique<CudaExecutor>());
      if (trains) gpus[m]->keepLoadedParameters(); // the optimizer's fp32 masters start from them
      const CudaExecutor *lender = chunks > 0 ? gpuPrefills[m].get() : m > 0 ? gpus[0].get() : nullptr;
      s = gpus[m]->prepare(exe.value(), rank, nccl, *ckpt.value(),
                           opt.generate > 0 ? inputsAt(step, 0, m) : microbatch(0), gpuIndex, lender,
                           chunks > 0 ? Share::WeightsAndCaches : Share::Weights);
      if (!s.isOk()) die(s.message());
      runners[m] = runnerOf(*gpus[m]);
      sharedParameters += gpus[m]->sharedParameters();
      stepParameters += gpus[m]->offeredParameters();
      sharedCaches += gpus[m]->sharedCaches();
      sharedMoves += gpus[m]->sharedMoves();
      if (m > 0 && chunks == 0) borrowedWeights += gpus[m]->sharedParameters();
    }
    if (chunks > 0)
      sharing = ", " + std::to_string(sharedParameters) + " of " + std::to_string(stepParameters) +
                " parameter(s) and " + std::to_string(sharedCaches) +
                " KV cache(s) shared with the prefill program";
    if (programs > 1)
      sharing += ", " + std::to_string(borrowedWeights) + " parameter(s) of microbatch 0 shared with the " +
                 std::to_string(programs - 1) + " other microbatch program(s)";
    if (sharedMoves > 0)
      sharing += ", " + std::to_string(sharedMoves) + " result(s) of parameter moves shared with another program";
    size_t borrowing = 0; // programs whose temporaries live in another's memory
    for (const auto *all : {&gpuPrefills, &gpus})
      for (const auto &program : *all) borrowing += program->borrowsTemporaries();
    if (borrowing > 0)
      sharing += ", " + std::to_string(borrowing) + " program(s) running in another's temporary memory";
    stageIndex = gpus[0]->stage();
    instructions = gpus[0]->instructionCount();
    hoisted = gpus[0]->hoistedInstructions();
#endif
  }
  // A step over pipeline stages with several microbatches (or model
  // chunks): each stage runs its program in ranges (a forward and a
  // backward pass; interleaved: those of each chunk) in its schedule's
  // order (runtime::pipelineSteps: 1F1B, GPipe, interleaved 1F1B), each
  // microbatch in flight keeping its activations in a set of its own. The
  // CUDA backend runs a plan's GPipe as 1F1B (its sends may wait for their
  // receives, and GPipe's last stage would send a gradient before the
  // first stage, still sending activations, receives it), and receives a
  // step's inputs together with the step before's sends
  // (CudaExecutor::exchange).
  const int stages = exe.value().stages_size();
  const bool chunked = exe.value().schedule().chunks() > 1;
  if (chunked && opt.generate > 0) die("--generate: this executable runs model chunks (interleaved 1F1B): plan it for inference");
  const bool pipelined = (micro > 1 || chunked) && stages > 1 && opt.generate <= 0;
  const std::string kind = opt.device == "cuda" && exe.value().schedule().kind() == "gpipe"
                               ? std::string("1f1b") : exe.value().schedule().kind();
  auto scheduleOf = [&](int stage) {
    auto ranges = pipelineRanges(exe.value(), stage);
    if (!ranges.isOk()) die(ranges.status().message());
    auto steps = pipelineSteps(ranges.value(), kind, stage, stages, micro);
    if (!steps.isOk()) die(steps.status().message());
    return std::make_pair(ranges.value(), steps.value());
  };
  std::vector<PipelineRange> ranges;
  PipelineSteps pipeline;
  if (pipelined) std::tie(ranges, pipeline) = scheduleOf(stageIndex);
  const int64_t sets = pipelined ? microbatchesInFlight(pipeline, ranges) : 1;
  long long heldSets[2] = {1, 0}; // CUDA: activation sets this rank holds, their bytes
  // On CUDA the optimizer runs on the device: the gradients, fp32 masters
  // and moments stay there (PARAX_CUDA_OPTIMIZER=host: fp32 masters on the
  // host, each step's gradients copied there and the parameters back).
  bool deviceOptimizer = false;
#ifdef PARAX_WITH_CUDA
  const char *optimizerAt = std::getenv("PARAX_CUDA_OPTIMIZER");
  if (optimizerAt && std::string(optimizerAt) != "host" && std::string(optimizerAt) != "device")
    die(std::string("PARAX_CUDA_OPTIMIZER=") + optimizerAt + ": host or device");
  deviceOptimizer = trains && opt.device == "cuda" && !(optimizerAt && std::string(optimizerAt) == "host");
  if (opt.device == "cuda" && (pipelined || deviceOptimizer)) {
    // (the device optimizer takes each gradient right after its range; or
    // without ranges, right after the instruction that writes it)
    s = gpus[0]->holdActivations(static_cast<int>(sets), pipelined ? chunksInFlight(pipeline, ranges)
                                                                    : std::vector<int64_t>{},
                                 ranges, deviceOptimizer);
    if (!s.isOk()) die(s.message());
    heldSets[0] = gpus[0]->activationSets();
    heldSets[1] = static_cast<long long>(gpus[0]->activationBytes());
  }
  if (mpi && opt.device == "cuda") // the summary's: the most a rank holds (stage 0's)
    MPI_Allreduce(MPI_IN_PLACE, heldSets, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
#endif
  auto shutdown = [&] {
    comm.reset(); // frees the sub-communicators before MPI ends
#ifdef PARAX_WITH_CUDA
    destroyNcclCommunicator(nccl);
#endif
    finalize();
  };
  // What this rank holds of the model: its box of every parameter.
  int64_t loaded = 0;
  for (const parax::pxe::Buffer &b : exe.value().stages(stageIndex).buffers())
    if (b.role() == parax::pxe::PARAMETER) loaded += numelOf(std::vector<int64_t>(b.shape().begin(), b.shape().end()));
  // ...and, on CUDA, the device memory it took: at prepare (--steps 0), and
  // after the steps with the device optimizer's (ZeRO-3's chunks in place of
  // the boxes it freed) and the scratch the steps grew.
  auto holdings = [&] {
    std::string memory = std::to_string(loaded) + " parameter values loaded";
#ifdef PARAX_WITH_CUDA
    if (opt.device == "cuda") {
      const BufferPlan &t = gpus[0]->temporaries();
      size_t bytes = 0, scratch = 0; // every program's, every microbatch's
      for (const auto *all : {&gpuPrefills, &gpus})
        for (const auto &program : *all) bytes += program->deviceBytes(), scratch += program->scratchBytes();
      memory += ", " + std::to_string(bytes) + " bytes of device memory";
      if (scratch > 0) memory += " (kernel scratch " + std::to_string(scratch) + ")";
      if (t.arenaBytes > 0)
        memory += ", temporaries share " + std::to_string(t.arenaBytes) + " bytes (live at once: " +
                  std::to_string(t.peakLiveBytes) + ", one allocation each: " + std::to_string(t.unsharedBytes) +
                  "; " + std::to_string(gpus[0]->inPlaceTemporaries()) + " more written in place)";
      if (gpus[0]->activationSets() > 1)
        memory += " and " + std::to_string(gpus[0]->activationSets()) + " activation sets hold " +
                  std::to_string(gpus[0]->activationBytes()) + " bytes";
    }
#endif
    return memory;
  };
  if (opt.steps == 0) { // prepare only: every rank says what it holds
#ifdef PARAX_WITH_CUDA
    if (opt.device == "cuda" && !gpus[0]->memoryPeak().empty())
      std::printf("parax-run: rank %d: %s\n", rank, gpus[0]->memoryPeak().c_str());
#endif
    std::printf("parax-run: rank %d (stage %d) on %s: %s%s\n", rank, stageIndex, opt.device.c_str(), holdings().c_str(),
                sharing.c_str());
    std::fflush(stdout);
    shutdown();
    return 0;
  }

  std::vector<double> times;
  // A training step's gradient averaging (the data-parallel reduction) and
  // optimizer update on the host, each step (--profile).
  std::vector<double> syncTimes, optimizerTimes;
  // ... and the averaging's all-reduces, by the ranks they span and their
  // message's bytes: each step's summed seconds, the calls of one step.
  std::map<Training::ReduceKey, std::vector<double>> reduceTimes;
  std::map<Training::ReduceKey, int> reduceCalls;
  double prefillSeconds = 0; // --prefill: the prompt's chunks
  std::vector<Tensor> results; // this stage's outputs, microbatches joined
  // A training step's gradients (every rank's boxes) and the optimizer.
  std::unique_ptr<Training> training;
  if (opt.generate <= 0) training = std::make_unique<Training>(exe.value(), rank, mpi, waits.get());
  auto tallyReduces = [&] { // (kept a step only for --profile: a long run's would grow)
    std::map<Training::ReduceKey, Training::ReduceTally> step = training->takeReduceTally();
    if (opt.profilePath.empty()) return;
    for (const auto &[key, tally] : step) {
      reduceTimes[key].push_back(tally.seconds);
      reduceCalls[key] = tally.calls;
    }
  };
  // The parameters the optimizer updates: the CPU executor's own buffers;
  // on CUDA, fp32 master copies on the host (the device holds the storage
  // dtype), written back to the device after each step.
  std::vector<Tensor> masters;
#ifdef PARAX_WITH_CUDA
  if (trains && opt.device == "cuda") masters = gpus[0]->takeLoadedParameters();
#endif
  std::vector<Tensor> &parameters = opt.device == "cpu" ? cpu.hostBuffers() : masters;
  if (trains) {
    s = training->bindParameters(parameters);
    if (!s.isOk()) die(s.message());
  }
  // --bias-update-speed: every router's correction bias, over every stage,
  // in one order (each rank sums its counts into its place; all add them).
  std::map<std::string, size_t> biasAt; // checkpoint name -> its first expert's place among the loads
  size_t biasLoads = 0;                 // every bias's experts
  if (opt.biasSpeed > 0) {
    for (const parax::pxe::Stage &stage : exe.value().stages())
      for (const parax::pxe::Instruction &inst : stage.instructions()) {
        if (inst.op() != "router" || inst.operands_size() != 3) continue;
        const parax::pxe::Buffer &bias = stage.buffers(inst.operands(2));
        const bool whole = std::all_of(bias.split().begin(), bias.split().end(),
                                       [](const parax::pxe::AxisList &axes) { return axes.axes_size() == 0; });
        if (bias.role() != parax::pxe::PARAMETER || bias.shape_size() != 1 || !whole)
          die("--bias-update-speed: stage " + std::to_string(stage.index()) +
              "'s router bias (buffer " + std::to_string(inst.operands(2)) + ") is not a whole parameter");
        if (biasAt.emplace(bias.param_name(), biasLoads).second) biasLoads += bias.shape(0);
      }
    if (biasAt.empty())
      die("--bias-update-speed: no router of this executable has a correction bias (DeepSeek-V3's "
          "e_score_correction_bias)");
  }
  // The step's expert loads (every rank's counts summed), then each bias
  // this rank holds moved by biasSpeed towards balance.
  auto balanceExperts = [&] {
    std::vector<double> loads(biasLoads, 0.0);
    const parax::pxe::Stage &mine = exe.value().stages(stageIndex);
    std::map<int32_t, std::vector<double>> counted;
    if (opt.device == "cpu") counted = cpu.takeExpertCounts();
#ifdef PARAX_WITH_CUDA
    if (opt.device == "cuda") {
      auto taken = gpus[0]->takeExpertCounts();
      if (!taken.isOk()) die(taken.status().message());
      counted = std::move(taken.value());
    }
#endif
    for (const auto &[id, counts] : counted)
      for (size_t e = 0; e < counts.size(); ++e) loads[biasAt.at(mine.buffers(id).param_name()) + e] += counts[e];
    if (mpi) {
      auto watched = waits->watch("summing the experts' loads (--bias-update-speed)");
      MPI_Allreduce(MPI_IN_PLACE, loads.data(), static_cast<int>(loads.size()), MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
    }
    std::vector<Tensor> moved(parameters.size()); // (on CUDA: the biases written to the device)
    for (const parax::pxe::Buffer &b : mine.buffers()) {
      auto found = b.role() == parax::pxe::PARAMETER ? biasAt.find(b.param_name()) : biasAt.end();
      if (found == biasAt.end()) continue;
      Tensor &bias = parameters[b.id()];
      const double *load = &loads[found->second];
      double mean = 0;
      for (int64_t e = 0; e < bias.numel(); ++e) mean += load[e] / static_cast<double>(bias.numel());
      for (int64_t e = 0; e < bias.numel(); ++e)
        bias.f[e] += static_cast<float>(opt.biasSpeed * ((mean > load[e]) - (mean < load[e])));
      if (opt.device == "cuda") moved[b.id()] = bias;
    }
#ifdef PARAX_WITH_CUDA
    if (opt.device == "cuda") {
      Status st = gpus[0]->updateParameters(moved);
      if (!st.isOk()) die("--bias-update-speed: " + st.message());
    }
#endif
  };
  if (!opt.loadOptimizer.empty()) { // AdamW's moments and step count, saved by --save-optimizer
    auto file = Checkpoint::open(opt.loadOptimizer);
    if (!file.isOk()) die("--load-optimizer: " + file.status().message());
    s = training->loadState(*file.value(), opt.loadOptimizer, opt.optimizer.zero);
    if (!s.isOk()) die("--load-optimizer: " + s.message());
  }
  std::vector<Training::Update> updates; // what each bound gradient updates (deviceOptimizer)
#ifdef PARAX_WITH_CUDA
  if (deviceOptimizer) {
    updates = training->updates(opt.optimizer);
    std::vector<CudaExecutor::Gradient> bound;
    for (const Training::Update &u : updates)
      bound.push_back({u.output, u.parameter, u.begin, u.end, u.size, u.axes, u.members, u.index, u.partRanks,
                       u.partialAxes, u.copies});
    CudaExecutor::OptimizerSetup setup;
    setup.adamw = opt.optimizer.kind == "adamw";
    setup.replicaAxis = replicaAxis;
    setup.replicas = replicas;
    setup.zero = training->sharesState(opt.optimizer);
    setup.shardSums = setup.zero && opt.optimizer.zeroStage >= 2;
    setup.shardParameters = setup.zero && opt.optimizer.zeroStage >= 3;
    s = gpus[0]->bindOptimizer(bound, setup, masters);
    for (int which = 0; s.isOk() && which < 2 && !opt.loadOptimizer.empty(); ++which) {
      std::vector<std::vector<float>> moments;
      for (const Training::Update &u : updates) moments.push_back(training->moment(u.output, which));
      s = gpus[0]->writeMoments(which, moments);
    }
    if (!s.isOk()) die(s.message());
    // The device holds the masters now: the host's fp32 copies of what the
    // optimizer updates go (4 bytes a parameter of the rank's boxes), read
    // back only to be saved; the rest (a bias --bias-update-speed moves)
    // stay.
    for (const Training::Update &u : updates) std::vector<float>().swap(masters[u.parameter].f);
    for (int which = 0; which < 2 && !opt.loadOptimizer.empty(); ++which)
      for (const Training::Update &u : updates) std::vector<float>().swap(training->moment(u.output, which));
  }
#endif
  // A schedule decays over this run's steps unless told otherwise (a
  // resumed run counts on from the saved step).
  if (trains && opt.optimizer.decaySteps == 0) opt.optimizer.decaySteps = training->steps() + opt.steps;
  if (trains && opt.optimizer.minLr > opt.optimizer.lr) die("--min-lr is above --lr");
  std::vector<float> losses; // --optimizer: each step's loss (the last stage's)
  double gradNorm = 0;       // the last step's, before clipping
  int lossOutput = -1;       // the last stage's scalar result that is not a gradient
  for (int k = 0; training && k < exe.value().stages(stageIndex).outputs_size(); ++k)
    if (lossOutput < 0 && !training->isGrad(k) && stageIndex + 1 == exe.value().stages_size() &&
        exe.value().stages(stageIndex).buffers(exe.value().stages(stageIndex).outputs(k)).shape_size() == 0)
      lossOutput = k;
  if (trains && lossOutput < 0 && stageIndex + 1 == exe.value().stages_size())
    die("--optimizer: the executable returns no loss (a scalar result): build it with --parax-autodiff");
  for (LossTerm &t : opt.terms) {
    if (stageIndex + 1 == exe.value().stages_size())
      for (int k = 0; k < exe.value().stages(stageIndex).output_terms_size(); ++k)
        if (exe.value().stages(stageIndex).output_terms(k) == t.term) t.output = k;
    if (trains && !t.path.empty() && rank == writerOf(exe.value(), 0) && t.output < 0)
      die(std::string(t.flag) + ": the executable returns no " + t.noun + " (" + t.missing + ")");
  }
  // --per-token-loss: every label_count gives the step's count of labels
  // that are not ignore_index (every replica's and microbatch's rows,
  // which every rank holds), over the step's microbatches x replicas, so
  // that the mean parax-run takes of their losses and gradients is the
  // mean over the step's counted labels. The labels: label_count's input.
  int labelsInput = -1;
  int32_t ignoreIndex = 0;
  if (opt.perTokenLoss) {
    if (!training || opt.generate > 0 || !std::any_of(exe.value().stages(0).output_grads().begin(),
                                                  exe.value().stages(0).output_grads().end(),
                                                  [](const std::string &g) { return !g.empty(); }))
      die("--per-token-loss: the executable is no training step (build it with --parax-autodiff)");
    bool counts = false;
    for (const auto &st : exe.value().stages())
      for (const auto &inst : st.instructions())
        counts |= inst.op() == "label_count";
    if (!counts)
      die("--per-token-loss: the executable counts no labels (build the model with ignore_index: every "
          "microbatch then counts all its tokens, and the two means are one)");
    for (const auto &inst : exe.value().stages(stageIndex).instructions()) {
      if (inst.op() == "shift")
        die("--per-token-loss: multi-token prediction's labels (shifted) are counted per microbatch only, not "
            "over the step yet; train it without --per-token-loss");
      if (inst.op() != "label_count") continue;
      const auto &labels = exe.value().stages(stageIndex).buffers(inst.operands(0));
      if (labels.role() != parax::pxe::INPUT || labels.global_shape_size() != labels.shape_size())
        die("--per-token-loss: label_count reads no whole input of labels on stage " + std::to_string(stageIndex));
      labelsInput = labels.input_index();
      ignoreIndex = static_cast<int32_t>(attrInt(inst.attrs(), "ignore_index"));
    }
    if (labelsInput >= static_cast<int>(inputTensors.size()))
      die("--per-token-loss: the labels are input #" + std::to_string(labelsInput) + ", which was not given");
  }
  // The step's count over micro x replicas (a step's rows are block's).
  auto stepLabelCount = [&]() -> float {
    const Tensor &labels = inputTensors[labelsInput];
    int64_t width = labels.numel() / std::max<int64_t>(labels.shape.empty() ? 1 : labels.shape[0], 1);
    int64_t counted = 0;
    for (int64_t k = block * rows * width; k < (block + 1) * rows * width; ++k) counted += labels.i[k] != ignoreIndex;
    return static_cast<float>(static_cast<double>(counted) / static_cast<double>(micro * replicas));
  };
  auto barrier = [&](const char *which) { // around each step, to time it
    if (size == 1) return;
    auto watched = waits->watch(which);
    MPI_Barrier(MPI_COMM_WORLD);
  };
  // The writer: last stage, every other coordinate 0. With data
  // parallelism, each replica's rank so placed sends it the replica's
  // results, which it joins in replica order (a scalar: the mean).
  bool replicaWriter = stageIndex + 1 == exe.value().stages_size();
  for (int i = 0; i < coords.size(); ++i)
    if (exe.value().grid().axis_names(i) != "pp" && exe.value().grid().axis_names(i) != "dp" && coords[i] != 0)
      replicaWriter = false;
  bool writer = replicaWriter && replica == 0;
  // --log-json: the rank that prints the steps writes their lines.
  std::ofstream logJson;
  if (writer && !opt.logJsonPath.empty()) {
    logJson.open(opt.logJsonPath);
    if (!logJson) die("--log-json: cannot write '" + opt.logJsonPath + "'");
  }
  // The program's results in order: a gradient's checkpoint name, else
  // "". Gradients are read back from the device and gathered whole only
  // when --output (as far as it reaches) or --output-dir writes them.
  std::vector<std::string> resultNames;
  auto sources = resultSources(exe.value());
  for (const auto &from : sources) {
    const auto &stage = exe.value().stages(from[0].stage);
    for (LossTerm &t : opt.terms)
      if (from[0].output < stage.output_terms_size() && stage.output_terms(from[0].output) == t.term)
        t.result = static_cast<int>(resultNames.size());
    resultNames.push_back(from[0].output < stage.output_grads_size() ? stage.output_grads(from[0].output) : "");
  }
  bool gradients = std::any_of(resultNames.begin(), resultNames.end(), [](const std::string &n) { return !n.empty(); });
  bool writesGradients = opt.generate <= 0 && gradients &&
                         (!opt.outputDir.empty() || std::any_of(resultNames.begin(),
                                                            resultNames.begin() + std::min(opt.outputs.size(), resultNames.size()),
                                                            [](const std::string &n) { return !n.empty(); }));
  // Weights and optimizer state: one file, gathered whole on the writer;
  // or a folder (a path ending in '/', or an existing folder), a sharded
  // checkpoint each rank writes its share of (whole tensors spread over
  // the ranks), with rank 0's index; or (--save-format boxes) each rank's
  // own boxes in a file of its own, nothing gathered, with rank 0's index.
  auto makeFolder = [&](const std::string &path) {
    std::string folder = path.back() == '/' ? path.substr(0, path.size() - 1) : path;
    if (::mkdir(folder.c_str(), 0755) != 0 && errno != EEXIST) die(folder + ": cannot create the folder");
    return folder;
  };
  // The device optimizer's ZeRO masters as this rank's chunks, per
  // gradient output (read back for a box-wise save of the weights).
  std::vector<std::vector<float>> masterChunks;
  // Each save's identity, in every file it writes and in its index (written
  // last, once every rank's files are): a loader refuses files of another
  // save (a save that died part way, its index still the last one's).
  auto saveIdentity = [&]() {
    unsigned long long id[2] = {std::random_device{}(),
                                static_cast<unsigned long long>(
                                    std::chrono::system_clock::now().time_since_epoch().count())};
    if (mpi && size > 1) MPI_Bcast(id, 2, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
    char text[64];
    std::snprintf(text, sizeof text, "%llx-%llx", id[0], id[1]);
    return std::string(text);
  };
  // Every rank's files written (or not): the index is written only then,
  // and only if all were.
  auto allWritten = [&](const Status &mine) {
    int ok = mine.isOk() ? 1 : 0;
    if (mpi && size > 1) MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
    return ok == 1;
  };
  // Each rank's file's size and checksum (after it is written; a failure
  // joins `st`), then, once every rank's files are, gathered on rank 0 for
  // the index, by the file name of each rank that wrote one.
  auto digestOf = [&](const std::string &file, bool wrote, Status &st) {
    std::array<uint64_t, 3> mine = {0, 0, 0};
    if (wrote && st.isOk()) {
      StatusOr<FileDigest> d = digestFile(file);
      if (d.isOk()) mine = {1, d.value().bytes, d.value().crc32};
      else st = d.status();
    }
    return mine;
  };
  auto gatherDigests = [&](const std::array<uint64_t, 3> &mine, const std::function<std::string(int)> &nameOf) {
    std::vector<uint64_t> all(3 * std::max(size, 1));
    if (mpi && size > 1) MPI_Gather(mine.data(), 3, MPI_UINT64_T, all.data(), 3, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    else std::copy(mine.begin(), mine.end(), all.begin());
    std::map<std::string, FileDigest> digests;
    for (int r = 0; r < std::max(size, 1); ++r)
      if (all[3 * r]) digests[nameOf(r)] = FileDigest{all[3 * r + 1], static_cast<uint32_t>(all[3 * r + 2])};
    return digests;
  };
  auto save = [&](const std::string &path, bool state) {
    if (opt.saveFormat == "boxes") {
      BoxCheckpoint boxes;
      Status st = Status::ok();
      if (state) st = training->optimizerStateBoxes(boxes);
      else if (!masterChunks.empty()) st = training->parameterChunkBoxes(parameters, masterChunks, boxes);
      else training->parameterBoxes(parameters, "", boxes);
      if (st.isOk()) st = training->gatherRecords(boxes.records);
      if (!st.isOk()) die(st.message());
      std::string folder = makeFolder(path);
      int ranks = exe.value().ranks_size();
      std::string id = saveIdentity();
      if (!boxes.tensors.empty())
        st = writeSafetensors(folder + "/" + boxFileName(rank, ranks), boxes.tensors, id);
      auto mine = digestOf(folder + "/" + boxFileName(rank, ranks), !boxes.tensors.empty(), st);
      if (!allWritten(st)) die(st.isOk() ? "another rank could not write its part of " + folder : st.message());
      auto digests = gatherDigests(mine, [&](int r) { return boxFileName(r, ranks); });
      if (rank == 0) st = writeBoxIndex(folder, boxes.records, ranks, id, digests);
      if (!st.isOk()) die(st.message());
      return;
    }
    bool sharded = isFolderPath(path);
    int to = sharded ? Training::kEveryRank : writerOf(exe.value(), 0);
    std::map<std::string, Tensor> tensors;
    Training::Layout layout;
    Status st = state ? training->gatherState(to, tensors, &layout)
                      : training->gatherParameters(parameters, to, tensors, "", &layout);
    if (!st.isOk()) die(st.message());
    if (!sharded) {
      if (writer) st = writeSafetensors(path, tensors);
      if (!st.isOk()) die(st.message());
      return;
    }
    std::string folder = makeFolder(path);
    int shards = 0;
    for (const auto &[name, rank] : layout.writer) shards = std::max(shards, rank + 1);
    std::map<std::string, std::string> weightMap;
    for (const auto &[name, rank] : layout.writer) weightMap[name] = shardFileName(rank, shards);
    std::string id = saveIdentity();
    if (!tensors.empty()) st = writeSafetensors(folder + "/" + shardFileName(rank, shards), tensors, id);
    auto mine = digestOf(folder + "/" + shardFileName(rank, shards), !tensors.empty(), st);
    if (!allWritten(st)) die(st.isOk() ? "another rank could not write its shard of " + folder : st.message());
    auto digests = gatherDigests(mine, [&](int r) { return shardFileName(r, shards); });
    if (rank == 0) st = writeSafetensorsIndex(folder, weightMap, layout.bytes, id, digests);
    if (!st.isOk()) die(st.message());
  };
#ifdef PARAX_WITH_CUDA
  // The device optimizer's masters (for --save-weights) and moments (for
  // --save-optimizer), read back to the host for writing, nothing more.
  // Under ZeRO the masters are all-gathered, but for a box-wise
  // checkpoint: each rank's chunks, nothing gathered.
  auto readDeviceState = [&]() {
    Status st = Status::ok();
    if (!opt.saveWeights.empty() && opt.saveFormat == "boxes" && training->sharesState(opt.optimizer)) {
      auto chunks = gpus[0]->readMasterChunks();
      if (!chunks.isOk()) die(chunks.status().message());
      masterChunks.assign(exe.value().stages(stageIndex).outputs_size(), {});
      for (size_t i = 0; i < updates.size(); ++i) masterChunks[updates[i].output] = std::move(chunks.value()[i]);
    } else if (!opt.saveWeights.empty()) {
      st = gpus[0]->readMasters(masters);
    }
    if (!st.isOk()) die(st.message());
    for (int which = 0; which < 2 && !opt.saveOptimizer.empty(); ++which) {
      auto moments = gpus[0]->readMoments(which);
      if (!moments.isOk()) die(moments.status().message());
      for (size_t i = 0; i < updates.size(); ++i)
        training->moment(updates[i].output, which) = std::move(moments.value()[i]);
    }
  };
#endif
  // --save-every K: every K optimizer steps (counting a resumed run's),
  // but the last, a checkpoint of the step beside the one the run ends
  // with: OUT/ as OUT/step-0000000K/, OUT.safetensors as
  // OUT-step-0000000K.safetensors.
  auto saveStep = [&](int64_t t) {
    char tag[32];
    std::snprintf(tag, sizeof tag, "step-%08lld", static_cast<long long>(t));
    auto at = [&](const std::string &path) { // (a file's path has no trailing '/')
      if (isFolderPath(path) || opt.saveFormat == "boxes") return makeFolder(path) + "/" + tag + "/";
      size_t dot = path.rfind(".safetensors");
      return (dot == std::string::npos ? path : path.substr(0, dot)) + "-" + tag + ".safetensors";
    };
#ifdef PARAX_WITH_CUDA
    if (deviceOptimizer) readDeviceState();
#endif
    if (!opt.saveWeights.empty()) save(at(opt.saveWeights), false);
    if (!opt.saveOptimizer.empty()) save(at(opt.saveOptimizer), true);
  };
  if (opt.generate > 0) {
    GenerationLoop loop{exe.value(), step,          prefill,  runners,      prefills, size,
                        replica,     micro,         exeBatch, replicaWriter, sequence, promptLengths, rows,
                        promptLength, opt.generate,     chunks,   opt.sampling,     opt.stopToken, opt.outputs.size() > 1,
                        waits.get(), [&](const std::string &m) { die(m); }, barrier, !opt.quiet};
    GenerationLoop::Result done = loop.run();
    times = std::move(done.times);
    prefillSeconds = done.prefillSeconds;
    results = std::move(done.results);
  } else {
    std::vector<std::vector<Tensor>> activations(opt.device == "cpu" ? sets : 0); // the CPU backend's sets
    const int n = static_cast<int>(instructions);
    // Microbatch m's range r of the stage's program (pipelineRanges). Its
    // gradients are summed after each backward range, the step's last
    // microbatch's reduced over the replicas as the range makes them; its
    // outputs joined after its last range.
    auto part = [&](int64_t m, int r) {
      const int begin = ranges[r].begin, end = ranges[r].end;
      Status st = Status::ok();
      if (opt.device == "cpu") {
        std::vector<Tensor> &held = activations[m % sets];
        cpu.swapActivations(held);
        if (begin == 0) st = cpu.setInputs(microbatch(m));
        if (st.isOk()) st = cpu.runRange(begin, end);
        if (st.isOk() && end == n) st = training->join(results, cpu.outputs());
        cpu.swapActivations(held);
      } else {
#ifdef PARAX_WITH_CUDA
        CudaExecutor &gpu = *gpus[0];
        st = gpu.useActivations(m);
        if (st.isOk() && begin == 0) st = gpu.setInputs(microbatch(m));
        const bool last = end == n && m + 1 == micro, backward = ranges[r].backward;
        if (st.isOk() && backward && m + 1 == micro && deviceOptimizer) st = gpu.streamGradients(m == 0, r);
        if (st.isOk()) st = gpu.runRange(begin, end, !last);
        if (st.isOk() && backward && m + 1 < micro && deviceOptimizer) st = gpu.accumulateGradients(m == 0, r);
        if (st.isOk() && end == n) st = training->join(results, gpu.outputs());
#endif
      }
      if (!st.isOk()) die(st.message());
    };
    // A pipeline step's items: on CUDA their leading receives first, in
    // one group with the sends the step before held.
    auto runStep = [&](const std::vector<PipelineItem> &items) {
#ifdef PARAX_WITH_CUDA
      if (opt.device == "cuda") {
        std::vector<std::pair<int64_t, int>> ahead;
        for (const PipelineItem &item : items) ahead.push_back({item.micro, ranges[item.range].begin});
        Status st = gpus[0]->exchange(ahead);
        if (!st.isOk()) die(st.message());
      }
#endif
      for (const PipelineItem &item : items) part(item.micro, item.range);
    };
    const bool whole = !pipelined; // each microbatch by run()
    for (int step = 0; step < opt.steps; ++step) {
      barrier("the barrier before a step");
      auto start = std::chrono::steady_clock::now();
      // The last step's results' memory, for this step's.
      if (opt.device == "cpu") cpu.recycle(std::move(results));
#ifdef PARAX_WITH_CUDA
      if (opt.device == "cuda") gpus[0]->recycle(std::move(results));
#endif
      results.clear();
      block = trains ? step % blocks : 0;
      if (labelsInput >= 0) {
        std::optional<float> count = stepLabelCount();
        if (opt.device == "cpu") cpu.setLabelCount(count);
#ifdef PARAX_WITH_CUDA
        else gpus[0]->setLabelCount(count);
#endif
      }
      for (const auto &items : pipeline) runStep(items);
      for (int64_t j = 0; whole && j < micro; ++j) {
        if (j > 0 || (step > 0 && (micro > 1 || blocks > 1))) { // prepare set microbatch 0 for the first step
          s = runners[0].setInputs(microbatch(j));
          if (!s.isOk()) die(s.message());
        }
#ifdef PARAX_WITH_CUDA
        // Every microbatch's gradients added to the sums as they are
        // written (their memory is not kept past that); the last's reduced
        // over the replicas then too.
        if (deviceOptimizer) s = gpus[0]->streamGradients(j == 0, -1, j + 1 == micro);
        if (!s.isOk()) die(s.message());
#endif
        s = runners[0].run();
        if (!s.isOk()) die(s.message());
        s = training->join(results, runners[0].outputs());
        if (!s.isOk()) die(s.message());
      }
      if (trains) {
        // The step's gradients averaged, clipped and applied; the moves of
        // parameters run again on the new values.
#ifdef PARAX_WITH_CUDA
        if (deviceOptimizer) {
          s = deviceStep(*gpus[0], *training, opt.optimizer, updates, micro, gradNorm);
        } else {
          auto began = std::chrono::steady_clock::now();
          s = training->averageGradients(results, micro, opt.optimizer.zero);
          auto averaged = std::chrono::steady_clock::now();
          if (s.isOk()) s = training->apply(opt.optimizer, results, parameters, gradNorm);
          if (s.isOk() && opt.device == "cuda") s = gpus[0]->updateParameters(masters);
          syncTimes.push_back(std::chrono::duration<double>(averaged - began).count());
          optimizerTimes.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - averaged).count());
          tallyReduces();
        }
#else
        auto began = std::chrono::steady_clock::now();
        s = training->averageGradients(results, micro, opt.optimizer.zero);
        auto averaged = std::chrono::steady_clock::now();
        if (s.isOk()) s = training->apply(opt.optimizer, results, parameters, gradNorm);
        syncTimes.push_back(std::chrono::duration<double>(averaged - began).count());
        optimizerTimes.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - averaged).count());
        tallyReduces();
#endif
        if (s.isOk() && opt.biasSpeed > 0) balanceExperts();
        if (s.isOk() && opt.device == "cpu") s = cpu.hoistParameterMoves();
        if (!s.isOk()) die(s.message());
        // The loss and its terms: each the mean over the microbatches and
        // the replicas.
        for (auto [output, values] : {std::pair(lossOutput, &losses), std::pair(opt.terms[0].output, &opt.terms[0].values),
                                      std::pair(opt.terms[1].output, &opt.terms[1].values)}) {
          if (output < 0) continue;
          double mean = 0;
          for (float v : results[output].f) mean += v;
          mean /= static_cast<double>(results[output].f.size());
          s = training->replicaMean(mean);
          if (!s.isOk()) die(s.message());
          values->push_back(static_cast<float>(mean));
        }
      }
      barrier("the barrier after a step");
      times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
      if (trains && writer && (!opt.quiet || logJson.is_open())) {
        std::string balance, balanceJson; // the loss's terms
        for (const LossTerm &t : opt.terms)
          if (!t.values.empty()) {
            char text[96];
            std::snprintf(text, sizeof text, " (%s %.6f)", t.label, t.values.back());
            balance += text;
            balanceJson += std::string(", \"") + t.file + "\": " + jsonNumber(t.values.back());
          }
        // Progress: the step's time, its tokens a second, and what the
        // steps left take at the median of the last (at most 32) steps --
        // not of them all, which a long run would sort every step.
        std::vector<double> sorted(times.end() - std::min<size_t>(times.size(), 32), times.end());
        std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
        long long left = static_cast<long long>(std::llround(sorted[sorted.size() / 2] * (opt.steps - step - 1)));
        double tokens = static_cast<double>(rows) *
                        (!inputTensors.empty() && inputTensors[0].shape.size() > 1 ? inputTensors[0].shape[1] : 1);
        bool clipped = opt.optimizer.clipNorm > 0 && gradNorm > opt.optimizer.clipNorm;
        if (!opt.quiet) {
          std::printf("parax-run: step %lld: loss %.6f%s, gradient norm %.6f%s, learning rate %.6g; %.1f ms, "
                      "%.0f tokens/s, %lld:%02lld:%02lld left\n",
                      static_cast<long long>(training->steps()), losses.back(), balance.c_str(), gradNorm,
                      clipped ? " (clipped)" : "", training->lastLearningRate(), 1e3 * times.back(),
                      tokens / times.back(), left / 3600, left / 60 % 60, left % 60);
          std::fflush(stdout);
        }
        if (logJson.is_open()) {
          logJson << "{\"step\": " << training->steps() << ", \"loss\": " << jsonNumber(losses.back())
                  << balanceJson << ", \"grad_norm\": " << jsonNumber(gradNorm)
                  << ", \"clipped\": " << (clipped ? "true" : "false")
                  << ", \"lr\": " << jsonNumber(training->lastLearningRate()) << ", \"seconds\": "
                  << jsonNumber(times.back()) << ", \"tokens_per_s\": " << jsonNumber(tokens / times.back())
                  << ", \"eta_s\": " << left << "}\n";
          logJson.flush();
          if (!logJson) die("--log-json: writing '" + opt.logJsonPath + "' failed");
        }
      }
      if (opt.saveEvery > 0 && step + 1 < opt.steps && training->steps() % opt.saveEvery == 0) saveStep(training->steps());
    }
#ifdef PARAX_WITH_CUDA
    // The device optimizer's gradients, masters and moments, read back
    // where something writes them (every rank: under ZeRO the gradients
    // and masters are all-gathered).
    if (deviceOptimizer && opt.steps > 0) {
      if (writesGradients) {
        auto sums = gpus[0]->gradientSums();
        if (!sums.isOk()) die(sums.status().message());
        for (size_t i = 0; i < updates.size(); ++i) results[updates[i].output] = std::move(sums.value()[i]);
      }
      readDeviceState();
    }
#endif
    // The gradients written: the mean over the microbatches and replicas
    // (with ZeRO each replica has only summed its own microbatches' yet;
    // the device optimizer's are the mean already).
    if (!trains) s = training->averageGradients(results, micro, false);
    else if (opt.optimizer.zero && !deviceOptimizer) s = training->meanOverReplicas(results);
    if (!s.isOk()) die(s.message());
  }
  meanOfScalars(results); // the loss: the mean over the microbatches

  // PARAX_CUDA_PROFILE=1: one more step, timed op by op on the GPU (every
  // rank runs it: its collectives need them all), after the timed steps.
  std::string profile;
#ifdef PARAX_WITH_CUDA
  const char *profiling = std::getenv("PARAX_CUDA_PROFILE");
  if (opt.device == "cuda" && profiling && std::string(profiling) == "1") {
    auto times = gpus[0]->profileStep();
    if (!times.isOk()) die(times.status().message());
    double total = 0;
    for (const CudaExecutor::OpTime &t : times.value()) total += t.ms;
    char line[160];
    for (const CudaExecutor::OpTime &t : times.value()) {
      std::snprintf(line, sizeof line, "parax-run: profile: %-20s %10.3f ms %5.1f %% (%d)\n", t.op.c_str(), t.ms,
                    total > 0 ? 100 * t.ms / total : 0.0, t.count);
      profile += line;
    }
    std::snprintf(line, sizeof line, "parax-run: profile: %-20s %10.3f ms (one step, kernel by kernel)\n",
                  "total", total);
    profile += line;
  }
#endif

  if (replicas > 1 && rows > 0 && replicaWriter) { // (no rows to share: every replica ran the same)
    auto watched = waits->watch("gathering the data-parallel replicas' results");
    // (Gradients are averaged over the replicas already.)
    if (!writer) {
      int to = rankWithReplica(exe.value(), rank, 0);
      for (size_t k = 0; k < results.size(); ++k)
        if (!training || !training->isGrad(k)) sendTensor(results[k], to);
    } else {
      for (int64_t other = 1; other < replicas; ++other) {
        int from = rankWithReplica(exe.value(), rank, other);
        for (size_t k = 0; k < results.size(); ++k) {
          if (training && training->isGrad(k)) continue;
          Tensor &r = results[k];
          Tensor part = receiveTensor(from);
          if (opt.generate > 0 && r.shape.size() == 3 && part.shape.size() == 3) {
            // Logits of replicas whose rows stopped after different numbers
            // of positions: NaN at the positions a replica did not run.
            int64_t positions = std::max(r.shape[1], part.shape[1]);
            padPositions(r, positions);
            padPositions(part, positions);
          }
          if (part.isInt != r.isInt || part.shape.size() != r.shape.size() ||
              !std::equal(part.shape.begin() + std::min<size_t>(1, part.shape.size()), part.shape.end(),
                          r.shape.begin() + std::min<size_t>(1, r.shape.size())))
            die("replica " + std::to_string(other) + " sent a result of shape " + part.shapeString() +
                " where replica 0 has " + r.shapeString());
          appendRows(r, part);
        }
      }
      meanOfScalars(results); // over the replicas' (equal) shares
    }
  }
  // The program's results in order, on the writer: the last stage's
  // outputs, and each gradient whole, gathered from its boxes (every rank
  // sends its own); with --save-weights the parameters likewise.
  if (opt.generate <= 0 && gradients) {
    std::map<int, Tensor> whole;
    if (writesGradients) s = training->gatherGradients(results, writerOf(exe.value(), 0), whole);
    if (!s.isOk()) die(s.message());
    if (writer) {
      std::vector<Tensor> ordered(sources.size());
      for (int k = 0; k < static_cast<int>(results.size()); ++k)
        ordered[outputResult(exe.value().stages(stageIndex), k)] = std::move(results[k]);
      for (auto &[r, t] : whole) ordered[r] = std::move(t);
      results = std::move(ordered);
    }
  }
  if (!opt.saveWeights.empty()) save(opt.saveWeights, false);
  if (!opt.saveOptimizer.empty()) save(opt.saveOptimizer, true);
  // The busiest expert-parallel rank of every rank's dispatches: the least
  // expert capacity (capacity= in the plan's workload) these steps fit.
  double expertLoad = 0;
  if (opt.device == "cpu") expertLoad = std::max(cpu.busiestExpertLoad(), cpuPrefill.busiestExpertLoad());
#ifdef PARAX_WITH_CUDA
  for (const auto *all : {&gpuPrefills, &gpus})
    for (const auto &program : *all) expertLoad = std::max(expertLoad, program->busiestExpertLoad());
#endif
  if (mpi) MPI_Allreduce(MPI_IN_PLACE, &expertLoad, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  if (writer) {
    for (auto [path, values] : {std::pair(&opt.lossesPath, &losses), std::pair(&opt.terms[0].path, &opt.terms[0].values),
                                std::pair(&opt.terms[1].path, &opt.terms[1].values)}) {
      if (path->empty()) continue;
      Tensor t = Tensor::floats({static_cast<int64_t>(values->size())});
      t.f = *values;
      s = writeNpy(*path, t);
      if (!s.isOk()) die(s.message());
    }
    if (opt.outputs.size() > results.size())
      die("the executable has " + std::to_string(results.size()) + " result(s) but " +
          std::to_string(opt.outputs.size()) + " --output files were given");
    for (size_t k = 0; k < opt.outputs.size(); ++k) {
      s = writeNpy(opt.outputs[k], results[k]);
      if (!s.isOk()) die(s.message());
    }
    if (!opt.outputDir.empty())
      for (size_t k = 0; k < results.size(); ++k) {
        // A gradient as its checkpoint name (a fused tensor's piece with
        // "@<offsets>", a stack of experts one file per expert), any other
        // result as result<k> (a loss term as balance_loss or mtp_loss);
        // '/' as '_'.
        bool named = k < resultNames.size() && !resultNames[k].empty();
        std::map<std::string, Tensor> files;
        if (named)
          putParameter(resultNames[k], std::move(results[k]), files);
        else {
          std::string file = "result" + std::to_string(k);
          for (const LossTerm &t : opt.terms)
            if (static_cast<int>(k) == t.result) file = t.file;
          files[file] = std::move(results[k]);
        }
        for (auto &[file, tensor] : files) {
          std::string name = file;
          std::replace(name.begin(), name.end(), '/', '_');
          s = writeNpy(opt.outputDir + "/" + name + ".npy", tensor);
          if (!s.isOk()) die(s.message());
        }
      }
    std::sort(times.begin(), times.end());
    std::string how = ", " + holdings();
    auto [ranges0, steps0] = pipelined ? scheduleOf(0) : std::make_pair(std::vector<PipelineRange>{}, PipelineSteps{});
    if (std::any_of(ranges0.begin(), ranges0.end(), [](const PipelineRange &r) { return r.backward; })) {
      const std::string &planned = exe.value().schedule().kind();
      const int chunks = std::max(exe.value().schedule().chunks(), 1);
      how += std::string(chunks > 1 ? ", schedule interleaved 1f1b (" + std::to_string(chunks) + " model chunks a stage) over "
                         : kind == "gpipe" ? ", schedule gpipe over " : ", schedule 1f1b over ") +
             std::to_string(micro) + " microbatches (" + std::to_string(microbatchesInFlight(steps0, ranges0)) +
             " in flight on stage 0)";
      if (planned == "interleaved" && chunks == 1)
        how += " (the plan chose interleaved 1F1B; this executable has one model chunk a stage)";
      if (planned == "gpipe" && kind != planned) how += " (the plan chose GPipe: 1F1B on the CUDA backend)";
      if (heldSets[0] > 1)
        how += ", up to " + std::to_string(heldSets[0]) + " activation sets a rank (at most " +
               std::to_string(heldSets[1]) + " bytes of them on the device)";
    }
    if (trains && !losses.empty()) {
      char balance[192] = "", line[416];
      for (const LossTerm &t : opt.terms)
        if (!t.values.empty()) {
          size_t used = std::strlen(balance);
          std::snprintf(balance + used, sizeof balance - used, " (%s %.6f -> %.6f)", t.label, t.values.front(),
                        t.values.back());
        }
      // (The device optimizer's moments: on the device, read back only to
      // be written.)
      size_t stateBytes = training->stateBytes();
      if (deviceOptimizer && opt.optimizer.kind == "adamw") {
        stateBytes = 0;
        for (const Training::Update &u : updates) stateBytes += 2 * sizeof(float) * (u.end - u.begin);
      }
      std::snprintf(line, sizeof line,
                    ", %s: loss %.6f -> %.6f%s over %zu step(s), %zu bytes of optimizer state on rank %d%s",
                    opt.optimizer.kind.c_str(), losses.front(), losses.back(), balance, losses.size(), stateBytes, rank,
                    zeroSummary(opt.optimizer, training->sharesState(opt.optimizer), deviceOptimizer).c_str());
      how += line;
#ifdef PARAX_WITH_CUDA
      if (deviceOptimizer)
        how += ", optimizer on the device (" + std::to_string(gpus[0]->optimizerBytes()) +
               " bytes: fp32 masters, moments, gradient sums; " + std::to_string(gpus[0]->readBackBytes()) +
               " bytes read back to write), " + std::to_string(gpus[0]->gradientsReducedEarly()) +
               " gradient reduction(s) issued during the backward pass";
      if (deviceOptimizer && gpus[0]->gradientBuckets().buckets > 0)
        how += ", " + std::to_string(gpus[0]->gradientBuckets().boxes) + " gradient boxes all-reduced in " +
               std::to_string(gpus[0]->gradientBuckets().buckets) + " bucket(s)";
      if (deviceOptimizer && gpus[0]->shardedParameters().boxes > 0) {
        CudaExecutor::ShardedParameters p = gpus[0]->shardedParameters();
        how += ", ZeRO-3: " + std::to_string(p.boxes) + " parameter boxes kept as this rank's chunks (" +
               std::to_string(p.chunkBytes) + " bytes), gathered into " + std::to_string(p.gatherBytes) +
               " bytes as the step reads them (" + std::to_string(p.gatheredAhead) +
               " all-gathers issued ahead of their reads)";
      }
#endif
    }
    if (hoisted > 0) how += ", " + std::to_string(hoisted) + " parameter move(s) run once at prepare";
    if (expertLoad > 0) {
      char line[160];
      std::snprintf(line, sizeof line,
                    ", expert routing: the busiest rank was sent %.4g x its own (token, choice) pairs "
                    "(the least capacity= these steps fit)", expertLoad);
      how += line;
    }
#ifdef PARAX_WITH_CUDA
    if (opt.device == "cuda" && gpus[0]->replaysGraph()) how += ", steps after the first as one CUDA graph";
    if (opt.device == "cuda" && gpus[0]->cacheReadsInPlace() > 0)
      how += ", " + std::to_string(gpus[0]->cacheReadsInPlace()) + " KV-cache concat(s) read in place by attention";
    if (opt.device == "cuda" && gpus[0]->cacheWritesInPlace() > 0)
      how += ", " + std::to_string(gpus[0]->cacheWritesInPlace()) + " KV cache(s) written in place";
    if (opt.device == "cuda" && gpus[0]->overlappedInstructions() > 0)
      how += ", " + std::to_string(gpus[0]->overlappedInstructions()) + " instruction(s) overlapping collectives";
#endif
    double median = times.empty() ? 0 : times[times.size() / 2]; // (a prefill may leave no step)
    if (opt.generate > 0) {
      // Every replica's rows (joined above): the most tokens a row gave
      // before its stop token (generate: some row never gave it).
      int64_t stoppedAfter = opt.stopToken >= 0 ? 0 : opt.generate, width = promptLength + opt.generate;
      const Tensor &all = results[0];
      for (int64_t row = 0; row < all.shape[0] && stoppedAfter < opt.generate; ++row) {
        const int32_t *tokens = &all.i[row * width];
        int64_t from = promptLengths[row], end = from + opt.generate;
        int64_t at = std::find(tokens + from, tokens + end, opt.stopToken) - tokens;
        stoppedAfter = std::max(stoppedAfter, at - from + 1);
      }
      int64_t shortest = *std::min_element(promptLengths.begin(), promptLengths.end());
      std::string promptText = shortest == promptLength
                                   ? "a prompt of " + std::to_string(promptLength)
                                   : "prompts of " + std::to_string(shortest) + " to " + std::to_string(promptLength);
      char prefilled[96] = "";
      if (chunks > 0)
        std::snprintf(prefilled, sizeof prefilled, ", prefill of %lld chunk(s) of %lld tokens in %.3f ms",
                      static_cast<long long>(chunks), static_cast<long long>(prefill.tokens), 1e3 * prefillSeconds);
      how = ", " + std::to_string(opt.generate) + " token(s) generated for each of " + std::to_string(rows) +
            " row(s) after " + promptText + ", " +
            std::to_string(static_cast<long long>(median > 0 ? rows / median : 0)) + " tokens/s at the median step" +
            prefilled + sharing +
            (stoppedAfter < opt.generate
                 ? ", every row gave the stop token after " + std::to_string(stoppedAfter) + " token(s)"
                 : std::string()) +
            how;
    }
    std::printf("parax-run: %d rank(s) on %s, %zu instructions on rank %d, %lld "
                "microbatch(es), step time %.3f ms (median of %zu)%s\n",
                size, opt.device.c_str(), instructions, rank, static_cast<long long>(micro),
                1e3 * median, times.size(), how.c_str());
    std::fputs(profile.c_str(), stdout);
    if (training && training->skippedSteps() > 0)
      std::printf("parax-run: %lld step(s) skipped: their gradients were not finite (--skip-nonfinite)\n",
                  static_cast<long long>(training->skippedSteps()));
  }
  // --profile: rank 0 writes FILE, rank r FILE.rank<r>. On cuda, three
  // more steps, each instruction timed on the device by events.
  if (!opt.profilePath.empty()) {
    std::string path = rank == 0 ? opt.profilePath : opt.profilePath + ".rank" + std::to_string(rank);
    const Executor *program = &cpu;
    std::vector<std::vector<double>> seconds = cpu.instructionSeconds();
#ifdef PARAX_WITH_CUDA
    if (opt.device == "cuda") {
      program = &gpus[0]->hostExecutor();
      seconds.assign(program->instructionCount(), {});
      for (int run = 0; run < 3; ++run) {
        auto timed = gpus[0]->timeInstructions();
        if (!timed.isOk()) die("--profile: " + timed.status().message());
        for (size_t k = 0; k < seconds.size(); ++k)
          if (timed.value()[k] >= 0) seconds[k].push_back(timed.value()[k]);
      }
    }
#endif
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v.empty() ? 0.0 : v[v.size() / 2];
    };
    RunProfileTotals totals{median(times), static_cast<int>(times.size()), median(syncTimes),
                            median(optimizerTimes), optimizerTimes.empty() ? std::string() : opt.optimizer.kind};
    for (const auto &[key, calls] : reduceCalls)
      totals.gradientReduces.push_back(
          {key.first, static_cast<double>(key.second) * calls, calls, median(reduceTimes[key])});
    Status written = writeRunProfile(path, exe.value(), *program, seconds, rank, size, opt.device, totals);
    if (!written.isOk()) die(written.message());
  }
  training.reset(); // its MPI communicator, before MPI ends
  shutdown();
  return 0;
}
