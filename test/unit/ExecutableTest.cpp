// The executable validator on hand-made generation steps: a run-time
// position must be an integer scalar and a cache_update's shapes must fit,
// whatever the file says. Then the CPU executor running such a step for
// several microbatches, each with its own KV caches, and an expert
// exchange over two ranks (what its all-to-alls send).

#include "parax/runtime/Executable.h"
#include "parax/runtime/Executor.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <thread>

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

pxe::Instruction *addInstruction(pxe::Stage &stage, pxe::OpKind kind, std::vector<int32_t> operands,
                                 std::vector<int32_t> results) {
  pxe::Instruction *inst = stage.add_instructions();
  inst->set_kind(kind);
  for (int32_t id : operands) inst->add_operands(id);
  for (int32_t id : results) inst->add_results(id);
  return inst;
}

// `exe` is refused by the validator with an error containing `text`.
void expectRefused(const pxe::Executable &exe, const std::string &text) {
  Status s = validateExecutable(exe);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find(text), std::string::npos) << s.message();
}

// An executable of one rank and one stage, without buffers yet.
pxe::Executable oneRank() {
  pxe::Executable exe;
  exe.set_format_version(2);
  exe.mutable_grid()->add_axis_names("tp");
  exe.mutable_grid()->add_shape(1);
  exe.add_ranks()->add_values(0);
  exe.add_stages()->set_index(0);
  return exe;
}

// One rank, one stage: cache [1, 8, 2, 4], new rows [1, `rows`, 2, 4], a
// position of `positionType`, and cache_update -> result.
pxe::Executable generationStep(pxe::DType positionType, int64_t rows, std::vector<int64_t> result) {
  pxe::Executable exe = oneRank();
  pxe::Stage *stage = exe.mutable_stages(0);
  addBuffer(*stage, pxe::INPUT, pxe::F32, {1, 8, 2, 4});
  addBuffer(*stage, pxe::INPUT, pxe::F32, {1, rows, 2, 4});
  addBuffer(*stage, pxe::INPUT, positionType, {});
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, result);
  pxe::Instruction *inst = stage->add_instructions();
  inst->set_kind(parax::pxe::OP_CACHE_UPDATE);
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
  expectRefused(generationStep(pxe::F32, 1, {1, 8, 2, 4}),
                "stages[0].instructions[0] (cache_update).operands: the position (operand 2) must be an integer scalar");
}

TEST(Executable, RefusesAnUpdateLargerThanItsCache) {
  expectRefused(generationStep(pxe::I32, 9, {1, 8, 2, 4}), "(cache_update): the cache, the update and the result must be");
}

TEST(Executable, RefusesAResultUnlikeItsCache) {
  expectRefused(generationStep(pxe::I32, 1, {1, 9, 2, 4}), "(cache_update): the cache");
}

// A result id past the buffers: the cache's check read that buffer before
// the ids were checked (parax-pxe-fuzz, a cache-step mutant, 2026-12-01).
TEST(Executable, RefusesACacheUpdateResultOutOfRange) {
  pxe::Executable exe = generationStep(pxe::I32, 1, {1, 8, 2, 4});
  exe.mutable_stages(0)->mutable_instructions(0)->set_results(0, 1 << 20);
  expectRefused(exe, "stages[0].instructions[0] (cache_update).results: buffer 1048576 is out of range");
}

// One rank, one stage: x [2, 4] -> linear with weight [3, 4] (transposed)
// and a bias of `bias` -> y [2, 3]; x's dtype `xType`.
pxe::Executable linearStep(std::vector<int64_t> bias, pxe::DType xType = pxe::F32) {
  pxe::Executable exe = oneRank();
  pxe::Stage *stage = exe.mutable_stages(0);
  addBuffer(*stage, pxe::INPUT, xType, {2, 4});
  for (std::vector<int64_t> shape : {std::vector<int64_t>{3, 4}, bias}) {
    pxe::Buffer *w = addBuffer(*stage, pxe::PARAMETER, pxe::F32, shape);
    w->set_param_name("w" + std::to_string(w->id()));
    for (int64_t d : shape) {
      w->add_global_shape(d);
      w->add_split();
    }
  }
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {2, 3});
  pxe::Instruction *inst = stage->add_instructions();
  inst->set_kind(parax::pxe::OP_LINEAR);
  for (int id : {0, 1, 2}) inst->add_operands(id);
  inst->add_results(3);
  (*inst->mutable_attrs())["transpose_w"].set_b(true);
  stage->add_outputs(3);
  return exe;
}

TEST(Executable, AcceptsALinearWhoseShapesFit) {
  Status s = validateExecutable(linearStep({3}));
  EXPECT_TRUE(s.isOk()) << s.message();
}

TEST(Executable, RefusesABiasOfAnotherWidth) {
  // What a fuzzed GPT-2 file did: a bias one dimension short, which the
  // kernel would have read past.
  for (std::vector<int64_t> bias : {std::vector<int64_t>{2}, std::vector<int64_t>{3, 1}}) {
    expectRefused(linearStep(bias), "stages[0].instructions[0] (linear): the bias must be [3]");
  }
}

TEST(Executable, RefusesIntegersWhereAKernelReadsFloats) {
  expectRefused(linearStep({3}, pxe::I32), "(linear): operand 0 must be floating point");
}

// A reshape of labels (what a context-parallel loss deals out): integers
// in, integers out; a float result would read them as floats.
pxe::Executable labelsReshape(pxe::DType resultType) {
  pxe::Executable exe = oneRank();
  pxe::Stage *stage = exe.mutable_stages(0);
  addBuffer(*stage, pxe::INPUT, pxe::I32, {2, 8});
  addBuffer(*stage, pxe::TEMPORARY, resultType, {2, 4, 2});
  pxe::Instruction *inst = stage->add_instructions();
  inst->set_kind(parax::pxe::OP_RESHAPE);
  inst->add_operands(0);
  inst->add_results(1);
  stage->add_outputs(1);
  return exe;
}

TEST(Executable, MovesIntegersWithoutTurningThemToFloats) {
  Status s = validateExecutable(labelsReshape(pxe::I32));
  EXPECT_TRUE(s.isOk()) << s.message();
  expectRefused(labelsReshape(pxe::F32), "(reshape): result 0 must be integer");
}

// A sum of fp32 and bf16 values (the dialect has one element type an op):
// the CUDA kernel would read the fp32 operand's bytes as bf16 (or a bf16
// one's past its end as fp32).
TEST(Executable, RefusesFloatTypesMixedInAnOp) {
  pxe::Executable exe = oneRank();
  pxe::Stage *stage = exe.mutable_stages(0);
  addBuffer(*stage, pxe::INPUT, pxe::BF16, {2, 8});
  addBuffer(*stage, pxe::INPUT, pxe::F32, {2, 8});
  addBuffer(*stage, pxe::TEMPORARY, pxe::BF16, {2, 8});
  pxe::Instruction *inst = stage->add_instructions();
  inst->set_kind(parax::pxe::OP_ADD);
  inst->add_operands(0);
  inst->add_operands(1);
  inst->add_results(2);
  stage->add_outputs(2);
  expectRefused(exe, "(add): operand 1 is F32 but operand 0 is BF16: an op's floating-point operands and results "
                     "have one type");
  stage->mutable_buffers(1)->set_dtype(pxe::BF16);
  Status s = validateExecutable(exe);
  EXPECT_TRUE(s.isOk()) << s.message();
}

TEST(Executable, RefusesAWeightThatDoesNotTakeXToY) {
  pxe::Executable exe = linearStep({3});
  (*exe.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["transpose_w"].set_b(false);
  expectRefused(exe, "(linear): the weight must be [4, 3], got [3, 4]");
}

// Context parallelism: two ranks along "cp", each with 4 of the queries
// (causal attention over `keys` gathered keys; a run-time position operand
// too when `position`).
pxe::Executable contextParallelAttention(int64_t keys, bool position) {
  pxe::Executable exe;
  exe.set_format_version(2);
  exe.mutable_grid()->add_axis_names("cp");
  exe.mutable_grid()->add_shape(2);
  exe.add_ranks()->add_values(0);
  exe.add_ranks()->add_values(1);
  pxe::Stage *stage = exe.add_stages();
  stage->set_index(0);
  addBuffer(*stage, pxe::INPUT, pxe::F32, {1, 4, 2, 8});
  addBuffer(*stage, pxe::INPUT, pxe::F32, {1, keys, 2, 8});
  addBuffer(*stage, pxe::INPUT, pxe::I32, {});
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {1, 4, 2, 8});
  pxe::Instruction *inst = stage->add_instructions();
  inst->set_kind(parax::pxe::OP_ATTENTION);
  for (int id : {0, 1, 1}) inst->add_operands(id);
  if (position) inst->add_operands(2);
  inst->add_results(3);
  auto &attrs = *inst->mutable_attrs();
  attrs["causal"].set_b(true);
  attrs["num_heads"].set_i(2);
  attrs["num_kv_heads"].set_i(2);
  attrs["head_dim"].set_i(8);
  attrs["scale"].set_f(0.35);
  attrs["seq_axes"].mutable_strings()->add_values("cp");
  stage->add_outputs(3);
  return exe;
}

TEST(Executable, AcceptsQueriesSplitOverRanksWithEveryKey) {
  Status s = validateExecutable(contextParallelAttention(8, false));
  EXPECT_TRUE(s.isOk()) << s.message();
}

TEST(Executable, RefusesQueriesSplitOverRanksWithTooFewKeys) {
  // Rank 1's queries are 4 .. 7 of 8: a kernel would look for keys that
  // are not there.
  expectRefused(contextParallelAttention(4, false), "(attention): causal attention of 8 queries over 4 keys");
}

