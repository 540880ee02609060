//===- LayerSolver.cpp - exact op shardings for one layer -----------------===//

#include "parax/Plan/LayerSolver.h"
#include "parax/Train/Recompute.h"

#include "llvm/ADT/DenseMap.h"
#include "llvm/ADT/StringMap.h"

#include <array>
#include <functional>
#include <limits>
#include <set>
#include <unordered_map>

using namespace parax::plan;
using llvm::SmallVector;

std::string parax::plan::layoutName(int8_t layout) {
  if (layout == kReplicated)
    return "R";
  if (layout == kPartial)
    return "P";
  return "S" + std::to_string(layout);
}

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

struct Strategy {
  std::string name;
  SmallVector<int8_t, 4> in;
  SmallVector<int8_t, 2> out;
  double computeFrac = 1; // share of the op's FLOPs on one device
  double weightFrac = 1;  // share of the op's weights on one device
  double kvFrac = 1;      // share of the op's KV cache on one device
  // Communication inside the op: kind and bytes per token.
  std::optional<std::pair<CollectiveKind, double>> internal;
};

class Solver {
public:
  Solver(const LayerGraph &layer, const TpContext &ctx, bool lastLayer)
      : layer(layer), ctx(ctx), t(ctx.tp), lastLayer(lastLayer) {}

  LayerPlan solve();
  double exhaustive();

private:
  const LayerGraph &layer;
  const TpContext &ctx;
  int64_t t;
  bool lastLayer;

  const ValueNode &value(int id) const { return layer.values[id]; }
  int rank(int id) const { return value(id).shape.size(); }
  double fullBytes(int id) const { return value(id).bytesPerToken * ctx.tokens(); }
  double share(int8_t layout) const {
    return layout >= 0 ? 1.0 / t : 1.0;
  }

  // Whether value `id` may be split over the group along `dim`. Dimension 0
  // is the batch (data parallelism's business, not tensor parallelism's);
  // dimension 1 of an activation is the sequence (sequence parallelism).
  bool splittable(int id, int dim) const {
    int r = rank(id);
    if (t <= 1 || dim < 0 || dim >= r)
      return false;
    if (r >= 2 && dim == 0)
      return false;
    if (r >= 2 && dim == 1)
      return ctx.sequenceSplits && !value(id).someSequence && static_cast<int64_t>(ctx.queryLen) % t == 0;
    return value(id).shape[dim] % t == 0;
  }

  int8_t boundaryLayout(int id) const {
    if (ctx.sequenceParallel && rank(id) >= 3 && splittable(id, 1))
      return 1;
    return kReplicated;
  }
  /// What an output of the layer, in layout `have`, closes to: a result
  /// of the program whole (the partitioner gathers or all-reduces it:
  /// prefill's logits), but a KV cache, which stays where it is, and a
  /// training step's (TpContext::train); else the next layer's boundary.
  int8_t closingLayout(int id, int8_t have) const {
    if (value(id).returned && !value(id).inKvCache && !ctx.train)
      return kReplicated;
    return lastLayer ? have : boundaryLayout(id);
  }

  double keptBytes(bool selective, llvm::ArrayRef<double> heldBytes, llvm::ArrayRef<double> opTimes,
                   double *recomputeTime = nullptr) const;
  /// Whether the profile's selective recomputation picks `op` to re-run
  /// (`gemms`: the layer's GEMMs before it, counted on, for AlternateGemms).
  bool pickedForRecompute(const OpNode &op, int &gemms) const;
  void passThrough(const OpNode &op, SmallVector<Strategy> &out,
                   llvm::function_ref<bool(int)> dimAllowed) const;
  SmallVector<Strategy> strategies(const OpNode &op) const;
  double opTime(const OpNode &op, const Strategy &s) const;
  /// What `op` computes under `s` (OpWork), `seconds` its forward time.
  OpWork workOf(const OpNode &op, const Strategy &s, double seconds) const;
  /// A GEMM (linear, head_linear, experts) but the output head: what the
  /// workload's gemm= dtype applies to.
  static bool isGemm(const OpNode &op);
  /// The bytes of `op`'s weights as it reads them (gemm=fp8: one an element).
  double weightBytes(const OpNode &op) const;
  /// The experts' (token, choice) pairs a rank routes and the width of
  /// the experts it holds: folded over the TP ranks, its sequence shard's
  /// pairs and whole experts; else every token's pairs and the strategy's
  /// share of an expert's width.
  double localExperts(const OpNode &op) const { return double(op.numExperts) / ctx.expertRanks(); }
  double expertPairs(const OpNode &op, const Strategy &s) const {
    return ctx.tokens() * op.topK * (ctx.foldExperts ? s.computeFrac : 1);
  }
  double expertWidth(const OpNode &op, const Strategy &s) const {
    return op.ffn * (ctx.foldExperts ? 1 : s.weightFrac);
  }
  /// The (token, choice) pairs a rank's experts compute (balanced routing).
  double rankPairs(const OpNode &op) const {
    return ctx.tokens() * op.topK * ctx.ep / op.numExperts * localExperts(op);
  }
  /// The bytes `op` reads and writes under `s` besides its weights (a
  /// value held in the KV cache left to the attention's own count).
  double ioBytes(const OpNode &op, const Strategy &s) const;
  /// A linear `op`'s GEMM under `s` at `peak`, its rows in `chunks` GEMMs
  /// (each reading the whole weight).
  double linearTime(const OpNode &op, const Strategy &s, double flops, double weights, double io, double peak,
                    double chunks) const;
  /// The k-overhead's scale for `op`'s GEMMs (gemmTime's kScale): a GEMM
  /// in the workload's gemm= dtype runs its k steps at that dtype's
  /// datasheet peak over the model's (a clock's work), its tiles' fixed
  /// time the same.
  double kScale(const OpNode &op) const { return isGemm(op) && ctx.gemmPeak > 0 ? ctx.gemmKScale : 1; }
  /// A linear `op`'s y [tokens, n] = x [tokens, k] W on one device under
  /// `s` ({n, k}): column-parallel splits n (out), row-parallel k (in).
  std::pair<double, double> linearDims(const OpNode &op, const Strategy &s) const {
    double n = op.out, k = op.in;
    if (s.name == "column")
      n /= ctx.tp;
    if (s.name == "row")
      k /= ctx.tp;
    return {n, k};
  }
  /// The bytes besides its weights a linear `op` under `s` reads and
  /// writes in its forward GEMM, its data gradient's and its weight
  /// gradient's: x and y (dx and dy) whole, but the operands a GEMM in fp8
  /// reads (gemm=fp8: the quantised copies). `io`: ioBytes(op, s).
  std::array<double, 3> linearIoBytes(const OpNode &op, const Strategy &s, double io) const;
  /// A linear `op`'s backward under `s`: its two GEMMs, each costed by
  /// its own shape (the data gradient dx = dy W^T, [tokens x out] x [out x
  /// in]; the weight's dW = x^T dy, [in x tokens] x [tokens x out]), the
  /// forward's FLOPs each.
  double linearBackwardTime(const OpNode &op, const Strategy &s) const;
  /// A linear `op` under `s` decomposed with a TP collective (its rows
  /// in tp chunks; `besideReduceScatter`: on the SMs the profile's
  /// tp_overlap_sms leave it).
  double decomposedGemmTime(const OpNode &op, const Strategy &s, bool besideReduceScatter) const;
  /// The experts' memory-bound passes on a rank, beside their GEMMs.
  double expertPassesTime(const OpNode &op, const Strategy &s) const;
  std::pair<double, double> scratchBytes(const OpNode &op, const Strategy &s) const;
  std::pair<double, std::optional<CollectiveKind>>
  reshard(int id, int8_t from, int8_t to) const;
  /// The layout value `v` (in layout `have`) is held in after `op` reads
  /// it under `s`: a copy gathered or all-reduced whole for it is kept for
  /// the value's later readers (the partitioner shares one resharded copy
  /// among them, and any other layout is sliced from it locally), so they
  /// pay no second collective; else `have`.
  static int8_t heldAfter(const OpNode &op, const Strategy &s, int v, int8_t have) {
    for (auto [k, in] : llvm::enumerate(op.inputs))
      if (in == v && s.in[k] == kReplicated && have != kDead)
        return kReplicated;
    return have;
  }
  /// The index of the last op reading each value (the op count for the
  /// layer's outputs; -1: none).
  SmallVector<int> lastUses() const {
    SmallVector<int> last(layer.values.size(), -1);
    for (auto [i, op] : llvm::enumerate(layer.ops))
      for (int in : op.inputs)
        last[in] = i;
    for (int out : layer.outputs)
      last[out] = layer.ops.size();
    return last;
  }
  /// The layout of a second copy of value `v` (in layout `have`) that `op`
  /// makes reading it under `s`: an all-to-all from one split to another
  /// leaves both (the partitioner keeps the value and shares the copy
  /// among its later readers), so a later reader may take either; none
  /// otherwise (-1).
  static int8_t copyAfter(const OpNode &op, const Strategy &s, int v, int8_t have) {
    for (auto [k, in] : llvm::enumerate(op.inputs))
      if (in == v && have >= 0 && s.in[k] >= 0 && s.in[k] != have)
        return s.in[k];
    return -1;
  }
  double attentionFlops(const OpNode &op) const;
  /// An embedding's table bytes (a rank's share) its lookup does not read:
  /// it reads the rows of its tokens, not the table.
  double unreadTableBytes(const OpNode &op, const Strategy &s) const {
    return std::max(0.0, (weightBytes(op) - fullBytes(op.results[0])) * s.weightFrac);
  }
  double collective(CollectiveKind kind, double bytes) const {
    if (kind == CollectiveKind::AllToAll)
      bytes /= t;
    return collectiveTime(*ctx.cluster, kind, bytes, ctx.group);
  }
  /// The linears reading value `id`, where only linears read it (0: some
  /// other op reads it too, or none; `head`: the output head counts as
  /// one, else as another op).
  int linearReadersOnly(int id, bool head) const {
    int linears = 0;
    for (const OpNode &op : layer.ops)
      if (is_contained(op.inputs, id)) {
        if (op.kind != OpClass::Linear || (op.outputHead && !head))
          return 0;
        ++linears;
      }
    return linears;
  }
  /// The bytes a `kind` collective moves of value `id` held in layout
  /// `from`: the whole value, or (gemm=fp8, the profile's tp_gather_fp8)
  /// its quantised bytes where it gathers a sequence-parallel shard (split
  /// along the sequence, dimension 1) that GEMMs alone read.
  double movedBytes(int id, CollectiveKind kind, int8_t from) const {
    bool quantised = kind == CollectiveKind::AllGather && from == 1 && rank(id) >= 3 && ctx.gemmBytes == 1 &&
                     ctx.cluster->profile.tpGatherFp8 && linearReadersOnly(id, /*head=*/false) > 0;
    return fullBytes(id) * (quantised ? ctx.gemmInputShare : 1);
  }
  // collective() over movedBytes of value `id`, memoised (the inner loop
  // of the dynamic program asks for the same few again and again; a
  // gather's bytes turn on the dimension it gathers along).
  double valueCollective(int id, CollectiveKind kind, int8_t from) const {
    size_t slot = id * 6 + (kind == CollectiveKind::AllGather && from == 1 ? 5 : static_cast<int>(kind));
    if (collectiveCache.size() <= slot)
      collectiveCache.resize(layer.values.size() * 6, -1);
    double &cached = collectiveCache[slot];
    if (cached < 0)
      cached = collective(kind, movedBytes(id, kind, from));
    return cached;
  }
  /// The dimension a reshard from `from` to `to` gathers or scatters along
  /// (-1: neither, or an all-to-all).
  static int8_t alongOf(CollectiveKind kind, int8_t from, int8_t to) {
    if (kind == CollectiveKind::AllGather)
      return from;
    if (kind == CollectiveKind::ReduceScatter)
      return to;
    return -1;
  }
  /// The copies sequence-parallel collectives along the sequence cost the
  /// profile's stack (sp_gather_copies), charged to the GEMMs beside them.
  void chargeSequenceCopies(LayerPlan &plan) const;
  mutable std::vector<double> collectiveCache;
};

