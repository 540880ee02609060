//===- Passes.td - planner passes --------------------------*- tablegen -*-===//

#ifndef PARAX_PLAN_PASSES_TD
#define PARAX_PLAN_PASSES_TD

include "mlir/Pass/PassBase.td"

def ParaxPlanPass : Pass<"parax-plan", "mlir::ModuleOp"> {
  let summary = "Choose a TP / PP / DP / EP placement and write it onto the IR";
  let description = [{
    Searches for the fastest placement of every model function on `cluster`
    for `workload` (see docs/planner.md) and writes the best plan onto the
    IR: a `parax.grid @plan(pp, dp, ep, tp)`, `parax.shardings` on every op
    and `parax.sharding` on parameters (the chosen tensor-parallel and
    expert-parallel layouts), `parax.stage` on every op, and a `parax.plan`
    dictionary on the function (degrees, schedule, microbatches, ZeRO stage,
    recompute, predicted step time, MFU and memory per device). When no plan
    fits, the pass fails with an error that says why. Fused parameters are
    split first (--parax-split-fused-params), so that each slice of one
    gets a layout of its own.
  }];
  let options = [
    Option<"cluster", "cluster", "std::string", /*default=*/"\"dgx-h100\"",
           "Cluster preset, PRESET:nodes=N, or a JSON file">,
    Option<"profile", "profile", "std::string", /*default=*/"\"roofline\"",
           "The software stack's profile (roofline, megatron-2021, megatron-core, "
           "fsdp, deepspeed-zero3-2021, parax-cuda) or a JSON file">,
    Option<"workload", "workload", "std::string",
           /*default=*/"\"train:batch=8,seq=2048\"",
           "train:batch=B,seq=S | prefill:batch=B,seq=S | decode:batch=B,context=C">,
  ];
}

#endif // PARAX_PLAN_PASSES_TD