TEST(Executable, RefusesQueriesSplitOverRanksAtARunTimePosition) {
  expectRefused(contextParallelAttention(8, true),
                "(attention): a sequence split over ranks (seq_axes) takes no run-time position");
}

// One rank, one stage, one instruction `op`: its operands inputs of the
// given shapes (integer where `ints` lists the operand), its results
// temporaries of the given shapes.
pxe::Executable oneOp(const std::string &op, const std::vector<std::vector<int64_t>> &operands,
                      const std::vector<std::vector<int64_t>> &results, std::vector<int> ints = {}) {
  pxe::Executable exe = oneRank();
  pxe::Stage *stage = exe.mutable_stages(0);
  pxe::Instruction *inst = stage->add_instructions();
  inst->set_kind(opKind(op));
  for (size_t k = 0; k < operands.size(); ++k) {
    bool integer = std::find(ints.begin(), ints.end(), static_cast<int>(k)) != ints.end();
    inst->add_operands(addBuffer(*stage, pxe::INPUT, integer ? pxe::I32 : pxe::F32, operands[k])->id());
  }
  for (const std::vector<int64_t> &shape : results) {
    inst->add_results(addBuffer(*stage, pxe::TEMPORARY, pxe::F32, shape)->id());
    stage->add_outputs(inst->results(inst->results_size() - 1));
  }
  return exe;
}

// The gradient ops' shapes, checked before any kernel runs.
TEST(Executable, AcceptsGradientOpsWhoseShapesFit) {
  for (const pxe::Executable &exe :
       {oneOp("linear_weight_grad", {{2, 3, 4}, {2, 3, 5}}, {{4, 5}}),
        oneOp("cross_entropy_grad", {{2, 3, 7}, {2, 3}}, {{2, 3, 7}}, {1}),
        oneOp("sum_to", {{2, 3, 4}}, {{1, 1, 4}}),
        oneOp("embedding_grad", {{2, 3}, {2, 3, 4}}, {{9, 4}}, {0}),
        oneOp("position_embedding_grad", {{1, 3, 4}}, {{8, 4}})}) {
    Status s = validateExecutable(exe);
    EXPECT_TRUE(s.isOk()) << s.message();
  }
}

TEST(Executable, RefusesGradientOpsWhoseShapesDoNotFit) {
  expectRefused(oneOp("linear_weight_grad", {{2, 3, 4}, {2, 2, 5}}, {{4, 5}}),
                "(linear_weight_grad): x [2, 3, 4] and dy [2, 2, 5] must agree but on their last dimension");
  expectRefused(oneOp("linear_weight_grad", {{2, 3, 4}, {2, 3, 5}}, {{5, 4}}),
                "(linear_weight_grad): the result must be [4, 5], got [5, 4]");
  expectRefused(oneOp("cross_entropy_grad", {{2, 3, 7}, {2, 3}}, {{2, 3, 6}}, {1}),
                "(cross_entropy_grad): the result must be the logits' shape");
  expectRefused(oneOp("attention_grad", {{1, 4, 2, 8}, {1, 4, 2, 8}, {1, 4, 2, 8}, {1, 4, 2, 8}},
                      {{1, 4, 2, 8}, {1, 4, 1, 8}, {1, 4, 2, 8}}),
                "(attention_grad): dq, dk and dv must have the shapes of q, k and v");
  expectRefused(oneOp("sum_to", {{2, 3, 4}}, {{1, 2, 4}}), "(sum_to): [2, 3, 4] cannot be summed to [1, 2, 4]");
  expectRefused(oneOp("embedding_grad", {{2, 3}, {2, 3, 4}}, {{9, 5}}, {0}),
                "(embedding_grad): dy must be [2, 3, 5], got [2, 3, 4]");
  expectRefused(oneOp("position_embedding_grad", {{1, 9, 4}}, {{8, 4}}),
                "(position_embedding_grad): positions 0 .. 8 exceed the table's 8 rows");
  expectRefused(oneOp("rms_norm_weight_grad", {{2, 4}, {2, 4}}, {{3}}),
                "(rms_norm_weight_grad): x, dy, the weight [H] and the result do not fit");
}

