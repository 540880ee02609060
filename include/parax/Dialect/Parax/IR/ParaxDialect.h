//===- ParaxDialect.h - parax dialect ---------------------------*- C++ -*-===//

#ifndef PARAX_DIALECT_PARAX_IR_PARAXDIALECT_H
#define PARAX_DIALECT_PARAX_IR_PARAXDIALECT_H

#include "mlir/IR/Dialect.h"

#include "parax/Dialect/Parax/IR/ParaxDialect.h.inc"

#endif // PARAX_DIALECT_PARAX_IR_PARAXDIALECT_H
