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
/// Hides from --help the options the LLVM libraries register as they load
/// (every code generator's: several hundred), still accepted; call first in
/// a tool's main, before it registers its own.
void hideLibraryOptions();
} // namespace parax

#endif // PARAX_INITALL_H
