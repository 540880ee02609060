//===- Parax.cpp - entry points for compilers that embed parax -----------===//

#include "parax/Parax.h"
#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Partition/Passes.h"
#include "parax/Plan/Passes.h"
#include "parax/Target/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"

using namespace mlir;
using namespace parax;

void parax::buildPlanPartitionPipeline(OpPassManager &pm,
                                       const PipelineOptions &options) {
  ParaxPlanPassOptions plan;
  plan.cluster = options.cluster;
  plan.workload = options.workload;
  pm.addPass(createParaxPlanPass(plan));
  if (!options.partition)
    return;
  pm.addPass(createParaxPartitionPass());
  if (!options.executable.empty()) {
    ParaxWriteExecutablePassOptions write;
    write.output = options.executable;
    pm.addPass(createParaxWriteExecutablePass(write));
  }
}

FailureOr<plan::PlanResult>
parax::planModule(ModuleOp module, const plan::ClusterSpec &cluster,
                  const plan::Workload &workload,
                  const plan::PlanOptions &options) {
  for (auto function : module.getOps<func::FuncOp>()) {
    if (function.isExternal() || function.getBody().getOps<EmbeddingOp>().empty())
      continue;
    FailureOr<plan::ModelGraph> graph = plan::analyzeModel(function);
    if (failed(graph))
      return failure();
    return plan::searchPlans(*graph, cluster, workload, options);
  }
  return module.emitError("no model function (a func.func with a parax.embedding)");
}

FailureOr<plan::PlanResult> parax::planModule(ModuleOp module,
                                              llvm::StringRef clusterSpec,
                                              llvm::StringRef workloadSpec,
                                              const plan::PlanOptions &options) {
  llvm::Expected<plan::ClusterSpec> cluster = plan::resolveCluster(clusterSpec);
  if (!cluster)
    return module.emitError(llvm::toString(cluster.takeError()));
  llvm::Expected<plan::Workload> workload = plan::parseWorkload(workloadSpec);
  if (!workload)
    return module.emitError(llvm::toString(workload.takeError()));
  return planModule(module, *cluster, *workload, options);
}
