// Run.cpp - parax-run's setting up: MPI, the flags, the executable, the
// weights and inputs, this replica's rows, the backend's programs, the
// pipeline schedule and what training binds.

#define OMPI_SKIP_MPICXX 1
#include "Run.h"

#include "parax/runtime/Grid.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <set>

using namespace parax::runtime;

namespace parax::run {

namespace {

/// PARAX_COLLECTIVE_TIMEOUT (or PARAX_NCCL_TIMEOUT) in seconds; 0 when set
/// but not a positive number (the run then says so), 300 when unset.
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

} // namespace

Run::Run(int argc, char **argv) {
  mpi = launchedByMpi();
  // (Checked once the error can be reported, below.)
  collectiveTimeout = collectiveTimeoutFromEnv();
  if (mpi) {
    waits = std::make_unique<StallWatchdog>(launcherRank(), collectiveTimeout > 0 ? collectiveTimeout : 300);
    auto watched = waits->watch("MPI start-up (MPI_Init)");
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    // (every backend's error ends the job through abortMpiJob)
    if (size > 1)
      prepareMpiAbort();
  }
  opt = parseOptions(argc, argv, dieFunction());
  trains = opt.trains();
}

void Run::finalize() {
  if (!mpi) return;
  auto watched = waits->watch("MPI shut-down (MPI_Finalize)");
  MPI_Finalize();
}

void Run::die(const std::string &message) {
  progress.finish(); // (a line drawn in place ended first)
  std::fprintf(stderr, "parax-run: rank %d: %s\n", rank, message.c_str());
  std::fflush(stderr);
  if (size > 1)
    abortMpiJob(); // (the other ranks that meet the same error report it first)
  finalize();
  std::exit(1);
}

void Run::shutdown() {
  training.reset(); // its MPI communicator, before MPI ends
  comm.reset();     // frees the sub-communicators before MPI ends
#ifdef PARAX_WITH_CUDA
  destroyNcclCommunicator(nccl);
#endif
  finalize();
}

int Run::execute() {
  if (opt.help) {
    finalize();
    return 0;
  }
  if (!(collectiveTimeout > 0)) {
    const char *name = std::getenv("PARAX_COLLECTIVE_TIMEOUT") ? "PARAX_COLLECTIVE_TIMEOUT" : "PARAX_NCCL_TIMEOUT";
    die(std::string(name) + "=" + std::getenv(name) + ": not a positive number of seconds");
  }
  load();
  splitRows();
  if (opt.generate > 0) readPrompts();
  prepare();
  schedule();
  if (opt.steps == 0) { // prepare only: every rank says what it holds
#ifdef PARAX_WITH_CUDA
    if (opt.device == "cuda" && !gpus[0]->memoryPeak().empty())
      std::printf("parax-run: rank %d: %s\n", rank, gpus[0]->memoryPeak().c_str());
#endif
    std::printf("parax-run: rank %d (stage %d) on %s: %s%s\n", rank, stageIndex, opt.device.c_str(),
                holdings().c_str(), sharing.c_str());
    std::fflush(stdout);
    shutdown();
    return 0;
  }
  if (opt.generate <= 0) bindTraining();
  else if (opt.perTokenLoss)
    die("--per-token-loss: the executable is no training step (build it with --parax-autodiff)");
  // The writer: last stage, every other coordinate 0. With data
  // parallelism, each replica's rank so placed sends it the replica's
  // results, which it joins in replica order (a scalar: the mean).
  replicaWriter = stageIndex + 1 == exe.stages_size();
  for (size_t i = 0; i < coords.size(); ++i)
    if (exe.grid().axis_names(i) != "pp" && exe.grid().axis_names(i) != "dp" && coords[i] != 0)
      replicaWriter = false;
  writer = replicaWriter && replica == 0;
  // --log-json: the rank that prints the steps writes their lines.
  if (writer && !opt.logJsonPath.empty()) {
    logJson.open(opt.logJsonPath);
    if (!logJson) die("--log-json: cannot write '" + opt.logJsonPath + "'");
  }
  nameResults();
  if (opt.generate > 0) generate();
  else runSteps();
  finish();
  shutdown();
  return 0;
}

void Run::load() {
  StatusOr<pxe::Executable> loaded = loadExecutable(opt.model);
  if (!loaded.isOk()) die(loaded.status().message());
  exe = std::move(loaded.value());
  // The plan's ZeRO stage: AdamW's states split over the ranks holding
  // each box (1), the gradient sums too (2) and the parameters between
  // their uses (3) -- 2 and 3 on the CUDA backend's device optimizer.
  if (trains && !opt.zeroGiven && opt.optimizer.kind == "adamw" && exe.schedule().zero_stage() >= 1) {
    opt.optimizer.zeroStage = exe.schedule().zero_stage();
    opt.optimizer.zero = true;
  }
  int64_t grid = gridSize(exe);
  if (grid != size)
    die("the executable's grid has " + std::to_string(grid) + " ranks but mpirun started " +
        std::to_string(size) + " (use mpirun -np " + std::to_string(grid) + ")");
  shape.assign(exe.grid().shape().begin(), exe.grid().shape().end());
  if (size > 1 && opt.device == "cpu") {
    auto watched = waits->watch("communicator set-up (MPI_Comm_split)");
    auto created = createMpiCommunicator(shape, collectiveTimeout);
    if (!created.isOk()) die(created.status().message());
    comm = std::move(created.value());
  }
  auto opened = Checkpoint::open(opt.weights);
  if (!opened.isOk()) die(opened.status().message());
  ckpt = opened.value();
  if (!opt.allowUnusedWeights) {
    Status used = checkEveryWeightRead(exe, *ckpt, opt.weights);
    if (!used.isOk()) die(used.message() + ", or pass --allow-unused-weights to run without them");
  }
  for (const std::string &path : opt.inputs) {
    auto t = readNpy(path);
    if (!t.isOk()) die(t.status().message());
    inputTensors.push_back(std::move(t.value()));
  }
}

void Run::splitRows() {
  coords.assign(exe.ranks(rank).values().begin(), exe.ranks(rank).values().end());
  for (int i = 0; i < exe.grid().axis_names_size(); ++i)
    if (exe.grid().axis_names(i) == "dp") {
      replicas = exe.grid().shape(i);
      replica = coords[i];
      replicaAxis = i;
    }
  for (const auto &buffer : exe.stages(0).buffers())
    if (buffer.role() == pxe::INPUT && buffer.input_index() == 0 && buffer.global_shape_size() > 0)
      exeBatch = buffer.global_shape(0);
  if (inputTensors.empty() || exeBatch <= 0 || inputTensors[0].shape.empty()) return;
  rows = inputTensors[0].shape[0];
  if (opt.stepRows > 0) {
    if (rows % opt.stepRows)
      die("--step-rows " + std::to_string(opt.stepRows) + " does not divide input #0's " + std::to_string(rows) +
          " rows");
    blocks = rows / opt.stepRows;
    rows = opt.stepRows;
  }
  if (rows % (exeBatch * replicas))
    die(std::string(opt.stepRows > 0 ? "--step-rows takes " : "input #0 has ") + std::to_string(rows) +
        " rows, not a multiple of the executable's batch " + std::to_string(exeBatch) +
        (replicas > 1 ? " times its " + std::to_string(replicas) +
                            " data-parallel replicas (each takes an equal share of whole batches)"
                      : std::string()));
  micro = rows / (exeBatch * replicas);
}

// --generate: the step at position t feeds every row's token t (the
// prompt's, then the ones generated); the KV caches are given as shapes
// without values, so each stage keeps its own where it runs. With
// --prefill, the prompt's whole chunks go through that program instead.
void Run::readPrompts() {
  Prompts &p = prompts;
  if (inputTensors.size() != 1) die("--generate takes one --input: the prompt's tokens [rows, L]");
  auto checked = generationProgram(exe);
  if (!checked.isOk()) die(checked.status().message());
  p.step = checked.value();
  auto read = promptRows(inputTensors[0], opt.generate, p.step);
  if (!read.isOk()) die("--generate: " + read.status().message());
  p.promptLength = read.value().length;
  p.sequence = std::move(read.value().sequence);
  p.promptLengths = std::move(read.value().lengths);
  if (!opt.prefillPath.empty()) {
    auto loaded = loadExecutable(opt.prefillPath);
    if (!loaded.isOk()) die(loaded.status().message());
    p.prefillExe = std::move(loaded.value());
    auto pairs = prefillProgram(p.prefillExe, exe, p.step);
    if (!pairs.isOk()) die(pairs.status().message());
    p.prefill = pairs.value();
    // Whole chunks of the shortest prompt; the rest of the prompts goes a token a step.
    p.chunks = *std::min_element(p.promptLengths.begin(), p.promptLengths.end()) / p.prefill.tokens;
  }
}

std::vector<Tensor> Run::inputsAt(const GenerationProgram &program, int64_t t, int64_t m) {
  return generationInputs(program, prompts.sequence, prompts.promptLength + opt.generate, firstRowOf(m), t);
}

std::vector<Tensor> Run::microbatch(int64_t j) {
  std::vector<Tensor> slice;
  for (const Tensor &t : inputTensors) {
    if (t.shape.empty() || t.shape[0] != rows * blocks) {
      slice.push_back(t);
      continue;
    }
    slice.push_back(t.rowBlock(block * rows + (replica * micro + j) * exeBatch, exeBatch));
  }
  return slice;
}

// The backend: the CPU executor, or the CUDA one (one GPU per rank, the
// local rank's; NCCL communicators when there are several ranks).
// --generate over several microbatches a replica: each has its own KV
// caches and its own runner of the step (and of the prefill program), so
// that the pipeline stages work on different microbatches at once.
void Run::prepare() {
  programs = opt.generate > 0 ? micro : 1;
  caches.resize(programs);
  runners.resize(programs);
  prefills.resize(programs);
  if (opt.device == "cpu") prepareCpu();
  else prepareCuda();
  // What this rank holds of the model: its box of every parameter.
  for (const pxe::Buffer &b : exe.stages(stageIndex).buffers())
    if (b.role() == pxe::PARAMETER) loaded += numelOf(std::vector<int64_t>(b.shape().begin(), b.shape().end()));
}

void Run::prepareCpu() {
  Status s = cpu.prepare(exe, rank, comm.get(), *ckpt,
                         opt.generate > 0 ? inputsAt(prompts.step, 0, 0) : microbatch(0));
  if (!s.isOk()) die(s.message());
  // A forward pass's results are written by the writers alone (and sent
  // to the writer by the replicas'): its last gathers go to them only.
  cpu.setResultsOnHoldersOnly(opt.generate <= 0 && !trains && !gradients);
  if (prompts.chunks > 0) {
    s = cpuPrefill.prepare(prompts.prefillExe, rank, comm.get(), *ckpt, inputsAt(prompts.prefill, 0, 0));
    if (!s.isOk()) die("--prefill: " + s.message());
  }
  // One executor a program; each run takes its microbatch's caches.
  for (int64_t m = 0; m < programs; ++m) {
    runners[m] = opt.generate > 0 ? runnerWithCaches(cpu, caches[m]) : runnerOf(cpu);
    if (prompts.chunks > 0) prefills[m] = runnerWithCaches(cpuPrefill, caches[m]);
  }
  if (!opt.profilePath.empty()) cpu.setProfiling(true);
  stageIndex = cpu.stage();
  instructions = cpu.instructionCount();
  hoisted = cpu.hoistedInstructions();
}

void Run::prepareCuda() {
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
    std::string note = collectivesNote(nccl);
    if (rank == 0 && !note.empty())
      std::fprintf(stderr, "parax-run: %s\n", note.c_str());
    if (rank == 0 && isHostStaged(nccl))
      std::fprintf(stderr, "parax-run: %d ranks share %d GPU(s): collectives go through host "
                           "memory and MPI, not NCCL\n", size, devices);
  }
  using Share = CudaExecutor::Share;
  const int64_t chunks = prompts.chunks;
  size_t sharedParameters = 0, stepParameters = 0, sharedCaches = 0, borrowedWeights = 0, sharedMoves = 0;
  for (int64_t m = 0; m < programs; ++m) {
    // Microbatch m > 0 borrows microbatch 0's weights; the step borrows
    // its prefill program's weights and caches.
    if (chunks > 0) {
      gpuPrefills.push_back(std::make_unique<CudaExecutor>());
      Status s = gpuPrefills[m]->prepare(prompts.prefillExe, rank, nccl, *ckpt, inputsAt(prompts.prefill, 0, m),
                                         gpuIndex, m > 0 ? gpuPrefills[0].get() : nullptr, Share::Weights);
      if (!s.isOk()) die("--prefill: " + s.message());
      prefills[m] = runnerOf(*gpuPrefills[m]);
      if (m > 0) borrowedWeights += gpuPrefills[m]->sharedParameters();
      sharedMoves += gpuPrefills[m]->sharedMoves();
    }
    gpus.push_back(std::make_unique<CudaExecutor>());
    if (trains) gpus[m]->keepLoadedParameters(); // the optimizer's fp32 masters start from them
    const CudaExecutor *lender = chunks > 0 ? gpuPrefills[m].get() : m > 0 ? gpus[0].get() : nullptr;
    Status s = gpus[m]->prepare(exe, rank, nccl, *ckpt,
                                opt.generate > 0 ? inputsAt(prompts.step, 0, m) : microbatch(0), gpuIndex, lender,
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
              " parameter(s) and " + std::to_string(sharedCaches) + " KV cache(s) shared with the prefill program";
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

std::pair<std::vector<PipelineRange>, PipelineSteps> Run::scheduleOf(int stage) {
  auto stageRanges = pipelineRanges(exe, stage);
  if (!stageRanges.isOk()) die(stageRanges.status().message());
  auto steps = pipelineSteps(stageRanges.value(), kind, stage, stages, micro);
  if (!steps.isOk()) die(steps.status().message());
  return {stageRanges.value(), steps.value()};
}

// A step over pipeline stages with several microbatches (or model chunks):
// each stage runs its program in ranges (a forward and a backward pass;
// interleaved: those of each chunk) in its schedule's order
// (runtime::pipelineSteps: 1F1B, GPipe, interleaved 1F1B), each microbatch
// in flight keeping its activations in a set of its own. The CUDA backend
// runs a plan's GPipe as 1F1B (its sends may wait for their receives, and
// GPipe's last stage would send a gradient before the first stage, still
// sending activations, receives it), and receives a step's inputs together
// with the step before's sends (CudaExecutor::exchange).
void Run::schedule() {
  stages = exe.stages_size();
  const bool chunked = exe.schedule().chunks() > 1;
  if (chunked && opt.generate > 0)
    die("--generate: this executable runs model chunks (interleaved 1F1B): plan it for inference");
  pipelined = (micro > 1 || chunked) && stages > 1 && opt.generate <= 0;
  kind = opt.device == "cuda" && exe.schedule().kind() == "gpipe" ? std::string("1f1b") : exe.schedule().kind();
  if (pipelined) std::tie(ranges, pipeline) = scheduleOf(stageIndex);
  sets = pipelined ? microbatchesInFlight(pipeline, ranges) : 1;
#ifdef PARAX_WITH_CUDA
  // On CUDA the optimizer runs on the device: the gradients, fp32 masters
  // and moments stay there (PARAX_CUDA_OPTIMIZER=host: fp32 masters on the
  // host, each step's gradients copied there and the parameters back).
  const char *optimizerAt = std::getenv("PARAX_CUDA_OPTIMIZER");
  if (optimizerAt && std::string(optimizerAt) != "host" && std::string(optimizerAt) != "device")
    die(std::string("PARAX_CUDA_OPTIMIZER=") + optimizerAt + ": host or device");
  deviceOptimizer = trains && opt.device == "cuda" && !(optimizerAt && std::string(optimizerAt) == "host");
  if (opt.device == "cuda" && (pipelined || deviceOptimizer)) {
    // (the device optimizer takes each gradient right after its range; or
    // without ranges, right after the instruction that writes it)
    Status s = gpus[0]->holdActivations(static_cast<int>(sets),
                                        pipelined ? chunksInFlight(pipeline, ranges) : std::vector<int64_t>{},
                                        ranges, deviceOptimizer);
    if (!s.isOk()) die(s.message());
    heldSets[0] = gpus[0]->activationSets();
    heldSets[1] = static_cast<long long>(gpus[0]->activationBytes());
  }
  if (mpi && opt.device == "cuda") // the summary's: the most a rank holds (stage 0's)
    MPI_Allreduce(MPI_IN_PLACE, heldSets, 2, MPI_LONG_LONG, MPI_MAX, MPI_COMM_WORLD);
#endif
}

// What this rank holds of the model, and, on CUDA, the device memory it
// took: at prepare (--steps 0), and after the steps with the device
// optimizer's (ZeRO-3's chunks in place of the boxes it freed) and the
// scratch the steps grew.
std::string Run::holdings() {
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
}

// A training step's gradients (every rank's boxes) and the optimizer. The
// parameters the optimizer updates: the CPU executor's own buffers; on
// CUDA, fp32 master copies on the host (the device holds the storage
// dtype), written back to the device after each step, or the device
// optimizer's.
void Run::bindTraining() {
  training = std::make_unique<Trainer>(exe, rank, mpi, waits.get());
#ifdef PARAX_WITH_CUDA
  if (trains && opt.device == "cuda") masters = gpus[0]->takeLoadedParameters();
#endif
  if (trains) {
    Status s = training->bindParameters(parameters());
    if (!s.isOk()) die(s.message());
  }
  if (opt.biasSpeed > 0) findRouterBiases();
  if (!opt.loadOptimizer.empty()) { // AdamW's moments and step count, saved by --save-optimizer
    auto file = Checkpoint::open(opt.loadOptimizer);
    if (!file.isOk()) die("--load-optimizer: " + file.status().message());
    Status s = training->loadState(*file.value(), opt.loadOptimizer, opt.optimizer.zero);
    if (!s.isOk()) die("--load-optimizer: " + s.message());
  }
  if (deviceOptimizer) bindDeviceOptimizer();
  // A schedule decays over this run's steps unless told otherwise (a
  // resumed run counts on from the saved step).
  if (trains && opt.optimizer.decaySteps == 0) opt.optimizer.decaySteps = training->steps() + opt.steps;
  if (trains && opt.optimizer.minLr > opt.optimizer.lr) die("--min-lr is above --lr");
  findLossOutputs();
  if (opt.perTokenLoss) checkPerTokenLoss();
}

// --bias-update-speed: every router's correction bias, over every stage, in
// one order (each rank sums its counts into its place; all add them).
void Run::findRouterBiases() {
  for (const pxe::Stage &stage : exe.stages())
    for (const pxe::Instruction &inst : stage.instructions()) {
      if (opName(inst) != "router" || inst.operands_size() != 3) continue;
      const pxe::Buffer &bias = stage.buffers(inst.operands(2));
      const bool whole = std::all_of(bias.split().begin(), bias.split().end(),
                                     [](const pxe::AxisList &axes) { return axes.axes_size() == 0; });
      if (bias.role() != pxe::PARAMETER || bias.shape_size() != 1 || !whole)
        die("--bias-update-speed: stage " + std::to_string(stage.index()) + "'s router bias (buffer " +
            std::to_string(inst.operands(2)) + ") is not a whole parameter");
      if (biasAt.emplace(bias.param_name(), biasLoads).second) biasLoads += bias.shape(0);
    }
  if (biasAt.empty())
    die("--bias-update-speed: no router of this executable has a correction bias (DeepSeek-V3's "
        "e_score_correction_bias)");
}

void Run::bindDeviceOptimizer() {
#ifdef PARAX_WITH_CUDA
  updates = training->updates(opt.optimizer);
  std::vector<CudaExecutor::Gradient> bound;
  for (const Trainer::Update &u : updates)
    bound.push_back({u.output, u.parameter, u.begin, u.end, u.size, u.axes, u.members, u.index, u.partRanks,
                     u.partialAxes, u.copies});
  CudaExecutor::OptimizerSetup setup;
  setup.adamw = opt.optimizer.kind == "adamw";
  setup.replicaAxis = replicaAxis;
  setup.replicas = replicas;
  setup.zero = training->sharesState(opt.optimizer);
  setup.shardSums = setup.zero && opt.optimizer.zeroStage >= 2;
  setup.shardParameters = setup.zero && opt.optimizer.zeroStage >= 3;
  Status s = gpus[0]->bindOptimizer(bound, setup, masters);
  for (int which = 0; s.isOk() && which < 2 && !opt.loadOptimizer.empty(); ++which) {
    std::vector<std::vector<float>> moments;
    for (const Trainer::Update &u : updates) moments.push_back(training->moment(u.output, which));
    s = gpus[0]->writeMoments(which, moments);
  }
  if (!s.isOk()) die(s.message());
  // The device holds the masters now: the host's fp32 copies of what the
  // optimizer updates go (4 bytes a parameter of the rank's boxes), read
  // back only to be saved; the rest (a bias --bias-update-speed moves)
  // stay.
  for (const Trainer::Update &u : updates) std::vector<float>().swap(masters[u.parameter].f);
  for (int which = 0; which < 2 && !opt.loadOptimizer.empty(); ++which)
    for (const Trainer::Update &u : updates) std::vector<float>().swap(training->moment(u.output, which));
#endif
}

// The last stage's scalar result that is not a gradient (the loss), and
// the loss terms' outputs.
void Run::findLossOutputs() {
  const pxe::Stage &mine = exe.stages(stageIndex);
  const bool last = stageIndex + 1 == exe.stages_size();
  for (int k = 0; k < mine.outputs_size(); ++k)
    if (lossOutput < 0 && !training->isGrad(k) && last && mine.buffers(mine.outputs(k)).shape_size() == 0)
      lossOutput = k;
  if (trains && lossOutput < 0 && last)
    die("--optimizer: the executable returns no loss (a scalar result): build it with --parax-autodiff");
  for (LossTerm &t : opt.terms) {
    if (last)
      for (int k = 0; k < mine.output_terms_size(); ++k)
        if (mine.output_terms(k) == t.term) t.output = k;
    if (trains && !t.path.empty() && rank == writerOf(exe, 0) && t.output < 0)
      die(std::string(t.flag) + ": the executable returns no " + t.noun + " (" + t.missing + ")");
  }
}

// --per-token-loss: every label_count gives the step's count of labels that
// are not ignore_index (every replica's and microbatch's rows, which every
// rank holds), over the step's microbatches x replicas, so that the mean
// parax-run takes of their losses and gradients is the mean over the
// step's counted labels. The labels: label_count's input.
void Run::checkPerTokenLoss() {
  if (!std::any_of(exe.stages(0).output_grads().begin(), exe.stages(0).output_grads().end(),
                   [](const std::string &g) { return !g.empty(); }))
    die("--per-token-loss: the executable is no training step (build it with --parax-autodiff)");
  bool counts = false;
  for (const auto &st : exe.stages())
    for (const auto &inst : st.instructions())
      counts |= opName(inst) == "label_count";
  if (!counts)
    die("--per-token-loss: the executable counts no labels (build the model with ignore_index: every "
        "microbatch then counts all its tokens, and the two means are one)");
  for (const auto &inst : exe.stages(stageIndex).instructions()) {
    if (opName(inst) == "shift")
      die("--per-token-loss: multi-token prediction's labels (shifted) are counted per microbatch only, not "
          "over the step yet; train it without --per-token-loss");
    if (opName(inst) != "label_count") continue;
    const auto &labels = exe.stages(stageIndex).buffers(inst.operands(0));
    if (labels.role() != pxe::INPUT || labels.global_shape_size() != labels.shape_size())
      die("--per-token-loss: label_count reads no whole input of labels on stage " + std::to_string(stageIndex));
    labelsInput = labels.input_index();
    ignoreIndex = static_cast<int32_t>(attrInt(inst.attrs(), "ignore_index"));
  }
  if (labelsInput >= static_cast<int>(inputTensors.size()))
    die("--per-token-loss: the labels are input #" + std::to_string(labelsInput) + ", which was not given");
}

// The program's results in order: a gradient's checkpoint name, else "".
// Gradients are read back from the device and gathered whole only when
// --output (as far as it reaches) or --output-dir writes them.
void Run::nameResults() {
  sources = resultSources(exe);
  for (const auto &from : sources) {
    const auto &stage = exe.stages(from[0].stage);
    for (LossTerm &t : opt.terms)
      if (from[0].output < stage.output_terms_size() && stage.output_terms(from[0].output) == t.term)
        t.result = static_cast<int>(resultNames.size());
    resultNames.push_back(from[0].output < stage.output_grads_size() ? stage.output_grads(from[0].output) : "");
  }
  auto named = [](const std::string &n) { return !n.empty(); };
  gradients = std::any_of(resultNames.begin(), resultNames.end(), named);
  writesGradients = opt.generate <= 0 && gradients &&
                    (!opt.outputDir.empty() ||
                     std::any_of(resultNames.begin(),
                                 resultNames.begin() + std::min(opt.outputs.size(), resultNames.size()), named));
}

} // namespace parax::run