// Whether the gradient of an op of this kind reads the op's activation
// inputs (lib/Train/Autodiff.cpp's rules). A rope, a sum, a view, a slice,
// a concat, a broadcast and a position embedding need dy alone.
static bool gradientReadsInputs(OpClass kind) {
  switch (kind) {
  case OpClass::Linear:       // x, for the weight's gradient
  case OpClass::HeadLinear:   // x
  case OpClass::Norm:         // x
  case OpClass::Attention:    // q, k and v (it recomputes the scores)
  case OpClass::Unary:        // x
  case OpClass::Swiglu:       // gate and up
  case OpClass::Mul:          // each the other's
  case OpClass::Router:       // x (the choice made again)
  case OpClass::Experts:      // x, the router's weights and choices
  case OpClass::CrossEntropy: // logits and labels
  case OpClass::Embedding:    // the token ids
    return true;
  default:
    return false;
  }
}

// The bytes of the layer's values a training step keeps from its forward
// pass to its backward (the values its gradient ops read, as the runtime
// keeps each temporary from its writer to its last reader), each once, in
// the layout its writer left it (`heldBytes`, by value id; the layer's
// inputs in the boundary layout). `selective`: what selective
// recomputation re-runs is not kept, the values it re-runs them from are;
// `recomputeTime` gets the time of the ops re-run (`opTimes`, by op).
bool Solver::pickedForRecompute(const OpNode &op, int &gemms) const {
  switch (ctx.cluster->profile.selectiveRecompute) {
  case SelectiveRecompute::Runtime:
    return parax::isSelectivelyRecomputed(op.op);
  case SelectiveRecompute::CoreAttention:
    return op.kind == OpClass::Attention;
  case SelectiveRecompute::None:
    return false;
  case SelectiveRecompute::AlternateGemms:
    if (op.kind == OpClass::Linear || op.kind == OpClass::HeadLinear)
      return ++gemms % 2 == 0;
    return op.kind != OpClass::Attention && op.kind != OpClass::CrossEntropy && op.kind != OpClass::Embedding &&
           op.kind != OpClass::Reshape && op.kind != OpClass::Slice && op.kind != OpClass::Transpose;
  }
  return false;
}

double Solver::keptBytes(bool selective, llvm::ArrayRef<double> heldBytes, llvm::ArrayRef<double> opTimes,
                         double *recomputeTime) const {
  const int n = layer.ops.size();
  SmallVector<int> writer(layer.values.size(), -1);
  SmallVector<bool> rerunnable(n, false), rerun(n, false);
  int gemms = 0; // the layer's GEMMs so far (AlternateGemms)
  for (int i = 0; i < n; ++i) {
    const OpNode &op = layer.ops[i];
    bool isView = op.kind == OpClass::Reshape || op.kind == OpClass::Slice || op.kind == OpClass::Transpose;
    bool chosen = pickedForRecompute(op, gemms);
    rerunnable[i] = selective && (chosen || (isView && !op.inputs.empty() &&
                                             writer[op.inputs[0]] >= 0 &&
                                             rerunnable[writer[op.inputs[0]]]));
    for (int res : op.results)
      writer[res] = i;
  }
  // Last op first: a value is needed if a gradient reads it, or an op
  // re-run (or a view of it) needs it; needed whole unless only GEMMs'
  // gradients read it (kept in their dtype, ctx.gemmInputShare).
  SmallVector<bool> needed(layer.values.size(), false);
  SmallVector<bool> neededWhole(layer.values.size(), false);
  for (int i = n - 1; i >= 0; --i) {
    const OpNode &op = layer.ops[i];
    bool resultNeeded = llvm::any_of(op.results, [&](int res) { return needed[res]; });
    bool resultWhole =
        llvm::any_of(op.results, [&](int res) { return neededWhole[res]; });
    rerun[i] = rerunnable[i] && resultNeeded;
    bool aliased = op.kind == OpClass::Reshape || op.cacheView;
    bool reads = gradientReadsInputs(op.kind);
    if (!rerun[i] && !(aliased && resultNeeded) && !reads)
      continue;
    for (auto [k, in] : llvm::enumerate(op.inputs)) {
      needed[in] = true;
      bool whole = rerun[i] || (reads && !(isGemm(op) && k == 0)) ||
                   (aliased && resultWhole);
      neededWhole[in] = neededWhole[in] || whole;
    }
  }
  double bytes = 0;
  for (auto [id, isNeeded] : llvm::enumerate(needed))
    if (isNeeded && (writer[id] < 0 || !rerun[writer[id]]))
      bytes += heldBytes[id] * (neededWhole[id] ? 1 : ctx.gemmInputShare);
  if (recomputeTime)
    for (int i = 0; i < n; ++i)
      if (rerun[i])
        *recomputeTime += opTimes[i];
  return bytes;
}

void Solver::passThrough(const OpNode &op, SmallVector<Strategy> &out,
                         llvm::function_ref<bool(int)> dimAllowed) const {
  Strategy replicated{"replicated"};
  replicated.in.assign(op.inputs.size(), kReplicated);
  replicated.out.assign(op.results.size(), kReplicated);
  out.push_back(replicated);
  if (op.results.empty())
    return;
  int r = rank(op.results[0]);
  for (int d = 0; d < r; ++d) {
    if (!dimAllowed(d) || !splittable(op.results[0], d))
      continue;
    if (!llvm::all_of(op.inputs, [&](int in) {
          return rank(in) == r && splittable(in, d);
        }))
      continue;
    Strategy s{"split" + std::to_string(d)};
    s.in.assign(op.inputs.size(), d);
    s.out.assign(op.results.size(), d);
    s.computeFrac = 1.0 / t;
    out.push_back(s);
  }
}

