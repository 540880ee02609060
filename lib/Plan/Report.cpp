//===- Report.cpp - plans as a readable table and as JSON -----------------===//

#include "parax/Plan/Planner.h"

#include "llvm/ADT/StringMap.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <algorithm>
#include <cmath>
#include <numeric>

using namespace parax::plan;
using llvm::formatv;

static double gb(double bytes) { return bytes / 1e9; }

namespace {
/// Where a grid axis's groups sit: its ranks a node and the nodes a group
/// spans (ranks in grid order [pp, dp, ep, cp, tp], tp fastest, node after
/// node).
struct AxisPlacement {
  const char *axis;
  int64_t size, perNode, nodes;
};
} // namespace

// What an op computes on one device and the rate its forward is costed
// at (OpWork): "  [m x k] x [k x n] bf16, 612 TFLOP/s".
static void printWork(llvm::raw_ostream &os, const OpNode &op, const OpWork &w, llvm::StringRef dtype) {
  if (w.flops <= 0 || w.seconds <= 0)
    return;
  auto count = [](double x) { return formatv("{0}", int64_t(std::llround(x))).str(); };
  std::string batch = w.batch > 1 ? count(w.batch) + " x " : "";
  if (op.kind == OpClass::Attention) {
    std::string mask = op.window > 0 ? formatv(", window {0}", op.window).str() : op.causal ? ", causal" : "";
    os << formatv("  {0}{1} queries over {2} keys{3}, head width {4}", batch, count(w.m), count(w.n), mask,
                  count(w.k));
  } else if (op.kind == OpClass::Experts) {
    os << formatv("  {0}expert(s) of {1} rows: [{1} x {2}] x [{2} x {3}] and back", batch, count(w.m),
                  count(w.k), count(w.n));
  } else {
    os << formatv("  {0}[{1} x {2}] x [{2} x {3}]", batch, count(w.m), count(w.k), count(w.n));
  }
  os << formatv(" {0}, {1:F0} TFLOP/s", dtype, w.flops / w.seconds / 1e12);
  if (w.backwardSeconds > 0) // (its data and weight gradients by their own shapes)
    os << formatv(", backward {0:F2}x", w.backwardSeconds / w.seconds);
}

static std::vector<AxisPlacement> placement(const Plan &p, const ClusterSpec &cluster) {
  std::vector<AxisPlacement> out;
  int64_t stride = 1;
  for (auto [axis, size] : {std::pair<const char *, int64_t>{"tp", p.tp}, {"cp", p.cp}, {"ep", p.ep},
                            {"dp", p.dp}, {"pp", p.pp}}) {
    if (size > 1) {
      Group group = makeGroup(cluster, size, stride);
      out.push_back({axis, size, group.perNode, group.nodes()});
    }
    stride *= size;
  }
  return out;
}

/// What the costs leave out or only suppose, a line each (the report prints
/// them under the stack line; the JSON's `caveats`).
static std::vector<std::string> caveats(const PlanResult &result, const ClusterSpec &cluster,
                                        const Workload &workload) {
  std::vector<std::string> out;
  if (!workload.gemmDtype.empty())
    out.push_back(formatv("the GEMMs costed in {0}: a what-if (parax's runtimes run them in the model's dtype)",
                          workload.gemmDtype)
                      .str());
  if (result.activeParams < result.params && !cluster.profile.isRoofline())
    out.push_back("experts: the host's share (kernel launches, the per-expert token counts read back every "
                  "layer) is not costed; Megatron-Bridge's Qwen3 H100 recipes ran longer steps than costed "
                  "(docs/cost-model.md, Validation)");
  return out;
}

/// The best plan's placement line: each axis within a node or over nodes.
static std::string placementText(const Plan &p, const ClusterSpec &cluster) {
  std::string text;
  for (const AxisPlacement &a : placement(p, cluster))
    text += formatv("{0}{1} {2}: {3}", text.empty() ? "" : "; ", a.axis, a.size,
                    a.nodes == 1    ? std::string("within a node")
                    : a.perNode == 1 ? formatv("one rank a node, over {0} nodes", a.nodes).str()
                                     : formatv("{0} ranks a node, over {1} nodes", a.perNode, a.nodes).str())
                .str();
  return text;
}

