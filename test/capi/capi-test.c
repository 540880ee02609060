/* Uses parax from C (MLIR's C API conventions): registers the dialects,
 * parses a model, ranks plans as JSON, runs the plan -> partition pipeline,
 * prints the partitioned module.
 *
 *   parax-capi-test MODEL.mlir CLUSTER WORKLOAD */

#include "mlir-c/IR.h"
#include "mlir-c/Pass.h"
#include "parax-c/Parax.h"

#include <stdio.h>
#include <stdlib.h>

static void print(MlirStringRef text, void *userData) {
  fwrite(text.data, 1, text.length, (FILE *)userData);
}

int main(int argc, char **argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: parax-capi-test MODEL.mlir CLUSTER WORKLOAD\n");
    return 2;
  }
  FILE *f = fopen(argv[1], "rb");
  if (!f) {
    fprintf(stderr, "cannot open %s\n", argv[1]);
    return 1;
  }
  fseek(f, 0, SEEK_END);
  long size = ftell(f);
  fseek(f, 0, SEEK_SET);
  char *text = malloc(size + 1);
  if (fread(text, 1, size, f) != (size_t)size) {
    fclose(f);
    return 1;
  }
  text[size] = 0;
  fclose(f);

  MlirContext ctx = mlirContextCreate();
  MlirDialectRegistry registry = mlirDialectRegistryCreate();
  paraxRegisterAllDialects(registry);
  mlirContextAppendDialectRegistry(ctx, registry);
  mlirDialectRegistryDestroy(registry);
  mlirContextLoadAllAvailableDialects(ctx);
  paraxRegisterAllPasses();

  MlirModule module = mlirModuleCreateParse(ctx, mlirStringRefCreateFromCString(text));
  free(text);
  if (mlirModuleIsNull(module)) {
    fprintf(stderr, "parse failed\n");
    return 1;
  }
  MlirStringRef cluster = mlirStringRefCreateFromCString(argv[2]);
  MlirStringRef workload = mlirStringRefCreateFromCString(argv[3]);

  printf("== plans\n");
  if (mlirLogicalResultIsFailure(
          paraxPlanModuleToJson(module, cluster, workload, 2, print, stdout))) {
    printf("\n== planning failed\n");
    return 3;
  }
  printf("\n== partitioned\n");
  MlirPassManager pm = mlirPassManagerCreate(ctx);
  paraxBuildPlanPartitionPipeline(mlirPassManagerGetAsOpPassManager(pm), cluster, workload,
                                  true);
  if (mlirLogicalResultIsFailure(
          mlirPassManagerRunOnOp(pm, mlirModuleGetOperation(module)))) {
    fprintf(stderr, "pipeline failed\n");
    mlirOperationPrint(mlirModuleGetOperation(module), print, stderr);
    return 1;
  }
  mlirOperationPrint(mlirModuleGetOperation(module), print, stdout);
  printf("\n");
  mlirPassManagerDestroy(pm);
  mlirModuleDestroy(module);
  mlirContextDestroy(ctx);
  return 0;
}
