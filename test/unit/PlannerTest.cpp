//===- PlannerTest.cpp - the planner's parts against hand counts ----------===//
//
// The column/row names here are ours (y = x · W, Megatron's); the seed
// article's "row split" is our column-parallel (docs/glossary.md).

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/InitAll.h"
#include "parax/Plan/Planner.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <random>

using namespace mlir;
using namespace parax::plan;
using llvm::Expected;

namespace {

class PlannerTest : public ::testing::Test {
protected:
  PlannerTest() {
    DialectRegistry registry;
    parax::registerAllDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
    cluster = cantFail(resolveCluster("dgx-h100"));
  }

  ModelGraph analyze(const std::string &source) {
    module = parseSourceString<ModuleOp>(source, &context);
    EXPECT_TRUE(module);
    auto function = *module->getOps<func::FuncOp>().begin();
    FailureOr<ModelGraph> graph = analyzeModel(function);
    EXPECT_TRUE(succeeded(graph));
    return *graph;
  }

  // tokens -> embedding (prologue); layer 0: two linears (`residual` adds
  // the residual connection); epilogue: the lm head. Hidden 1024, FFN 4096,
  // 8 x 2048 tokens, bf16.
  std::string mlp(bool residual = false) {
    if (!residual) {
      std::string text = mlp(true);
      text.replace(text.find("  %r = parax.add"), text.find("  %l =") - text.find("  %r = parax.add"), "");
      text.replace(text.find("parax.linear %r,"), 16, "parax.linear %d,");
      return text;
    }
    return R"mlir(
func.func @forward(%tok: tensor<8x2048xi32>,
    %emb: tensor<1024x1024xbf16> {parax.param = "emb"},
    %up: tensor<4096x1024xbf16> {parax.param = "up"},
    %down: tensor<1024x4096xbf16> {parax.param = "down"},
    %head: tensor<1024x1024xbf16> {parax.param = "head"}) -> tensor<8x2048x1024xbf16> {
  %h = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<8x2048xi32>, tensor<1024x1024xbf16>) -> tensor<8x2048x1024xbf16>
  %u = parax.linear %h, %up {transpose_w, parax.layer = 0 : i64} : (tensor<8x2048x1024xbf16>, tensor<4096x1024xbf16>) -> tensor<8x2048x4096xbf16>
  %d = parax.linear %u, %down {transpose_w, parax.layer = 0 : i64} : (tensor<8x2048x4096xbf16>, tensor<1024x4096xbf16>) -> tensor<8x2048x1024xbf16>
  %r = parax.add %h, %d {parax.layer = 0 : i64} : (tensor<8x2048x1024xbf16>, tensor<8x2048x1024xbf16>) -> tensor<8x2048x1024xbf16>
  %l = parax.linear %r, %head {transpose_w, parax.layer = 1 : i64} : (tensor<8x2048x1024xbf16>, tensor<1024x1024xbf16>) -> tensor<8x2048x1024xbf16>
  return %l : tensor<8x2048x1024xbf16>
}
)mlir";
  }

  // tokens -> embedding; layer 0: q, k, v (4096 -> 4096, 256, 256), 32
  // query heads on 2 KV heads of 128, causal attention, o, the residual add;
  // 2 x 512 tokens, bf16.
  std::string attentionBlock() {
    return R"mlir(
func.func @forward(%tok: tensor<2x512xi32>,
    %emb: tensor<512x4096xbf16> {parax.param = "emb"},
    %wq: tensor<4096x4096xbf16> {parax.param = "q"},
    %wk: tensor<256x4096xbf16> {parax.param = "k"},
    %wv: tensor<256x4096xbf16> {parax.param = "v"},
    %wo: tensor<4096x4096xbf16> {parax.param = "o"}) -> tensor<2x512x4096xbf16> {
  %h = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<2x512xi32>, tensor<512x4096xbf16>) -> tensor<2x512x4096xbf16>
  %q = parax.linear %h, %wq {transpose_w, parax.layer = 0 : i64} : (tensor<2x512x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<2x512x4096xbf16>
  %k = parax.linear %h, %wk {transpose_w, parax.layer = 0 : i64} : (tensor<2x512x4096xbf16>, tensor<256x4096xbf16>) -> tensor<2x512x256xbf16>
  %v = parax.linear %h, %wv {transpose_w, parax.layer = 0 : i64} : (tensor<2x512x4096xbf16>, tensor<256x4096xbf16>) -> tensor<2x512x256xbf16>
  %q4 = parax.reshape %q {parax.layer = 0 : i64} : (tensor<2x512x4096xbf16>) -> tensor<2x512x32x128xbf16>
  %k4 = parax.reshape %k {parax.layer = 0 : i64} : (tensor<2x512x256xbf16>) -> tensor<2x512x2x128xbf16>
  %v4 = parax.reshape %v {parax.layer = 0 : i64} : (tensor<2x512x256xbf16>) -> tensor<2x512x2x128xbf16>
  %o = parax.attention %q4, %k4, %v4 {causal, num_heads = 32, num_kv_heads = 2, head_dim = 128, scale = 0.088 : f64, parax.layer = 0 : i64}
      : (tensor<2x512x32x128xbf16>, tensor<2x512x2x128xbf16>, tensor<2x512x2x128xbf16>) -> tensor<2x512x32x128xbf16>
  %o3 = parax.reshape %o {parax.layer = 0 : i64} : (tensor<2x512x32x128xbf16>) -> tensor<2x512x4096xbf16>
  %y = parax.linear %o3, %wo {transpose_w, parax.layer = 0 : i64} : (tensor<2x512x4096xbf16>, tensor<4096x4096xbf16>) -> tensor<2x512x4096xbf16>
  %r = parax.add %h, %y {parax.layer = 0 : i64} : (tensor<2x512x4096xbf16>, tensor<2x512x4096xbf16>) -> tensor<2x512x4096xbf16>
  return %r : tensor<2x512x4096xbf16>
}
)mlir";
  }

  // mlp(true) with its output as the logits of a cross-entropy over
  // int32 labels [8, 2048] (the loss in the head's layer).
  std::string mlpWithLoss() {
    std::string text = mlp(true);
    text.replace(text.find("%head: tensor<1024x1024xbf16> {parax.param = \"head\"})"),
                 std::string("%head: tensor<1024x1024xbf16> {parax.param = \"head\"})").size(),
                 "%head: tensor<1024x1024xbf16> {parax.param = \"head\"}, %labels: tensor<8x2048xi32>)");
    text.replace(text.find("-> tensor<8x2048x1024xbf16> {"), 30, "-> tensor<f32> {");
    text.replace(text.find("  return %l : tensor<8x2048x1024xbf16>"), 39,
                 "  %loss = parax.cross_entropy %l, %labels {parax.layer = 1 : i64} : (tensor<8x2048x1024xbf16>, "
                 "tensor<8x2048xi32>) -> tensor<f32>\n  return %loss : tensor<f32>");
    return text;
  }

  // attentionBlock's layer at one rank, a training step of its 2 x 512
  // tokens.
  TpContext attentionTraining() {
    TpContext ctx = tpContext(1);
    ctx.sequences = 2;
    ctx.queryLen = ctx.contextLen = 512;
    ctx.train = true;
    return ctx;
  }

  TpContext tpContext(int64_t tp) {
    TpContext ctx;
    ctx.cluster = &cluster;
    ctx.peak = peakFlops(cluster, "bf16");
    ctx.tp = tp;
    ctx.group = makeGroup(cluster, tp, 1);
    ctx.sequences = 8;
    ctx.queryLen = ctx.contextLen = 2048;
    return ctx;
  }

  // The best plan of `model` on `clusterSpec` for `workload` under the
  // profile written `profileJson` (an empty plan, and a failure, if none).
  static Plan bestUnder(const ModelGraph &model, ClusterSpec clusterSpec, const std::string &workload,
                        const char *profileJson) {
    clusterSpec.profile = cantFail(parseProfile(profileJson));
    PlanResult result = searchPlans(model, clusterSpec, cantFail(parseWorkload(workload)), PlanOptions());
    EXPECT_FALSE(result.plans.empty()) << profileJson;
    return result.plans.empty() ? Plan() : result.plans.front();
  }

  static std::vector<std::string> kinds(const LayerPlan &plan) {
    std::vector<std::string> out;
    for (const CollectiveUse &use : plan.collectives)
      out.push_back(toString(use.kind).str());
    return out;
  }

  MLIRContext context;
  OwningOpRef<ModuleOp> module;
  ClusterSpec cluster;
};

