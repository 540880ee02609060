// Steps.cpp - parax-run's work: the generation loop, or the steps (each
// microbatch through the stage's program, or the pipeline's ranges in its
// schedule's order), the optimizer, the step's line, and checkpoints.

#define OMPI_SKIP_MPICXX 1
#include "Run.h"

#include "parax/runtime/Generator.h"
#include "parax/runtime/Grid.h"
#include "parax/runtime/MpiRing.h"
#include "RunProfile.h"

#include <mpi.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <random>

using namespace parax::runtime;

namespace parax::run {

namespace {

using Clock = std::chrono::steady_clock;
double secondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

#ifdef PARAX_WITH_CUDA
/// One optimizer step on the device: the step's gradient sums averaged
/// there, the global norm from their squares, the update applied.
Status deviceStep(CudaExecutor &gpu, Trainer &training, const OptimizerConfig &config,
                  const std::vector<Trainer::Update> &updates, int64_t micro, double &gradNorm) {
  auto squares = gpu.averageGradients(micro);
  if (!squares.isOk()) return squares.status();
  std::vector<double> perOutput;
  for (size_t i = 0; i < updates.size(); ++i) {
    perOutput.resize(std::max<size_t>(perOutput.size(), updates[i].output + 1), 0.0);
    perOutput[updates[i].output] = squares.value()[i];
  }
  Trainer::StepFactors f;
  Status s = training.beginStep(config, perOutput, f, gradNorm);
  if (!s.isOk() || f.skip) return s;
  CudaExecutor::OptimizerStep step{f.lr, config.beta1, config.beta2, config.eps, config.weightDecay,
                                   f.clip, f.correction1, f.correction2, {}};
  for (const Trainer::Update &u : updates) step.decays.push_back(u.decays);
  return gpu.applyOptimizer(step);
}
#endif

} // namespace

void Run::barrier(const char *which) { // around each step, to time it
  if (size == 1) return;
  auto watched = waits->watch(which);
  if (Status s = runtime::mpiBarrier(MPI_COMM_WORLD, which); !s.isOk()) die(s.message());
}

void Run::generate() {
  runtime::Generator loop{exe, prompts.step, prompts.prefill, runners, prefills, size, replica, micro, exeBatch,
                          replicaWriter, prompts.sequence, prompts.promptLengths, rows, prompts.promptLength,
                          opt.generate, prompts.chunks, opt.sampling, opt.stopToken, opt.outputs.size() > 1,
                          waits.get(), [this](const char *which) { barrier(which); }};
  if (!opt.quiet)
    loop.progress = [this](int64_t position, int64_t total, double tokensPerSecond) {
      double positions = tokensPerSecond / static_cast<double>(micro * exeBatch); // a second
      long long left = std::llround(static_cast<double>(total - position) / positions);
      char text[192];
      std::snprintf(text, sizeof text,
                    "generating: position %lld of %lld, %.0f tokens/s (%lld rows), %lld:%02lld:%02lld left",
                    static_cast<long long>(position), static_cast<long long>(total), tokensPerSecond,
                    static_cast<long long>(micro * exeBatch), left / 3600, left / 60 % 60, left % 60);
      char brief[96]; // (a terminal's line)
      std::snprintf(brief, sizeof brief, "position %lld/%lld %.0f tok/s %lld:%02lld:%02lld left",
                    static_cast<long long>(position), static_cast<long long>(total), tokensPerSecond, left / 3600,
                    left / 60 % 60, left % 60);
      progress.show(static_cast<double>(position) / static_cast<double>(total), text, brief);
    };
  runtime::Generator::Result done;
  Status s = loop.run(done);
  progress.finish();
  if (!s.isOk()) die("--generate: " + s.message());
  times = std::move(done.times);
  prefillSeconds = done.prefillSeconds;
  results = std::move(done.results);
}

// Microbatch m's range r of the stage's program (pipelineRanges). Its
// gradients are summed after each backward range, the step's last
// microbatch's reduced over the replicas as the range makes them; its
// outputs joined after its last range.
void Run::runPart(int64_t m, int r, std::vector<std::vector<Tensor>> &activations) {
  const int begin = ranges[r].begin, end = ranges[r].end, n = static_cast<int>(instructions);
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
}

// A pipeline step's items: on CUDA their leading receives first, in one
// group with the sends the step before held.
void Run::runPipelineStep(const std::vector<PipelineItem> &items, std::vector<std::vector<Tensor>> &activations) {
#ifdef PARAX_WITH_CUDA
  if (opt.device == "cuda") {
    std::vector<std::pair<int64_t, int>> ahead;
    for (const PipelineItem &item : items) ahead.push_back({item.micro, ranges[item.range].begin});
    Status st = gpus[0]->exchange(ahead);
    if (!st.isOk()) die(st.message());
  }
#endif
  for (const PipelineItem &item : items) runPart(item.micro, item.range, activations);
}

// Without a pipeline: each microbatch by run().
void Run::runMicrobatches(int step) {
  for (int64_t j = 0; j < micro; ++j) {
    Status s = Status::ok();
    if (j > 0 || (step > 0 && (micro > 1 || blocks > 1))) // prepare set microbatch 0 for the first step
      s = runners[0].setInputs(microbatch(j));
    if (!s.isOk()) die(s.message());
#ifdef PARAX_WITH_CUDA
    // Every microbatch's gradients added to the sums as they are written
    // (their memory is not kept past that); the last's reduced over the
    // replicas then too.
    if (deviceOptimizer) s = gpus[0]->streamGradients(j == 0, -1, j + 1 == micro);
    if (!s.isOk()) die(s.message());
#endif
    s = runners[0].run();
    if (!s.isOk()) die(s.message());
    s = training->join(results, runners[0].outputs());
    if (!s.isOk()) die(s.message());
  }
}

void Run::runSteps() {
  std::vector<std::vector<Tensor>> activations(opt.device == "cpu" ? sets : 0); // the CPU backend's sets
  for (int step = 0; step < opt.steps; ++step) {
    barrier("the barrier before a step");
    auto start = Clock::now();
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
    for (const auto &items : pipeline) runPipelineStep(items, activations);
    if (!pipelined) runMicrobatches(step);
    if (trains) {
      optimizerStep();
      recordLosses();
    }
    barrier("the barrier after a step");
    times.push_back(secondsSince(start));
    if (trains && writer && (!opt.quiet || logJson.is_open())) logStep(step);
    if (opt.saveEvery > 0 && step + 1 < opt.steps && training->steps() % opt.saveEvery == 0)
      saveStep(training->steps());
  }
  finishSteps();
}

// The step's gradients averaged, clipped and applied; the moves of
// parameters run again on the new values.
void Run::optimizerStep() {
  Status s = Status::ok();
  if (deviceOptimizer) {
#ifdef PARAX_WITH_CUDA
    s = deviceStep(*gpus[0], *training, opt.optimizer, updates, micro, gradNorm);
#endif
  } else {
    auto began = Clock::now();
    s = training->averageGradients(results, micro, opt.optimizer.zero);
    syncTimes.push_back(secondsSince(began));
    auto averaged = Clock::now();
    if (s.isOk()) s = training->apply(opt.optimizer, results, parameters(), gradNorm);
#ifdef PARAX_WITH_CUDA
    if (s.isOk() && opt.device == "cuda") s = gpus[0]->updateParameters(masters);
#endif
    optimizerTimes.push_back(secondsSince(averaged));
    tallyReduces();
  }
  if (s.isOk() && opt.biasSpeed > 0) balanceExperts();
  if (s.isOk() && opt.device == "cpu") s = cpu.hoistParameterMoves();
  if (!s.isOk()) die(s.message());
}

// The loss and its terms: each the mean over the microbatches and the
// replicas.
void Run::recordLosses() {
  for (auto [output, values] : {std::pair(lossOutput, &losses), std::pair(opt.terms[0].output, &opt.terms[0].values),
                                std::pair(opt.terms[1].output, &opt.terms[1].values)}) {
    if (output < 0) continue;
    double mean = 0;
    for (float v : results[output].f) mean += v;
    mean /= static_cast<double>(results[output].f.size());
    Status s = training->replicaMean(mean);
    if (!s.isOk()) die(s.message());
    values->push_back(static_cast<float>(mean));
  }
}

// The step's line (unless --quiet) and --log-json's.
void Run::logStep(int step) {
  std::string balance, balanceJson; // the loss's terms
  for (const LossTerm &t : opt.terms)
    if (!t.values.empty()) {
      char text[96];
      std::snprintf(text, sizeof text, " (%s %.6f)", t.label, t.values.back());
      balance += text;
      balanceJson += std::string(", \"") + t.file + "\": " + jsonNumber(t.values.back());
    }
  // Progress: the step's time, its tokens a second, and what the steps
  // left take at the median of the last (at most 32) steps -- not of them
  // all, which a long run would sort every step.
  std::vector<double> sorted(times.end() - std::min<size_t>(times.size(), 32), times.end());
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  long long left = static_cast<long long>(std::llround(sorted[sorted.size() / 2] * (opt.steps - step - 1)));
  double tokens = static_cast<double>(rows) *
                  (!inputTensors.empty() && inputTensors[0].shape.size() > 1 ? inputTensors[0].shape[1] : 1);
  bool clipped = opt.optimizer.clipNorm > 0 && gradNorm > opt.optimizer.clipNorm;
  if (!opt.quiet) {
    char text[384];
    std::snprintf(text, sizeof text,
                  "step %lld: loss %.6f%s, gradient norm %.6f%s, learning rate %.6g; %.1f ms, %.0f tokens/s, "
                  "%lld:%02lld:%02lld left",
                  static_cast<long long>(training->steps()), losses.back(), balance.c_str(), gradNorm,
                  clipped ? " (clipped)" : "", training->lastLearningRate(), 1e3 * times.back(),
                  tokens / times.back(), left / 3600, left / 60 % 60, left % 60);
    char brief[192]; // (a terminal's line: what changes first)
    std::snprintf(brief, sizeof brief, "step %lld/%d loss %.4f %.0f tok/s %lld:%02lld:%02lld left",
                  static_cast<long long>(training->steps()), opt.steps, losses.back(), tokens / times.back(),
                  left / 3600, left / 60 % 60, left % 60);
    progress.show(static_cast<double>(step + 1) / opt.steps, text, brief);
  }
  if (logJson.is_open()) {
    logJson << "{\"step\": " << training->steps() << ", \"loss\": " << jsonNumber(losses.back()) << balanceJson
            << ", \"grad_norm\": " << jsonNumber(gradNorm) << ", \"clipped\": " << (clipped ? "true" : "false")
            << ", \"lr\": " << jsonNumber(training->lastLearningRate())
            << ", \"seconds\": " << jsonNumber(times.back()) << ", \"tokens_per_s\": " << jsonNumber(tokens / times.back())
            << ", \"eta_s\": " << left << "}\n";
    logJson.flush();
    if (!logJson) die("--log-json: writing '" + opt.logJsonPath + "' failed");
  }
}

void Run::finishSteps() {
#ifdef PARAX_WITH_CUDA
  // The device optimizer's gradients, masters and moments, read back where
  // something writes them (every rank: under ZeRO the gradients and
  // masters are all-gathered).
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
  // (with ZeRO each replica has only summed its own microbatches' yet; the
  // device optimizer's are the mean already).
  Status s = Status::ok();
  if (!trains) s = training->averageGradients(results, micro, false);
  else if (opt.optimizer.zero && !deviceOptimizer) s = training->meanOverReplicas(results);
  if (!s.isOk()) die(s.message());
}

// The step's count over micro x replicas (a step's rows are block's).
float Run::stepLabelCount() {
  const Tensor &labels = inputTensors[labelsInput];
  int64_t width = labels.numel() / std::max<int64_t>(labels.shape.empty() ? 1 : labels.shape[0], 1);
  int64_t counted = 0;
  for (int64_t k = block * rows * width; k < (block + 1) * rows * width; ++k) counted += labels.i[k] != ignoreIndex;
  return static_cast<float>(static_cast<double>(counted) / static_cast<double>(micro * replicas));
}

// The averaging's all-reduces, by the ranks they span and their message's
// bytes (kept a step only for --profile: a long run's would grow).
void Run::tallyReduces() {
  std::map<Trainer::ReduceKey, Trainer::ReduceTally> step = training->takeReduceTally();
  if (opt.profilePath.empty()) return;
  for (const auto &[key, tally] : step) {
    reduceTimes[key].push_back(tally.seconds);
    reduceCalls[key] = tally.calls;
  }
}

// The step's expert loads (every rank's counts summed), then each bias this
// rank holds moved by biasSpeed towards balance.
void Run::balanceExperts() {
  std::vector<double> loads(biasLoads, 0.0);
  const pxe::Stage &mine = exe.stages(stageIndex);
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
  std::vector<Tensor> moved(parameters().size()); // (on CUDA: the biases written to the device)
  for (const pxe::Buffer &b : mine.buffers()) {
    auto found = b.role() == pxe::PARAMETER ? biasAt.find(b.param_name()) : biasAt.end();
    if (found == biasAt.end()) continue;
    Tensor &bias = parameters()[b.id()];
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
}

// Weights and optimizer state: one file, gathered whole on the writer; or a
// folder (a path ending in '/', or an existing folder), a sharded
// checkpoint each rank writes its share of (whole tensors spread over the
// ranks), with rank 0's index; or (--save-format boxes) each rank's own
// boxes in a file of its own, nothing gathered, with rank 0's index.
std::string Run::makeFolder(const std::string &path) {
  std::string folder = path.back() == '/' ? path.substr(0, path.size() - 1) : path;
  if (::mkdir(folder.c_str(), 0755) != 0 && errno != EEXIST) die(folder + ": cannot create the folder");
  return folder;
}

// Each save's identity, in every file it writes and in its index (written
// last, once every rank's files are): a loader refuses files of another
// save (a save that died part way, its index still the last one's).
std::string Run::saveIdentity() {
  unsigned long long id[2] = {std::random_device{}(), static_cast<unsigned long long>(
                                                          std::chrono::system_clock::now().time_since_epoch().count())};
  if (mpi && size > 1) MPI_Bcast(id, 2, MPI_UNSIGNED_LONG_LONG, 0, MPI_COMM_WORLD);
  char text[64];
  std::snprintf(text, sizeof text, "%llx-%llx", id[0], id[1]);
  return std::string(text);
}

// Every rank's files written (or not): the index is written only then, and
// only if all were.
bool Run::allWritten(const Status &mine) {
  int ok = mine.isOk() ? 1 : 0;
  if (mpi && size > 1) MPI_Allreduce(MPI_IN_PLACE, &ok, 1, MPI_INT, MPI_MIN, MPI_COMM_WORLD);
  return ok == 1;
}

// Each rank's file's size and checksum (after it is written; a failure
// joins `st`), then, once every rank's files are, gathered on rank 0 for
// the index, by the file name of each rank that wrote one.
std::array<uint64_t, 3> Run::digestOf(const std::string &file, bool wrote, Status &st) {
  std::array<uint64_t, 3> mine = {0, 0, 0};
  if (wrote && st.isOk()) {
    StatusOr<FileDigest> d = digestFile(file);
    if (d.isOk()) mine = {1, d.value().bytes, d.value().crc32};
    else st = d.status();
  }
  return mine;
}

std::map<std::string, FileDigest> Run::gatherDigests(const std::array<uint64_t, 3> &mine,
                                                     const std::function<std::string(int)> &nameOf) {
  std::vector<uint64_t> all(3 * std::max(size, 1));
  if (mpi && size > 1) MPI_Gather(mine.data(), 3, MPI_UINT64_T, all.data(), 3, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  else std::copy(mine.begin(), mine.end(), all.begin());
  std::map<std::string, FileDigest> digests;
  for (int r = 0; r < std::max(size, 1); ++r)
    if (all[3 * r]) digests[nameOf(r)] = FileDigest{all[3 * r + 1], static_cast<uint32_t>(all[3 * r + 2])};
  return digests;
}

void Run::saveBoxes(const std::string &path, bool state) {
  BoxCheckpoint boxes;
  Status st = Status::ok();
  if (state) st = training->optimizerStateBoxes(boxes);
  else if (!masterChunks.empty()) st = training->parameterChunkBoxes(parameters(), masterChunks, boxes);
  else training->parameterBoxes(parameters(), "", boxes);
  if (st.isOk()) st = training->gatherRecords(boxes.records);
  if (!st.isOk()) die(st.message());
  std::string folder = makeFolder(path);
  int ranks = exe.ranks_size();
  std::string id = saveIdentity();
  if (!boxes.tensors.empty()) st = writeSafetensors(folder + "/" + boxFileName(rank, ranks), boxes.tensors, id);
  auto mine = digestOf(folder + "/" + boxFileName(rank, ranks), !boxes.tensors.empty(), st);
  if (!allWritten(st)) die(st.isOk() ? "another rank could not write its part of " + folder : st.message());
  auto digests = gatherDigests(mine, [&](int r) { return boxFileName(r, ranks); });
  if (rank == 0) st = writeBoxIndex(folder, boxes.records, ranks, id, digests);
  if (!st.isOk()) die(st.message());
}

void Run::save(const std::string &path, bool state) {
  if (opt.saveFormat == "boxes") return saveBoxes(path, state);
  bool sharded = isFolderPath(path);
  int to = sharded ? Trainer::kEveryRank : writerOf(exe, 0);
  std::map<std::string, Tensor> tensors;
  Trainer::Layout layout;
  Status st = state ? training->gatherState(to, tensors, &layout)
                    : training->gatherParameters(parameters(), to, tensors, "", &layout);
  if (!st.isOk()) die(st.message());
  if (!sharded) {
    if (writer) st = writeSafetensors(path, tensors);
    if (!st.isOk()) die(st.message());
    return;
  }
  std::string folder = makeFolder(path);
  int shards = 0;
  for (const auto &[name, writerRank] : layout.writer) shards = std::max(shards, writerRank + 1);
  std::map<std::string, std::string> weightMap;
  for (const auto &[name, writerRank] : layout.writer) weightMap[name] = shardFileName(writerRank, shards);
  std::string id = saveIdentity();
  if (!tensors.empty()) st = writeSafetensors(folder + "/" + shardFileName(rank, shards), tensors, id);
  auto mine = digestOf(folder + "/" + shardFileName(rank, shards), !tensors.empty(), st);
  if (!allWritten(st)) die(st.isOk() ? "another rank could not write its shard of " + folder : st.message());
  auto digests = gatherDigests(mine, [&](int r) { return shardFileName(r, shards); });
  if (rank == 0) st = writeSafetensorsIndex(folder, weightMap, layout.bytes, id, digests);
  if (!st.isOk()) die(st.message());
}

// The device optimizer's masters (for --save-weights) and moments (for
// --save-optimizer), read back to the host for writing, nothing more.
// Under ZeRO the masters are all-gathered, but for a box-wise checkpoint:
// each rank's chunks, nothing gathered.
void Run::readDeviceState() {
#ifdef PARAX_WITH_CUDA
  Status st = Status::ok();
  if (!opt.saveWeights.empty() && opt.saveFormat == "boxes" && training->sharesState(opt.optimizer)) {
    auto chunks = gpus[0]->readMasterChunks();
    if (!chunks.isOk()) die(chunks.status().message());
    masterChunks.assign(exe.stages(stageIndex).outputs_size(), {});
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
#endif
}

// --save-every K: every K optimizer steps (counting a resumed run's), but
// the last, a checkpoint of the step beside the one the run ends with:
// OUT/ as OUT/step-0000000K/, OUT.safetensors as
// OUT-step-0000000K.safetensors.
void Run::saveStep(int64_t t) {
  char tag[32];
  std::snprintf(tag, sizeof tag, "step-%08lld", static_cast<long long>(t));
  auto at = [&](const std::string &path) { // (a file's path has no trailing '/')
    if (isFolderPath(path) || opt.saveFormat == "boxes") return makeFolder(path) + "/" + tag + "/";
    size_t dot = path.rfind(".safetensors");
    return (dot == std::string::npos ? path : path.substr(0, dot)) + "-" + tag + ".safetensors";
  };
  if (deviceOptimizer) readDeviceState();
  if (!opt.saveWeights.empty()) save(at(opt.saveWeights), false);
  if (!opt.saveOptimizer.empty()) save(at(opt.saveOptimizer), true);
}

} // namespace parax::run