// The mixture of experts' gradient ops: router_grad with top_k 2 of 4
// experts; experts_grad (indices an integer operand); sigmoid_grad.
pxe::Executable routerGrad(std::vector<int64_t> dweights, std::vector<int64_t> result) {
  pxe::Executable exe = oneOp("router_grad", {{2, 3, 8}, {4, 8}, dweights}, {result});
  (*exe.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["top_k"].set_i(2);
  return exe;
}

pxe::Executable routerAux(std::vector<int64_t> load, std::vector<int64_t> result) {
  pxe::Executable exe = oneOp("router_aux_grad", {{2, 3, 8}, {4, 8}, load}, {result});
  (*exe.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["num_tokens"].set_i(6);
  return exe;
}

// The load-balancing loss's router_load (top_k 2) and balance_loss
// (num_tokens 3) on these shapes.
pxe::Executable routerLoad(std::vector<int64_t> load) {
  pxe::Executable exe = oneOp("router_load", {{2, 3, 8}, {4, 8}}, {load});
  (*exe.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["top_k"].set_i(2);
  return exe;
}

pxe::Executable balanceLoss(std::vector<int64_t> load, std::vector<int64_t> scores) {
  pxe::Executable exe = oneOp("balance_loss", {load, scores}, {{}});
  (*exe.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["num_tokens"].set_i(3);
  return exe;
}

TEST(Executable, AcceptsMoeGradientOpsWhoseShapesFit) {
  for (const pxe::Executable &exe :
       {routerGrad({2, 3, 2}, {2, 3, 4}),
        oneOp("experts_grad", {{6, 8}, {6, 2}, {6, 2}, {4, 5, 8}, {4, 5, 8}, {4, 8, 5}, {6, 8}},
              {{6, 8}, {6, 2}, {4, 5, 8}, {4, 5, 8}, {4, 8, 5}}, {2}),
        oneOp("sigmoid_grad", {{3, 7}, {3, 7}}, {{3, 7}}), routerAux({4}, {2, 3, 4}),
        routerAux({2, 4}, {2, 3, 4}), // a load per sequence
        routerLoad({4}), routerLoad({2, 4}), balanceLoss({2, 4}, {2, 4})}) {
    Status s = validateExecutable(exe);
    EXPECT_TRUE(s.isOk()) << s.message();
  }
}

TEST(Executable, RefusesMoeGradientOpsWhoseShapesDoNotFit) {
  expectRefused(routerGrad({2, 3, 3}, {2, 3, 4}),
                "(router_grad): dweights must hold 12 values and the result [tokens, 4]");
  expectRefused(routerGrad({2, 3, 2}, {2, 3, 5}),
                "(router_grad): dweights must hold 12 values and the result [tokens, 4]");
  expectRefused(oneOp("experts_grad", {{6, 8}, {6, 2}, {6, 2}, {4, 5, 8}, {4, 5, 8}, {4, 8, 5}, {6, 8}},
                      {{6, 8}, {6, 2}, {4, 5, 8}, {4, 5, 8}, {4, 5, 8}}, {2}),
                "(experts_grad): x [.., H], weights and indices [tokens, K], gate/up [E, F, H], down [E, H, F] "
                "and the result do not fit");
  expectRefused(oneOp("experts_grad", {{6, 8}, {6, 2}, {6, 2}, {4, 5, 8}, {4, 5, 8}, {4, 8, 5}, {6, 8}},
                      {{6, 8}, {6, 2}, {4, 5, 8}, {4, 5, 8}, {4, 8, 5}}),
                "(experts_grad): operand 2 must be integer");
  expectRefused(oneOp("sigmoid_grad", {{3, 7}, {3, 6}}, {{3, 7}}),
                "(sigmoid_grad): x, dy and the result must have one shape");
  const char *auxShapes = "(router_aux_grad): the gate [experts, 8], the load [experts] (or [sequences, experts] for "
                          "x [sequences, tokens, 8]) and the result [tokens, experts] do not fit";
  expectRefused(routerAux({5}, {2, 3, 4}), auxShapes);
  expectRefused(routerAux({3, 4}, {2, 3, 4}), auxShapes); // not a row for each of x's 2 sequences
  expectRefused(routerLoad({3, 4}), "(router_load): the load must be [4] or, per sequence, [2, 4]");
  expectRefused(balanceLoss({2, 4}, {4}), "(balance_loss): the load and the scores must be [experts] or [sequences, "
                                          "experts] alike, the result a scalar");
  pxe::Executable manyGroups = routerGrad({2, 3, 2}, {2, 3, 4});
  (*manyGroups.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["num_groups"].set_i(65);
  expectRefused(manyGroups, "(router_grad): num_groups 65 is above 64");
  pxe::Executable noTokens = routerAux({4}, {2, 3, 4});
  (*noTokens.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["num_tokens"].set_i(0);
  expectRefused(noTokens, "(router_aux_grad): num_tokens and num_sequences must be positive");
  pxe::Executable noSequences = routerAux({2, 4}, {2, 3, 4});
  (*noSequences.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["num_sequences"].set_i(0);
  expectRefused(noSequences, "(router_aux_grad): num_tokens and num_sequences must be positive");
}

// Offsets near INT64_MAX: `start + n` wrapped below the size and passed the
// check, and the slice read before its tensor (parax-pxe-fuzz, a DeepSeek
// mutant, 2026-12-01).
TEST(Executable, RefusesOffsetsWhoseEndOverflows) {
  pxe::Executable slice = oneOp("slice", {{2, 9, 5}}, {{2, 4, 5}});
  auto &attrs = *slice.mutable_stages(0)->mutable_instructions(0)->mutable_attrs();
  attrs["dim"].set_i(1);
  attrs["start"].set_i(5);
  Status s = validateExecutable(slice);
  EXPECT_TRUE(s.isOk()) << s.message();
  attrs["start"].set_i(6);
  expectRefused(slice, "(slice): the slice from 6 does not fit [2, 9, 5] -> [2, 4, 5]");
  attrs["start"].set_i(INT64_MAX);
  expectRefused(slice, "(slice): the slice from 9223372036854775807 does not fit");
  pxe::Executable table = oneOp("position_embedding_grad", {{1, 3, 4}}, {{8, 4}});
  (*table.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["offset"].set_i(INT64_MAX - 1);
  expectRefused(table, "(position_embedding_grad): positions 9223372036854775806 .. beyond exceed the table's 8 rows");
  pxe::Executable rope = oneOp("rope", {{1, 3, 2, 4}}, {{1, 3, 2, 4}});
  (*rope.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["rotary_dim"].set_i(4);
  (*rope.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["theta"].set_f(1e4);
  s = validateExecutable(rope);
  EXPECT_TRUE(s.isOk()) << s.message();
  (*rope.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["position_offset"].set_i(INT64_MAX);
  expectRefused(rope, "(rope): position_offset must be in [0, 2^31), got 9223372036854775807");
  pxe::Executable positions = oneOp("position_embedding", {{8, 4}}, {{1, 3, 4}});
  (*positions.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["offset"].set_i(INT64_MAX);
  expectRefused(positions, "(position_embedding): positions 9223372036854775807 .. beyond exceed the table's 8 rows");
}

// The attribute values the dialect verifies, checked again at load: an
// executable that did not come from verified IR (a hostile file, a stale
// tool) computed NaN from an eps of -1 without a word.
pxe::Executable rmsNorm(pxe::Attr eps) {
  pxe::Executable exe = oneOp("rms_norm", {{2, 4}, {4}}, {{2, 4}});
  (*exe.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["eps"] = eps;
  return exe;
}

TEST(Executable, RefusesAttributeValuesTheDialectRefuses) {
  pxe::Attr eps;
  eps.set_f(1e-5);
  Status s = validateExecutable(rmsNorm(eps));
  EXPECT_TRUE(s.isOk()) << s.message();
  eps.set_f(-1);
  expectRefused(rmsNorm(eps), "stages[0].instructions[0] (rms_norm): eps must be a finite positive number, got -1");
  eps.set_f(0);
  expectRefused(rmsNorm(eps), "(rms_norm): eps must be a finite positive number, got 0");
  eps.set_f(std::nan(""));
  expectRefused(rmsNorm(eps), "(rms_norm): eps must be a finite positive number, got nan");
  eps.set_i(1); // of another kind
  expectRefused(rmsNorm(eps), "(rms_norm): eps must be a finite positive number");
  pxe::Executable aux = routerAux({4}, {2, 3, 4});
  (*aux.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["coefficient"].set_f(0);
  s = validateExecutable(aux);
  EXPECT_TRUE(s.isOk()) << s.message();
  (*aux.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["coefficient"].set_f(-0.5);
  expectRefused(aux, "(router_aux_grad): coefficient must be a finite non-negative number, got -0.5");
}

TEST(Executable, RefusesALossGradientOverFewerTokensThanItsRows) {
  pxe::Executable exe = oneOp("cross_entropy_grad", {{2, 3, 7}, {2, 3}}, {{2, 3, 7}}, {1});
  (*exe.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["num_tokens"].set_i(5);
  expectRefused(exe, "(cross_entropy_grad): num_tokens must be at least the 6 rows of the logits");
}

// Two pipeline stages of one rank each, each with an input [4].
pxe::Executable twoStages() {
  pxe::Executable exe;
  exe.set_format_version(2);
  exe.mutable_grid()->add_axis_names("pp");
  exe.mutable_grid()->add_shape(2);
  for (int r = 0; r < 2; ++r) {
    exe.add_ranks()->add_values(r);
    pxe::Stage *stage = exe.add_stages();
    stage->set_index(r);
    addBuffer(*stage, pxe::INPUT, pxe::F32, {4});
  }
  return exe;
}

TEST(Executable, RefusesACollectiveAcrossPipelineStages) {
  // Stage 0 all-reduces over "pp", which stage 1 never does: a rank would
  // wait forever.
  pxe::Executable exe = twoStages();
  for (int r = 0; r < 2; ++r) {
    pxe::Stage *stage = exe.mutable_stages(r);
    addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {4});
    pxe::Instruction *inst = stage->add_instructions();
    inst->set_kind(opKind(r == 0 ? "all_reduce" : "silu"));
    inst->add_operands(0);
    inst->add_results(1);
    if (r == 0) (*inst->mutable_attrs())["axes"].mutable_strings()->add_values("pp");
  }
  expectRefused(exe, "stages[0].instructions[0] (all_reduce).attrs[axes]: a group over 'pp' spans pipeline stages");
}

// Two stages of one rank each exchanging a tensor each way: stage s runs
// its transfers in the order given ("send" to / "recv" from the other).
pxe::Executable backAndForth(const std::vector<std::string> &first, const std::vector<std::string> &second) {
  pxe::Executable exe = twoStages();
  for (int r = 0; r < 2; ++r) {
    pxe::Stage *stage = exe.mutable_stages(r);
    for (const std::string &op : r == 0 ? first : second) {
      pxe::Instruction *inst = stage->add_instructions();
      inst->set_kind(opKind(op));
      if (op == "send") {
        inst->add_operands(0);
      } else {
        addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {4});
        inst->add_results(stage->buffers_size() - 1);
      }
      (*inst->mutable_attrs())["axes"].mutable_strings()->add_values("pp");
      (*inst->mutable_attrs())["peer"].set_i(1 - r);
    }
  }
  return exe;
}

TEST(Executable, AcceptsAGradientSentBackAfterItsActivation) {
  // Stage 0 sends its activation, then waits for the gradient stage 1
  // sends back once it has the activation (a training step's pipeline).
  EXPECT_TRUE(validateExecutable(backAndForth({"send", "recv"}, {"recv", "send"})).isOk());
}

TEST(Executable, RefusesStagesThatWaitForEachOther) {
  // Each stage receives before it sends: sends and receives pair up in
  // number and size, but neither stage ever reaches its send.
  expectRefused(backAndForth({"recv", "send"}, {"recv", "send"}),
                "stages: wait for each other forever: stages[0].instructions[0] (recv from stage 1); "
                "stages[1].instructions[0] (recv from stage 0)");
}

// A training step over two stages: stage s holds parameter "w" [4]
// (buffer 1) and computes its gradient (silu of the input, buffer 2);
// stage 0 returns it as result 1, stage 1 returns a loss (buffer 4, a
// reshape of input buffer 3; result 0) and the same gradient (result 1).
pxe::Executable gradientsOnTwoStages() {
  pxe::Executable exe = twoStages();
  for (int r = 0; r < 2; ++r) {
    pxe::Stage *stage = exe.mutable_stages(r);
    pxe::Buffer *w = addBuffer(*stage, pxe::PARAMETER, pxe::F32, {4});
    w->set_param_name("w");
    w->add_global_shape(4);
    w->add_split();
    addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {4});
    pxe::Instruction *grad = stage->add_instructions();
    grad->set_kind(parax::pxe::OP_SILU);
    grad->add_operands(0);
    grad->add_results(2);
    if (r == 1) {
      addBuffer(*stage, pxe::INPUT, pxe::F32, {1});
      addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {});
      pxe::Instruction *loss = stage->add_instructions();
      loss->set_kind(parax::pxe::OP_RESHAPE);
      loss->add_operands(3);
      loss->add_results(4);
      stage->add_outputs(4);
      stage->add_output_results(0);
      stage->add_output_grads("");
    }
    stage->add_outputs(2);
    stage->add_output_results(1);
    stage->add_output_grads("w");
  }
  return exe;
}

TEST(Executable, AcceptsGradientsReturnedByTheStagesHoldingTheirParameter) {
  pxe::Executable exe = gradientsOnTwoStages();
  Status s = validateExecutable(exe);
  ASSERT_TRUE(s.isOk()) << s.message();
  auto sources = resultSources(exe);
  ASSERT_EQ(sources.size(), 2u);
  EXPECT_EQ(sources[0].size(), 1u);
  EXPECT_EQ(sources[1].size(), 2u); // both stages return the gradient
  EXPECT_EQ(sources[1][0].stage, 0);
}

// A weight both stages read (a tied embedding and head): each returns its
// part of the gradient, flagged on both; the runtime adds the parts.
TEST(Executable, AGradientsPartsAreFlaggedOnEveryStageReturningIt) {
  auto flagged = [](std::vector<bool> first, std::vector<bool> second) {
    pxe::Executable exe = gradientsOnTwoStages();
    for (bool f : first) exe.mutable_stages(0)->add_output_stage_parts(f);
    for (bool f : second) exe.mutable_stages(1)->add_output_stage_parts(f);
    return exe;
  };
  pxe::Executable exe = flagged({true}, {false, true});
  Status s = validateExecutable(exe);
  ASSERT_TRUE(s.isOk()) << s.message();
  EXPECT_TRUE(isStagePart(exe.stages(0), 0));
  EXPECT_FALSE(isStagePart(exe.stages(1), 0));
  EXPECT_TRUE(isStagePart(exe.stages(1), 1));
  expectRefused(flagged({true}, {false, false}),
                "stages[1].outputs[1]: is result 1 but differs from stage 0's (gradient name, shape or being a "
                "stage's part)");
  expectRefused(flagged({true}, {true}), "stages[1].output_stage_parts: 1 flags for 2 outputs");
  expectRefused(flagged({true}, {true, true}), "stages[1].output_stage_parts[0]: a stage's part of what is not a "
                                               "gradient");
  // A part no other stage returns would never be added to.
  pxe::Executable alone = flagged({}, {false, true});
  alone.mutable_stages(0)->clear_outputs();
  alone.mutable_stages(0)->clear_output_results();
  alone.mutable_stages(0)->clear_output_grads();
  expectRefused(alone, "stages[1].outputs[1]: is a stage's part of result 1, which no other stage returns");
}

TEST(Executable, RefusesAnEarlierStageOutputThatDoesNotSayWhichResult) {
  pxe::Executable exe = gradientsOnTwoStages();
  exe.mutable_stages(0)->clear_output_results();
  expectRefused(exe, "stages[0].output_results: an earlier pipeline stage's outputs must say which results");
}

TEST(Executable, RefusesAnEarlierStageReturningAModelResult) {
  pxe::Executable exe = gradientsOnTwoStages();
  exe.mutable_stages(0)->set_output_grads(0, "");
  expectRefused(exe, "stages[0].outputs[0]: is result 1, not a gradient: only the last stage returns");
}

TEST(Executable, RefusesAResultNoStageReturns) {
  pxe::Executable exe = gradientsOnTwoStages();
  exe.mutable_stages(0)->set_output_results(0, 2);
  exe.mutable_stages(1)->set_output_results(1, 2);
  expectRefused(exe, "stages: no stage returns result 1");
}

TEST(Executable, RefusesStagesDisagreeingOnAResult) {
  pxe::Executable exe = gradientsOnTwoStages();
  exe.mutable_stages(1)->set_output_grads(1, "v");
  expectRefused(exe, "stages[1].outputs[1]: is result 1 but differs from stage 0's");
}

TEST(Executable, RefusesASplitOutputThatIsNotAGradient) {
  // A box of the loss, and a box where nothing is returned.
  pxe::Executable exe = gradientsOnTwoStages();
  pxe::Buffer *loss = exe.mutable_stages(1)->mutable_buffers(4);
  loss->clear_shape();
  loss->add_shape(1);
  loss->add_global_shape(1);
  loss->add_split();
  expectRefused(exe, "stages[1].outputs[0]: is a box of result 0: only a gradient is returned in its "
                     "parameter's split");
  exe = gradientsOnTwoStages();
  pxe::Buffer *temporary = addBuffer(*exe.mutable_stages(0), pxe::TEMPORARY, pxe::F32, {4});
  temporary->add_global_shape(8);
  temporary->add_split()->add_axes("pp");
  expectRefused(exe, "stages[0].buffers[3].global_shape: belongs on a parameter, an input or an output");
}

TEST(Executable, RefusesAGradientBoxThatIsNotItsSplit) {
  pxe::Executable exe = gradientsOnTwoStages();
  pxe::Buffer *grad = exe.mutable_stages(0)->mutable_buffers(2);
  grad->add_global_shape(16);
  grad->add_split();
  expectRefused(exe, "stages[0].buffers[2].global_shape: dimension 0 is not the local size times its split");
}

// A gradient returned as a partial sum (over cp, say): the runtime adds
// those axes into its data-parallel reduction. Only a gradient output may
// be one, over axes of the grid other than pp, none of them splitting it.
TEST(Executable, APartialSumIsAGradientOverAxesThatDoNotSplitIt) {
  auto partial = [](int stage, int buffer, std::vector<std::string> axes, const char *split = nullptr) {
    pxe::Executable exe = gradientsOnTwoStages();
    exe.mutable_grid()->add_axis_names("cp");
    exe.mutable_grid()->add_shape(1);
    for (pxe::Coordinates &rank : *exe.mutable_ranks()) rank.add_values(0);
    pxe::Buffer *b = exe.mutable_stages(stage)->mutable_buffers(buffer);
    if (b->shape_size() == 1) {
      b->add_global_shape(4);
      pxe::AxisList *dim = b->add_split();
      if (split) dim->add_axes(split);
    }
    for (const std::string &axis : axes) b->add_partial(axis);
    return exe;
  };
  Status s = validateExecutable(partial(0, 2, {"cp"}));
  EXPECT_TRUE(s.isOk()) << s.message();
  expectRefused(partial(1, 4, {"cp"}), "stages[1].buffers[4].partial: a partial sum that is not a gradient output");
  expectRefused(partial(0, 2, {"pp"}), "stages[0].buffers[2].partial: a partial sum over 'pp'");
  expectRefused(partial(0, 2, {"tp"}), "stages[0].buffers[2].partial: names unknown grid axis 'tp'");
  expectRefused(partial(0, 2, {"cp", "cp"}), "stages[0].buffers[2].partial: names 'cp' twice");
  expectRefused(partial(0, 2, {"cp"}, "cp"), "stages[0].buffers[2].partial: 'cp' both splits the box and sums it");
}

TEST(Executable, RefusesAZeroStageOutOfRange) {
  pxe::Executable exe = gradientsOnTwoStages();
  exe.mutable_schedule()->set_zero_stage(4);
  expectRefused(exe, "schedule.zero_stage: is 4, not 0 to 3");
}

TEST(Executable, RefusesModelChunksWithoutTheirRanges) {
  // Two chunks a stage, but no recv marks where the second begins.
  pxe::Executable exe = gradientsOnTwoStages();
  exe.mutable_schedule()->set_chunks(2);
  expectRefused(exe, "stages[0]: pipeline stage 0: 1 ranges (recvs marked range_start, and the start) for 2 model "
                     "chunks: expected 2 (forward only) or 4 (a training step)");
}

TEST(Executable, RefusesANegativeChunkCount) {
  pxe::Executable exe = gradientsOnTwoStages();
  exe.mutable_schedule()->set_chunks(-3);
  expectRefused(exe, "schedule.chunks: is -3: model chunks need two pipeline stages or more");
}

TEST(Executable, RefusesAChunkCountNearIntMax) {
  // (found by parax-pxe-fuzz under AddressSanitizer: twice the count
  // overflowed an int)
  pxe::Executable exe = gradientsOnTwoStages();
  exe.mutable_schedule()->set_chunks(2147483647);
  expectRefused(exe, "stages[0]: pipeline stage 0: 1 ranges (recvs marked range_start, and the start) for "
                     "2147483647 model chunks: expected 2147483647 (forward only) or 4294967294 (a training step)");
}

TEST(Executable, ACacheReadElsewhereIsNotWrittenInPlace) {
  pxe::Executable exe = generationStep(pxe::I32, 1, {1, 8, 2, 4});
  exe.mutable_stages(0)->add_outputs(0); // the old cache is a result too
  EXPECT_TRUE(cacheStateInputs(exe.stages(0)).empty());
}

// A checkpoint without tensors (the hand-made step has no parameters).
std::shared_ptr<Checkpoint> emptyCheckpoint() {
  std::string path = testing::TempDir() + "/parax-empty.safetensors";
  {
    std::ofstream out(path, std::ios::binary);
    const std::string header = "{}      "; // 8 bytes
    uint64_t size = header.size();
    out.write(reinterpret_cast<const char *>(&size), sizeof size);
    out << header;
  }
  auto opened = Checkpoint::open(path);
  EXPECT_TRUE(opened.isOk()) << opened.status().message();
  std::remove(path.c_str());
  return opened.value();
}

// The step's inputs at `position`: the cache as a shape only (it keeps its
// own), one new row of keys all equal to `value`.
std::vector<Tensor> stepInputs(int32_t position, float value) {
  Tensor cache{false, {1, 8, 2, 4}, {}, {}};
  Tensor rows = Tensor::floats({1, 1, 2, 4});
  std::fill(rows.f.begin(), rows.f.end(), value);
  Tensor at = Tensor::ints({});
  at.i[0] = position;
  return {cache, rows, at};
}

// Row `row` of a [1, 8, 2, 4] cache, all 8 values equal to `value`?
bool rowHolds(const Tensor &cache, int row, float value) {
  for (int k = 0; k < 8; ++k)
    if (cache.f[row * 8 + k] != value) return false;
  return true;
}

TEST(Executor, EachMicrobatchKeepsItsOwnCaches) {
  pxe::Executable exe = generationStep(pxe::I32, 1, {1, 8, 2, 4});
  auto weights = emptyCheckpoint();
  Executor executor;
  Status s = executor.prepare(exe, 0, nullptr, *weights, stepInputs(0, 1));
  ASSERT_TRUE(s.isOk()) << s.message();
  Executor::CacheSet first, second;
  auto step = [&](Executor::CacheSet &caches, int32_t position, float value) {
    ASSERT_TRUE(executor.setInputs(stepInputs(position, value)).isOk());
    ASSERT_TRUE(executor.swapCacheState(caches).isOk());
    ASSERT_TRUE(executor.run().isOk());
    ASSERT_TRUE(executor.swapCacheState(caches).isOk());
  };
  step(first, 0, 1);  // microbatch 0 writes row 0
  step(second, 0, 5); // microbatch 1 writes its own row 0
  step(first, 1, 2);  // microbatch 0 goes on from its own cache
  ASSERT_EQ(first.size(), 1u);
  const Tensor &a = first.at(0), &b = second.at(0);
  EXPECT_TRUE(rowHolds(a, 0, 1) && rowHolds(a, 1, 2) && rowHolds(a, 2, 0));
  EXPECT_TRUE(rowHolds(b, 0, 5) && rowHolds(b, 1, 0));
  // The step's result is microbatch 0's whole updated cache.
  Tensor result = executor.outputs()[0];
  EXPECT_TRUE(rowHolds(result, 0, 1) && rowHolds(result, 1, 2));
}

TEST(Executor, RefusesACacheOfAnotherShape) {
  pxe::Executable exe = generationStep(pxe::I32, 1, {1, 8, 2, 4});
  auto weights = emptyCheckpoint();
  Executor executor;
  ASSERT_TRUE(executor.prepare(exe, 0, nullptr, *weights, stepInputs(0, 1)).isOk());
  Executor::CacheSet other;
  other[0] = Tensor::floats({1, 4, 2, 4}); // a program planned with a smaller cache
  Status s = executor.swapCacheState(other);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("input #0: a KV cache [1, 4, 2, 4] where this program keeps [1, 8, 2, 4]"),
            std::string::npos)
      << s.message();
}


// The element counts of each all-to-all (everything else passed through).
class CountingCommunicator : public Communicator {
public:
  explicit CountingCommunicator(Communicator &inner) : inner(inner) {}
  int rank() const override { return inner.rank(); }
  int size() const override { return inner.size(); }
  int groupSize(unsigned mask) const override { return inner.groupSize(mask); }
  Status allReduce(float *data, size_t n, unsigned mask) override { return inner.allReduce(data, n, mask); }
  Status allGather(const float *in, size_t n, float *out, unsigned mask) override {
    return inner.allGather(in, n, out, mask);
  }
  Status allGatherRuns(const float *in, size_t rows, size_t run, float *out, unsigned mask) override {
    ++allGathers;
    return inner.allGatherRuns(in, rows, run, out, mask);
  }
  Status gatherRuns(const float *in, size_t rows, size_t run, float *out, unsigned mask) override {
    ++gathers;
    return inner.gatherRuns(in, rows, run, out, mask);
  }
  Status reduceScatter(const float *in, float *out, size_t n, unsigned mask) override {
    return inner.reduceScatter(in, out, n, mask);
  }
  Status allToAll(const float *in, float *out, size_t n, unsigned mask) override {
    allToAlls.push_back(n);
    return inner.allToAll(in, out, n, mask);
  }
  Status allToAllv(const float *in, const std::vector<size_t> &sendCounts, float *out,
                   const std::vector<size_t> &recvCounts, unsigned mask) override {
    allToAllvs.push_back(sendCounts);
    return inner.allToAllv(in, sendCounts, out, recvCounts, mask);
  }
  Status send(const float *data, size_t n, int peer) override { return inner.send(data, n, peer); }
  Status recv(float *data, size_t n, int peer) override { return inner.recv(data, n, peer); }
  [[noreturn]] void abort(const std::string &message) override {
    inner.abort(message);
    std::abort(); // (inner.abort does not return)
  }
  std::vector<size_t> allToAlls;
  std::vector<std::vector<size_t>> allToAllvs; // each one's send counts
  int allGathers = 0, gathers = 0;             // allGatherRuns' and gatherRuns' calls

private:
  Communicator &inner;
};

// Two ranks over `ep`, 4 experts (2 a rank), 4 tokens of width 3 choosing
// 2 each, the same on both ranks: 5 (token, choice) pairs go to rank 0's
// experts and 3 to rank 1's, so rank 0 receives 10 rows and rank 1 6.
// moe_dispatch into `capacity` rows a rank, then moe_combine of the rows as
// they arrived (experts that return their input): each token gets its two
// rows back, summed.
struct ExpertExchange {
  std::vector<Status> status;
  std::vector<std::vector<std::vector<size_t>>> sent; // per rank: each all-to-all's send counts
  std::vector<Tensor> back;
  Tensor x;
};
ExpertExchange exchangeExperts(int64_t capacity, std::vector<int32_t> choices = {0, 1, 2, 3, 0, 2, 1, 0}) {
  pxe::Executable exe;
  exe.set_format_version(2);
  exe.mutable_grid()->add_axis_names("ep");
  exe.mutable_grid()->add_shape(2);
  exe.add_ranks()->add_values(0);
  exe.add_ranks()->add_values(1);
  pxe::Stage *stage = exe.add_stages();
  stage->set_index(0);
  addBuffer(*stage, pxe::INPUT, pxe::F32, {4, 3});           // 0: tokens
  addBuffer(*stage, pxe::INPUT, pxe::F32, {4, 2});           // 1: router weights
  addBuffer(*stage, pxe::INPUT, pxe::I32, {4, 2});           // 2: experts chosen
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {capacity, 3}); // 3: rows
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {capacity, 1}); // 4: their weights
  addBuffer(*stage, pxe::TEMPORARY, pxe::I32, {capacity, 1}); // 5: their local experts
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {4, 3});       // 6: the tokens back
  for (const char *op : {"moe_dispatch", "moe_combine"}) {
    pxe::Instruction *inst = stage->add_instructions();
    inst->set_kind(opKind(op));
    for (int id : std::string(op) == "moe_dispatch" ? std::vector<int>{0, 1, 2} : std::vector<int>{3, 2})
      inst->add_operands(id);
    for (int id : std::string(op) == "moe_dispatch" ? std::vector<int>{3, 4, 5} : std::vector<int>{6})
      inst->add_results(id);
    (*inst->mutable_attrs())["num_experts"].set_i(4);
    (*inst->mutable_attrs())["axes"].mutable_strings()->add_values("ep");
  }
  stage->add_outputs(6);
  ExpertExchange out;
  out.x = Tensor::floats({4, 3});
  Tensor w = Tensor::floats({4, 2}), idx = Tensor::ints({4, 2});
  for (size_t k = 0; k < out.x.f.size(); ++k) out.x.f[k] = static_cast<float>(k + 1);
  std::fill(w.f.begin(), w.f.end(), 0.5f);
  idx.i = choices; // (by default rank 0's experts get 5 pairs, rank 1's 3)
  auto weights = emptyCheckpoint();
  auto comms = createThreadCommunicators({2});
  std::vector<std::unique_ptr<CountingCommunicator>> counting;
  for (auto &c : comms) counting.push_back(std::make_unique<CountingCommunicator>(*c));
  std::vector<Executor> executors(2);
  out.status.assign(2, Status::ok());
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r)
    threads.emplace_back([&, r] {
      out.status[r] = executors[r].prepare(exe, r, counting[r].get(), *weights, {out.x, w, idx});
      if (out.status[r].isOk()) out.status[r] = executors[r].run();
      if (!out.status[r].isOk()) cancelThreadCommunicators(*comms[r]);
    });
  for (auto &t : threads) t.join();
  for (int r = 0; r < 2; ++r) {
    out.sent.push_back(counting[r]->allToAllvs);
    out.back.push_back(out.status[r].isOk() ? executors[r].outputs().at(0) : Tensor());
  }
  return out;
}

// Two ranks over `tp` each take their half of x [2, 4] (columns 0-1, 2-3)
// and all-gather it back twice: once into an output nothing reads, once
// into a value the add reads (x + x, an output too). With the results on
// their holders only, the first gathers onto rank 0 alone
// (Executor::markGathersToHolders); the second, read on both ranks, stays
// an all-gather.
TEST(Executor, AnOutputNothingReadsIsGatheredOntoItsHolderAlone) {
  pxe::Executable exe;
  exe.set_format_version(2);
  exe.mutable_grid()->add_axis_names("tp");
  exe.mutable_grid()->add_shape(2);
  exe.add_ranks()->add_values(0);
  exe.add_ranks()->add_values(1);
  pxe::Stage *stage = exe.add_stages();
  stage->set_index(0);
  addBuffer(*stage, pxe::INPUT, pxe::F32, {2, 4});     // 0: x, whole on both ranks
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {2, 2}); // 1: this rank's columns
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {2, 4}); // 2: gathered, an output alone
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {2, 4}); // 3: gathered, read by the add
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {2, 4}); // 4: 3 + 3
  auto collective = [&](pxe::OpKind kind, int32_t in, int32_t out) {
    pxe::Instruction *inst = addInstruction(*stage, kind, {in}, {out});
    (*inst->mutable_attrs())["axes"].mutable_strings()->add_values("tp");
    (*inst->mutable_attrs())["dim"].set_i(1);
  };
  collective(pxe::OP_SHARD_SLICE, 0, 1);
  collective(pxe::OP_ALL_GATHER, 1, 2);
  collective(pxe::OP_ALL_GATHER, 1, 3);
  addInstruction(*stage, pxe::OP_ADD, {3, 3}, {4});
  stage->add_outputs(2);
  stage->add_outputs(4);
  ASSERT_TRUE(validateExecutable(exe).isOk()) << validateExecutable(exe).message();
  Tensor x = Tensor::floats({2, 4});
  for (size_t k = 0; k < x.f.size(); ++k) x.f[k] = static_cast<float>(k + 1);
  auto weights = emptyCheckpoint();
  for (bool holdersOnly : {false, true}) {
    auto comms = createThreadCommunicators({2});
    std::vector<std::unique_ptr<CountingCommunicator>> counting;
    for (auto &c : comms) counting.push_back(std::make_unique<CountingCommunicator>(*c));
    std::vector<Executor> executors(2);
    std::vector<Status> status(2, Status::ok());
    std::vector<std::vector<Tensor>> out(2);
    std::vector<std::thread> threads;
    for (int r = 0; r < 2; ++r)
      threads.emplace_back([&, r] {
        status[r] = executors[r].prepare(exe, r, counting[r].get(), *weights, {x});
        executors[r].setResultsOnHoldersOnly(holdersOnly);
        if (status[r].isOk()) status[r] = executors[r].run();
        if (status[r].isOk()) out[r] = executors[r].outputs();
        if (!status[r].isOk()) cancelThreadCommunicators(*comms[r]);
      });
    for (auto &t : threads) t.join();
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(status[r].isOk()) << status[r].message();
      EXPECT_EQ(counting[r]->gathers, holdersOnly ? 1 : 0) << "rank " << r;
      EXPECT_EQ(counting[r]->allGathers, holdersOnly ? 1 : 2) << "rank " << r;
      ASSERT_EQ(out[r].size(), 2u);
      for (size_t k = 0; k < x.f.size(); ++k)
        EXPECT_EQ(out[r][1].f[k], 2 * x.f[k]) << "rank " << r << " element " << k; // read: whole on both
    }
    for (int r = 0; r < (holdersOnly ? 1 : 2); ++r)
      EXPECT_EQ(out[r][0].f, x.f) << "rank " << r; // the holder's (and, all-gathered, the other's)
  }
}

TEST(Executor, ExpertExchangesSendTheRoutedRowsOnly) {
  // 12 rows a rank (the 16 every routing could need, less): enough here.
  ExpertExchange run = exchangeExperts(12);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(run.status[r].isOk()) << run.status[r].message();
    for (size_t k = 0; k < run.x.f.size(); ++k)
      EXPECT_EQ(run.back[r].f[k], 2 * run.x.f[k]) << "rank " << r << " element " << k;
  }
  // Out: 5 rows to rank 0, 3 to rank 1, [3 features, weight, expert] each;
  // back: what arrived (rank 0: 5 from each rank, rank 1: 3), 3 features.
  using Counts = std::vector<std::vector<size_t>>;
  EXPECT_EQ(run.sent[0], Counts({{5 * 5, 3 * 5}, {5 * 3, 5 * 3}}));
  EXPECT_EQ(run.sent[1], Counts({{5 * 5, 3 * 5}, {3 * 3, 3 * 3}}));
}

TEST(Executor, ExpertExchangeWithAnEmptyBlock) {
  // Every pair to rank 0's experts: rank 0 receives all 16 rows (the most
  // any routing sends, 16 held), rank 1 none; the blocks to and from rank
  // 1 are empty.
  ExpertExchange run = exchangeExperts(16, {0, 1, 1, 0, 0, 1, 1, 1});
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(run.status[r].isOk()) << run.status[r].message();
    for (size_t k = 0; k < run.x.f.size(); ++k)
      EXPECT_EQ(run.back[r].f[k], 2 * run.x.f[k]) << "rank " << r << " element " << k;
  }
  using Counts = std::vector<std::vector<size_t>>;
  EXPECT_EQ(run.sent[0], Counts({{8 * 5, 0}, {8 * 3, 8 * 3}}));
  EXPECT_EQ(run.sent[1], Counts({{8 * 5, 0}, {0, 0}}));
}

