//===- ModelGraph.h - the planner's view of a parax model -------*- C++ -*-===//
//
// analyzeModel reads a parax function and groups its ops by `parax.layer`
// into layer graphs: per op its class, FLOPs and weight bytes (from
// CostOpInterface), and the activation values it reads and writes. Identical
// layers share a signature, so the planner solves one representative per
// distinct layer kind.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_PLAN_MODELGRAPH_H
#define PARAX_PLAN_MODELGRAPH_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/SmallVector.h"

#include <string>
#include <vector>

namespace parax::plan {

enum class OpClass {
  Embedding,
  PositionEmbedding,
  Linear,
  HeadLinear,
  Norm,
  Rope,
  Attention,
  Unary,
  Swiglu,
  Add,
  Mul,
  Reshape,
  Transpose,
  Slice,
  Concat,
  CacheUpdate,
  Broadcast,
  Router,
  Experts,
  CrossEntropy,
  LabelCount, // the cross-entropy's counted labels (ignore_index)
  Shift,      // token ids or labels moved along the sequence (multi-token prediction)
};

/// An activation value inside a layer graph.
struct ValueNode {
  llvm::SmallVector<int64_t> shape;
  double bytesPerToken = 0; // at the IR's shape, divided by its token count
  // A KV cache input, or its join with the new keys/values (a cache view):
  // memory of the plan's KV-cache account, read by the attention's cache
  // read, so neither activation memory nor bytes an op moves; resharding it
  // still costs its bytes.
  bool inKvCache = false;
  // Dimension 1 holds some positions of the sequence, not all of them (a
  // slice: the last position that a prefill's logits need): never the
  // sequence split of sequence parallelism.
  bool someSequence = false;
  // A result of the program: returned whole (gathered over tp and cp),
  // but for a KV cache, which stays where it is.
  bool returned = false;
};

struct OpNode {
  OpClass kind;
  mlir::Operation *op = nullptr;     // in the representative layer
  llvm::SmallVector<int> inputs;     // activation value ids (weights excluded)
  llvm::SmallVector<int> results;    // value ids
  double flopsPerToken = 0;          // attention: projections only (see below)
  double weightBytes = 0;            // parameters read (whole, unsharded)
  double weightParams = 0;           // parameter elements
  double largestWeight = 0;          // the largest parameter's elements
  llvm::SmallVector<double, 2> weightTensors; // each parameter's elements
  double tiedParams = 0;             // of weightParams: a weight the first and last layer share
  // Attention: heads, KV heads, qk and v head dims, causal; the channels
  // a KV head's cache row holds (the keys', plus the values' unless they
  // are the keys' first channels: `value_dim` over v = k).
  int64_t heads = 0, kvHeads = 0, headDim = 0, valueDim = 0, cacheWidth = 0;
  bool causal = false;
  int64_t window = 0; // a sliding window: each query over its last `window` keys (0: none)
  /// Attention: the (query, key) pairs `queries` consecutive queries, the
  /// last at key `keys` - 1, see (all of them, the causal triangle, or
  /// under the window its last keys); what a flash-class kernel computes.
  double attentionPairs(double queries, double keys) const;
  // Linear: in/out features. Experts: E, F, k. Slice/concat: the dim.
  int64_t in = 0, out = 0;
  // Linear: the output head (its logits returned or read by the loss),
  // which a workload's gemm= dtype leaves in the model's, as DeepSeek-V3
  // keeps it (report §3.3.1).
  bool outputHead = false;
  int64_t numExperts = 0, ffn = 0, topK = 0;
  // Router: group-limited routing (a token's experts from at most
  // `topkGroups` of `numGroups` groups; 1 and 1: none).
  int64_t numGroups = 1, topkGroups = 1;
  int64_t dim = -1;
  llvm::SmallVector<int64_t> permutation;
  // A decode step's KV cache (an input) joined with the new tokens' keys or
  // values for an attention of at most 4 queries: the CUDA backend's decode
  // attention reads both parts in place, so the concat costs nothing (its
  // values are ValueNode::inKvCache). Likewise a generation step's
  // cache_update, which the runtimes do in place (a few rows written).
  bool cacheView = false;
  // A cache_update into a ring (a sliding-window layer's cache of its
  // window's last tokens, whatever the context).
  bool ring = false;
};

struct LayerGraph {
  int64_t index = 0; // parax.layer (-1 prologue, L epilogue)
  std::string signature;
  std::vector<OpNode> ops;
  llvm::SmallVector<ValueNode> values;
  llvm::SmallVector<int> inputs;  // values defined outside the layer
  llvm::SmallVector<int> outputs; // values used outside the layer
  double params = 0;     // parameter elements owned by this layer
  double paramBytes = 0;
  double expertParams = 0; // of which in routed experts
  bool hasAttention = false, hasExperts = false;
  int64_t kvHeads = 0, cacheWidth = 0; // the KV cache's heads and their channels
  /// With caches written by the program (parax.cache_update): the values a
  /// token adds to them (their heads x channels, summed), which count
  /// instead of what the attention reads (the absorbed MLA's latent read
  /// expanded per head by a prefill).
  int64_t cachedValues = 0;
};

struct ModelGraph {
  std::vector<LayerGraph> layers; // in order: prologue, 0 .. L-1, epilogue
  int64_t numDecoderLayers = 0;
  int64_t irBatch = 0, irSeq = 0; // shape of the token input
  int64_t cachedTokens = 0;       // a step over a KV cache (--past: its length,
                                  // --cache: its capacity)
  int64_t cacheCapacity = 0;      // a generation step's (--cache): the caches it
                                  // allocates, whatever the context (rings aside)
  bool ringCaches = false;        // some caches are sliding-window rings
  std::string cacheDtype;         // the KV caches' element type (empty: no caches)
  int64_t elementBytes = 2;       // parameter/activation element size
  std::string dtype = "bf16";
  double params = 0, paramBytes = 0;
  double activeParams = 0;        // per token (routed experts: k of E)
  double forwardFlopsPerToken = 0; // at the IR's sequence length
  int64_t hidden = 0;
  /// Elements of the weights both the first and the last layer read (a
  /// tied embedding and head): under PP each of the two stages holds them
  /// and adds the other's part of their gradient once a step.
  double tiedParams = 0;
  /// KV cache bytes per token of context at `kvBytes` per element.
  double kvCacheBytesPerToken(int64_t kvBytes) const;
};

/// Reads `function`; on malformed input (an op without a layer, an op with no
/// planner rule, no token input) emits an error at the op and fails.
mlir::FailureOr<ModelGraph> analyzeModel(mlir::func::FuncOp function);

} // namespace parax::plan

#endif // PARAX_PLAN_MODELGRAPH_H
