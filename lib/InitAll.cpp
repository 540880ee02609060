//===- InitAll.cpp - register everything parax provides ------------------===//

#include "parax/InitAll.h"

#include "parax/Dialect/Parax/IR/ParaxDialect.h"
#include "parax/Dialect/Parax/Transforms/Passes.h"
#include "parax/Interop/Passes.h"
#include "parax/Partition/Passes.h"
#include "parax/Plan/Passes.h"
#include "parax/Target/Passes.h"
#include "parax/Train/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Dialect/Shard/IR/ShardDialect.h"
#include "mlir/IR/DialectRegistry.h"
#include "llvm/Support/CommandLine.h"

void parax::registerAllDialects(mlir::DialectRegistry &registry) {
  registry.insert<parax::ParaxDialect, mlir::func::FuncDialect,
                  mlir::shard::ShardDialect, mlir::linalg::LinalgDialect,
                  mlir::arith::ArithDialect, mlir::math::MathDialect,
                  mlir::tensor::TensorDialect>();
}

void parax::registerAllPasses() {
  parax::registerParaxPasses();
  parax::registerParaxPlanPasses();
  parax::registerParaxPartitionPasses();
  parax::registerParaxInteropPasses();
  parax::registerParaxTargetPasses();
  parax::registerParaxTrainPasses();
}

void parax::hideLibraryOptions() {
  for (auto &option : llvm::cl::getRegisteredOptions())
    if (!option.first.starts_with("help") && option.first != "version")
      option.second->setHiddenFlag(llvm::cl::ReallyHidden);
}