static std::string collectivesText(const CollectiveTally<int64_t> &tally) {
  std::string text;
  for (const auto &[kind, count] : tally.byName())
    text += formatv("{0}{1} {2}", text.empty() ? "" : ", ", kind, count).str();
  return text.empty() ? "none" : text;
}

std::string parax::plan::formatPlans(const PlanResult &result,
                                     const ClusterSpec &cluster,
                                     const Workload &workload) {
  std::string text;
  llvm::raw_string_ostream os(text);
  bool train = workload.kind == WorkloadKind::Train;
  os << formatv("cluster   {0}: {1} x {2} ({3} nodes of {4}), {5:F0} GB HBM "
                "each\n",
                cluster.name, result.devices, cluster.device, cluster.nodes,
                cluster.devicesPerNode, gb(cluster.hbmBytes));
  os << formatv("workload  {0}, objective {1}\n", workload.toString(),
                toString(workload.objective));
  os << formatv("stack     {0}\n", cluster.profile.summary());
  for (const std::string &caveat : caveats(result, cluster, workload))
    os << "          " << caveat << "\n";
  os << formatv("model     {0:F2} B parameters ({1:F2} B active per token), "
                "{2:F1} GB; KV cache {3:F1} KiB per token; {4:F2} GFLOP per "
                "token forward\n",
                result.params / 1e9, result.activeParams / 1e9,
                gb(result.paramBytes), result.kvBytesPerToken / 1024,
                result.modelFlopsPerToken / 1e9);
  os << formatv("search    {0} configurations\n\n", result.evaluated);
  if (result.plans.empty()) {
    os << "no plan: " << result.explanation << "\n";
    return text;
  }
  if (train)
    os << formatv("{0,-2} {1,-22} {2,-9} {3,-11} {4,-4} {5,-9} {6,9} {7,6} | "
                  "{8,7} {9,6} {10,6} {11,6} {12,7} {13,7} | {14,7} {15,7} {16,7} "
                  "{17,7} {18,7} {19,7}\n",
                  "#", "degrees", "mbs x m", "schedule", "zero", "recompute",
                  "step s", "MFU", "weights", "grads", "optim", "act", "scratch", "tot/GB",
                  "tp s", "pp s", "dp s", "ep s", "cp s", "bubble");
  else
    os << formatv("{0,-2} {1,-22} {2,-9} {3,11} {4,12} {5,11} | {6,7} {7,6} {8,7} "
                  "{9,7} {10,12} | {11,8} {12,8} {13,8} {14,8}\n",
                  "#", "degrees", "seqs x m", "latency ms", "tok/s/device",
                  "w-read ms", "weights", "KV", "act", "tot/GB", "KV room/rep", "tp ms",
                  "pp ms", "ep ms", "cp ms");
  for (auto [i, p] : llvm::enumerate(result.plans)) {
    const MemoryBreakdown &m = p.memory;
    if (train)
      os << formatv("{0,-2} {1,-22} {2,-9} {3,-11} {4,-4} {5,-9} {6,9:F3} "
                    "{7,5:F1}% | {8,7:F1} {9,6:F1} {10,6:F1} {11,6:F1} {12,7:F1} {13,7:F1} "
                    "| {14,7:F3} {15,7:F3} {16,7:F3} {17,7:F3} {18,7:F3} {19,7:F3}\n",
                    i + 1, p.degrees(),
                    formatv("{0}x{1}", p.microBatch, p.microBatches).str(),
                    p.schedule == Schedule::Interleaved
                        ? formatv("interl.v{0}", p.virtualStages).str()
                        : toString(p.schedule).str(),
                    p.zero, toString(p.recompute), p.stepTime, 100 * p.mfu,
                    gb(m.weights), gb(m.gradients), gb(m.optimizer),
                    gb(m.activations + m.kvCache), gb(m.scratch), gb(m.total() - m.reserved), p.tpComm,
                    p.ppComm, p.dpComm, p.epComm, p.cpComm, p.bubbleTime);
    else
      os << formatv("{0,-2} {1,-22} {2,-9} {3,11:F3} {4,12:F1} {5,11:F3} | "
                    "{6,7:F1} {7,6:F1} {8,7:F1} {9,7:F1} {10,12:F1} | {11,8:F3} {12,8:F3} "
                    "{13,8:F3} {14,8:F3}\n",
                    i + 1, p.degrees(), formatv("{0}x{1}", p.microBatch, p.microBatches).str(),
                    p.stepTime * 1e3,
                    p.tokensPerSecondPerDevice, p.weightReadBound * 1e3,
                    gb(m.weights), gb(m.kvCache), gb(m.scratch + m.activations), gb(m.total() - m.reserved),
                    gb(p.kvRoom), p.tpComm * 1e3, p.ppComm * 1e3, p.epComm * 1e3, p.cpComm * 1e3);
  }
  // What the columns are (issue 48: a table nobody explained).
  const Plan &first = result.plans.front();
  if (train)
    os << formatv("\ncolumns: degrees pp dp ep cp tp (sp: sequence parallelism); mbs x m: sequences a microbatch x "
                  "microbatches a step; schedule 1f1b or interl.vN (interleaved, N model chunks a stage); zero: "
                  "ZeRO stage; step s and MFU (model FLOPs a second over the devices' peak in the GEMMs' dtype); GB a "
                  "device of the fullest stage: weights, gradients, optimizer state, activations, the backend's "
                  "kernel scratch, their sum (tot/GB, without the runtime's {0:F1} GB reserve); the communication "
                  "each step leaves exposed (tp, pp, dp, ep, cp s) and the pipeline's idle time (bubble)\n",
                  gb(first.memory.reserved));
  else
    os << formatv("\ncolumns: degrees pp dp ep cp tp; seqs x m: sequences a microbatch x microbatches; latency "
                  "ms (a step), tokens/s a device, w-read ms (the step's weight-read bound); GB a device: weights, "
                  "KV cache, act (activations and the backend's kernel scratch), their sum (tot/GB, without the runtime's {0:F1} GB "
                  "reserve); KV room/rep: the KV cache one replica's devices hold together (its tp x pp x cp "
                  "devices); the communication each step leaves exposed (tp, pp, ep, cp ms)\n",
                  gb(first.memory.reserved));
  const Plan &best = result.plans.front();
  os << formatv("\nbest: {0}; ", best.degrees());
  if (best.chunkStart.empty()) {
    os << "stages start at layers [";
    for (auto [i, s] : llvm::enumerate(best.stageStart))
      os << (i ? ", " : "") << s;
    os << "] (in the model's layer graph: 0 the embedding, then the decoder layers, the head last)\n";
  } else {
    // What PlanPass builds: virtual stage c's decoder layers on stage c % pp.
    int64_t chunks = best.chunkStart.size();
    os << formatv("interleaved 1F1B: {0} virtual stages, virtual stage c on pipeline stage c % {1}; decoder "
                  "layers of each: [", chunks, best.pp);
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t end = c + 1 < chunks ? best.chunkStart[c + 1] : result.decoderLayers;
      os << (c ? ", " : "") << best.chunkStart[c] << "-" << end - 1;
    }
    os << "] (the prologue with the first, the epilogue with the last)\n";
  }
  if (std::string text = placementText(best, cluster); !text.empty())
    os << formatv("placement (ranks in grid order pp, dp, ep, cp, tp; {0} devices a node): {1}\n",
                  cluster.devicesPerNode, text);
  // The program's batch: a microbatch of each of a replica's EP ranks
  // (the partitioner splits it over them).
  int64_t programBatch = best.microBatch * best.ep;
  std::string perRank =
      best.ep > 1 ? formatv(": {0} on each of its {1} EP ranks", best.microBatch, best.ep).str() : "";
  if (!train && best.microBatches > 1)
    os << formatv("run: {0} microbatches of {1} sequences a replica{2} (build the program with "
                  "batch {1}{3}; parax-run takes {0} x {1} rows a replica as microbatches)\n",
                  best.microBatches, programBatch,
                  workload.kind == WorkloadKind::Decode ? ", each with its own KV cache" : "", perRank);
  else if (best.ep > 1)
    os << formatv("run: build the program with batch {0}{1}\n", programBatch, perRank);
  if (best.expertsFolded)
    os << formatv("experts folded over the TP ranks (etp=1, Megatron's expert_tensor_parallel_size = 1): each "
                  "whole on one of {0} expert ranks (ep {1} x tp {2}), each rank's sequence shard dispatched over "
                  "them; a what-if parax's runtime does not run\n",
                  best.ep * best.tp, best.ep, best.tp);
  if (best.cp > 1)
    os << formatv("context parallelism: each sequence in {0} pieces of {1} tokens; every layer's keys and "
                  "values all-gathered over them ({2}): {3:F3} ms a step\n",
                  best.cp, workload.seq / best.cp,
                  workload.kind == WorkloadKind::Train ? "their gradients reduce-scattered back" : "forward; the results holding the whole sequence too",
                  best.cpComm * 1e3);
  os << formatv("forward collectives per step: decoder layers: {0}; all: {1}\n",
                collectivesText(best.decoderCollectives),
                collectivesText(best.allCollectives));
  os << formatv("memory per device (fullest stage): {0:F1} of {1:F1} GB usable "
                "+ {2:F1} GB reserved\n",
                gb(best.memory.total() - best.memory.reserved),
                gb(best.capacity), gb(best.memory.reserved));
  return text;
}

