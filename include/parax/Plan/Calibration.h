//===- Calibration.h - a cluster and profile fitted to measured runs -*- C++ -*-===//
//
// parax-plan --calibrate reads what `parax-run --profile` wrote (each
// instruction's median wall time with its shapes) and fits, by weighted
// least squares on relative error, the figures the planner's formulas use:
//
//   GEMMs (linear, head_linear, linear_weight_grad):
//                            t = max(flops / R, bytes / B) + c
//   plain memory-bound ops (add, mul, ...):  t = bytes / B_plain + c
//   norms, rope, swiglu, activations:        t = bytes / B_class + c
//   attention (prefill):                     t = flops / A + c
//   experts:                                 t = flops / E + c
//   collectives (all_reduce, all_gather, reduce_scatter, all_to_all, the
//   expert exchange over n ranks), on absolute error:
//                            t = L + steps(n) h + factor(n) bytes / W
//
// (c shared: a kernel's overhead; a GEMM's max by fitting each GEMM to the
// term the previous fit says is larger, until that settles). The result is
// a cluster (peak R, HBM bandwidth B, links W, launch L, step latency h;
// every efficiency 1) and a profile (kernel overhead c, flash efficiency
// A / R, experts efficiency E / R, each class's passes B / B_class, the
// optimizer's bytes a parameter from its measured update, no NCCL
// protocols) that parax-plan reads back with --cluster and --profile.
// docs/cost-model.md, "Calibration".
//===----------------------------------------------------------------------===//

#ifndef PARAX_PLAN_CALIBRATION_H
#define PARAX_PLAN_CALIBRATION_H

#include "parax/Plan/Cluster.h"

#include "llvm/ADT/ArrayRef.h"
#include "llvm/Support/Error.h"

#include <string>

namespace parax::plan {

struct Calibration {
  ClusterSpec cluster; // profile inside
  /// One line a fitted class: its figure, its samples, the median and
  /// largest |relative residual|.
  std::string report;
};

/// Fits `base` (its name, device, counts and memory kept) to the run
/// profiles `files` (their JSON text, named by `names` in errors).
llvm::Expected<Calibration> calibrate(const ClusterSpec &base,
                                      llvm::ArrayRef<std::string> files,
                                      llvm::ArrayRef<std::string> names);

} // namespace parax::plan

#endif // PARAX_PLAN_CALIBRATION_H
