//===- ModelSummary.cpp - parameters, bytes and FLOPs of a model ---------===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Dialect/Parax/Transforms/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/Support/FileUtilities.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/ToolOutputFile.h"

namespace parax {
#define GEN_PASS_DEF_PARAXMODELSUMMARYPASS
#include "parax/Dialect/Parax/Transforms/Passes.h.inc"
} // namespace parax

using namespace mlir;
using namespace parax;

namespace {

struct ModelTotals {
  uint64_t params = 0, paramBytes = 0, paramTensors = 0;
  uint64_t flops = 0, bytesRead = 0, bytesWritten = 0, ops = 0;
  uint64_t tokens = 0;
  int64_t maxLayer = -1;
  bool hasParaxOps = false;
};

// 1234567 -> "1.23 M"
std::string humanCount(double value, StringRef unit = "") {
  static const char *prefixes[] = {"", "K", "M", "G", "T", "P", "E"};
  int i = 0;
  while (value >= 1000 && i < 6) {
    value /= 1000;
    ++i;
  }
  std::string suffix = (prefixes[i] + unit).str();
  return llvm::formatv("{0:F2}{1}{2}", value, suffix.empty() ? "" : " ", suffix)
      .str();
}

FailureOr<ModelTotals> summarize(func::FuncOp function) {
  ModelTotals totals;
  for (auto [i, type] : llvm::enumerate(function.getArgumentTypes())) {
    if (function.getArgAttr(i, ParaxDialect::kParamAttrName)) {
      totals.params += getNumElements(type);
      totals.paramBytes += getTensorBytes(type);
      ++totals.paramTensors;
    } else if (!totals.tokens) {
      auto tensor = dyn_cast<RankedTensorType>(type);
      if (tensor && tensor.getElementType().isInteger())
        totals.tokens = getNumElements(type);
    }
  }
  WalkResult walk = function.walk([&](Operation *op) {
    if (op == function.getOperation() || isa<func::ReturnOp>(op))
      return WalkResult::advance();
    auto cost = dyn_cast<CostOpInterface>(op);
    if (!cost) {
      op->emitWarning("op has no cost model; it is not counted in the summary");
      return WalkResult::advance();
    }
    totals.hasParaxOps = true;
    ++totals.ops;
    totals.flops += cost.getFlops();
    totals.bytesRead += cost.getBytesRead();
    totals.bytesWritten += cost.getBytesWritten();
    if (std::optional<int64_t> layer = getLayer(op))
      totals.maxLayer = std::max(totals.maxLayer, *layer);
    return WalkResult::advance();
  });
  if (walk.wasInterrupted())
    return failure();
  return totals;
}

struct ParaxModelSummaryPass
    : public parax::impl::ParaxModelSummaryPassBase<ParaxModelSummaryPass> {
  using Base::Base;

  void runOnOperation() override {
    std::string error;
    std::unique_ptr<llvm::ToolOutputFile> file =
        openOutputFile(output, &error);
    if (!file) {
      mlir::emitError(getOperation().getLoc())
          << "cannot open summary output: " << error;
      return signalPassFailure();
    }
    llvm::raw_ostream &os = file->os();
    for (auto function : getOperation().getOps<func::FuncOp>()) {
      FailureOr<ModelTotals> totals = summarize(function);
      if (failed(totals))
        return signalPassFailure();
      if (!totals->hasParaxOps)
        continue;
      const ModelTotals &t = *totals;
      // The epilogue carries layer L, so L decoder layers have max layer L.
      int64_t layers = std::max<int64_t>(t.maxLayer, 0);
      os << "model @" << function.getSymName() << "\n";
      os << llvm::formatv("  decoder layers     {0}\n", layers);
      os << llvm::formatv("  parameters         {0} ({1}) in {2} tensors\n",
                          t.params, humanCount(t.params), t.paramTensors);
      os << llvm::formatv("  parameter bytes    {0} ({1})\n", t.paramBytes,
                          humanCount(t.paramBytes, "B"));
      os << llvm::formatv("  ops                {0}\n", t.ops);
      os << llvm::formatv("  tokens per step    {0}\n", t.tokens);
      os << llvm::formatv("  forward FLOPs      {0} ({1})\n", t.flops,
                          humanCount(t.flops, "FLOP"));
      if (t.tokens)
        os << llvm::formatv("  FLOPs per token    {0} ({1})\n",
                            t.flops / t.tokens,
                            humanCount(double(t.flops) / t.tokens, "FLOP"));
      os << llvm::formatv("  bytes read         {0} ({1})\n", t.bytesRead,
                          humanCount(t.bytesRead, "B"));
      os << llvm::formatv("  bytes written      {0} ({1})\n", t.bytesWritten,
                          humanCount(t.bytesWritten, "B"));
    }
    file->keep();
    markAllAnalysesPreserved();
  }
};

} // namespace
