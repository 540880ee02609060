//===- parax-opt.cpp - the parax opt driver ------------------------------===//

#include "parax/InitAll.h"

#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-opt/MlirOptMain.h"

int main(int argc, char **argv) {
  // (--help: the passes and MlirOptMain's options, not LLVM's)
  parax::hideLibraryOptions();
  mlir::DialectRegistry registry;
  parax::registerAllDialects(registry);
  parax::registerAllPasses();
  return mlir::asMainReturnCode(
      mlir::MlirOptMain(argc, argv, "parax optimizer driver\n", registry));
}
