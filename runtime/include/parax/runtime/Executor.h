// Executor.h - runs one rank's stage of an executable on the CPU.
//
// Buffers are assigned up front (prepare): parameters read from the
// checkpoint (this rank's slice only), inputs sliced from the model inputs;
// then run() executes the instructions in order, one kernel each.

#ifndef PARAX_RUNTIME_EXECUTOR_H
#define PARAX_RUNTIME_EXECUTOR_H

#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/Communicator.h"
#include "parax/runtime/Executable.h"
#include "parax/runtime/Status.h"
#include "parax/runtime/Tensor.h"
#include "parax/runtime/executable.pb.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace parax::runtime {

/// The CPU executor's GEMM kernels, for a run's summary: oneDNN's version,
/// the instruction set its kernels use on this CPU and the threads each
/// product takes (OMP_NUM_THREADS, or this rank's share of the cores).
std::string gemmKernels();

/// Whether two programs' input buffers are the same box of the same input
/// on a rank: input index, dtype, shape and split axes.
bool sameInputBox(const pxe::Buffer &a, const pxe::Buffer &b);

class Executor {
public:
  /// How another backend loads through this one (the CUDA backend):
  /// `parameterLoaded(id)` runs as soon as parameter buffer `id` is read, to
  /// copy it away; its host copy is then freed at once unless a move of
  /// parameters reads it at prepare. Temporaries get host memory only where
  /// prepare computes them (those moves).
  struct LoadHooks {
    std::function<Status(int32_t id)> parameterLoaded;
    /// True when the other backend already holds parameter `id` (another
    /// program's copy of the same box): it is not read then (its host
    /// tensor keeps only its shape). Asked only of parameters that no move
    /// of parameters reads.
    std::function<bool(int32_t id)> alreadyHeld;
    /// The host copy of each parameter stays after parameterLoaded (by
    /// default it goes, unless a move of parameters reads it).
    bool keepParameters = false;
  };
  /// `comm` may be null for a grid of one rank.
  Status prepare(const pxe::Executable &exe, int rank, Communicator *comm,
                 const Checkpoint &weights, const std::vector<Tensor> &inputs,
                 const LoadHooks *hooks = nullptr);
  /// Replaces the model inputs (the next microbatch, the next generation
  /// step) without reloading weights. A KV cache that the steps write in
  /// place (cacheStateInputs) given as a shape without values keeps what
  /// its buffer holds: zeros at first, then what the last step wrote.
  /// Run-time positions are checked against what they index, token ids
  /// against the vocabulary.
  Status setInputs(const std::vector<Tensor> &inputs);
  /// Global shapes of the model inputs this stage reads (by input index).
  std::vector<std::vector<int64_t>> inputShapes() const;
  Status run();
  /// Instructions [begin, end) of the stage only (run() is all of them):
  /// a pipeline schedule's forward or backward half of a training step.
  Status runRange(int begin, int end);
  /// Exchanges the values one microbatch keeps between its forward and its
  /// backward half (the inputs and the temporaries, but not the results of
  /// moves of parameters, computed once) with `held`'s: empty, it receives
  /// buffers of the right shapes first. A 1F1B schedule keeps one such set
  /// per microbatch in flight.
  void swapActivations(std::vector<Tensor> &held);
  /// The stage's outputs: the last stage's results, and a training step's
  /// gradients of the parameters the stage holds (in their split). Those
  /// every run writes afresh are handed over (the buffer takes a recycled
  /// tensor's memory in their place: no copy), the rest copied; so the
  /// first output's logits are gone from the stage after it (greedyTokens
  /// first).
  std::vector<Tensor> outputs();
  /// An earlier step's results: outputs() puts their memory back into the
  /// stage or copies into it (recyclable(), Tensor.h).
  void recycle(std::vector<Tensor> results) { spare_ = recyclable(std::move(results)); }
  /// Each row's most likely token of the first output (logits [..., V]):
  /// the first of equal largest values. The last stage only.
  StatusOr<std::vector<int32_t>> greedyTokens() const;
  int stage() const { return stage_; }
  size_t instructionCount() const;
  /// Instructions that only move parameters (slice, shard_slice, to_partial,
  /// reshape, ... of parameters or of such moves): `prepare` runs them once
  /// and `run` skips them.
  bool hoisted(int instruction) const { return hoisted_[instruction]; }
  size_t hoistedInstructions() const;
  /// The most (token, choice) rows an expert dispatch sent one rank, as a
  /// multiple of a rank's own pairs, over every dispatch run so far (0:
  /// none over several ranks): the least expert capacity these steps fit.
  double busiestExpertLoad() const { return busiestExpertLoad_; }
  /// Each router with a correction bias (DeepSeek-V3's): its expert choices
  /// counted over every run since the last call, by the bias's buffer
  /// ([E] counts; a router re-run by recompute counts again). Cleared.
  std::map<int32_t, std::vector<double>> takeExpertCounts() { return std::exchange(expertCounts_, {}); }
  /// The count every label_count instruction gives from now on instead of
  /// counting its own labels (parax-run --per-token-loss: the step's counted
  /// labels over its microbatches and replicas); none: count them.
  void setLabelCount(std::optional<float> count) { labelCount_ = count; }
  /// Runs the moves of parameters again (prepare ran them once): after an
  /// optimizer step changed the parameters' values (hostBuffers).
  Status hoistParameterMoves();
  /// For a backend that has copied parameters and temporaries elsewhere
  /// (the CUDA backend, to the device): frees their host memory, keeping
  /// their shapes. `run` refuses to run afterwards; inputs stay (and,
  /// with `keepParameters`, the parameters' values).
  void releaseHostCopies(bool keepParameters = false);
  /// For other backends, which load through this one and then take over.
  const pxe::Stage &stageProgram() const { return *stageProto_; }
  const std::vector<int64_t> &coordinates() const { return coords_; }
  /// The checkpoint box parameter `buffer` of this stage reads on this rank.
  CheckpointBox parameterBox(const pxe::Buffer &buffer) const { return checkpointBox(*exe_, coords_, buffer); }
  /// KV caches kept outside the executor, by input index: one set per
  /// microbatch of a generation loop, which the programs of that microbatch
  /// (the prefill's and the step's) take in turn.
  using CacheSet = std::map<int32_t, Tensor>;
  /// Exchanges this stage's KV caches (the inputs the steps write in place)
  /// with `held`'s of the same input index: after a call the executor holds
  /// `held`'s caches, `held` what the executor held; a call again swaps them
  /// back. An input `held` lacks enters it as zeros. A cache of another
  /// shape (a program planned otherwise) is an error naming the input.
  Status swapCacheState(CacheSet &held);
  /// Whether buffer `id` is a KV cache the steps write in place.
  bool isCacheState(int32_t id) const {
    return std::find(cacheState_.begin(), cacheState_.end(), id) != cacheState_.end();
  }
  std::vector<Tensor> &hostBuffers() { return buffers_; }
  const std::vector<Tensor> &hostBuffers() const { return buffers_; }
  /// parax-run --profile: from now on each instruction's wall time is
  /// recorded on every run (instructionSeconds: per instruction, one entry
  /// a run of it); off again with false (the records stay).
  void setProfiling(bool on);
  /// The stage's outputs are read on the ranks that hold results alone
  /// (Session::holdsResults: the first rank of each group over the model
  /// axes): an all-gather that makes an output no instruction reads then
  /// gathers onto its group's first rank, and the group's other ranks
  /// leave that output unfilled. Off by default (every rank gets every
  /// output whole); a training step's outputs are not gathered this way.
  void setResultsOnHoldersOnly(bool on) { resultsOnHoldersOnly_ = on; }
  const std::vector<std::vector<double>> &instructionSeconds() const { return seconds_; }

private:
  struct Impl;
  Status checkInputValues() const;
  const pxe::Executable *exe_ = nullptr;
  const pxe::Stage *stageProto_ = nullptr;
  Communicator *comm_ = nullptr;
  int rank_ = 0;
  int stage_ = 0;
  std::vector<int64_t> coords_;
  std::vector<Tensor> buffers_;
  mutable std::vector<Tensor> spare_; // recycle()'s tensors, for outputs() to fill
  std::vector<bool> hoisted_; // per instruction
  std::vector<bool> handedOver_; // per buffer: an output outputs() hands over
  std::vector<bool> reshapeTakes_; // per buffer: a reshape's result that takes its operand's storage
  void markReshapesInPlace(const std::vector<bool> &fixed, const std::vector<int> &named,
                           const std::vector<int> &written, const std::vector<int> &lastRead);
  std::vector<bool> gathersToFirst_; // per buffer: an output all-gathered that no instruction reads
  void markGathersToHolders(const std::vector<int> &named, const std::vector<int> &lastRead);
  bool resultsOnHoldersOnly_ = false;
  std::vector<int32_t> activations_; // buffers swapActivations exchanges
  std::vector<int32_t> cacheState_; // cacheStateInputs of the stage
  std::vector<int> readsCheckedInputs_; // instructions reading token ids or a position from the inputs
  bool runsElsewhere_ = false; // prepared for another backend, or its host copies released
  double busiestExpertLoad_ = 0;
  std::vector<int> kernels_;                            // each instruction's CPU kernel (Impl::kKernels' index)
  std::map<int32_t, std::vector<double>> expertCounts_; // takeExpertCounts
  std::optional<float> labelCount_;                      // setLabelCount
  bool profiling_ = false;
  std::vector<std::vector<double>> seconds_; // setProfiling
};

} // namespace parax::runtime

#endif // PARAX_RUNTIME_EXECUTOR_H
