//===- Passes.h - planner passes --------------------------------*- C++ -*-===//

#ifndef PARAX_PLAN_PASSES_H
#define PARAX_PLAN_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace parax {

#define GEN_PASS_DECL
#include "parax/Plan/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "parax/Plan/Passes.h.inc"

} // namespace parax

#endif // PARAX_PLAN_PASSES_H
