//===- ShardingTest.cpp - the sharding attribute's C++ API ---------------===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/InitAll.h"

#include "mlir/AsmParser/AsmParser.h"
#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/Diagnostics.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/Parser/Parser.h"

#include <gtest/gtest.h>

using namespace mlir;

namespace {

class ShardingTest : public ::testing::Test {
protected:
  ShardingTest() {
    DialectRegistry registry;
    parax::registerAllDialects(registry);
    context.appendDialectRegistry(registry);
    context.loadAllAvailableDialects();
  }
  parax::ShardingAttr parse(StringRef text) {
    return dyn_cast_or_null<parax::ShardingAttr>(parseAttribute(text, &context));
  }
  MLIRContext context;
};

TEST_F(ShardingTest, SplitAndPartialAxes) {
  parax::ShardingAttr sharding =
      parse("#parax.sharding<@g, [{dp}, {}, {pp, tp}], partial = {ep}>");
  ASSERT_TRUE(sharding);
  EXPECT_EQ(sharding.getGrid().getValue(), "g");
  ASSERT_EQ(sharding.getDims().size(), 3u);
  EXPECT_EQ(sharding.getSplitAxes(0), SmallVector<StringRef>({"dp"}));
  EXPECT_TRUE(sharding.getSplitAxes(1).empty());
  EXPECT_EQ(sharding.getSplitAxes(2), SmallVector<StringRef>({"pp", "tp"}));
  EXPECT_TRUE(sharding.isPartial());
  EXPECT_EQ(sharding.getAllAxes(),
            SmallVector<StringRef>({"dp", "pp", "tp", "ep"}));
}

TEST_F(ShardingTest, RoundTripsThroughText) {
  StringRef text = "#parax.sharding<@g, [{dp}, {}], partial = {tp}>";
  parax::ShardingAttr sharding = parse(text);
  ASSERT_TRUE(sharding);
  std::string printed;
  llvm::raw_string_ostream os(printed);
  os << Attribute(sharding);
  EXPECT_EQ(printed, text);
}

TEST_F(ShardingTest, AxisUsedTwiceIsRejected) {
  std::string message;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    message = diag.str();
    return success();
  });
  EXPECT_FALSE(parse("#parax.sharding<@g, [{tp}, {tp}]>"));
  EXPECT_NE(message.find("'tp' is used twice"), std::string::npos) << message;
}

TEST_F(ShardingTest, DivisibilityIsCheckedAgainstTheGrid) {
  const char *source = R"mlir(
    parax.grid @g(dp = 2, tp = 4)
    func.func @f(%x: tensor<8x6xf32>) { return }
  )mlir";
  OwningOpRef<ModuleOp> module = parseSourceString<ModuleOp>(source, &context);
  ASSERT_TRUE(module);
  auto function = *module->getOps<func::FuncOp>().begin();
  Type type = function.getArgumentTypes()[0];

  std::string message;
  ScopedDiagnosticHandler handler(&context, [&](Diagnostic &diag) {
    message = diag.str();
    return success();
  });
  auto emit = [&] { return function.emitError(); };
  EXPECT_TRUE(succeeded(parax::verifySharding(
      parse("#parax.sharding<@g, [{dp, tp}, {}]>"), type, function, emit)));
  EXPECT_TRUE(failed(parax::verifySharding(
      parse("#parax.sharding<@g, [{}, {tp}]>"), type, function, emit)));
  EXPECT_NE(message.find("dimension 1 of size 6 is not divisible by 4"),
            std::string::npos)
      << message;
  EXPECT_TRUE(failed(parax::verifySharding(
      parse("#parax.sharding<@g, [{ep}, {}]>"), type, function, emit)));
  EXPECT_NE(message.find("unknown grid axis 'ep'"), std::string::npos)
      << message;
}

} // namespace
