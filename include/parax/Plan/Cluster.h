//===- Cluster.h - cluster descriptions for the planner ---------*- C++ -*-===//
//
// A cluster: identical devices, `devicesPerNode` per node joined by a fast
// intra-node link (NVLink), nodes joined by a slower scale-out network. All
// figures in SI units (FLOP/s, bytes, bytes/s per device per direction,
// seconds). Presets and their sources: docs/cost-model.md.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_PLAN_CLUSTER_H
#define PARAX_PLAN_CLUSTER_H

#include "parax/Plan/Profile.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <map>
#include <string>
#include <vector>

namespace parax::plan {

struct LinkSpec {
  double bandwidth = 0; // bytes/s per device, one direction (line rate)
  double efficiency = 1; // achievable fraction of `bandwidth` for large messages
  double hopLatency = 0; // seconds per ring step (NCCL Simple protocol)
};

struct ClusterSpec {
  std::string name;
  std::string device;
  int64_t devicesPerNode = 0;
  int64_t nodes = 0;
  std::map<std::string, double> peakFlops; // per dtype: "bf16", "f16", "f32", "fp8"
  double hbmBytes = 0;
  double hbmBandwidth = 0;
  double matmulEfficiency = 1; // achievable fraction of peak for large GEMMs
  /// The same for fp8 GEMMs (their own measured share of the fp8 peak); 0:
  /// matmulEfficiency.
  double fp8MatmulEfficiency = 0;
  /// The share of those rates the slowest device of a node keeps while
  /// every device of the node runs GEMMs at once (they share the board's
  /// power and cooling, and a synchronous step waits for the slowest); 1:
  /// a device's own rate holds.
  double busyNodeMatmulShare = 1;
  /// The share of a GEMM dtype's achievable rate a step gets:
  /// matmulEfficiency, times busyNodeMatmulShare where a node has more
  /// than one device (each busy: the plans use every device).
  double sustainedMatmulEfficiency() const;
  double memoryEfficiency = 1; // achievable fraction of HBM bandwidth
  /// The memory bandwidth a node's devices share (bytes/s), where they
  /// share one memory (CPU cores on a socket's channels); 0: each device
  /// has its own (a GPU's HBM).
  double nodeMemoryBandwidth = 0;
  /// What a device streams at while every device of its node streams:
  /// hbmBandwidth, or its share of the node's memory where that is less.
  double memoryBandwidth() const;
  LinkSpec intraNode;
  LinkSpec interNode;
  double collectiveLatency = 8.4e-6; // fixed launch cost of a collective
  /// Streaming multiprocessors a device (GEMM wave quantisation); 0: unknown
  /// (a profile with gemm_shapes then assumes 108).
  int64_t multiprocessors = 0;
  /// The SMs a device has, an A100's 108 where the cluster does not say.
  int64_t smCount() const { return multiprocessors > 0 ? multiprocessors : 108; }
  /// The software stack that runs on it (not part of the cluster's JSON:
  /// parax-plan --profile, the pass's profile= option).
  Profile profile;

  int64_t numDevices() const { return devicesPerNode * nodes; }
  /// Peak FLOP/s for `dtype`, or 0 when the device has no figure for it.
  double peak(llvm::StringRef dtype) const;
  /// The peak a GEMM in `dtype` is costed at: `peak(dtype)` scaled so that
  /// matmulEfficiency times it is the dtype's achievable rate.
  double gemmPeak(llvm::StringRef dtype) const;
  /// The cluster as JSON (the format parseCluster reads).
  std::string toJson() const;
};

/// Reads a cluster from JSON text (see docs/cost-model.md for the fields).
llvm::Expected<ClusterSpec> parseCluster(llvm::StringRef json,
                                         llvm::StringRef source = "<json>");

/// `PRESET`, `PRESET:nodes=N[,devices_per_node=D]`, or a path to a JSON file.
llvm::Expected<ClusterSpec> resolveCluster(llvm::StringRef spec);

/// Names of the shipped presets, sorted.
std::vector<std::string> clusterPresetNames();

} // namespace parax::plan

#endif // PARAX_PLAN_CLUSTER_H
