//===- Planner.cpp - search for the best placement ------------------------===//
//
// Formulas and their sources: docs/cost-model.md.
//
//===----------------------------------------------------------------------===//

#include "parax/Plan/Planner.h"
#include "parax/Plan/CostModel.h"
#include "parax/runtime/PipelineSchedule.h"

#include "llvm/ADT/STLExtras.h"
#include "llvm/ADT/StringMap.h"
#include "llvm/Support/Format.h"
#include "llvm/Support/FormatVariadic.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>
#include <tuple>

using namespace parax::plan;
using llvm::formatv;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();
// Context parallelism is searched only down to pieces of this many tokens
// a rank (shorter pieces make small GEMMs; a pinned cp= takes any).
constexpr int64_t kMinContextPiece = 1024;

std::vector<int64_t> divisorsOf(int64_t n) {
  std::vector<int64_t> out;
  for (int64_t d = 1; d * d <= n; ++d)
    if (n % d == 0) {
      out.push_back(d);
      if (d != n / d)
        out.push_back(n / d);
    }
  llvm::sort(out);
  return out;
}

// Everything one layer contributes to a training configuration.
/// The links a group's collectives hold: 1, the network, when it spans
/// nodes; 0, a node's own links (NVLink), when it does not.
static int linkOf(Group g) { return g.nodes() > 1 ? 1 : 0; }

struct LayerCost {
  double time = 0;      // per microbatch: forward + backward (+ recompute)
  double forward = 0;   // per microbatch
  double backward = 0;
  double tpComm = 0, epComm = 0, cpComm = 0;
  double compute = 0;
  // Seconds its collectives hold each kind of link (0: a node's own links,
  // 1: the network) in its forward and in its backward (`backward`'s, no
  // recompute): what a gradient sync or a ZeRO-3 gather beside them
  // cannot use.
  double forwardBusy[2] = {0, 0}, backwardBusy[2] = {0, 0};
  double weights = 0, gradients = 0, optimizer = 0; // bytes per device
  double activations = 0;  // per in-flight microbatch
  double inputBytes = 0, outputBytes = 0; // the layer's inputs and outputs, per microbatch
  double working = 0;      // full recompute: one layer's activations
  double transient = 0;    // per microbatch: what its backward makes at once (LayerPlan::backwardTransientBytes)
  double largestGradient = 0; // the largest gradient box (bf16) and a tied weight's other part
  double gathered = 0;     // ZeRO-3: the layer's weights while it runs
  double staged = 0;       // ZeRO-2/3: its largest box's reduce-scatter staging
  double scratch = 0;      // the CUDA backend's kernel scratch for its largest op
  double kvCache = 0;     // bytes per device (inference)
  double denseParams = 0, expertParams = 0;
  llvm::ArrayRef<double> denseTensors; // its LayerPlan's (the search's cache holds it)
};

/// The parameters (a device's) of the bucket holding a stage's first layer
/// when buckets are filled walking the stage backwards from its last
/// layer, each closed once it holds `bucket` (Megatron-Core's
/// param_and_grad_buffer.py, at layer granularity): the last one formed.
static double firstBucketParams(const std::vector<LayerCost> &costs, llvm::ArrayRef<int64_t> layers,
                                double bucket) {
  double held = 0;
  for (size_t i = layers.size(); i-- > 0;) {
    held += costs[layers[i]].denseParams;
    if (held >= bucket && i > 0)
      held = 0;
  }
  return held;
}

class Search {
public:
  Search(const ModelGraph &model, const ClusterSpec &cluster,
         const Workload &workload, const PlanOptions &options)
      : model(model), cluster(cluster), w(workload), opt(options) {
    llvm::StringMap<int> ids;
    for (const LayerGraph &layer : model.layers) {
      signature.push_back(ids.try_emplace(layer.signature, ids.size()).first->second);
      hasExperts = hasExperts || layer.hasExperts;
      for (const OpNode &op : layer.ops) {
        shifts = shifts || op.kind == OpClass::Shift;
        if (op.kind == OpClass::Experts)
          numExperts = op.numExperts;
        if ((op.kind == OpClass::Linear && !op.outputHead) || op.kind == OpClass::HeadLinear ||
            op.kind == OpClass::Experts)
          gemmFlopsPerToken += op.flopsPerToken;
      }
    }
  }

  PlanResult run();
  TpContext context(int64_t tp, int64_t ep, bool sp, double sequences, int64_t cp = 1) const;
  const LayerPlan &layerPlan(size_t layer, const TpContext &ctx);

private:
  const ModelGraph &model;
  const ClusterSpec &cluster;
  const Workload &w;
  PlanOptions opt;
  std::vector<int> signature;
  bool hasExperts = false; // some layer routes tokens to experts
  int64_t numExperts = 0;  // (their count)
  bool shifts = false;     // multi-token prediction's shifted tokens: no cp
  double gemmFlopsPerToken = 0; // of the GEMMs gemm= runs in its dtype (mfuPeak)
  std::map<std::tuple<int, int64_t, int64_t, bool, double, bool, double, bool>, LayerPlan> cache;
  /// Interleaved 1F1B's activation sets each of `pp` stages holds at
  /// once with `v` chunks and `m` microbatches (the runtime's schedule,
  /// runtime::activationsInFlight), computed once a (pp, v, m).
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::vector<double>> inFlight;
  const std::vector<double> &interleavedActivations(int64_t pp, int64_t v, int64_t m) {
    auto [it, inserted] = inFlight.try_emplace({pp, v, m});
    if (inserted)
      for (int64_t stage = 0; stage < pp; ++stage)
        it->second.push_back(parax::runtime::activationsInFlight(
            "interleaved", static_cast<int>(stage), static_cast<int>(pp), static_cast<int>(v), m,
            cluster.profile.pipelineActivationSlots ? parax::runtime::InFlightMemory::Slots
                                                    : parax::runtime::InFlightMemory::Peak));
    return it->second;
  }
  int64_t evaluated = 0;
  /// Why a pinned interleaved schedule was never costed (a reason the
  /// explanation names when nothing else applied); empty if it was.
  std::string interleavedRefused;
  // The best objectives of feasible plans so far: a configuration whose
  // lower bound is worse than the top-k-th cannot make the list.
  std::vector<double> topObjectives;
  double cutoff() const {
    return !opt.prune || topObjectives.size() < static_cast<size_t>(opt.topK)
               ? kInf
               : topObjectives.back();
  }
  void record(const Plan &plan) {
    if (!plan.fits)
      return;
    topObjectives.insert(llvm::upper_bound(topObjectives, plan.objective),
                         plan.objective);
    if (topObjectives.size() > static_cast<size_t>(opt.topK))
      topObjectives.pop_back();
  }