TEST_F(PlannerTest, MegatronPairingComesOutOfTheSearch) {
  ModelGraph model = analyze(mlp());
  const LayerGraph &layer = model.layers[1];
  ASSERT_EQ(layer.index, 0);
  LayerPlan plan = solveLayer(layer, tpContext(4));
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(plan.strategy[0], "column");
  EXPECT_EQ(plan.strategy[1], "row");
  EXPECT_EQ(kinds(plan), std::vector<std::string>({"all_reduce"}));
}

// With the residual add in the layer, the solver splits the add between a
// reduce-scatter and an all-gather (the two halves of a ring all-reduce, as
// sequence parallelism does): same bytes, the add done on a quarter each.
TEST_F(PlannerTest, ResidualAddMaySplitTheAllReduce) {
  ModelGraph model = analyze(mlp(/*residual=*/true));
  LayerPlan plan = solveLayer(model.layers[1], tpContext(4));
  EXPECT_EQ(plan.strategy[0], "column");
  EXPECT_EQ(plan.strategy[1], "row");
  EXPECT_EQ(kinds(plan), std::vector<std::string>({"reduce_scatter", "all_gather"}));
  TpContext ctx = tpContext(4);
  ctx.forced = {{2, "replicated"}}; // the add on whole tensors
  LayerPlan whole = solveLayer(model.layers[1], ctx);
  EXPECT_EQ(kinds(whole), std::vector<std::string>({"all_reduce"}));
  EXPECT_LT(plan.objective, whole.objective);
}

TEST_F(PlannerTest, DecomposedCollectivesHideBehindTheGemmsThatMakeOrReadTheirValue) {
  // The residual MLP at TP4: the reduce-scatter of the down projection's
  // partial sums (its result, %d) pairs with that GEMM, hidden up to 3/4
  // of its time (a ring exchange's first chunk computes before any
  // transfer); the all-gather closing the layer's output (%r, the add's)
  // has no GEMM in the layer beside it and stays exposed.
  ModelGraph model = analyze(mlp(/*residual=*/true));
  LayerPlan plan = solveLayer(model.layers[1], tpContext(4));
  ASSERT_EQ(kinds(plan), std::vector<std::string>({"reduce_scatter", "all_gather"}));
  const CollectiveUse &scatter = plan.collectives[0];
  ASSERT_GT(scatter.seconds, 0);
  double down = plan.opTimes[1];
  EXPECT_DOUBLE_EQ(plan.commBehindGemms, std::min(scatter.seconds, 0.75 * down));
  EXPECT_LT(plan.commBehindGemms, plan.commTime);
  // The planner leaves the rest exposed under a profile that decomposes
  // them, and a share of all under one that overlaps by a share.
  auto tpExposed = [&](const char *profile) {
    return bestUnder(model, cantFail(resolveCluster("dgx-h100:devices_per_node=4,nodes=1")),
                     "train:batch=8,seq=2048,dp=1,tp=4,pp=1,ep=1,cp=1,mbs=8,sp=1,recompute=none,zero=0", profile)
        .tpComm;
  };
  double none = tpExposed(R"({"name": "none"})");
  double decomposed = tpExposed(R"({"name": "ub", "tp_overlap_gemms": true})");
  double half = tpExposed(R"({"name": "half", "tp_overlap": 0.5})");
  EXPECT_GT(none, decomposed);
  EXPECT_NEAR(half, none / 2, 1e-12 + 1e-9 * none);
  // PyTorch's AsyncTP decomposes the forward's collectives alone: the
  // forward's share hidden, the backward's conjugates all exposed, half way
  // between the two.
  double forwardOnly =
      tpExposed(R"({"name": "async", "tp_overlap_gemms": true, "tp_overlap_backward": false})");
  EXPECT_NEAR(forwardOnly, (none + decomposed) / 2, 1e-12 + 1e-9 * none);
  EXPECT_GT(forwardOnly, decomposed);
}

TEST_F(PlannerTest, ForcedPairingsCostTheirCollectives) {
  ModelGraph model = analyze(mlp());
  const LayerGraph &layer = model.layers[1];
  auto forced = [&](const char *first, const char *second) {
    TpContext ctx = tpContext(4);
    ctx.forced = {{0, first}, {1, second}};
    return solveLayer(layer, ctx);
  };
  LayerPlan colRow = forced("column", "row");
  LayerPlan colCol = forced("column", "column");
  LayerPlan rowRow = forced("row", "row");
  // col -> col: gather the split activation for the second layer, and its
  // split output at the end (the seed article's "row -> row").
  EXPECT_EQ(kinds(colCol), std::vector<std::string>({"all_gather", "all_gather"}));
  // row -> row: partial sums before the second layer (a reduce-scatter leaves
  // them split as it needs) and after it (the article's "col -> col").
  EXPECT_EQ(kinds(rowRow), std::vector<std::string>({"reduce_scatter", "all_reduce"}));
  EXPECT_EQ(kinds(colRow), std::vector<std::string>({"all_reduce"}));
  EXPECT_LT(colRow.commTime, colCol.commTime);
  EXPECT_LT(colRow.commTime, rowRow.commTime);
  EXPECT_LT(colRow.objective, colCol.objective);
  EXPECT_LT(colRow.objective, rowRow.objective);
}

TEST_F(PlannerTest, DynamicProgramMatchesExhaustiveEnumeration) {
  ModelGraph model = analyze(mlp());
  for (int64_t tp : {1, 2, 4, 8})
    for (bool sp : {false, true}) {
      TpContext ctx = tpContext(tp);
      ctx.sequenceParallel = sp;
      for (size_t l = 0; l < model.layers.size(); ++l) {
        bool last = l + 1 == model.layers.size();
        LayerPlan plan = solveLayer(model.layers[l], ctx, last);
        double exhaustive = solveLayerExhaustively(model.layers[l], ctx, last);
        EXPECT_NEAR(plan.objective, exhaustive, 1e-12 * exhaustive)
            << "layer " << l << " tp " << tp << " sp " << sp;
      }
    }
}

