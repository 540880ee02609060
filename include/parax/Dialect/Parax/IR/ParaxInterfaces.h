//===- ParaxInterfaces.h - parax op interfaces ------------------*- C++ -*-===//

#ifndef PARAX_DIALECT_PARAX_IR_PARAXINTERFACES_H
#define PARAX_DIALECT_PARAX_IR_PARAXINTERFACES_H

#include "mlir/IR/OpDefinition.h"

namespace parax {
/// Size in bytes of a ranked tensor of static shape (0 for other types).
uint64_t getTensorBytes(mlir::Type type);
/// Number of elements of a ranked tensor of static shape (0 otherwise).
uint64_t getNumElements(mlir::Type type);

namespace detail {
/// Every operand once.
uint64_t defaultBytesRead(mlir::Operation *op);
/// Every result once.
uint64_t defaultBytesWritten(mlir::Operation *op);
} // namespace detail
} // namespace parax

#include "parax/Dialect/Parax/IR/ParaxInterfaces.h.inc"

#endif // PARAX_DIALECT_PARAX_IR_PARAXINTERFACES_H