  bool train() const { return w.kind == WorkloadKind::Train; }
  /// Which pinned degrees no plan could take, in words ("; tp=16 ..."), for
  /// the explanation when nothing applied: `n` devices, `experts` the
  /// model's routed experts (0: none).
  std::string pinnedRefusals(int64_t n, int64_t experts) const;
  /// Whether a training step with `stages` pipeline stages keeps ZeRO-3's
  /// parameters gathered a step (Profile::zero3PipelineUnsharded).
  bool zero3KeptUnsharded(int64_t stages) const {
    return cluster.profile.zero3PipelineUnsharded && stages > 1 && w.kind == WorkloadKind::Train;
  }
  double capacity() const {
    return cluster.hbmBytes * opt.memoryHeadroom - opt.reservedBytes;
  }
  void evaluateTrain(int64_t tp, int64_t pp, int64_t dp, int64_t ep, int64_t cp,
                     std::vector<Plan> &out);
  void evaluateInference(int64_t tp, int64_t pp, int64_t dp, int64_t ep, int64_t cp,
                         std::vector<Plan> &out);
  /// Whether a sequence split over cp ranks stays split through every layer
  /// with `rows` sequences a microbatch: an MoE layer's tokens ([B x S],
  /// batch and sequence merged) carry it only for one sequence.
  bool contextSplitFits(int64_t cp, int64_t rows) const {
    return cp <= 1 || rows == 1 || !hasExperts;
  }
  /// Whether this configuration's experts may be folded over the TP ranks
  /// (`fold`: each whole on one of ep x tp ranks, Megatron's
  /// expert_tensor_parallel_size = 1) or split like the MLP (etp = tp):
  /// folding needs sequence parallelism (the caller's), no cp, the
  /// experts dealt out evenly, and the stack's support or etp=1; never
  /// when lowering for parax's runtime. A pinned etp allows one of the two.
  bool expertsMayFold(bool fold, int64_t tp, int64_t ep, int64_t cp) const {
    if (!hasExperts)
      return !fold && !w.etp; // (etp= pins what a model without experts lacks)
    if (tp == 1)
      return !fold;
    if (!fold)
      return !w.etp || *w.etp == tp;
    bool even = cp == 1 && numExperts % (ep * tp) == 0;
    return even && !opt.lowering && (w.etp ? *w.etp == 1 : cluster.profile.expertFolding);
  }
  /// The GEMMs' input bytes an element (gemm=), as a share of the model's:
  /// what the expert dispatch sends and a training step keeps for the
  /// GEMMs' gradients. 1 for the model's dtype or a wider one.
  double gemmInputShare() const {
    return w.gemmDtype.empty() ? 1
                               : std::min(1.0, double(dtypeBytes(w.gemmDtype)) /
                                                   model.elementBytes);
  }
  /// Expert parallelism: a layer's dispatch and combine all-to-alls over
  /// the ep group, 0 without (each way of a training step: the backward's
  /// combine gradient goes the dispatch's way). With gemm=fp8 the
  /// dispatched rows are FP8 where the stack quantises before the dispatch
  /// (the profile's ep_dispatch_fp8, as DeepSeek-V3 exchanges them), the
  /// combined ones the model's dtype.
  double expertExchangeTime(const LayerPlan &lp, int64_t ep, Group epGroup) const {
    if (ep <= 1 || lp.alltoallBytes <= 0)
      return 0;
    double dispatchShare = cluster.profile.epDispatchFp8 ? gemmInputShare() : 1;
    if (cluster.profile.epNodeDispatch && epGroup.nodes() > 1)
      return nodeDispatchTime(cluster, lp.dispatchedRows * dispatchShare, lp.expertTopK, lp.numGroups,
                              lp.topkGroups, epGroup) +
             nodeDispatchTime(cluster, lp.dispatchedRows, lp.expertTopK, lp.numGroups, lp.topkGroups, epGroup);
    return collectiveTime(cluster, CollectiveKind::AllToAll,
                          lp.alltoallBytes * dispatchShare, epGroup) +
           collectiveTime(cluster, CollectiveKind::AllToAll, lp.alltoallBytes,
                          epGroup);
  }
  /// One pipeline boundary's transfer, `bytes` a rank holds (a
  /// microbatch's hidden rows; 1/tp of them under sequence parallelism):
  /// sent whole by each of the tp ranks to its peer, or, where the stack
  /// scatters and gathers (pp_scatter_gather) a replicated boundary, 1/tp
  /// of it each and all-gathered over the TP group on arrival.
  double boundaryTime(double bytes, int64_t tp, bool split, const Group &ppGroup) const {
    if (!cluster.profile.boundaryInPieces(tp, split))
      return collectiveTime(cluster, CollectiveKind::SendRecv, bytes, ppGroup);
    return collectiveTime(cluster, CollectiveKind::SendRecv, bytes / tp, ppGroup) +
           collectiveTime(cluster, CollectiveKind::AllGather, bytes, makeGroup(cluster, tp, 1));
  }
  /// Context parallelism: the keys and values of layer `lp` gathered over
  /// cp ranks, per device ({bytes of the gathered copy, seconds}).
  std::pair<double, double> gatheredKeysValues(const LayerPlan &lp, const TpContext &ctx,
                                               int64_t cp) const {
    if (cp <= 1 || lp.kvBytesPerToken <= 0)
      return {0, 0};
    double bytes = lp.kvBytesPerToken / ctx.kvBytes * model.elementBytes * ctx.sequences * w.seq;
    return {bytes, collectiveTime(cluster, CollectiveKind::AllGather, bytes,
                                  makeGroup(cluster, cp, ctx.tp))};
  }
  /// The program's results that layer `lp` makes, returned whole: those
  /// holding the whole sequence (prefill's logits) gathered over the cp
  /// ranks, then all over the ep ranks (each holding its own sequences);
  /// and under cp the values some positions are sliced from, gathered:
  /// {seconds over cp, seconds over ep}.
  std::pair<double, double> gatheredResults(const LayerPlan &lp, const TpContext &ctx, int64_t cp,
                                            int64_t ep) const {
    double overCp = 0, overEp = 0, whole = lp.returnedBytes;
    if (cp > 1 && lp.slicedSequenceBytes > 0)
      overCp += collectiveTime(cluster, CollectiveKind::AllGather, lp.slicedSequenceBytes * cp,
                               makeGroup(cluster, cp, ctx.tp));
    if (ctx.train)
      return {overCp, 0};
    if (cp > 1 && lp.returnedSequenceBytes > 0) {
      overCp += collectiveTime(cluster, CollectiveKind::AllGather, lp.returnedSequenceBytes * cp,
                              makeGroup(cluster, cp, ctx.tp));
      whole += lp.returnedSequenceBytes * (cp - 1);
    }
    if (ep > 1 && whole > 0)
      overEp = collectiveTime(cluster, CollectiveKind::AllGather, whole * ep,
                              makeGroup(cluster, ep, ctx.tp * cp));
    return {overCp, overEp};
  }
  /// A layer's TP collectives the profile's stack leaves exposed, forward
  /// (or, `backward`, their conjugates): those its GEMMs do not hide
  /// (decomposed with them), or the share of them its overlap does not.
  double exposedTp(const LayerPlan &lp, bool backward = false) const {
    const Profile &profile = cluster.profile;
    bool decomposed = profile.tpOverlapGemms && (!backward || profile.tpOverlapBackward);
    return decomposed ? lp.commTime - lp.commBehindGemms : lp.commTime * (1 - profile.tpOverlap);
  }
  /// The ranks whose partial losses the loss's layer sums (ep, cp and,
  /// vocab-parallel, tp; 1: none), and the seconds of that all-reduce of
  /// a scalar.
  static int64_t lossSummers(const LayerPlan &lp, int64_t tp, int64_t cp, int64_t ep) {
    return lp.holdsLoss ? ep * cp * (lp.lossOverTp ? tp : 1) : 1;
  }
  double summedLoss(const LayerPlan &lp, const TpContext &ctx, int64_t cp, int64_t ep) const {
    int64_t ranks = lossSummers(lp, ctx.tp, cp, ep);
    if (ranks == 1)
      return 0;
    return collectiveTime(cluster, CollectiveKind::AllReduce, 4,
                          makeGroup(cluster, ranks, lp.lossOverTp ? 1 : ctx.tp));
  }
  /// Stage starts for `pp` stages, each stage's counted memory within the
  /// capacity less `margin`.
  std::vector<int64_t> partition(const std::vector<LayerCost> &costs,
                                 int64_t pp, llvm::function_ref<double(int64_t)> inflight,
                                 double &maxStage, double margin = 0) {
    std::vector<double> time, states, acts;
    for (const LayerCost &c : costs) {
      time.push_back(c.time);
      states.push_back(c.weights + c.gradients + c.optimizer + c.kvCache);
      acts.push_back(c.activations);
    }
    if (cluster.profile.pipelineEvenSplit)
      return evenStages(time, states, acts, inflight, pp, maxStage, margin);
    std::vector<int64_t> starts =
        partitionStages(time, states, acts, inflight, capacity() - margin, pp, maxStage);
    if (margin > 0)
      return starts;
    // No stages fit (only when asked): the split that needs the least
    // memory (the smallest capacity some split fits, by bisection), kept as
    // a plan that does not fit, for the explanation to say what overflows.
    if (starts.empty() && opt.keepUnfitStages && pp <= static_cast<int64_t>(costs.size())) {
      double most = 0;
      for (int64_t s = 0; s < pp; ++s)
        most = std::max(most, inflight(s));
      double lo = capacity(), hi = std::accumulate(states.begin(), states.end(), 0.0) +
                                   most * std::accumulate(acts.begin(), acts.end(), 0.0);
      for (int i = 0; i < 60 && hi > lo * (1 + 1e-9); ++i) {
        double mid = (lo + hi) / 2;
        if (partitionStages(time, states, acts, inflight, mid, pp, maxStage).empty())
          lo = mid;
        else
          hi = mid;
      }
      starts = partitionStages(time, states, acts, inflight, hi, pp, maxStage);
    }
    return starts;
  }
  /// Stage starts under the stack's even split (pipeline_even_split): stage
  /// s from decoder layer s L/pp (the layers before the first decoder
  /// layer on stage 0, those after the last on the last stage); empty
  /// when a stage's counted memory overflows the capacity less `margin`,
  /// unless unfit stages are asked for (and no margin is).
  std::vector<int64_t> evenStages(llvm::ArrayRef<double> time, llvm::ArrayRef<double> states,
                                  llvm::ArrayRef<double> acts, llvm::function_ref<double(int64_t)> inflight,
                                  int64_t pp, double &maxStage, double margin) const {
    int64_t decoders = model.numDecoderLayers, n = time.size();
    std::vector<int64_t> starts(pp, 0);
    for (int64_t s = 1; s < pp; ++s) {
      int64_t first = s * decoders / pp;
      starts[s] = std::find_if(model.layers.begin(), model.layers.end(),
                               [&](const LayerGraph &layer) { return layer.index == first; }) -
                  model.layers.begin();
    }
    maxStage = 0;
    bool fits = true;
    for (int64_t s = 0; s < pp; ++s) {
      int64_t end = s + 1 < pp ? starts[s + 1] : n;
      double t = 0, held = 0, kept = 0;
      for (int64_t l = starts[s]; l < end; ++l) {
        t += time[l];
        held += states[l];
        kept += acts[l];
      }
      maxStage = std::max(maxStage, t);
      fits &= held + inflight(s) * kept <= capacity() - margin;
    }
    if (!fits && (margin > 0 || !opt.keepUnfitStages))
      return {};
    return starts;
  }
  /// The plan's memory per stage (`stages`: each stage's layers, from
  /// stageLayers), the fullest stage's kept, and whether it fits.
  void finishMemory(Plan &plan, const std::vector<LayerCost> &costs,
                    llvm::function_ref<double(int64_t)> inflight,
                    const std::vector<std::vector<int64_t>> &stages);
  /// Each pipeline stage's layers (indices into model.layers, in order):
  /// a contiguous run, or under interleaved 1F1B its virtual stages'.
  std::vector<std::vector<int64_t>> stageLayers(const Plan &plan) const {
    std::vector<std::vector<int64_t>> out(plan.pp);
    for (size_t l = 0; l < model.layers.size(); ++l)
      out[plan.stageOfLayer(l, model.layers[l].index) % plan.pp].push_back(l);
    return out;
  }
  /// Interleaved 1F1B's virtual stages for `starts`: each stage's decoder
  /// layers dealt into v chunks (equal counts a stage when a stage has
  /// fewer than v).
  std::vector<int64_t> chunksFor(llvm::ArrayRef<int64_t> starts, int64_t v) const {
    int64_t pp = starts.size(), layers = model.numDecoderLayers;
    std::vector<int64_t> counts(pp, 0);
    for (int64_t s = 0; s < pp; ++s) {
      int64_t end = s + 1 < pp ? starts[s + 1] : model.layers.size();
      for (int64_t l = starts[s]; l < end; ++l)
        counts[s] += model.layers[l].index >= 0 && model.layers[l].index < layers;
    }
    std::vector<int64_t> chunks = interleavedChunks(counts, v);
    if (!chunks.empty())
      return chunks;
    for (int64_t s = 0; s < pp; ++s)
      counts[s] = layers / pp + (s < layers % pp ? 1 : 0);
    return interleavedChunks(counts, v);
  }
  /// Per device, the elements of a weight the first and the last layer
  /// share (a tied embedding) that both layers' plans count but one
  /// stage holding both holds once (the larger box): at PP1 that is the
  /// only stage; under PP the first and last stages each hold a copy.
  static double heldTwice(const std::vector<const LayerPlan *> &plans, int64_t pp) {
    return pp == 1 && plans.size() > 1 ? std::min(plans.front()->tiedParams, plans.back()->tiedParams) : 0;
  }
  void countCollectives(Plan &plan, const std::vector<const LayerPlan *> &plans);
  /// ZeRO-3: the seconds one microbatch's forward and backward pass over
  /// `layers` wait for their parameters' gathers and gradients'
  /// reduce-scatters, on one communication stream beside the compute,
  /// and (second) what the hidden ones cost the compute beside them
  /// (Profile::dpOverlapSms), included in the first.
  std::pair<double, double> zero3Exposed(const std::vector<LayerCost> &costs, const std::vector<int64_t> &layers,
                      Recompute rc,
                      Group denseGroup, Group expertGroup) const;
  /// What `hidden` seconds of data-parallel collectives beside the
  /// compute cost it: the share of the SMs their kernels hold
  /// (Profile::dpOverlapSms).
  double besideCompute(double hidden) const;
  double modelFlopsPerToken(double contextLen, double queryLen) const;
  /// The FLOP/s at which `flopsPerToken` of the model's FLOPs would run
  /// at the devices' peaks: the GEMMs' share at the gemm= dtype's peak,
  /// the rest at the model's dtype's (MFU's denominator: a plan cannot
  /// exceed it).
  double mfuPeak(double flopsPerToken) const {
    double peak = peakFlops(cluster, model.dtype);
    if (w.gemmDtype.empty() || flopsPerToken <= 0)
      return peak;
    double gemm = std::min(gemmFlopsPerToken, flopsPerToken);
    double seconds = gemm / peakFlops(cluster, w.gemmDtype) + (flopsPerToken - gemm) / peak;
    return flopsPerToken / seconds;
  }
};

