//===- parax-translate.cpp - parax translations ---------------------------===//
//
//   parax-translate --to-executable partitioned.mlir -o model.pxe

#include "parax/Target/Executable.h"

#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  parax::registerToExecutableTranslation();
  return mlir::failed(
             mlir::mlirTranslateMain(argc, argv, "parax translations\n"))
             ? 1
             : 0;
}