TEST(Executor, ExpertExchangeRefusesMoreRowsThanItHolds) {
  // Rank 0 is routed 10 rows, 9 held: both ranks stop before the exchange,
  // naming rank 0 and the counts (never a dropped row).
  ExpertExchange run = exchangeExperts(9);
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(run.status[r].isOk()) << "rank " << r;
    EXPECT_NE(run.status[r].message().find("expert-parallel rank 0 of 2 is routed 10 (token, choice) rows, "
                                           "more than the 9 its exchange holds"),
              std::string::npos)
        << run.status[r].message();
    EXPECT_TRUE(run.sent[r].empty());
  }
}

TEST(Executor, ExpertExchangeRefusesAnExpertOutsideTheModel) {
  // Pair 5 (token 2's second choice) chose expert 7 of 4: each rank stops
  // naming it, before anything is sent.
  ExpertExchange run = exchangeExperts(12, {0, 1, 2, 3, 0, 7, 1, 0});
  for (int r = 0; r < 2; ++r) {
    ASSERT_FALSE(run.status[r].isOk()) << "rank " << r;
    EXPECT_NE(run.status[r].message().find("moe_dispatch: (token, choice) pair 5 chose expert 7, outside the 4 "
                                           "experts"),
              std::string::npos)
        << run.status[r].message();
    EXPECT_TRUE(run.sent[r].empty());
  }
}