TpContext Search::context(int64_t tp, int64_t ep, bool sp,
                          double sequences, int64_t cp) const {
  TpContext ctx;
  ctx.cluster = &cluster;
  // (the SMs the stack leaves to compute: Profile::computeShare)
  ctx.peak = peakFlops(cluster, model.dtype) * cluster.profile.computeShare;
  if (!w.gemmDtype.empty()) {
    ctx.gemmPeak = cluster.gemmPeak(w.gemmDtype) * cluster.profile.computeShare;
    ctx.gemmBytes = dtypeBytes(w.gemmDtype);
    ctx.gemmInputShare = gemmInputShare();
    double own = peakFlops(cluster, model.dtype);
    ctx.gemmKScale = own > 0 ? cluster.peak(w.gemmDtype) / own : 1;
  }
  ctx.tp = tp;
  ctx.group = makeGroup(cluster, tp, 1);
  ctx.ep = ep;
  ctx.expertCapacity = w.expertCapacity.value_or(0);
  ctx.sequenceParallel = sp;
  ctx.sequenceSplits = w.sequenceParallel.value_or(true);
  ctx.sequences = sequences;
  ctx.kvBytes = dtypeBytes(w.kvDtype);
  if (w.kind == WorkloadKind::Decode) {
    ctx.queryLen = 1;
    ctx.contextLen = w.context + 1;
    ctx.decode = true;
  } else { // with context parallelism, a rank's positions of every
            // sequence (dealt out cyclically: an equal share of attention)
    ctx.queryLen = double(w.seq) / cp;
    ctx.contextLen = w.seq;
    ctx.queryPieces = cp;
  }
  ctx.train = train();
  ctx.computeWeight = train() ? 3 : 1;
  ctx.commWeight = train() ? 2 : 1;
  return ctx;
}

const LayerPlan &Search::layerPlan(size_t layer, const TpContext &ctx) {
  bool last = layer + 1 == model.layers.size();
  // The solver reads ep (and the expert capacity) for experts alone: a
  // layer without them has one plan whatever the ep degree.
  bool experts = llvm::any_of(model.layers[layer].ops, [](const OpNode &op) { return op.kind == OpClass::Experts; });
  auto key = std::make_tuple(signature[layer], ctx.tp, experts ? ctx.ep : 1,
                             ctx.sequenceParallel, ctx.sequences, last, ctx.queryLen,
                             experts && ctx.foldExperts);
  auto it = cache.find(key);
  if (it == cache.end())
    it = cache.emplace(key, solveLayer(model.layers[layer], ctx, last)).first;
  return it->second;
}

double Search::modelFlopsPerToken(double contextLen, double queryLen) const {
  double flops = 0;
  for (const LayerGraph &layer : model.layers)
    for (const OpNode &op : layer.ops) {
      if (op.kind != OpClass::Attention) {
        flops += op.flopsPerToken;
        continue;
      }
      double q = queryLen, c = contextLen;
      flops += op.heads * op.attentionPairs(q, c) / q * (2.0 * op.headDim + 5 + 2.0 * op.valueDim);
    }
  return flops;
}

void Search::finishMemory(Plan &plan, const std::vector<LayerCost> &costs,
                          llvm::function_ref<double(int64_t)> inflight,
                          const std::vector<std::vector<int64_t>> &stageOf) {
  plan.capacity = capacity();
  plan.stageMemory.clear();
  int64_t stages = stageOf.size();
  double worst = -kInf;
  for (int64_t s = 0; s < stages; ++s) {
    const std::vector<int64_t> &layers = stageOf[s];
    MemoryBreakdown m;
    double working = 0, gathered = 0, staged = 0, scratch = 0, largestGradient = 0,
           stageGathered = 0;
    for (int64_t l : layers) {
      m.weights += costs[l].weights;
      stageGathered += costs[l].gathered;
      m.gradients += costs[l].gradients;
      m.optimizer += costs[l].optimizer;
      m.activations += inflight(s) * costs[l].activations;
      working = std::max(working, costs[l].working);
      largestGradient = std::max(largestGradient, costs[l].largestGradient);
      gathered = std::max(gathered, costs[l].gathered);
      staged = std::max(staged, costs[l].staged);
      scratch = std::max(scratch, costs[l].scratch);
      m.kvCache += costs[l].kvCache;
    }
    // A training pipeline's exchanges: the activation a stage sends on,
    // kept for each microbatch in flight unless the stack frees it once
    // sent; the gradient it receives back and the one it sends to the
    // stage before, each microbatch's own (the CUDA backend's activation
    // sets, docs/cuda.md) or one pair during a microbatch's backward.
    if (stages > 1 && w.kind == WorkloadKind::Train) {
      const Profile &prof = cluster.profile;
      double out = s + 1 < stages ? costs[layers.back()].outputBytes : 0;
      double in = s > 0 ? costs[layers.front()].inputBytes : 0;
      m.activations += (prof.pipelineOutputsKept ? inflight(s) * out : 0) +
                       (prof.pipelineGradientSets ? inflight(s) : 1) * (out + in);
    }
    if (cluster.profile.runtimeBuffers) {
      m.optimizer += 2 * staged; // the runtime's two staging boxes
      m.scratch = scratch;       // one buffer a stage, grown to its largest op's
    }
    // A microbatch's backward pass through layer l: what the layers up to
    // l keep (the later ones' is freed), layer l's working set (full
    // recomputation makes it again) and the gradient of its largest value
    // (the loss's layer: of the logits) at once.
    if (w.kind == WorkloadKind::Train) {
      double later = 0, backward = 0;
      for (int64_t l : llvm::reverse(layers)) {
        backward = std::max(backward, costs[l].working + costs[l].transient - later);
        later += costs[l].activations;
      }
      working = backward;
    }
    m.activations += working;
    // One stage: the optimizer adds each bf16 gradient to its fp32 sum
    // right after the instruction that writes it, every microbatch (the
    // CUDA backend's streamGradients), so a gradient is live only then:
    // the largest, and a tied weight's first part held until the other is
    // made. (A gradient that is a partial sum over cp or ep is returned
    // so and summed with the data-parallel reduction, not all-reduced in
    // the program. With stages, a range's gradients are held to its end:
    // all of the stage's.)
    if (stages == 1 && w.kind == WorkloadKind::Train)
      m.gradients = std::min(m.gradients, largestGradient);
    if (zero3KeptUnsharded(stages)) {
      // ZeRO-3 under a pipeline, kept gathered: the stage's parameters in
      // their type, its gradients unsharded in the reduction's.
      m.weights += stageGathered;
      m.gradients += stageGathered / model.elementBytes * cluster.profile.reduceBytes;
    } else {
      m.weights += 2 * gathered; // ZeRO-3: this layer's and the prefetched next
    }
    m.reserved = opt.reservedBytes;
    plan.stageMemory.push_back(m);
    if (m.total() > worst) {
      worst = m.total();
      plan.memory = m;
    }
  }
  plan.fits = plan.memory.total() - plan.memory.reserved <= plan.capacity;
}

void Search::countCollectives(Plan &plan,
                              const std::vector<const LayerPlan *> &plans) {
  for (size_t l = 0; l < plans.size(); ++l) {
    int64_t index = model.layers[l].index;
    bool decoder = index >= 0 && index < model.numDecoderLayers;
    auto count = [&](CollectiveKind kind, int64_t n) {
      plan.allCollectives[kind] += n;
      if (decoder)
        plan.decoderCollectives[kind] += n;
    };
    for (const CollectiveUse &use : plans[l]->collectives) {
      count(use.kind, 1);
      plan.tpCollectiveBytes[use.kind] += use.bytes;
    }
    // Expert parallelism: dispatch and combine.
    if (plan.ep > 1 && plans[l]->alltoallBytes > 0)
      count(CollectiveKind::AllToAll, 2);
    // Context parallelism: every attention's keys and values gathered.
    if (plan.cp > 1 && plans[l]->kvBytesPerToken > 0)
      count(CollectiveKind::AllGather, 2);
    // ... and the results: those holding the whole sequence over cp, all
    // over ep.
    if (plan.cp > 1)
      count(CollectiveKind::AllGather, plans[l]->slicedSequenceValues);
    if (plan.cp > 1 && !train())
      count(CollectiveKind::AllGather, plans[l]->returnedSequenceValues);
    if (plan.ep > 1 && !train())
      count(CollectiveKind::AllGather, plans[l]->returnedValues);
    // ... and the loss summed.
    if (lossSummers(*plans[l], plan.tp, plan.cp, plan.ep) > 1)
      count(CollectiveKind::AllReduce, 1);
  }
  if (plan.pp > 1) // one boundary crossing per stage boundary
    plan.allCollectives[CollectiveKind::SendRecv] += plan.pp - 1;
}

std::pair<double, double> Search::zero3Exposed(const std::vector<LayerCost> &costs,
                            const std::vector<int64_t> &layers, Recompute rc,
                            Group denseGroup, Group expertGroup) const {
  const Profile &profile = cluster.profile;
  // One collective call (torch.distributed's list forms: a copy kernel a
  // rank besides).
  auto call = [&](CollectiveKind kind, double bytes, Group group) {
    return collectiveTime(cluster, kind, bytes, group) +
           (profile.collectiveListCopies ? group.size * profile.kernelOverhead : 0);
  };
  // A collective of `bytes` in messages of at most `bucket` (0: one).
  auto chunked = [&](CollectiveKind kind, double bytes, Group group, double bucket) {
    if (group.size <= 1 || bytes <= 0)
      return 0.0;
    double pieces = bucket > 0 ? std::ceil(bytes / bucket) : 1;
    return pieces * call(kind, bytes / pieces, group);
  };
  // A layer's dense parameters, `bytes` an element: in buckets, or one
  // message a parameter tensor but those every rank keeps whole.
  auto dense = [&](CollectiveKind kind, double bytes, const LayerCost &c, double bucket) {
    if (!profile.zero3TensorMessages)
      return chunked(kind, bytes * c.denseParams, denseGroup, bucket);
    double t = 0;
    if (denseGroup.size > 1)
      for (double elements : c.denseTensors)
        if (elements >= profile.zero3PersistElements)
          t += call(kind, bytes * elements, denseGroup);
    return t;
  };
  // Each layer's gathers and reduce-scatters (the gradients in the stack's
  // reduction type), and its passes: the forward in layer order, the
  // backward in reverse. A recomputed forward's gather serves the backward
  // unless the stack drops parameters it reuses only that far apart.
  size_t n = layers.size();
  std::vector<double> gather(n), forward(n), gatherBack(n), reduceBack(n), backward(n),
      heldForward(n), heldBackward(n);
  bool uses[2] = {false, false};
  uses[linkOf(denseGroup)] = denseGroup.size > 1;
  uses[linkOf(expertGroup)] = uses[linkOf(expertGroup)] || expertGroup.size > 1;
  double e = model.elementBytes, g = profile.reduceBytes;
  double copies = 0; // the copies out of the gathers' buffers (zero3_copy_out)
  for (size_t i = 0, r = n - 1; i < n; ++i, --r) {
    const LayerCost &c = costs[layers[i]];
    gather[i] = gatherBack[r] =
        dense(CollectiveKind::AllGather, e, c, profile.zero3BucketBytes) +
        chunked(CollectiveKind::AllGather, e * c.expertParams, expertGroup, profile.zero3BucketBytes);
    // (the backward's gathers: two beyond the reuse distance)
    double backwardGathers = rc == Recompute::Full && profile.zero3ReuseElements > 0 &&
                                     c.denseParams + c.expertParams > profile.zero3ReuseElements
                                 ? 2
                                 : 1;
    gatherBack[r] *= backwardGathers;
    reduceBack[r] =
        dense(CollectiveKind::ReduceScatter, g, c, profile.reduceBucketBytes) +
        chunked(CollectiveKind::ReduceScatter, g * c.expertParams, expertGroup, profile.reduceBucketBytes);
    forward[i] = c.forward;
    backward[r] = c.time - c.forward;
    // (a stack that copies a gathered layer out of the gather's buffer
    // does it on the compute stream, before the layer: a read and a write
    // of its gathered bytes, counted in what this returns)
    if (profile.zero3CopyOut && gather[i] > 0) {
      double copy = 2 * e * (c.denseParams + c.expertParams) / (cluster.memoryBandwidth() * cluster.memoryEfficiency);
      copies += copy * (1 + backwardGathers);
      forward[i] += copy;
      backward[r] += copy * backwardGathers;
    }
    // (the links the layer's own collectives hold while the stream's
    // gathers and reduce-scatters want them)
    for (int link : {0, 1})
      if (uses[link]) {
        heldForward[i] += c.forwardBusy[link];
        heldBackward[r] += c.backwardBusy[link] * (rc == Recompute::Full ? 2 : 1);
      }
  }
  double waits = streamedPassOverhead(gather, {}, forward, profile.zero3Prefetch, heldForward) +
                 streamedPassOverhead(gatherBack, reduceBack, backward, profile.zero3Prefetch, heldBackward);
  // (the collectives' time the compute did not wait for ran beside it)
  double streamed = 0;
  for (size_t i = 0; i < n; ++i)
    streamed += gather[i] + gatherBack[i] + reduceBack[i];
  double beside = besideCompute(std::max(0.0, streamed - waits));
  return {copies + waits + beside, beside};
}

