//===- CostInterfaceTest.cpp - FLOPs and bytes from the op interface -----===//
//
// Expected values are worked out by hand from the op's definition (a
// multiply-add is two FLOPs), not read back from the implementation.

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/InitAll.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

using namespace mlir;

namespace {

class CostTest : public ::testing::Test {
protected:
  CostTest() {
    DialectRegistry registry;
    parax::registerAllDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }

  // Parses `body` as the body of a function and returns its first op.
  template <typename OpT> OpT parseOp(StringRef signature, StringRef body) {
    source = ("func.func @f" + signature + " {\n" + body + "\n}").str();
    module = parseSourceString<ModuleOp>(source, &context);
    EXPECT_TRUE(module) << source;
    OpT found;
    module->walk([&](OpT op) {
      if (!found)
        found = op;
    });
    EXPECT_TRUE(found);
    return found;
  }

  MLIRContext context;
  std::string source;
  OwningOpRef<ModuleOp> module;
};

TEST_F(CostTest, LinearCountsMultiplyAddsAndBias) {
  auto op = parseOp<parax::LinearOp>(
      "(%x: tensor<2x3x8xbf16>, %w: tensor<16x8xbf16>, %b: tensor<16xbf16>)",
      "%y = parax.linear %x, %w, %b {transpose_w} : (tensor<2x3x8xbf16>, "
      "tensor<16x8xbf16>, tensor<16xbf16>) -> tensor<2x3x16xbf16>\n"
      "return");
  auto cost = cast<parax::CostOpInterface>(op.getOperation());
  // 6 rows x 8 in x 16 out multiply-adds, and 6 x 16 bias adds.
  EXPECT_EQ(cost.getFlops(), 2u * 6 * 8 * 16 + 6 * 16);
  // bf16: x (48) + w (128) + b (16) elements read, 96 written.
  EXPECT_EQ(cost.getBytesRead(), 2u * (48 + 128 + 16));
  EXPECT_EQ(cost.getBytesWritten(), 2u * 96);
  EXPECT_EQ(op.getInFeatures(), 8);
  EXPECT_EQ(op.getOutFeatures(), 16);
}

TEST_F(CostTest, CausalAttentionCountsLowerTriangle) {
  auto op = parseOp<parax::AttentionOp>(
      "(%q: tensor<1x4x2x8xf32>, %k: tensor<1x4x1x8xf32>, %v: "
      "tensor<1x4x1x8xf32>)",
      "%o = parax.attention %q, %k, %v {causal, num_heads = 2, num_kv_heads = "
      "1, head_dim = 8, scale = 0.35 : f64} : (tensor<1x4x2x8xf32>, "
      "tensor<1x4x1x8xf32>, tensor<1x4x1x8xf32>) -> tensor<1x4x2x8xf32>\n"
      "return");
  auto cost = cast<parax::CostOpInterface>(op.getOperation());
  // 4 queries see 1 + 2 + 3 + 4 = 10 keys; per pair 2*8 + 5 + 2*8 = 37; 2 heads.
  EXPECT_EQ(cost.getFlops(), 2u * 10 * 37);
  // q (64) + k (32) + v (32) floats; the score matrix is never counted.
  EXPECT_EQ(cost.getBytesRead(), 4u * (64 + 32 + 32));
}

TEST_F(CostTest, ExpertsReadOnlyTouchedExperts) {
  auto op = parseOp<parax::ExpertsOp>(
      "(%x: tensor<1x1x4xf32>, %w: tensor<1x1x2xf32>, %i: tensor<1x1x2xi32>, "
      "%g: tensor<8x6x4xf32>, %u: tensor<8x6x4xf32>, %d: tensor<8x4x6xf32>)",
      "%y = parax.experts %x, %w, %i, %g, %u, %d : (tensor<1x1x4xf32>, "
      "tensor<1x1x2xf32>, tensor<1x1x2xi32>, tensor<8x6x4xf32>, "
      "tensor<8x6x4xf32>, tensor<8x4x6xf32>) -> tensor<1x1x4xf32>\n"
      "return");
  auto cost = cast<parax::CostOpInterface>(op.getOperation());
  // One token, two experts: 3 GEMVs of 4x6 (2 FLOPs each), swiglu on 6, and a
  // weighted add of 4, per expert.
  EXPECT_EQ(cost.getFlops(), 2u * (3 * 2 * 4 * 6 + 5 * 6 + 2 * 4));
  // Two of eight experts' weights (3 * 24 floats each) plus x, w, i.
  EXPECT_EQ(cost.getBytesRead(), 4u * (4 + 2 + 2 + 2 * 3 * 24));
}

TEST_F(CostTest, ReshapeIsFree) {
  auto op = parseOp<parax::ReshapeOp>(
      "(%x: tensor<2x8xf32>)",
      "%y = parax.reshape %x : (tensor<2x8xf32>) -> tensor<2x2x4xf32>\n"
      "return");
  auto cost = cast<parax::CostOpInterface>(op.getOperation());
  EXPECT_EQ(cost.getFlops(), 0u);
  EXPECT_EQ(cost.getBytesRead(), 0u);
  EXPECT_EQ(cost.getBytesWritten(), 0u);
}

TEST_F(CostTest, LayerIndexIsReadFromTheOp) {
  auto op = parseOp<parax::SiluOp>(
      "(%x: tensor<4xf32>)",
      "%y = parax.silu %x {parax.layer = 3 : i64} : (tensor<4xf32>) -> "
      "tensor<4xf32>\nreturn");
  EXPECT_EQ(parax::getLayer(op), std::optional<int64_t>(3));
}

} // namespace