SmallVector<Strategy> Solver::strategies(const OpNode &op) const {
  SmallVector<Strategy> list;
  auto all = [](int) { return true; };
  auto addPartial = [&]() {
    Strategy s{"partial"};
    s.in.assign(op.inputs.size(), kPartial);
    s.out.assign(op.results.size(), kPartial);
    s.computeFrac = 1;
    list.push_back(s);
  };
  switch (op.kind) {
  case OpClass::Linear: {
    int x = op.inputs[0];
    int last = rank(x) - 1;
    list.push_back(Strategy{"replicated", {kReplicated}, {kReplicated}});
    if (op.out % t == 0 && t > 1) {
      Strategy col{"column", {kReplicated}, {static_cast<int8_t>(last)}};
      col.computeFrac = col.weightFrac = 1.0 / t;
      list.push_back(col);
    }
    if (op.in % t == 0 && t > 1) {
      Strategy row{"row", {static_cast<int8_t>(last)}, {kPartial}};
      row.computeFrac = row.weightFrac = 1.0 / t;
      list.push_back(row);
    }
    break;
  }
  case OpClass::HeadLinear: {
    // The heads split with their weights (x [..., G, in] -> [..., G, out]).
    int heads = rank(op.inputs[0]) - 2;
    list.push_back(Strategy{"replicated", {kReplicated}, {kReplicated}});
    if (t > 1 && splittable(op.inputs[0], heads) &&
        splittable(op.results[0], heads)) {
      Strategy s{
          "heads", {static_cast<int8_t>(heads)}, {static_cast<int8_t>(heads)}};
      s.computeFrac = s.weightFrac = 1.0 / t;
      list.push_back(s);
    }
    break;
  }
  case OpClass::Embedding: {
    // Replicated only when no split applies: a lookup reads a few rows
    // whatever the layout, so time alone would always replicate the
    // table, tp times its memory (weights, gradients, optimizer state)
    // for one collective saved; the stacks split it (Megatron's and
    // vLLM's VocabParallelEmbedding).
    size_t first = list.size();
    const ValueNode &result = value(op.results[0]);
    int64_t vocab = op.weightParams / result.shape.back();
    if (t > 1 && vocab % t == 0) {
      Strategy s{"vocab", {kReplicated}, {kPartial}};
      s.weightFrac = 1.0 / t;
      list.push_back(s);
    }
    if (splittable(op.results[0], rank(op.results[0]) - 1)) {
      Strategy s{"hidden", {kReplicated},
                 {static_cast<int8_t>(rank(op.results[0]) - 1)}};
      s.weightFrac = 1.0 / t;
      list.push_back(s);
    }
    if (list.size() == first)
      list.push_back(Strategy{"replicated", {kReplicated}, {kReplicated}});
    break;
  }
  case OpClass::PositionEmbedding: {
    list.push_back(Strategy{"replicated", {}, {kReplicated}});
    for (int d : {2}) // hidden only: sequence splits need per-rank offsets
      if (splittable(op.results[0], d)) {
        Strategy s{"split" + std::to_string(d), {}, {static_cast<int8_t>(d)}};
        s.weightFrac = 1.0 / t;
        list.push_back(s);
      }
    break;
  }
  case OpClass::Attention: {
    list.push_back(Strategy{"replicated", {kReplicated, kReplicated, kReplicated},
                            {kReplicated}});
    if (t > 1 && op.heads % t == 0) {
      if (op.kvHeads % t == 0) {
        Strategy s{"heads", {2, 2, 2}, {2}};
        s.computeFrac = s.kvFrac = 1.0 / t;
        list.push_back(s);
      } else {
        // Fewer KV heads than ranks: each rank keeps all KV heads (Megatron
        // replicates them).
        Strategy s{"heads-kv-replicated", {2, kReplicated, kReplicated}, {2}};
        s.computeFrac = 1.0 / t;
        list.push_back(s);
      }
    }
    break;
  }
  case OpClass::Norm:
    passThrough(op, list, [&](int d) { return d != rank(op.results[0]) - 1; });
    break;
  case OpClass::Rope:
    // Whole rotary pairs, and whole sequences (positions would need per-rank
    // offsets, which the partitioner does not emit).
    passThrough(op, list, [](int d) { return d != 1 && d != 3; });
    addPartial();
    break;
  case OpClass::Unary:
  case OpClass::Swiglu:
    passThrough(op, list, all);
    break;
  case OpClass::Add:
  case OpClass::Broadcast:
    passThrough(op, list, all);
    addPartial();
    break;
  case OpClass::Mul: {
    passThrough(op, list, all);
    // Linear in each operand: partial times replicated is partial.
    for (int p = 0; p < 2; ++p) {
      Strategy s{"partial" + std::to_string(p)};
      s.in = {kReplicated, kReplicated};
      s.in[p] = kPartial;
      s.out = {kPartial};
      list.push_back(s);
    }
    break;
  }
  case OpClass::Slice:
  case OpClass::Concat:
    passThrough(op, list, [&](int d) { return d != op.dim; });
    addPartial();
    break;
  case OpClass::CacheUpdate:
    // Written at a run-time position: whole sequences, and never a partial
    // sum (the cache outlives the step).
    passThrough(op, list, [&](int d) { return d != op.dim; });
    break;
  case OpClass::Reshape: {
    list.push_back(Strategy{"replicated", {kReplicated}, {kReplicated}});
    addPartial();
    const auto &a = value(op.inputs[0]).shape, &b = value(op.results[0]).shape;
    for (size_t d = 0; d < a.size(); ++d) {
      if (!splittable(op.inputs[0], d))
        continue;
      int64_t prefix = 1;
      for (size_t i = 0; i < d; ++i)
        prefix *= a[i];
      int64_t prefixB = 1;
      for (size_t e = 0; e < b.size(); prefixB *= b[e], ++e)
        if (prefixB == prefix && splittable(op.results[0], e)) {
          Strategy s{"split" + std::to_string(d)};
          s.in = {static_cast<int8_t>(d)};
          s.out = {static_cast<int8_t>(e)};
          list.push_back(s);
          break;
        }
    }
    break;
  }
  case OpClass::Transpose: {
    list.push_back(Strategy{"replicated", {kReplicated}, {kReplicated}});
    addPartial();
    for (size_t e = 0; e < op.permutation.size(); ++e) {
      int d = op.permutation[e];
      if (splittable(op.inputs[0], d) && splittable(op.results[0], e)) {
        Strategy s{"split" + std::to_string(d)};
        s.in = {static_cast<int8_t>(d)};
        s.out = {static_cast<int8_t>(e)};
        s.computeFrac = 1.0 / t;
        list.push_back(s);
      }
    }
    break;
  }
  case OpClass::Router: {
    // The router stays replicated (its gate is small, and its integer
    // choices are not communicated).
    list.push_back(Strategy{"replicated", {kReplicated}, {kReplicated, kReplicated}});
    // Folded experts: each rank routes its own sequence shard.
    if (ctx.foldExperts && t > 1 && splittable(op.inputs[0], 1) &&
        llvm::all_of(op.results, [&](int r) { return splittable(r, 1); })) {
      Strategy s{"sequence", {1}, {1, 1}};
      s.computeFrac = 1.0 / t;
      list.push_back(s);
    }
    break;
  }
  case OpClass::Experts: {
    if (ctx.foldExperts) {
      // Folded over the TP ranks (Megatron's expert_tensor_parallel_size
      // = 1): a rank's sequence shard dispatched to the ep x tp expert
      // ranks, each expert whole on one of them; nothing else.
      if (t > 1 && llvm::all_of(op.inputs, [&](int v) { return splittable(v, 1); }) &&
          splittable(op.results[0], 1)) {
        Strategy s{"folded", {1, 1, 1}, {1}};
        s.computeFrac = s.weightFrac = 1.0 / t;
        list.push_back(s);
      }
      break;
    }
    list.push_back(Strategy{"replicated", {kReplicated, kReplicated, kReplicated},
                            {kReplicated}});
    if (t > 1 && op.ffn % t == 0) {
      // Every expert's FFN split like a Megatron MLP: partial sums.
      Strategy s{"ffn", {kReplicated, kReplicated, kReplicated}, {kPartial}};
      s.computeFrac = s.weightFrac = 1.0 / t;
      list.push_back(s);
    }
    break;
  }
  case OpClass::LabelCount: // whole labels, a whole count (a scalar)
  case OpClass::Shift:      // ids as they are (rows within themselves)
    list.push_back(Strategy{"replicated", {kReplicated}, {kReplicated}});
    break;
  case OpClass::CrossEntropy: {
    list.push_back(Strategy{"replicated", {kReplicated, kReplicated}, {kReplicated}});
    int logits = op.inputs[0];
    int last = rank(logits) - 1;
    if (splittable(logits, last)) {
      // Vocab-parallel (as the partitioner does it): every rank's
      // logsumexp of its columns all-gathered, 4 bytes a rank a token (the
      // gradient reads the same).
      Strategy s{"vocab", {static_cast<int8_t>(last), kReplicated}, {kReplicated}};
      s.computeFrac = 1.0 / t;
      s.internal = std::make_pair(CollectiveKind::AllGather, 4.0 * t);
      list.push_back(s);
    }
    break;
  }
  }
  return list;
}