// Under sequence parallelism a norm read by two column-parallel linears
// (gate and up) runs on its rows and its output is gathered once: the
// partitioner shares one gathered copy among the readers, and the solver
// costs it so. (It used to charge a gather to each reader, which made the
// norm on every row of the sequence, its input gathered once, look
// cheaper.)
TEST_F(PlannerTest, AValueGatheredForOneReaderIsGatheredForTheNext) {
  ModelGraph model = analyze(R"mlir(
func.func @forward(%tok: tensor<8x2048xi32>,
    %emb: tensor<1024x1024xbf16> {parax.param = "emb"},
    %norm: tensor<1024xbf16> {parax.param = "norm"},
    %gate: tensor<4096x1024xbf16> {parax.param = "gate"},
    %up: tensor<4096x1024xbf16> {parax.param = "up"},
    %down: tensor<1024x4096xbf16> {parax.param = "down"},
    %head: tensor<1024x1024xbf16> {parax.param = "head"}) -> tensor<8x2048x1024xbf16> {
  %h = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<8x2048xi32>, tensor<1024x1024xbf16>) -> tensor<8x2048x1024xbf16>
  %n = parax.rms_norm %h, %norm {eps = 1.0e-5 : f64, parax.layer = 0 : i64} : (tensor<8x2048x1024xbf16>, tensor<1024xbf16>) -> tensor<8x2048x1024xbf16>
  %g = parax.linear %n, %gate {transpose_w, parax.layer = 0 : i64} : (tensor<8x2048x1024xbf16>, tensor<4096x1024xbf16>) -> tensor<8x2048x4096xbf16>
  %u = parax.linear %n, %up {transpose_w, parax.layer = 0 : i64} : (tensor<8x2048x1024xbf16>, tensor<4096x1024xbf16>) -> tensor<8x2048x4096xbf16>
  %s = parax.swiglu %g, %u {parax.layer = 0 : i64} : (tensor<8x2048x4096xbf16>, tensor<8x2048x4096xbf16>) -> tensor<8x2048x4096xbf16>
  %d = parax.linear %s, %down {transpose_w, parax.layer = 0 : i64} : (tensor<8x2048x4096xbf16>, tensor<1024x4096xbf16>) -> tensor<8x2048x1024xbf16>
  %r = parax.add %h, %d {parax.layer = 0 : i64} : (tensor<8x2048x1024xbf16>, tensor<8x2048x1024xbf16>) -> tensor<8x2048x1024xbf16>
  %l = parax.linear %r, %head {transpose_w, parax.layer = 1 : i64} : (tensor<8x2048x1024xbf16>, tensor<1024x1024xbf16>) -> tensor<8x2048x1024xbf16>
  return %l : tensor<8x2048x1024xbf16>
}
)mlir");
  const LayerGraph &layer = model.layers[1];
  ASSERT_EQ(layer.index, 0);
  TpContext ctx = tpContext(4);
  ctx.sequenceParallel = true;
  LayerPlan plan = solveLayer(layer, ctx);
  ASSERT_TRUE(plan.feasible);
  EXPECT_EQ(plan.strategy[0], "split1"); // the norm on the rank's rows
  EXPECT_EQ(plan.strategy[1], "column");
  EXPECT_EQ(plan.strategy[2], "column");
  // One all-gather of the norm's output for both linears, one
  // reduce-scatter of the down projection's partial sums.
  EXPECT_EQ(kinds(plan), std::vector<std::string>({"all_gather", "reduce_scatter"}));
  EXPECT_NEAR(plan.objective, solveLayerExhaustively(layer, ctx, false), 1e-12 * plan.objective);
}

// A grouped-query attention block: q/k/v projections, attention, output
// projection and the residual add.
TEST_F(PlannerTest, AttentionSplitsByHeadsAndMatchesExhaustive) {
  std::string source = attentionBlock();
  ModelGraph model = analyze(source);
  const LayerGraph &layer = model.layers[1];
  TpContext ctx = tpContext(2);
  // (The block's result is the program's, returned whole: its all-reduce is
  // paid, and at hidden 4096 splitting pays off.)
  ctx.sequences = 2;
  ctx.queryLen = ctx.contextLen = 512;
  LayerPlan plan = solveLayer(layer, ctx, /*lastLayer=*/true);
  // q, k, v column-parallel, attention by heads, o row-parallel.
  EXPECT_EQ(plan.strategy[0], "column");
  EXPECT_EQ(plan.strategy[1], "column");
  EXPECT_EQ(plan.strategy[2], "column");
  EXPECT_EQ(plan.strategy[6], "heads");
  EXPECT_EQ(plan.strategy[8], "row");
  // The result, returned, is all-reduced whole (it used to go free).
  EXPECT_EQ(kinds(plan), std::vector<std::string>({"all_reduce"}));
  EXPECT_NEAR(plan.objective, solveLayerExhaustively(layer, ctx, true),
              1e-12 * plan.objective);
  // Four ranks but two KV heads: KV heads are replicated, queries split.
  ctx.tp = 4;
  ctx.group = makeGroup(cluster, 4, 1);
  LayerPlan four = solveLayer(layer, ctx, true);
  EXPECT_EQ(four.strategy[6], "heads-kv-replicated");
  EXPECT_NEAR(four.objective, solveLayerExhaustively(layer, ctx, true),
              1e-12 * four.objective);
}

TEST_F(PlannerTest, AFlashAttentionsBackwardRunsItsFiveProductsAPair) {
  // Flash attention's backward recomputes the scores and runs dv, dP, dq,
  // dk: per (query, key) pair 2d + 5 + 2Dv again, then 2Dv + 5 + 4d,
  // against the forward's 2d + 5 + 2Dv (d = Dv = 128: 1290 against 517),
  // at the forward's rate. By hand: at 512 tokens the forward is bound by
  // its FLOPs (2 sequences x 32 heads x 512·513/2 causal pairs x 517 at
  // 989 TF x 0.716 x 0.972, a busy node's slowest H100: 6.32 us), not its
  // bytes (q and the output [2, 512, 32, 128], k and v [2, 512, 2, 128],
  // bf16, at 3,350 GB/s x 0.85: 6.26 us).
  ModelGraph model = analyze(attentionBlock());
  TpContext ctx = attentionTraining();
  LayerPlan plan = solveLayer(model.layers[1], ctx, /*lastLayer=*/true);
  double forward = 2.0 * 32 * (512.0 * 513 / 2) * 517 / (989e12 * 0.716 * 0.972);
  double bytes = 2.0 * (2 * 2 * 512 * 32 * 128 + 2 * 2 * 512 * 2 * 128) / (3350e9 * 0.85);
  ASSERT_GT(forward, bytes);
  EXPECT_NEAR(plan.opTimes[6], forward, 1e-9 * forward);
  EXPECT_NEAR(plan.backwardExtraTime, forward * (1290.0 / 517 - 2), 1e-9 * forward);
  // A materialised kernel's backward is four batched GEMMs against two.
  cluster.profile = cantFail(
      parseProfile(R"({"name": "m", "attention": "materialized", "score_bytes": 13, "score_kept_bytes": 5})"));
  EXPECT_EQ(solveLayer(model.layers[1], ctx, true).backwardExtraTime, 0);
}

TEST_F(PlannerTest, AMaterialisedAttentionKeepsItsScoresUnlessRecomputed) {
  // Korthikanti et al. 2022's 5 a s^2 b: the softmax's output (2 bytes),
  // the dropout's mask (1) and output (2) for every (query, key) pair,
  // causal or not: 2 sequences x 32 heads x 512 x 512 x 5 bytes = 83.9 MB
  // more kept than a flash kernel keeps (its inputs and output alike);
  // selective recomputation of the core attention keeps none of them.
  ModelGraph model = analyze(attentionBlock());
  TpContext ctx = attentionTraining();
  LayerPlan flash = solveLayer(model.layers[1], ctx, /*lastLayer=*/true);
  auto materialised = [&](const char *selective) {
    cluster.profile = cantFail(parseProfile(
        (R"({"name": "m", "attention": "materialized", "score_bytes": 13, "score_kept_bytes": 5, )"
         R"("selective_recompute": ")" + std::string(selective) + "\"}")));
    return solveLayer(model.layers[1], ctx, /*lastLayer=*/true);
  };
  double scores = 5.0 * 2 * 32 * 512 * 512;
  LayerPlan core = materialised("core_attention");
  EXPECT_NEAR(core.activationBytes[0] - flash.activationBytes[0], scores, 1e-6 * scores);
  EXPECT_NEAR(core.activationBytes[1], flash.activationBytes[1], 1e-6 * scores);
  // A stack without selective recomputation keeps them under it too (the
  // search does not try it there; a pin costs it as none).
  LayerPlan none = materialised("none");
  EXPECT_NEAR(none.activationBytes[1], none.activationBytes[0], 1e-6 * scores);
  // Split by heads over TP2, each rank keeps its heads' half.
  LayerPlan split = solveLayer(model.layers[1], [&] {
    TpContext two = attentionTraining();
    two.tp = 2;
    two.group = makeGroup(cluster, 2, 1);
    return two;
  }(), true);
  ASSERT_EQ(split.strategy[6], "heads");
  cluster.profile = Profile();
  TpContext two = attentionTraining();
  two.tp = 2;
  two.group = makeGroup(cluster, 2, 1);
  EXPECT_NEAR(split.activationBytes[0] - solveLayer(model.layers[1], two, true).activationBytes[0], scores / 2,
              1e-6 * scores);
}

