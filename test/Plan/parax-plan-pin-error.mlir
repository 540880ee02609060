// RUN: parax-opt %s -verify-diagnostics --parax-plan="cluster=dgx-h100 workload=train:batch=8,seq=16,tp=16"
// RUN: not parax-opt %s --parax-plan="cluster=dgx-h100 workload=train:batch=8,seq=16,ep=2" 2>&1 | FileCheck %s --check-prefix=EP
// RUN: not parax-opt %s --parax-plan="cluster=dgx-h100 workload=train:batch=8,seq=16,dp=3" 2>&1 | FileCheck %s --check-prefix=DP
// RUN: not parax-opt %s --parax-plan="cluster=dgx-h100 workload=prefill:batch=2,seq=16,dp=4" 2>&1 | FileCheck %s --check-prefix=INFER

// EP: ep=2: the model has no routed experts
// DP: the pinned degrees' product (3) does not divide the 8 devices; the batch (8) does not divide into dp x ep = 3 replicas
// INFER: the batch (2) is smaller than dp x ep = 4 replicas

// A two-layer Llama (hidden 64; parax.models.build_model, a training step
// with its loss) with pinned degrees no plan can take: after the generic
// rules, the explanation names the pin that broke them.
// parax model: tmp (llama), 2 layers, batch 8, sequence 16
module {
  // expected-error @+1 {{tp=16 does not divide a node's 8 devices}}
  func.func @forward(
      %tokens: tensor<8x16xi32>,
      %labels: tensor<8x16xi32>,
      %p0: tensor<128x64xbf16> {parax.param = "model.embed_tokens.weight"},
      %p1: tensor<64xbf16> {parax.param = "model.layers.0.input_layernorm.weight"},
      %p2: tensor<64x64xbf16> {parax.param = "model.layers.0.self_attn.q_proj.weight"},
      %p3: tensor<32x64xbf16> {parax.param = "model.layers.0.self_attn.k_proj.weight"},
      %p4: tensor<32x64xbf16> {parax.param = "model.layers.0.self_attn.v_proj.weight"},
      %p5: tensor<64x64xbf16> {parax.param = "model.layers.0.self_attn.o_proj.weight"},
      %p6: tensor<64xbf16> {parax.param = "model.layers.0.post_attention_layernorm.weight"},
      %p7: tensor<128x64xbf16> {parax.param = "model.layers.0.mlp.gate_proj.weight"},
      %p8: tensor<128x64xbf16> {parax.param = "model.layers.0.mlp.up_proj.weight"},
      %p9: tensor<64x128xbf16> {parax.param = "model.layers.0.mlp.down_proj.weight"},
      %p10: tensor<64xbf16> {parax.param = "model.layers.1.input_layernorm.weight"},
      %p11: tensor<64x64xbf16> {parax.param = "model.layers.1.self_attn.q_proj.weight"},
      %p12: tensor<32x64xbf16> {parax.param = "model.layers.1.self_attn.k_proj.weight"},
      %p13: tensor<32x64xbf16> {parax.param = "model.layers.1.self_attn.v_proj.weight"},
      %p14: tensor<64x64xbf16> {parax.param = "model.layers.1.self_attn.o_proj.weight"},
      %p15: tensor<64xbf16> {parax.param = "model.layers.1.post_attention_layernorm.weight"},
      %p16: tensor<128x64xbf16> {parax.param = "model.layers.1.mlp.gate_proj.weight"},
      %p17: tensor<128x64xbf16> {parax.param = "model.layers.1.mlp.up_proj.weight"},
      %p18: tensor<64x128xbf16> {parax.param = "model.layers.1.mlp.down_proj.weight"},
      %p19: tensor<64xbf16> {parax.param = "model.norm.weight"},
      %p20: tensor<128x64xbf16> {parax.param = "lm_head.weight"}) -> tensor<f32> {
    %0 = parax.embedding %tokens, %p0 {parax.layer = -1 : i64} : (tensor<8x16xi32>, tensor<128x64xbf16>) -> tensor<8x16x64xbf16>
    %1 = parax.rms_norm %0, %p1 {eps = 1.0e-05 : f64, parax.layer = 0 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %2 = parax.linear %1, %p2 {transpose_w, parax.layer = 0 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %3 = parax.linear %1, %p3 {transpose_w, parax.layer = 0 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %4 = parax.linear %1, %p4 {transpose_w, parax.layer = 0 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %5 = parax.reshape %2 {parax.layer = 0 : i64} : (tensor<8x16x64xbf16>) -> tensor<8x16x4x16xbf16>
    %6 = parax.reshape %3 {parax.layer = 0 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %7 = parax.rope %5 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 0 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x4x16xbf16>
    %8 = parax.rope %6 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 0 : i64} : (tensor<8x16x2x16xbf16>) -> tensor<8x16x2x16xbf16>
    %9 = parax.reshape %4 {parax.layer = 0 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %10 = parax.attention %7, %8, %9 {causal, head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 0.25 : f64, parax.layer = 0 : i64} : (tensor<8x16x4x16xbf16>, tensor<8x16x2x16xbf16>, tensor<8x16x2x16xbf16>) -> tensor<8x16x4x16xbf16>
    %11 = parax.reshape %10 {parax.layer = 0 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x64xbf16>
    %12 = parax.linear %11, %p5 {transpose_w, parax.layer = 0 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %13 = parax.add %0, %12 {parax.layer = 0 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %14 = parax.rms_norm %13, %p6 {eps = 1.0e-05 : f64, parax.layer = 0 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %15 = parax.linear %14, %p7 {transpose_w, parax.layer = 0 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %16 = parax.linear %14, %p8 {transpose_w, parax.layer = 0 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %17 = parax.swiglu %15, %16 {parax.layer = 0 : i64} : (tensor<8x16x128xbf16>, tensor<8x16x128xbf16>) -> tensor<8x16x128xbf16>
    %18 = parax.linear %17, %p9 {transpose_w, parax.layer = 0 : i64} : (tensor<8x16x128xbf16>, tensor<64x128xbf16>) -> tensor<8x16x64xbf16>
    %19 = parax.add %13, %18 {parax.layer = 0 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %20 = parax.rms_norm %19, %p10 {eps = 1.0e-05 : f64, parax.layer = 1 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %21 = parax.linear %20, %p11 {transpose_w, parax.layer = 1 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %22 = parax.linear %20, %p12 {transpose_w, parax.layer = 1 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %23 = parax.linear %20, %p13 {transpose_w, parax.layer = 1 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %24 = parax.reshape %21 {parax.layer = 1 : i64} : (tensor<8x16x64xbf16>) -> tensor<8x16x4x16xbf16>
    %25 = parax.reshape %22 {parax.layer = 1 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %26 = parax.rope %24 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 1 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x4x16xbf16>
    %27 = parax.rope %25 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 1 : i64} : (tensor<8x16x2x16xbf16>) -> tensor<8x16x2x16xbf16>
    %28 = parax.reshape %23 {parax.layer = 1 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %29 = parax.attention %26, %27, %28 {causal, head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 0.25 : f64, parax.layer = 1 : i64} : (tensor<8x16x4x16xbf16>, tensor<8x16x2x16xbf16>, tensor<8x16x2x16xbf16>) -> tensor<8x16x4x16xbf16>
    %30 = parax.reshape %29 {parax.layer = 1 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x64xbf16>
    %31 = parax.linear %30, %p14 {transpose_w, parax.layer = 1 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %32 = parax.add %19, %31 {parax.layer = 1 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %33 = parax.rms_norm %32, %p15 {eps = 1.0e-05 : f64, parax.layer = 1 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %34 = parax.linear %33, %p16 {transpose_w, parax.layer = 1 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %35 = parax.linear %33, %p17 {transpose_w, parax.layer = 1 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %36 = parax.swiglu %34, %35 {parax.layer = 1 : i64} : (tensor<8x16x128xbf16>, tensor<8x16x128xbf16>) -> tensor<8x16x128xbf16>
    %37 = parax.linear %36, %p18 {transpose_w, parax.layer = 1 : i64} : (tensor<8x16x128xbf16>, tensor<64x128xbf16>) -> tensor<8x16x64xbf16>
    %38 = parax.add %32, %37 {parax.layer = 1 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %39 = parax.rms_norm %38, %p19 {eps = 1.0e-05 : f64, parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %40 = parax.linear %39, %p20 {transpose_w, parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %41 = parax.cross_entropy %40, %labels {parax.layer = 2 : i64} : (tensor<8x16x128xbf16>, tensor<8x16xi32>) -> tensor<f32>
    return %41 : tensor<f32>
  }
}