double Solver::attentionFlops(const OpNode &op) const {
  // The pairs of the whole sequence's queries, this rank's share of them.
  double q = ctx.queryLen * ctx.queryPieces, c = ctx.contextLen;
  double pairs = op.attentionPairs(q, c) / ctx.queryPieces;
  return ctx.sequences * op.heads * pairs *
         (2.0 * op.headDim + 5 + 2.0 * op.valueDim);
}

bool Solver::isGemm(const OpNode &op) {
  return (op.kind == OpClass::Linear && !op.outputHead) ||
         op.kind == OpClass::HeadLinear || op.kind == OpClass::Experts;
}

// TransformerEngine's userbuffers (and PyTorch's AsyncTP) run a GEMM
// decomposed with its all-gather or reduce-scatter as tp GEMMs, one a
// peer's chunk of the rows, each a kernel (TE's ring exchange: num_splits
// = tp; its "pipeline" reduce-scatter in tp_overlap_splits, 4), and a
// reduce-scatter's GEMMs with tp_overlap_sms of the SMs left to the
// communication (set_sm_margin).
double Solver::decomposedGemmTime(const OpNode &op, const Strategy &s, bool besideReduceScatter) const {
  const Profile &profile = ctx.cluster->profile;
  double rows = ctx.tokens(); // (a column or row split divides n or k, not the rows)
  double chunks = besideReduceScatter && profile.tpOverlapSplits > 0 ? profile.tpOverlapSplits : ctx.tp;
  chunks = std::max(1.0, std::min(chunks, std::floor(rows))); // (a chunk at least a row)
  double peak = ctx.gemmPeak > 0 ? ctx.gemmPeak : ctx.peak;
  int sms = ctx.cluster->smCount();
  if (besideReduceScatter && profile.tpOverlapSms > 0)
    peak *= std::max(1, sms - profile.tpOverlapSms) / double(sms);
  return linearTime(op, s, op.flopsPerToken * rows * s.computeFrac, weightBytes(op) * s.weightFrac,
                    linearIoBytes(op, s, ioBytes(op, s))[0], peak, chunks);
}

double Solver::linearTime(const OpNode &op, const Strategy &s, double flops, double weights, double io,
                          double peak, double chunks) const {
  auto [n, k] = linearDims(op, s);
  return chunks * gemmTime(*ctx.cluster, flops / chunks, weights + io / chunks, peak, ctx.tokens() / chunks, n, k, 1,
                           kScale(op));
}

std::array<double, 3> Solver::linearIoBytes(const OpNode &op, const Strategy &s, double io) const {
  double x = fullBytes(op.inputs[0]) * share(s.in[0]), y = fullBytes(op.results[0]) * share(s.out[0]);
  double rest = io - x - y;
  double q = isGemm(op) && ctx.gemmBytes == 1 ? ctx.gemmInputShare : 1;
  return {x * q + y + rest, y * q + x + rest, (x + y) * q + rest};
}

double Solver::linearBackwardTime(const OpNode &op, const Strategy &s) const {
  auto [n, k] = linearDims(op, s);
  double m = ctx.tokens();
  double flops = op.flopsPerToken * m * s.computeFrac;
  double weights = weightBytes(op) * s.weightFrac;
  auto io = linearIoBytes(op, s, ioBytes(op, s));
  double peak = isGemm(op) && ctx.gemmPeak > 0 ? ctx.gemmPeak : ctx.peak;
  return gemmTime(*ctx.cluster, flops, weights + io[1], peak, m, k, n, 1, kScale(op)) +
         gemmTime(*ctx.cluster, flops, weights + io[2], peak, k, n, m, 1, kScale(op));
}

double Solver::ioBytes(const OpNode &op, const Strategy &s) const {
  double bytes = 0;
  for (auto [i, id] : llvm::enumerate(op.inputs))
    if (!value(id).inKvCache) // the attention's cache read apart
      bytes += fullBytes(id) * share(s.in[i]);
  for (auto [i, id] : llvm::enumerate(op.results))
    bytes += fullBytes(id) * share(s.out[i]);
  return bytes;
}

// A grouped MLP's three memory-bound kernels between and around its GEMMs
// (Megatron-Core's permute, bias-SwiGLU and unpermute; parax's runtime's
// row gather, swiglu and scatter): the rank's (token, choice) rows read
// and written into expert order and back (4 hidden rows a pair), the
// gated pair read and the activation written (3 expert widths a pair), at
// the plain memory-bound ops' passes.
double Solver::expertPassesTime(const OpNode &op, const Strategy &s) const {
  const ClusterSpec &cluster = *ctx.cluster;
  const ValueNode &x = value(op.inputs[0]);
  double pairs = rankPairs(op);
  double element = x.bytesPerToken / x.shape.back();
  double bytes = pairs * (4 * x.bytesPerToken + 3 * expertWidth(op, s) * element);
  return bytes * cluster.profile.addPasses / (cluster.memoryBandwidth() * cluster.memoryEfficiency) +
         3 * cluster.profile.kernelOverhead;
}

double Solver::weightBytes(const OpNode &op) const {
  return isGemm(op) && ctx.gemmBytes > 0 ? op.weightParams * ctx.gemmBytes
                                         : op.weightBytes;
}

double Solver::opTime(const OpNode &op, const Strategy &s) const {
  if (op.kind == OpClass::Reshape || op.cacheView)
    return 0; // a view
  const ClusterSpec &cluster = *ctx.cluster;
  const Profile &profile = cluster.profile;
  double tokens = ctx.tokens();
  double flops = op.kind == OpClass::Attention ? attentionFlops(op)
                                               : op.flopsPerToken * tokens;
  flops *= s.computeFrac;
  double weights = weightBytes(op) * s.weightFrac;
  if (op.kind == OpClass::Experts) {
    // (the experts some pair chose, of the rank's)
    double touched = std::min(localExperts(op), expertPairs(op, s));
    weights = weightBytes(op) * (expertWidth(op, s) / op.ffn) * touched / op.numExperts;
  }
  if (op.kind == OpClass::Embedding)
    weights -= unreadTableBytes(op, s);
  double bytes = weights + ioBytes(op, s);
  if (op.kind == OpClass::Attention && ctx.decode) // (the window's rows of the cache)
    bytes += ctx.sequences *
             (op.window > 0 ? std::min<double>(ctx.contextLen, op.window) : ctx.contextLen) *
             op.kvHeads * op.cacheWidth * ctx.kvBytes * s.kvFrac;
  double peak = isGemm(op) && ctx.gemmPeak > 0 ? ctx.gemmPeak : ctx.peak;
  switch (op.kind) {
  case OpClass::Linear:
    return linearTime(op, s, flops, weights, linearIoBytes(op, s, bytes - weights)[0], peak, 1);
  case OpClass::HeadLinear: {
    // G heads, each [tokens, in] x [in, out]: G GEMMs side by side.
    const auto &in = value(op.inputs[0]).shape, &out = value(op.results[0]).shape;
    double heads = in.size() >= 2 ? double(in[in.size() - 2]) : 1;
    if (s.name == "heads")
      heads /= t;
    return gemmTime(cluster, flops, bytes, peak, tokens, out.back(), in.back(), heads, kScale(op));
  }
  case OpClass::Experts: {
    // A rank's E / ep experts, each on its share of the (token, choice)
    // pairs (balanced routing, then the profile's expert_imbalance on an
    // EP rank): gate/up [rows, H] x [H, F], down back.
    // (folded: a rank's tokens / tp over ep x tp ranks, as many rows an
    // expert; each expert whole)
    double local = localExperts(op);
    double rows = tokens * op.topK * ctx.ep / op.numExperts;
    double hidden = value(op.inputs[0]).shape.back();
    double width = expertWidth(op, s);
    // One grouped kernel: the local experts' GEMMs fill the device
    // together. A GEMM an expert (expert_gemm_streams): as many at once as
    // the stack's streams, and each of the 2 a local expert (the gated
    // up-projection, the down-projection) a kernel of its own.
    int64_t streams = profile.expertGemmStreams;
    double together = streams > 0 ? std::min<double>(local, streams) : local;
    double launches = streams > 0 ? (2 * local - 1) * profile.kernelOverhead : 0;
    // (the busiest expert rank's work: the combine waits for it)
    double busiest = ctx.expertRanks() > 1 ? profile.expertImbalance : 1;
    return busiest * (gemmTime(cluster, flops / profile.expertsEfficiency, bytes, peak, rows, width, hidden,
                               together, kScale(op)) +
                      expertPassesTime(op, s)) +
           launches;
  }
  case OpClass::Attention: {
    if (profile.attention == AttentionKernel::Flash) {
      // (its fixed cost a query: flash_key_overhead keys more than the T
      // a query sees on average)
      double queries = ctx.queryLen * ctx.queryPieces;
      double keys = queries > 0 ? op.attentionPairs(queries, ctx.contextLen) / queries : 0;
      double share = keys > 0 ? keys / (keys + profile.flashKeyOverhead) : 1;
      return rooflineTime(cluster, flops, bytes, peak * profile.flashEfficiency * share);
    }
    // Materialised: Q K^T and P V as batched GEMMs over every (query, key)
    // pair whatever the mask, and the score matrix through HBM in between
    // (softmax, dropout): four kernels.
    double q = ctx.queryLen, c = ctx.contextLen;
    double heads = ctx.sequences * op.heads * s.computeFrac;
    double scores = heads * q * c;
    double qk = gemmTime(cluster, 2 * scores * op.headDim, 0, peak, q, c, op.headDim, heads);
    double pv = gemmTime(cluster, 2 * scores * op.valueDim, 0, peak, q, op.valueDim, c, heads);
    double memory = (bytes + scores * profile.scoreBytes) /
                    (cluster.memoryBandwidth() * cluster.memoryEfficiency);
    return qk + pv + memory + 2 * profile.kernelOverhead;
  }
  case OpClass::Norm:
    bytes *= profile.normPasses;
    break;
  case OpClass::Rope:
    bytes *= profile.ropePasses;
    break;
  case OpClass::Swiglu:
    bytes *= profile.swigluPasses;
    break;
  case OpClass::Unary:
    bytes *= profile.unaryPasses;
    break;
  case OpClass::Add:
  case OpClass::Mul:
    bytes *= profile.addPasses;
    break;
  case OpClass::CrossEntropy:
    bytes *= profile.crossEntropyPasses;
    break;
  default:
    break;
  }
  return rooflineTime(cluster, flops, bytes, peak);
}

