//===- parax-translate.cpp - parax translations ---------------------------===//
//
//   parax-translate --to-executable partitioned.mlir -o model.pxe

#include "parax/InitAll.h"
#include "parax/Target/Executable.h"

#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  // (--help: this tool's options and mlirTranslateMain's, not LLVM's)
  parax::hideLibraryOptions();
  parax::registerToExecutableTranslation();
  return mlir::failed(
             mlir::mlirTranslateMain(argc, argv, "parax translations\n"))
             ? 1
             : 0;
}
