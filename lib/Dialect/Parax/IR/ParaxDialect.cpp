//===- ParaxDialect.cpp - parax dialect, attributes, attribute verifiers --===//

#include "parax/Dialect/Parax/IR/ParaxDialect.h"
#include "parax/Dialect/Parax/IR/ParaxOps.h"

#include "mlir/IR/Builders.h"
#include "mlir/IR/DialectImplementation.h"
#include "mlir/Interfaces/FunctionInterfaces.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/ADT/StringSet.h"
#include "llvm/ADT/TypeSwitch.h"

using namespace mlir;
using namespace parax;

#include "parax/Dialect/Parax/IR/ParaxDialect.cpp.inc"
#include "parax/Dialect/Parax/IR/ParaxEnums.cpp.inc"

#define GET_ATTRDEF_CLASSES
#include "parax/Dialect/Parax/IR/ParaxAttrs.cpp.inc"

void ParaxDialect::initialize() {
  addOperations<
#define GET_OP_LIST
#include "parax/Dialect/Parax/IR/ParaxOps.cpp.inc"
      >();
  addAttributes<
#define GET_ATTRDEF_LIST
#include "parax/Dialect/Parax/IR/ParaxAttrs.cpp.inc"
      >();
}

std::optional<int64_t> parax::getLayer(Operation *op) {
  if (auto layer = op->getAttrOfType<IntegerAttr>(ParaxDialect::kLayerAttrName))
    return layer.getValue().getSExtValue();
  return std::nullopt;
}

//===----------------------------------------------------------------------===//
// ShardingAttr
//===----------------------------------------------------------------------===//

// Prints `{a, b}`.
static void printAxisSet(AsmPrinter &printer, ArrayAttr axes) {
  printer << '{';
  llvm::interleaveComma(axes, printer, [&](Attribute axis) {
    printer << cast<StringAttr>(axis).getValue();
  });
  printer << '}';
}

// Parses `{a, b}` (axis names are bare identifiers).
static ParseResult parseAxisSet(AsmParser &parser, ArrayAttr &axes) {
  SmallVector<Attribute> names;
  if (parser.parseCommaSeparatedList(AsmParser::Delimiter::Braces, [&] {
        StringRef name;
        if (parser.parseKeyword(&name))
          return failure();
        names.push_back(parser.getBuilder().getStringAttr(name));
        return success();
      }))
    return failure();
  axes = parser.getBuilder().getArrayAttr(names);
  return success();
}

// `<@grid, [{dp}, {}, {tp}]>` or `<@grid, [{}, {}], partial = {tp}>`.
Attribute ShardingAttr::parse(AsmParser &parser, Type) {
  FlatSymbolRefAttr grid;
  SmallVector<Attribute> dims;
  ArrayAttr partial = parser.getBuilder().getArrayAttr({});
  if (parser.parseLess() || parser.parseAttribute(grid) || parser.parseComma() ||
      parser.parseCommaSeparatedList(AsmParser::Delimiter::Square, [&] {
        ArrayAttr axes;
        if (parseAxisSet(parser, axes))
          return failure();
        dims.push_back(axes);
        return success();
      }))
    return {};
  if (succeeded(parser.parseOptionalComma())) {
    if (parser.parseKeyword("partial") || parser.parseEqual() ||
        parseAxisSet(parser, partial))
      return {};
  }
  if (parser.parseGreater())
    return {};
  return parser.getChecked<ShardingAttr>(
      parser.getContext(), grid, parser.getBuilder().getArrayAttr(dims), partial);
}

void ShardingAttr::print(AsmPrinter &printer) const {
  printer << '<' << getGrid() << ", [";
  llvm::interleaveComma(getDims(), printer, [&](Attribute dim) {
    printAxisSet(printer, cast<ArrayAttr>(dim));
  });
  printer << ']';
  if (isPartial()) {
    printer << ", partial = ";
    printAxisSet(printer, getPartialAxes());
  }
  printer << '>';
}

LogicalResult
ShardingAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                     FlatSymbolRefAttr grid, ArrayAttr dims, ArrayAttr partial) {
  if (!grid)
    return emitError() << "sharding needs a grid";
  llvm::StringSet<> seen;
  auto checkAxes = [&](Attribute list, StringRef where) -> LogicalResult {
    auto axes = dyn_cast<ArrayAttr>(list);
    if (!axes)
      return emitError() << "sharding " << where << " must be a list of axes";
    for (Attribute axis : axes) {
      auto name = dyn_cast<StringAttr>(axis);
      if (!name || name.getValue().empty())
        return emitError() << "sharding " << where
                           << " must list grid axis names";
      if (!seen.insert(name.getValue()).second)
        return emitError() << "grid axis '" << name.getValue()
                           << "' is used twice in one sharding";
    }
    return success();
  };
  for (auto [i, dim] : llvm::enumerate(dims))
    if (failed(checkAxes(dim, "dimension " + std::to_string(i))))
      return failure();
  return checkAxes(partial, "partial");
}