OpWork Solver::workOf(const OpNode &op, const Strategy &s, double seconds) const {
  OpWork w;
  double tokens = ctx.tokens();
  switch (op.kind) {
  case OpClass::Linear: {
    auto [n, k] = linearDims(op, s);
    w = {1, tokens, n, k};
    w.flops = op.flopsPerToken * tokens * s.computeFrac;
    break;
  }
  case OpClass::HeadLinear: {
    const auto &in = value(op.inputs[0]).shape, &out = value(op.results[0]).shape;
    double heads = in.size() >= 2 ? double(in[in.size() - 2]) : 1;
    w = {s.name == "heads" ? heads / t : heads, tokens, double(out.back()), double(in.back())};
    w.flops = op.flopsPerToken * tokens * s.computeFrac;
    break;
  }
  case OpClass::Experts:
    w = {localExperts(op), tokens * op.topK * ctx.ep / op.numExperts, expertWidth(op, s),
         double(value(op.inputs[0]).shape.back())};
    w.flops = op.flopsPerToken * tokens * s.computeFrac;
    break;
  case OpClass::Attention:
    w = {ctx.sequences * op.heads * s.computeFrac, ctx.queryLen, ctx.contextLen, double(op.headDim)};
    w.flops = attentionFlops(op) * s.computeFrac;
    break;
  default:
    return w;
  }
  w.seconds = seconds;
  w.gemmDtype = isGemm(op) && ctx.gemmPeak > 0;
  return w;
}

// The CUDA backend's kernel scratch for `op` under `s` on one device, in
// bytes: {its forward, its gradient's} (CudaExecutor.cu's ensureScratch
// calls, the ops whose scratch grows with the model: a stage holds one
// buffer, as large as its largest op's).
std::pair<double, double> Solver::scratchBytes(const OpNode &op, const Strategy &s) const {
  const double tokens = ctx.tokens(), f = 4; // fp32 scratch
  switch (op.kind) {
  case OpClass::Experts: {
    // A rank's experts see the dispatch's rows (every token of the EP group
    // could choose them, or the expert capacity): pairs of (row, choice).
    // Counts and permutations (ints), the rows, gate/up products (fp32), bf16
    // copies for the GEMMs; the gradient also dy's rows and one expert's stack
    // gradient [F, H].
    double E = localExperts(op), pairs = expertPairs(op, s) * ctx.dispatchedFactor();
    double H = value(op.inputs[0]).shape.back(), F = expertWidth(op, s), widest = std::max(H, F);
    double ints = 3 * E + 2 * pairs;
    return {f * (ints + pairs * (2 * H + 2 * F)) + 2 * pairs * widest,
            f * (ints + 2 * pairs * H + 3 * pairs * F + F * H) + 2 * pairs * widest};
  }
  case OpClass::Attention: {
    // The gradient: each query's log-sum-exp and D; with grouped KV heads,
    // each query head's dK and dV in fp32 (summed per KV head after).
    double heads = op.heads * s.computeFrac, B = ctx.sequences, S = ctx.queryLen, T = ctx.contextLen;
    double partials = op.heads != op.kvHeads ? B * T * heads * (op.headDim + op.valueDim) : 0;
    return {0, f * (2 * B * S * heads + partials)};
  }
  case OpClass::Embedding:
    // The gradient: the rank's rows of the table summed in fp32.
    return {0, f * op.weightParams * s.weightFrac};
  case OpClass::Router: {
    // Logits, scores and choices [tokens, E] each; bf16 activations.
    double H = value(op.inputs[0]).shape.back(), scratch = f * 3 * tokens * op.numExperts + 2 * tokens * H;
    return {scratch, scratch};
  }
  default:
    return {0, 0};
  }
}

std::pair<double, std::optional<CollectiveKind>>
Solver::reshard(int id, int8_t from, int8_t to) const {
  if (from == to || to == kDead)
    return {0, std::nullopt};
  // Slicing or zero-filling is local. (Its copy is not costed: a cost
  // here makes a KV cache's layout turn on it, and a generation's prefill
  // and step programs, planned apart, must keep their caches alike.)
  if (from == kReplicated)
    return {0, std::nullopt};
  std::optional<CollectiveKind> kind;
  if (to == kReplicated)
    kind = from == kPartial ? CollectiveKind::AllReduce : CollectiveKind::AllGather;
  else if (to == kPartial)
    kind = CollectiveKind::AllGather;
  else
    kind = from == kPartial ? CollectiveKind::ReduceScatter : CollectiveKind::AllToAll;
  // (a stack without it has no such move: no plan takes it)
  if (kind == CollectiveKind::AllToAll && !ctx.cluster->profile.tpAllToAll)
    return {kInf, kind};
  return {valueCollective(id, *kind, from), kind};
}

// torchtitan's sequence parallelism (DTensor's Shard(1) on [batch,
// sequence, hidden]) gathers and scatters along the sequence, which
// PyTorch's functional collectives do along dimension 0 and a torch.cat of
// the pieces (torchtitan PR #437: "an extra aten.cat after each
// collective"). The cat is a kernel of its own where a GEMM reads the
// gathered value or writes the one scattered (an extern kernel the
// compiler fuses nothing into); an elementwise producer takes it in (the
// sum of several GEMMs' data gradients, written in the scattered order).
// AsyncTP's fused kernels (tp_overlap_gemms) read and write the pieces in
// place.
void Solver::chargeSequenceCopies(LayerPlan &plan) const {
  const Profile &profile = ctx.cluster->profile;
  if (!profile.spGatherCopies || t <= 1)
    return;
  double bandwidth = ctx.cluster->memoryBandwidth() * ctx.cluster->memoryEfficiency;
  const int n = layer.ops.size();
  for (const CollectiveUse &c : plan.collectives) {
    if (c.value < 0 || c.along <= 0 ||
        (c.kind != CollectiveKind::AllGather && c.kind != CollectiveKind::ReduceScatter))
      continue;
    bool gather = c.kind == CollectiveKind::AllGather;
    // The GEMM beside it: the one reading the gathered value (the first
    // of its readers), or the one writing the value scattered.
    int gemm = -1;
    for (int j = 0; j < n && gemm < 0; ++j) {
      const OpNode &op = layer.ops[j];
      if (op.kind == OpClass::Linear && is_contained(gather ? op.inputs : op.results, c.value))
        gemm = j;
    }
    if (gemm < 0)
      continue;
    // A read and a write of the whole value as it moved (fp8 where
    // gathered in fp8).
    double copy = 2 * c.bytes / bandwidth;
    bool fused = profile.tpOverlapGemms && !layer.ops[gemm].outputHead;
    double forward = fused ? 0 : copy;
    // The backward's conjugate: a gather's is the reduce-scatter of the
    // input's gradient, a GEMM's data gradient alone where one GEMM reads
    // it (several: their sum, elementwise, writes the pieces); a
    // reduce-scatter's is the gather of the output's gradient, which the
    // GEMMs' gradients read (quantised before the gather where the stack
    // gathers in fp8: torchao's NoopFwToFloat8BwDynamic).
    double backward = gather ? (linearReadersOnly(c.value, /*head=*/true) == 1 ? fullBytes(c.value) : 0)
                             : fullBytes(c.value) * (ctx.gemmBytes == 1 && profile.tpGatherFp8 ? ctx.gemmInputShare : 1);
    backward = fused && profile.tpOverlapBackward ? 0 : 2 * backward / bandwidth;
    plan.opTimes[gemm] += forward;
    plan.computeTime += forward;
    // (the backward is costed at twice the forward)
    plan.backwardExtraTime += backward - 2 * forward;
  }
}

