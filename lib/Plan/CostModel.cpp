//===- CostModel.cpp - time of computation and collectives ----------------===//

#include "parax/Plan/CostModel.h"

#include <algorithm>

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

// NCCL's ring model (docs/cost-model.md §collectives): a launch latency, a
// per-step latency, and the bus-bandwidth factor times bytes over the link's
// achievable bandwidth. Two protocols: Simple (full bandwidth, higher
// latency) and LL (low latency, half the bandwidth); the faster one wins, as
// NCCL's tuner picks.
double ringTime(const ClusterSpec &cluster, const LinkSpec &link,
                CollectiveKind kind, double bytes, int64_t n) {
  if (n <= 1 || bytes <= 0)
    return 0;
  double steps = 0, factor = 0;
  switch (kind) {
  case CollectiveKind::AllReduce:
    steps = 2.0 * (n - 1);
    factor = 2.0 * (n - 1) / n;
    break;
  case CollectiveKind::AllGather:
  case CollectiveKind::ReduceScatter:
  case CollectiveKind::AllToAll:
    steps = n - 1;
    factor = double(n - 1) / n;
    break;
  case CollectiveKind::SendRecv:
    steps = 1;
    factor = 1;
    break;
  }
  double bandwidth = link.bandwidth * link.efficiency;
  double simple = cluster.collectiveLatency + steps * link.hopLatency +
                  factor * bytes / bandwidth;
  // LL: NCCL's base 6.6 us and about a sixth of Simple's per-step latency.
  double ll = 6.6e-6 + steps * link.hopLatency / 5.7 +
              factor * bytes / (0.5 * bandwidth);
  return std::min(simple, ll);
}

} // namespace

double parax::plan::collectiveTime(const ClusterSpec &cluster,
                                   CollectiveKind kind, double bytes,
                                   Group group) {
  if (group.size <= 1 || bytes <= 0)
    return 0;
  int64_t g = group.perNode, k = group.nodes();
  if (k <= 1)
    return ringTime(cluster, cluster.intraNode, kind, bytes, group.size);
  if (g <= 1)
    return ringTime(cluster, cluster.interNode, kind, bytes, group.size);
  switch (kind) {
  case CollectiveKind::AllReduce:
    // Reduce-scatter in the node, all-reduce 1/g across nodes, all-gather.
    return ringTime(cluster, cluster.intraNode, CollectiveKind::ReduceScatter,
                    bytes, g) +
           ringTime(cluster, cluster.interNode, CollectiveKind::AllReduce,
                    bytes / g, k) +
           ringTime(cluster, cluster.intraNode, CollectiveKind::AllGather,
                    bytes, g);
  case CollectiveKind::AllGather:
  case CollectiveKind::ReduceScatter:
    return ringTime(cluster, cluster.intraNode, kind, bytes, g) +
           ringTime(cluster, cluster.interNode, kind, bytes / g, k);
  case CollectiveKind::AllToAll: {
    // The off-node share goes over the NICs, the rest over NVLink, at once.
    double n = group.size;
    double offNode = bytes * (n - g) / n, onNode = bytes * (g - 1) / n;
    double inter = cluster.collectiveLatency + (k - 1) * cluster.interNode.hopLatency +
                   offNode / (cluster.interNode.bandwidth * cluster.interNode.efficiency);
    double intra = onNode / (cluster.intraNode.bandwidth * cluster.intraNode.efficiency);
    return std::max(inter, intra);
  }
  case CollectiveKind::SendRecv:
    return ringTime(cluster, cluster.interNode, kind, bytes, 2);
  }
  return 0;
}

double parax::plan::peakFlops(const ClusterSpec &cluster, llvm::StringRef dtype) {
  double peak = cluster.peak(dtype);
  return peak > 0 ? peak : cluster.peak("bf16");
}

double parax::plan::rooflineTime(const ClusterSpec &cluster, double flops,
                                 double bytes, double peak) {
  double compute = flops / (peak * cluster.matmulEfficiency);
  double memory = bytes / (cluster.hbmBandwidth * cluster.memoryEfficiency);
  return std::max(compute, memory);
}