// A device's memory by kind, in bytes, and their total.
static llvm::json::Object memoryJson(const MemoryBreakdown &m) {
  return llvm::json::Object{{"weights", m.weights},     {"gradients", m.gradients},
                            {"optimizer", m.optimizer}, {"activations", m.activations},
                            {"kv_cache", m.kvCache},    {"scratch", m.scratch},
                            {"reserved", m.reserved},   {"total", m.total()}};
}

llvm::json::Value parax::plan::plansToJson(const PlanResult &result,
                                           const ClusterSpec &cluster,
                                           const Workload &workload) {
  llvm::json::Array plans;
  auto planJson = [&](const Plan &p) {
    llvm::json::Object collectives;
    for (const auto &[kind, count] : p.allCollectives.byName())
      collectives[kind] = count;
    llvm::json::Object decoder;
    for (const auto &[kind, count] : p.decoderCollectives.byName())
      decoder[kind] = count;
    llvm::json::Array stages;
    for (int64_t s : p.stageStart)
      stages.push_back(s);
    return llvm::json::Object{
        {"pp", p.pp}, {"dp", p.dp}, {"ep", p.ep}, {"cp", p.cp}, {"tp", p.tp},
        {"sequence_parallel", p.sequenceParallel}, {"experts_folded", p.expertsFolded},
        {"micro_batch", p.microBatch}, {"micro_batches", p.microBatches},
        {"schedule", toString(p.schedule)}, {"virtual_stages", p.virtualStages},
        {"zero", p.zero}, {"recompute", toString(p.recompute)},
        {"stage_start", std::move(stages)},
        {"chunk_start", llvm::json::Array(p.chunkStart)},
        {"step_time_s", p.stepTime}, {"mfu", p.mfu},
        {"tokens_per_s", p.tokensPerSecond},
        {"tokens_per_s_per_device", p.tokensPerSecondPerDevice},
        {"weight_read_bound_s", p.weightReadBound},
        {"kv_room_bytes", p.kvRoom},
        {"time_s",
         llvm::json::Object{{"compute", p.computeTime}, {"bubble", p.bubbleTime},
                            {"tp_comm", p.tpComm}, {"pp_comm", p.ppComm},
                            {"dp_comm", p.dpComm}, {"ep_comm", p.epComm},
                            {"cp_comm", p.cpComm},
                            {"optimizer", p.optimizerTime}}},
        {"memory_bytes", [&] {
           llvm::json::Object m = memoryJson(p.memory);
           m["usable"] = p.capacity;
           return m;
         }()},
        {"stage_memory_bytes",
         [&] {
           llvm::json::Array perStage;
           for (const MemoryBreakdown &m : p.stageMemory)
             perStage.push_back(memoryJson(m));
           return perStage;
         }()},
        {"stage_forward_s", llvm::json::Array(p.stageForward)},
        {"stage_backward_s", llvm::json::Array(p.stageBackward)},
        {"transfer_s", p.transferTime},
        {"placement",
         [&] {
           llvm::json::Object axes;
           for (const AxisPlacement &a : placement(p, cluster))
             axes[a.axis] = llvm::json::Object{{"size", a.size}, {"ranks_per_node", a.perNode}, {"nodes", a.nodes}};
           return axes;
         }()},
        {"tp_collective_bytes_per_microbatch",
         [&] {
           llvm::json::Object bytes;
           for (const auto &[kind, b] : p.tpCollectiveBytes.byName())
             bytes[kind] = b;
           return bytes;
         }()},
        {"collectives_per_step", std::move(collectives)},
        {"decoder_collectives_per_step", std::move(decoder)}};
  };
  for (const Plan &p : result.plans)
    plans.push_back(planJson(p));
  llvm::json::Object root{
      {"cluster", cluster.name},
      {"devices", result.devices},
      {"workload", workload.toString()},
      {"objective", toString(workload.objective)},
      {"profile", llvm::json::Object{{"name", cluster.profile.name},
                                     {"description", cluster.profile.description},
                                     {"assumptions", cluster.profile.summary()}}},
      {"model", llvm::json::Object{{"parameters", result.params},
                                   {"active_parameters", result.activeParams},
                                   {"parameter_bytes", result.paramBytes},
                                   {"kv_bytes_per_token", result.kvBytesPerToken},
                                   {"flops_per_token", result.modelFlopsPerToken}}},
      {"evaluated", result.evaluated},
      {"caveats", llvm::json::Array(caveats(result, cluster, workload))},
      {"plans", std::move(plans)}};
  if (result.plans.empty()) {
    root["explanation"] = result.explanation;
    if (result.closest)
      root["closest"] = planJson(*result.closest);
  }
  return root;
}