SmallVector<StringRef> ShardingAttr::getSplitAxes(unsigned dim) const {
  SmallVector<StringRef> axes;
  for (Attribute axis : cast<ArrayAttr>(getDims()[dim]))
    axes.push_back(cast<StringAttr>(axis).getValue());
  return axes;
}

SmallVector<StringRef> ShardingAttr::getAllAxes() const {
  SmallVector<StringRef> axes;
  for (unsigned d = 0, e = getDims().size(); d < e; ++d)
    llvm::append_range(axes, getSplitAxes(d));
  for (Attribute axis : getPartialAxes())
    axes.push_back(cast<StringAttr>(axis).getValue());
  return axes;
}

LogicalResult
parax::verifySharding(ShardingAttr sharding, Type type, Operation *anchor,
                      function_ref<InFlightDiagnostic()> emitError) {
  auto grid =
      SymbolTable::lookupNearestSymbolFrom<GridOp>(anchor, sharding.getGrid());
  if (!grid)
    return emitError() << "sharding refers to unknown grid "
                       << sharding.getGrid();
  auto tensor = dyn_cast<RankedTensorType>(type);
  if (!tensor)
    return emitError() << "sharding annotates a value of type " << type
                       << ", not a ranked tensor";
  if (static_cast<int64_t>(sharding.getDims().size()) != tensor.getRank())
    return emitError() << "sharding has " << sharding.getDims().size()
                       << " dimension entries but the value has rank "
                       << tensor.getRank();
  for (StringRef axis : sharding.getAllAxes())
    if (!grid.getAxisSize(axis))
      return emitError() << "unknown grid axis '" << axis << "' (grid "
                         << sharding.getGrid() << " has axes "
                         << grid.getAxisNames() << ")";
  for (int64_t d = 0; d < tensor.getRank(); ++d) {
    int64_t parts = 1;
    for (StringRef axis : sharding.getSplitAxes(d))
      parts *= *grid.getAxisSize(axis);
    int64_t size = tensor.getDimSize(d);
    if (!ShapedType::isDynamic(size) && size % parts != 0)
      return emitError() << "dimension " << d << " of size " << size
                         << " is not divisible by " << parts
                         << " (split over grid axes {"
                         << llvm::join(sharding.getSplitAxes(d), ", ") << "})";
  }
  return success();
}

//===----------------------------------------------------------------------===//
// PlanAttr, PipelineAttr
//===----------------------------------------------------------------------===//

static bool isSchedule(StringRef schedule) {
  return schedule == "gpipe" || schedule == "1f1b" || schedule == "interleaved";
}

LogicalResult PlanAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                               StringRef cluster, int64_t devices,
                               StringRef workload, int64_t pp, int64_t dp,
                               int64_t ep, int64_t tp, int64_t cp,
                               BoolAttr sequenceParallel, int64_t microBatch,
                               int64_t microBatches, StringRef schedule,
                               int64_t virtualStages, int64_t zero,
                               StringRef recompute, FloatAttr expertCapacity,
                               FloatAttr stepTime, FloatAttr mfu,
                               FloatAttr memory, FloatAttr exposed) {
  for (auto [name, value] : {std::pair<StringRef, int64_t>{"pp", pp}, {"dp", dp}, {"ep", ep},
                             {"tp", tp}, {"cp", cp}, {"micro_batch", microBatch},
                             {"micro_batches", microBatches},
                             {"virtual_stages", virtualStages}})
    if (value < 1)
      return emitError() << "plan: " << name << " must be at least 1, got " << value;
  if (devices < 0)
    return emitError() << "plan: devices must not be negative, got " << devices;
  if (zero < 0 || zero > 3)
    return emitError() << "plan: zero must be a ZeRO stage, 0 to 3, got " << zero;
  if (!isSchedule(schedule))
    return emitError() << "plan: schedule must be gpipe, 1f1b or interleaved, got '"
                       << schedule << "'";
  if (recompute != "none" && recompute != "selective" && recompute != "full")
    return emitError() << "plan: recompute must be none, selective or full, got '"
                       << recompute << "'";
  if (expertCapacity && !(expertCapacity.getValueAsDouble() >= 1))
    return emitError() << "plan: expert_capacity must be a number >= 1 (the rows a "
                          "rank's expert dispatch holds, per (token, choice) pair of "
                          "its own), got "
                       << expertCapacity.getValueAsDouble();
  return success();
}