double Search::besideCompute(double hidden) const {
  return hidden * std::min<double>(cluster.profile.dpOverlapSms, cluster.smCount()) / cluster.smCount();
}

void Search::evaluateTrain(int64_t tp, int64_t pp, int64_t dp, int64_t ep,
                           int64_t cp, std::vector<Plan> &out) {
  int64_t replicas = dp * ep;
  if (w.batch % replicas)
    return;
  int64_t local = w.batch / replicas;
  std::vector<int64_t> mbsList;
  if (w.microBatch)
    mbsList = {w.microBatch};
  else
    for (int64_t m : {1, 2, 4, 8, 16})
      mbsList.push_back(m);
  // The grid [pp, dp, ep, cp, tp]: the cp ranks of a sequence hold the same
  // weights, so gradients are reduced and ZeRO shards over dp x ep x cp
  // (experts: dp x cp).
  Group epGroup = makeGroup(cluster, ep, tp * cp);
  Group denseGroup = makeGroup(cluster, replicas * cp, tp);
  Group expertGroup = makeGroup(cluster, dp * cp, tp);
  Group ppGroup = makeGroup(cluster, 2, tp * cp * ep * dp);
  int tpLink = linkOf(makeGroup(cluster, tp, 1)), cpLink = linkOf(makeGroup(cluster, cp, tp));
  int64_t sharers = replicas * cp, expertSharers = dp * cp;
  double flopsPerToken = modelFlopsPerToken(w.seq, w.seq);
  double peak = mfuPeak(flopsPerToken);

  for (int64_t mbs : mbsList) {
    if (local % mbs || !contextSplitFits(cp, mbs))
      continue;
    int64_t m = local / mbs;
    std::vector<LayerCost> costs; // by layer, for one configuration at a time
    // Sequence parallelism off or on; on, the experts split like the MLP
    // or folded over the TP ranks (their all-to-all then over the ep x tp
    // ranks of a cp-less grid: adjacent).
    for (auto [sp, fold] : {std::pair{false, false}, {true, false}, {true, true}}) {
      if (sp && (tp == 1 || (w.seq / cp) % tp))
        continue;
      if (w.sequenceParallel && *w.sequenceParallel != sp)
        continue;
      if (!expertsMayFold(fold, tp, ep, cp))
        continue;
      TpContext ctx = context(tp, ep, sp, mbs, cp);
      ctx.foldExperts = fold;
      Group exchangeGroup = fold ? makeGroup(cluster, ep * tp, 1) : epGroup;
      int64_t expertRanks = ctx.expertRanks();
      int epLink = linkOf(exchangeGroup);
      std::vector<const LayerPlan *> plans;
      bool ok = true;
      for (size_t l = 0; l < model.layers.size(); ++l) {
        plans.push_back(&layerPlan(l, ctx));
        ok &= plans.back()->feasible;
      }
      if (!ok)
        continue;
      double boundaryBytes = model.hidden * model.elementBytes * ctx.tokens() /
                             (sp ? tp : 1);
      double p2p = pp > 1 ? boundaryTime(boundaryBytes, tp, sp, ppGroup) : 0;
      for (Recompute rc : {Recompute::None, Recompute::Selective, Recompute::Full}) {
        if (w.recompute ? *w.recompute != rc
                        : rc == Recompute::Selective && cluster.profile.selectiveRecompute == SelectiveRecompute::None)
          continue;
        // Schedules; interleaved 1F1B with v model chunks per device needs
        // at least v layers per device and m a multiple of pp (Megatron's
        // rule); chunks may differ by a layer.
        // A pinned chunks=v is tried whatever it is.
        llvm::SmallVector<std::pair<Schedule, int64_t>, 8> schedules = {
            {Schedule::OneFOneB, 1},    {Schedule::Interleaved, 2},
            {Schedule::Interleaved, 4}, {Schedule::Interleaved, 8},
            {Schedule::GPipe, 1}};
        if (w.chunks && *w.chunks != 2 && *w.chunks != 4 && *w.chunks != 8)
          schedules.push_back({Schedule::Interleaved, *w.chunks});
        // A stack whose chunks hold a stage's layers evenly can run only
        // the v that divide them: those up to 8 besides 2, 4 and 8 (a
        // stage of 15 layers: 3 and 5; of 3: 3).
        int64_t perStage = model.numDecoderLayers / pp; // (under an even split)
        if (cluster.profile.pipelineEvenSplit && pp > 1 && !w.chunks)
          for (int64_t v : {3, 5, 6, 7})
            if (perStage % v == 0)
              schedules.push_back({Schedule::Interleaved, v});
        for (auto [sched, v] : schedules) {
          if (w.schedule && *w.schedule != sched)
            continue;
          if (w.chunks && (sched != Schedule::Interleaved || *w.chunks != v))
            continue;
          if (pp == 1 && sched != Schedule::OneFOneB)
            continue;
          bool unevenChunks = cluster.profile.pipelineEvenSplit && perStage % v != 0;
          if (sched == Schedule::Interleaved && (model.numDecoderLayers < pp * v || m % pp || unevenChunks)) {
            if (w.schedule == Schedule::Interleaved || w.chunks)
              interleavedRefused =
                  model.numDecoderLayers < pp * v
                      ? formatv("; interleaved with {0} chunks over pp {1} needs {2} decoder layers (a layer a "
                                "chunk at least), the model has {3}",
                                v, pp, pp * v, model.numDecoderLayers)
                            .str()
                  : m % pp
                      ? formatv("; interleaved needs microbatches in a multiple of pp ({0}), a step has {1}", pp, m)
                            .str()
                      : formatv("; interleaved with {0} chunks: the profile's stack (pipeline_even_split) gives "
                                "each chunk equal layers, and a stage's {1} decoder layers do not split in {0}",
                                v, perStage)
                            .str();
            continue;
          }
          // Interleaved: the chunks' activations each stage holds at once
          // under the schedule parax-run runs (runtime::pipelineSteps,
          // Megatron-LM's order), in microbatches' worth of a stage's
          // layers: counted as the profile's stack keeps them (parax's
          // runtime a slot per microbatch a chunk holds; a caching
          // allocator the most chunk passes at once).
          const std::vector<double> *interleavedInFlight =
              sched == Schedule::Interleaved ? &interleavedActivations(pp, v, m) : nullptr;
          auto inflight = [&](int64_t stage) -> double {
            switch (sched) {
            case Schedule::GPipe: return m;
            case Schedule::OneFOneB: return std::min<int64_t>(m, pp - stage);
            case Schedule::Interleaved: return (*interleavedInFlight)[stage];
            }
            return m;
          };
          for (int zero = 0; zero <= 3; ++zero) {
            if (w.zero ? *w.zero != zero : zero > cluster.profile.maxZero)
              continue;
            ++evaluated;
            // (every field written: the vector is reused, not cleared)
            costs.resize(model.layers.size());
            double once = heldTwice(plans, pp);
            for (size_t l = 0; l < costs.size(); ++l) {
              const LayerPlan &lp = *plans[l];
              LayerCost &c = costs[l];
              c.kvCache = 0;
              double a2a = expertExchangeTime(lp, expertRanks, exchangeGroup);
              // Keys and values gathered (forward), their gradients
              // reduce-scattered (backward).
              auto [gathered, cpTime] = gatheredKeysValues(lp, ctx, cp);
              auto [resultsOverCp, resultsOverEp] = gatheredResults(lp, ctx, cp, ep);
              double loss = summedLoss(lp, ctx, cp, ep);
              // (the profile's overlaps hide a share of the TP and expert
              // communication behind independent compute)
              double tpTime = exposedTp(lp), tpBack = exposedTp(lp, /*backward=*/true);
              a2a *= 1 - cluster.profile.epOverlap;
              double besideA2a = 0; // compute slowed by the exchanges beside it
              if (cluster.profile.epOverlapCompute) {
                // Beside another microbatch's compute (a forward merged
                // with a backward): exposed where the layer's four
                // exchanges outlast its forward and backward compute; the
                // compute beside the hidden rest runs on the SMs the
                // exchange kernels leave (ep_overlap_sms of them held).
                double exchanges = 2 * a2a;
                double exposed = std::max(0.0, exchanges - (3 * lp.computeTime + lp.backwardExtraTime));
                // (all the SMs at most: the compute then waits out the exchange)
                besideA2a = (exchanges - exposed) *
                            std::min<double>(cluster.profile.epOverlapSms, cluster.smCount()) / cluster.smCount();
                a2a = exposed / 2;
              }
              c.forward = lp.computeTime + besideA2a / 3 + tpTime + a2a + cpTime + resultsOverCp + resultsOverEp +
                          loss;
              c.backward = 2 * lp.computeTime + 2 * besideA2a / 3 + lp.backwardExtraTime + tpBack + a2a + cpTime;
              double extra = rc == Recompute::Selective ? lp.selectiveRecomputeTime
                             : rc == Recompute::Full    ? c.forward
                                                        : 0;
              c.time = c.forward + c.backward + extra;
              c.compute = 3 * lp.computeTime + besideA2a + lp.backwardExtraTime + extra;
              c.tpComm = tpTime + tpBack + loss;
              c.epComm = 2 * a2a + resultsOverEp;
              c.cpComm = 2 * cpTime + resultsOverCp;
              for (int link : {0, 1})
                c.forwardBusy[link] = c.backwardBusy[link] = 0;
              c.backwardBusy[tpLink] += tpBack;
              c.backwardBusy[epLink] += a2a;
              c.backwardBusy[cpLink] += cpTime;
              c.forwardBusy[tpLink] += tpTime + loss;
              c.forwardBusy[epLink] += a2a + resultsOverEp;
              c.forwardBusy[cpLink] += cpTime + resultsOverCp;
              // A tied weight that both the first and this last layer read
              // is one parameter on a stage holding both: its weight, state
              // and sync once; its gradient's two parts are both made.
              double parts = l + 1 == costs.size() ? once : 0;
              c.expertParams = lp.expertParams;
              c.denseParams = lp.weightParams - lp.expertParams - parts;
              c.denseTensors = lp.denseTensors;
              double e = model.elementBytes;
              double dense = c.denseParams, expert = c.expertParams;
              double shard = dense / sharers + expert / expertSharers;
              c.weights = zero == 3 ? e * shard : e * (dense + expert);
              c.gradients = (zero >= 2 ? e * shard : e * (dense + expert)) + e * parts;
              c.largestGradient = e * (lp.largestWeightParams + parts);
              // A stack whose weight-gradient GEMMs add into the fp32 sums
              // holds no gradient in the model's type.
              if (cluster.profile.gradientFusion)
                c.gradients = c.largestGradient = 0;
              c.transient = lp.backwardTransientBytes;
              // fp32 master, m and v (12 bytes a parameter), and the
              // step's gradient sums (the sums over microbatches that the
              // data-parallel mean and the update read): fp32, or where
              // the weight-gradient GEMMs add into them, in the type the
              // stack reduces them in (Megatron-Core's DDP buffer: bf16
              // under grad_reduce_in_fp32 = False).
              double sums = cluster.profile.gradientFusion ? cluster.profile.reduceBytes : 4;
              c.optimizer = (zero >= 1 ? 12 * shard : 12 * (dense + expert)) +
                            (zero >= 2 ? sums * shard : sums * (dense + expert));
              // (the gathered keys and values are kept for the backward)
              c.activations = rc == Recompute::Full
                                  ? lp.activationBytes[2]
                                  : lp.activationBytes[rc == Recompute::None ? 0 : 1] + gathered;
              c.working = rc == Recompute::Full ? lp.workingBytes + gathered : 0;
              c.inputBytes = lp.inputBytes;
              c.outputBytes = lp.outputBytes;
              c.gathered = zero == 3 ? e * (dense + expert) : 0;
              // ZeRO-2 (the runtime's device optimizer) reduce-scatters each
              // microbatch's gradients through two fp32 staging boxes of the
              // largest box, at most 2^24 values (CudaExecutor.cu's
              // kZeroStagingValues).
              c.scratch = lp.scratchBytes[1];
              c.staged = zero >= 2 && std::max(sharers, expertSharers) > 1
                             ? 4 * std::min(lp.largestWeightParams, double(int64_t(1) << 24))
                             : 0;
            }
            double slots = sched == Schedule::Interleaved
                               ? m + (pp - 1.0) / v
                               : m + pp - 1.0;
            if (pp > 1) {
              // No stage is faster than an equal share of the work.
              double work = 0;
              for (const LayerCost &c : costs)
                work += c.time;
              if (slots * work / pp > cutoff())
                continue;
            }
            Plan plan = Plan::withDegrees(pp, dp, ep, tp, sp);
            plan.expertsFolded = fold;
            plan.cp = cp;
            plan.microBatch = mbs;
            plan.microBatches = m;
            plan.schedule = sched;
            plan.virtualStages = v;
            plan.zero = zero;
            plan.recompute = rc;
            // The stages: split by time under the memory the split counts
            // (states and activations in flight); when the stage's whole
            // memory (working sets, exchanges, ...) then overflows, split
            // again with that much less room, twice at most.
            double stageTime = 0, margin = 0;
            std::vector<std::vector<int64_t>> stages;
            for (int attempt = 0; attempt < 3; ++attempt) {
              std::vector<int64_t> starts =
                  pp == 1 ? std::vector<int64_t>{0}
                          : partition(costs, pp, inflight, stageTime, margin);
              if (starts.empty())
                break; // (the last split, if any, is kept)
              plan.stageStart = starts;
              // Interleaved: each stage's count of layers in its chunks,
              // and the stages costed with the layers their chunks hold.
              if (sched == Schedule::Interleaved)
                plan.chunkStart = chunksFor(starts, v);
              stages = stageLayers(plan);
              finishMemory(plan, costs, inflight, stages);
              if (plan.fits || pp == 1)
                break;
              margin += plan.memory.total() - plan.memory.reserved - plan.capacity;
            }
            if (stages.empty())
              continue;
            // The slowest stage sets the pace.
            const std::vector<int64_t> *slowestLayers = &stages.front();
            double slowest = 0, slowestBackward = 0, slowestForward = 0, stageTp = 0, stageEp = 0,
                   stageCp = 0, stageCompute = 0, denseParams = 0, expertParams = 0;
            double slowestBackwardBusy[2] = {0, 0}, slowestBusy[2] = {0, 0},
                   slowestForwardBusy[2] = {0, 0};
            double everyStage = 0; // one microbatch's passes through every stage
            for (const std::vector<int64_t> &layers : stages) {
              double t = 0, f = 0, b = 0, tpc = 0, epc = 0, cpc = 0, comp = 0, dn = 0, ex = 0;
              double bb[2] = {0, 0}, bt[2] = {0, 0}, fb[2] = {0, 0};
              for (int64_t l : layers) {
                for (int link : {0, 1}) {
                  bb[link] += costs[l].backwardBusy[link];
                  fb[link] += costs[l].forwardBusy[link];
                  bt[link] += costs[l].forwardBusy[link] + costs[l].backwardBusy[link] *
                                                                (rc == Recompute::Full ? 2 : 1);
                }
                t += costs[l].time;
                f += costs[l].forward;
                b += costs[l].backward;
                tpc += costs[l].tpComm;
                epc += costs[l].epComm;
                cpc += costs[l].cpComm;
                comp += costs[l].compute;
                dn += costs[l].denseParams;
                ex += costs[l].expertParams;
              }
              everyStage += t;
              if (t > slowest) {
                slowestLayers = &layers;
                slowest = t;
                slowestForward = f;
                slowestBackward = b;
                stageTp = tpc;
                stageEp = epc;
                stageCp = cpc;
                stageCompute = comp;
                for (int link : {0, 1}) {
                  slowestBackwardBusy[link] = bb[link];
                  slowestBusy[link] = bt[link];
                  slowestForwardBusy[link] = fb[link];
                }
              }
              denseParams = std::max(denseParams, dn);
              expertParams = std::max(expertParams, ex);
            }
            // (unequal stages -- a head or an embedding beside fewer layers
            // -- take less than m + (pp - 1) / v slots of the slowest)
            double pipeline = pipelineTime(m, v, slowest, everyStage);
            // Each chunk pass sends its activation on and its gradient back;
            // a stack that overlaps them (interleaved only) waits along
            // the fill and the drain, and where a transfer outlasts the
            // next chunk's forward pass (a third of its share of the work).
            double ppComm = pp > 1 ? 2 * slots * p2p * v : 0;
            if (pp > 1 && v > 1 && cluster.profile.ppOverlap)
              ppComm = 2 * (pp - 1) * p2p + 2 * m * v * std::max(0.0, p2p - slowest / (3 * v));
            // Gradient synchronisation, overlapped with the last backward:
            // the step's gradient sums reduced (the profile's bytes a
            // parameter: 4, fp32, as the runtime and Megatron-LM's bf16
            // training reduce them),
            // the parameters gathered in their own type.
            double e = model.elementBytes;
            double sync = 0;
            // (in messages of at most the profile's reduce bucket; 0: one)
            auto messages = [&](CollectiveKind kind, double bytes, Group group) {
              double bucket = cluster.profile.reduceBucketBytes;
              double pieces = bucket > 0 ? std::ceil(bytes / bucket) : 1;
              return pieces * collectiveTime(cluster, kind, bytes / pieces, group);
            };
            // The gradients' reduction (ZeRO-1 reduce-scatters the step's
            // sums once; ZeRO-2 each microbatch's gradients, the sums being
            // split) and, ZeRO-1/2, the updated parameters' gather, once a
            // step.
            auto reduceOnce = [&](double params, Group group) {
              if (group.size <= 1 || params <= 0)
                return 0.0;
              return messages(zero == 0 ? CollectiveKind::AllReduce : CollectiveKind::ReduceScatter,
                              cluster.profile.reduceBytes * params, group);
            };
            auto reduceOf = [&](double params, Group group) {
              return reduceOnce(params, group) * (zero >= 2 ? m : 1);
            };
            auto gatherOf = [&](double params, Group group) {
              if (group.size <= 1 || params <= 0 || zero == 0)
                return 0.0;
              return messages(CollectiveKind::AllGather, e * params, group);
            };
            auto syncOver = [&](double params, Group group) {
              return reduceOf(params, group) + gatherOf(params, group);
            };
            double dpExposed = 0;
            if (zero == 3) {
              // Gathered layer by layer for every microbatch's forward and
              // backward, reduce-scattered layer by layer: what the two
              // streams leave exposed on the slowest stage.
              // (a stack that keeps a pipeline stage's parameters gathered
              // gathers and reduces once a step)
              double passes = zero3KeptUnsharded(pp) ? 1 : m;
              auto [exposed, beside] = zero3Exposed(costs, *slowestLayers, rc, denseGroup, expertGroup);
              dpExposed = passes * exposed;
              plan.dpBeside = passes * beside;
            } else {
              double dense = syncOver(denseParams, denseGroup);
              double expert = syncOver(expertParams, expertGroup);
              sync = dense + expert;
              // What hides it (a profile with dp_overlap): the last
              // microbatch's backward; ZeRO-2's reduce-scatters each run
              // beside the next microbatch too. Link sharing: while that
              // window's own collectives (TP, EP, CP) hold the links
              // the sync needs, the sync waits.
              double overlap = 0;
              if (cluster.profile.dpOverlap) {
                bool uses[2] = {false, false};
                if (dense > 0)
                  uses[linkOf(denseGroup)] = true;
                if (expert > 0)
                  uses[linkOf(expertGroup)] = true;
                double window = zero == 2 ? (m - 1) * slowest + slowestBackward : slowestBackward;
                for (int link : {0, 1})
                  if (uses[link])
                    window -= slowestBackwardBusy[link] +
                              (zero == 2 ? (m - 1) * slowestBusy[link] : 0);
                overlap = std::max(0.0, window);
              }
              dpExposed = std::max(0.0, sync - overlap);
              // Megatron-Core's buckets (Profile::dpBucketParams): the
              // first stage's bucket of its first layers is reduced after
              // the backward and (overlap_param_gather) gathered before
              // the next forward, exposed; the other buckets' gathers run
              // behind the first microbatch's forward (or, not
              // overlapped, after the optimizer step).
              double bucket = cluster.profile.dpBucketFor(dp);
              if (cluster.profile.dpOverlap && bucket > 0 && dense > 0) {
                double tail = std::min(firstBucketParams(costs, stages.front(), bucket), denseParams);
                double reduce = reduceOf(denseParams, denseGroup), gather = gatherOf(denseParams, denseGroup);
                double tailReduce = reduceOnce(tail, denseGroup); // (the last microbatch's)
                double exposedGather = gather;
                if (cluster.profile.dpParamGatherOverlap && gather > 0) {
                  double tailGather = gatherOf(tail, denseGroup);
                  double forward = slowestForward - slowestForwardBusy[linkOf(denseGroup)];
                  exposedGather = tailGather + std::max(0.0, gather - tailGather - std::max(0.0, forward));
                }
                // (the reductions but the tail's behind the backward, as
                // above, the expert parameters' with them)
                dpExposed = tailReduce + std::max(0.0, reduce - tailReduce + expert - overlap) + exposedGather;
                plan.dpTail = tail;
              }
              // (what the hidden part costs the compute beside it)
              if (cluster.profile.dpOverlap) {
                plan.dpBeside = besideCompute(std::max(0.0, sync - dpExposed));
                dpExposed += plan.dpBeside;
              }
              plan.dpSync = sync;
              plan.dpWindow = overlap;
            }
            // A weight the first and the last stage both hold (a tied
            // embedding and head): the two exchange their parts of its
            // gradient once a step, after the last backward (the runtime's
            // sumStageParts: fp32, each rank its box, split over tp; ZeRO:
            // its chunk), between stages pp - 1 apart.
            double tied = 0;
            if (pp > 1 && model.tiedParams > 0) {
              Group ends = makeGroup(cluster, 2, (pp - 1) * tp * cp * ep * dp);
              tied = collectiveTime(cluster, CollectiveKind::SendRecv,
                                    4 * model.tiedParams / tp / (zero >= 1 ? sharers : 1), ends);
            }
            double optimizerParams =
                zero >= 1 ? denseParams / sharers + expertParams / expertSharers
                          : denseParams + expertParams;
            plan.optimizerTime = cluster.profile.optimizerBytes * optimizerParams /
                                 (cluster.memoryBandwidth() * cluster.memoryEfficiency);
            plan.stepTime = pipeline + ppComm + tied + dpExposed + plan.optimizerTime;
            // Each virtual stage's passes, for simulatePipeline: only for a
            // plan the search may return (not on the search's hot path).
            if (plan.fits && plan.stepTime <= cutoff()) {
              plan.stageForward.assign(pp * v, 0);
              plan.stageBackward.assign(pp * v, 0);
              for (size_t l = 0; l < costs.size(); ++l) {
                int64_t c = plan.stageOfLayer(l, model.layers[l].index);
                plan.stageForward[c] += costs[l].forward;
                plan.stageBackward[c] += costs[l].time - costs[l].forward;
              }
              plan.transferTime = p2p;
              plan.tailTime = tied + dpExposed + plan.optimizerTime;
            }
            plan.computeTime = m * stageCompute;
            plan.bubbleTime = pipeline - m * slowest;
            plan.tpComm = m * stageTp;
            plan.epComm = m * stageEp;
            plan.cpComm = m * stageCp;
            plan.ppComm = ppComm + tied;
            plan.dpComm = dpExposed;
            double tokens = double(w.batch) * w.seq;
            plan.tokensPerSecond = tokens / plan.stepTime;
            plan.tokensPerSecondPerDevice = plan.tokensPerSecond / cluster.numDevices();
            plan.mfu = 3 * flopsPerToken * tokens /
                       (plan.stepTime * cluster.numDevices() * peak);
            plan.objective = plan.stepTime;
            countCollectives(plan, plans);
            record(plan);
            out.push_back(std::move(plan));
          }
        }
      }
    }
  }
}

