//===- Parax.cpp - C API of parax ----------------------------------------===//

#include "parax-c/Parax.h"
#include "parax/Parax.h"

#include "mlir/CAPI/IR.h"
#include "mlir/CAPI/Pass.h"
#include "mlir/CAPI/Registration.h"
#include "mlir/CAPI/Support.h"
#include "mlir/IR/Diagnostics.h"
#include "llvm/Support/FormatVariadic.h"

using namespace mlir;

void paraxRegisterAllDialects(MlirDialectRegistry registry) {
  parax::registerAllDialects(*unwrap(registry));
}

void paraxRegisterAllPasses(void) { parax::registerAllPasses(); }

void paraxBuildPlanPartitionPipeline(MlirOpPassManager pm, MlirStringRef cluster,
                                     MlirStringRef workload, bool partition) {
  parax::PipelineOptions options;
  options.cluster = unwrap(cluster).str();
  options.workload = unwrap(workload).str();
  options.partition = partition;
  parax::buildPlanPartitionPipeline(*unwrap(pm), options);
}

MlirLogicalResult paraxPlanModuleToJson(MlirModule module, MlirStringRef cluster,
                                        MlirStringRef workload, int topK,
                                        MlirStringCallback callback, void *userData) {
  ModuleOp op = unwrap(module);
  std::string error;
  ScopedDiagnosticHandler handler(op.getContext(), [&](Diagnostic &diag) {
    error += diag.str();
    return success();
  });
  parax::plan::PlanOptions options;
  options.topK = topK > 0 ? topK : 1;
  FailureOr<parax::plan::PlanResult> result =
      parax::planModule(op, unwrap(cluster), unwrap(workload), options);
  std::string text;
  if (failed(result)) {
    text = llvm::formatv("{0}", llvm::json::Value(llvm::json::Object{{"error", error}})).str();
    callback(mlirStringRefCreate(text.data(), text.size()), userData);
    return mlirLogicalResultFailure();
  }
  llvm::Expected<parax::plan::ClusterSpec> spec = parax::plan::resolveCluster(unwrap(cluster));
  llvm::Expected<parax::plan::Workload> work = parax::plan::parseWorkload(unwrap(workload));
  if (!spec || !work) { // already checked by planModule
    llvm::consumeError(spec.takeError());
    llvm::consumeError(work.takeError());
    return mlirLogicalResultFailure();
  }
  text = llvm::formatv("{0:2}", parax::plan::plansToJson(*result, *spec, *work)).str();
  callback(mlirStringRefCreate(text.data(), text.size()), userData);
  return mlirLogicalResultSuccess();
}