TEST(Executable, BoxesOfATensorInRefinedShapesHoldTheSameElements) {
  // DeepSeek-V3's kv_b_proj at 4 heads of 3 rows (2 of keys, 1 of values)
  // of 2: [12, 2] to one program, [4, 3, 2] to another. Rank 1 of 2 on the
  // heads holds rows 6..11 either way: the same run of elements, 12..24.
  pxe::Stage stage;
  pxe::Buffer *flat = addBuffer(stage, pxe::PARAMETER, pxe::F32, {6, 2});
  pxe::Buffer *heads = addBuffer(stage, pxe::PARAMETER, pxe::F32, {2, 3, 2});
  auto blocks = [](int64_t first, int64_t length, int64_t stride = 0, int64_t count = 1) {
    return std::optional<ElementBlocks>(ElementBlocks{first, length, stride, count});
  };
  EXPECT_EQ(elementBlocks({{12, 2}, {6, 0}}, *flat), blocks(12, 12));
  EXPECT_EQ(elementBlocks({{4, 3, 2}, {2, 0, 0}}, *heads), blocks(12, 12));
  EXPECT_EQ(elementBlocks({{4, 3, 2}, {2, 0, 0}}, *heads)->end(), 24);
  // One head's rows: a run after leading dimensions of one element.
  pxe::Buffer *head = addBuffer(stage, pxe::PARAMETER, pxe::F32, {1, 3, 2});
  EXPECT_EQ(elementBlocks({{4, 3, 2}, {3, 0, 0}}, *head), blocks(18, 6));
  // Rank 1's key piece: its two heads' first two rows, a block a head.
  pxe::Buffer *keys = addBuffer(stage, pxe::PARAMETER, pxe::F32, {2, 2, 2});
  EXPECT_EQ(elementBlocks({{4, 3, 2}, {2, 0, 0}}, *keys), blocks(12, 4, 6, 2));
  EXPECT_EQ(elementBlocks({{4, 3, 2}, {2, 0, 0}}, *keys)->end(), 22);
  // ... and its value piece, every head's last row.
  pxe::Buffer *values = addBuffer(stage, pxe::PARAMETER, pxe::F32, {2, 1, 2});
  EXPECT_EQ(elementBlocks({{4, 3, 2}, {2, 2, 0}}, *values), blocks(16, 2, 6, 2));
  // Whole: one run of everything.
  pxe::Buffer *all = addBuffer(stage, pxe::PARAMETER, pxe::F32, {4, 3, 2});
  EXPECT_EQ(elementBlocks({{4, 3, 2}, {0, 0, 0}}, *all), blocks(0, 24));
  // Cut on two dimensions before the last cut one: not blocks at one stride.
  pxe::Buffer *corner = addBuffer(stage, pxe::PARAMETER, pxe::F32, {2, 2, 1});
  EXPECT_EQ(elementBlocks({{4, 3, 2}, {0, 0, 0}}, *corner), std::nullopt);
  // A stack of experts is not one checkpoint tensor.
  heads->set_param_name("experts.{e}.w");
  EXPECT_EQ(elementBlocks({{4, 3, 2}, {2, 0, 0}}, *heads), std::nullopt);
}

