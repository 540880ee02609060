//===- parax-translate.cpp - parax translations ---------------------------===//
//
//   parax-translate --to-executable partitioned.mlir -o model.pxe

#include "parax/Target/Executable.h"

#include "mlir/Tools/mlir-translate/MlirTranslateMain.h"
#include "llvm/Support/CommandLine.h"

int main(int argc, char **argv) {
  // The options the LLVM libraries register when they load (code
  // generation for every target: several hundred) are not this tool's:
  // hidden from --help, still accepted. mlirTranslateMain registers its
  // own (input, -o, the translations) after this.
  for (auto &option : llvm::cl::getRegisteredOptions())
    if (!option.first.starts_with("help") && option.first != "version")
      option.second->setHiddenFlag(llvm::cl::ReallyHidden);
  parax::registerToExecutableTranslation();
  return mlir::failed(
             mlir::mlirTranslateMain(argc, argv, "parax translations\n"))
             ? 1
             : 0;
}