TEST_F(PlannerTest, Fp8GemmsPayTheirStacksQuantisation) {
  // gemm=fp8 with a stack that moves 2 passes over each GEMM input and
  // output gradient and 4 over the weights a microbatch: q, k and v share
  // their input (cast once), o reads the attention's; the backward casts
  // the four outputs' gradients. By hand, bf16 bytes at 3,350 GB/s x 0.85.
  ModelGraph model = analyze(attentionBlock());
  TpContext ctx = attentionTraining();
  ctx.gemmBytes = 1;
  ctx.gemmPeak = cluster.gemmPeak("fp8");
  ctx.gemmInputShare = 0.5;
  auto solved = [&](const char *casts) {
    cluster.profile = cantFail(parseProfile((std::string(R"({"name": "p", "fp8_casts": )") + casts + "}").c_str()));
    return solveLayer(model.layers[1], ctx, /*lastLayer=*/true);
  };
  LayerPlan plain = solved(R"({"activations": 0, "weights": 0})");
  LayerPlan cast = solved(R"({"activations": 2, "weights": 4})");
  double bandwidth = 3350e9 * 0.85, tokens = 2 * 512;
  double inputs = 2 * (tokens * 4096 + tokens * 4096);                 // h (once), the attention's output
  double weights = 2 * (4096.0 * 4096 * 2 + 256.0 * 4096 * 2);         // q, o; k, v
  double outputs = 2 * (tokens * 4096 * 2 + tokens * 256 * 2);         // q, y; k, v
  double forward = (2 * inputs + 4 * weights) / bandwidth;
  EXPECT_NEAR(cast.computeTime - plain.computeTime, forward, 1e-9 * forward);
  EXPECT_NEAR(cast.backwardExtraTime - plain.backwardExtraTime, 2 * outputs / bandwidth - 2 * forward,
              1e-9 * forward);
  // Inference casts the inputs alone.
  ctx.train = false;
  double prefill = solved(R"({"activations": 2, "weights": 4})").computeTime -
                   solved(R"({"activations": 0, "weights": 0})").computeTime;
  EXPECT_NEAR(prefill, 2 * inputs / bandwidth, 1e-9 * forward);
  Expected<Profile> bad = parseProfile(R"({"name": "p", "fp8_casts": {"scales": 1}})", "p.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(toString(bad.takeError()).find("p.json: profile field 'fp8_casts.scales' is not an fp8 cast"),
            std::string::npos);
}

TEST_F(PlannerTest, EachStacksSelectiveRecomputationReRunsWhatItsCodeReRuns) {
  // Megatron's core attention: the attention alone. torchtitan's op-level
  // policy: every op but the attention and the odd GEMMs (q, v kept; k, the
  // 2nd, re-run for the attention's gradient, which reads it; o, the 4th,
  // not: no gradient of this block reads its result); the k projection's
  // [2, 512, 256] bf16 result is no longer kept. parax's runtime: the
  // attention (no GEMM here widens 4x).
  ModelGraph model = analyze(attentionBlock());
  TpContext ctx = attentionTraining();
  auto solved = [&](const char *policy) {
    cluster.profile = cantFail(parseProfile(
        (std::string(R"({"name": "p", "selective_recompute": ")") + policy + "\"}").c_str()));
    return solveLayer(model.layers[1], ctx, /*lastLayer=*/true);
  };
  LayerPlan core = solved("core_attention"), alternate = solved("alternate_gemms"),
            runtime = solved("runtime");
  EXPECT_DOUBLE_EQ(core.selectiveRecomputeTime, core.opTimes[6]);
  EXPECT_DOUBLE_EQ(runtime.selectiveRecomputeTime, runtime.opTimes[6]);
  EXPECT_DOUBLE_EQ(alternate.selectiveRecomputeTime, alternate.opTimes[2]);
  EXPECT_DOUBLE_EQ(alternate.activationBytes[0] - alternate.activationBytes[1], 2.0 * 512 * 256 * 2);
  // Without recomputation the policies keep the same.
  EXPECT_DOUBLE_EQ(alternate.activationBytes[0], core.activationBytes[0]);
  // A policy parax does not know is refused by name.
  Expected<Profile> bad = parseProfile(R"({"name": "p", "selective_recompute": "some"})", "p.json");
  ASSERT_FALSE(bad);
  EXPECT_NE(toString(bad.takeError()).find("p.json: profile field 'selective_recompute' must be"),
            std::string::npos);
}

TEST_F(PlannerTest, StagePartitionMatchesBruteForce) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<double> time(1, 10), mem(1, 5);
  for (int trial = 0; trial < 200; ++trial) {
    int n = 3 + trial % 8;
    int pp = 1 + trial % std::min(n, 4);
    std::vector<double> t(n), s(n), a(n);
    for (int i = 0; i < n; ++i) {
      t[i] = time(rng);
      s[i] = mem(rng);
      a[i] = mem(rng);
    }
    double capacity = 6 + trial % 20;
    auto inflight = [&](int64_t stage) { return double(pp - stage); };
    double best = 0;
    std::vector<int64_t> starts = partitionStages(t, s, a, inflight, capacity, pp, best);
    // Brute force over every choice of pp-1 cut points.
    double brute = std::numeric_limits<double>::infinity();
    std::function<void(int, int, double)> cut = [&](int stage, int begin, double worst) {
      int remaining = pp - stage;
      if (remaining == 1) {
        double st = 0, sm = 0, sa = 0;
        for (int i = begin; i < n; ++i)
          st += t[i], sm += s[i], sa += a[i];
        if (sm + inflight(stage) * sa <= capacity)
          brute = std::min(brute, std::max(worst, st));
        return;
      }
      double st = 0, sm = 0, sa = 0;
      for (int end = begin + 1; end <= n - (remaining - 1); ++end) {
        st += t[end - 1], sm += s[end - 1], sa += a[end - 1];
        if (sm + inflight(stage) * sa <= capacity)
          cut(stage + 1, end, std::max(worst, st));
      }
    };
    cut(0, 0, 0);
    if (std::isinf(brute)) {
      EXPECT_TRUE(starts.empty()) << "trial " << trial;
    } else {
      ASSERT_EQ(starts.size(), size_t(pp)) << "trial " << trial;
      EXPECT_DOUBLE_EQ(best, brute) << "trial " << trial;
    }
  }
}

TEST(InterleavedChunksTest, EachStageKeepsItsLayersInNearlyEqualChunks) {
  // 96 layers on 16 stages of 4 chunks: 6 a stage, in chunks of 2, 2, 1, 1
  // (virtual stages 0-31 of two layers, 32-63 of one).
  std::vector<int64_t> starts = interleavedChunks(std::vector<int64_t>(16, 6), 4);
  ASSERT_EQ(starts.size(), 64u);
  EXPECT_EQ(starts[1], 2);
  EXPECT_EQ(starts[32], 64);
  EXPECT_EQ(starts[63], 95);
  // Any counts: every stage's chunks hold its count, differing by a layer
  // at most, in the order of the virtual stages.
  std::mt19937 rng(11);
  for (int trial = 0; trial < 200; ++trial) {
    int64_t pp = 1 + trial % 5, chunks = 1 + trial % 4;
    std::vector<int64_t> counts(pp);
    for (int64_t &n : counts)
      n = chunks + rng() % 7;
    std::vector<int64_t> got = interleavedChunks(counts, chunks);
    ASSERT_EQ(got.size(), size_t(pp * chunks)) << "trial " << trial;
    int64_t total = std::accumulate(counts.begin(), counts.end(), int64_t(0));
    std::vector<int64_t> held(pp, 0), least(pp, total), most(pp, 0);
    for (int64_t c = 0; c < pp * chunks; ++c) {
      int64_t size = (c + 1 < pp * chunks ? got[c + 1] : total) - got[c];
      ASSERT_GE(size, 1) << "trial " << trial;
      held[c % pp] += size;
      least[c % pp] = std::min(least[c % pp], size);
      most[c % pp] = std::max(most[c % pp], size);
    }
    EXPECT_EQ(got.front(), 0);
    for (int64_t s = 0; s < pp; ++s) {
      EXPECT_EQ(held[s], counts[s]) << "trial " << trial;
      EXPECT_LE(most[s] - least[s], 1) << "trial " << trial;
    }
  }
  // A stage with fewer layers than chunks cannot fill them.
  EXPECT_TRUE(interleavedChunks({3, 1}, 2).empty());
}

