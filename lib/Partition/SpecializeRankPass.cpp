//===- SpecializeRankPass.cpp - what one rank of a program runs -----------===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Partition/Passes.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

namespace parax {
#define GEN_PASS_DEF_PARAXSPECIALIZERANKPASS
#include "parax/Partition/Passes.h.inc"
} // namespace parax

using namespace mlir;
using namespace parax;

namespace {

// Row-major coordinates: the last grid axis is the innermost.
SmallVector<int64_t> coordinates(ArrayRef<int64_t> shape, int64_t rank) {
  SmallVector<int64_t> coords(shape.size());
  for (int64_t i = shape.size() - 1; i >= 0; --i) {
    coords[i] = rank % shape[i];
    rank /= shape[i];
  }
  return coords;
}

int64_t rankOf(ArrayRef<int64_t> shape, ArrayRef<int64_t> coords) {
  int64_t rank = 0;
  for (auto [size, c] : llvm::zip(shape, coords))
    rank = rank * size + c;
  return rank;
}

// The box of its checkpoint tensor that this rank's parameter `arg` holds,
// as [begin:end, ...]: its chunk along each dimension's split axes (major to
// minor), shifted by the piece's offset when it is one piece of a fused
// tensor ("of [...]" then gives the tensor's shape).
std::string checkpointBox(func::FuncOp function, unsigned arg, ArrayRef<int64_t> coords,
                          ArrayRef<StringRef> names, ArrayRef<int64_t> gridShape) {
  auto type = cast<RankedTensorType>(function.getArgument(arg).getType());
  auto global = function.getArgAttrOfType<ShardingAttr>(arg, ParaxDialect::kGlobalShardingAttrName);
  auto offset = function.getArgAttrOfType<DenseI64ArrayAttr>(arg, ParaxDialect::kParamOffsetAttrName);
  auto whole = function.getArgAttrOfType<DenseI64ArrayAttr>(arg, ParaxDialect::kParamShapeAttrName);
  SmallVector<std::string> ranges;
  for (int64_t d = 0; d < type.getRank(); ++d) {
    int64_t chunk = 0;
    if (global && d < static_cast<int64_t>(global.getDims().size()))
      for (StringRef axis : global.getSplitAxes(d)) {
        int64_t index = llvm::find(names, axis) - names.begin();
        chunk = chunk * gridShape[index] + coords[index];
      }
    int64_t extent = type.getDimSize(d);
    int64_t begin = chunk * extent + (offset ? offset[d] : 0);
    ranges.push_back(std::to_string(begin) + ":" + std::to_string(begin + extent));
  }
  std::string box = "[" + llvm::join(ranges, ", ") + "]";
  if (whole)
    box += " of [" +
           llvm::join(llvm::map_range(whole.asArrayRef(), [](int64_t v) { return std::to_string(v); }), ", ") +
           "]";
  return box;
}

struct ParaxSpecializeRankPass
    : public parax::impl::ParaxSpecializeRankPassBase<ParaxSpecializeRankPass> {
  using Base::Base;

  void runOnOperation() override {
    ModuleOp module = getOperation();
    auto grids = module.getOps<GridOp>();
    if (grids.empty()) {
      mlir::emitError(module.getLoc()) << "no parax.grid: nothing to specialize";
      return signalPassFailure();
    }
    GridOp grid = *grids.begin();
    SmallVector<int64_t> shape(grid.getShape());
    SmallVector<StringRef> names;
    for (Attribute a : grid.getAxisNames())
      names.push_back(cast<StringAttr>(a).getValue());
    int64_t devices = grid.getNumDevices();
    if (rank < 0 || rank >= devices) {
      mlir::emitError(module.getLoc())
          << "rank " << static_cast<int64_t>(rank) << " is outside the grid @" << grid.getSymName()
          << " of " << devices << " ranks";
      return signalPassFailure();
    }
    SmallVector<int64_t> coords = coordinates(shape, rank);
    llvm::raw_ostream &os = llvm::outs();
    os << formatv("rank {0} of {1} on @{2}:", rank, devices, grid.getSymName());
    for (auto [name, c] : llvm::zip(names, coords))
      os << " " << name << "=" << c;
    os << "\n";

    auto axisIndex = [&](StringRef axis) -> int64_t {
      return llvm::find(names, axis) - names.begin();
    };
    // The ranks that differ from this one only along `axes`.
    auto group = [&](ArrayAttr axes) {
      SmallVector<int64_t> members = {rank};
      for (Attribute a : axes) {
        int64_t index = axisIndex(cast<StringAttr>(a).getValue());
        SmallVector<int64_t> next;
        for (int64_t member : members) {
          SmallVector<int64_t> c = coordinates(shape, member);
          for (int64_t v = 0; v < shape[index]; ++v) {
            c[index] = v;
            next.push_back(rankOf(shape, c));
          }
        }
        members = next;
      }
      llvm::sort(members);
      members.erase(std::unique(members.begin(), members.end()), members.end());
      return members;
    };
    int64_t ppIndex = axisIndex("pp");
    int64_t myStage = ppIndex < static_cast<int64_t>(names.size()) ? coords[ppIndex] : 0;

    for (auto function : module.getOps<func::FuncOp>()) {
      auto pipeline =
          function->getAttrOfType<PipelineAttr>(ParaxDialect::kPipelineAttrName);
      int64_t stage = pipeline ? pipeline.getStage() : 0,
              stages = pipeline ? pipeline.getStages() : 1;
      if (stage != myStage)
        continue;
      os << formatv("runs @{0} (stage {1} of {2})\n", function.getSymName(),
                    stage, stages);
      os << "  arguments:\n";
      for (unsigned i = 0; i < function.getNumArguments(); ++i) {
        auto param =
            function.getArgAttrOfType<StringAttr>(i, ParaxDialect::kParamAttrName);
        auto input =
            function.getArgAttrOfType<IntegerAttr>(i, ParaxDialect::kInputAttrName);
        std::string what = param ? param.getValue().str()
                           : input ? llvm::formatv("(input {0})", input.getInt()).str()
                                   : std::string("(input)");
        if (param)
          what += " " + checkpointBox(function, i, coords, names, shape);
        os << llvm::formatv("    #{0} {1}: {2}\n", i, what,
                      function.getArgument(i).getType());
      }
      os << "  communication:\n";
      function.walk([&](Operation *op) {
        auto axes = op->getAttrOfType<ArrayAttr>("axes");
        if (!axes)
          return;
        os << "    " << op->getName().stripDialect() << " " << axes << " ";
        if (isa<SendOp, RecvOp>(op)) {
          int64_t peer = cast<IntegerAttr>(op->getAttr("peer")).getInt();
          SmallVector<int64_t> c = coords;
          c[axisIndex(cast<StringAttr>(axes[0]).getValue())] = peer;
          os << (isa<SendOp>(op) ? "to rank " : "from rank ") << rankOf(shape, c);
        } else {
          os << "group [" << llvm::join(llvm::map_range(group(axes), [](int64_t r) {
            return std::to_string(r);
          }), ", ") << "]";
        }
        os << ": ";
        if (op->getNumOperands())
          os << op->getOperandTypes() << " -> ";
        os << op->getResultTypes() << "\n";
      });
    }
    markAllAnalysesPreserved();
  }
};

} // namespace
