//===- Passes.h - target passes ---------------------------------*- C++ -*-===//

#ifndef PARAX_TARGET_PASSES_H
#define PARAX_TARGET_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace parax {

#define GEN_PASS_DECL
#include "parax/Target/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "parax/Target/Passes.h.inc"

} // namespace parax

#endif // PARAX_TARGET_PASSES_H
