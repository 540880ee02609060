// Experts folded over the TP ranks (etp=1, Megatron's expert_tensor_parallel_size
// = 1): parax-plan costs it where the profile's stack has it (megatron-core),
// and says so (and that an MoE step's host side is not costed); the pass that lowers a plan for parax's runtime refuses it,
// naming why; an etp that is neither 1 nor the tp is refused. Tiny Mixtral,
// 1 layer, 4 experts, on 2 devices.
// RUN: parax-opt %s -verify-diagnostics --parax-plan="cluster=%parax_src/python/parax/oracle-cluster.json:devices_per_node=2 profile=megatron-core workload=train:batch=1,seq=8,tp=2,sp=1,etp=1"
// RUN: parax-plan %s --cluster %parax_src/python/parax/oracle-cluster.json:devices_per_node=2 --profile megatron-core --workload train:batch=1,seq=8,tp=2,sp=1,etp=1 --explain | FileCheck %s
// RUN: not parax-plan %s --cluster %parax_src/python/parax/oracle-cluster.json:devices_per_node=2 --profile megatron-core --workload train:batch=1,seq=8,tp=2,etp=3 2>&1 | FileCheck %s --check-prefix=ETP

// CHECK: experts: the host's share (kernel launches, the per-expert token counts read back every layer) is not costed
// CHECK: 1  pp1 dp1 ep1 tp2 sp etp1
// CHECK: experts folded over the TP ranks (etp=1, Megatron's expert_tensor_parallel_size = 1): each whole on one of 2 expert ranks (ep 1 x tp 2)
// CHECK: parax.router sequence
// CHECK: parax.experts folded
// ETP: etp=3 (the experts' tensor parallelism) must be 1 or the tp (2)
module {
  // expected-error @+1 {{etp=1 (the experts folded over the TP ranks) is a what-if parax's runtime does not run}}
  func.func @forward(
      %tokens: tensor<1x8xi32>,
      %labels: tensor<1x8xi32>,
      %p0: tensor<256x64xbf16> {parax.param = "model.embed_tokens.weight"},
      %p1: tensor<64xbf16> {parax.param = "model.layers.0.input_layernorm.weight"},
      %p2: tensor<64x64xbf16> {parax.param = "model.layers.0.self_attn.q_proj.weight"},
      %p3: tensor<32x64xbf16> {parax.param = "model.layers.0.self_attn.k_proj.weight"},
      %p4: tensor<32x64xbf16> {parax.param = "model.layers.0.self_attn.v_proj.weight"},
      %p5: tensor<64x64xbf16> {parax.param = "model.layers.0.self_attn.o_proj.weight"},
      %p6: tensor<64xbf16> {parax.param = "model.layers.0.post_attention_layernorm.weight"},
      %p7: tensor<4x64xbf16> {parax.param = "model.layers.0.block_sparse_moe.gate.weight"},
      %p8: tensor<4x96x64xbf16> {parax.param = "model.layers.0.block_sparse_moe.experts.{e}.w1.weight"},
      %p9: tensor<4x96x64xbf16> {parax.param = "model.layers.0.block_sparse_moe.experts.{e}.w3.weight"},
      %p10: tensor<4x64x96xbf16> {parax.param = "model.layers.0.block_sparse_moe.experts.{e}.w2.weight"},
      %p11: tensor<64xbf16> {parax.param = "model.norm.weight"},
      %p12: tensor<256x64xbf16> {parax.param = "lm_head.weight"}) -> tensor<f32> {
    %0 = parax.embedding %tokens, %p0 {parax.layer = -1 : i64} : (tensor<1x8xi32>, tensor<256x64xbf16>) -> tensor<1x8x64xbf16>
    %1 = parax.rms_norm %0, %p1 {eps = 1.0e-05 : f64, parax.layer = 0 : i64} : (tensor<1x8x64xbf16>, tensor<64xbf16>) -> tensor<1x8x64xbf16>
    %2 = parax.linear %1, %p2 {transpose_w, parax.layer = 0 : i64} : (tensor<1x8x64xbf16>, tensor<64x64xbf16>) -> tensor<1x8x64xbf16>
    %3 = parax.linear %1, %p3 {transpose_w, parax.layer = 0 : i64} : (tensor<1x8x64xbf16>, tensor<32x64xbf16>) -> tensor<1x8x32xbf16>
    %4 = parax.linear %1, %p4 {transpose_w, parax.layer = 0 : i64} : (tensor<1x8x64xbf16>, tensor<32x64xbf16>) -> tensor<1x8x32xbf16>
    %5 = parax.reshape %2 {parax.layer = 0 : i64} : (tensor<1x8x64xbf16>) -> tensor<1x8x4x16xbf16>
    %6 = parax.rope %5 {rotary_dim = 16 : i64, theta = 1000000.0 : f64, parax.layer = 0 : i64} : (tensor<1x8x4x16xbf16>) -> tensor<1x8x4x16xbf16>
    %7 = parax.reshape %3 {parax.layer = 0 : i64} : (tensor<1x8x32xbf16>) -> tensor<1x8x2x16xbf16>
    %8 = parax.rope %7 {rotary_dim = 16 : i64, theta = 1000000.0 : f64, parax.layer = 0 : i64} : (tensor<1x8x2x16xbf16>) -> tensor<1x8x2x16xbf16>
    %9 = parax.reshape %4 {parax.layer = 0 : i64} : (tensor<1x8x32xbf16>) -> tensor<1x8x2x16xbf16>
    %10 = parax.attention %6, %8, %9 {causal, head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 0.25 : f64, parax.layer = 0 : i64} : (tensor<1x8x4x16xbf16>, tensor<1x8x2x16xbf16>, tensor<1x8x2x16xbf16>) -> tensor<1x8x4x16xbf16>
    %11 = parax.reshape %10 {parax.layer = 0 : i64} : (tensor<1x8x4x16xbf16>) -> tensor<1x8x64xbf16>
    %12 = parax.linear %11, %p5 {transpose_w, parax.layer = 0 : i64} : (tensor<1x8x64xbf16>, tensor<64x64xbf16>) -> tensor<1x8x64xbf16>
    %13 = parax.add %0, %12 {parax.layer = 0 : i64} : (tensor<1x8x64xbf16>, tensor<1x8x64xbf16>) -> tensor<1x8x64xbf16>
    %14 = parax.rms_norm %13, %p6 {eps = 1.0e-05 : f64, parax.layer = 0 : i64} : (tensor<1x8x64xbf16>, tensor<64xbf16>) -> tensor<1x8x64xbf16>
    %15, %16 = parax.router softmax %14, %p7 {num_experts = 4 : i64, top_k = 2 : i64, normalize, parax.layer = 0 : i64} : (tensor<1x8x64xbf16>, tensor<4x64xbf16>) -> (tensor<1x8x2xbf16>, tensor<1x8x2xi32>)
    %17 = parax.experts %14, %15, %16, %p8, %p9, %p10 {parax.layer = 0 : i64} : (tensor<1x8x64xbf16>, tensor<1x8x2xbf16>, tensor<1x8x2xi32>, tensor<4x96x64xbf16>, tensor<4x96x64xbf16>, tensor<4x64x96xbf16>) -> tensor<1x8x64xbf16>
    %18 = parax.add %13, %17 {parax.layer = 0 : i64} : (tensor<1x8x64xbf16>, tensor<1x8x64xbf16>) -> tensor<1x8x64xbf16>
    %19 = parax.rms_norm %18, %p11 {eps = 1.0e-05 : f64, parax.layer = 1 : i64} : (tensor<1x8x64xbf16>, tensor<64xbf16>) -> tensor<1x8x64xbf16>
    %20 = parax.linear %19, %p12 {transpose_w, parax.layer = 1 : i64} : (tensor<1x8x64xbf16>, tensor<256x64xbf16>) -> tensor<1x8x256xbf16>
    %21 = parax.cross_entropy %20, %labels {parax.layer = 1 : i64} : (tensor<1x8x256xbf16>, tensor<1x8xi32>) -> tensor<f32>
    return %21 : tensor<f32>
  }
}
