//===- CostModel.h - time of computation and collectives --------*- C++ -*-===//
//
// Roofline per op and alpha-beta collectives on the link their group spans
// (hierarchical when a group spans nodes). Formulas and sources:
// docs/cost-model.md.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_PLAN_COSTMODEL_H
#define PARAX_PLAN_COSTMODEL_H

#include "parax/Plan/Cluster.h"

#include "llvm/ADT/ArrayRef.h"

namespace parax::plan {

enum class CollectiveKind { AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv };
llvm::StringRef toString(CollectiveKind kind);

/// A communicator group: `size` ranks, `perNode` of them on each node.
struct Group {
  int64_t size = 1;
  int64_t perNode = 1;
  int64_t nodes() const { return (size + perNode - 1) / perNode; }
};

/// The group of `size` ranks spaced `stride` apart in rank order (grid axes
/// inner to it multiply into the stride), on `cluster`'s nodes.
Group makeGroup(const ClusterSpec &cluster, int64_t size, int64_t stride);

/// Seconds for one collective over `bytes` (the full buffer: for all-gather
/// the gathered size, for reduce-scatter the input size, for all-to-all the
/// bytes each rank holds).
double collectiveTime(const ClusterSpec &cluster, CollectiveKind kind,
                      double bytes, Group group);

/// Seconds for one way of an expert dispatch that sends each token once to
/// every other node holding one of its `k` experts (the profile's
/// ep_node_dispatch: DeepSeek's DeepEP), then copies it over NVLink to
/// those experts' ranks; `rows`: the bytes of a rank's tokens, one copy
/// each. Under group-limited routing (`topkGroups` of `numGroups`) whose
/// groups lie evenly on the group's nodes, a token reaches the expected
/// distinct nodes of the groups it may choose; otherwise of k uniform
/// experts.
double nodeDispatchTime(const ClusterSpec &cluster, double rows, int64_t k, int64_t numGroups,
                        int64_t topkGroups, Group group);

/// Peak FLOP/s of `dtype` on the cluster's devices (bf16's when the device
/// lists no figure for it).
double peakFlops(const ClusterSpec &cluster, llvm::StringRef dtype);

/// A training step's pipeline: the slowest stage's `m` microbatches back to
/// back, plus one microbatch's passes through every other stage (the first
/// one's forward reaching the slowest, the last one's backward leaving it),
/// a chunk at a time under interleaving (1/v of them exposed). `slowest`:
/// the slowest stage's forward and backward of one microbatch; `everyStage`:
/// the sum of that over all stages. Equal stages: (m + (pp - 1) / v) x
/// `slowest`, Narayanan et al. 2021's formula.
double pipelineTime(double m, double v, double slowest, double everyStage);

/// Seconds for `flops` of arithmetic at `peak` FLOP/s, reading/writing
/// `bytes` of HBM: the larger of the two, each at its achievable fraction,
/// plus the profile's cost of a kernel.
double rooflineTime(const ClusterSpec &cluster, double flops, double bytes,
                    double peak);

/// rooflineTime for `batch` GEMMs of an (m x k) by (k x n) shape: under a
/// profile with gemm_shapes, at the efficiency of that shape
/// (gemmShapeEfficiency) rather than the cluster's fixed one; the larger
/// of the FLOPs' and the bytes' time plus the profile's gemm_unhidden share
/// of the smaller. `kScale`: the GEMM's dtype's rate over the one the
/// profile's gemm_k_overhead was measured in (a tile's fixed time, in k
/// steps, grows with the rate of a step: fp8 on a bf16 model, 2).
double gemmTime(const ClusterSpec &cluster, double flops, double bytes, double peak,
                double m, double n, double k, double batch = 1, double kScale = 1);

/// One pass over layers, a compute stream beside one communication stream
/// (ZeRO-3 / FSDP): layer j computes for `work[j]` once its `gather[j]` is
/// done; the gather of the layer `prefetch` ahead is issued when a layer
/// starts computing (prefetch 0: when the one before it ends); `reduce[j]`
/// (empty: none) is issued when layer j ends. The stream runs its
/// collectives in the order issued. `held[j]` (empty: none) is how long
/// layer j's own collectives hold the links the stream needs while it
/// computes, spread evenly over its `work[j]`: the stream shares the
/// layer's time at the rate left (link sharing). Returns the pass's time
/// beyond `sum(work)`: what the communication leaves exposed.
double streamedPassOverhead(llvm::ArrayRef<double> gather, llvm::ArrayRef<double> reduce,
                            llvm::ArrayRef<double> work, int64_t prefetch,
                            llvm::ArrayRef<double> held = {});

} // namespace parax::plan

#endif // PARAX_PLAN_COSTMODEL_H
