//===- Passes.h - interoperability with upstream shard ----------*- C++ -*-===//

#ifndef PARAX_INTEROP_PASSES_H
#define PARAX_INTEROP_PASSES_H

#include "mlir/Dialect/Arith/IR/Arith.h"
#include "mlir/Dialect/Linalg/IR/Linalg.h"
#include "mlir/Dialect/Math/IR/Math.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/Dialect/Tensor/IR/Tensor.h"
#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace parax {

#define GEN_PASS_DECL
#include "parax/Interop/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "parax/Interop/Passes.h.inc"

} // namespace parax

#endif // PARAX_INTEROP_PASSES_H
