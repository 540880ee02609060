//===- Passes.h - parax dialect passes --------------------------*- C++ -*-===//

#ifndef PARAX_DIALECT_PARAX_TRANSFORMS_PASSES_H
#define PARAX_DIALECT_PARAX_TRANSFORMS_PASSES_H

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace parax {

#define GEN_PASS_DECL
#include "parax/Dialect/Parax/Transforms/Passes.h.inc"

/// The rewrite of --parax-split-fused-params on one function; returns how
/// many fused parameters it split.
unsigned splitFusedParams(mlir::func::FuncOp function);

#define GEN_PASS_REGISTRATION
#include "parax/Dialect/Parax/Transforms/Passes.h.inc"

} // namespace parax

#endif // PARAX_DIALECT_PARAX_TRANSFORMS_PASSES_H
