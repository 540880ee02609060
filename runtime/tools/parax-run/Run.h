// Run.h - one parax-run job on this rank: its phases, in the order they run.
//
//   start      MPI (watched), the flags
//   load       the executable, the communicator, the weights, the inputs
//   splitRows  the rows of this data-parallel replica and its microbatches
//   prepare    the backend's programs (CPU, or CUDA with its lenders)
//   schedule   the pipeline's ranges and steps, the activation sets
//   bindTraining  the gradients, the optimizer and its state, the loss
//   generate / runSteps   the work
//   finish     the replicas' results gathered, checkpoints and outputs
//              written, the summary and the profile
//
// The phases share the run's state as members; Run.cpp holds the setting
// up, Steps.cpp the steps and checkpoints, Report.cpp what is written at
// the end.

#ifndef PARAX_RUN_RUN_H
#define PARAX_RUN_RUN_H

#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/Communicator.h"
#include "parax/runtime/Executable.h"
#include "parax/runtime/Executor.h"
#include "parax/runtime/Generation.h"
#include "parax/runtime/Grid.h"
#include "parax/runtime/PipelineSchedule.h"
#include "parax/runtime/Runner.h"
#include "parax/runtime/Session.h"
#include "parax/runtime/StallWatchdog.h"
#include "parax/runtime/Trainer.h"

#include "Options.h"
#include "Progress.h"
#ifdef PARAX_WITH_CUDA
#include "parax/runtime/CudaExecutor.h"
#endif

#include <array>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace parax::run {

using runtime::appendRows;
using runtime::Checkpoint;
using runtime::Executor;
using runtime::rankWithReplica;
using runtime::Runner;
using runtime::runnerOf;
using runtime::runnerWithCaches;
using runtime::Status;
using runtime::StatusOr;
using runtime::Tensor;
using runtime::Trainer;
using runtime::writerOf;
using runtime::GenerationProgram;
using runtime::PipelineRange;
using runtime::PipelineSteps;

/// --generate's prompts and programs: the step (and the prefill program
/// for the prompt's whole chunks), every row's tokens [rows, prompt +
/// generate] with its prompt in, and each row's prompt length (its tokens
/// before the first -1).
struct Prompts {
  GenerationProgram step, prefill;
  pxe::Executable prefillExe;
  int64_t promptLength = 0, chunks = 0;
  std::vector<int32_t> sequence;      // [rows, promptLength + generate], on every rank
  std::vector<int64_t> promptLengths; // each row's: its tokens before the first -1
};

class Run {
public:
  /// MPI (when a launcher started the process) and the flags.
  Run(int argc, char **argv);
  /// Every phase after start; the process's exit code.
  int execute();

private:
  // --- start, load, prepare (Run.cpp) ---
  [[noreturn]] void die(const std::string &message);
  void finalize();
  void shutdown();
  std::function<void(const std::string &)> dieFunction() {
    return [this](const std::string &m) { die(m); };
  }
  void load();
  void splitRows();
  void readPrompts();
  void prepare();
  void prepareCpu();
  void prepareCuda();
  std::pair<std::vector<PipelineRange>, PipelineSteps> scheduleOf(int stage);
  void schedule();
  std::string holdings();
  void bindTraining();
  void findRouterBiases();
  void bindDeviceOptimizer();
  void findLossOutputs();
  void checkPerTokenLoss();
  void nameResults();

  // Microbatch m of this replica: rows (replica * micro + m) * exeBatch ..
  int64_t firstRowOf(int64_t m) const { return (replica * micro + m) * exeBatch; }
  std::vector<Tensor> inputsAt(const GenerationProgram &program, int64_t t, int64_t m);
  std::vector<Tensor> microbatch(int64_t j);
  std::vector<Tensor> &parameters() { return opt.device == "cpu" ? cpu.hostBuffers() : masters; }

  // --- the steps and checkpoints (Steps.cpp) ---
  void barrier(const char *which);
  void generate();
  void runSteps();
  void runPart(int64_t m, int r, std::vector<std::vector<Tensor>> &activations);
  void runPipelineStep(const std::vector<runtime::PipelineItem> &items,
                       std::vector<std::vector<Tensor>> &activations);
  void runMicrobatches(int step);
  void optimizerStep();
  void recordLosses();
  void logStep(int step);
  void finishSteps();
  float stepLabelCount();
  void tallyReduces();
  void balanceExperts();
  void save(const std::string &path, bool state);
  void saveBoxes(const std::string &path, bool state);
  void saveStep(int64_t t);
  void readDeviceState();
  std::string makeFolder(const std::string &path);
  std::string saveIdentity();
  bool allWritten(const Status &mine);
  std::array<uint64_t, 3> digestOf(const std::string &file, bool wrote, Status &st);
  std::map<std::string, runtime::FileDigest> gatherDigests(const std::array<uint64_t, 3> &mine,
                                                           const std::function<std::string(int)> &nameOf);

