//===- InitAll.h - register everything parax provides -----------*- C++ -*-===//
//
// The entry points an embedding compiler calls: the dialects parax IR uses and
// every parax pass.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_INITALL_H
#define PARAX_INITALL_H

namespace mlir {
class DialectRegistry;
} // namespace mlir

namespace parax {
/// Registers the parax dialect and the upstream dialects parax IR uses (func;
/// shard, linalg, arith, math and tensor for interoperability).
void registerAllDialects(mlir::DialectRegistry &registry);
/// Registers every parax pass with the global pass registry.
void registerAllPasses();
} // namespace parax

#endif // PARAX_INITALL_H