void Search::evaluateInference(int64_t tp, int64_t pp, int64_t dp, int64_t ep,
                               int64_t cp, std::vector<Plan> &out) {
  int64_t replicas = dp * ep;
  if (replicas > w.batch || !expertsMayFold(false, tp, ep, cp)) // (no folding for inference)
    return;
  int64_t sequences = (w.batch + replicas - 1) / replicas;
  // Under PP a replica's requests may run as m microbatches, each with its
  // own KV cache, taken in turn by every stage (parax-run --generate with
  // m batches a replica): stage s + 1 works on one while stage s works on
  // the next. m = 1 is one batch going through the stages in turn.
  std::vector<int64_t> counts = {1};
  if (w.microBatch) {
    if (sequences % w.microBatch)
      return;
    counts = {sequences / w.microBatch};
  } else if (pp > 1) {
    for (int64_t m : {2, 4, 8, 16})
      if (m <= sequences && sequences % m == 0)
        counts.push_back(m);
  }
  Group epGroup = makeGroup(cluster, ep, tp * cp);
  Group ppGroup = makeGroup(cluster, 2, tp * cp * ep * dp);
  bool decode = w.kind == WorkloadKind::Decode;
  double flopsPerToken = decode ? modelFlopsPerToken(w.context + 1, 1)
                                : modelFlopsPerToken(w.seq, w.seq);
  double peak = mfuPeak(flopsPerToken);
  for (int64_t micro : counts)
    for (bool sp : {false, true}) {
      if (sp && (decode || tp == 1 || (w.seq / cp) % tp))
        continue;
      if (w.sequenceParallel && *w.sequenceParallel != sp && !(decode && !sp))
        continue;
      ++evaluated;
      double perMicro = double(sequences / micro); // rows of one microbatch
      if (!contextSplitFits(cp, static_cast<int64_t>(perMicro)))
        continue;
      TpContext ctx = context(tp, ep, sp, perMicro, cp);
      std::vector<const LayerPlan *> plans;
      std::vector<LayerCost> costs(model.layers.size());
      bool ok = true;
      for (size_t l = 0; l < model.layers.size(); ++l) {
        const LayerPlan &lp = layerPlan(l, ctx);
        ok &= lp.feasible;
        plans.push_back(&lp);
        LayerCost &c = costs[l];
        double a2a = expertExchangeTime(lp, ep, epGroup);
        auto [gathered, cpTime] = gatheredKeysValues(lp, ctx, cp);
        auto [resultsOverCp, resultsOverEp] = gatheredResults(lp, ctx, cp, ep);
        c.compute = lp.computeTime;
        c.tpComm = exposedTp(lp) + summedLoss(lp, ctx, cp, ep);
        c.epComm = a2a * (1 - cluster.profile.epOverlap) + resultsOverEp;
        c.cpComm = cpTime + resultsOverCp;
        c.time = c.forward = lp.computeTime + c.tpComm + c.epComm + c.cpComm; // one microbatch
        c.weights = lp.weightBytes;
        c.working = lp.peakLiveBytes + gathered; // a stage holds one microbatch's at a time
        c.scratch = lp.scratchBytes[0];
        // Every microbatch keeps its KV cache. A generation step's caches
        // hold their capacity whatever the context (its time is the
        // context's: the attention stops at the position); a sliding
        // window's the window's tokens, a ring its rows.
        double span = std::max<double>(ctx.contextLen, static_cast<double>(model.cacheCapacity));
        if (lp.kvWindow > 0)
          span = std::min<double>(span, static_cast<double>(lp.kvWindow));
        c.kvCache = (lp.kvBytesPerToken * span + lp.kvRingBytes) * sequences;
        c.denseParams = lp.weightParams;
      }
      if (!ok)
        continue;
      double once = heldTwice(plans, pp);
      costs.back().denseParams -= once;
      costs.back().weights -= once * model.elementBytes;
      double stageTime = 0;
      auto one = [](int64_t) { return 1.0; };
      std::vector<int64_t> starts =
          pp == 1 ? std::vector<int64_t>{0} : partition(costs, pp, one, stageTime);
      if (starts.empty())
        continue;
      Plan plan = Plan::withDegrees(pp, dp, ep, tp, sp);
      plan.cp = cp;
      plan.microBatch = static_cast<int64_t>(perMicro);
      plan.microBatches = micro;
      plan.stageStart = starts;
      finishMemory(plan, costs, one, stageLayers(plan));
      // Per stage: one microbatch's time and parts, the weights it holds
      // and those it reads (an embedding's looked-up rows, not its table).
      struct Part {
        double time = 0, compute = 0, tp = 0, ep = 0, cp = 0, held = 0, weights = 0;
      };
      std::vector<Part> stages(starts.size());
      Part all;
      for (size_t st = 0; st < starts.size(); ++st) {
        size_t end = st + 1 < starts.size() ? starts[st + 1] : costs.size();
        for (size_t l = starts[st]; l < end; ++l) {
          for (Part *part : {&stages[st], &all}) {
            part->time += costs[l].time;
            part->compute += costs[l].compute;
            part->tp += costs[l].tpComm;
            part->ep += costs[l].epComm;
            part->cp += costs[l].cpComm;
            part->held += costs[l].weights;
            part->weights += costs[l].weights - plans[l]->unreadWeightBytes;
          }
        }
      }
      // What one replica (tp x pp devices; ep ranks hold other experts) has
      // left for the KV cache.
      plan.kvRoom = 0;
      for (size_t st = 0; st < starts.size(); ++st) {
        size_t end = st + 1 < starts.size() ? starts[st + 1] : costs.size();
        double working = 0;
        for (size_t l = starts[st]; l < end; ++l)
          working = std::max(working, costs[l].working);
        plan.kvRoom += tp * std::max(0.0, capacity() - stages[st].held - working);
      }
      double boundaryBytes = model.hidden * model.elementBytes * ctx.tokens();
      double hop = pp > 1 ? boundaryTime(boundaryBytes, tp, false, ppGroup) : 0;
      const Part *slowest = &stages.front();
      for (const Part &part : stages)
        if (part.time > slowest->time)
          slowest = &part;
      // (what simulateInference runs: each stage's time on one microbatch)
      plan.stageForward.clear();
      for (const Part &part : stages)
        plan.stageForward.push_back(part.time);
      plan.transferTime = hop;
      double chained = all.time + (pp - 1) * hop; // one microbatch through every stage
      double turn = slowest->time + (pp > 1 ? hop : 0); // the slowest stage on one microbatch
      // The critical path: `all` (every stage on one microbatch) plus
      // `turns` more turns of the slowest stage; or, decode's steady state
      // when the slowest stage sets the pace, `turns` turns of it alone.
      double turns = 0;
      bool paced = false;
      if (!decode) { // prefill: one pass; the others follow the first through the pipe
        turns = micro - 1;
        plan.stepTime = chained + turns * turn;
      } else { // one position of every row: each stage works through the
               // microbatches (the slowest sets the pace), and a
               // microbatch goes through every stage before its next step
        paced = micro * turn > chained;
        turns = paced ? micro : 0;
        plan.stepTime = paced ? micro * turn : chained;
      }
      auto onPath = [&](double Part::*field) {
        return (paced ? 0 : all.*field) + turns * slowest->*field;
      };
      plan.computeTime = onPath(&Part::compute);
      plan.tpComm = onPath(&Part::tp);
      plan.epComm = onPath(&Part::ep);
      plan.cpComm = onPath(&Part::cp);
      plan.ppComm = (paced ? 0 : (pp - 1) * hop) + (pp > 1 ? turns * hop : 0);
      double tokens = w.batch * (decode ? 1.0 : double(w.seq));
      plan.tokensPerSecond = tokens / plan.stepTime;
      plan.tokensPerSecondPerDevice = plan.tokensPerSecond / cluster.numDevices();
      plan.mfu = flopsPerToken * tokens / (plan.stepTime * cluster.numDevices() * peak);
      // Reading the weights once per microbatch and stage: the stages in
      // turn (one microbatch), or the slowest stage m times.
      double slowestWeights = 0;
      for (const Part &part : stages)
        slowestWeights = std::max(slowestWeights, part.weights);
      plan.weightReadBound = std::max(all.weights, micro * slowestWeights) / cluster.memoryBandwidth();
      if (w.latencyBound > 0 && plan.stepTime > w.latencyBound)
        plan.fits = false;
      plan.objective = w.objective == Objective::Latency ? plan.stepTime
                                                         : -plan.tokensPerSecondPerDevice;
      countCollectives(plan, plans);
      record(plan);
      out.push_back(std::move(plan));
    }
}

