//===- Passes.h - the training step -----------------------------*- C++ -*-===//

#ifndef PARAX_TRAIN_PASSES_H
#define PARAX_TRAIN_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace parax {

#define GEN_PASS_DECL
#include "parax/Train/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "parax/Train/Passes.h.inc"

} // namespace parax

#endif // PARAX_TRAIN_PASSES_H