TEST(Executable, AParameterIsFoundInAnotherDeclarationOfItsTensor) {
  // kv_b_proj at 4 heads of 3 rows of 2, over 2 ranks: rank 1 holds rows
  // 6..11 of [12, 2] to one program; to another, its key piece [4, 2, 2]
  // and value piece [4, 1, 2] of [4, 3, 2], heads 2..3.
  pxe::Stage stage;
  pxe::Buffer *flat = addBuffer(stage, pxe::PARAMETER, pxe::F32, {6, 2});
  const CheckpointBox flatBox{{12, 2}, {6, 0}};
  auto expectAt = [&](const CheckpointBox &box, const pxe::Buffer &buffer, int64_t offset, int64_t stride) {
    auto at = heldAt(box, buffer, flatBox, *flat);
    ASSERT_TRUE(at.has_value());
    EXPECT_EQ(at->offset, offset);
    EXPECT_EQ(at->blockStride, stride);
    EXPECT_EQ(at->blocks, stride > 0 ? 2 : 1);
  };
  pxe::Buffer *keys = addBuffer(stage, pxe::PARAMETER, pxe::F32, {2, 2, 2});
  pxe::Buffer *values = addBuffer(stage, pxe::PARAMETER, pxe::F32, {2, 1, 2});
  pxe::Buffer *head = addBuffer(stage, pxe::PARAMETER, pxe::F32, {1, 3, 2});
  expectAt({{4, 3, 2}, {2, 0, 0}}, *keys, 0, 6);   // a block of 4 a head, 6 apart
  expectAt({{4, 3, 2}, {2, 2, 0}}, *values, 4, 6); // each head's last row
  expectAt({{4, 3, 2}, {3, 0, 0}}, *head, 6, 0);   // head 3 whole: one run
  // Rank 0's heads are not in rank 1's box.
  EXPECT_FALSE(heldAt({{4, 3, 2}, {0, 0, 0}}, *keys, flatBox, *flat).has_value());
  // A declaration of the tensor with another number of elements is not the
  // same tensor, though its box's offsets would fit.
  EXPECT_FALSE(heldAt({{4, 4, 2}, {2, 0, 0}}, *keys, flatBox, *flat).has_value());
  // Blocks are not taken from blocks (the lender's box must be one run).
  EXPECT_FALSE(heldAt({{4, 3, 2}, {2, 2, 0}}, *values, {{4, 3, 2}, {2, 0, 0}}, *keys).has_value());
}

} // namespace