std::string Search::pinnedRefusals(int64_t n, int64_t experts) const {
  std::string why;
  int64_t pinned = 1;
  for (const std::optional<int64_t> &d : {w.tp, w.pp, w.dp, w.ep, w.cp})
    pinned *= d.value_or(1);
  if (n % pinned)
    why += formatv("; the pinned degrees' product ({0}) does not divide the {1} devices", pinned, n).str();
  if (w.pp && *w.pp > std::max<int64_t>(model.numDecoderLayers, 1))
    why += formatv("; pp={0} is more stages than the model's {1} decoder layer(s)", *w.pp, model.numDecoderLayers)
               .str();
  if (w.pp && *w.pp > 1 && cluster.profile.pipelineEvenSplit && model.numDecoderLayers % *w.pp)
    why += formatv("; pp={0} does not divide the model's {1} decoder layers, which the profile's stack "
                   "(pipeline_even_split) splits evenly",
                   *w.pp, model.numDecoderLayers)
               .str();
  if (w.tp && (*w.tp > cluster.devicesPerNode || cluster.devicesPerNode % *w.tp))
    why += formatv("; tp={0} does not divide a node's {1} devices", *w.tp, cluster.devicesPerNode).str();
  if (w.cp && *w.cp > 1) {
    if (w.kind == WorkloadKind::Decode || model.cachedTokens > 0)
      why += formatv("; cp={0} splits a prompt or a training sequence, not a step over a KV cache", *w.cp).str();
    else if (shifts)
      why += formatv("; cp={0} cannot split multi-token prediction's shifted sequences", *w.cp).str();
    else if (w.seq % *w.cp)
      why += formatv("; cp={0} does not divide the sequence ({1})", *w.cp, w.seq).str();
  }
  if (w.ep && *w.ep > 1 && (!experts || experts % *w.ep))
    why += experts ? formatv("; ep={0} does not divide the model's {1} experts", *w.ep, experts).str()
                   : formatv("; ep={0}: the model has no routed experts", *w.ep).str();
  if (w.etp && !experts)
    why += formatv("; etp={0}: the model has no routed experts", *w.etp).str();
  if (w.etp && *w.etp > 1 && w.tp && *w.etp != *w.tp)
    why += formatv("; etp={0} (the experts' tensor parallelism) must be 1 or the tp ({1})", *w.etp, *w.tp).str();
  if (w.etp && *w.etp == 1 && w.tp.value_or(2) > 1 && experts) {
    if (!train())
      why += "; etp=1 (the experts folded over the TP ranks) is costed for training only";
    else if (w.cp.value_or(1) > 1 || w.sequenceParallel == false)
      why += "; etp=1 (the experts folded over the TP ranks) needs sequence parallelism and no cp";
    else if (opt.lowering)
      why += "; etp=1 (the experts folded over the TP ranks) is a what-if parax's runtime does not run";
  }
  int64_t replicas = w.dp.value_or(1) * w.ep.value_or(1);
  if ((w.dp || w.ep) && (train() ? w.batch % replicas != 0 : replicas > w.batch))
    why += formatv(train() ? "; the batch ({0}) does not divide into dp x ep = {1} replicas"
                           : "; the batch ({0}) is smaller than dp x ep = {1} replicas",
                   w.batch, replicas)
               .str();
  return why;
}

