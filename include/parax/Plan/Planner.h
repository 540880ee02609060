//===- Planner.h - search for the best placement ----------------*- C++ -*-===//
//
// searchPlans enumerates the factorizations of the cluster's devices into
// pp x dp x ep x cp x tp (tp innermost and inside a node; cp, context
// parallelism, splits long sequences), microbatch sizes,
// pipeline schedules, ZeRO stages, recompute policies and sequence
// parallelism; chooses every op's tensor-parallel layout exactly per layer
// kind (LayerSolver) and the pipeline stage boundaries by dynamic programming
// over layers; and returns the best plans that fit in memory, each with its
// time and memory breakdown. When nothing fits it says which memory term
// overflows, by how much, and the smallest change that fits.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_PLAN_PLANNER_H
#define PARAX_PLAN_PLANNER_H

#include "parax/Plan/Cluster.h"
#include "parax/Plan/LayerSolver.h"
#include "parax/Plan/ModelGraph.h"
#include "parax/Plan/Workload.h"

#include "llvm/Support/JSON.h"

#include <array>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace parax::plan {

struct PlanOptions {
  int topK = 5;
  /// Usable share of HBM (allocator fragmentation, workspace).
  double memoryHeadroom = 0.9;
  /// Per device: CUDA context, NCCL buffers, library workspace.
  double reservedBytes = 1.5e9;
  /// Skip the "what would fit" follow-up search when nothing fits.
  bool explainInfeasible = true;
  /// Skip configurations whose lower bound cannot reach the top k (the
  /// result is the same; tests compare both).
  bool prune = true;
  /// Plans for parax's runtime to run (--parax-plan): no what-if it does
  /// not implement (experts folded over the TP ranks).
  bool lowering = false;
  /// When set (--parax-plan: the IR's batch), ep divides it: each EP rank
  /// of the program runs its own sequences, as the plan is costed.
  int64_t epDivides = 0;
  /// Keep configurations whose pipeline stages fit in no split of the
  /// layers, costed with the split that needs the least memory (they do
  /// not fit): what searchPlans searches with when a search found nothing
  /// to explain by.
  bool keepUnfitStages = false;
};

struct MemoryBreakdown {
  double weights = 0, gradients = 0, optimizer = 0, activations = 0,
         kvCache = 0, reserved = 0;
  /// The CUDA backend's kernel scratch: one buffer a stage, as large as its
  /// largest op's (an embedding table's gradient in fp32, the experts' rows
  /// at the dispatch's capacity, grouped heads' dK and dV in fp32).
  double scratch = 0;
  double total() const {
    return weights + gradients + optimizer + activations + kvCache + scratch +
           reserved;
  }
};

/// Per-kind tallies of a plan's collectives, in an array (the search
/// tallies every candidate it costs); a kind never tallied is absent from
/// the reports.
template <typename T> struct CollectiveTally {
  static constexpr size_t kKinds = static_cast<size_t>(CollectiveKind::SendRecv) + 1; // (the last kind)
  std::array<T, kKinds> value{};
  std::array<bool, kKinds> seen{};
  T &operator[](CollectiveKind kind) {
    seen[static_cast<size_t>(kind)] = true;
    return value[static_cast<size_t>(kind)];
  }
  /// The tallied kinds by name (all_gather, all_reduce, ...), in name order.
  std::map<std::string, T> byName() const {
    std::map<std::string, T> out;
    for (size_t k = 0; k < kKinds; ++k)
      if (seen[k])
        out[toString(static_cast<CollectiveKind>(k)).str()] = value[k];
    return out;
  }
};

struct Plan {
  // Degrees: devices = pp * dp * ep * cp * tp; dense layers see dp * ep
  // replicas; cp ranks split each sequence (context parallelism).
  int64_t pp = 1, dp = 1, ep = 1, tp = 1, cp = 1;
  bool sequenceParallel = false;
  /// The experts folded over the TP ranks (etp=1): each whole on one of
  /// ep x tp ranks (Profile::expertFolding; a what-if parax's runtime does
  /// not run).
  bool expertsFolded = false;
  int64_t microBatch = 1, microBatches = 1;
  Schedule schedule = Schedule::OneFOneB;
  int64_t virtualStages = 1;
  int zero = 0;
  Recompute recompute = Recompute::None;
  /// First index (into ModelGraph::layers) of each stage.
  std::vector<int64_t> stageStart;
  /// Interleaved 1F1B: the first decoder layer of each virtual stage (pp x
  /// virtualStages of them, virtual stage c run on pipeline stage c % pp),
  /// from interleavedChunks. Empty: not interleaved.
  std::vector<int64_t> chunkStart;
  /// The stage (the virtual stage when interleaved) of graph layer `layer`
  /// (an index into ModelGraph::layers) whose parax.layer is `index` (-1:
  /// the prologue, with the first; past the decoder layers: the epilogue,
  /// with the last).
  int64_t stageOfLayer(int64_t layer, int64_t index) const;