TEST_F(PlannerTest, PruningKeepsTheOptimum) {
  ModelGraph model = analyze(mlp());
  Workload w = cantFail(parseWorkload("train:batch=64,seq=2048"));
  ClusterSpec two = cantFail(resolveCluster("dgx-h100:nodes=2"));
  PlanOptions pruned, full;
  full.prune = false;
  PlanResult a = searchPlans(model, two, w, pruned);
  PlanResult b = searchPlans(model, two, w, full);
  ASSERT_FALSE(a.plans.empty());
  ASSERT_EQ(a.plans.size(), b.plans.size());
  for (size_t i = 0; i < a.plans.size(); ++i) {
    EXPECT_EQ(a.plans[i].degrees(), b.plans[i].degrees());
    EXPECT_DOUBLE_EQ(a.plans[i].stepTime, b.plans[i].stepTime);
  }
}

TEST_F(PlannerTest, TensorParallelGroupsStayInsideANode) {
  ModelGraph model = analyze(mlp());
  Workload w = cantFail(parseWorkload("train:batch=64,seq=2048"));
  PlanOptions all;
  all.topK = 1000;
  PlanResult result = searchPlans(model, cantFail(resolveCluster("dgx-h100:nodes=4")), w, all);
  ASSERT_FALSE(result.plans.empty());
  for (const Plan &plan : result.plans)
    EXPECT_LE(plan.tp, 8) << plan.degrees();
}

TEST_F(PlannerTest, CollectiveTimesFollowTheAlphaBetaForms) {
  // 1 GB all-reduce over 8 H100s: 2·7/8 · 1 GB / (450 GB/s · 0.82), plus
  // 14 steps of 3.4 us and the 8.4 us launch.
  Group node = makeGroup(cluster, 8, 1);
  double expected = 8.4e-6 + 14 * 3.4e-6 + 2.0 * 7 / 8 * 1e9 / (450e9 * 0.82);
  EXPECT_NEAR(collectiveTime(cluster, CollectiveKind::AllReduce, 1e9, node),
              expected, 1e-9);
  // A group of 16 over two nodes goes hierarchical and is slower than one
  // inside a node.
  ClusterSpec two = cantFail(resolveCluster("dgx-h100:nodes=2"));
  Group spanning = makeGroup(two, 16, 1);
  EXPECT_EQ(spanning.nodes(), 2);
  EXPECT_GT(collectiveTime(two, CollectiveKind::AllReduce, 1e9, spanning),
            collectiveTime(two, CollectiveKind::AllReduce, 1e9, node));
  // Small messages are latency-bound (LL protocol): tens of microseconds.
  double small = collectiveTime(cluster, CollectiveKind::AllReduce, 16384, node);
  EXPECT_GT(small, 5e-6);
  EXPECT_LT(small, 30e-6);
}

TEST_F(PlannerTest, ZeroTwoSplitsTheSumsAndReduceScattersEveryMicrobatch) {
  // 16 replicas over two nodes joined by a slow network, 4 microbatches:
  // the data-parallel sync shows. ZeRO-2 splits the fp32 sums (4 bytes a
  // parameter) over the replicas, and adds the runtime's two fp32 staging
  // boxes of the largest box (up: 4096 x 1024); it reduce-scatters every
  // microbatch's gradients, each but the last one's beside the next
  // microbatch.
  ModelGraph model = analyze(mlp());
  ClusterSpec slow = cantFail(resolveCluster("dgx-h100:nodes=2"));
  slow.interNode.bandwidth /= 100;
  auto planned = [&](int zero) {
    Workload w = cantFail(parseWorkload("train:batch=64,seq=2048,dp=16,tp=1,pp=1,ep=1,cp=1,mbs=1,"
                                        "recompute=none,zero=" + std::to_string(zero)));
    PlanResult result = searchPlans(model, slow, w, PlanOptions());
    EXPECT_FALSE(result.plans.empty());
    return result.plans.empty() ? Plan() : result.plans.front();
  };
  Plan one = planned(1), two = planned(2);
  ASSERT_EQ(one.microBatches, 4);
  ASSERT_EQ(two.microBatches, 4);
  const double params = 1024.0 * 1024 + 2 * 4096.0 * 1024 + 1024.0 * 1024;
  EXPECT_DOUBLE_EQ(two.memory.optimizer, one.memory.optimizer - 4 * params * 15 / 16 + 2 * 4 * 4096.0 * 1024);
  Group replicas = makeGroup(slow, 16, 1);
  double reduceScatter = collectiveTime(slow, CollectiveKind::ReduceScatter, 4 * params, replicas);
  // (both exposed: one microbatch's time is the step's without the sync
  // and the update, over the 4)
  ASSERT_GT(one.dpComm, 0);
  ASSERT_GT(two.dpComm, 0);
  double microbatch = (two.stepTime - two.dpComm - two.optimizerTime) / 4;
  EXPECT_NEAR(two.dpComm - one.dpComm, 3 * (reduceScatter - microbatch), 1e-9 * two.stepTime);
}

TEST_F(PlannerTest, APipelineOfUnequalStagesTakesItsSlowestStagesMicrobatchesAndTheOthersOnce) {
  // Two unequal stages: the step's compute, bubble and TP terms are
  // pipelineTime of the stages' own passes, m x the slowest + the lighter
  // one once, not (m + 1) x the slowest.
  // Three decoder layers (attentionBlock's, one after the other) and a head
  // on two stages: two layers on one, one and the head on the other.
  std::string args, body = "  %r0 = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<2x512xi32>, "
                           "tensor<512x4096xbf16>) -> tensor<2x512x4096xbf16>\n";
  const std::string x = "tensor<2x512x4096xbf16>";
  for (int l = 0; l < 3; ++l) {
    std::string i = std::to_string(l), in = "%r" + i, out = "%r" + std::to_string(l + 1),
                at = " {transpose_w, parax.layer = " + i + " : i64} : ", tag = " {parax.layer = " + i + " : i64} : ";
    args += ", %wq" + i + ": tensor<4096x4096xbf16> {parax.param = \"q" + i + "\"}, %wk" + i +
            ": tensor<256x4096xbf16> {parax.param = \"k" + i + "\"}, %wv" + i +
            ": tensor<256x4096xbf16> {parax.param = \"v" + i + "\"}, %wo" + i +
            ": tensor<4096x4096xbf16> {parax.param = \"o" + i + "\"}";
    body += "  %q" + i + " = parax.linear " + in + ", %wq" + i + at + "(" + x + ", tensor<4096x4096xbf16>) -> " + x + "\n" +
            "  %k" + i + " = parax.linear " + in + ", %wk" + i + at + "(" + x +
            ", tensor<256x4096xbf16>) -> tensor<2x512x256xbf16>\n" +
            "  %v" + i + " = parax.linear " + in + ", %wv" + i + at + "(" + x +
            ", tensor<256x4096xbf16>) -> tensor<2x512x256xbf16>\n" +
            "  %q4" + i + " = parax.reshape %q" + i + tag + "(" + x + ") -> tensor<2x512x32x128xbf16>\n" +
            "  %k4" + i + " = parax.reshape %k" + i + tag + "(tensor<2x512x256xbf16>) -> tensor<2x512x2x128xbf16>\n" +
            "  %v4" + i + " = parax.reshape %v" + i + tag + "(tensor<2x512x256xbf16>) -> tensor<2x512x2x128xbf16>\n" +
            "  %o" + i + " = parax.attention %q4" + i + ", %k4" + i + ", %v4" + i +
            " {causal, num_heads = 32, num_kv_heads = 2, head_dim = 128, scale = 0.088 : f64, parax.layer = " + i +
            " : i64} : (tensor<2x512x32x128xbf16>, tensor<2x512x2x128xbf16>, tensor<2x512x2x128xbf16>) -> "
            "tensor<2x512x32x128xbf16>\n" +
            "  %o3" + i + " = parax.reshape %o" + i + tag + "(tensor<2x512x32x128xbf16>) -> " + x + "\n" +
            "  %y" + i + " = parax.linear %o3" + i + ", %wo" + i + at + "(" + x + ", tensor<4096x4096xbf16>) -> " + x +
            "\n" + "  " + out + " = parax.add " + in + ", %y" + i + tag + "(" + x + ", " + x + ") -> " + x + "\n";
  }
  std::string text = "func.func @forward(%tok: tensor<2x512xi32>, %emb: tensor<512x4096xbf16> {parax.param = "
                     "\"emb\"}" + args + ", %head: tensor<512x4096xbf16> {parax.param = \"head\"}) -> "
                     "tensor<2x512x512xbf16> {\n" + body +
                     "  %l = parax.linear %r3, %head {transpose_w, parax.layer = 3 : i64} : (" + x +
                     ", tensor<512x4096xbf16>) -> tensor<2x512x512xbf16>\n  return %l : tensor<2x512x512xbf16>\n}\n";
  ModelGraph model = analyze(text);
  Workload w = cantFail(parseWorkload("train:batch=2,seq=512,pp=2,dp=1,tp=4,ep=1,cp=1,mbs=1,recompute=none,"
                                      "schedule=1f1b,zero=0"));
  PlanResult result = searchPlans(model, cluster, w, PlanOptions());
  ASSERT_FALSE(result.plans.empty()) << result.explanation;
  const Plan &plan = result.plans.front();
  ASSERT_EQ(plan.pp, 2);
  ASSERT_EQ(plan.microBatches, 2);
  ASSERT_EQ(plan.stageForward.size(), 2u);
  double stage[2] = {plan.stageForward[0] + plan.stageBackward[0], plan.stageForward[1] + plan.stageBackward[1]};
  double slowest = std::max(stage[0], stage[1]), lighter = std::min(stage[0], stage[1]);
  ASSERT_LT(lighter, 0.8 * slowest); // (one layer and the head against two layers)
  double pipeline = plan.computeTime + plan.bubbleTime + plan.tpComm + plan.epComm + plan.cpComm;
  EXPECT_NEAR(pipeline, 2 * slowest + lighter, 1e-9 * pipeline);
  EXPECT_NEAR(plan.bubbleTime, lighter, 1e-9 * pipeline);
}