// Every combination of strategies, costed exactly as solve() costs them.
double Solver::exhaustive() {
  const int n = layer.ops.size();
  SmallVector<SmallVector<Strategy>> options(n);
  for (int i = 0; i < n; ++i)
    options[i] = strategies(layer.ops[i]);
  SmallVector<int8_t> layout(layer.values.size(), kDead);
  for (int in : layer.inputs)
    layout[in] = boundaryLayout(in);
  SmallVector<int> lastUse = lastUses();
  double best = kInf;
  std::function<void(int, double)> visit = [&](int i, double cost) {
    if (i == n) {
      for (int out : layer.outputs)
        cost += ctx.commWeight * reshard(out, layout[out], closingLayout(out, layout[out])).first;
      best = std::min(best, cost);
      return;
    }
    const OpNode &op = layer.ops[i];
    for (const Strategy &s : options[i]) {
      double c = cost + ctx.computeWeight * opTime(op, s);
      for (auto [k, in] : llvm::enumerate(op.inputs))
        c += ctx.commWeight * reshard(in, layout[in], s.in[k]).first;
      if (s.internal)
        c += ctx.commWeight *
             collective(s.internal->first, s.internal->second * ctx.tokens());
      SmallVector<int8_t> saved(layout.begin(), layout.end());
      SmallVector<std::pair<int, int8_t>> copies;
      for (int in : op.inputs)
        if (int8_t copy = copyAfter(op, s, in, layout[in]); copy >= 0 && lastUse[in] > i)
          copies.push_back({in, copy});
      for (int in : op.inputs)
        layout[in] = heldAfter(op, s, in, layout[in]);
      for (auto [k, res] : llvm::enumerate(op.results))
        layout[res] = s.out[k];
      visit(i + 1, c);
      // ... or later readers take one input's copy.
      for (auto [in, copy] : copies) {
        int8_t held = layout[in];
        layout[in] = copy;
        visit(i + 1, c);
        layout[in] = held;
      }
      layout = saved;
    }
  };
  visit(0, 0);
  return best;
}