  // Times (seconds per step). Exposed communication only.
  double stepTime = 0;
  double computeTime = 0; // on the slowest stage, all microbatches
  double bubbleTime = 0;
  double tpComm = 0, ppComm = 0, dpComm = 0, epComm = 0;
  /// Context parallelism: every layer's keys and values gathered over the
  /// cp ranks (and, training, their gradients reduce-scattered back).
  double cpComm = 0;
  double optimizerTime = 0;
  /// Training without ZeRO-3: the step's gradient synchronisation (its
  /// reduction and, under ZeRO-1/2, the updated parameters' all-gather)
  /// over the data-parallel group, and the time that hides it (the last
  /// backward's, less its own collectives' use of the links; 0 without
  /// dp_overlap). dpComm is what the window leaves exposed. For --explain.
  double dpSync = 0, dpWindow = 0;
  /// Megatron-Core's buckets: the parameters (a device's) of the first
  /// stage's first bucket, reduced after the backward and gathered before
  /// the next forward (0: no buckets).
  double dpTail = 0;
  /// What the hidden data-parallel collectives cost the compute beside
  /// them (Profile::dpOverlapSms), seconds a step, in dpComm.
  double dpBeside = 0;
  /// Training: per virtual stage (pp x virtualStages of them, virtual
  /// stage c on stage c % pp), one microbatch's forward and backward pass
  /// (the backward with its recomputation), seconds; one pipeline
  /// transfer's seconds; and what follows the last backward pass (the tied
  /// weight's exchange, the exposed gradient sync, the optimizer). What
  /// simulatePipeline (Timeline.h) runs; set for the plans a search may
  /// return (those that fit within the best so far).
  std::vector<double> stageForward, stageBackward;
  double transferTime = 0, tailTime = 0;
  // Results.
  double mfu = 0;            // train, prefill
  double tokensPerSecond = 0;
  double tokensPerSecondPerDevice = 0;
  /// Decode: the weights one device reads per step (all its stages, one after
  /// the other) over its HBM bandwidth: a lower bound on the step time.
  double weightReadBound = 0;
  /// Inference: bytes a replica (tp x pp devices) has left for the KV cache.
  double kvRoom = 0;
  MemoryBreakdown memory;     // the fullest stage
  std::vector<MemoryBreakdown> stageMemory; // each pipeline stage's, in order
  double capacity = 0;        // usable bytes per device
  bool fits = false;
  double objective = 0;       // smaller is better
  /// Forward collectives per step by kind, over decoder layers and overall.
  CollectiveTally<int64_t> decoderCollectives, allCollectives;
  /// Bytes of the forward collectives over the tp group per microbatch on a
  /// device, by kind, as costed (all-gather: the gathered value;
  /// reduce-scatter, all-reduce: the input; all-to-all: the value whole
  /// over tp).
  CollectiveTally<double> tpCollectiveBytes;

  std::string degrees() const;
  static Plan withDegrees(int64_t pp, int64_t dp, int64_t ep, int64_t tp,
                          bool sequenceParallel);
};

struct PlanResult {
  std::vector<Plan> plans; // best first, feasible only
  std::optional<Plan> closest; // when nothing fits: the least overflowing
  std::string explanation;     // when nothing fits: why, and what would
  int64_t evaluated = 0;
  double searchSeconds = 0;
  int64_t devices = 0;
  double params = 0, activeParams = 0, paramBytes = 0;
  double kvBytesPerToken = 0; // whole model, at the workload's KV dtype
  double modelFlopsPerToken = 0;
  int64_t decoderLayers = 0;
};

/// `workload` with what it leaves to the graph filled in from `model`: a
/// decode's KV cache dtype, where unstated, the element type of the caches
/// the graph holds (else bf16). searchPlans and layerPlansFor apply it
/// themselves; a caller that reports the workload applies it first.
Workload resolveWorkload(Workload workload, const ModelGraph &model);

PlanResult searchPlans(const ModelGraph &model, const ClusterSpec &cluster,
                       const Workload &workload,
                       const PlanOptions &options = {});

/// Pipeline stage boundaries: splits layers [0, n) into `pp` contiguous
/// non-empty stages minimising the slowest stage's time, where stage s must
/// hold its layers' states plus `inflight(s)` copies of their activations
/// within `capacity`. Returns each stage's first layer (empty if nothing
/// fits) and sets `maxStage`. Exact (dynamic programming).
std::vector<int64_t> partitionStages(llvm::ArrayRef<double> layerTime,
                                     llvm::ArrayRef<double> layerStates,
                                     llvm::ArrayRef<double> layerActivations,
                                     llvm::function_ref<double(int64_t)> inflight,
                                     double capacity, int64_t pp,
                                     double &maxStage);

/// Interleaved 1F1B's virtual stages: pipeline stage s's
/// `layersPerStage[s]` decoder layers dealt into `chunks` runs of nearly
/// equal counts (the larger first), virtual stage j x pp + s holding run j
/// of stage s, so that each device holds the layers the cost model gave it.
/// Returns each virtual stage's first decoder layer (empty when a stage has
/// fewer layers than chunks).
std::vector<int64_t> interleavedChunks(llvm::ArrayRef<int64_t> layersPerStage,
                                       int64_t chunks);

/// The per-layer op layouts of `plan` (for writing onto the IR): one
/// LayerPlan per entry of model.layers.
std::vector<LayerPlan> layerPlansFor(const ModelGraph &model,
                                     const ClusterSpec &cluster,
                                     const Workload &workload, const Plan &plan);

/// --explain: the best plan's cost terms with their inputs -- the cluster's
/// and the profile's figures, each distinct layer's ops (strategy, forward
/// time) and collectives (kind, bytes, time), and how the step adds up.
std::string explainPlan(const ModelGraph &model, const ClusterSpec &cluster,
                        const Workload &workload, const Plan &plan);

/// A readable ranked table, and the same as JSON.
std::string formatPlans(const PlanResult &result, const ClusterSpec &cluster,
                        const Workload &workload);
llvm::json::Value plansToJson(const PlanResult &result,
                              const ClusterSpec &cluster,
                              const Workload &workload);

} // namespace parax::plan

#endif // PARAX_PLAN_PLANNER_H