TEST_F(PlannerTest, GradientSyncWaitsWhileTheBackwardsCollectivesHoldItsLinks) {
  // One node: TP2 and DP4 share the node's links (NVLink, slowed 20x so
  // the sync outlasts the backward). The sync is overlapped with the last
  // backward, but not while that backward's own TP all-reduces hold the
  // links: it hides only behind the backward's compute (2/3 of one
  // microbatch's compute, no recompute: forward 1, backward 2), not its
  // collectives (half of the TP time: the forward's and the backward's).
  ModelGraph model = analyze(mlp(true));
  ClusterSpec c = cantFail(resolveCluster("dgx-h100"));
  c.intraNode.bandwidth /= 20;
  Workload w = cantFail(parseWorkload("train:batch=8,seq=2048,dp=4,tp=2,pp=1,ep=1,cp=1,mbs=2,"
                                      "recompute=none,zero=0,sp=0"));
  auto planned = [&](bool overlap) {
    ClusterSpec d = c;
    d.profile.dpOverlap = overlap;
    PlanResult result = searchPlans(model, d, w, PlanOptions());
    EXPECT_FALSE(result.plans.empty());
    return result.plans.empty() ? Plan() : result.plans.front();
  };
  Plan serial = planned(false), shared = planned(true);
  ASSERT_EQ(shared.microBatches, 1);
  ASSERT_GT(shared.tpComm, 0); // (the layer is split: its collectives are there)
  double sync = serial.dpComm, compute = shared.computeTime;
  ASSERT_GT(sync, 2.0 / 3 * compute + shared.tpComm / 2); // (exposed either way)
  EXPECT_NEAR(shared.dpComm, sync - 2.0 / 3 * compute, 1e-9 * sync);
}

TEST_F(PlannerTest, TheLossTakesItsProfilesPassesOverTheLogits) {
  // The MLP's output [8, 2048, 1024] bf16 as logits of a cross-entropy with
  // int32 labels: its bytes (the logits' 2 a value, the labels' 4, the f32
  // loss) are memory-bound at any pass count here (4 FLOPs a logit at the
  // bf16 peak take 1/300 of their read), and training runs the loss once
  // forward and its gradient at twice that (no recompute): 11 passes
  // against 1 add 10 x 3 x bytes / HBM to the step's compute.
  ModelGraph model = analyze(mlpWithLoss());
  Workload w = cantFail(parseWorkload("train:batch=8,seq=2048,dp=1,tp=1,pp=1,ep=1,cp=1,mbs=8,recompute=none,zero=0"));
  ClusterSpec c = cantFail(resolveCluster("dgx-h100:devices_per_node=1,nodes=1"));
  auto compute = [&](double passes) {
    ClusterSpec d = c;
    d.profile.crossEntropyPasses = passes;
    PlanResult result = searchPlans(model, d, w, PlanOptions());
    EXPECT_FALSE(result.plans.empty());
    return result.plans.empty() ? 0.0 : result.plans.front().computeTime;
  };
  double bytes = 8.0 * 2048 * 1024 * 2 + 8.0 * 2048 * 4 + 4;
  double more = 10 * 3 * bytes / (c.hbmBandwidth * c.memoryEfficiency);
  EXPECT_NEAR(compute(11) - compute(1), more, 1e-9 * more);
}

TEST_F(PlannerTest, EachStacksOwnBuffersAreItsMemory) {
  // The loss of the MLP above: its logits [8, 2048, 1024] bf16 (32 MiB).
  ModelGraph model = analyze(mlpWithLoss());
  TpContext ctx = tpContext(1);
  ctx.train = true;
  double logits = 8.0 * 2048 * 1024 * 2;
  // An eager fp32 cross-entropy: the logits' gradient and 3 logits-sized
  // buffers more at its peak (its fp32 copy and log-softmax: 10 bytes a
  // bf16 logit against 4).
  cluster.profile = cantFail(parseProfile(R"({"name": "p", "loss_buffers": 3})"));
  EXPECT_DOUBLE_EQ(solveLayer(model.layers[2], ctx, true).backwardTransientBytes, 4 * logits);
  cluster.profile = Profile();
  EXPECT_DOUBLE_EQ(solveLayer(model.layers[2], ctx, true).backwardTransientBytes, logits);

  // parax's runtime's kernel scratch (the embedding's fp32 gradient, 4 MiB
  // here) is no other stack's.
  auto memory = [&](const char *profile) {
    return bestUnder(model, cantFail(resolveCluster("dgx-h100:devices_per_node=1,nodes=1")),
                     "train:batch=8,seq=2048,dp=1,tp=1,pp=1,ep=1,cp=1,mbs=8,recompute=none,zero=0", profile)
        .memory;
  };
  EXPECT_DOUBLE_EQ(memory(R"({"name": "parax"})").scratch, 1024.0 * 1024 * 4);
  EXPECT_EQ(memory(R"({"name": "other", "runtime_buffers": false})").scratch, 0);
}

TEST_F(PlannerTest, SmsGivenToCommunicationSlowTheFlopBoundOps) {
  // compute_share 0.5: the GEMMs (FLOP-bound: up, down and the head over
  // 8 x 2048 tokens, 2 x 16384 x (2 x 1024 x 4096 + 1024 x 1024) FLOPs
  // forward at 989 TF x 0.716, three times a training step) take twice
  // as long; the embedding (bound by its bytes) does not.
  ModelGraph model = analyze(mlp());
  Workload w = cantFail(parseWorkload("train:batch=8,seq=2048,dp=1,tp=1,pp=1,ep=1,cp=1,mbs=8,recompute=none,zero=0"));
  auto compute = [&](const char *profile) {
    ClusterSpec c = cantFail(resolveCluster("dgx-h100:devices_per_node=1,nodes=1"));
    c.profile = cantFail(parseProfile(profile));
    PlanResult result = searchPlans(model, c, w, PlanOptions());
    EXPECT_FALSE(result.plans.empty());
    return result.plans.empty() ? 0.0 : result.plans.front().computeTime;
  };
  double gemms = 3 * 2.0 * 16384 * (2 * 1024.0 * 4096 + 1024.0 * 1024) / (989e12 * 0.716);
  EXPECT_NEAR(compute(R"({"name": "half", "compute_share": 0.5})") - compute(R"({"name": "all"})"), gemms,
              1e-9 * gemms);
}

