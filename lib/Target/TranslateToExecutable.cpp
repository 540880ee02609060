//===- TranslateToExecutable.cpp - partitioned IR -> .pxe -----------------===//

#include "parax/Target/Executable.h"
#include "parax/Dialect/Parax/IR/ParaxOps.h"

#include "parax/runtime/executable.pb.h"

#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/DialectRegistry.h"
#include "mlir/Tools/mlir-translate/Translation.h"
#include "llvm/ADT/TypeSwitch.h"

#include <map>

using namespace mlir;
using namespace parax;

namespace {

constexpr uint32_t kFormatVersion = 2;

FailureOr<pxe::DType> dtypeOf(Type type, Location loc) {
  Type element = cast<ShapedType>(type).getElementType();
  if (element.isF32()) return pxe::F32;
  if (element.isBF16()) return pxe::BF16;
  if (element.isF16()) return pxe::F16;
  if (element.isInteger(32)) return pxe::I32;
  if (element.isInteger(64)) return pxe::I64;
  return emitError(loc) << "no executable dtype for " << element;
}

// Attribute -> pxe::Attr; dictionaries flatten into "name.key" entries.
LogicalResult addAttr(google::protobuf::Map<std::string, pxe::Attr> &out,
                      const std::string &name, Attribute attr, Location loc) {
  pxe::Attr value;
  if (auto b = dyn_cast<BoolAttr>(attr)) {
    value.set_b(b.getValue());
  } else if (auto i = dyn_cast<IntegerAttr>(attr)) {
    value.set_i(i.getValue().getSExtValue());
  } else if (auto f = dyn_cast<FloatAttr>(attr)) {
    value.set_f(f.getValueAsDouble());
  } else if (auto s = dyn_cast<StringAttr>(attr)) {
    value.set_s(s.getValue().str());
  } else if (isa<UnitAttr>(attr)) {
    value.set_b(true);
  } else if (auto ref = dyn_cast<FlatSymbolRefAttr>(attr)) {
    value.set_s(ref.getValue().str());
  } else if (auto dense = dyn_cast<DenseI64ArrayAttr>(attr)) {
    for (int64_t v : dense.asArrayRef())
      value.mutable_ints()->add_values(v);
  } else if (auto dense = dyn_cast<DenseF64ArrayAttr>(attr)) {
    for (double v : dense.asArrayRef())
      value.mutable_floats()->add_values(v);
  } else if (auto score = dyn_cast<ScoreFuncAttr>(attr)) {
    value.set_s(stringifyScoreFunc(score.getValue()).str());
  } else if (auto gelu = dyn_cast<GeluApproxAttr>(attr)) {
    value.set_s(stringifyGeluApprox(gelu.getValue()).str());
  } else if (auto dict = dyn_cast<DictionaryAttr>(attr)) {
    for (NamedAttribute entry : dict)
      if (failed(addAttr(out, name + "." + entry.getName().str(), entry.getValue(), loc)))
        return failure();
    return success();
  } else if (auto array = dyn_cast<ArrayAttr>(attr)) {
    for (Attribute element : array) {
      if (auto s = dyn_cast<StringAttr>(element))
        value.mutable_strings()->add_values(s.getValue().str());
      else if (auto i = dyn_cast<IntegerAttr>(element))
        value.mutable_ints()->add_values(i.getValue().getSExtValue());
      else
        return emitError(loc) << "attribute '" << name << "' has no executable form";
    }
  } else {
    return emitError(loc) << "attribute '" << name << "' has no executable form";
  }
  out[name] = value;
  return success();
}

struct GridSizes {
  std::map<std::string, int64_t> sizes;
  int64_t product(ArrayAttr axes) const {
    int64_t n = 1;
    for (Attribute a : axes)
      n *= sizes.at(cast<StringAttr>(a).getValue().str());
    return n;
  }
};

// A buffer that is a box of a whole tensor (a parameter, an input, a split
// result): per dimension the axes `global` splits it over (none: whole)
// and the whole tensor's size.
void addBox(pxe::Buffer &buffer, RankedTensorType local, ShardingAttr global, const GridSizes &grid) {
  for (int64_t d = 0; d < local.getRank(); ++d) {
    pxe::AxisList *axes = buffer.add_split();
    int64_t parts = 1;
    if (global && d < static_cast<int64_t>(global.getDims().size()))
      for (StringRef axis : global.getSplitAxes(d)) {
        axes->add_axes(axis.str());
        parts *= grid.sizes.at(axis.str());
      }
    buffer.add_global_shape(local.getDimSize(d) * parts);
  }
}

LogicalResult translateStage(func::FuncOp function, int64_t stageIndex,
                             bool last, const GridSizes &grid, pxe::Stage &stage) {
  stage.set_index(stageIndex);
  DenseMap<Value, int32_t> ids;
  auto addBuffer = [&](Value value) -> FailureOr<pxe::Buffer *> {
    auto type = dyn_cast<RankedTensorType>(value.getType());
    if (!type || !type.hasStaticShape())
      return emitError(value.getLoc()) << "executables hold static tensors only";
    FailureOr<pxe::DType> dtype = dtypeOf(type, value.getLoc());
    if (failed(dtype))
      return failure();
    pxe::Buffer *buffer = stage.add_buffers();
    buffer->set_id(stage.buffers_size() - 1);
    buffer->set_dtype(*dtype);
    for (int64_t d : type.getShape())
      buffer->add_shape(d);
    buffer->set_role(pxe::TEMPORARY);
    ids[value] = buffer->id();
    return buffer;
  };

  int32_t inputs = 0;
  for (BlockArgument arg : function.getArguments()) {
    FailureOr<pxe::Buffer *> buffer = addBuffer(arg);
    if (failed(buffer))
      return failure();
    unsigned n = arg.getArgNumber();
    if (auto param = function.getArgAttrOfType<StringAttr>(n, ParaxDialect::kParamAttrName)) {
      (*buffer)->set_role(pxe::PARAMETER);
      (*buffer)->set_param_name(param.getValue().str());
    } else {
      // A pipeline stage's data argument says which program input it is;
      // an unpartitioned function's are the inputs in order.
      auto index = function.getArgAttrOfType<IntegerAttr>(
          n, ParaxDialect::kInputAttrName);
      (*buffer)->set_role(pxe::INPUT);
      (*buffer)->set_input_index(index ? index.getInt() : inputs);
      ++inputs;
    }
    auto type = cast<RankedTensorType>(arg.getType());
    auto global = function.getArgAttrOfType<ShardingAttr>(
        n, ParaxDialect::kGlobalShardingAttrName);
    addBox(**buffer, type, global, grid);
    auto offset = function.getArgAttrOfType<DenseI64ArrayAttr>(n, ParaxDialect::kParamOffsetAttrName);
    auto whole = function.getArgAttrOfType<DenseI64ArrayAttr>(n, ParaxDialect::kParamShapeAttrName);
    if (offset && whole) {
      for (int64_t d = 0; d < type.getRank(); ++d) {
        if (offset[d] + (*buffer)->global_shape(d) > whole[d])
          return function.emitError("argument #")
                 << n << ": its piece (offset " << offset[d] << ", extent " << (*buffer)->global_shape(d)
                 << " in dimension " << d << ") is outside the checkpoint tensor (extent " << whole[d] << ")";
        (*buffer)->add_param_offset(offset[d]);
        (*buffer)->add_param_shape(whole[d]);
      }
    }
    if (global)
      for (Attribute axis : global.getPartialAxes())
        (*buffer)->add_partial(cast<StringAttr>(axis).getValue().str());
  }

  for (Operation &op : function.getBody().front()) {
    if (auto ret = dyn_cast<func::ReturnOp>(op)) {
      // Every stage may return results (a training step's gradients come
      // from the stages holding their parameters); each says which result
      // of the program it is, and a split one where its box lies.
      bool trains = false, numbered = false, terms = false, parts = false;
      for (auto [k, value] : llvm::enumerate(ret.getOperands())) {
        stage.add_outputs(ids.at(value));
        auto result = function.getResultAttrOfType<IntegerAttr>(k, ParaxDialect::kResultAttrName);
        numbered |= bool(result);
        stage.add_output_results(result ? result.getInt() : k);
        if (auto global = function.getResultAttrOfType<ShardingAttr>(
                k, ParaxDialect::kGlobalShardingAttrName)) {
          pxe::Buffer &buffer = *stage.mutable_buffers(ids.at(value));
          if (buffer.role() != pxe::TEMPORARY || buffer.global_shape_size())
            return ret.emitError("result #") << k << " is split but not computed by the stage alone";
          addBox(buffer, cast<RankedTensorType>(value.getType()), global, grid);
          // A gradient that is a partial sum: the runtime sums it over these
          // axes with its data-parallel reduction.
          for (Attribute axis : global.getPartialAxes())
            buffer.add_partial(cast<StringAttr>(axis).getValue().str());
        }
        auto grad = function.getResultAttrOfType<StringAttr>(k, ParaxDialect::kGradAttrName);
        if (!grad && stage.buffers(ids.at(value)).partial_size())
          return ret.emitError("result #")
                 << k << " is a partial sum but not a gradient (the runtime adds the partial sums of "
                 << "gradients only)";
        std::string name = grad ? grad.getValue().str() : "";
        // A piece of a fused tensor: "<name>@<offset>,...".
        if (auto offset = function.getResultAttrOfType<DenseI64ArrayAttr>(
                k, ParaxDialect::kParamOffsetAttrName)) {
          name += "@";
          for (auto [i, o] : llvm::enumerate(offset.asArrayRef()))
            name += (i ? "," : "") + std::to_string(o);
        }
        stage.add_output_grads(name);
        trains |= bool(grad);
        auto term = function.getResultAttrOfType<StringAttr>(k, ParaxDialect::kLossTermAttrName);
        stage.add_output_terms(term ? term.getValue().str() : "");
        terms |= bool(term);
        bool part = bool(function.getResultAttr(k, ParaxDialect::kStagePartAttrName));
        stage.add_output_stage_parts(part);
        parts |= part;
      }
      if (!trains)
        stage.clear_output_grads();
      if (!terms)
        stage.clear_output_terms();
      if (!parts)
        stage.clear_output_stage_parts();
      if (!numbered && last)
        stage.clear_output_results(); // the last stage's results in order
      else if (!numbered && ret.getNumOperands() > 0)
        return ret.emitError("an earlier pipeline stage returns results that do not say which "
                             "('parax.result')");
      continue;
    }
    if (!isa<ParaxDialect>(op.getDialect()))
      return op.emitError("executables hold parax ops only");
    pxe::Instruction *inst = stage.add_instructions();
    std::string name = op.getName().stripDialect().str(), upper = "OP_";
    for (char c : name) upper += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    pxe::OpKind kind;
    if (!pxe::OpKind_Parse(upper, &kind) || kind == pxe::OP_UNKNOWN)
      return op.emitError("the executable format has no op '") << name << "' (no runtime runs it)";
    inst->set_kind(kind);
    for (Value operand : op.getOperands()) {
      auto it = ids.find(operand);
      if (it == ids.end())
        return op.emitError("operand defined outside the stage");
      inst->add_operands(it->second);
    }
    for (Value result : op.getResults()) {
      FailureOr<pxe::Buffer *> buffer = addBuffer(result);
      if (failed(buffer))
        return failure();
      inst->add_results((*buffer)->id());
    }
    for (NamedAttribute attr : op.getAttrs()) {
      std::string name = attr.getName().str();
      if (name == ParaxDialect::kShardingsAttrName || name == ParaxDialect::kStageAttrName)
        continue;
      if (name == ParaxDialect::kLayerAttrName)
        name = "layer";
      if (failed(addAttr(*inst->mutable_attrs(), name, attr.getValue(), op.getLoc())))
        return failure();
    }
  }
  return success();
}

} // namespace

