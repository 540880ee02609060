//===- ParaxBase.td - parax dialect, enums, attributes -----*- tablegen -*-===//

#ifndef PARAX_DIALECT_PARAX_IR_PARAXBASE_TD
#define PARAX_DIALECT_PARAX_IR_PARAXBASE_TD

include "mlir/IR/OpBase.td"
include "mlir/IR/AttrTypeBase.td"
include "mlir/IR/EnumAttr.td"
include "mlir/IR/BuiltinAttributeInterfaces.td"

def Parax_Dialect : Dialect {
  let name = "parax";
  let cppNamespace = "::parax";
  let summary = "Transformer-level tensor ops with sharding annotations";
  let description = [{
    The `parax` dialect describes a Transformer model graph at the level the
    auto-parallelization planner reasons about: one op per kernel-sized piece
    of work (a linear, an attention, a norm, an MoE router, the experts), each
    of which knows its FLOPs and the bytes it moves (`CostOpInterface`).

    Conventions:

    * A model is a `func.func`; its parameters are function arguments that
      carry `parax.param = "<checkpoint tensor name>"` (Hugging Face naming).
      A name containing `{e}` names a stack of per-expert tensors along
      dimension 0 (`...experts.{e}.w1.weight`, e = 0 .. E-1). A parameter
      that is one piece of a fused checkpoint tensor (GPT-2's `c_attn` holds
      q, k and v) also carries `parax.param_offset` (where the piece starts)
      and `parax.param_shape` (the checkpoint tensor's shape); the loader
      reads only its box of the piece (`--parax-split-fused-params`).
    * Every op of a model built by `python -m parax.models` carries
      `parax.layer = i`: `-1` for the prologue (embeddings), `0 .. L-1` for the
      decoder layers, `L` for the epilogue (final norm, lm head, loss).
    * `parax.linear` computes `y = x · W` with `W : [in, out]` (Megatron's
      convention); `transpose_w` declares `W : [out, in]`, the layout in which
      Hugging Face stores `nn.Linear` weights, so checkpoints map 1:1.
    * Shardings: `parax.grid` declares a device grid with named axes;
      `#parax.sharding` gives, per tensor dimension, the grid axes it is split
      over, and the axes over which the value is a pending partial sum. Ops
      carry `parax.shardings = [...]` (one per result), function arguments and
      results `parax.sharding = ...`.
  }];
  let useDefaultAttributePrinterParser = 1;
  let hasOperationAttrVerify = 1;
  let hasRegionArgAttrVerify = 1;
  let hasRegionResultAttrVerify = 1;
  let extraClassDeclaration = [{
    /// Discardable attribute names used across the project.
    static constexpr ::llvm::StringLiteral kParamAttrName = "parax.param";
    /// On a parameter argument that is a box of its checkpoint tensor (one
    /// piece of a fused weight, see --parax-split-fused-params): where the
    /// box starts, and the checkpoint tensor's whole shape.
    static constexpr ::llvm::StringLiteral kParamOffsetAttrName = "parax.param_offset";
    static constexpr ::llvm::StringLiteral kParamShapeAttrName = "parax.param_shape";
    static constexpr ::llvm::StringLiteral kLayerAttrName = "parax.layer";
    static constexpr ::llvm::StringLiteral kShardingAttrName = "parax.sharding";
    static constexpr ::llvm::StringLiteral kShardingsAttrName = "parax.shardings";
    static constexpr ::llvm::StringLiteral kStageAttrName = "parax.stage";
    static constexpr ::llvm::StringLiteral kPlanAttrName = "parax.plan";
    static constexpr ::llvm::StringLiteral kPipelineAttrName = "parax.pipeline";
    /// On a partitioned function's argument: the sharding of the global
    /// tensor this local argument is a piece of (what the loader reads).
    static constexpr ::llvm::StringLiteral kGlobalShardingAttrName =
        "parax.global_sharding";
    /// On a partitioned function's data (non-parameter) argument: which
    /// input of the original program it is, counted over the original
    /// function's data arguments (a pipeline stage reads only some).
    static constexpr ::llvm::StringLiteral kInputAttrName = "parax.input";
    /// On a function result (--parax-autodiff): the checkpoint name of the
    /// parameter this result is the gradient of.
    static constexpr ::llvm::StringLiteral kGradAttrName = "parax.grad";
    /// On a partitioned stage function's result: which result of the
    /// original function it is (a stage returns only some: a training
    /// step's gradients come from the stages holding their parameters).
    static constexpr ::llvm::StringLiteral kResultAttrName = "parax.result";
    /// On a function result (--parax-autodiff): a term of the loss
    /// returned first, returned apart for logging ("balance": the MoE
    /// load-balancing losses' sum; "mtp": multi-token prediction's
    /// weighted losses').
    static constexpr ::llvm::StringLiteral kLossTermAttrName =
        "parax.loss_term";
    /// On a partitioned stage function's result (a gradient): this stage's
    /// part of a gradient that every stage returning it returns a part of
    /// (a weight they all read: a tied embedding and head); the runtime
    /// adds the parts once a step, after the microbatches.
    static constexpr ::llvm::StringLiteral kStagePartAttrName =
        "parax.stage_part";
  }];
}

//===----------------------------------------------------------------------===//
// Enums
//===----------------------------------------------------------------------===//

def Parax_ScoreFunc : I32EnumAttr<"ScoreFunc", "router scoring function", [
    I32EnumAttrCase<"Softmax", 0, "softmax">,
    I32EnumAttrCase<"Sigmoid", 1, "sigmoid">]> {
  let cppNamespace = "::parax";
  let genSpecializedAttr = 0;
}
def Parax_ScoreFuncAttr : EnumAttr<Parax_Dialect, Parax_ScoreFunc, "score_func">;

def Parax_GeluApprox : I32EnumAttr<"GeluApprox", "GELU approximation", [
    I32EnumAttrCase<"None", 0, "none">,
    I32EnumAttrCase<"Tanh", 1, "tanh">]> {
  let cppNamespace = "::parax";
  let genSpecializedAttr = 0;
}
def Parax_GeluApproxAttr : EnumAttr<Parax_Dialect, Parax_GeluApprox, "gelu_approx">;

//===----------------------------------------------------------------------===//
// Attributes
//===----------------------------------------------------------------------===//

def Parax_ShardingAttr : AttrDef<Parax_Dialect, "Sharding"> {
  let mnemonic = "sharding";
  let summary = "how a tensor value is laid out over a device grid";
  let description = [{
    `#parax.sharding<@grid, [{dp}, {}, {tp} ]>` splits dimension 0 over grid
    axis `dp` and dimension 2 over `tp`; dimension 1 is replicated. A dimension
    split over several axes lists them major to minor (`{dp, tp}`). Axes not
    named anywhere replicate the value.

    `partial = {tp}` marks a pending partial sum over `tp`: every `tp` rank
    holds a summand and the value is their sum (the output of a row-parallel
    linear before its all-reduce).

    Constraints (checked by the verifier): every axis exists in the grid; no
    axis is used twice (across dimensions and `partial`); the list has one
    entry per tensor dimension; the product of the sizes of the axes that
    split a static dimension divides it.
  }];
  let parameters = (ins
    "::mlir::FlatSymbolRefAttr":$grid,
    // One ArrayAttr of StringAttr (axis names) per tensor dimension.
    "::mlir::ArrayAttr":$dims,
    // Axis names over which the value is a pending partial sum.
    "::mlir::ArrayAttr":$partial_axes
  );
  let hasCustomAssemblyFormat = 1;
  let genVerifyDecl = 1;
  let extraClassDeclaration = [{
    /// Axis names splitting tensor dimension `dim`, major to minor.
    ::llvm::SmallVector<::llvm::StringRef> getSplitAxes(unsigned dim) const;
    /// All axis names used anywhere in this sharding.
    ::llvm::SmallVector<::llvm::StringRef> getAllAxes() const;
    bool isPartial() const { return !getPartialAxes().empty(); }
  }];
}

def Parax_PlanAttr : AttrDef<Parax_Dialect, "Plan"> {
  let mnemonic = "plan";
  let summary = "the plan a function was partitioned by";
  let description = [{
    `parax.plan = #parax.plan<...>` on a function: what `--parax-plan`
    chose (the cluster, the degrees, the microbatching, the schedule, ZeRO,
    recomputation) and what it predicts (step time, MFU, memory, exposed
    communication), read by the passes after it: `--parax-partition` (the
    schedule, microbatches and ZeRO stage it hands the runtime in
    `#parax.pipeline`, the expert capacity), `--parax-recompute=plan`. A
    user may write a partial plan; what it leaves out takes the default
    (one of each degree, one microbatch, `1f1b`, ZeRO 0, no recomputation,
    any expert capacity, no prediction).

    ```mlir
    func.func @model(...) attributes {parax.plan = #parax.plan<ep = 4, expert_capacity = 1.5 : f64>}
    ```

    Constraints (the verifier): degrees, microbatch sizes and counts and
    virtual stages at least 1, `devices` not negative, `zero` 0 to 3,
    `schedule` one of `gpipe`, `1f1b`, `interleaved`, `recompute` one of
    `none`, `selective`, `full`, `expert_capacity` at least 1.
  }];
  let parameters = (ins
    StringRefParameter<"the cluster's name", "\"\"">:$cluster,
    DefaultValuedParameter<"int64_t", "0">:$devices,
    StringRefParameter<"the workload, as parax-plan reads it", "\"\"">:$workload,
    DefaultValuedParameter<"int64_t", "1">:$pp,
    DefaultValuedParameter<"int64_t", "1">:$dp,
    DefaultValuedParameter<"int64_t", "1">:$ep,
    DefaultValuedParameter<"int64_t", "1">:$tp,
    DefaultValuedParameter<"int64_t", "1">:$cp,
    OptionalParameter<"::mlir::BoolAttr">:$sequence_parallel,
    DefaultValuedParameter<"int64_t", "1">:$micro_batch,
    DefaultValuedParameter<"int64_t", "1">:$micro_batches,
    StringRefParameter<"the pipeline schedule", "\"1f1b\"">:$schedule,
    DefaultValuedParameter<"int64_t", "1">:$virtual_stages,
    DefaultValuedParameter<"int64_t", "0">:$zero,
    StringRefParameter<"what the backward recomputes", "\"none\"">:$recompute,
    OptionalParameter<"::mlir::FloatAttr">:$expert_capacity,
    OptionalParameter<"::mlir::FloatAttr">:$step_time_s,
    OptionalParameter<"::mlir::FloatAttr">:$mfu,
    OptionalParameter<"::mlir::FloatAttr">:$memory_per_device_bytes,
    OptionalParameter<"::mlir::FloatAttr">:$exposed_comm_s
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

def Parax_PipelineAttr : AttrDef<Parax_Dialect, "Pipeline"> {
  let mnemonic = "pipeline";
  let summary = "a partitioned function's pipeline stage and the runtime's schedule";
  let description = [{
    `parax.pipeline = #parax.pipeline<...>` on each function
    `--parax-partition` makes: which of `stages` pipeline stages it is
    (with `chunks` > 1, interleaved: the model chunks a stage holds), and
    the schedule the runtime runs them by (`schedule`, `micro_batches`, the
    ZeRO stage `zero`), taken from the function's `#parax.plan`.
    `parax-translate --to-executable` writes them into the executable.

    ```mlir
    func.func @stage1(...) attributes {parax.pipeline = #parax.pipeline<stage = 1, stages = 2, micro_batches = 4>}
    ```

    Constraints (the verifier): `0 <= stage < stages`, `chunks` and
    `micro_batches` at least 1, `zero` 0 to 3, `schedule` one of `gpipe`,
    `1f1b`, `interleaved`.
  }];
  let parameters = (ins
    "int64_t":$stage,
    "int64_t":$stages,
    DefaultValuedParameter<"int64_t", "1">:$chunks,
    StringRefParameter<"the pipeline schedule", "\"1f1b\"">:$schedule,
    DefaultValuedParameter<"int64_t", "1">:$micro_batches,
    DefaultValuedParameter<"int64_t", "0">:$zero
  );
  let assemblyFormat = "`<` struct(params) `>`";
  let genVerifyDecl = 1;
}

#endif // PARAX_DIALECT_PARAX_IR_PARAXBASE_TD