TEST_F(PlannerTest, ZeroThreeAsDeepSpeedRanItGathersTensorByTensorWithoutOverlap) {
  // DeepSpeed's 2021 stage 3: every gather after a device synchronisation
  // (no prefetch: each is exposed, and so is each reduce-scatter on the
  // same stream), one collective a parameter tensor, tensors under the
  // persistence threshold (the 1M-element embedding and head here) never
  // gathered, the fp16 gradients reduce-scattered, and each call over 16
  // ranks 16 copy kernels more (torch.distributed's list forms). Layer 0's
  // two 4M-element weights: forward, the backward's gather and the
  // reduce-scatter, each of the two tensors apart.
  ModelGraph model = analyze(mlp());
  ClusterSpec c = cantFail(resolveCluster("dgx-h100:nodes=2"));
  c.profile = cantFail(parseProfile(R"({"name": "ds", "kernel_overhead_us": 5,
      "zero3_prefetch_layers": 0, "zero3_tensor_messages": true, "zero3_persist_elements": 2e6,
      "zero3_reuse_elements": 1e6, "collective_list_copies": true, "reduce_bytes": 2})"));
  auto planned = [&](const char *recompute) {
    Workload w = cantFail(parseWorkload(std::string("train:batch=16,seq=2048,dp=16,tp=1,pp=1,ep=1,cp=1,"
                                                    "mbs=1,zero=3,recompute=") + recompute));
    PlanResult result = searchPlans(model, c, w, PlanOptions());
    EXPECT_FALSE(result.plans.empty());
    return result.plans.empty() ? Plan() : result.plans.front();
  };
  Group replicas = makeGroup(c, 16, 1);
  double copies = 16 * 5e-6, weight = 4096.0 * 1024;
  double gather = 2 * (collectiveTime(c, CollectiveKind::AllGather, 2 * weight, replicas) + copies);
  double reduce = 2 * (collectiveTime(c, CollectiveKind::ReduceScatter, 2 * weight, replicas) + copies);
  Plan plain = planned("none");
  EXPECT_NEAR(plain.dpComm, 2 * gather + reduce, 1e-12);
  // Full recomputation: the layer's 8M elements are beyond the reuse
  // distance (1M), so its recomputed forward's gather is not kept for
  // its backward: gathered once more.
  Plan recomputed = planned("full");
  EXPECT_NEAR(recomputed.dpComm, 3 * gather + reduce, 1e-12);
}

TEST_F(PlannerTest, HiddenZeroThreeCollectivesCostTheComputeTheSmsTheyHold) {
  // ZeRO-3 a layer ahead over 16 ranks on 2 nodes: each layer's bf16
  // parameters gathered for its forward and again for its backward, its
  // fp32 gradients reduce-scattered (the embedding's and the head's 1M
  // elements, layer 0's 8M). What the layers' passes hide of that stream
  // runs beside them on dp_overlap_sms of the H100's 132 SMs: at 66 the
  // compute beside it loses half the hidden time (the collectives' times
  // are collectiveTime's: the share is what is tested here).
  ModelGraph model = analyze(mlp());
  Workload w = cantFail(parseWorkload("train:batch=16,seq=2048,dp=16,tp=1,pp=1,ep=1,cp=1,mbs=1,"
                                      "recompute=none,zero=3"));
  auto planned = [&](int sms) {
    ClusterSpec c = cantFail(resolveCluster("dgx-h100:nodes=2"));
    c.profile = cantFail(parseProfile(
        llvm::formatv(R"({{"name": "z3", "zero3_prefetch_layers": 1, "dp_overlap_sms": {0}})", sms).str()));
    PlanResult result = searchPlans(model, c, w, PlanOptions());
    EXPECT_FALSE(result.plans.empty());
    return result.plans.empty() ? Plan() : result.plans.front();
  };
  ClusterSpec c = cantFail(resolveCluster("dgx-h100:nodes=2"));
  Group replicas = makeGroup(c, 16, 1);
  double streamed = 0;
  for (double elements : {1024.0 * 1024, 8 * 1024.0 * 1024, 1024.0 * 1024})
    streamed += 2 * collectiveTime(c, CollectiveKind::AllGather, 2 * elements, replicas) +
                collectiveTime(c, CollectiveKind::ReduceScatter, 4 * elements, replicas);
  Plan free = planned(0), held = planned(66);
  ASSERT_EQ(free.microBatches, 1);
  ASSERT_LT(free.dpComm, 0.9 * streamed); // (some of it hidden)
  EXPECT_EQ(free.dpBeside, 0);
  double beside = 0.5 * (streamed - free.dpComm);
  EXPECT_NEAR(held.dpBeside, beside, 1e-9 * beside);
  EXPECT_NEAR(held.dpComm - free.dpComm, beside, 1e-9 * beside);
}

TEST_F(PlannerTest, GradientFusionHoldsNoGradientInTheModelsType) {
  // Megatron's gradient_accumulation_fusion: the weight-gradient GEMM adds
  // into the fp32 sums, so no bf16 gradient is held (without it one stage
  // holds its largest); the sums (optimizer state here) are unchanged.
  ModelGraph model = analyze(mlp());
  Workload w = cantFail(parseWorkload("train:batch=16,seq=2048,dp=8,tp=1,pp=1,ep=1,cp=1,mbs=1,"
                                      "recompute=none,zero=0"));
  ClusterSpec c = cluster;
  PlanResult held = searchPlans(model, c, w, PlanOptions());
  c.profile.gradientFusion = true;
  PlanResult fused = searchPlans(model, c, w, PlanOptions());
  ASSERT_FALSE(held.plans.empty());
  ASSERT_FALSE(fused.plans.empty());
  EXPECT_GT(held.plans.front().memory.gradients, 0);
  EXPECT_EQ(fused.plans.front().memory.gradients, 0);
  EXPECT_EQ(fused.plans.front().memory.optimizer, held.plans.front().memory.optimizer);
}

TEST(ClusterTest, PresetsParseAndOverridesApply) {
  for (const std::string &name : clusterPresetNames()) {
    Expected<ClusterSpec> spec = resolveCluster(name);
    ASSERT_TRUE(!!spec) << llvm::toString(spec.takeError());
    EXPECT_GT(spec->peak("bf16"), 0) << name;
    // The JSON form reads back to the same cluster.
    Expected<ClusterSpec> again = parseCluster(spec->toJson());
    ASSERT_TRUE(!!again) << llvm::toString(again.takeError());
    EXPECT_EQ(again->hbmBytes, spec->hbmBytes);
    EXPECT_EQ(again->fp8MatmulEfficiency, spec->fp8MatmulEfficiency);
  }
  ClusterSpec h100 = cantFail(resolveCluster("dgx-h100:nodes=4"));
  EXPECT_EQ(h100.numDevices(), 32);
  EXPECT_DOUBLE_EQ(h100.hbmBandwidth, 3.35e12);
  // A GEMM's sustained rate in its dtype: bf16 708.5 of 989 TF, fp8 1,288.7
  // of 1,979 (MSMF, the power-limited rate mamf-finder measured on an H200
  // at ~693 W and a 1,465 / 1,374 MHz clock: the same die at the same 700 W):
  // the costed peak times the matmul efficiency, to the preset's 3 digits.
  EXPECT_NEAR(h100.gemmPeak("bf16") * h100.matmulEfficiency, 708.5e12, 0.5e12);
  EXPECT_NEAR(h100.gemmPeak("fp8") * h100.matmulEfficiency, 1288.7e12, 1e12);
  EXPECT_EQ(h100.peak("fp8"), 1979e12); // (MFU's denominator stays the datasheet's)
}

