//===- Parax.h - the entry header for compilers that embed parax -*- C++ -*-===//
//
// One include for the stable entry points (docs/embedding.md):
//
//   mlir::DialectRegistry registry;
//   parax::registerAllDialects(registry);          // parax, func, shard, ...
//   parax::registerAllPasses();                    // for textual pipelines
//
//   mlir::PassManager pm(&context);
//   parax::buildPlanPartitionPipeline(pm, {"dgx-h100:nodes=4",
//                                          "train:batch=256,seq=4096"});
//   pm.run(module);                                // plan, then partition
//
//   auto plans = parax::planModule(module, "dgx-h100:nodes=4", "decode:batch=8,context=4096");
//   plans->plans.front().stepTime ...              // ranked plans as C++ values
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_PARAX_H
#define PARAX_PARAX_H

#include "parax/InitAll.h"
#include "parax/Plan/Planner.h"
#include "parax/Target/Executable.h"

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/PassManager.h"

#include <string>

namespace parax {

struct PipelineOptions {
  /// Cluster preset (`PRESET[:nodes=N]`) or JSON file.
  std::string cluster = "dgx-h100";
  /// `train:...`, `prefill:...` or `decode:...` (docs/planner.md).
  std::string workload = "train:batch=8,seq=2048";
  /// Add --parax-partition after the planner.
  bool partition = true;
  /// When set (and partitioning), also write the .pxe executable there.
  std::string executable;
};

/// Adds --parax-plan (and --parax-partition, and --parax-write-executable)
/// to `pm`.
void buildPlanPartitionPipeline(mlir::OpPassManager &pm,
                                const PipelineOptions &options);

/// Ranks plans for the first model function of `module` (a func.func with a
/// parax.embedding). Fails with an error on the module for a bad cluster,
/// workload or model; an infeasible model returns no plans and an
/// explanation in the result.
mlir::FailureOr<plan::PlanResult> planModule(mlir::ModuleOp module,
                                             const plan::ClusterSpec &cluster,
                                             const plan::Workload &workload,
                                             const plan::PlanOptions &options = {});
/// The same with the cluster and workload given as text.
mlir::FailureOr<plan::PlanResult> planModule(mlir::ModuleOp module,
                                             llvm::StringRef cluster,
                                             llvm::StringRef workload,
                                             const plan::PlanOptions &options = {});

} // namespace parax

#endif // PARAX_PARAX_H
