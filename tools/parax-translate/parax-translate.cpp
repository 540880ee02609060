//===- parax-translate.cpp - parax translations ---------------------------===//
//
//   parax-translate --to-executable partitioned.mlir -o model.pxe

#include "parax/InitAll.h"
#include "parax/Target/Executable.h"

#include "mlir/IR/AsmState.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Support/Timing.h"
#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"

int main(int argc, char **argv) {
  // (--help: this tool's options and mlirTranslateMain's own -- the output,
  // split input, diagnostics -- not LLVM's nor MLIR's printing, context
  // and timing options, which are registered first to be hidden with them)
  mlir::registerAsmPrinterCLOptions();
  mlir::registerMLIRContextCLOptions();
  mlir::registerDefaultTimingManagerCLOptions();
  parax::hideLibraryOptions();
  parax::registerToExecutableTranslation();
  return mlir::failed(
             mlir::mlirTranslateMain(argc, argv, "parax translations\n"))
             ? 1
             : 0;
}
