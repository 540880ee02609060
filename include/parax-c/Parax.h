/*===- parax-c/Parax.h - C API of parax ----------------------------*- C -*-===*\
|*                                                                            *|
|* MLIR's C-API conventions: handles from mlir-c, MlirStringRef in,           *|
|* MlirStringCallback out, MlirLogicalResult for success. See                 *|
|* docs/embedding.md.                                                         *|
\*===----------------------------------------------------------------------===*/

#ifndef PARAX_C_PARAX_H
#define PARAX_C_PARAX_H

#include "mlir-c/IR.h"
#include "mlir-c/Pass.h"
#include "mlir-c/Support.h"

#ifdef __cplusplus
extern "C" {
#endif

/// Inserts the parax dialect and the upstream dialects parax IR uses.
MLIR_CAPI_EXPORTED void paraxRegisterAllDialects(MlirDialectRegistry registry);

/// Registers every parax pass (for textual pipelines such as
/// "builtin.module(parax-plan{...},parax-partition)").
MLIR_CAPI_EXPORTED void paraxRegisterAllPasses(void);

/// Adds --parax-plan for `cluster` and `workload` and, when `partition`,
/// --parax-partition to `pm`.
MLIR_CAPI_EXPORTED void paraxBuildPlanPartitionPipeline(MlirOpPassManager pm,
                                                        MlirStringRef cluster,
                                                        MlirStringRef workload,
                                                        bool partition);

/// Ranks the `topK` best plans of `module`'s model and writes the JSON report
/// (the format of `parax-plan --json`) through `callback`. Fails (with the
/// error as the report's "error" field) for a bad cluster, workload or model.
MLIR_CAPI_EXPORTED MlirLogicalResult
paraxPlanModuleToJson(MlirModule module, MlirStringRef cluster,
                      MlirStringRef workload, int topK,
                      MlirStringCallback callback, void *userData);

#ifdef __cplusplus
}
#endif

#endif /* PARAX_C_PARAX_H */
