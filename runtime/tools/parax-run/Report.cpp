// Report.cpp - the end of a parax-run job: the replicas' results and the
// gradients gathered on the writer, the checkpoints, the output files, the
// summary line and --profile's file.

#define OMPI_SKIP_MPICXX 1
#include "Run.h"

#include "parax/runtime/Grid.h"
#include "RunProfile.h"

#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <limits>

using namespace parax::runtime;

namespace parax::run {

namespace {

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

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

} // namespace

void Run::finish() {
  progress.finish();
  meanOfScalars(results); // the loss: the mean over the microbatches
  std::string profile = cudaProfile();
  gatherReplicas();
  gatherGradients();
  if (!opt.saveWeights.empty()) save(opt.saveWeights, false);
  if (!opt.saveOptimizer.empty()) save(opt.saveOptimizer, true);
  double expertLoad = busiestExpertLoad();
  if (writer) {
    writeResults();
    std::puts(summary(expertLoad).c_str());
    std::fputs(profile.c_str(), stdout);
    if (training && training->skippedSteps() > 0)
      std::printf("parax-run: %lld step(s) skipped: their gradients were not finite (--skip-nonfinite)\n",
                  static_cast<long long>(training->skippedSteps()));
  }
  if (!opt.profilePath.empty()) writeProfile();
}

// PARAX_CUDA_PROFILE=1: one more step, timed op by op on the GPU (every
// rank runs it: its collectives need them all), after the timed steps.
std::string Run::cudaProfile() {
  std::string profile;
#ifdef PARAX_WITH_CUDA
  const char *profiling = std::getenv("PARAX_CUDA_PROFILE");
  if (opt.device != "cuda" || !profiling || std::string(profiling) != "1") return profile;
  auto opTimes = gpus[0]->profileStep();
  if (!opTimes.isOk()) die(opTimes.status().message());
  double total = 0;
  for (const CudaExecutor::OpTime &t : opTimes.value()) total += t.ms;
  char line[160];
  for (const CudaExecutor::OpTime &t : opTimes.value()) {
    std::snprintf(line, sizeof line, "parax-run: profile: %-20s %10.3f ms %5.1f %% (%d)\n", t.op.c_str(), t.ms,
                  total > 0 ? 100 * t.ms / total : 0.0, t.count);
    profile += line;
  }
  std::snprintf(line, sizeof line, "parax-run: profile: %-20s %10.3f ms (one step, kernel by kernel)\n", "total",
                total);
  profile += line;
#endif
  return profile;
}

// Each replica's writer sends the replica's results to the writer, which
// joins them in replica order (no rows to share: every replica ran the
// same). Gradients are averaged over the replicas already.
void Run::gatherReplicas() {
  if (replicas <= 1 || rows <= 0 || !replicaWriter) return;
  auto watched = waits->watch("gathering the data-parallel replicas' results");
  if (!writer) {
    int to = rankWithReplica(exe, rank, 0);
    for (size_t k = 0; k < results.size(); ++k)
      if (!training || !training->isGrad(k)) sendTensor(results[k], to);
    return;
  }
  for (int64_t other = 1; other < replicas; ++other) {
    int from = rankWithReplica(exe, rank, other);
    for (size_t k = 0; k < results.size(); ++k) {
      if (training && training->isGrad(k)) continue;
      Tensor &r = results[k];
      Tensor part = receiveTensor(from);
      if (opt.generate > 0 && r.shape.size() == 3 && part.shape.size() == 3) {
        // Logits of replicas whose rows stopped after different numbers of
        // positions: NaN at the positions a replica did not run.
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

// The program's results in order, on the writer: the last stage's outputs,
// and each gradient whole, gathered from its boxes (every rank sends its
// own).
void Run::gatherGradients() {
  if (opt.generate > 0 || !gradients) return;
  std::map<int, Tensor> whole;
  if (writesGradients) {
    Status s = training->gatherGradients(results, writerOf(exe, 0), whole);
    if (!s.isOk()) die(s.message());
  }
  if (!writer) return;
  std::vector<Tensor> ordered(sources.size());
  for (int k = 0; k < static_cast<int>(results.size()); ++k)
    ordered[outputResult(exe.stages(stageIndex), k)] = std::move(results[k]);
  for (auto &[r, t] : whole) ordered[r] = std::move(t);
  results = std::move(ordered);
}

// The busiest expert-parallel rank of every rank's dispatches: the least
// expert capacity (capacity= in the plan's workload) these steps fit.
double Run::busiestExpertLoad() {
  double expertLoad = 0;
  if (opt.device == "cpu") expertLoad = std::max(cpu.busiestExpertLoad(), cpuPrefill.busiestExpertLoad());
#ifdef PARAX_WITH_CUDA
  for (const auto *all : {&gpuPrefills, &gpus})
    for (const auto &program : *all) expertLoad = std::max(expertLoad, program->busiestExpertLoad());
#endif
  if (mpi) MPI_Allreduce(MPI_IN_PLACE, &expertLoad, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return expertLoad;
}

// --losses and the loss terms' files, --output's, --output-dir's.
void Run::writeResults() {
  for (auto [path, values] : {std::pair(&opt.lossesPath, &losses), std::pair(&opt.terms[0].path, &opt.terms[0].values),
                              std::pair(&opt.terms[1].path, &opt.terms[1].values)}) {
    if (path->empty()) continue;
    Tensor t = Tensor::floats({static_cast<int64_t>(values->size())});
    t.f = *values;
    Status s = writeNpy(*path, t);
    if (!s.isOk()) die(s.message());
  }
  if (opt.outputs.size() > results.size())
    die("the executable has " + std::to_string(results.size()) + " result(s) but " +
        std::to_string(opt.outputs.size()) + " --output files were given");
  for (size_t k = 0; k < opt.outputs.size(); ++k) {
    Status s = writeNpy(opt.outputs[k], results[k]);
    if (!s.isOk()) die(s.message());
  }
  if (opt.outputDir.empty()) return;
  for (size_t k = 0; k < results.size(); ++k) {
    // A gradient as its checkpoint name (a fused tensor's piece with
    // "@<offsets>", a stack of experts one file per expert), any other
    // result as result<k> (a loss term as balance_loss or mtp_loss); '/'
    // as '_'.
    bool named = k < resultNames.size() && !resultNames[k].empty();
    std::map<std::string, Tensor> files;
    if (named) {
      putParameter(resultNames[k], std::move(results[k]), files);
    } else {
      std::string file = "result" + std::to_string(k);
      for (const LossTerm &t : opt.terms)
        if (static_cast<int>(k) == t.result) file = t.file;
      files[file] = std::move(results[k]);
    }
    for (auto &[file, tensor] : files) {
      std::string name = file;
      std::replace(name.begin(), name.end(), '/', '_');
      Status s = writeNpy(opt.outputDir + "/" + name + ".npy", tensor);
      if (!s.isOk()) die(s.message());
    }
  }
}

// The writer's line: ranks, device, instructions, microbatches, the median
// step, then what the run held and did.
std::string Run::summary(double expertLoad) {
  std::string how = ", " + holdings() + scheduleSummary() + trainingSummary();
  if (hoisted > 0) how += ", " + std::to_string(hoisted) + " parameter move(s) run once at prepare";
  if (expertLoad > 0) {
    char line[160];
    std::snprintf(line, sizeof line,
                  ", expert routing: the busiest rank was sent %.4g x its own (token, choice) pairs "
                  "(the least capacity= these steps fit)",
                  expertLoad);
    how += line;
  }
  how += deviceSummary();
  double mid = median(times); // (a prefill may leave no step)
  if (opt.generate > 0) how = generationSummary(mid) + how;
  char head[256];
  std::snprintf(head, sizeof head,
                "parax-run: %d rank(s) on %s, %zu instructions on rank %d, %lld microbatch(es), step time %.3f ms "
                "(median of %zu)",
                size, opt.device.c_str(), instructions, rank, static_cast<long long>(micro), 1e3 * mid, times.size());
  return head + how;
}

std::string Run::scheduleSummary() {
  auto [ranges0, steps0] = pipelined ? scheduleOf(0) : std::make_pair(std::vector<PipelineRange>{}, PipelineSteps{});
  if (!std::any_of(ranges0.begin(), ranges0.end(), [](const PipelineRange &r) { return r.backward; })) return "";
  const std::string &planned = exe.schedule().kind();
  const int chunks = std::max(exe.schedule().chunks(), 1);
  std::string how =
      std::string(chunks > 1 ? ", schedule interleaved 1f1b (" + std::to_string(chunks) + " model chunks a stage) over "
                  : kind == "gpipe" ? ", schedule gpipe over "
                                    : ", schedule 1f1b over ") +
      std::to_string(micro) + " microbatches (" + std::to_string(microbatchesInFlight(steps0, ranges0)) +
      " in flight on stage 0)";
  if (planned == "interleaved" && chunks == 1)
    how += " (the plan chose interleaved 1F1B; this executable has one model chunk a stage)";
  if (planned == "gpipe" && kind != planned) how += " (the plan chose GPipe: 1F1B on the CUDA backend)";
  if (heldSets[0] > 1)
    how += ", up to " + std::to_string(heldSets[0]) + " activation sets a rank (at most " +
           std::to_string(heldSets[1]) + " bytes of them on the device)";
  return how;
}

std::string Run::trainingSummary() {
  if (!trains || losses.empty()) return "";
  char balance[192] = "", line[416];
  for (const LossTerm &t : opt.terms)
    if (!t.values.empty()) {
      size_t used = std::strlen(balance);
      std::snprintf(balance + used, sizeof balance - used, " (%s %.6f -> %.6f)", t.label, t.values.front(),
                    t.values.back());
    }
  // (The device optimizer's moments: on the device, read back only to be
  // written.)
  size_t stateBytes = training->stateBytes();
  if (deviceOptimizer && opt.optimizer.kind == "adamw") {
    stateBytes = 0;
    for (const Trainer::Update &u : updates) stateBytes += 2 * sizeof(float) * (u.end - u.begin);
  }
  std::snprintf(line, sizeof line, ", %s: loss %.6f -> %.6f%s over %zu step(s), %zu bytes of optimizer state on rank %d%s",
                opt.optimizer.kind.c_str(), losses.front(), losses.back(), balance, losses.size(), stateBytes, rank,
                zeroSummary(opt.optimizer, training->sharesState(opt.optimizer), deviceOptimizer).c_str());
  std::string how = line;
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
  return how;
}

std::string Run::deviceSummary() {
  std::string how;
  if (opt.device == "cpu") how += ", " + runtime::gemmKernels();
#ifdef PARAX_WITH_CUDA
  if (opt.device != "cuda") return how;
  if (gpus[0]->replaysGraph()) how += ", steps after the first as one CUDA graph";
  if (gpus[0]->cacheReadsInPlace() > 0)
    how += ", " + std::to_string(gpus[0]->cacheReadsInPlace()) + " KV-cache concat(s) read in place by attention";
  if (gpus[0]->cacheWritesInPlace() > 0)
    how += ", " + std::to_string(gpus[0]->cacheWritesInPlace()) + " KV cache(s) written in place";
  if (gpus[0]->overlappedInstructions() > 0)
    how += ", " + std::to_string(gpus[0]->overlappedInstructions()) + " instruction(s) overlapping collectives";
  if (!gpus[0]->attentionPath().empty()) how += ", " + gpus[0]->attentionPath();
#endif
  return how;
}

// Every replica's rows (joined above): the most tokens a row gave before
// its stop token (generate: some row never gave it).
std::string Run::generationSummary(double mid) {
  const int64_t promptLength = prompts.promptLength, width = promptLength + opt.generate;
  const std::vector<int64_t> &promptLengths = prompts.promptLengths;
  int64_t stoppedAfter = opt.stopToken >= 0 ? 0 : opt.generate;
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
  if (prompts.chunks > 0)
    std::snprintf(prefilled, sizeof prefilled, ", prefill of %lld chunk(s) of %lld tokens in %.3f ms",
                  static_cast<long long>(prompts.chunks), static_cast<long long>(prompts.prefill.tokens),
                  1e3 * prefillSeconds);
  return ", " + std::to_string(opt.generate) + " token(s) generated for each of " + std::to_string(rows) +
         " row(s) after " + promptText + ", " +
         std::to_string(static_cast<long long>(mid > 0 ? rows / mid : 0)) + " tokens/s at the median step" +
         prefilled + sharing +
         (stoppedAfter < opt.generate
              ? ", every row gave the stop token after " + std::to_string(stoppedAfter) + " token(s)"
              : std::string());
}

// --profile: rank 0 writes FILE, rank r FILE.rank<r>. On cuda, three more
// steps, each instruction timed on the device by events.
void Run::writeProfile() {
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
  RunProfileTotals totals{median(times), static_cast<int>(times.size()), median(syncTimes), median(optimizerTimes),
                          optimizerTimes.empty() ? std::string() : opt.optimizer.kind};
  for (const auto &[key, calls] : reduceCalls)
    totals.gradientReduces.push_back({key.first, static_cast<double>(key.second) * calls, calls,
                                      median(reduceTimes[key])});
  Status written = writeRunProfile(path, exe, *program, seconds, rank, size, opt.device, totals);
  if (!written.isOk()) die(written.message());
}

} // namespace parax::run
