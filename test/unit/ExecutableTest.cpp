// The executable validator on hand-made generation steps: a run-time
// position must be an integer scalar and a cache_update's shapes must fit,
// whatever the file says.

#include "parax/runtime/Executable.h"

#include <gtest/gtest.h>

using namespace parax::runtime;
namespace pxe = parax::pxe;

namespace {

pxe::Buffer *addBuffer(pxe::Stage &stage, pxe::Role role, pxe::DType dtype, std::vector<int64_t> shape) {
  pxe::Buffer *b = stage.add_buffers();
  b->set_id(stage.buffers_size() - 1);
  b->set_role(role);
  b->set_dtype(dtype);
  for (int64_t d : shape) b->add_shape(d);
  if (role == pxe::INPUT) {
    b->set_input_index(b->id());
    for (int64_t d : shape) {
      b->add_global_shape(d);
      b->add_split();
    }
  }
  return b;
}

// One rank, one stage: cache [1, 8, 2, 4], new rows [1, `rows`, 2, 4], a
// position of `positionType`, and cache_update -> result.
pxe::Executable generationStep(pxe::DType positionType, int64_t rows, std::vector<int64_t> result) {
  pxe::Executable exe;
  exe.set_format_version(1);
  exe.mutable_grid()->add_axis_names("tp");
  exe.mutable_grid()->add_shape(1);
  exe.add_ranks()->add_values(0);
  pxe::Stage *stage = exe.add_stages();
  stage->set_index(0);
  addBuffer(*stage, pxe::INPUT, pxe::F32, {1, 8, 2, 4});
  addBuffer(*stage, pxe::INPUT, pxe::F32, {1, rows, 2, 4});
  addBuffer(*stage, pxe::INPUT, positionType, {});
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, result);
  pxe::Instruction *inst = stage->add_instructions();
  inst->set_op("cache_update");
  for (int id : {0, 1, 2}) inst->add_operands(id);
  inst->add_results(3);
  stage->add_outputs(3);
  return exe;
}

TEST(Executable, AcceptsAGenerationStep) {
  pxe::Executable exe = generationStep(pxe::I32, 1, {1, 8, 2, 4});
  Status s = validateExecutable(exe);
  EXPECT_TRUE(s.isOk()) << s.message();
  // The cache is an input only the update reads: written in place.
  EXPECT_EQ(cacheStateInputs(exe.stages(0)), std::vector<int32_t>({0}));
}

TEST(Executable, RefusesAFloatPosition) {
  Status s = validateExecutable(generationStep(pxe::F32, 1, {1, 8, 2, 4}));
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("stages[0].instructions[0] (cache_update).operands: the position (operand 2) "
                             "must be an integer scalar"),
            std::string::npos)
      << s.message();
}

TEST(Executable, RefusesAnUpdateLargerThanItsCache) {
  Status s = validateExecutable(generationStep(pxe::I32, 9, {1, 8, 2, 4}));
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("(cache_update): the cache, the update and the result must be"), std::string::npos)
      << s.message();
}

TEST(Executable, RefusesAResultUnlikeItsCache) {
  Status s = validateExecutable(generationStep(pxe::I32, 1, {1, 9, 2, 4}));
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("(cache_update): the cache"), std::string::npos) << s.message();
}

TEST(Executable, ACacheReadElsewhereIsNotWrittenInPlace) {
  pxe::Executable exe = generationStep(pxe::I32, 1, {1, 8, 2, 4});
  exe.mutable_stages(0)->add_outputs(0); // the old cache is a result too
  EXPECT_TRUE(cacheStateInputs(exe.stages(0)).empty());
}

} // namespace
