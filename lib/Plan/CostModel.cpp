//===- CostModel.cpp - time of computation and collectives ----------------===//

#include "parax/Plan/CostModel.h"

#include <algorithm>
#include <cmath>
#include <vector>

using namespace parax::plan;

llvm::StringRef parax::plan::toString(CollectiveKind kind) {
  switch (kind) {
  case CollectiveKind::AllReduce: return "all_reduce";
  case CollectiveKind::AllGather: return "all_gather";
  case CollectiveKind::ReduceScatter: return "reduce_scatter";
  case CollectiveKind::AllToAll: return "all_to_all";
  case CollectiveKind::SendRecv: return "send_recv";
  }
  return "?";
}

Group parax::plan::makeGroup(const ClusterSpec &cluster, int64_t size,
                             int64_t stride) {
  Group group;
  group.size = size;
  int64_t perNode = cluster.devicesPerNode / std::max<int64_t>(stride, 1);
  group.perNode = std::clamp<int64_t>(perNode, 1, size);
  return group;
}

namespace {

// A link's bus bandwidth for the stack's collectives (bytes/s).
double busBandwidth(const ClusterSpec &cluster, const LinkSpec &link) {
  return link.bandwidth * link.efficiency * cluster.profile.collectiveEfficiency;
}

// Ring steps and the bus-bandwidth factor of `kind` over n ranks
// (nccl-tests PERFORMANCE.md; NCCL's tuning.cc step counts).
std::pair<double, double> ringShape(CollectiveKind kind, double n) {
  switch (kind) {
  case CollectiveKind::AllReduce: return {2.0 * (n - 1), 2.0 * (n - 1) / n};
  case CollectiveKind::AllGather:
  case CollectiveKind::ReduceScatter:
  case CollectiveKind::AllToAll: return {n - 1, (n - 1) / n};
  case CollectiveKind::SendRecv: return {1, 1};
  }
  return {0, 0};
}

// NCCL's ring model (docs/cost-model.md, collectives): a launch latency,
// `intraSteps` steps over NVLink and `interSteps` over the network, each
// with its per-step latency, and the bus-bandwidth factor times bytes over
// the ring's bus bandwidth. Two protocols: Simple (full bandwidth) and LL
// (NCCL's 6.6 us launch, about a sixth of Simple's per-step latency, half
// the bandwidth); the faster wins, as NCCL's tuner picks.
double ringTime(const ClusterSpec &cluster, double intraSteps, double interSteps,
                double factor, double bytes, double busBw) {
  double hops = intraSteps * cluster.intraNode.hopLatency + interSteps * cluster.interNode.hopLatency;
  double simple = cluster.collectiveLatency + hops + factor * bytes / busBw;
  if (!cluster.profile.ncclProtocols)
    return simple;
  double ll = 6.6e-6 + hops / 5.7 + factor * bytes / (0.5 * busBw);
  return std::min(simple, ll);
}

} // namespace

double parax::plan::collectiveTime(const ClusterSpec &cluster,
                                   CollectiveKind kind, double bytes,
                                   Group group) {
  if (group.size <= 1 || bytes <= 0)
    return 0;
  double n = group.size, g = group.perNode, k = group.nodes();
  auto [steps, factor] = ringShape(kind, n);
  // (the profile's share for this kind and this message's size: what each
  // bandwidth below carries)
  double share = cluster.profile.kindEfficiency[static_cast<int>(kind)] *
                 cluster.profile.sizeShare(static_cast<int>(kind), bytes);
  factor /= share;
  double intraBw = busBandwidth(cluster, cluster.intraNode);
  if (k <= 1)
    return ringTime(cluster, steps, 0, factor, bytes, intraBw);
  // Across nodes each of a node's g ranks drives its own NIC (rails), so a
  // ring's bus bandwidth is g NICs' unless NVLink is slower.
  double interBw = busBandwidth(cluster, cluster.interNode);
  double ringBw = std::min(intraBw, g * interBw);
  switch (kind) {
  case CollectiveKind::AllGather:
  case CollectiveKind::ReduceScatter:
    // One ring over all n ranks: k of its n - 1 steps leave a node.
    return ringTime(cluster, steps - (k - 1), k - 1, factor, bytes, ringBw);
  case CollectiveKind::AllReduce: {
    double ring = ringTime(cluster, steps - 2 * (k - 1), 2 * (k - 1), factor, bytes, ringBw);
    // NCCL's tree: up and down a chain inside the node and a binary tree
    // over the nodes; 2 S over 0.92 of the bus bandwidth (tuning.cc).
    if (!cluster.profile.ncclProtocols)
      return ring;
    double tree = ringTime(cluster, 2 * (g - 1), 2 * std::ceil(std::log2(k)), 2.0 / share, bytes, 0.92 * ringBw);
    return std::min(ring, tree);
  }
  case CollectiveKind::AllToAll: {
    // The off-node share goes over the NICs, the rest over NVLink, at once.
    double offNode = bytes * (n - g) / n / share, onNode = bytes * (g - 1) / n / share;
    double inter = cluster.collectiveLatency + (k - 1) * cluster.interNode.hopLatency +
                   offNode / interBw;
    double intra = onNode / intraBw;
    return std::max(inter, intra);
  }
  case CollectiveKind::SendRecv:
    return ringTime(cluster, 0, 1, 1, bytes, interBw);
  }
  return 0;
}

