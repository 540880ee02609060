//===- ParaxOps.h - parax dialect ops and attributes ------------*- C++ -*-===//

#ifndef PARAX_DIALECT_PARAX_IR_PARAXOPS_H
#define PARAX_DIALECT_PARAX_IR_PARAXOPS_H

#include "mlir/Bytecode/BytecodeOpInterface.h"
#include "mlir/IR/BuiltinAttributes.h"
#include "mlir/IR/BuiltinTypes.h"
#include "mlir/IR/OpDefinition.h"
#include "mlir/IR/SymbolTable.h"
#include "mlir/Interfaces/SideEffectInterfaces.h"

#include "parax/Dialect/Parax/IR/ParaxDialect.h"
#include "parax/Dialect/Parax/IR/ParaxInterfaces.h"

#include "parax/Dialect/Parax/IR/ParaxEnums.h.inc"

#define GET_ATTRDEF_CLASSES
#include "parax/Dialect/Parax/IR/ParaxAttrs.h.inc"

#define GET_OP_CLASSES
#include "parax/Dialect/Parax/IR/ParaxOps.h.inc"

namespace parax {
/// The layer index an op carries (`parax.layer`), if any.
std::optional<int64_t> getLayer(mlir::Operation *op);

/// Checks `sharding` against the type of the value it annotates and against
/// the grid it names (looked up from `anchor`). Errors go to `emitError`.
mlir::LogicalResult
verifySharding(ShardingAttr sharding, mlir::Type type, mlir::Operation *anchor,
               llvm::function_ref<mlir::InFlightDiagnostic()> emitError);
} // namespace parax

#endif // PARAX_DIALECT_PARAX_IR_PARAXOPS_H