LayerPlan Solver::solve() {
  const int n = layer.ops.size();
  const int numValues = layer.values.size();
  SmallVector<int> lastUse = lastUses();

  SmallVector<SmallVector<Strategy>> options(n);
  for (int i = 0; i < n; ++i) {
    options[i] = strategies(layer.ops[i]);
    for (const auto &[index, name] : ctx.forced)
      if (index == i)
        llvm::erase_if(options[i], [&](const Strategy &s) { return s.name != name; });
  }

  struct Entry {
    double cost;
    int parent;
    int choice;
  };
  // A state holds one layout byte per value live between two ops (in id
  // order): small strings, cheap to hash.
  using State = std::string;
  SmallVector<int> definedAt(numValues, -1); // layer inputs: before op 0
  for (auto [i, op] : llvm::enumerate(layer.ops))
    for (int res : op.results)
      definedAt[res] = i;
  std::vector<SmallVector<int>> live(n + 1);
  std::vector<SmallVector<int>> position(n + 1, SmallVector<int>(numValues, -1));
  for (int i = 0; i <= n; ++i)
    for (int v = 0; v < numValues; ++v)
      if (definedAt[v] < i && lastUse[v] >= i) {
        position[i][v] = live[i].size();
        live[i].push_back(v);
      }
  auto layoutAt = [&](int i, const State &state, int v) -> int8_t {
    int p = position[i][v];
    return p < 0 ? static_cast<int8_t>(kDead) : static_cast<int8_t>(state[p]);
  };

  // Each state once, as a key of index[i] (whose nodes do not move);
  // states[i] points at the keys, in the order they were reached.
  std::vector<std::unordered_map<State, int>> index(n + 1);
  std::vector<std::vector<std::pair<const State *, Entry>>> states(n + 1);
  State start(live[0].size(), static_cast<char>(kDead));
  for (int in : layer.inputs)
    if (position[0][in] >= 0)
      start[position[0][in]] = boundaryLayout(in);
  states[0].push_back({&index[0].try_emplace(start, 0).first->first, {0, -1, -1}});

  State next; // (one buffer, reused)
  for (int i = 0; i < n; ++i) {
    const OpNode &op = layer.ops[i];
    SmallVector<double> opCost;
    for (const Strategy &s : options[i]) {
      double cost = ctx.computeWeight * opTime(op, s);
      if (s.internal)
        cost += ctx.commWeight *
                collective(s.internal->first, s.internal->second * ctx.tokens());
      opCost.push_back(cost);
    }
    for (int si = 0, se = states[i].size(); si < se; ++si) {
      const State &state = *states[i][si].first;
      double base = states[i][si].second.cost;
      for (auto [ci, s] : llvm::enumerate(options[i])) {
        double cost = base + opCost[ci];
        for (auto [k, in] : llvm::enumerate(op.inputs))
          cost += ctx.commWeight * reshard(in, layoutAt(i, state, in), s.in[k]).first;
        next.assign(live[i + 1].size(), 0);
        for (auto [p, v] : llvm::enumerate(live[i + 1])) {
          if (definedAt[v] == i)
            next[p] = s.out[llvm::find(op.results, v) - op.results.begin()];
          else
            next[p] = heldAfter(op, s, v, state[position[i][v]]);
        }
        auto reach = [&](const State &to) {
          auto [it, inserted] = index[i + 1].try_emplace(to, states[i + 1].size());
          if (inserted)
            states[i + 1].push_back({&it->first, {cost, si, static_cast<int>(ci)}});
          else if (cost < states[i + 1][it->second].second.cost)
            states[i + 1][it->second].second = {cost, si, static_cast<int>(ci)};
        };
        reach(next);
        // ... or later readers take one input's copy.
        for (auto [p, v] : llvm::enumerate(live[i + 1])) {
          if (definedAt[v] == i)
            continue;
          int8_t copy = copyAfter(op, s, v, state[position[i][v]]);
          if (copy < 0)
            continue;
          State variant = next;
          variant[p] = copy;
          reach(variant);
        }
      }
    }
  }

  LayerPlan plan;
  // Close: outputs go back to the boundary layout (the last layer's whole).
  int best = -1;
  double bestCost = kInf;
  for (int si = 0, se = states[n].size(); si < se; ++si) {
    double cost = states[n][si].second.cost;
    for (int out : layer.outputs) {
      int8_t have = layoutAt(n, *states[n][si].first, out);
      cost += ctx.commWeight * reshard(out, have, closingLayout(out, have)).first;
    }
    if (cost < bestCost) {
      bestCost = cost;
      best = si;
    }
  }
  if (best < 0)
    return plan;

  // Walk back to the chosen strategies.
  SmallVector<int> choice(n);
  SmallVector<int> stateAt(n + 1);
  stateAt[n] = best;
  for (int i = n; i > 0; --i) {
    const Entry &entry = states[i][stateAt[i]].second;
    choice[i - 1] = entry.choice;
    stateAt[i - 1] = entry.parent;
  }

  plan.feasible = true;
  plan.objective = bestCost;
  double tokens = ctx.tokens();
  SmallVector<double> heldBytes(layer.values.size(), 0);
  double dispatchedBytes = 0;
  std::set<int> castInputs; // (gemm=fp8) the GEMM inputs quantised so far
  double keptScores[2] = {0, 0}; // a materialised attention's scores kept: without, with selective recomputation
  for (int i = 0; i < n; ++i) {
    const OpNode &op = layer.ops[i];
    const Strategy &s = options[i][choice[i]];
    const State &state = *states[i][stateAt[i]].first;
    auto layoutOf = [&](int v) { return layoutAt(i, state, v); };
    plan.strategy.push_back(s.name);
    plan.layouts.push_back(SmallVector<int8_t>(s.out.begin(), s.out.end()));
    // Some positions sliced from the whole sequence (a prefill's last):
    // under context parallelism the partitioner gathers the input first.
    if (op.kind == OpClass::Slice && op.dim == 1 && rank(op.inputs[0]) >= 3 &&
        !value(op.inputs[0]).someSequence && value(op.results[0]).someSequence) {
      plan.slicedSequenceBytes += fullBytes(op.inputs[0]) * share(s.in[0]);
      ++plan.slicedSequenceValues;
    }
    if (op.kind == OpClass::Router && op.numGroups > 1) {
      plan.numGroups = op.numGroups;
      plan.topkGroups = op.topkGroups;
    }
    if (op.kind == OpClass::CrossEntropy) {
      plan.holdsLoss = true;
      plan.lossOverTp = s.in[0] != kReplicated;
      // (the logits' gradient is the transient below; the stack's loss may
      // hold more logits-sized buffers at its peak)
      if (ctx.train)
        plan.backwardTransientBytes = std::max(
            plan.backwardTransientBytes,
            (1 + ctx.cluster->profile.lossBuffers) * fullBytes(op.inputs[0]) * share(s.in[0]));
    }
    double time = opTime(op, s);
    plan.computeTime += time;
    plan.opTimes.push_back(time);
    plan.opWork.push_back(workOf(op, s, time));
    // A linear's backward by its two GEMMs' own shapes (costed at twice
    // the forward otherwise): a skinny forward's data gradient runs a
    // short inner dimension, its weight gradient few output tiles.
    if (op.kind == OpClass::Linear && ctx.train) {
      double backward = linearBackwardTime(op, s);
      plan.backwardExtraTime += backward - 2 * time;
      plan.opWork.back().backwardSeconds = backward;
    }
    // A materialised attention keeps its scores for the backward pass
    // (its softmax's output, the dropout's mask and output: every pair,
    // whatever the mask), unless selective recomputation re-runs it.
    if (op.kind == OpClass::Attention && ctx.cluster->profile.attention == AttentionKernel::Materialized) {
      double kept = ctx.cluster->profile.scoreKeptBytes * ctx.sequences * op.heads * s.computeFrac *
                    ctx.queryLen * ctx.contextLen;
      int gemms = 0; // (no policy picks an attention by its GEMM count)
      keptScores[0] += kept;
      keptScores[1] += pickedForRecompute(op, gemms) ? 0 : kept;
    }
    // A flash-style kernel's backward runs its FLOPs (2.5x the forward's)
    // at flash_backward_rate of the forward's FLOP/s (FlashAttention-3
    // paper, H100 head dim 128, 4K-16K tokens: FA2 310-322 against
    // 368-370 TFLOP/s, cuDNN 499-518 against 595-609, FA3 542-561 against
    // 638-648: 0.82-0.87); a materialised one's is four batched GEMMs
    // against two.
    // gemm=fp8: the stack's quantisation of the GEMM's operands (the
    // output head stays out of it; the experts' below), forward: the input (once
    // for the GEMMs that share it, in the layout it is held in before a
    // gather: TransformerEngine and torchao cast a sequence-parallel shard
    // and gather it in fp8) and, training, the weights; backward: the
    // output's gradient (a sequence-parallel shard likewise).
    const Profile &profile = ctx.cluster->profile;
    if (isGemm(op) && op.kind != OpClass::Experts && ctx.gemmBytes == 1) {
      double bandwidth = ctx.cluster->memoryBandwidth() * ctx.cluster->memoryEfficiency;
      int in = op.inputs[0];
      double input = castInputs.insert(in).second ? fullBytes(in) * share(layoutOf(in)) : 0;
      double output = fullBytes(op.results[0]) *
                      std::min(share(s.out[0]), ctx.sequenceParallel ? 1.0 / t : 1.0);
      double casts = profile.fp8ActivationPasses * input / bandwidth;
      if (ctx.train) {
        casts += profile.fp8WeightPasses * op.weightBytes * s.weightFrac / bandwidth;
        // (the backward, costed at twice the forward, casts the gradient
        // alone)
        plan.backwardExtraTime += profile.fp8ActivationPasses * output / bandwidth - 2 * casts;
        // A shard gathered in fp8 (tp_gather_fp8) has its transposed copy,
        // which the weight's gradient reads, made of the whole gathered
        // value, a read and a write of a byte an element: the rest of the
        // value beyond the shard the passes above count.
        if (input > 0 && layoutOf(in) == 1 && s.in[0] == kReplicated && profile.tpGatherFp8 && rank(in) >= 3)
          plan.backwardExtraTime += 2 * (fullBytes(in) - input) * ctx.gemmInputShare / bandwidth;
      }
      plan.computeTime += casts;
      plan.opTimes.back() += casts;
    }
    // The experts' GEMMs quantise their own rows where the dispatch leaves
    // them in the model's dtype (TransformerEngine's GroupedLinear, after
    // Megatron's dispatch): forward, the dispatched rows and the
    // down-projection's input; backward, the gradients of the two GEMMs'
    // outputs (the hidden rows, the gated pair).
    if (op.kind == OpClass::Experts && ctx.gemmBytes == 1 && !profile.epDispatchFp8 &&
        profile.fp8ActivationPasses > 0) {
      double bandwidth = ctx.cluster->memoryBandwidth() * ctx.cluster->memoryEfficiency;
      double rows = op.topK * fullBytes(op.inputs[0]) * share(s.in[0]); // bytes, hidden wide
      double widen = expertWidth(op, s) / value(op.inputs[0]).shape.back();
      double casts = profile.fp8ActivationPasses * rows * (1 + widen) / bandwidth;
      if (ctx.train)
        plan.backwardExtraTime += profile.fp8ActivationPasses * rows * (1 + 2 * widen) / bandwidth - 2 * casts;
      plan.computeTime += casts;
      plan.opTimes.back() += casts;
    }
    if (op.kind == OpClass::Attention && profile.attention == AttentionKernel::Flash) {
      double forward = 2.0 * op.headDim + 5 + 2.0 * op.valueDim;
      double backward = forward + 2.0 * op.valueDim + 5 + 4.0 * op.headDim;
      // (its kernel at flash_backward_rate of the forward's FLOP/s)
      plan.backwardExtraTime += time * (backward / (forward * profile.flashBackwardRate) - 2);
    }
    auto [forwardScratch, backwardScratch] = scratchBytes(op, s);
    plan.scratchBytes[0] = std::max(plan.scratchBytes[0], forwardScratch);
    plan.scratchBytes[1] = std::max({plan.scratchBytes[1], forwardScratch, backwardScratch});
    for (auto [k, in] : llvm::enumerate(op.inputs)) {
      auto [commTime, kind] = reshard(in, layoutOf(in), s.in[k]);
      plan.commTime += commTime;
      if (kind)
        plan.collectives.push_back({*kind, movedBytes(in, *kind, layoutOf(in)), i, commTime, in,
                                    alongOf(*kind, layoutOf(in), s.in[k])});
    }
    if (s.internal) {
      double seconds = collective(s.internal->first, s.internal->second * tokens);
      plan.commTime += seconds;
      plan.collectives.push_back({s.internal->first, s.internal->second * tokens, i, seconds});
    }
    double weightShare = s.weightFrac / (op.kind == OpClass::Experts ? ctx.ep : 1);
    plan.weightBytes += weightBytes(op) * weightShare;
    if (op.kind == OpClass::Embedding)
      plan.unreadWeightBytes += unreadTableBytes(op, s);
    plan.weightParams += op.weightParams * weightShare;
    plan.tiedParams += op.tiedParams * weightShare;
    plan.largestWeightParams = std::max(plan.largestWeightParams, op.largestWeight * weightShare);
    if (op.kind != OpClass::Experts)
      for (double elements : op.weightTensors)
        plan.denseTensors.push_back(elements * weightShare);
    if (op.kind == OpClass::Experts) {
      plan.expertWeightBytes += weightBytes(op) * weightShare;
      plan.expertParams += op.weightParams * weightShare;
      // (folded: the rank's sequence shard)
      plan.alltoallBytes += fullBytes(op.inputs[0]) * share(s.in[0]) * op.topK;
      plan.dispatchedRows += fullBytes(op.inputs[0]) * share(s.in[0]);
      plan.expertTopK = std::max(plan.expertTopK, op.topK);
    }
    // The KV cache: what the program's cache updates write (a token's
    // heads x channels, in their layout), else what the attention reads.
    if (op.kind == OpClass::Attention && !layer.cachedValues) {
      plan.kvBytesPerToken +=
          op.kvHeads * op.cacheWidth * ctx.kvBytes * s.kvFrac;
      plan.kvWindow = op.window; // (what parax builds for generation: a ring)
    }
    if (op.kind == OpClass::CacheUpdate) {
      const auto &shape = value(op.results.back()).shape; // (the cache's)
      double perToken = shape[2] * shape[3] * ctx.kvBytes * share(s.out.back());
      if (op.ring)
        plan.kvRingBytes += shape[1] * perToken;
      else
        plan.kvBytesPerToken += perToken;
    }
    // Inference: the peak of live values (those live into this op, in
    // their layouts here, and what it writes). An elementwise result
    // (rope's too) takes the memory of an operand of its shape and layout
    // that this op is the last reader of, as the runtime writes it in
    // place; so does a reshape's of its operand's bytes.
    double liveBytes = 0;
    for (int v : live[i])
      if (!value(v).inKvCache)
        liveBytes += fullBytes(v) * share(layoutOf(v));
    bool elementwise = op.kind == OpClass::Unary || op.kind == OpClass::Swiglu || op.kind == OpClass::Add ||
                       op.kind == OpClass::Mul || op.kind == OpClass::Rope;
    bool inPlace = false;
    for (auto [k, in] : llvm::enumerate(op.inputs)) {
      if (op.results.size() != 1 || lastUse[in] != static_cast<int>(i) || value(in).inKvCache ||
          layoutOf(in) != s.in[k])
        continue;
      int res = op.results[0];
      if (op.kind == OpClass::Reshape)
        inPlace |= fullBytes(in) * share(s.in[k]) == fullBytes(res) * share(s.out[0]);
      else if (elementwise)
        inPlace |= value(in).shape == value(res).shape && fullBytes(in) == fullBytes(res) && s.in[k] == s.out[0];
    }
    for (auto [k, res] : llvm::enumerate(op.results))
      if (!value(res).inKvCache && !inPlace)
        liveBytes += fullBytes(res) * share(s.out[k]);
    plan.peakLiveBytes = std::max(plan.peakLiveBytes, liveBytes);
    // The bytes of each result as this device holds it (a reshape's and a
    // cache view's are another value's memory).
    for (auto [k, res] : llvm::enumerate(op.results)) {
      heldBytes[res] = op.kind == OpClass::Reshape || op.cacheView ? 0 : fullBytes(res) * share(s.out[k]);
      if (!value(res).inKvCache)
        plan.backwardTransientBytes = std::max(plan.backwardTransientBytes, heldBytes[res]);
    }
    if (op.kind == OpClass::Experts && ctx.expertRanks() > 1)
      // Its backward: the output's gradient dispatched to this rank's
      // experts, the input's gradient rows sent back, the experts' weight
      // gradients (one instruction writes them all).
      plan.backwardTransientBytes =
          std::max(plan.backwardTransientBytes,
                   2 * ctx.dispatchedFactor() * op.topK * fullBytes(op.inputs[0]) * share(s.in[0]) +
                       op.weightBytes * weightShare);
    if (op.kind == OpClass::Experts && ctx.cluster->profile.expertKeptBytes > 0) {
      // The intermediates the stack keeps for the experts' backward (the
      // profile's expert_kept_bytes an element of a pair's expert width)
      // and, without expert parallelism, the rows it permuted into expert
      // order, which the first GEMM's weight gradient reads (with it, the
      // dispatched rows below).
      dispatchedBytes += ctx.cluster->profile.expertKeptBytes * rankPairs(op) * expertWidth(op, s);
      if (ctx.expertRanks() == 1)
        dispatchedBytes += op.topK * fullBytes(op.inputs[0]) * share(s.in[0]) * ctx.gemmInputShare;
    }
    if (op.kind == OpClass::Experts && ctx.expertRanks() > 1 && op.inputs.size() >= 3)
      // The dispatched rows, weights and experts the gradient reads: ep ·
      // tokens · k rows (the runtime sizes them for every token of the EP
      // group choosing this rank's experts), or the expert capacity's.
      // (The rows in the GEMMs' dtype: the experts' gradient alone reads
      // them.)
      dispatchedBytes += ctx.dispatchedFactor() *
                         (op.topK * fullBytes(op.inputs[0]) * share(s.in[0]) *
                              ctx.gemmInputShare +
                          fullBytes(op.inputs[1]) * share(s.in[1]) + fullBytes(op.inputs[2]) * share(s.in[2]));
  }
  for (int in : layer.inputs)
    heldBytes[in] = value(in).inKvCache ? 0 : fullBytes(in) * share(boundaryLayout(in));

  plan.activationBytes[0] = keptBytes(/*selective=*/false, heldBytes, plan.opTimes) + dispatchedBytes + keptScores[0];
  plan.activationBytes[1] = keptBytes(/*selective=*/true, heldBytes, plan.opTimes, &plan.selectiveRecomputeTime) +
                            dispatchedBytes + keptScores[1];
  // The last states' outputs closing back to the boundary.
  for (int out : layer.outputs) {
    int8_t have = layoutAt(n, *states[n][best].first, out);
    auto [commTime, kind] = reshard(out, have, closingLayout(out, have));
    plan.commTime += commTime;
    if (kind)
      plan.collectives.push_back(
          {*kind, movedBytes(out, *kind, have), n, commTime, out, alongOf(*kind, have, closingLayout(out, have))});
  }
  chargeSequenceCopies(plan);
  // A collective decomposed with its GEMMs (TransformerEngine's userbuffers
  // ring exchange: tp chunks, each chunk's transfer beside the GEMM on the
  // one before) hides behind all of them but the first chunk's share:
  // exposed where it outlasts (tp - 1)/tp of the GEMMs that read the
  // gathered value or write the value reduce-scattered. The backward's
  // conjugates pair with the same GEMMs' data gradients (the same FLOPs).
  const Profile &profile = ctx.cluster->profile;
  for (const CollectiveUse &c : plan.collectives) {
    if (c.value < 0 || (c.kind != CollectiveKind::AllGather && c.kind != CollectiveKind::ReduceScatter))
      continue;
    // The decomposition's own cost. Forward: a GEMM reading the gathered
    // value in tp chunks, one writing the value reduce-scattered in the
    // profile's splits on the SMs it leaves. Backward (where decomposed
    // too, as TransformerEngine does): the latter's data gradient gathers
    // its input in tp chunks (a ring exchange); the former's data and
    // weight gradients run whole beside bulk exchanges (the recipes'
    // tuned configurations set no SM margin for them).
    if (profile.tpOverlapGemms && ctx.tp > 1)
      for (int j = 0; j < n; ++j) {
        const OpNode &op = layer.ops[j];
        bool scattered = c.kind == CollectiveKind::ReduceScatter;
        if (op.kind != OpClass::Linear || op.outputHead ||
            !is_contained(scattered ? op.results : op.inputs, c.value))
          continue;
        const Strategy &s = options[j][choice[j]];
        // (never faster than whole: a chunk's better wave fit is the
        // shape model's artefact, not a gain)
        double whole = opTime(op, s), extra = std::max(0.0, decomposedGemmTime(op, s, scattered) - whole);
        plan.computeTime += extra;
        plan.opTimes[j] += extra;
        plan.backwardExtraTime -= 2 * extra; // (the backward is costed at twice the forward)
        if (scattered && profile.tpOverlapBackward)
          plan.backwardExtraTime += std::max(0.0, decomposedGemmTime(op, s, /*besideReduceScatter=*/false) - whole);
      }
    double gemms = 0;
    for (int j = 0; j < n; ++j)
      if (isGemm(layer.ops[j]) && layer.ops[j].kind != OpClass::Experts &&
          (is_contained(layer.ops[j].inputs, c.value) || is_contained(layer.ops[j].results, c.value)))
        gemms += plan.opTimes[j];
    plan.commBehindGemms += std::min(c.seconds, gemms * (ctx.tp - 1.0) / ctx.tp);
  }
  for (int out : layer.outputs) {
    if (!value(out).returned || value(out).inKvCache || rank(out) < 2 || ctx.train)
      continue;
    plan.returnedBytes += fullBytes(out);
    ++plan.returnedValues;
    if (rank(out) >= 3 && !value(out).someSequence) {
      plan.returnedSequenceBytes += fullBytes(out);
      ++plan.returnedSequenceValues;
    }
  }
  for (int in : layer.inputs)
    plan.inputBytes += heldBytes[in];
  plan.activationBytes[2] = plan.inputBytes;
  for (int out : layer.outputs)
    plan.outputBytes += value(out).inKvCache || lastLayer ? 0 : fullBytes(out) * share(boundaryLayout(out));
  plan.workingBytes = plan.activationBytes[0];
  // The prologue and the layer holding the loss are never recomputed
  // (lib/Train/Recompute.cpp): they keep what they keep without. (The
  // loss's layer runs its backward right after its forward: under full
  // recomputation what it keeps is live only then, with the layers'
  // inputs, as one layer's working set is.)
  bool holdsLoss = llvm::any_of(layer.ops, [](const OpNode &op) { return op.kind == OpClass::CrossEntropy; });
  if (layer.index < 0 || holdsLoss) {
    plan.activationBytes[1] = plan.activationBytes[0];
    if (layer.index < 0)
      plan.activationBytes[2] = plan.activationBytes[0];
    plan.selectiveRecomputeTime = 0;
  }
  return plan;
}

} // namespace

LayerPlan parax::plan::solveLayer(const LayerGraph &layer,
                                  const TpContext &context, bool lastLayer) {
  return Solver(layer, context, lastLayer).solve();
}

double parax::plan::solveLayerExhaustively(const LayerGraph &layer,
                                           const TpContext &context,
                                           bool lastLayer) {
  return Solver(layer, context, lastLayer).exhaustive();
}