  // --- the end (Report.cpp) ---
  void finish();
  std::string cudaProfile();
  void gatherReplicas();
  void gatherGradients();
  double busiestExpertLoad();
  void writeResults();
  std::string summary(double expertLoad);
  std::string scheduleSummary();
  std::string trainingSummary();
  std::string deviceSummary();
  std::string generationSummary(double median);
  void writeProfile();

  // The process and its flags.
  bool mpi = false;
  int rank = 0, size = 1;
  // How long one wait for the other ranks may take before the job ends
  // naming the rank and the operation: NCCL's watchdog, and MPI's.
  double collectiveTimeout = 300;
  // Every point where a rank waits for all the others outside a
  // collective (MPI's start-up and shut-down, communicator set-up, the
  // barriers around each step) is watched like the collectives are.
  std::unique_ptr<runtime::StallWatchdog> waits;
  Options opt;
  bool trains = false;

  // What it runs on.
  pxe::Executable exe;
  std::vector<int64_t> shape; // the grid's
  std::unique_ptr<runtime::Communicator> comm;
  std::shared_ptr<Checkpoint> ckpt;
  std::vector<Tensor> inputTensors;

  // Data parallelism: the replicas (coordinates along "dp") take equal
  // shares of the inputs' rows, in order; microbatches: a share holding k
  // times the executable's batch runs as k microbatches.
  std::vector<int64_t> coords;
  int64_t replicas = 1, replica = 0;
  int replicaAxis = -1; // the grid axis "dp"
  int64_t micro = 1, rows = 0, exeBatch = 0;
  int64_t blocks = 1, block = 0; // --step-rows: the steps' blocks of rows, the current one
  Prompts prompts;

  // The backend's programs: one a microbatch under --generate (each its
  // own KV caches), else one.
  int64_t programs = 1;
  Executor cpu, cpuPrefill;
  std::vector<Executor::CacheSet> caches;     // the CPU backend's, per microbatch
  std::vector<Runner> runners, prefills;      // per microbatch
  std::string sharing;                        // what the programs share
  int stageIndex = 0;
  size_t instructions = 0, hoisted = 0;
#ifdef PARAX_WITH_CUDA
  // The step may borrow the prefill's memory, and microbatch m's programs
  // microbatch 0's weights: lenders are declared (and prepared) first.
  std::vector<std::unique_ptr<runtime::CudaExecutor>> gpuPrefills, gpus;
  runtime::NcclCommunicator *nccl = nullptr;
#endif

  // The pipeline.
  int stages = 1;
  bool pipelined = false;
  std::string kind; // the schedule run
  std::vector<PipelineRange> ranges;
  PipelineSteps pipeline;
  int64_t sets = 1;
  long long heldSets[2] = {1, 0}; // CUDA: activation sets this rank holds, their bytes
  bool deviceOptimizer = false;   // CUDA: the optimizer on the device
  int64_t loaded = 0;             // this rank's parameter values

  // Training and the steps' record.
  std::vector<double> times, syncTimes, optimizerTimes;
  std::map<Trainer::ReduceKey, std::vector<double>> reduceTimes;
  std::map<Trainer::ReduceKey, int> reduceCalls;
  double prefillSeconds = 0;
  std::vector<Tensor> results; // this stage's outputs, microbatches joined
  std::unique_ptr<Trainer> training;
  std::vector<Tensor> masters; // CUDA's fp32 masters on the host
  std::map<std::string, size_t> biasAt; // a router bias's first expert among the loads
  size_t biasLoads = 0;
  std::vector<Trainer::Update> updates; // what each bound gradient updates (deviceOptimizer)
  std::vector<float> losses;
  double gradNorm = 0;
  int lossOutput = -1;
  int labelsInput = -1;
  int32_t ignoreIndex = 0;

  // Who writes, and what.
  bool replicaWriter = false, writer = false;
  std::ofstream logJson;
  Progress progress; // each training step's line (a terminal: one line redrawn)
  std::vector<std::string> resultNames; // a gradient's checkpoint name, else ""
  std::vector<std::vector<runtime::ResultSource>> sources;
  bool gradients = false, writesGradients = false;
  std::vector<std::vector<float>> masterChunks; // ZeRO masters as this rank's chunks
};

} // namespace parax::run

#endif // PARAX_RUN_RUN_H