double parax::plan::nodeDispatchTime(const ClusterSpec &cluster, double rows, int64_t k, int64_t numGroups,
                                     int64_t topkGroups, Group group) {
  double K = group.nodes(), g = group.perNode;
  // Nodes a token reaches: K (1 - (1 - 1/K)^k) for k uniform experts; with
  // G groups evenly on the nodes, t of them reachable (DeepSeek-V3: 8 on
  // 8 nodes, 4), K (1 - C(G - G/K, t) / C(G, t)) (no chosen group on a
  // given node).
  double nodes = K * (1 - std::pow(1 - 1 / K, double(k)));
  if (numGroups > 1 && numGroups % group.nodes() == 0) {
    double none = 1, perNode = double(numGroups) / K;
    for (int64_t i = 0; i < topkGroups; ++i)
      none *= std::max(0.0, (numGroups - perNode - i) / (numGroups - i));
    nodes = K * (1 - none);
  }
  // Off the node over the NICs, the k copies over NVLink, at once (as the
  // all-to-all's).
  double share = cluster.profile.kindEfficiency[static_cast<int>(CollectiveKind::AllToAll)];
  double inter = cluster.collectiveLatency + (K - 1) * cluster.interNode.hopLatency +
                 rows * nodes * (K - 1) / K / share / busBandwidth(cluster, cluster.interNode);
  double intra = rows * k * (g - 1) / g / share / busBandwidth(cluster, cluster.intraNode);
  return std::max(inter, intra);
}

double parax::plan::peakFlops(const ClusterSpec &cluster, llvm::StringRef dtype) {
  double peak = cluster.peak(dtype);
  return peak > 0 ? peak : cluster.peak("bf16");
}

double parax::plan::pipelineTime(double m, double v, double slowest, double everyStage) {
  return m * slowest + std::max(0.0, everyStage - slowest) / std::max(v, 1.0);
}

double parax::plan::rooflineTime(const ClusterSpec &cluster, double flops,
                                 double bytes, double peak) {
  double compute = flops / (peak * cluster.sustainedMatmulEfficiency());
  double memory = bytes / (cluster.memoryBandwidth() * cluster.memoryEfficiency);
  return std::max(compute, memory) + cluster.profile.kernelOverhead;
}

double parax::plan::gemmTime(const ClusterSpec &cluster, double flops, double bytes, double peak,
                             double m, double n, double k, double batch, double kScale) {
  const Profile &profile = cluster.profile;
  if (profile.gemmShapes) {
    // `batch` independent GEMMs of one shape fill the device together.
    peak *= gemmShapeEfficiency(m * std::max(batch, 1.0), n, k, cluster.smCount(),
                                profile.gemmKOverhead * kScale);
  }
  double compute = flops / (peak * cluster.sustainedMatmulEfficiency());
  double memory = bytes / (cluster.memoryBandwidth() * cluster.memoryEfficiency);
  return std::max(compute, memory) + profile.gemmUnhidden * std::min(compute, memory) + profile.kernelOverhead;
}

double parax::plan::streamedPassOverhead(llvm::ArrayRef<double> gather,
                                         llvm::ArrayRef<double> reduce,
                                         llvm::ArrayRef<double> work, int64_t prefetch,
                                         llvm::ArrayRef<double> held) {
  size_t n = work.size();
  std::vector<double> done(n, 0); // when each layer's gather ends
  double comm = 0, clock = 0, total = 0; // the stream's free time, the compute's
  for (size_t j = 0; j < std::min<size_t>(std::max<int64_t>(prefetch, 0), n); ++j)
    done[j] = comm += gather[j];
  for (size_t j = 0; j < n; ++j) {
    if (prefetch <= 0)
      done[j] = comm = std::max(comm, clock) + gather[j];
    double start = std::max(clock, done[j]);
    if (prefetch > 0 && j + prefetch < n)
      done[j + prefetch] = comm = std::max(comm, start) + gather[j + prefetch];
    clock = start + work[j];
    total += work[j];
    // Link sharing: what the stream runs after `start` gets the links at
    // the rate the layer's own collectives leave, then all of them once
    // the layer ends.
    if (!held.empty() && held[j] > 0) {
      double free = std::max(0.0, work[j] - std::min(held[j], work[j]));
      auto shared = [&](double end) {
        if (end <= start)
          return end;
        double need = end - start;
        return need <= free && free > 0 ? start + need * work[j] / free : clock + need - free;
      };
      for (size_t k = j + 1; k < std::min<size_t>(n, j + 1 + std::max<int64_t>(prefetch, 0)); ++k)
        done[k] = shared(done[k]); // (the gathers issued so far)
      comm = shared(comm);
    }
    if (!reduce.empty())
      comm = std::max(comm, clock) + reduce[j];
  }
  return std::max(clock, comm) - total;
}