LogicalResult parax::translateToExecutable(ModuleOp module, llvm::raw_ostream &os) {
  pxe::Executable exe;
  exe.set_format_version(kFormatVersion);
  GridSizes grid;
  SmallVector<int64_t> shape;
  auto grids = module.getOps<GridOp>();
  if (std::distance(grids.begin(), grids.end()) > 1)
    return module.emitError("an executable runs on one grid; the module has several");
  if (!grids.empty()) {
    GridOp g = *grids.begin();
    for (auto [name, size] : llvm::zip(g.getAxisNames(), g.getShape())) {
      std::string axis = cast<StringAttr>(name).getValue().str();
      exe.mutable_grid()->add_axis_names(axis);
      exe.mutable_grid()->add_shape(size);
      grid.sizes[axis] = size;
      shape.push_back(size);
    }
  }
  // (as the planner: a grid past 2^24 ranks is no cluster, and its rank
  // table alone would not fit in memory)
  constexpr int64_t kMaxRanks = int64_t(1) << 24;
  int64_t devices = 1;
  for (int64_t s : shape) {
    if (s > kMaxRanks / devices)
      return (*grids.begin()).emitError("the grid has more than ")
             << kMaxRanks << " ranks: no executable runs on that many";
    devices *= s;
  }
  for (int64_t rank = 0; rank < devices; ++rank) {
    pxe::Coordinates *coords = exe.add_ranks();
    SmallVector<int64_t> c(shape.size());
    int64_t r = rank;
    for (int64_t i = shape.size() - 1; i >= 0; --i) {
      c[i] = r % shape[i];
      r /= shape[i];
    }
    for (int64_t v : c)
      coords->add_values(v);
  }

  // Stage functions, in stage order.
  std::map<int64_t, func::FuncOp> stages;
  std::string scheduleKind = "1f1b";
  int64_t microBatches = 1, zeroStage = 0, chunks = 1;
  for (auto function : module.getOps<func::FuncOp>()) {
    if (function.isExternal())
      continue;
    int64_t index = 0;
    if (auto pipeline = function->getAttrOfType<PipelineAttr>(ParaxDialect::kPipelineAttrName)) {
      index = pipeline.getStage();
      scheduleKind = pipeline.getSchedule().str();
      microBatches = pipeline.getMicroBatches();
      zeroStage = pipeline.getZero();
      chunks = pipeline.getChunks();
    }
    if (!stages.emplace(index, function).second)
      return function.emitError("two functions for pipeline stage ") << index;
  }
  if (stages.empty())
    return module.emitError("no function to translate");
  int64_t expected = 0;
  for (auto &[index, function] : stages) {
    if (index != expected++)
      return function.emitError("pipeline stages must be 0 .. n-1");
    bool last = index + 1 == static_cast<int64_t>(stages.size());
    if (failed(translateStage(function, index, last, grid, *exe.add_stages())))
      return failure();
  }
  exe.mutable_schedule()->set_kind(scheduleKind);
  exe.mutable_schedule()->set_micro_batches(microBatches);
  exe.mutable_schedule()->set_zero_stage(static_cast<int32_t>(zeroStage));
  if (chunks > 1)
    exe.mutable_schedule()->set_chunks(static_cast<int32_t>(chunks));
  // Deterministically: an attribute map's entries sorted by key (their
  // hash order made each translation of one IR a different file).
  std::string bytes;
  {
    google::protobuf::io::StringOutputStream stream(&bytes);
    google::protobuf::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    if (!exe.SerializeToCodedStream(&coded) || coded.HadError())
      return module.emitError("cannot serialise the executable");
  }
  os << bytes;
  return success();
}

void parax::registerToExecutableTranslation() {
  TranslateFromMLIRRegistration registration(
      "to-executable", "write a partitioned parax module as a .pxe executable",
      [](Operation *op, llvm::raw_ostream &os) -> LogicalResult {
        auto module = dyn_cast<ModuleOp>(op);
        if (!module)
          return op->emitError("expected a module");
        return translateToExecutable(module, os);
      },
      [](DialectRegistry &registry) {
        registry.insert<ParaxDialect, func::FuncDialect>();
      });
}