LogicalResult PipelineAttr::verify(function_ref<InFlightDiagnostic()> emitError,
                                   int64_t stage, int64_t stages, int64_t chunks,
                                   StringRef schedule, int64_t microBatches,
                                   int64_t zero) {
  if (stages < 1 || stage < 0 || stage >= stages)
    return emitError() << "pipeline: stage " << stage << " is not one of " << stages
                       << " stages (0 .. stages - 1)";
  if (chunks < 1 || microBatches < 1)
    return emitError() << "pipeline: chunks and micro_batches must be at least 1, got "
                       << chunks << " and " << microBatches;
  if (zero < 0 || zero > 3)
    return emitError() << "pipeline: zero must be a ZeRO stage, 0 to 3, got " << zero;
  if (!isSchedule(schedule))
    return emitError() << "pipeline: schedule must be gpipe, 1f1b or interleaved, got '"
                       << schedule << "'";
  return success();
}

//===----------------------------------------------------------------------===//
// Discardable attribute verification
//===----------------------------------------------------------------------===//

// `attr` must be a #parax.sharding valid for a value of `type`.
static LogicalResult
verifyShardingOf(Attribute attr, Type type, Operation *anchor,
                 function_ref<InFlightDiagnostic()> emitError) {
  auto sharding = dyn_cast<ShardingAttr>(attr);
  if (!sharding)
    return emitError() << "expected a #parax.sharding, got " << attr;
  return verifySharding(sharding, type, anchor, emitError);
}

LogicalResult ParaxDialect::verifyOperationAttribute(Operation *op,
                                                     NamedAttribute attr) {
  StringRef name = attr.getName().getValue();
  if (name == kLayerAttrName) {
    auto layer = dyn_cast<IntegerAttr>(attr.getValue());
    if (!layer || !layer.getType().isInteger())
      return op->emitError() << "'" << name << "' must be an integer";
    if (layer.getValue().getSExtValue() < -1)
      return op->emitError() << "'" << name
                             << "' must be >= -1 (-1 is the prologue)";
    return success();
  }
  if (name == kShardingsAttrName) {
    auto list = dyn_cast<ArrayAttr>(attr.getValue());
    if (!list || list.size() != op->getNumResults())
      return op->emitError() << "'" << name << "' must list one sharding per "
                             << "result (" << op->getNumResults() << ")";
    for (auto [i, element] : llvm::enumerate(list))
      if (failed(verifyShardingOf(element, op->getResult(i).getType(), op, [&] {
            return op->emitError() << "result #" << i << ": ";
          })))
        return failure();
    return success();
  }
  if (name == kStageAttrName) {
    auto stage = dyn_cast<IntegerAttr>(attr.getValue());
    if (!stage || !stage.getType().isInteger() ||
        stage.getValue().getSExtValue() < 0)
      return op->emitError() << "'" << name
                             << "' must be a non-negative integer";
    return success();
  }
  if (name == kPlanAttrName || name == kPipelineAttrName) {
    bool typed = name == kPlanAttrName ? isa<PlanAttr>(attr.getValue())
                                       : isa<PipelineAttr>(attr.getValue());
    if (!typed || !isa<FunctionOpInterface>(op))
      return op->emitError() << "'" << name << "' must be a #" << name
                             << "<...> on a function";
    return success();
  }
  return op->emitError() << "unknown parax attribute '" << name << "'";
}

