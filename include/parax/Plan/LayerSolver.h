//===- LayerSolver.h - exact op shardings for one layer ---------*- C++ -*-===//
//
// Chooses, for every op of a layer graph, how it runs on a tensor-parallel
// group of `tp` devices: replicated, or one of the splits its rule allows
// (a linear: output features = column-parallel, input features =
// row-parallel with a partial-sum result; attention: by heads; norms and
// elementwise ops: follow their input). Resharding between a producer's and a
// consumer's layout costs the collective of DESIGN §4 (partial -> replicated:
// all_reduce; partial -> split: reduce_scatter; split -> replicated:
// all_gather; split -> other split: all_to_all; replicated -> split: free).
//
// The solution is exact: a dynamic program over the ops in program order
// whose state is the layout of every live value, minimising the layer's
// time (compute by roofline + communication). Nothing about Megatron's
// column-then-row pairing is written in: it is what the minimum is.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_PLAN_LAYERSOLVER_H
#define PARAX_PLAN_LAYERSOLVER_H

#include "parax/Plan/CostModel.h"
#include "parax/Plan/ModelGraph.h"

#include <algorithm>
#include <string>

namespace parax::plan {

/// A value's layout over the tensor-parallel axis.
enum : int8_t { kReplicated = -1, kPartial = -2, kDead = -3 };
/// Printed as "R", "P" or "S<dim>".
std::string layoutName(int8_t layout);

struct TpContext {
  const ClusterSpec *cluster = nullptr;
  double peak = 0;              // FLOP/s of the model's dtype
  /// The workload's gemm= dtype (0: the model's): the GEMMs' FLOP/s and
  /// their weights' bytes an element.
  double gemmPeak = 0, gemmBytes = 0;
  /// The gemm= dtype's datasheet peak over the model dtype's (fp8 on bf16:
  /// 2): the rate of a tile's k steps, whose fixed time is the same.
  double gemmKScale = 1;
  /// A training step keeps what only the GEMMs' gradients read of a value
  /// (their inputs x) in the GEMMs' dtype, this share of its bytes when
  /// narrower than the model's (gemm=fp8 on bf16: 1/2), as DeepSeek-V3
  /// caches them in FP8; 1 otherwise.
  double gemmInputShare = 1;
  int64_t tp = 1;
  Group group;                  // the tensor-parallel group
  int64_t ep = 1;               // expert-parallel degree (experts / ep here)
  /// The experts folded over the TP ranks (Profile::expertFolding, etp=1):
  /// each whole on one of ep x tp ranks, the router and the experts on the
  /// rank's sequence shard.
  bool foldExperts = false;
  /// The ranks the experts are dealt out over: ep, or ep x tp folded.
  int64_t expertRanks() const { return ep * (foldExperts ? tp : 1); }
  /// The rows an expert dispatch holds on a rank, as a multiple of the
  /// rank's own (token, choice) pairs: the expert ranks (any routing)
  /// unless the workload's expert capacity is less.
  double expertCapacity = 0; // 0: none set
  double dispatchedFactor() const {
    return expertCapacity > 0
               ? std::min<double>(expertRanks(), std::max(1.0, expertCapacity))
               : double(expertRanks());
  }
  bool sequenceParallel = false; // layer boundary split on the sequence
  /// Whether an activation may be split on the sequence inside a layer
  /// (a residual add between a reduce-scatter and an all-gather): not when
  /// the workload pins sp=0, which then means Megatron's layer without
  /// sequence parallelism (all-reduces, norms on whole activations).
  bool sequenceSplits = true;
  double sequences = 1;         // per microbatch (or per step)
  double queryLen = 1;          // new tokens per sequence
  double contextLen = 1;        // keys per query (incl. the new tokens)
  /// Context parallelism: the queries of a sequence are dealt out over this
  /// many ranks, position by position (cyclic), so each holds an equal
  /// share of the causal attention's (query, key) pairs.
  double queryPieces = 1;
  double kvBytes = 2;           // KV cache element bytes (decode)
  bool decode = false;          // attention reads a KV cache of contextLen
  /// A training step: it returns its loss (a scalar); the results of an IR
  /// without one (logits) stand in for it and are not gathered.
  bool train = false;
  double computeWeight = 1;     // train: 3 (forward + backward)
  double commWeight = 1;        // train: 2 (forward + backward conjugates)
  /// Constraints for tests: op index -> strategy name that must be chosen.
  std::vector<std::pair<int, std::string>> forced;
  double tokens() const { return sequences * queryLen; }
};

struct CollectiveUse {
  CollectiveKind kind;
  double bytes;
  int opIndex; // the consumer whose input needed it
  double seconds = 0; // forward, as costed
  int value = -1; // the value it moves (-1: an op's own collective)
  /// The dimension it gathers or scatters along (-1: neither).
  int8_t along = -1;
};

/// What an op computes on one device, for --explain: a GEMM's [m x k] x
/// [k x n], `batch` of them (a head linear's heads; the experts on a rank,
/// each its up- and down-projection), an attention's `batch` (sequence,
/// head) pairs of m queries over n keys of head width k; their `flops` and
/// the forward's `seconds` for them (a GEMM's without its fp8 casts). All
/// zero for other ops.
struct OpWork {
  double batch = 0, m = 0, n = 0, k = 0, flops = 0, seconds = 0;
  /// A training step's linear: its backward's two GEMMs (0: not costed
  /// apart).
  double backwardSeconds = 0;
  bool gemmDtype = false; // a GEMM in the workload's gemm= dtype
};

struct LayerPlan {
  bool feasible = false;
  llvm::SmallVector<std::string> strategy;           // per op
  llvm::SmallVector<llvm::SmallVector<int8_t>> layouts; // per op, per result
  double computeTime = 0; // forward, per device
  llvm::SmallVector<double> opTimes; // forward, per device, per op (--explain)
  llvm::SmallVector<OpWork> opWork;  // per op (--explain)
  double commTime = 0;    // forward tensor-parallel collectives
  /// Of commTime, what a stack that decomposes each sequence-parallel
  /// all-gather and reduce-scatter with the GEMMs that read or write its
  /// value hides behind them (Profile::tpOverlapGemms).
  double commBehindGemms = 0;
  /// The backward's time beyond twice the forward's: a flash-style
  /// attention's gradient recomputes the scores, 5 products a pair
  /// against the forward's 2 (AttentionGradOp::getFlops, 2.5x).
  double backwardExtraTime = 0;
  double selectiveRecomputeTime = 0;
  double weightBytes = 0;       // per device
  double expertWeightBytes = 0; // per device (included in weightBytes)
  /// Per device: the part of weightBytes a forward pass does not read (an
  /// embedding table's rows no token looks up).
  double unreadWeightBytes = 0;
  double weightParams = 0;      // per device
  double expertParams = 0;      // per device
  double largestWeightParams = 0; // per device: the largest parameter's box
  /// Per device: each dense (not routed-expert) parameter's box, in op
  /// order (a ZeRO-3 stack that gathers parameter by parameter).
  llvm::SmallVector<double, 8> denseTensors;
  /// Per device: of weightParams, those of a weight the first and the
  /// last layer share (a tied embedding; ModelGraph.tiedParams).
  double tiedParams = 0;
  /// Activations kept for backward per microbatch per device, by recompute
  /// policy: none, selective, full (layer inputs only).
  double activationBytes[3] = {0, 0, 0};
  double workingBytes = 0;      // one layer's activations (full recompute)
  /// Per microbatch per device: what the layer's backward pass makes at
  /// once while what the layer keeps is live: the gradient of its largest
  /// value (the loss's layer: of the logits); under EP an expert layer's
  /// gradient rows dispatched in, its input's gradient rows and its
  /// experts' weight gradients, if more.
  double backwardTransientBytes = 0;
  double inputBytes = 0, outputBytes = 0; // the layer's inputs and outputs, boundary layout
  /// Inference keeps nothing for a backward pass: the most bytes of values
  /// live at once in the layer's forward (each from the op that writes it
  /// to the last that reads it, the layer's inputs from its start and its
  /// outputs to its end), as the runtime places its temporaries.
  double peakLiveBytes = 0;
  /// The CUDA backend's kernel scratch (one buffer, its largest op's) per
  /// device: inference, training (the gradients' too).
  double scratchBytes[2] = {0, 0};
  double kvBytesPerToken = 0;   // per device per token of context
  /// A sliding-window layer's cache holds at most its window's tokens
  /// (0: every token of the context); a ring cache its fixed rows
  /// (bytes per device per sequence, beside kvBytesPerToken).
  int64_t kvWindow = 0;
  double kvRingBytes = 0;
  double alltoallBytes = 0;     // expert dispatch (= combine) bytes per device
  double dispatchedRows = 0;    // of alltoallBytes: the tokens' bytes (one copy each)
  int64_t expertTopK = 0;       // the experts a token goes to
  /// Group-limited routing: a token's experts from at most `topkGroups`
  /// of `numGroups` groups (1 and 1: any expert).
  int64_t numGroups = 1, topkGroups = 1;
  /// Per device, the bytes of the program's results the layer makes (but
  /// KV caches), as returned whole over tp: each ep rank's sequences,
  /// all-gathered over ep; of them, those holding the whole sequence
  /// (prefill's logits), each cp rank's positions, all-gathered over cp.
  double returnedBytes = 0, returnedSequenceBytes = 0;
  int returnedValues = 0, returnedSequenceValues = 0;
  /// Per device, the bytes of the values some positions are sliced from
  /// (a prefill's last), in the slice's layout over tp: under context
  /// parallelism each rank's positions, all-gathered over cp first.
  double slicedSequenceBytes = 0;
  int slicedSequenceValues = 0;
  /// The loss's layer: each rank's cross-entropy is a partial sum over the
  /// ranks holding its tokens (ep, cp) and, vocab-parallel, over tp, summed
  /// by one all-reduce of the scalar (Search::summedLoss).
  bool holdsLoss = false, lossOverTp = false;
  llvm::SmallVector<CollectiveUse> collectives; // forward
  double objective = 0;
};

/// `lastLayer`: the layer's outputs leave the model (no boundary layout).
LayerPlan solveLayer(const LayerGraph &layer, const TpContext &context,
                     bool lastLayer = false);

/// The same minimum by enumerating every combination of strategies (for
/// tests on small layers; exponential).
double solveLayerExhaustively(const LayerGraph &layer, const TpContext &context,
                              bool lastLayer = false);

} // namespace parax::plan

#endif // PARAX_PLAN_LAYERSOLVER_H
