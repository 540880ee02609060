// RUN: parax-opt %s -verify-diagnostics --parax-plan="cluster=dgx-h100 profile=megatron-2021 workload=train:batch=8,seq=16,pp=4"

// A six-layer Llama (hidden 64; parax.models.build_model, a training step
// with its loss) pinned to 4 pipeline stages under a stack that gives each
// stage the same number of layers (Megatron-LM: pipeline_even_split): the
// error names the rule and the counts.
// parax model: tmp (llama), 6 layers, batch 8, sequence 16
module {
  // expected-error @+1 {{pp=4 does not divide the model's 6 decoder layers, which the profile's stack (pipeline_even_split) splits evenly}}
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
      %p19: tensor<64xbf16> {parax.param = "model.layers.2.input_layernorm.weight"},
      %p20: tensor<64x64xbf16> {parax.param = "model.layers.2.self_attn.q_proj.weight"},
      %p21: tensor<32x64xbf16> {parax.param = "model.layers.2.self_attn.k_proj.weight"},
      %p22: tensor<32x64xbf16> {parax.param = "model.layers.2.self_attn.v_proj.weight"},
      %p23: tensor<64x64xbf16> {parax.param = "model.layers.2.self_attn.o_proj.weight"},
      %p24: tensor<64xbf16> {parax.param = "model.layers.2.post_attention_layernorm.weight"},
      %p25: tensor<128x64xbf16> {parax.param = "model.layers.2.mlp.gate_proj.weight"},
      %p26: tensor<128x64xbf16> {parax.param = "model.layers.2.mlp.up_proj.weight"},
      %p27: tensor<64x128xbf16> {parax.param = "model.layers.2.mlp.down_proj.weight"},
      %p28: tensor<64xbf16> {parax.param = "model.layers.3.input_layernorm.weight"},
      %p29: tensor<64x64xbf16> {parax.param = "model.layers.3.self_attn.q_proj.weight"},
      %p30: tensor<32x64xbf16> {parax.param = "model.layers.3.self_attn.k_proj.weight"},
      %p31: tensor<32x64xbf16> {parax.param = "model.layers.3.self_attn.v_proj.weight"},
      %p32: tensor<64x64xbf16> {parax.param = "model.layers.3.self_attn.o_proj.weight"},
      %p33: tensor<64xbf16> {parax.param = "model.layers.3.post_attention_layernorm.weight"},
      %p34: tensor<128x64xbf16> {parax.param = "model.layers.3.mlp.gate_proj.weight"},
      %p35: tensor<128x64xbf16> {parax.param = "model.layers.3.mlp.up_proj.weight"},
      %p36: tensor<64x128xbf16> {parax.param = "model.layers.3.mlp.down_proj.weight"},
      %p37: tensor<64xbf16> {parax.param = "model.layers.4.input_layernorm.weight"},
      %p38: tensor<64x64xbf16> {parax.param = "model.layers.4.self_attn.q_proj.weight"},
      %p39: tensor<32x64xbf16> {parax.param = "model.layers.4.self_attn.k_proj.weight"},
      %p40: tensor<32x64xbf16> {parax.param = "model.layers.4.self_attn.v_proj.weight"},
      %p41: tensor<64x64xbf16> {parax.param = "model.layers.4.self_attn.o_proj.weight"},
      %p42: tensor<64xbf16> {parax.param = "model.layers.4.post_attention_layernorm.weight"},
      %p43: tensor<128x64xbf16> {parax.param = "model.layers.4.mlp.gate_proj.weight"},
      %p44: tensor<128x64xbf16> {parax.param = "model.layers.4.mlp.up_proj.weight"},
      %p45: tensor<64x128xbf16> {parax.param = "model.layers.4.mlp.down_proj.weight"},
      %p46: tensor<64xbf16> {parax.param = "model.layers.5.input_layernorm.weight"},
      %p47: tensor<64x64xbf16> {parax.param = "model.layers.5.self_attn.q_proj.weight"},
      %p48: tensor<32x64xbf16> {parax.param = "model.layers.5.self_attn.k_proj.weight"},
      %p49: tensor<32x64xbf16> {parax.param = "model.layers.5.self_attn.v_proj.weight"},
      %p50: tensor<64x64xbf16> {parax.param = "model.layers.5.self_attn.o_proj.weight"},
      %p51: tensor<64xbf16> {parax.param = "model.layers.5.post_attention_layernorm.weight"},
      %p52: tensor<128x64xbf16> {parax.param = "model.layers.5.mlp.gate_proj.weight"},
      %p53: tensor<128x64xbf16> {parax.param = "model.layers.5.mlp.up_proj.weight"},
      %p54: tensor<64x128xbf16> {parax.param = "model.layers.5.mlp.down_proj.weight"},
      %p55: tensor<64xbf16> {parax.param = "model.norm.weight"},
      %p56: tensor<128x64xbf16> {parax.param = "lm_head.weight"}) -> tensor<f32> {
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
    %40 = parax.linear %39, %p20 {transpose_w, parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %41 = parax.linear %39, %p21 {transpose_w, parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %42 = parax.linear %39, %p22 {transpose_w, parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %43 = parax.reshape %40 {parax.layer = 2 : i64} : (tensor<8x16x64xbf16>) -> tensor<8x16x4x16xbf16>
    %44 = parax.reshape %41 {parax.layer = 2 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %45 = parax.rope %43 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 2 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x4x16xbf16>
    %46 = parax.rope %44 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 2 : i64} : (tensor<8x16x2x16xbf16>) -> tensor<8x16x2x16xbf16>
    %47 = parax.reshape %42 {parax.layer = 2 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %48 = parax.attention %45, %46, %47 {causal, head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 0.25 : f64, parax.layer = 2 : i64} : (tensor<8x16x4x16xbf16>, tensor<8x16x2x16xbf16>, tensor<8x16x2x16xbf16>) -> tensor<8x16x4x16xbf16>
    %49 = parax.reshape %48 {parax.layer = 2 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x64xbf16>
    %50 = parax.linear %49, %p23 {transpose_w, parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %51 = parax.add %38, %50 {parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %52 = parax.rms_norm %51, %p24 {eps = 1.0e-05 : f64, parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %53 = parax.linear %52, %p25 {transpose_w, parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %54 = parax.linear %52, %p26 {transpose_w, parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %55 = parax.swiglu %53, %54 {parax.layer = 2 : i64} : (tensor<8x16x128xbf16>, tensor<8x16x128xbf16>) -> tensor<8x16x128xbf16>
    %56 = parax.linear %55, %p27 {transpose_w, parax.layer = 2 : i64} : (tensor<8x16x128xbf16>, tensor<64x128xbf16>) -> tensor<8x16x64xbf16>
    %57 = parax.add %51, %56 {parax.layer = 2 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %58 = parax.rms_norm %57, %p28 {eps = 1.0e-05 : f64, parax.layer = 3 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %59 = parax.linear %58, %p29 {transpose_w, parax.layer = 3 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %60 = parax.linear %58, %p30 {transpose_w, parax.layer = 3 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %61 = parax.linear %58, %p31 {transpose_w, parax.layer = 3 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %62 = parax.reshape %59 {parax.layer = 3 : i64} : (tensor<8x16x64xbf16>) -> tensor<8x16x4x16xbf16>
    %63 = parax.reshape %60 {parax.layer = 3 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %64 = parax.rope %62 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 3 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x4x16xbf16>
    %65 = parax.rope %63 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 3 : i64} : (tensor<8x16x2x16xbf16>) -> tensor<8x16x2x16xbf16>
    %66 = parax.reshape %61 {parax.layer = 3 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %67 = parax.attention %64, %65, %66 {causal, head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 0.25 : f64, parax.layer = 3 : i64} : (tensor<8x16x4x16xbf16>, tensor<8x16x2x16xbf16>, tensor<8x16x2x16xbf16>) -> tensor<8x16x4x16xbf16>
    %68 = parax.reshape %67 {parax.layer = 3 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x64xbf16>
    %69 = parax.linear %68, %p32 {transpose_w, parax.layer = 3 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %70 = parax.add %57, %69 {parax.layer = 3 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %71 = parax.rms_norm %70, %p33 {eps = 1.0e-05 : f64, parax.layer = 3 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %72 = parax.linear %71, %p34 {transpose_w, parax.layer = 3 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %73 = parax.linear %71, %p35 {transpose_w, parax.layer = 3 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %74 = parax.swiglu %72, %73 {parax.layer = 3 : i64} : (tensor<8x16x128xbf16>, tensor<8x16x128xbf16>) -> tensor<8x16x128xbf16>
    %75 = parax.linear %74, %p36 {transpose_w, parax.layer = 3 : i64} : (tensor<8x16x128xbf16>, tensor<64x128xbf16>) -> tensor<8x16x64xbf16>
    %76 = parax.add %70, %75 {parax.layer = 3 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %77 = parax.rms_norm %76, %p37 {eps = 1.0e-05 : f64, parax.layer = 4 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %78 = parax.linear %77, %p38 {transpose_w, parax.layer = 4 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %79 = parax.linear %77, %p39 {transpose_w, parax.layer = 4 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %80 = parax.linear %77, %p40 {transpose_w, parax.layer = 4 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %81 = parax.reshape %78 {parax.layer = 4 : i64} : (tensor<8x16x64xbf16>) -> tensor<8x16x4x16xbf16>
    %82 = parax.reshape %79 {parax.layer = 4 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %83 = parax.rope %81 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 4 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x4x16xbf16>
    %84 = parax.rope %82 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 4 : i64} : (tensor<8x16x2x16xbf16>) -> tensor<8x16x2x16xbf16>
    %85 = parax.reshape %80 {parax.layer = 4 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %86 = parax.attention %83, %84, %85 {causal, head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 0.25 : f64, parax.layer = 4 : i64} : (tensor<8x16x4x16xbf16>, tensor<8x16x2x16xbf16>, tensor<8x16x2x16xbf16>) -> tensor<8x16x4x16xbf16>
    %87 = parax.reshape %86 {parax.layer = 4 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x64xbf16>
    %88 = parax.linear %87, %p41 {transpose_w, parax.layer = 4 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %89 = parax.add %76, %88 {parax.layer = 4 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %90 = parax.rms_norm %89, %p42 {eps = 1.0e-05 : f64, parax.layer = 4 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %91 = parax.linear %90, %p43 {transpose_w, parax.layer = 4 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %92 = parax.linear %90, %p44 {transpose_w, parax.layer = 4 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %93 = parax.swiglu %91, %92 {parax.layer = 4 : i64} : (tensor<8x16x128xbf16>, tensor<8x16x128xbf16>) -> tensor<8x16x128xbf16>
    %94 = parax.linear %93, %p45 {transpose_w, parax.layer = 4 : i64} : (tensor<8x16x128xbf16>, tensor<64x128xbf16>) -> tensor<8x16x64xbf16>
    %95 = parax.add %89, %94 {parax.layer = 4 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %96 = parax.rms_norm %95, %p46 {eps = 1.0e-05 : f64, parax.layer = 5 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %97 = parax.linear %96, %p47 {transpose_w, parax.layer = 5 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %98 = parax.linear %96, %p48 {transpose_w, parax.layer = 5 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %99 = parax.linear %96, %p49 {transpose_w, parax.layer = 5 : i64} : (tensor<8x16x64xbf16>, tensor<32x64xbf16>) -> tensor<8x16x32xbf16>
    %100 = parax.reshape %97 {parax.layer = 5 : i64} : (tensor<8x16x64xbf16>) -> tensor<8x16x4x16xbf16>
    %101 = parax.reshape %98 {parax.layer = 5 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %102 = parax.rope %100 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 5 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x4x16xbf16>
    %103 = parax.rope %101 {rotary_dim = 16 : i64, theta = 10000.0 : f64, parax.layer = 5 : i64} : (tensor<8x16x2x16xbf16>) -> tensor<8x16x2x16xbf16>
    %104 = parax.reshape %99 {parax.layer = 5 : i64} : (tensor<8x16x32xbf16>) -> tensor<8x16x2x16xbf16>
    %105 = parax.attention %102, %103, %104 {causal, head_dim = 16 : i64, num_heads = 4 : i64, num_kv_heads = 2 : i64, scale = 0.25 : f64, parax.layer = 5 : i64} : (tensor<8x16x4x16xbf16>, tensor<8x16x2x16xbf16>, tensor<8x16x2x16xbf16>) -> tensor<8x16x4x16xbf16>
    %106 = parax.reshape %105 {parax.layer = 5 : i64} : (tensor<8x16x4x16xbf16>) -> tensor<8x16x64xbf16>
    %107 = parax.linear %106, %p50 {transpose_w, parax.layer = 5 : i64} : (tensor<8x16x64xbf16>, tensor<64x64xbf16>) -> tensor<8x16x64xbf16>
    %108 = parax.add %95, %107 {parax.layer = 5 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %109 = parax.rms_norm %108, %p51 {eps = 1.0e-05 : f64, parax.layer = 5 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %110 = parax.linear %109, %p52 {transpose_w, parax.layer = 5 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %111 = parax.linear %109, %p53 {transpose_w, parax.layer = 5 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %112 = parax.swiglu %110, %111 {parax.layer = 5 : i64} : (tensor<8x16x128xbf16>, tensor<8x16x128xbf16>) -> tensor<8x16x128xbf16>
    %113 = parax.linear %112, %p54 {transpose_w, parax.layer = 5 : i64} : (tensor<8x16x128xbf16>, tensor<64x128xbf16>) -> tensor<8x16x64xbf16>
    %114 = parax.add %108, %113 {parax.layer = 5 : i64} : (tensor<8x16x64xbf16>, tensor<8x16x64xbf16>) -> tensor<8x16x64xbf16>
    %115 = parax.rms_norm %114, %p55 {eps = 1.0e-05 : f64, parax.layer = 6 : i64} : (tensor<8x16x64xbf16>, tensor<64xbf16>) -> tensor<8x16x64xbf16>
    %116 = parax.linear %115, %p56 {transpose_w, parax.layer = 6 : i64} : (tensor<8x16x64xbf16>, tensor<128x64xbf16>) -> tensor<8x16x128xbf16>
    %117 = parax.cross_entropy %116, %labels {parax.layer = 6 : i64} : (tensor<8x16x128xbf16>, tensor<8x16xi32>) -> tensor<f32>
    return %117 : tensor<f32>
  }
}
