//===- Passes.td - the training step -----------------------*- tablegen -*-===//

#ifndef PARAX_TRAIN_PASSES_TD
#define PARAX_TRAIN_PASSES_TD

include "mlir/Pass/PassBase.td"

def ParaxAutodiffPass : Pass<"parax-autodiff", "mlir::ModuleOp"> {
  let summary = "Append the backward pass: gradients of the loss by every parameter";
  let description = [{
    Rewrites every function that returns one loss (a `parax.cross_entropy`
    result) into a training step's forward and backward pass: it returns
    the loss, then the gradient of the loss by each parameter argument
    (`parax.param`), in argument order, each result marked `parax.grad =
    "<checkpoint name>"`. Gradients flow back through the forward ops in
    reverse order (reverse-mode differentiation), as gradient ops
    (`parax.cross_entropy_grad`, `parax.linear_weight_grad`,
    `parax.attention_grad`, ...) or forward ops (`parax.linear` with its
    weight transposed, an inverse `parax.rope`, `parax.reshape`); the
    gradients of a value read several times are added. Each gradient op
    takes its forward op's `parax.layer` and `parax.stage`; none takes a
    sharding: run it after --parax-plan and before --parax-partition, whose
    propagation gives the backward pass its layouts (a weight's gradient, a
    sum over tokens, is a partial sum over the axes that split them: the
    data-parallel all-reduce of a plan's batch axes).

    Pipeline stages: each gradient op runs in its forward op's stage, so the
    partitioner sends gradients back to earlier stages.

    Covered: the ops of Llama and GPT-2 models (embedding,
    position_embedding, rms_norm, layer_norm, linear, reshape, slices that
    tile their operand, rope, attention, add, swiglu, gelu, cross_entropy).
    Other ops on the path to the loss, a parameter the loss does not depend
    on: errors naming them.
  }];
}

#endif // PARAX_TRAIN_PASSES_TD
