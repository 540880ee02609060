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

    Covered: the ops of Llama, GPT-2 and the MoE families Mixtral,
    Qwen2-MoE and DeepSeek-V3 (embedding, position_embedding, rms_norm,
    layer_norm, linear, reshape, slices that tile their operand, concat,
    broadcast, rope, attention, add, mul, sigmoid, swiglu, gelu, router,
    experts, cross_entropy). Other ops on the path to the loss, a parameter
    the loss does not depend on (but a router's correction bias, which only
    chooses experts): errors naming them.
  }];
}

def ParaxRecomputePass : Pass<"parax-recompute", "mlir::ModuleOp"> {
  let summary = "Recompute activations in the backward pass instead of keeping them";
  let description = [{
    Run after --parax-autodiff (and before --parax-partition). For every
    transformer layer (`parax.layer` >= 0; not the head's, which holds the
    loss), the layer's forward ops are run again in its backward pass,
    each copy just before its first reader, and the layer's gradient ops
    read the recomputed values: the forward values then die at their last
    forward use instead of living until the backward pass (a smaller peak
    of live temporaries), at the cost of the recomputed ops' time.

    `mode=full` recomputes every forward op of the layer from the layer's
    inputs (activation checkpointing at layer boundaries: only the inputs
    are kept); `mode=selective` recomputes only the ops whose results are
    large and cheap to make again (norms, activations, swiglu, rope, mul,
    broadcast, concat, attention; and reshapes, slices and transposes of
    recomputed values), reading the kept results of the others (Korthikanti
    et al. 2022's selective recomputation, as the planner costs it);
    `mode=plan` (the default) takes the plan's `recompute` choice
    (`parax.plan`), none without a plan; `mode=none` changes nothing.
    Recomputed ops keep their shardings and stages, so the partitioner
    gives them the forward's layouts and collectives.
  }];
  let options = [
    Option<"mode", "mode", "std::string", /*default=*/"\"plan\"",
           "none, selective, full, or plan (the plan's recompute choice)">,
  ];
}

#endif // PARAX_TRAIN_PASSES_TD