std::string parax::plan::explainPlan(const ModelGraph &model, const ClusterSpec &cluster,
                                     const Workload &workload, const Plan &plan) {
  std::string text;
  llvm::raw_string_ostream os(text);
  const Profile &profile = cluster.profile;
  auto link = [](const LinkSpec &l) {
    return formatv("{0:F1} GB/s x {1:F2}, {2:F1} us a ring step", l.bandwidth / 1e9, l.efficiency,
                   l.hopLatency * 1e6)
        .str();
  };
  os << formatv("\nexplain: {0}\n", plan.degrees());
  double busy = cluster.sustainedMatmulEfficiency() / cluster.matmulEfficiency;
  os << formatv("  device: {0} TFLOP/s ({1}) x matmul efficiency {2:F3}{7}{3}; HBM {4:F1} GB/s x {5:F2}{6}\n",
                peakFlops(cluster, model.dtype) / 1e12, model.dtype, cluster.matmulEfficiency,
                profile.gemmShapes ? formatv(" x the GEMM's shape ({0} SMs)", cluster.multiprocessors).str()
                                   : std::string(),
                cluster.memoryBandwidth() / 1e9, cluster.memoryEfficiency,
                cluster.memoryBandwidth() < cluster.hbmBandwidth
                    ? formatv(" (the node's {0:F1} GB/s shared by its {1} devices; {2:F1} a device alone)",
                              cluster.nodeMemoryBandwidth / 1e9, cluster.devicesPerNode, cluster.hbmBandwidth / 1e9)
                          .str()
                    : std::string(),
                busy != 1 ? formatv(" x {0:F3} (the slowest of a node's {1} devices, all busy)", busy,
                                    cluster.devicesPerNode)
                                .str()
                          : std::string());
  os << formatv("  links: in a node {0}; between nodes {1}; {2:F1} us a collective's launch\n",
                link(cluster.intraNode), link(cluster.interNode), cluster.collectiveLatency * 1e6);
  os << "  " << profile.summary() << "\n";
  os << formatv("  profile: passes norm {0:G}, rope {1:G}, swiglu {2:G}, activations {3:G}, add/mul {4:G}, "
                "cross-entropy {5:G}; experts at {6:G} of the GEMM rate, {8}{9}; optimizer {7:G} bytes a "
                "parameter\n",
                profile.normPasses, profile.ropePasses, profile.swigluPasses, profile.unaryPasses,
                profile.addPasses, profile.crossEntropyPasses, profile.expertsEfficiency, profile.optimizerBytes,
                profile.expertGemmStreams > 0
                    ? formatv("a GEMM an expert, {0} at once", profile.expertGemmStreams).str()
                    : std::string("one grouped kernel"),
                profile.expertImbalance != 1
                    ? formatv(", the busiest EP rank's {0:F3}x the mean's", profile.expertImbalance).str()
                    : std::string());
  os << formatv("  profile: selective recomputation re-runs {0}; fp8 quantisation {1:G} passes an activation, "
                "{2:G} over the weights; {3:G} of the SMs to compute; the expert dispatch {4}{8}, {5}; "
                "the loss {6:G} logits-sized buffer(s) more; {7}\n",
                profile.selectiveRecompute == SelectiveRecompute::Runtime         ? "what parax's runtime does"
                : profile.selectiveRecompute == SelectiveRecompute::CoreAttention ? "the core attention"
                : profile.selectiveRecompute == SelectiveRecompute::None          ? "nothing (the stack has none)"
                                                                                  : "all but the attention and every other GEMM",
                profile.fp8ActivationPasses, profile.fp8WeightPasses, profile.computeShare,
                profile.epNodeDispatch ? "once a node" : "one copy an expert",
                profile.epOverlapCompute
                    ? std::string("hidden up to another microbatch's compute") +
                          (profile.epOverlapSms > 0
                               ? formatv(" (on {0} SMs, slowing the compute beside it)", profile.epOverlapSms).str()
                               : std::string())
                    : formatv("{0:G} of it hidden", profile.epOverlap).str(),
                profile.lossBuffers,
                profile.runtimeBuffers ? "parax's runtime's scratch and staging held" : "no runtime scratch",
                profile.epDispatchFp8 ? "" : " in the model's dtype under fp8");
  std::vector<LayerPlan> plans = layerPlansFor(model, cluster, workload, plan);
  os << formatv("  each distinct layer, forward, one microbatch of {0} sequence(s) on one device (ms):\n",
                plan.microBatch);
  llvm::StringMap<bool> shown;
  for (size_t l = 0; l < model.layers.size(); ++l) {
    const LayerGraph &layer = model.layers[l];
    if (!shown.try_emplace(layer.signature, true).second)
      continue;
    int64_t same = llvm::count_if(model.layers, [&](const LayerGraph &g) { return g.signature == layer.signature; });
    const LayerPlan &lp = plans[l];
    os << formatv("    layer {0} ({1} like it): compute {2:F3}, tensor-parallel collectives {3:F3}\n", layer.index,
                  same, lp.computeTime * 1e3, lp.commTime * 1e3);
    for (size_t i = 0; i < layer.ops.size() && i < lp.opTimes.size(); ++i) {
      for (const CollectiveUse &use : lp.collectives)
        if (use.opIndex == static_cast<int>(i))
          os << formatv("      {0,-24} {1,-22} {2,9:F3}  ({3:F2} MB)\n", toString(use.kind), "", use.seconds * 1e3,
                        use.bytes / 1e6);
      std::string name = layer.ops[i].op ? layer.ops[i].op->getName().getStringRef().str() : "?";
      os << formatv("      {0,-24} {1,-22} {2,9:F3}", name, lp.strategy[i], lp.opTimes[i] * 1e3);
      if (i < lp.opWork.size())
        printWork(os, layer.ops[i], lp.opWork[i], lp.opWork[i].gemmDtype ? workload.gemmDtype : model.dtype);
      os << "\n";
    }
    for (const CollectiveUse &use : lp.collectives)
      if (use.opIndex >= static_cast<int>(layer.ops.size()))
        os << formatv("      {0,-24} {1,-22} {2,9:F3}  ({3:F2} MB, closing the layer)\n", toString(use.kind), "",
                      use.seconds * 1e3, use.bytes / 1e6);
  }
  if (plan.pp > 1)
    os << formatv("  pipeline: each transfer between stages {0:F3} ms (a microbatch's hidden rows{1})\n",
                  plan.transferTime * 1e3,
                  profile.boundaryInPieces(plan.tp, plan.sequenceParallel)
                      ? formatv(", sent in {0} pieces, one a TP rank, and all-gathered over the TP group on arrival",
                                plan.tp)
                            .str()
                      : std::string());
  // The pipeline's formula with its inputs (pipelineTime): each stage's
  // forward and backward of one microbatch, its communication within.
  size_t chunks = static_cast<size_t>(plan.pp * plan.virtualStages);
  if (workload.kind == WorkloadKind::Train && plan.pp > 1 && plan.stageForward.size() == chunks &&
      plan.stageBackward.size() == chunks) {
    std::vector<double> stage(plan.pp, 0);
    for (size_t c = 0; c < chunks; ++c)
      stage[c % plan.pp] += plan.stageForward[c] + plan.stageBackward[c];
    size_t slowest = std::max_element(stage.begin(), stage.end()) - stage.begin();
    double every = std::accumulate(stage.begin(), stage.end(), 0.0);
    double v = double(plan.virtualStages), m = double(plan.microBatches);
    os << formatv("  pipeline: one microbatch's forward and backward {0:F3} to {1:F3} ms a stage (the slowest "
                  "stage {2}); {3} microbatches x {1:F3} + the other stages' {4:F3}{5} = {6:F3} ms\n",
                  *std::min_element(stage.begin(), stage.end()) * 1e3, stage[slowest] * 1e3, slowest,
                  plan.microBatches, (every - stage[slowest]) * 1e3,
                  plan.virtualStages > 1 ? formatv(" / {0} chunks", plan.virtualStages).str() : std::string(),
                  pipelineTime(m, v, stage[slowest], every) * 1e3);
  }
  if (workload.kind == WorkloadKind::Train && plan.zero < 3 && plan.dpSync > 0) {
    std::string buckets;
    if (plan.dpTail > 0) {
      bool overlapped = plan.zero > 0 && profile.dpParamGatherOverlap;
      buckets = formatv(" (in buckets of {0:F1} M parameters; the first stage's first bucket, {1:F2} M, {2}, "
                        "exposed{3})",
                        profile.dpBucketFor(plan.dp) / 1e6,
                        plan.dpTail / 1e6,
                        overlapped ? "reduced after it and gathered before the next forward" : "reduced after it",
                        plan.zero == 0 ? ""
                        : overlapped   ? "; the other gathers behind the first microbatch's forward"
                                       : "; the gathers after the optimizer step, exposed")
                    .str();
    }
    std::string beside =
        plan.dpBeside > 0 ? formatv(" (with {0:F3} ms the compute beside the hidden part loses to its kernels' {1} "
                                    "SMs)",
                                    plan.dpBeside * 1e3, profile.dpOverlapSms)
                                .str()
                          : std::string();
    os << formatv("  data parallel: the step's gradient sync {0:F3} ms ({1}, the gradients at {2} bytes a "
                  "parameter); {3}{5}: {4:F3} ms exposed{6}\n",
                  plan.dpSync * 1e3,
                  plan.zero == 0 ? "all-reduced" : "reduce-scattered, the updated parameters all-gathered",
                  profile.reduceBytes,
                  profile.dpOverlap ? formatv("hidden behind {0:F3} ms of the last backward (less its own "
                                              "collectives' time on the same links)",
                                              plan.dpWindow * 1e3)
                                          .str()
                                    : std::string("after the last backward (the stack does not overlap it)"),
                  plan.dpComm * 1e3, buckets, beside);
  }
  if (workload.kind == WorkloadKind::Train && plan.zero == 3 && plan.dp * plan.ep > 1)
    os << formatv("  data parallel (ZeRO-3): each layer's parameters all-gathered {0} for its forward and "
                  "backward, its gradients reduce-scattered after its backward, beside the compute: {1:F3} ms "
                  "exposed a step{2}\n",
                  profile.zero3Prefetch > 0 ? formatv("{0} layer(s) ahead", profile.zero3Prefetch).str()
                                            : std::string("when it is reached (no prefetch)"),
                  plan.dpComm * 1e3,
                  plan.dpBeside > 0 ? formatv(" (with {0:F3} ms the compute beside the hidden part loses to "
                                              "their kernels' {1} SMs)",
                                              plan.dpBeside * 1e3, profile.dpOverlapSms)
                                          .str()
                                    : std::string());
  os << formatv("  step {0:F3} ms = ", plan.stepTime * 1e3);
  if (workload.kind == WorkloadKind::Train)
    os << formatv("compute {0:F3} + bubble {1:F3} + tp {2:F3} + ep {3:F3} + cp {4:F3} (the slowest stage's {5} "
                  "microbatch(es), training's forward + 2x backward{6}) + pp {7:F3} + exposed dp {8:F3} + "
                  "optimizer {9:F3}\n",
                  plan.computeTime * 1e3, plan.bubbleTime * 1e3, plan.tpComm * 1e3, plan.epComm * 1e3,
                  plan.cpComm * 1e3, plan.microBatches,
                  plan.recompute == Recompute::None ? "" : ", recomputation included", plan.ppComm * 1e3,
                  plan.dpComm * 1e3, plan.optimizerTime * 1e3);
  else
    os << formatv("compute {0:F3} + tp {1:F3} + ep {2:F3} + cp {3:F3} + pp {4:F3} (on the critical path of {5} "
                  "microbatch(es))\n",
                  plan.computeTime * 1e3, plan.tpComm * 1e3, plan.epComm * 1e3, plan.cpComm * 1e3,
                  plan.ppComm * 1e3, plan.microBatches);
  return text;
}
