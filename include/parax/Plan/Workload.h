//===- Workload.h - what the plan is for ------------------------*- C++ -*-===//

#ifndef PARAX_PLAN_WORKLOAD_H
#define PARAX_PLAN_WORKLOAD_H

#include "parax/Plan/Profile.h"

#include "llvm/ADT/StringRef.h"
#include "llvm/Support/Error.h"

#include <optional>
#include <string>

namespace parax::plan {

enum class WorkloadKind { Train, Prefill, Decode };
enum class Objective { Throughput, Latency };
enum class Schedule { GPipe, OneFOneB, Interleaved };
enum class Recompute { None, Selective, Full };

llvm::StringRef toString(WorkloadKind kind);
llvm::StringRef toString(Objective objective);
llvm::StringRef toString(Schedule schedule);
llvm::StringRef toString(Recompute recompute);

struct Workload {
  WorkloadKind kind = WorkloadKind::Train;
  /// Sequences per step (train: global batch; prefill/decode: concurrent
  /// requests).
  int64_t batch = 0;
  /// Tokens per sequence (train, prefill); the prompt length for prefill.
  int64_t seq = 0;
  /// Decode: tokens already in the KV cache.
  int64_t context = 0;
  /// Train: sequences per microbatch; 0 lets the planner choose.
  int64_t microBatch = 0;
  /// Decode: the KV cache's dtype; empty: the element type of the caches
  /// the graph holds, else bf16 (resolveWorkload).
  std::string kvDtype;
  Objective objective = Objective::Throughput;
  /// Decode/prefill: the step latency must not exceed this (seconds; 0: none).
  double latencyBound = 0;
  // Pin a search dimension (unset: searched).
  std::optional<int> zero;
  std::optional<Recompute> recompute;
  std::optional<Schedule> schedule;
  std::optional<int64_t> chunks; // interleaved 1F1B's model chunks a stage
  std::optional<int64_t> tp, pp, dp, ep, cp;
  /// The experts' tensor parallelism (Megatron's expert_tensor_parallel_size):
  /// the plan's tp (each expert split over the TP ranks like the MLP), or
  /// 1 (each expert whole on one rank, the TP ranks more expert ranks: the
  /// expert all-to-all over ep x tp ranks, each sending its sequence
  /// shard). Unset: searched where the profile's stack folds experts.
  std::optional<int64_t> etp;
  /// Expert parallelism: the rows a rank's expert dispatch holds, as a
  /// multiple of its own (token, choice) pairs (unset: every rank's, which
  /// any routing fits). Less memory; a step that routes more to one rank
  /// stops with an error (no token is dropped).
  std::optional<double> expertCapacity;
  /// The GEMMs' dtype (linear, head_linear, experts: their FLOP/s and the
  /// bytes of the weights they read), empty for the model's own. `fp8`:
  /// DeepSeek-V3's FP8 recipe (see cost-model.md, "FP8 GEMMs").
  std::string gemmDtype;
  /// Sequence parallelism pinned on or off (unset: searched).
  std::optional<bool> sequenceParallel;
  /// The attention kernel's kind, over the profile's.
  std::optional<AttentionKernel> attention;

  std::string toString() const;
};

/// `train:batch=1024,seq=4096[,mbs=1][,zero=1][,recompute=selective]`,
/// `prefill:batch=8,seq=2048`, `decode:batch=64,context=4096[,kv=fp8]`;
/// also `objective=latency|throughput`, `latency_ms=50`, `schedule=1f1b`,
/// `chunks=2` (interleaved 1F1B's model chunks a stage, 2 or more),
/// `capacity=2` (the expert capacity, a number >= 1), `gemm=fp8` (the
/// GEMMs' dtype: fp8, bf16, f16 or f32), `sp=0|1` (sequence parallelism),
/// `attention=flash|materialized` (the kernel kind), and `tp=`, `pp=`,
/// `dp=`, `ep=`, `cp=` to pin degrees, `etp=` the experts' (1 or the tp).
llvm::Expected<Workload> parseWorkload(llvm::StringRef spec);

/// Bytes per element of a dtype name (bf16, f16, f32, fp8, int8), 0 if unknown.
int64_t dtypeBytes(llvm::StringRef dtype);

} // namespace parax::plan

#endif // PARAX_PLAN_WORKLOAD_H