LogicalResult ParaxDialect::verifyRegionArgAttribute(Operation *op,
                                                     unsigned regionIndex,
                                                     unsigned argIndex,
                                                     NamedAttribute attr) {
  auto function = dyn_cast<FunctionOpInterface>(op);
  if (!function)
    return op->emitError() << "parax argument attributes belong on functions";
  Type type = function.getArgumentTypes()[argIndex];
  StringRef name = attr.getName().getValue();
  auto emitArgError = [&]() {
    return op->emitError() << "argument #" << argIndex << ": ";
  };
  if (name == kParamAttrName) {
    auto tensorName = dyn_cast<StringAttr>(attr.getValue());
    if (!tensorName || tensorName.getValue().empty())
      return emitArgError() << "'" << name
                            << "' must be a non-empty checkpoint tensor name";
    auto tensor = dyn_cast<RankedTensorType>(type);
    if (!tensor || !tensor.hasStaticShape())
      return emitArgError() << "a parameter must be a tensor of static shape";
    if (tensorName.getValue().contains("{e}") && tensor.getRank() < 1)
      return emitArgError() << "a stacked '{e}' parameter needs rank >= 1";
    return success();
  }
  if (name == kParamOffsetAttrName || name == kParamShapeAttrName) {
    auto values = dyn_cast<DenseI64ArrayAttr>(attr.getValue());
    auto tensor = dyn_cast<RankedTensorType>(type);
    if (!values || !tensor ||
        static_cast<int64_t>(values.size()) != tensor.getRank())
      return emitArgError() << "'" << name
                            << "' must be an array<i64> with one entry per "
                               "dimension of the argument";
    if (!function.getArgAttr(argIndex, kParamAttrName))
      return emitArgError() << "'" << name << "' belongs on a parameter";
    StringRef other =
        name == kParamOffsetAttrName ? kParamShapeAttrName : kParamOffsetAttrName;
    auto otherValues = function.getArgAttrOfType<DenseI64ArrayAttr>(argIndex, other);
    if (!otherValues)
      return emitArgError() << "'" << name << "' needs '" << other << "' too";
    if (otherValues.size() != values.size() || name == kParamShapeAttrName)
      return success(); // the other is checked on its own; the box once, with the offset
    // A partitioned function's argument is a piece of the global box: its
    // extent is checked where the grid is known (translation, loading).
    bool local = static_cast<bool>(function.getArgAttr(argIndex, kGlobalShardingAttrName));
    for (int64_t d = 0; d < tensor.getRank(); ++d) {
      int64_t start = values[d], whole = otherValues[d];
      if (start < 0 || (!local && start + tensor.getDimSize(d) > whole))
        return emitArgError() << "the box at offset " << start << " of extent "
                              << tensor.getDimSize(d) << " in dimension " << d
                              << " is outside the checkpoint tensor (extent "
                              << whole << ")";
    }
    return success();
  }
  if (name == kShardingAttrName)
    return verifyShardingOf(attr.getValue(), type, op, emitArgError);
  if (name == kGlobalShardingAttrName) {
    // Describes the global tensor, not this local one: no shape check.
    if (!isa<ShardingAttr>(attr.getValue()))
      return emitArgError() << "expected a #parax.sharding, got "
                            << attr.getValue();
    return success();
  }
  if (name == kInputAttrName) {
    auto index = dyn_cast<IntegerAttr>(attr.getValue());
    if (!index || index.getInt() < 0)
      return emitArgError() << "'" << name
                            << "' must be a non-negative integer input index";
    if (function.getArgAttr(argIndex, kParamAttrName))
      return emitArgError() << "a parameter cannot also be input #"
                            << index.getInt();
    return success();
  }
  return emitArgError() << "unknown parax argument attribute '" << name << "'";
}

LogicalResult ParaxDialect::verifyRegionResultAttribute(Operation *op,
                                                        unsigned regionIndex,
                                                        unsigned resultIndex,
                                                        NamedAttribute attr) {
  auto function = dyn_cast<FunctionOpInterface>(op);
  if (!function)
    return op->emitError() << "parax result attributes belong on functions";
  auto emitResultError = [&]() {
    return op->emitError() << "result #" << resultIndex << ": ";
  };
  if (attr.getName().getValue() == kShardingAttrName)
    return verifyShardingOf(attr.getValue(),
                            function.getResultTypes()[resultIndex], op,
                            emitResultError);
  if (attr.getName().getValue() == kParamOffsetAttrName ||
      attr.getName().getValue() == kParamShapeAttrName) {
    if (!isa<DenseI64ArrayAttr>(attr.getValue()))
      return emitResultError() << "'" << attr.getName().getValue()
                               << "' must be an array of integers";
    return success();
  }
  if (attr.getName().getValue() == kGlobalShardingAttrName) {
    // Describes the global tensor, not this local one: no shape check.
    if (!isa<ShardingAttr>(attr.getValue()))
      return emitResultError() << "expected a #parax.sharding, got "
                               << attr.getValue();
    return success();
  }
  if (attr.getName().getValue() == kResultAttrName) {
    auto index = dyn_cast<IntegerAttr>(attr.getValue());
    if (!index || index.getInt() < 0)
      return emitResultError() << "'" << kResultAttrName
                               << "' must be a non-negative result index";
    return success();
  }
  if (attr.getName().getValue() == kGradAttrName) {
    auto name = dyn_cast<StringAttr>(attr.getValue());
    if (!name || name.getValue().empty())
      return emitResultError() << "'" << kGradAttrName
                               << "' must name a checkpoint tensor";
    return success();
  }
  if (attr.getName().getValue() == kLossTermAttrName) {
    auto name = dyn_cast<StringAttr>(attr.getValue());
    if (!name || (name.getValue() != "balance" && name.getValue() != "mtp"))
      return emitResultError() << "'" << kLossTermAttrName
                               << "' must be \"balance\" or \"mtp\" (the loss terms: the load-balancing "
                                  "losses', multi-token prediction's)";
    return success();
  }
  if (attr.getName().getValue() == kStagePartAttrName) {
    if (!isa<UnitAttr>(attr.getValue()) || !function.getResultAttr(resultIndex, kGradAttrName))
      return emitResultError() << "'" << kStagePartAttrName
                               << "' is a unit attribute on a gradient ('" << kGradAttrName << "')";
    return success();
  }
  return emitResultError() << "unknown parax result attribute '"
                           << attr.getName().getValue() << "'";
}
