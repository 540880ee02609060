//===- Passes.h - parax dialect passes --------------------------*- C++ -*-===//

#ifndef PARAX_DIALECT_PARAX_TRANSFORMS_PASSES_H
#define PARAX_DIALECT_PARAX_TRANSFORMS_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace parax {

#define GEN_PASS_DECL
#include "parax/Dialect/Parax/Transforms/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "parax/Dialect/Parax/Transforms/Passes.h.inc"

} // namespace parax

#endif // PARAX_DIALECT_PARAX_TRANSFORMS_PASSES_H
