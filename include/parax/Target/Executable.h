//===- Executable.h - partitioned IR -> .pxe --------------------*- C++ -*-===//

#ifndef PARAX_TARGET_EXECUTABLE_H
#define PARAX_TARGET_EXECUTABLE_H

#include "mlir/IR/BuiltinOps.h"
#include "llvm/Support/raw_ostream.h"

namespace parax {

/// Writes the partitioned module as a .pxe executable (binary protobuf, see
/// runtime/proto/parax/runtime/executable.proto). Fails with an error at the
/// offending op for anything the format cannot express.
mlir::LogicalResult translateToExecutable(mlir::ModuleOp module,
                                          llvm::raw_ostream &os);

/// Registers `--to-executable` with mlir-translate style drivers.
void registerToExecutableTranslation();

} // namespace parax

#endif // PARAX_TARGET_EXECUTABLE_H