// A loss term returned apart (the MoE load-balancing loss, for logging):
// one entry per output, "balance" on an f32 scalar.
TEST(Executable, ALossTermIsABalanceScalar) {
  auto withTerms = [](pxe::Executable exe, std::vector<std::string> terms) {
    for (const std::string &term : terms) exe.mutable_stages(0)->add_output_terms(term);
    return exe;
  };
  Status ok = validateExecutable(withTerms(balanceLoss({2, 4}, {2, 4}), {"balance"}));
  EXPECT_TRUE(ok.isOk()) << ok.message();
  expectRefused(withTerms(balanceLoss({2, 4}, {2, 4}), {"router"}), "'router' is not a loss term (balance, mtp)");
  expectRefused(withTerms(balanceLoss({2, 4}, {2, 4}), {"balance", ""}), "output_terms: 2 terms for 1 outputs");
  expectRefused(withTerms(oneOp("sigmoid_grad", {{3, 7}, {3, 7}}, {{3, 7}}), {"balance"}),
                "a loss term must be an f32 scalar");
}

// ignore_index: the cross-entropy's third operand, the count of labels,
// comes with the attribute and only then; label_count needs it too.
TEST(Executable, ACountOfLabelsComesWithIgnoreIndex) {
  auto withIgnore = [](pxe::Executable exe) {
    (*exe.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["ignore_index"].set_i(-100);
    return exe;
  };
  for (const char *op : {"cross_entropy", "cross_entropy_grad"}) {
    std::vector<std::vector<int64_t>> result = {std::string(op) == "cross_entropy" ? std::vector<int64_t>{}
                                                                                    : std::vector<int64_t>{6, 10}};
    Status ok = validateExecutable(withIgnore(oneOp(op, {{6, 10}, {6}, {}}, result, {1})));
    EXPECT_TRUE(ok.isOk()) << ok.message();
    expectRefused(oneOp(op, {{6, 10}, {6}, {}}, result, {1}),
                  "a count of the labels (a scalar) must come with ignore_index and only then");
    expectRefused(withIgnore(oneOp(op, {{6, 10}, {6}}, result, {1})),
                  "a count of the labels (a scalar) must come with ignore_index and only then");
    expectRefused(withIgnore(oneOp(op, {{6, 10}, {6}, {2}}, result, {1})),
                  "a count of the labels (a scalar) must come with ignore_index and only then");
  }
  Status ok = validateExecutable(withIgnore(oneOp("label_count", {{6}}, {{}}, {0})));
  EXPECT_TRUE(ok.isOk()) << ok.message();
  expectRefused(oneOp("label_count", {{6}}, {{}}, {0}), "(label_count): the count must be a scalar, with ignore_index");
  expectRefused(withIgnore(oneOp("label_count", {{6}}, {{2}}, {0})),
                "(label_count): the count must be a scalar, with ignore_index");
}

// Vocab-parallel cross-entropy: after the labels (and a count), every
// token's logsumexp ([.., 1]) with vocab_axes and only then; logsumexp's
// result is its operand's shape with a last dimension of 1.
TEST(Executable, AVocabParallelLossReadsOneLogsumexpAToken) {
  auto vocab = [](pxe::Executable exe) {
    (*exe.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["vocab_axes"].mutable_strings()->add_values(
        "tp");
    return exe;
  };
  for (const char *op : {"cross_entropy", "cross_entropy_grad"}) {
    std::vector<std::vector<int64_t>> result = {std::string(op) == "cross_entropy" ? std::vector<int64_t>{}
                                                                                    : std::vector<int64_t>{6, 10}};
    Status ok = validateExecutable(vocab(oneOp(op, {{6, 10}, {6}, {6, 1}}, result, {1})));
    EXPECT_TRUE(ok.isOk()) << ok.message();
    expectRefused(vocab(oneOp(op, {{6, 10}, {6}}, result, {1})),
                  "then an lse with vocab_axes and only then");
    expectRefused(oneOp(op, {{6, 10}, {6}, {6, 1}}, result, {1}), "then an lse with vocab_axes and only then");
    expectRefused(vocab(oneOp(op, {{6, 10}, {6}, {6, 2}}, result, {1})),
                  "lse must have the logits' shape with a last dimension of 1");
  }
  Status ok = validateExecutable(oneOp("logsumexp", {{6, 10}}, {{6, 1}}));
  EXPECT_TRUE(ok.isOk()) << ok.message();
  expectRefused(oneOp("logsumexp", {{6, 10}}, {{6}}), "(logsumexp): the result must have x's shape with a last dimension of 1");
}

// Multi-token prediction's shift (ids moved along their sequence) and a
// loss's weight, checked before any kernel runs.
TEST(Executable, AShiftStaysInsideItsSequenceOfIds) {
  auto shift = [](std::vector<int64_t> shape, int64_t by, bool fill = true, pxe::DType result = pxe::I32) {
    pxe::Executable exe = oneOp("shift", {shape}, {shape}, {0});
    pxe::Stage *stage = exe.mutable_stages(0);
    pxe::Instruction *inst = stage->mutable_instructions(0);
    stage->mutable_buffers(inst->results(0))->set_dtype(result);
    (*inst->mutable_attrs())["shift"].set_i(by);
    if (fill) (*inst->mutable_attrs())["fill"].set_i(-100);
    return exe;
  };
  Status ok = validateExecutable(shift({2, 8}, 1));
  EXPECT_TRUE(ok.isOk()) << ok.message();
  expectRefused(shift({2, 8}, 0), "(shift): shift must be in (0, 8), the sequence, with a fill, got 0");
  expectRefused(shift({2, 8}, 8), "(shift): shift must be in (0, 8), the sequence, with a fill, got 8");
  expectRefused(shift({2, 8}, 1, /*fill=*/false), "(shift): shift must be in (0, 8), the sequence, with a fill, got 1");
  expectRefused(shift({16}, 1), "(shift): x must be [batch, sequence] and the result of its type");
  expectRefused(shift({2, 8}, 1, true, pxe::F32), "result 0 must be integer");
  for (double weight : {-0.3, 0.0, std::nan("")}) {
    pxe::Executable exe = oneOp("cross_entropy", {{6, 10}, {6}}, {{}}, {1});
    (*exe.mutable_stages(0)->mutable_instructions(0)->mutable_attrs())["weight"].set_f(weight);
    expectRefused(exe, "weight must be a finite positive number");
  }
}

// A rope whose LongRoPE factors do not fit its rotated pairs, or are not
// positive, is refused when the executable is read, naming the rope.
TEST(Executable, RefusesLongRopeFactorsUnlikeItsPairs) {
  for (std::vector<double> factors : {std::vector<double>{1.0, 2.0}, std::vector<double>{1.0, 2.0, 0.0, 4.0},
                                      std::vector<double>{1.0, NAN, 3.0, 4.0}}) {
    pxe::Executable exe = oneRank();
    pxe::Stage *stage = exe.mutable_stages(0);
    addBuffer(*stage, pxe::INPUT, pxe::F32, {1, 4, 2, 8});
    addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {1, 4, 2, 8});
    pxe::Instruction *inst = stage->add_instructions();
    inst->set_kind(parax::pxe::OP_ROPE);
    inst->add_operands(0);
    inst->add_results(1);
    auto &attrs = *inst->mutable_attrs();
    attrs["rotary_dim"].set_i(8);
    attrs["theta"].set_f(1e4);
    attrs["scaling.rope_type"].set_s("longrope");
    attrs["scaling.factor"].set_f(4);
    for (double f : factors) attrs["scaling.ext_factors"].mutable_floats()->add_values(f);
    stage->add_outputs(1);
    expectRefused(exe, factors.size() == 2 ? "longrope scaling needs ext_factors: 4 numbers"
                                           : "must be a finite positive number");
  }
}

// The executor's own checks, on executables the validator lets through
// (its text is what a user reads).

// Two ranks over `tp`, one stage: an input [4] all-reduced over `axes`.
pxe::Executable allReduceOver(const std::vector<std::string> &axes) {
  pxe::Executable exe;
  exe.set_format_version(2);
  exe.mutable_grid()->add_axis_names("dp");
  exe.mutable_grid()->add_shape(1);
  exe.mutable_grid()->add_axis_names("tp");
  exe.mutable_grid()->add_shape(2);
  for (int r = 0; r < 2; ++r) {
    auto *c = exe.add_ranks();
    c->add_values(0);
    c->add_values(r);
  }
  pxe::Stage *stage = exe.add_stages();
  stage->set_index(0);
  addBuffer(*stage, pxe::INPUT, pxe::F32, {4});
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {4});
  pxe::Instruction *inst = stage->add_instructions();
  inst->set_kind(parax::pxe::OP_ALL_REDUCE);
  inst->add_operands(0);
  inst->add_results(1);
  for (const std::string &axis : axes)
    (*inst->mutable_attrs())["axes"].mutable_strings()->add_values(axis);
  stage->add_outputs(1);
  return exe;
}

// `exe` prepared on rank 0 without a communicator, run once: the status.
Status runAlone(const pxe::Executable &exe, std::vector<Tensor> inputs) {
  auto weights = emptyCheckpoint();
  Executor executor;
  Status s = executor.prepare(exe, 0, nullptr, *weights, inputs);
  return s.isOk() ? executor.run() : s;
}

TEST(Executor, ACollectiveOverSeveralRanksNeedsACommunicator) {
  pxe::Executable exe = allReduceOver({"tp"});
  ASSERT_TRUE(validateExecutable(exe).isOk());
  Status s = runAlone(exe, {Tensor::floats({4})});
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("a collective over several ranks needs a communicator"), std::string::npos)
      << s.message();
}