PlanResult Search::run() {
  auto begin = std::chrono::steady_clock::now();
  PlanResult result;
  int64_t n = cluster.numDevices();
  result.devices = n;
  result.params = model.params;
  result.activeParams = model.activeParams;
  result.paramBytes = model.paramBytes;
  result.kvBytesPerToken = model.kvCacheBytesPerToken(dtypeBytes(w.kvDtype));
  result.decoderLayers = model.numDecoderLayers;
  result.modelFlopsPerToken =
      w.kind == WorkloadKind::Decode ? modelFlopsPerToken(w.context + 1, 1)
                                     : modelFlopsPerToken(w.seq, w.seq);
  // A generation step's chunk (--cache C --seq P, the prefill of a
  // generation loop) may be planned as a prefill of P tokens: its chunk
  // attends to itself (the first chunk; later ones also read the cache).
  bool prefillChunk = (model.cacheCapacity > 0 || model.ringCaches) && w.kind == WorkloadKind::Prefill &&
                      (model.cacheCapacity == 0 || w.seq <= model.cacheCapacity);
  if (model.cachedTokens > 0 && w.kind != WorkloadKind::Decode && !prefillChunk) {
    result.explanation =
        formatv("this graph is a step over a KV cache of {0} tokens (built with --past or "
                "--cache): plan it with a decode "
                "workload (decode:batch=B,context={0}){2}, not '{1}'",
                model.cachedTokens, w.toString(),
                model.cacheCapacity > 0 ? formatv(", or as a prefill chunk (prefill:batch=B,seq=P, P <= {0})",
                                                  model.cacheCapacity).str()
                                        : std::string())
            .str();
    return result;
  }
  if (!w.gemmDtype.empty() && cluster.peak(w.gemmDtype) <= 0) {
    result.explanation =
        formatv("gemm={0}: the cluster's device ({1}) has no {0} figure in "
                "its peak_tflops",
                w.gemmDtype, cluster.device)
            .str();
    return result;
  }
  int64_t experts = 0;
  for (const LayerGraph &layer : model.layers)
    for (const OpNode &op : layer.ops)
      if (op.kind == OpClass::Experts)
        experts = op.numExperts;

  std::vector<Plan> all;
  bool epHeldToBatch = false; // an ep skipped: it does not divide the IR's batch
  for (int64_t tp : divisorsOf(n)) {
    if (tp > cluster.devicesPerNode || cluster.devicesPerNode % tp)
      continue; // tensor parallelism stays inside a node
    if (w.tp && *w.tp != tp)
      continue;
    for (int64_t pp : divisorsOf(n / tp)) {
      if (pp > std::max<int64_t>(model.numDecoderLayers, 1) || (w.pp && *w.pp != pp))
        continue;
      if (pp > 1 && cluster.profile.pipelineEvenSplit && model.numDecoderLayers % pp)
        continue; // the stack splits the layers evenly
      for (int64_t cp : divisorsOf(n / tp / pp)) {
        // Context parallelism splits a long prompt or training sequence
        // (not a decode step's one token, not a step over a KV cache) into
        // pieces of at least kMinContextPiece tokens unless pinned. (An
        // MoE layer routes [B x S] tokens: one sequence a microbatch.)
        // (A shift of the tokens, multi-token prediction's, needs each
        // sequence whole.)
        if (cp > 1 && (w.kind == WorkloadKind::Decode || model.cachedTokens > 0 || shifts ||
                       w.seq % cp || (!w.cp && w.seq / cp < kMinContextPiece)))
          continue;
        if (w.cp && *w.cp != cp)
          continue;
        int64_t rest = n / tp / pp / cp;
        for (int64_t ep : divisorsOf(rest)) {
          if (ep > 1 && (!experts || experts % ep))
            continue;
          if (ep > 1 && opt.epDivides && opt.epDivides % ep) {
            epHeldToBatch = true;
            continue;
          }
          if (w.ep && *w.ep != ep)
            continue;
          int64_t dp = rest / ep;
          if (w.dp && *w.dp != dp)
            continue;
          if (train())
            evaluateTrain(tp, pp, dp, ep, cp, all);
          else
            evaluateInference(tp, pp, dp, ep, cp, all);
        }
      }
    }
  }
  result.evaluated = evaluated;

  // Ties go to the simpler plan: fewer stages, 1F1B before interleaved
  // before GPipe, lower ZeRO stage, less recompute.
  auto rank = [](Schedule s) {
    return s == Schedule::OneFOneB ? 0 : s == Schedule::Interleaved ? 1 : 2;
  };
  auto order = [&](const Plan &a, const Plan &b) {
    return std::make_tuple(a.objective, a.pp, a.dp, a.ep, a.cp, a.tp, a.microBatch,
                           rank(a.schedule), a.virtualStages, a.zero,
                           int(a.recompute), a.sequenceParallel) <
           std::make_tuple(b.objective, b.pp, b.dp, b.ep, b.cp, b.tp, b.microBatch,
                           rank(b.schedule), b.virtualStages, b.zero,
                           int(b.recompute), b.sequenceParallel);
  };
  // (moved out: `all` is read below only when none fits)
  std::vector<Plan> feasible;
  for (Plan &plan : all)
    if (plan.fits)
      feasible.push_back(std::move(plan));
  llvm::sort(feasible, order);
  if (feasible.size() > static_cast<size_t>(opt.topK))
    feasible.resize(opt.topK);
  result.plans = std::move(feasible);

  if (result.plans.empty()) {
    if (all.empty()) {
      result.explanation =
          formatv("no configuration applies: the batch ({0}) must cover the "
                  "data-parallel replicas (dp x ep; divide them, for training) "
                  "and {1} devices must factor into pp x dp x ep x cp x tp with tp "
                  "inside a {2}-device node (cp dividing the sequence; under an MoE "
                  "model, with one sequence a microbatch; none with multi-token "
                  "prediction)",
                  w.batch, n, cluster.devicesPerNode)
              .str();
      if (epHeldToBatch)
        result.explanation += formatv("; ep must divide the IR's batch ({0}): each EP rank runs its "
                                      "own sequences of it",
                                      opt.epDivides)
                                  .str();
      result.explanation += pinnedRefusals(n, experts);
      result.explanation += interleavedRefused;
    } else {
      // The least overflowing plan, and what overflows.
      const Plan *closest = nullptr;
      double bestRatio = kInf;
      for (const Plan &plan : all) {
        double ratio = (plan.memory.total() - plan.memory.reserved) / plan.capacity;
        if (w.latencyBound > 0 && ratio <= 1)
          ratio = plan.stepTime / w.latencyBound; // fits, but too slow
        if (ratio < bestRatio || (ratio == bestRatio && order(plan, *closest))) {
          bestRatio = ratio;
          closest = &plan;
        }
      }
      result.closest = *closest;
      const MemoryBreakdown &m = closest->memory;
      double over = m.total() - m.reserved - closest->capacity;
      std::pair<const char *, double> terms[] = {
          {"weights", m.weights},         {"gradients", m.gradients},
          {"optimizer state", m.optimizer}, {"activations", m.activations},
          {"KV cache", m.kvCache}};
      auto largest = *llvm::max_element(
          terms, [](auto &a, auto &b) { return a.second < b.second; });
      if (over > 0)
        result.explanation =
            formatv("nothing fits in {0:F1} GB per device ({1:F1} GB usable): "
                    "the least demanding plan ({2}) needs {3:F1} GB, {4:F1} GB "
                    "over; its largest term is {5} ({6:F1} GB)",
                    cluster.hbmBytes / 1e9, closest->capacity / 1e9,
                    closest->degrees(), (m.total() - m.reserved) / 1e9,
                    over / 1e9, largest.first, largest.second / 1e9)
                .str();
      else
        result.explanation =
            formatv("every plan that fits misses the latency bound of {0:F2} ms; "
                    "the fastest ({1}) takes {2:F2} ms",
                    w.latencyBound * 1e3, closest->degrees(),
                    closest->stepTime * 1e3)
                .str();
    }
  }
  result.searchSeconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - begin).count();
  return result;
}

} // namespace

