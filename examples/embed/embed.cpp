// parax-embed-example: how a compiler embeds parax.
//
// Builds a two-layer Transformer-style model in its own code (no parser, no
// Python), asks the planner for ranked plans as C++ values, runs the
// plan -> partition pipeline, and prints the collectives each pipeline stage
// (and so each rank of it) runs.
//
//   parax-embed-example [CLUSTER] [WORKLOAD] [EXECUTABLE.pxe]

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/Parax.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Builders.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Pass/PassManager.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/raw_ostream.h"

#include <map>
#include <string>

using namespace mlir;

namespace {

// tokens [1, 16] -> embedding -> 2 x (rms_norm, up, silu, down, residual)
// -> rms_norm -> lm head; hidden 4096, FFN 14336, vocabulary 32000, bf16.
OwningOpRef<ModuleOp> buildModel(MLIRContext &ctx) {
  const int64_t B = 1, S = 16, H = 4096, F = 14336, V = 32000, L = 2;
  OpBuilder b(&ctx);
  Location loc = b.getUnknownLoc();
  OwningOpRef<ModuleOp> module = ModuleOp::create(loc);
  Type bf16 = b.getBF16Type();
  auto tensor = [&](ArrayRef<int64_t> shape, Type t) { return RankedTensorType::get(shape, t); };

  SmallVector<Type> args = {tensor({B, S}, b.getI32Type()), tensor({V, H}, bf16)};
  for (int64_t i = 0; i < L; ++i)
    args.append({tensor({H}, bf16), tensor({F, H}, bf16), tensor({H, F}, bf16)});
  args.append({tensor({H}, bf16), tensor({V, H}, bf16)});
  auto result = tensor({B, S, V}, bf16);
  b.setInsertionPointToEnd(module->getBody());
  auto function = func::FuncOp::create(b, loc, "forward", b.getFunctionType(args, {result}));
  Block *body = function.addEntryBlock();
  auto param = [&](unsigned i, const std::string &name) {
    function.setArgAttr(i, parax::ParaxDialect::kParamAttrName, b.getStringAttr(name));
    return body->getArgument(i);
  };
  b.setInsertionPointToStart(body);
  auto layer = [&](Operation *op, int64_t index) {
    op->setAttr(parax::ParaxDialect::kLayerAttrName, b.getI64IntegerAttr(index));
    return op->getResult(0);
  };
  auto act = tensor({B, S, H}, bf16);
  Value h = layer(parax::EmbeddingOp::create(b, loc, act, body->getArgument(0),
                                             param(1, "model.embed_tokens.weight"),
                                             nullptr, nullptr),
                  -1);
  for (int64_t i = 0; i < L; ++i) {
    std::string p = "model.layers." + std::to_string(i) + ".";
    unsigned a = 2 + 3 * i;
    Value x = layer(parax::RmsNormOp::create(b, loc, act, h, param(a, p + "norm.weight"),
                                             b.getF64FloatAttr(1e-5)),
                    i);
    Value up = layer(parax::LinearOp::create(b, loc, tensor({B, S, F}, bf16), x,
                                             param(a + 1, p + "mlp.up_proj.weight"), Value(),
                                             b.getUnitAttr()),
                     i);
    Value s = layer(parax::SiluOp::create(b, loc, up.getType(), up), i);
    Value down = layer(parax::LinearOp::create(b, loc, act, s,
                                               param(a + 2, p + "mlp.down_proj.weight"),
                                               Value(), b.getUnitAttr()),
                       i);
    h = layer(parax::AddOp::create(b, loc, act, h, down), i);
  }
  unsigned n = args.size();
  Value x = layer(parax::RmsNormOp::create(b, loc, act, h, param(n - 2, "model.norm.weight"),
                                           b.getF64FloatAttr(1e-5)),
                  L);
  Value logits = layer(parax::LinearOp::create(b, loc, result, x, param(n - 1, "lm_head.weight"),
                                               Value(), b.getUnitAttr()),
                       L);
  func::ReturnOp::create(b, loc, logits);
  return module;
}

} // namespace

int main(int argc, char **argv) {
  std::string cluster = argc > 1 ? argv[1] : "dgx-h100:devices_per_node=4";
  std::string workload = argc > 2 ? argv[2] : "decode:batch=8,context=4096";
  std::string executable = argc > 3 ? argv[3] : "embed.pxe";

  DialectRegistry registry;
  parax::registerAllDialects(registry);
  MLIRContext context(registry);
  context.loadAllAvailableDialects();
  OwningOpRef<ModuleOp> module = buildModel(context);
  if (failed(verify(*module)))
    return 1;

  // 1. The planner, directly: ranked plans as C++ values.
  parax::plan::PlanOptions options;
  options.topK = 3;
  FailureOr<parax::plan::PlanResult> plans =
      parax::planModule(*module, cluster, workload, options);
  if (failed(plans))
    return 1;
  if (plans->plans.empty()) {
    llvm::outs() << "no plan: " << plans->explanation << "\n";
    return 2;
  }
  llvm::outs() << llvm::formatv("model: {0:F2} B parameters on {1} devices ({2}, {3})\n",
                                plans->params / 1e9, plans->devices, cluster, workload);
  for (const parax::plan::Plan &p : plans->plans)
    llvm::outs() << llvm::formatv("  plan {0}: step {1:F3} ms, {2:F2} GB per device\n",
                                  p.degrees(), p.stepTime * 1e3, p.memory.total() / 1e9);

  // 2. The pipeline: plan (the best), partition, write the executable.
  PassManager pm(&context);
  parax::buildPlanPartitionPipeline(pm, {cluster, workload, /*partition=*/true, executable});
  if (failed(pm.run(*module)))
    return 1;

  // 3. What each stage's ranks run.
  for (auto function : module->getOps<func::FuncOp>()) {
    std::map<std::string, int> counts;
    function.walk([&](Operation *op) {
      if (op->getAttr("axes"))
        ++counts[op->getName().stripDialect().str()];
    });
    llvm::outs() << "@" << function.getSymName() << " (every rank of its stage):";
    for (const auto &[name, count] : counts)
      llvm::outs() << " " << name << " x" << count;
    llvm::outs() << "\n";
  }
  llvm::outs() << "executable: " << executable << "\n";
  return 0;
}
