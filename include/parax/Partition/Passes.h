//===- Passes.h - partitioning passes ---------------------------*- C++ -*-===//

#ifndef PARAX_PARTITION_PASSES_H
#define PARAX_PARTITION_PASSES_H

#include "mlir/IR/BuiltinOps.h"
#include "mlir/Pass/Pass.h"

namespace parax {

#define GEN_PASS_DECL
#include "parax/Partition/Passes.h.inc"

#define GEN_PASS_REGISTRATION
#include "parax/Partition/Passes.h.inc"

} // namespace parax

#endif // PARAX_PARTITION_PASSES_H