// Stage boundaries by dynamic programming over the layer sequence:
// best[s][i] = the smallest possible slowest-stage time when stages 0..s-1
// hold layers [0, i). best[s][i] = min_j max(best[s-1][j], T(j, i)) over the
// j whose stage fits in memory. best[s-1][.] grows with j and T(., i) shrinks,
// so the minimum is where they cross: found by bisection, O(pp · L · log L).
std::vector<int64_t> parax::plan::partitionStages(
    llvm::ArrayRef<double> layerTime, llvm::ArrayRef<double> layerStates,
    llvm::ArrayRef<double> layerActivations,
    llvm::function_ref<double(int64_t)> inflight, double capacity, int64_t pp,
    double &maxStage) {
  int64_t n = layerTime.size();
  maxStage = kInf;
  if (pp < 1 || pp > n)
    return {};
  std::vector<double> time(n + 1, 0), states(n + 1, 0), acts(n + 1, 0);
  for (int64_t i = 0; i < n; ++i) {
    time[i + 1] = time[i] + layerTime[i];
    states[i + 1] = states[i] + layerStates[i];
    acts[i + 1] = acts[i] + layerActivations[i];
  }
  auto fits = [&](int64_t s, int64_t j, int64_t i) {
    return states[i] - states[j] + inflight(s) * (acts[i] - acts[j]) <= capacity;
  };
  std::vector<std::vector<double>> best(pp + 1, std::vector<double>(n + 1, kInf));
  std::vector<std::vector<int64_t>> from(pp + 1, std::vector<int64_t>(n + 1, -1));
  best[0][0] = 0;
  for (int64_t s = 1; s <= pp; ++s) {
    for (int64_t i = s; i <= n - (pp - s); ++i) {
      // Feasible j: [s-1, i-1]; memory needs j large enough (monotone).
      int64_t lo = s - 1, hi = i - 1;
      if (!fits(s - 1, hi, i))
        continue;
      int64_t a = lo, b = hi;
      while (a < b) { // smallest j that fits
        int64_t mid = (a + b) / 2;
        if (fits(s - 1, mid, i))
          b = mid;
        else
          a = mid + 1;
      }
      lo = a;
      // Smallest j in [lo, hi] with best[s-1][j] >= T(j, i).
      b = hi;
      while (a < b) {
        int64_t mid = (a + b) / 2;
        if (best[s - 1][mid] >= time[i] - time[mid])
          b = mid;
        else
          a = mid + 1;
      }
      for (int64_t j : {a - 1, a}) {
        if (j < lo || j > hi)
          continue;
        double v = std::max(best[s - 1][j], time[i] - time[j]);
        if (v < best[s][i]) {
          best[s][i] = v;
          from[s][i] = j;
        }
      }
    }
  }
  maxStage = best[pp][n];
  if (!std::isfinite(maxStage))
    return {};
  std::vector<int64_t> starts(pp);
  int64_t i = n;
  for (int64_t s = pp; s >= 1; --s) {
    starts[s - 1] = from[s][i];
    i = from[s][i];
  }
  return starts;
}

std::vector<int64_t> parax::plan::interleavedChunks(llvm::ArrayRef<int64_t> layersPerStage,
                                                   int64_t chunks) {
  int64_t pp = layersPerStage.size();
  if (pp == 0 || chunks < 1 || llvm::any_of(layersPerStage, [&](int64_t n) { return n < chunks; }))
    return {};
  std::vector<int64_t> starts;
  for (int64_t c = 0, first = 0; c < pp * chunks; ++c) {
    starts.push_back(first);
    int64_t n = layersPerStage[c % pp], j = c / pp;
    first += n / chunks + (j < n % chunks ? 1 : 0);
  }
  return starts;
}

int64_t Plan::stageOfLayer(int64_t layer, int64_t index) const {
  if (!chunkStart.empty()) {
    if (index < 0)
      return 0;
    return std::upper_bound(chunkStart.begin(), chunkStart.end(), index) - chunkStart.begin() - 1;
  }
  auto after = std::upper_bound(stageStart.begin(), stageStart.end(), layer);
  return std::max<int64_t>(0, after - stageStart.begin() - 1);
}

Plan Plan::withDegrees(int64_t pp, int64_t dp, int64_t ep, int64_t tp,
                       bool sequenceParallel) {
  Plan plan;
  plan.pp = pp;
  plan.dp = dp;
  plan.ep = ep;
  plan.tp = tp;
  plan.sequenceParallel = sequenceParallel;
  return plan;
}

std::string Plan::degrees() const {
  std::string text = formatv("pp{0} dp{1} ep{2} ", pp, dp, ep).str();
  if (cp > 1)
    text += formatv("cp{0} ", cp).str();
  text += formatv("tp{0}", tp).str();
  if (sequenceParallel)
    text += " sp";
  if (expertsFolded)
    text += " etp1";
  return text;
}

// The cluster as the workload runs on it: its pinned attention kernel over
// the profile's (a materialised one, when the profile has no figure for
// its bytes, moves Megatron-LM's 13 a score: docs/cost-model.md).
static ClusterSpec withPins(const ClusterSpec &cluster, const Workload &workload) {
  ClusterSpec out = cluster;
  if (workload.attention) {
    out.profile.attention = *workload.attention;
    if (*workload.attention == AttentionKernel::Materialized && out.profile.scoreBytes <= 0)
      out.profile.scoreBytes = 13;
  }
  return out;
}

// The parallelisms the profile's stack lacks, pinned off unless the
// workload pins them.
static Workload withStackLimits(Workload workload, const Profile &profile) {
  if (!profile.sequenceParallel && !workload.sequenceParallel)
    workload.sequenceParallel = false;
  if (!profile.contextParallel && !workload.cp)
    workload.cp = 1;
  return workload;
}

Workload parax::plan::resolveWorkload(Workload workload, const ModelGraph &model) {
  if (workload.kvDtype.empty())
    workload.kvDtype = model.cacheDtype.empty() ? "bf16" : model.cacheDtype;
  return workload;
}

PlanResult parax::plan::searchPlans(const ModelGraph &model,
                                    const ClusterSpec &pinnedCluster,
                                    const Workload &asked,
                                    const PlanOptions &options) {
  ClusterSpec cluster = withPins(pinnedCluster, asked);
  const Workload workload = withStackLimits(resolveWorkload(asked, model), cluster.profile);
  PlanResult result = Search(model, cluster, workload, options).run();
  // Nothing even to explain by (every configuration's pipeline stages fit
  // in no split of the layers): again, keeping those with the split that
  // needs the least memory (the answer used to be that no configuration
  // applies).
  if (result.plans.empty() && !result.closest && !options.keepUnfitStages) {
    PlanOptions unfit = options;
    unfit.keepUnfitStages = true;
    PlanResult again = Search(model, cluster, workload, unfit).run();
    if (again.closest)
      result = std::move(again);
  }
  if (!result.plans.empty() || !options.explainInfeasible || !result.closest)
    return result;
  // The smallest change that fits: more nodes (doubling), and for inference
  // a smaller batch.
  PlanOptions quiet = options;
  quiet.explainInfeasible = false;
  quiet.topK = 1;
  auto started = std::chrono::steady_clock::now();
  for (int64_t factor = 2; factor <= 64; factor *= 2) {
    ClusterSpec bigger = cluster;
    bigger.nodes = cluster.nodes * factor;
    PlanResult retry = Search(model, bigger, workload, quiet).run();
    if (!retry.plans.empty()) {
      const Plan &p = retry.plans.front();
      result.explanation +=
          formatv(". Smallest change that fits: {0} nodes ({1} devices), e.g. "
                  "{2} at {3:F3} s per step",
                  bigger.nodes, bigger.numDevices(), p.degrees(), p.stepTime)
              .str();
      break;
    }
  }
  // An MoE model: an expert capacity (the largest of a few that fits)
  // shrinks the dispatched rows of every EP plan.
  bool experts = llvm::any_of(model.layers,
                              [](const LayerGraph &l) { return l.hasExperts; });
  if (experts && !workload.expertCapacity)
    for (double capacity : {4.0, 2.0, 1.5, 1.25}) {
      Workload capped = workload;
      capped.expertCapacity = capacity;
      PlanResult retry = Search(model, cluster, capped, quiet).run();
      if (!retry.plans.empty() && retry.plans.front().ep > 1) {
        const Plan &p = retry.plans.front();
        result.explanation +=
            formatv("; or on this cluster, capacity={0} (a rank's expert "
                    "dispatch holds {0} x its own tokens' rows, not ep x), "
                    "e.g. {1} at {2:F3} s per step",
                    llvm::format("%g", capacity), p.degrees(), p.stepTime)
                .str();
        break;
      }
    }
  if (workload.kind != WorkloadKind::Train)
    for (int64_t batch = workload.batch / 2; batch >= 1; batch /= 2) {
      Workload smaller = workload;
      smaller.batch = batch;
      PlanResult retry = Search(model, cluster, smaller, quiet).run();
      if (!retry.plans.empty()) {
        result.explanation +=
            formatv("; or on this cluster, batch {0}", batch).str();
        break;
      }
    }
  result.searchSeconds +=
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

std::vector<LayerPlan> parax::plan::layerPlansFor(const ModelGraph &model,
                                                  const ClusterSpec &pinnedCluster,
                                                  const Workload &asked,
                                                  const Plan &plan) {
  ClusterSpec cluster = withPins(pinnedCluster, asked);
  const Workload workload = resolveWorkload(asked, model);
  Search search(model, cluster, workload, PlanOptions());
  double sequences = plan.microBatch; // (inference: a replica's rows over its microbatches)
  TpContext ctx = search.context(plan.tp, plan.ep, plan.sequenceParallel, sequences, plan.cp);
  ctx.foldExperts = plan.expertsFolded;
  std::vector<LayerPlan> out;
  for (size_t l = 0; l < model.layers.size(); ++l)
    out.push_back(search.layerPlan(l, ctx));
  return out;
}