// CPU cores share one memory: a device streams at the node's rate over its
// devices where that is less than its own; the field reads back from the
// JSON and a bad value names the field.
TEST(ClusterTest, ANodesDevicesShareItsMemoryWhereTheClusterSaysSo) {
  ClusterSpec gpus = cantFail(resolveCluster("dgx-h100"));
  EXPECT_EQ(gpus.nodeMemoryBandwidth, 0);
  EXPECT_DOUBLE_EQ(gpus.memoryBandwidth(), 3.35e12); // (each GPU its own HBM)
  std::string json = R"({"name": "cpu", "devices_per_node": 2, "nodes": 1, "peak_tflops": {"f32": 0.1},
    "hbm_gb": 8, "hbm_bandwidth_gbps": 20, "node_memory_bandwidth_gbps": 30, "matmul_efficiency": 1,
    "memory_efficiency": 1, "intra_node": {"bandwidth_gbps": 5, "efficiency": 1, "hop_latency_us": 3},
    "inter_node": {"bandwidth_gbps": 5, "efficiency": 1, "hop_latency_us": 3}, "collective_latency_us": 5})";
  ClusterSpec cpu = cantFail(parseCluster(json));
  EXPECT_DOUBLE_EQ(cpu.nodeMemoryBandwidth, 30e9);
  EXPECT_DOUBLE_EQ(cpu.memoryBandwidth(), 15e9); // 30 GB/s over 2 cores, less than one's 20
  EXPECT_DOUBLE_EQ(cantFail(parseCluster(cpu.toJson())).nodeMemoryBandwidth, 30e9);
  cpu.devicesPerNode = 1;
  EXPECT_DOUBLE_EQ(cpu.memoryBandwidth(), 20e9); // alone: its own rate
  // A decode-sized GEMM bound by its weight's read: 4 x 4096 x 4096 f32,
  // 67.2 MB at 15 GB/s = 4.48 ms (its 134 MFLOP at 100 GFLOP/s, 1.34 ms,
  // hidden under the roofline profile).
  cpu.devicesPerNode = 2;
  double bytes = 4.0 * (4 * 4096 + 4096 * 4096 + 4 * 4096), flops = 2.0 * 4 * 4096 * 4096;
  EXPECT_NEAR(gemmTime(cpu, flops, bytes, cpu.peak("f32"), 4, 4096, 4096), bytes / 15e9, 1e-12);
  std::string bad = json;
  bad.replace(bad.find("\"node_memory_bandwidth_gbps\": 30"), 32, "\"node_memory_bandwidth_gbps\": -3");
  llvm::Expected<ClusterSpec> rejected = parseCluster(bad, "c.json");
  ASSERT_FALSE(static_cast<bool>(rejected));
  EXPECT_NE(llvm::toString(rejected.takeError()).find("c.json: field 'node_memory_bandwidth_gbps' must be positive"),
            std::string::npos);
}

TEST(ClusterTest, BadInputNamesTheProblem) {
  auto message = [](Expected<ClusterSpec> spec) {
    return spec ? std::string("ok") : llvm::toString(spec.takeError());
  };
  EXPECT_NE(message(resolveCluster("dgx-h999")).find("neither a preset"),
            std::string::npos);
  EXPECT_NE(message(resolveCluster("dgx-h100:nodes=0")).find("positive integer"),
            std::string::npos);
  EXPECT_NE(message(resolveCluster("dgx-h100:gpus=4")).find("unknown option 'gpus'"),
            std::string::npos);
  // (nodes x devices overflowed to -8 devices, a plan search over them)
  EXPECT_NE(message(resolveCluster("dgx-h100:nodes=9223372036854775807"))
                .find("cluster 'dgx-h100:nodes=9223372036854775807': 9223372036854775807 nodes of 8 devices are "
                      "more than parax plans for (16777216 devices at most)"),
            std::string::npos);
  EXPECT_EQ(message(resolveCluster("dgx-h100:nodes=2097152")), "ok"); // 2^24 devices
  EXPECT_NE(message(parseCluster("{", "c.json")).find("c.json: invalid JSON"),
            std::string::npos);
  std::string json = cantFail(resolveCluster("dgx-h100")).toJson();
  std::string noHbm = json;
  noHbm.replace(noHbm.find("\"hbm_gb\""), 8, "\"hbm_xx\"");
  EXPECT_NE(message(parseCluster(noHbm, "c.json")).find("field 'hbm_xx' is not a cluster field"),
            std::string::npos);
  std::string negative = json;
  negative.replace(negative.find("\"nodes\": 1"), 10, "\"nodes\": -1");
  EXPECT_NE(message(parseCluster(negative, "c.json")).find("field 'nodes' must be a positive integer"),
            std::string::npos);
  std::string fp8 = json;
  size_t at = fp8.find("\"fp8_matmul_efficiency\"");
  ASSERT_NE(at, std::string::npos);
  fp8.replace(at, fp8.find(',', at) - at, "\"fp8_matmul_efficiency\": 1.709");
  EXPECT_NE(message(parseCluster(fp8, "c.json")).find("field 'fp8_matmul_efficiency' must be at most 1"),
            std::string::npos);
}

TEST(WorkloadTest, ParsesAndRejects) {
  Workload w = cantFail(parseWorkload("decode:batch=32,context=4096,kv=fp8,tp=4"));
  EXPECT_EQ(w.kind, WorkloadKind::Decode);
  EXPECT_EQ(w.objective, Objective::Latency);
  EXPECT_EQ(dtypeBytes(w.kvDtype), 1);
  EXPECT_EQ(*w.tp, 4);
  auto message = [](llvm::StringRef spec) {
    Expected<Workload> w = parseWorkload(spec);
    return w ? std::string("ok") : llvm::toString(w.takeError());
  };
  EXPECT_NE(message("serve:batch=1").find("kind must be train, prefill or decode"),
            std::string::npos);
  EXPECT_NE(message("train:batch=8").find("needs seq=N"), std::string::npos);
  EXPECT_NE(message("decode:batch=8").find("needs context=N"), std::string::npos);
  EXPECT_NE(message("train:batch=8,seq=16,mbs=3").find("mbs must divide batch"),
            std::string::npos);
  EXPECT_NE(message("train:batch=8,seq=16,zero=4").find("zero must be"),
            std::string::npos);
  EXPECT_NE(message("train:batch=x,seq=16").find("'batch' needs an integer"),
            std::string::npos);
  EXPECT_NE(message("train:batch=8,seq=16,foo=1").find("unknown key 'foo'"),
            std::string::npos);
  EXPECT_NE(message("decode:batch=8,context=64,cp=2").find("a decode step has one token a sequence"),
            std::string::npos);
  EXPECT_NE(message("prefill:batch=1,seq=10,cp=4").find("cp must divide seq"), std::string::npos);
  for (const char *capacity : {"0.5", "x", "inf", "nan"})
    EXPECT_NE(message(std::string("train:batch=8,seq=16,capacity=") + capacity)
                  .find("capacity (the expert capacity: rows a rank's expert dispatch holds, per "
                        "(token, choice) pair of its own) must be a number >= 1"),
              std::string::npos)
        << capacity;
  Workload c = cantFail(parseWorkload("train:batch=8,seq=16,capacity=1.25"));
  EXPECT_EQ(c.expertCapacity, 1.25);
  EXPECT_EQ(c.toString(), "train:batch=8,seq=16,capacity=1.25");
  EXPECT_NE(message("train:batch=8,seq=16,gemm=int4")
                .find("gemm (the GEMMs' dtype) must be fp8, bf16, f16 or f32, got 'int4'"),
            std::string::npos);
  Workload g = cantFail(parseWorkload("train:batch=8,seq=16,gemm=fp8"));
  EXPECT_EQ(g.gemmDtype, "fp8");
  EXPECT_EQ(g.toString(), "train:batch=8,seq=16,gemm=fp8");
  // Counts that would overflow the search's arithmetic (a batch of 2^63 - 1
  // planned with negative rows, latency and memory): refused.
  EXPECT_NE(message("prefill:batch=9223372036854775807,seq=8")
                .find("'batch' needs an integer in [1, 2147483648], got '9223372036854775807'"),
            std::string::npos);
  EXPECT_NE(message("prefill:batch=2147483648,seq=2048").find("4398046511104 tokens a step, more than 2^40"),
            std::string::npos);
  EXPECT_NE(message("decode:batch=65536,context=2147483648").find("more than 2^40"), std::string::npos);
}

} // namespace