TEST(Executor, RefusesCollectiveAxesOutOfGridOrder) {
  for (auto [axes, given] : {std::pair{std::vector<std::string>{"tp", "dp"}, "[tp, dp]"},
                             std::pair{std::vector<std::string>{"tp", "tp"}, "[tp, tp]"}}) {
    pxe::Executable exe = allReduceOver(axes);
    ASSERT_TRUE(validateExecutable(exe).isOk());
    Status s = runAlone(exe, {Tensor::floats({4})});
    ASSERT_FALSE(s.isOk());
    EXPECT_NE(s.message().find(std::string("stage 0 instruction 0 (all_reduce): collective axes ") + given +
                               " must be distinct grid axes in grid order (dp, tp)"),
              std::string::npos)
        << s.message();
  }
}

TEST(Executor, RefusesATransposeWithoutItsPermutation) {
  pxe::Executable exe = oneRank();
  pxe::Stage *stage = exe.mutable_stages(0);
  addBuffer(*stage, pxe::INPUT, pxe::F32, {2, 3});
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {3, 2});
  pxe::Instruction *inst = stage->add_instructions();
  inst->set_kind(parax::pxe::OP_TRANSPOSE);
  inst->add_operands(0);
  inst->add_results(1);
  stage->add_outputs(1);
  // (refused before it runs: the validator reads the attribute)
  Status s = validateExecutable(exe);
  ASSERT_FALSE(s.isOk());
  EXPECT_NE(s.message().find("stages[0].instructions[0] (transpose): has no permutation attribute"),
            std::string::npos)
      << s.message();
}

// outputs() hands over an output the run writes afresh (a temporary: the
// memory the run wrote, the stage taking a recycled tensor's in its place)
// and copies one it must keep (here an input returned as it is); results
// held by the caller are never written by later runs.
TEST(Executor, HandsOverFreshOutputsAndCopiesKeptOnes) {
  auto weights = emptyCheckpoint();
  pxe::Executable exe = oneRank();
  pxe::Stage *stage = exe.mutable_stages(0);
  addBuffer(*stage, pxe::INPUT, pxe::F32, {4});
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {4});
  addInstruction(*stage, pxe::OP_ADD, {0, 0}, {1});
  stage->add_outputs(1); // x + x, handed over
  stage->add_outputs(0); // x, copied
  ASSERT_TRUE(validateExecutable(exe).isOk());
  auto input = [](float v) {
    Tensor t = Tensor::floats({4});
    std::fill(t.f.begin(), t.f.end(), v);
    return t;
  };
  auto expectStep = [](const std::vector<Tensor> &out, float v) {
    ASSERT_EQ(out.size(), 2u);
    for (int j = 0; j < 4; ++j) {
      EXPECT_EQ(out[0].f[j], 2 * v);
      EXPECT_EQ(out[1].f[j], v);
    }
  };
  Executor executor;
  ASSERT_TRUE(executor.prepare(exe, 0, nullptr, *weights, {input(1)}).isOk());
  ASSERT_TRUE(executor.run().isOk());
  std::vector<Tensor> first = executor.outputs();
  expectStep(first, 1);
  const float *recycled[] = {first[0].f.data(), first[1].f.data()};
  executor.recycle(std::move(first));
  ASSERT_TRUE(executor.setInputs({input(3)}).isOk());
  ASSERT_TRUE(executor.run().isOk());
  std::vector<Tensor> second = executor.outputs();
  expectStep(second, 3);
  // the sum is the run's own memory, the copy a recycled tensor's
  EXPECT_TRUE(second[0].f.data() != recycled[0] && second[0].f.data() != recycled[1]);
  EXPECT_TRUE(second[1].f.data() == recycled[0] || second[1].f.data() == recycled[1]);
  ASSERT_TRUE(executor.setInputs({input(5)}).isOk());
  ASSERT_TRUE(executor.run().isOk());
  expectStep(executor.outputs(), 5);
  expectStep(second, 3); // held, not written by the later run
}

// A reshape whose operand is read last there takes the operand's storage
// (Executor::markReshapesInPlace); one whose operand is read after it
// copies. Both right over several runs, the taken storage going back to
// the operand's writer each time.
TEST(Executor, AReshapeTakesAnOperandReadLastThereAndCopiesOneReadAfter) {
  auto weights = emptyCheckpoint();
  pxe::Executable exe = oneRank();
  pxe::Stage *stage = exe.mutable_stages(0);
  addBuffer(*stage, pxe::INPUT, pxe::F32, {2, 4});     // 0: x
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {2, 4}); // 1: x + x, read last by the reshape
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {8});    // 2: its reshape (takes 1's storage)
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {2, 4}); // 3: x + x, read again after its reshape
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {8});    // 4: its reshape (a copy)
  addBuffer(*stage, pxe::TEMPORARY, pxe::F32, {2, 4}); // 5: (x + x) + x
  addInstruction(*stage, pxe::OP_ADD, {0, 0}, {1});
  addInstruction(*stage, pxe::OP_RESHAPE, {1}, {2});
  addInstruction(*stage, pxe::OP_ADD, {0, 0}, {3});
  addInstruction(*stage, pxe::OP_RESHAPE, {3}, {4});
  addInstruction(*stage, pxe::OP_ADD, {3, 0}, {5});
  stage->add_outputs(2);
  stage->add_outputs(4);
  stage->add_outputs(5);
  ASSERT_TRUE(validateExecutable(exe).isOk());
  Executor executor;
  auto input = [](float v) {
    Tensor t = Tensor::floats({2, 4});
    for (int j = 0; j < 8; ++j)
      t.f[j] = v + j;
    return t;
  };
  ASSERT_TRUE(executor.prepare(exe, 0, nullptr, *weights, {input(1)}).isOk());
  for (float v : {1.0f, 10.0f, 100.0f}) {
    ASSERT_TRUE(executor.setInputs({input(v)}).isOk());
    ASSERT_TRUE(executor.run().isOk());
    std::vector<Tensor> out = executor.outputs();
    ASSERT_EQ(out.size(), 3u);
    EXPECT_EQ(out[0].shape, std::vector<int64_t>{8});
    for (int j = 0; j < 8; ++j) {
      EXPECT_EQ(out[0].f[j], 2 * (v + j)) << v << " " << j;
      EXPECT_EQ(out[1].f[j], 2 * (v + j)) << v << " " << j;
      EXPECT_EQ(out[2].f[j], 3 * (v + j)) << v << " " << j;
    }
    executor.recycle(std::move(out));
  }
}

TEST(Executor, GreedyTokensNeedLogits) {
  auto weights = emptyCheckpoint();
  pxe::Executable none = oneRank();
  addBuffer(*none.mutable_stages(0), pxe::INPUT, pxe::F32, {2, 5});
  Executor executor;
  ASSERT_TRUE(executor.prepare(none, 0, nullptr, *weights, {Tensor::floats({2, 5})}).isOk());
  ASSERT_TRUE(executor.run().isOk());
  StatusOr<std::vector<int32_t>> tokens = executor.greedyTokens();
  ASSERT_FALSE(tokens.isOk());
  EXPECT_NE(tokens.status().message().find("greedy tokens: this stage returns nothing"), std::string::npos);
  // a first result of integers is no logits
  pxe::Executable ints = oneRank();
  addBuffer(*ints.mutable_stages(0), pxe::INPUT, pxe::I32, {2, 5});
  ints.mutable_stages(0)->add_outputs(0);
  Executor other;
  ASSERT_TRUE(other.prepare(ints, 0, nullptr, *weights, {Tensor::ints({2, 5})}).isOk());
  ASSERT_TRUE(other.run().isOk());
  tokens = other.greedyTokens();
  ASSERT_FALSE(tokens.isOk());
  EXPECT_NE(tokens.status().message().find("greedy tokens: the first result is not logits [..., vocab]"),
            std::string::npos);
}

// Format 2 names each op by its kind (OpKind): a format-1 file (ops by
// strings) is refused saying how to get a new one; a kind this runtime does
// not know is refused by the instruction; the names and kinds agree both
// ways for every op either backend runs.
TEST(ExecutableFormatTest, OpsAreKindsAndFormatOneIsRefusedByName) {
  pxe::Executable old = oneRank();
  old.set_format_version(1);
  expectRefused(old, "format 1 named ops by strings: translate the IR again");

  pxe::Executable exe = oneRank();
  pxe::Stage &stage = *exe.mutable_stages(0);
  addBuffer(stage, pxe::INPUT, pxe::F32, {4});
  addBuffer(stage, pxe::TEMPORARY, pxe::F32, {4});
  pxe::Instruction *inst = stage.add_instructions();
  inst->add_operands(0), inst->add_results(1);
  stage.add_outputs(1);
  inst->set_kind(pxe::OP_SILU);
  EXPECT_TRUE(validateExecutable(exe).isOk()) << validateExecutable(exe).message();
  inst->set_kind(static_cast<pxe::OpKind>(4096)); // (an open enum: any number parses)
  expectRefused(exe, "instructions[0] (kind 4096).kind: is not an op this runtime knows");

  EXPECT_EQ(opName(pxe::OP_LINEAR), "linear");
  EXPECT_EQ(opKind("moe_dispatch"), pxe::OP_MOE_DISPATCH);
  EXPECT_EQ(opKind("no_such_op"), pxe::OP_UNKNOWN);
  EXPECT_EQ(opName(static_cast<pxe::OpKind>(-3)), "");
  for (int k = 1; k < pxe::OpKind_ARRAYSIZE; ++k)
    if (pxe::OpKind_IsValid(k))
      EXPECT_EQ(opKind(opName(static_cast<pxe::OpKind>(k))), k) << k;
}
