// A profile that cannot be read: the pass and the tool name the profile and
// its field.
// RUN: not parax-opt %s --parax-plan="cluster=dgx-h100 profile=nonesuch workload=train:batch=8,seq=16" 2>&1 | FileCheck %s --check-prefix=NAME
// RUN: not parax-opt %s --parax-plan="cluster=dgx-h100 profile=%S/Inputs/bad-profile.json workload=train:batch=8,seq=16" 2>&1 | FileCheck %s --check-prefix=FIELD
// RUN: not parax-plan %s --cluster dgx-h100 --profile %S/Inputs/bad-profile.json --workload train:batch=8,seq=16 2>&1 | FileCheck %s --check-prefix=FIELD
// RUN: echo '{"name": "p", "expert_gemm_streams": 2.5}' > %t.json
// RUN: not parax-plan %s --cluster dgx-h100 --profile %t.json --workload train:batch=8,seq=16 2>&1 | FileCheck %s --check-prefix=STREAMS
// RUN: echo '{"name": "p", "expert_kept_bytes": -1}' > %t.kept.json
// RUN: not parax-plan %s --cluster dgx-h100 --profile %t.kept.json --workload train:batch=8,seq=16 2>&1 | FileCheck %s --check-prefix=KEPT
// RUN: echo '{"name": "p", "tp_overlap_splits": 1.5}' > %t.splits.json
// RUN: not parax-plan %s --cluster dgx-h100 --profile %t.splits.json --workload train:batch=8,seq=16 2>&1 | FileCheck %s --check-prefix=SPLITS
// RUN: echo '{"name": "p", "tp_overlap_sms": -16}' > %t.sms.json
// RUN: not parax-plan %s --cluster dgx-h100 --profile %t.sms.json --workload train:batch=8,seq=16 2>&1 | FileCheck %s --check-prefix=SMS
// RUN: echo '{"name": "p", "gemm_unhidden": 1.5}' > %t.unhidden.json
// RUN: not parax-plan %s --cluster dgx-h100 --profile %t.unhidden.json --workload train:batch=8,seq=16 2>&1 | FileCheck %s --check-prefix=UNHIDDEN
// RUN: not parax-plan %s --cluster dgx-h100 --workload train:batch=8,seq=16,sp=2 2>&1 | FileCheck %s --check-prefix=SP
// RUN: not parax-plan %s --cluster dgx-h100 --workload train:batch=8,seq=16,etp=1 2>&1 | FileCheck %s --check-prefix=ETP
// RUN: not parax-plan %s --cluster dgx-h100 --workload train:batch=8,seq=16,attention=paged 2>&1 | FileCheck %s --check-prefix=ATTN

// NAME: profile 'nonesuch' is neither a shipped profile (deepseek-v3, deepspeed-zero3-2021, fsdp, fsdp-compile, megatron-2021, megatron-2022, megatron-bridge, megatron-core, parax-cuda, roofline) nor a readable JSON file
// FIELD: bad-profile.json: profile field 'score_bytes' must be positive for a materialized attention
// STREAMS: profile field 'expert_gemm_streams' must be a whole number
// KEPT: kept.json: profile field 'expert_kept_bytes' must be in [0, 1000], got -1
// SPLITS: splits.json: profile field 'tp_overlap_splits' must be a whole number
// SMS: sms.json: profile field 'tp_overlap_sms' must be in [0, 1024], got -16
// UNHIDDEN: unhidden.json: profile field 'gemm_unhidden' must be in [0, 1], got 1.5
// ETP: etp=1: the model has no routed experts
// SP: sp (sequence parallelism) must be 0 or 1, got '2'
// ATTN: attention (the kernel kind) must be flash or materialized, got 'paged'

func.func @model(%tok: tensor<1x16xi32>,
    %emb: tensor<64x32xbf16> {parax.param = "emb"},
    %w: tensor<32x32xbf16> {parax.param = "w"}) -> tensor<1x16x32xbf16> {
  %h = parax.embedding %tok, %emb {parax.layer = -1 : i64} : (tensor<1x16xi32>, tensor<64x32xbf16>) -> tensor<1x16x32xbf16>
  %y = parax.linear %h, %w {parax.layer = 0 : i64} : (tensor<1x16x32xbf16>, tensor<32x32xbf16>) -> tensor<1x16x32xbf16>
  return %y : tensor<1x16x32xbf16>
}
