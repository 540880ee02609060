// RUN: parax-opt %s -split-input-file -verify-diagnostics

// Every op verifier rule (C1, C2, ... of the op's description) rejects what it
// should, with an error located at the op.

func.func @negative_embedding_table_rank(%ids: tensor<2xi32>, %t: tensor<4xf32>) {
  // expected-error @+1 {{C1: table must have rank 2}}
  %0 = parax.embedding %ids, %t : (tensor<2xi32>, tensor<4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_embedding_result_shape(%ids: tensor<2xi32>, %t: tensor<8x4xf32>) {
  // expected-error @+1 {{C2: result shape must be the ids shape + [4]}}
  %0 = parax.embedding %ids, %t : (tensor<2xi32>, tensor<8x4xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @negative_embedding_element_type(%ids: tensor<2xi32>, %t: tensor<8x4xf32>) {
  // expected-error @+1 {{C3: result element type must match the table's}}
  %0 = parax.embedding %ids, %t : (tensor<2xi32>, tensor<8x4xf32>) -> tensor<2x4xbf16>
  return
}

// -----

func.func @negative_embedding_float_ids(%ids: tensor<2xf32>, %t: tensor<8x4xf32>) {
  // expected-error @+1 {{operand #0 must be statically shaped tensor of 32-bit signless integer or 64-bit signless integer values}}
  %0 = parax.embedding %ids, %t : (tensor<2xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_dynamic_shape(%x: tensor<?x64xf32>, %w: tensor<64x64xf32>) {
  // expected-error @+1 {{operand #0 must be statically shaped tensor of floating-point values}}
  %0 = parax.linear %x, %w : (tensor<?x64xf32>, tensor<64x64xf32>) -> tensor<?x64xf32>
  return
}

// -----

func.func @negative_position_embedding_shape(%t: tensor<8x4xf32>) {
  // expected-error @+1 {{C1: expected a [P, H] table and a [1, S, H] result}}
  %0 = parax.position_embedding %t : (tensor<8x4xf32>) -> tensor<2x4x4xf32>
  return
}

// -----

func.func @negative_position_embedding_range(%t: tensor<8x4xf32>) {
  // expected-error @+1 {{C2: positions 6 .. 9 exceed the table's 8 rows}}
  %0 = parax.position_embedding %t {offset = 6} : (tensor<8x4xf32>) -> tensor<1x4x4xf32>
  return
}

// -----

func.func @negative_linear_weight_rank(%x: tensor<2x4xf32>, %w: tensor<4xf32>) {
  // expected-error @+1 {{C1: x needs rank >= 1 and the weight rank 2}}
  %0 = parax.linear %x, %w : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_linear_in_features(%x: tensor<2x4xf32>, %w: tensor<8x4xf32>) {
  // [8, 4] is [in, out] without transpose_w: in = 8 does not match x's 4.
  // expected-error @+1 {{C2: x's last dimension (4) must equal the weight's in features (8, weight is [in, out])}}
  %0 = parax.linear %x, %w : (tensor<2x4xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_linear_bias(%x: tensor<2x4xf32>, %w: tensor<4x8xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{C3: bias must be [8]}}
  %0 = parax.linear %x, %w, %b : (tensor<2x4xf32>, tensor<4x8xf32>, tensor<4xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @negative_linear_result(%x: tensor<2x4xf32>, %w: tensor<8x4xf32>) {
  // expected-error @+1 {{C4: result shape must be x's with the last dimension 8}}
  %0 = parax.linear %x, %w {transpose_w} : (tensor<2x4xf32>, tensor<8x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_linear_element_types(%x: tensor<2x4xf32>, %w: tensor<4x8xbf16>) {
  // expected-error @+1 {{C5: operands and result must share one element type}}
  %0 = parax.linear %x, %w : (tensor<2x4xf32>, tensor<4x8xbf16>) -> tensor<2x8xf32>
  return
}

// -----

func.func @negative_head_linear_weight_rank(%x: tensor<2x4x8xf32>, %w: tensor<8x16xf32>) {
  // expected-error @+1 {{C1: x needs rank >= 2 and the weight rank 3}}
  %0 = parax.head_linear %x, %w : (tensor<2x4x8xf32>, tensor<8x16xf32>) -> tensor<2x4x16xf32>
  return
}

// -----

func.func @negative_head_linear_heads(%x: tensor<2x4x8xf32>, %w: tensor<2x8x16xf32>) {
  // expected-error @+1 {{C3: x's 4 heads (its dimension -2) need one weight each, the weight has 2}}
  %0 = parax.head_linear %x, %w : (tensor<2x4x8xf32>, tensor<2x8x16xf32>) -> tensor<2x4x16xf32>
  return
}

// -----

func.func @negative_head_linear_in_features(%x: tensor<2x4x8xf32>, %w: tensor<4x8x16xf32>) {
  // [4, 8, 16] with transpose_w is [G, out, in]: in = 16 does not match x's 8.
  // expected-error @+1 {{C2: x's last dimension (8) must equal the weight's in features (16, weight is [G, out, in])}}
  %0 = parax.head_linear %x, %w {transpose_w} : (tensor<2x4x8xf32>, tensor<4x8x16xf32>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @negative_head_linear_result(%x: tensor<2x4x8xf32>, %w: tensor<4x8x16xf32>) {
  // expected-error @+1 {{C4: result shape must be x's with the last dimension 16}}
  %0 = parax.head_linear %x, %w : (tensor<2x4x8xf32>, tensor<4x8x16xf32>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @negative_head_linear_element_types(%x: tensor<2x4x8xf32>, %w: tensor<4x8x16xbf16>) {
  // expected-error @+1 {{C5: operands and result must share one element type}}
  %0 = parax.head_linear %x, %w : (tensor<2x4x8xf32>, tensor<4x8x16xbf16>) -> tensor<2x4x16xf32>
  return
}

// -----

func.func @negative_embedding_scale(%ids: tensor<2xi32>, %t: tensor<8x4xf32>) {
  // expected-error @+1 {{C5: scale must be finite and positive, got -2}}
  %0 = parax.embedding %ids, %t {scale = -2.0 : f64} : (tensor<2xi32>, tensor<8x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_embedding_grad_scale(%ids: tensor<2xi32>, %dy: tensor<2x4xf32>) {
  // expected-error @+1 {{C3: scale must be finite and positive, got 0}}
  %0 = parax.embedding_grad %ids, %dy {scale = 0.0 : f64} : (tensor<2xi32>, tensor<2x4xf32>) -> tensor<8x4xf32>
  return
}

// -----

func.func @negative_rms_norm_offset(%x: tensor<2x4xf32>, %w: tensor<4xf32>) {
  // expected-error @+1 {{C4: offset must be finite}}
  %0 = parax.rms_norm %x, %w {eps = 1.0e-05 : f64, offset = 0x7FF0000000000000 : f64} : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_rms_norm_grad_offset(%x: tensor<2x4xf32>, %w: tensor<4xf32>) {
  // expected-error @+1 {{C4: offset must be finite}}
  %0 = parax.rms_norm_grad %x, %w, %x {eps = 1.0e-05 : f64, offset = 0x7FF8000000000000 : f64} : (tensor<2x4xf32>, tensor<4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_rms_norm_weight(%x: tensor<2x4xf32>, %w: tensor<8xf32>) {
  // expected-error @+1 {{C1: norm parameters must be [4]}}
  %0 = parax.rms_norm %x, %w {eps = 1.0e-5 : f64} : (tensor<2x4xf32>, tensor<8xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_rms_norm_result(%x: tensor<2x4xf32>, %w: tensor<4xf32>) {
  // expected-error @+1 {{C2: result type must equal x's type}}
  %0 = parax.rms_norm %x, %w {eps = 1.0e-5 : f64} : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xbf16>
  return
}

// -----

func.func @negative_rms_norm_eps(%x: tensor<2x4xf32>, %w: tensor<4xf32>) {
  // expected-error @+1 {{C3: eps must be positive}}
  %0 = parax.rms_norm %x, %w {eps = 0.0 : f64} : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_layer_norm_bias(%x: tensor<2x4xf32>, %w: tensor<4xf32>, %b: tensor<2xf32>) {
  // expected-error @+1 {{C1: norm parameters must be [4]}}
  %0 = parax.layer_norm %x, %w, %b {eps = 1.0e-5 : f64} : (tensor<2x4xf32>, tensor<4xf32>, tensor<2xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_rope_rank(%x: tensor<2x4x8xf32>) {
  // expected-error @+1 {{C1: x must be [B, S, heads, head_dim] and the result of the same type}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 8} : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  return
}

// -----

func.func @negative_rope_theta(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C2: theta must be positive}}
  %0 = parax.rope %x {theta = -1.0 : f64, rotary_dim = 8} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_rope_odd_rotary_dim(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C3: rotary_dim must be positive, even and at most head_dim (8), got 5}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 5} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_rope_rotary_dim_too_large(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C3: rotary_dim must be positive, even and at most head_dim (8), got 16}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 16} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_rope_offset(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C4: position_offset must be >= 0}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 8, position_offset = -3} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_rope_scaling_type(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C5: scaling needs rope_type = "llama3", "yarn", "linear" or "longrope"}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 8, scaling = {rope_type = "ntk", factor = 2.0 : f64}} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_rope_scaling_factor(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C5: scaling needs a float 'factor'}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 8, scaling = {rope_type = "llama3"}} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_rope_yarn_fields(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C5: yarn scaling needs a float 'beta_fast'}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 8, scaling = {rope_type = "yarn", factor = 4.0 : f64, original_max_position_embeddings = 64 : i64}} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_rope_longrope_factors(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C5: longrope scaling needs 'ext_factors', an array<f64> of 4 factors (one a pair of rotated channels)}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 8, scaling = {rope_type = "longrope", factor = 4.0 : f64, ext_factors = array<f64: 1.0, 2.0, 3.0>}} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_rope_longrope_factor_value(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C5: longrope scaling's ext_factors must be finite and positive, got 0}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 8, scaling = {rope_type = "longrope", factor = 4.0 : f64, ext_factors = array<f64: 1.0, 2.0, 0.0, 4.0>}} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_rope_attention_factor(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C5: scaling's 'attention_factor' must be a finite positive float}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 4, scaling = {rope_type = "longrope", factor = 4.0 : f64, ext_factors = array<f64: 1.0, 2.0>, attention_factor = -1.5 : f64}} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_rope_llama3_original(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C5: llama3 scaling needs a positive integer 'original_max_position_embeddings'}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 8, scaling = {rope_type = "llama3", factor = 8.0 : f64, low_freq_factor = 1.0 : f64, high_freq_factor = 4.0 : f64, original_max_position_embeddings = 8.0e3 : f64}} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_attention_softcap(%q: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C12: softcap must be finite and positive}}
  %0 = parax.attention %q, %q, %q {causal, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64, softcap = -1.0 : f64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_softcap(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{C2: cap must be finite and positive}}
  %0 = parax.softcap %x {cap = 0.0 : f64} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_softcap_grad(%x: tensor<2x4xf32>) {
  // expected-error @+1 {{C2: cap must be finite and positive}}
  %0 = parax.softcap_grad %x, %x {cap = 0x7FF0000000000000 : f64} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_attention_window(%q: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C11: a window must be positive and come with causal}}
  %0 = parax.attention %q, %q, %q {num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64, window = 2} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_attention_rank(%q: tensor<1x4x8xf32>, %k: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C1: q, k, v and the result must have rank 4}}
  %0 = parax.attention %q, %k, %k {num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64} : (tensor<1x4x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_attention_heads(%q: tensor<1x4x4x8xf32>, %k: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C2: q must have 2 heads of 8, got [4, 8]}}
  %0 = parax.attention %q, %k, %k {num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64} : (tensor<1x4x4x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_attention_kv_heads(%q: tensor<1x4x4x8xf32>, %k: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C2: k must have 1 heads of 8, got [2, 8]}}
  %0 = parax.attention %q, %k, %k {num_heads = 4, num_kv_heads = 1, head_dim = 8, scale = 0.35 : f64} : (tensor<1x4x4x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x4x8xf32>
  return
}

// -----

func.func @negative_attention_gqa_ratio(%q: tensor<1x4x4x8xf32>, %k: tensor<1x4x3x8xf32>) {
  // expected-error @+1 {{C3: num_kv_heads (3) must divide num_heads (4)}}
  %0 = parax.attention %q, %k, %k {num_heads = 4, num_kv_heads = 3, head_dim = 8, scale = 0.35 : f64} : (tensor<1x4x4x8xf32>, tensor<1x4x3x8xf32>, tensor<1x4x3x8xf32>) -> tensor<1x4x4x8xf32>
  return
}

// -----

func.func @negative_attention_kv_lengths(%q: tensor<1x4x2x8xf32>, %k: tensor<1x4x2x8xf32>, %v: tensor<1x6x2x8xf32>) {
  // expected-error @+1 {{C4: batch sizes must agree and k, v must share a sequence length}}
  %0 = parax.attention %q, %k, %v {num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x6x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_attention_result(%q: tensor<1x4x2x8xf32>, %k: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C4: result must be [B, S, num_heads, Dv] of q's element type}}
  %0 = parax.attention %q, %k, %k {num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x1x16xf32>
  return
}

// -----

func.func @negative_attention_scale(%q: tensor<1x4x2x8xf32>, %k: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C5: scale must be positive}}
  %0 = parax.attention %q, %k, %k {num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.0 : f64} : (tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_attention_causal_fewer_keys(%q: tensor<1x4x2x8xf32>, %k: tensor<1x2x2x8xf32>) {
  // expected-error @+1 {{C6: causal attention needs at least as many keys as queries}}
  %0 = parax.attention %q, %k, %k {causal, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64} : (tensor<1x4x2x8xf32>, tensor<1x2x2x8xf32>, tensor<1x2x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_add_ranks(%a: tensor<2x4xf32>, %b: tensor<4xf32>) {
  // expected-error @+1 {{C1: operands must have equal ranks and element types}}
  %0 = parax.add %a, %b : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_mul_broadcast(%a: tensor<2x4xf32>, %b: tensor<2x3xf32>) {
  // expected-error @+1 {{C2: dimensions 4 and 3 do not broadcast}}
  %0 = parax.mul %a, %b : (tensor<2x4xf32>, tensor<2x3xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_add_result(%a: tensor<2x4xf32>, %b: tensor<1x4xf32>) {
  // expected-error @+1 {{C3: result must have the broadcast shape}}
  %0 = parax.add %a, %b : (tensor<2x4xf32>, tensor<1x4xf32>) -> tensor<1x4xf32>
  return
}

// -----

func.func @negative_silu_type(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{C1: operands and result must have one type}}
  %0 = parax.silu %a : (tensor<2x4xf32>) -> tensor<2x4xbf16>
  return
}

// -----

func.func @negative_sigmoid_type(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{C1: operands and result must have one type}}
  %0 = parax.sigmoid %a : (tensor<2x4xf32>) -> tensor<4x2xf32>
  return
}

// -----

func.func @negative_gelu_type(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{C1: operands and result must have one type}}
  %0 = parax.gelu tanh %a : (tensor<2x4xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @negative_gelu_approximation(%a: tensor<2x4xf32>) {
  // expected-error @+2 {{expected ::parax::GeluApprox to be one of: none, tanh}}
  // expected-error @+1 {{failed to parse Parax_GeluApproxAttr}}
  %0 = parax.gelu erf %a : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_swiglu_types(%a: tensor<2x4xf32>, %b: tensor<2x8xf32>) {
  // expected-error @+1 {{C1: operands and result must have one type}}
  %0 = parax.swiglu %a, %b : (tensor<2x4xf32>, tensor<2x8xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_reshape_count(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{C1: reshape must keep the element count (8 vs 9) and the element type}}
  %0 = parax.reshape %a : (tensor<2x4xf32>) -> tensor<3x3xf32>
  return
}

// -----

func.func @negative_transpose_permutation(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{C1: permutation is not a permutation of 0 .. 1}}
  %0 = parax.transpose %a {permutation = array<i64: 1, 1>} : (tensor<2x4xf32>) -> tensor<4x2xf32>
  return
}

// -----

func.func @negative_transpose_result(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{C2: result shape does not follow the permutation}}
  %0 = parax.transpose %a {permutation = array<i64: 1, 0>} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_slice_dim(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{C1: dim must be in [0, 2)}}
  %0 = parax.slice %a {dim = 2, start = 0} : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_slice_other_dims(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{C2: result must equal x outside dimension 1}}
  %0 = parax.slice %a {dim = 1, start = 0} : (tensor<2x4xf32>) -> tensor<1x2xf32>
  return
}

// -----

func.func @negative_slice_range(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{C3: slice [3, 5) lies outside dimension 1 of size 4}}
  %0 = parax.slice %a {dim = 1, start = 3} : (tensor<2x4xf32>) -> tensor<2x2xf32>
  return
}

// -----

func.func @negative_concat_empty() {
  // expected-error @+1 {{C1: needs at least one input}}
  %0 = parax.concat {dim = 0} : () -> tensor<2xf32>
  return
}

// -----

func.func @negative_concat_mismatch(%a: tensor<2x4xf32>, %b: tensor<3x4xf32>) {
  // expected-error @+1 {{C2: inputs must agree outside dimension 1}}
  %0 = parax.concat %a, %b {dim = 1} : (tensor<2x4xf32>, tensor<3x4xf32>) -> tensor<2x8xf32>
  return
}

// -----

func.func @negative_concat_result(%a: tensor<2x4xf32>, %b: tensor<2x4xf32>) {
  // expected-error @+1 {{C2: result extent along dimension 1 must be 8}}
  %0 = parax.concat %a, %b {dim = 1} : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x6xf32>
  return
}

// -----

func.func @negative_broadcast(%a: tensor<2x4xf32>) {
  // expected-error @+1 {{C1: dimension of size 2 cannot broadcast to 3}}
  %0 = parax.broadcast %a : (tensor<2x4xf32>) -> tensor<3x4xf32>
  return
}

// -----

func.func @negative_router_gate(%x: tensor<4x8xf32>, %g: tensor<8x4xf32>) {
  // The gate is [num_experts, H] (checkpoint layout), not [H, E].
  // expected-error @+1 {{C1: gate must be [num_experts, H] = [4, 8]}}
  %w, %i = parax.router softmax %x, %g {num_experts = 4, top_k = 2} : (tensor<4x8xf32>, tensor<8x4xf32>) -> (tensor<4x2xf32>, tensor<4x2xi32>)
  return
}

// -----

func.func @negative_router_bias(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>, %b: tensor<8xf32>) {
  // expected-error @+1 {{C1: bias must be [4]}}
  %w, %i = parax.router sigmoid %x, %g, %b {num_experts = 4, top_k = 2} : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x2xf32>, tensor<4x2xi32>)
  return
}

// -----

func.func @negative_router_top_k(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>) {
  // expected-error @+1 {{C2: top_k must be in [1, num_experts], got 5}}
  %w, %i = parax.router softmax %x, %g {num_experts = 4, top_k = 5} : (tensor<4x8xf32>, tensor<4x8xf32>) -> (tensor<4x5xf32>, tensor<4x5xi32>)
  return
}

// -----

func.func @negative_router_groups(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>) {
  // expected-error @+1 {{C3: num_groups (3) must divide num_experts (4)}}
  %w, %i = parax.router softmax %x, %g {num_experts = 4, top_k = 2, num_groups = 3} : (tensor<4x8xf32>, tensor<4x8xf32>) -> (tensor<4x2xf32>, tensor<4x2xi32>)
  return
}

// -----

func.func @negative_router_topk_groups(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>) {
  // expected-error @+1 {{C3: topk_groups must be in [1, num_groups]}}
  %w, %i = parax.router softmax %x, %g {num_experts = 4, top_k = 2, num_groups = 2, topk_groups = 3} : (tensor<4x8xf32>, tensor<4x8xf32>) -> (tensor<4x2xf32>, tensor<4x2xi32>)
  return
}

// -----

func.func @negative_router_too_many_groups(%x: tensor<4x8xf32>, %g: tensor<128x8xf32>) {
  // The runtimes keep the chosen groups as a 64-bit mask (ExpertChoice.h).
  // expected-error @+1 {{C3: num_groups (128) must be at most 64}}
  %w, %i = parax.router softmax %x, %g {num_experts = 128, top_k = 2, num_groups = 128, topk_groups = 2} : (tensor<4x8xf32>, tensor<128x8xf32>) -> (tensor<4x2xf32>, tensor<4x2xi32>)
  return
}

// -----

func.func @negative_router_group_capacity(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>) {
  // One allowed group of two experts cannot supply three choices.
  // expected-error @+1 {{C3: the 1 allowed groups hold fewer than top_k experts}}
  %w, %i = parax.router softmax %x, %g {num_experts = 4, top_k = 3, num_groups = 2, topk_groups = 1} : (tensor<4x8xf32>, tensor<4x8xf32>) -> (tensor<4x3xf32>, tensor<4x3xi32>)
  return
}

// -----

func.func @negative_router_result_shape(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>) {
  // expected-error @+1 {{C4: weights must have x's shape with the last dimension 2}}
  %w, %i = parax.router softmax %x, %g {num_experts = 4, top_k = 2} : (tensor<4x8xf32>, tensor<4x8xf32>) -> (tensor<4x3xf32>, tensor<4x2xi32>)
  return
}

// -----

func.func @negative_router_scaling(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>) {
  // expected-error @+1 {{C5: scaling_factor must be positive}}
  %w, %i = parax.router softmax %x, %g {num_experts = 4, top_k = 2, scaling_factor = 0.0 : f64} : (tensor<4x8xf32>, tensor<4x8xf32>) -> (tensor<4x2xf32>, tensor<4x2xi32>)
  return
}

// -----

func.func @negative_router_score_func(%x: tensor<4x8xf32>, %g: tensor<4x8xf32>) {
  // expected-error @+2 {{expected ::parax::ScoreFunc to be one of: softmax, sigmoid}}
  // expected-error @+1 {{failed to parse Parax_ScoreFuncAttr}}
  %w, %i = parax.router relu %x, %g {num_experts = 4, top_k = 2} : (tensor<4x8xf32>, tensor<4x8xf32>) -> (tensor<4x2xf32>, tensor<4x2xi32>)
  return
}

// -----

func.func @negative_experts_hidden(%x: tensor<4x8xf32>, %w: tensor<4x2xf32>, %i: tensor<4x2xi32>,
                                   %g: tensor<4x16x4xf32>, %d: tensor<4x8x16xf32>) {
  // expected-error @+1 {{C1: w_gate must be [E, F, H] with H = 8}}
  %0 = parax.experts %x, %w, %i, %g, %g, %d : (tensor<4x8xf32>, tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x16x4xf32>, tensor<4x16x4xf32>, tensor<4x8x16xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @negative_experts_up(%x: tensor<4x8xf32>, %w: tensor<4x2xf32>, %i: tensor<4x2xi32>,
                               %g: tensor<4x16x8xf32>, %u: tensor<4x12x8xf32>, %d: tensor<4x8x16xf32>) {
  // expected-error @+1 {{C1: w_up must have w_gate's shape [4, 16, 8]}}
  %0 = parax.experts %x, %w, %i, %g, %u, %d : (tensor<4x8xf32>, tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x16x8xf32>, tensor<4x12x8xf32>, tensor<4x8x16xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @negative_experts_down(%x: tensor<4x8xf32>, %w: tensor<4x2xf32>, %i: tensor<4x2xi32>,
                                 %g: tensor<4x16x8xf32>, %d: tensor<4x16x8xf32>) {
  // expected-error @+1 {{C1: w_down must be [E, H, F] = [4, 8, 16]}}
  %0 = parax.experts %x, %w, %i, %g, %g, %d : (tensor<4x8xf32>, tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x16x8xf32>, tensor<4x16x8xf32>, tensor<4x16x8xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @negative_experts_routing(%x: tensor<4x8xf32>, %w: tensor<4x2xf32>, %i: tensor<4x3xi32>,
                                    %g: tensor<4x16x8xf32>, %d: tensor<4x8x16xf32>) {
  // expected-error @+1 {{C2: indices must have x's shape with the last dimension 2}}
  %0 = parax.experts %x, %w, %i, %g, %g, %d : (tensor<4x8xf32>, tensor<4x2xf32>, tensor<4x3xi32>, tensor<4x16x8xf32>, tensor<4x16x8xf32>, tensor<4x8x16xf32>) -> tensor<4x8xf32>
  return
}

// -----

func.func @negative_experts_result(%x: tensor<4x8xf32>, %w: tensor<4x2xf32>, %i: tensor<4x2xi32>,
                                   %g: tensor<4x16x8xf32>, %d: tensor<4x8x16xf32>) {
  // expected-error @+1 {{C3: result must have x's type}}
  %0 = parax.experts %x, %w, %i, %g, %g, %d : (tensor<4x8xf32>, tensor<4x2xf32>, tensor<4x2xi32>, tensor<4x16x8xf32>, tensor<4x16x8xf32>, tensor<4x8x16xf32>) -> tensor<4x16xf32>
  return
}

// -----

func.func @negative_cross_entropy_labels(%l: tensor<2x4x16xf32>, %y: tensor<2x16xi32>) {
  // expected-error @+1 {{C1: labels must have the logits' shape without the last dimension}}
  %0 = parax.cross_entropy %l, %y : (tensor<2x4x16xf32>, tensor<2x16xi32>) -> tensor<f32>
  return
}

// -----

func.func @negative_cross_entropy_count_without_ignore(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>, %n: tensor<f32>) {
  // expected-error @+1 {{C4: the count of labels (parax.label_count) must be given with ignore_index and only then}}
  %0 = parax.cross_entropy %l, %y, %n : (tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<f32>) -> tensor<f32>
  return
}

// -----

func.func @negative_cross_entropy_ignore_without_count(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>) {
  // expected-error @+1 {{C4: the count of labels (parax.label_count) must be given with ignore_index and only then}}
  %0 = parax.cross_entropy %l, %y {ignore_index = -100 : i64} : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return
}

// -----

func.func @negative_cross_entropy_grad_count_without_ignore(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>, %n: tensor<f32>) {
  // expected-error @+1 {{C4: the count of labels (parax.label_count) must be given with ignore_index and only then}}
  %0 = parax.cross_entropy_grad %l, %y, %n : (tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<f32>) -> tensor<2x4x16xf32>
  return
}

// -----

func.func @negative_cross_entropy_weight(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>) {
  // expected-error @+1 {{C5: weight must be a positive finite number, got -3.000000e-01}}
  %0 = parax.cross_entropy %l, %y {weight = -0.3 : f64} : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<f32>
  return
}

// -----

func.func @negative_cross_entropy_grad_weight(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>) {
  // expected-error @+1 {{C5: weight must be a positive finite number, got 0.000000e+00}}
  %0 = parax.cross_entropy_grad %l, %y {weight = 0.0 : f64} : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<2x4x16xf32>
  return
}

// -----

func.func @negative_shift_rank(%y: tensor<2x4x2xi32>) {
  // expected-error @+1 {{C1: x must be [batch, sequence] and the result of its type, got 'tensor<2x4x2xi32>' -> 'tensor<2x4x2xi32>'}}
  %0 = parax.shift %y {shift = 1 : i64, fill = 0 : i64} : (tensor<2x4x2xi32>) -> tensor<2x4x2xi32>
  return
}

// -----

func.func @negative_shift_result(%y: tensor<2x4xi32>) {
  // expected-error @+1 {{C1: x must be [batch, sequence] and the result of its type, got 'tensor<2x4xi32>' -> 'tensor<2x4xi64>'}}
  %0 = parax.shift %y {shift = 1 : i64, fill = 0 : i64} : (tensor<2x4xi32>) -> tensor<2x4xi64>
  return
}

// -----

func.func @negative_shift_past_the_sequence(%y: tensor<2x4xi32>) {
  // expected-error @+1 {{C2: shift must be in (0, 4), the sequence, got 4}}
  %0 = parax.shift %y {shift = 4 : i64, fill = -100 : i64} : (tensor<2x4xi32>) -> tensor<2x4xi32>
  return
}

// -----

func.func @negative_label_count_result(%y: tensor<2x4xi32>) {
  // expected-error @+1 {{result #0 must be 0D tensor of 32-bit float values}}
  %0 = parax.label_count %y {ignore_index = -100 : i64} : (tensor<2x4xi32>) -> tensor<2xf32>
  return
}

// -----

func.func @negative_cross_entropy_result(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>) {
  // expected-error @+1 {{result #0 must be 0D tensor of 32-bit float values}}
  %0 = parax.cross_entropy %l, %y : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<2xf32>
  return
}

// -----

func.func @negative_position_embedding_position_and_offset(%t: tensor<8x4xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C3: a position operand and a non-zero offset do not come together}}
  %0 = parax.position_embedding %t, %p {offset = 2} : (tensor<8x4xf32>, tensor<i32>) -> tensor<1x1x4xf32>
  return
}

// -----

func.func @negative_rope_position_and_offset(%x: tensor<1x1x2x8xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C6: a position operand and a non-zero position_offset do not come together}}
  %0 = parax.rope %x, %p {theta = 1.0e4 : f64, rotary_dim = 8, position_offset = 3} : (tensor<1x1x2x8xf32>, tensor<i32>) -> tensor<1x1x2x8xf32>
  return
}

// -----

func.func @negative_rope_position_not_scalar(%x: tensor<1x1x2x8xf32>, %p: tensor<1xi32>) {
  // expected-error @+1 {{operand #1 must be 0D tensor of 32-bit signless integer or 64-bit signless integer values}}
  %0 = parax.rope %x, %p {theta = 1.0e4 : f64, rotary_dim = 8} : (tensor<1x1x2x8xf32>, tensor<1xi32>) -> tensor<1x1x2x8xf32>
  return
}

// -----

func.func @negative_attention_position_not_causal(%q: tensor<1x1x2x8xf32>, %k: tensor<1x16x2x8xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C8: attention over a KV cache at a run-time position must be causal}}
  %0 = parax.attention %q, %k, %k, %p {num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.5 : f64} : (tensor<1x1x2x8xf32>, tensor<1x16x2x8xf32>, tensor<1x16x2x8xf32>, tensor<i32>) -> tensor<1x1x2x8xf32>
  return
}

// -----

func.func @negative_cache_update_rank(%c: tensor<1x16x16xf32>, %u: tensor<1x1x16xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C1: cache and update must be rank-4 tensors of one element type, and the result of the cache's type}}
  %0 = parax.cache_update %c, %u, %p : (tensor<1x16x16xf32>, tensor<1x1x16xf32>, tensor<i32>) -> tensor<1x16x16xf32>
  return
}

// -----

func.func @negative_cache_update_element_type(%c: tensor<1x16x2x8xbf16>, %u: tensor<1x1x2x8xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C1: cache and update must be rank-4 tensors of one element type}}
  %0 = parax.cache_update %c, %u, %p : (tensor<1x16x2x8xbf16>, tensor<1x1x2x8xf32>, tensor<i32>) -> tensor<1x16x2x8xbf16>
  return
}

// -----

func.func @negative_cache_update_heads(%c: tensor<1x16x2x8xf32>, %u: tensor<1x1x4x8xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C2: cache and update must agree outside dimension 1}}
  %0 = parax.cache_update %c, %u, %p : (tensor<1x16x2x8xf32>, tensor<1x1x4x8xf32>, tensor<i32>) -> tensor<1x16x2x8xf32>
  return
}

// -----

func.func @negative_cache_update_too_many_rows(%c: tensor<1x4x2x8xf32>, %u: tensor<1x8x2x8xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C2: 8 new rows do not fit a cache of 4}}
  %0 = parax.cache_update %c, %u, %p : (tensor<1x4x2x8xf32>, tensor<1x8x2x8xf32>, tensor<i32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

// Context parallelism: seq_grid/seq_axes say which piece of the sequence a
// rank's op holds.
parax.grid @g(cp = 2)
func.func @negative_attention_seq_axes_alone(%q: tensor<1x4x2x8xf32>, %k: tensor<1x8x2x8xf32>) {
  // expected-error @+1 {{C9: seq_grid and seq_axes come together}}
  %0 = parax.attention %q, %k, %k {causal, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64, seq_axes = ["cp"]} : (tensor<1x4x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

parax.grid @g(cp = 2)
func.func @negative_attention_seq_axes_unknown(%q: tensor<1x4x2x8xf32>, %k: tensor<1x8x2x8xf32>) {
  // expected-error @+1 {{C9: unknown grid axis "sp"}}
  %0 = parax.attention %q, %k, %k {causal, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64, seq_grid = @g, seq_axes = ["sp"]} : (tensor<1x4x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

parax.grid @g(cp = 4)
func.func @negative_attention_seq_pieces_fewer_keys(%q: tensor<1x4x2x8xf32>, %k: tensor<1x8x2x8xf32>) {
  // expected-error @+1 {{C6: causal attention needs at least as many keys as queries (16), got 8}}
  %0 = parax.attention %q, %k, %k {causal, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64, seq_grid = @g, seq_axes = ["cp"]} : (tensor<1x4x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

parax.grid @g(cp = 2)
func.func @negative_attention_seq_axes_with_position(%q: tensor<1x1x2x8xf32>, %k: tensor<1x16x2x8xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C9: a sequence split over ranks takes no run-time position}}
  %0 = parax.attention %q, %k, %k, %p {causal, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.5 : f64, seq_grid = @g, seq_axes = ["cp"]} : (tensor<1x1x2x8xf32>, tensor<1x16x2x8xf32>, tensor<1x16x2x8xf32>, tensor<i32>) -> tensor<1x1x2x8xf32>
  return
}

// -----

parax.grid @g(cp = 2)
func.func @negative_rope_seq_axes_with_position(%x: tensor<1x1x2x8xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C7: a sequence split over ranks takes no run-time position}}
  %0 = parax.rope %x, %p {theta = 1.0e4 : f64, rotary_dim = 8, seq_grid = @g, seq_axes = ["cp"]} : (tensor<1x1x2x8xf32>, tensor<i32>) -> tensor<1x1x2x8xf32>
  return
}

// -----

parax.grid @g(cp = 4)
func.func @negative_position_embedding_pieces_past_the_table(%t: tensor<16x8xf32>) {
  // expected-error @+1 {{C2: positions 4 .. 19 exceed the table's 16 rows}}
  %0 = parax.position_embedding %t {offset = 4, seq_grid = @g, seq_axes = ["cp"]} : (tensor<16x8xf32>) -> tensor<1x4x8xf32>
  return
}

// -----

// expected-error @+1 {{C4: cyclic axis "sp" is not an axis of the grid}}
parax.grid @g(cp = 2) {cyclic_axes = ["sp"]}

// -----

func.func @negative_rope_cyclic_without_axes(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{C7: seq_cyclic needs seq_axes}}
  %0 = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = 8, seq_cyclic} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @cross_entropy_grad_labels(%l: tensor<2x16x256xf32>, %y: tensor<2x8xi32>) -> tensor<2x16x256xf32> {
  // expected-error @+1 {{C1: labels must have the logits' shape without the last dimension}}
  %d = parax.cross_entropy_grad %l, %y : (tensor<2x16x256xf32>, tensor<2x8xi32>) -> tensor<2x16x256xf32>
  return %d : tensor<2x16x256xf32>
}

// -----

func.func @cross_entropy_grad_result(%l: tensor<2x16x256xf32>, %y: tensor<2x16xi32>) -> tensor<2x16x128xf32> {
  // expected-error @+1 {{C2: the result must have the logits' type}}
  %d = parax.cross_entropy_grad %l, %y : (tensor<2x16x256xf32>, tensor<2x16xi32>) -> tensor<2x16x128xf32>
  return %d : tensor<2x16x128xf32>
}

// -----

func.func @linear_weight_grad_tokens(%x: tensor<2x16x64xf32>, %dy: tensor<2x8x128xf32>) -> tensor<64x128xf32> {
  // expected-error @+1 {{C1: x and dy must have one rank (at least 2) and agree on every dimension but the last}}
  %d = parax.linear_weight_grad %x, %dy : (tensor<2x16x64xf32>, tensor<2x8x128xf32>) -> tensor<64x128xf32>
  return %d : tensor<64x128xf32>
}

// -----

func.func @linear_weight_grad_layout(%x: tensor<2x16x64xf32>, %dy: tensor<2x16x128xf32>) -> tensor<64x128xf32> {
  // expected-error @+1 {{C2: the result must be [128, 64] of x's element type}}
  %d = parax.linear_weight_grad %x, %dy {transpose_w} : (tensor<2x16x64xf32>, tensor<2x16x128xf32>) -> tensor<64x128xf32>
  return %d : tensor<64x128xf32>
}

// -----

func.func @rms_norm_grad_weight(%x: tensor<2x64xf32>, %w: tensor<32xf32>) -> tensor<2x64xf32> {
  // expected-error @+1 {{C1: norm parameters must be [64]}}
  %d = parax.rms_norm_grad %x, %w, %x {eps = 1.0e-5 : f64} : (tensor<2x64xf32>, tensor<32xf32>, tensor<2x64xf32>) -> tensor<2x64xf32>
  return %d : tensor<2x64xf32>
}

// -----

func.func @rms_norm_grad_dy(%x: tensor<2x64xf32>, %w: tensor<64xf32>, %dy: tensor<4x64xf32>) -> tensor<2x64xf32> {
  // expected-error @+1 {{C2: dy must have x's type}}
  %d = parax.rms_norm_grad %x, %w, %dy {eps = 1.0e-5 : f64} : (tensor<2x64xf32>, tensor<64xf32>, tensor<4x64xf32>) -> tensor<2x64xf32>
  return %d : tensor<2x64xf32>
}

// -----

func.func @rms_norm_weight_grad_dy(%x: tensor<2x64xf32>, %dy: tensor<4x64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{C1: dy must have x's type}}
  %d = parax.rms_norm_weight_grad %x, %dy {eps = 1.0e-5 : f64} : (tensor<2x64xf32>, tensor<4x64xf32>) -> tensor<64xf32>
  return %d : tensor<64xf32>
}

// -----

func.func @rms_norm_weight_grad_result(%x: tensor<2x64xf32>) -> tensor<32xf32> {
  // expected-error @+1 {{C2: the result must be [64] of x's element type}}
  %d = parax.rms_norm_weight_grad %x, %x {eps = 1.0e-5 : f64} : (tensor<2x64xf32>, tensor<2x64xf32>) -> tensor<32xf32>
  return %d : tensor<32xf32>
}

// -----

func.func @rms_norm_weight_grad_eps(%x: tensor<2x64xf32>) -> tensor<64xf32> {
  // expected-error @+1 {{C3: eps must be positive}}
  %d = parax.rms_norm_weight_grad %x, %x {eps = 0.0 : f64} : (tensor<2x64xf32>, tensor<2x64xf32>) -> tensor<64xf32>
  return %d : tensor<64xf32>
}

// -----

func.func @swiglu_grad_types(%g: tensor<2x8xf32>, %u: tensor<2x4xf32>) -> tensor<2x8xf32> {
  // expected-error @+1 {{C1: operands and result must have one type}}
  %d = parax.swiglu_grad %g, %u, %g {operand = 0} : (tensor<2x8xf32>, tensor<2x4xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %d : tensor<2x8xf32>
}

// -----

func.func @swiglu_grad_operand(%g: tensor<2x8xf32>) -> tensor<2x8xf32> {
  // expected-error @+1 {{C2: operand must be 0 (gate) or 1 (up), got 2}}
  %d = parax.swiglu_grad %g, %g, %g {operand = 2} : (tensor<2x8xf32>, tensor<2x8xf32>, tensor<2x8xf32>) -> tensor<2x8xf32>
  return %d : tensor<2x8xf32>
}

// -----

func.func @attention_grad_results(%q: tensor<1x8x4x8xf32>, %k: tensor<1x8x2x8xf32>) {
  // expected-error @+1 {{C10: dq, dk and dv must have q's, k's and v's types}}
  %dq, %dk, %dv = parax.attention_grad %q, %k, %k, %q {causal, num_heads = 4, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64}
      : (tensor<1x8x4x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x4x8xf32>)
      -> (tensor<1x8x4x8xf32>, tensor<1x8x4x8xf32>, tensor<1x8x2x8xf32>)
  return
}

// -----

func.func @attention_grad_dout(%q: tensor<1x8x4x8xf32>, %k: tensor<1x8x2x8xf32>, %do: tensor<1x4x4x8xf32>) {
  // expected-error @+1 {{C4: result must be [B, S, num_heads, Dv] of q's element type}}
  %dq, %dk, %dv = parax.attention_grad %q, %k, %k, %do {causal, num_heads = 4, num_kv_heads = 2, head_dim = 8, scale = 0.35 : f64}
      : (tensor<1x8x4x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>, tensor<1x4x4x8xf32>)
      -> (tensor<1x8x4x8xf32>, tensor<1x8x2x8xf32>, tensor<1x8x2x8xf32>)
  return
}

// -----

func.func @embedding_grad_shape(%ids: tensor<2x16xi32>, %dy: tensor<2x16x32xf32>) -> tensor<256x64xf32> {
  // expected-error @+1 {{C1: the result must be [V, H] and dy ids' shape with H appended}}
  %d = parax.embedding_grad %ids, %dy : (tensor<2x16xi32>, tensor<2x16x32xf32>) -> tensor<256x64xf32>
  return %d : tensor<256x64xf32>
}

// -----

parax.grid @g(tp = 2)
func.func @embedding_grad_vocab_axes(%ids: tensor<2x16xi32>, %dy: tensor<2x16x64xf32>) -> tensor<128x64xf32> {
  // expected-error @+1 {{C2: vocab_grid and vocab_axes come together}}
  %d = parax.embedding_grad %ids, %dy {vocab_axes = ["tp"]} : (tensor<2x16xi32>, tensor<2x16x64xf32>) -> tensor<128x64xf32>
  return %d : tensor<128x64xf32>
}

// -----

func.func @sum_to_shape(%x: tensor<2x3x4xf32>) -> tensor<1x2x4xf32> {
  // expected-error @+1 {{C1: the result must have x's rank and element type, each dimension x's or 1}}
  %y = parax.sum_to %x : (tensor<2x3x4xf32>) -> tensor<1x2x4xf32>
  return %y : tensor<1x2x4xf32>
}

// -----

func.func @gelu_grad_types(%x: tensor<2x8xf32>, %dy: tensor<2x4xf32>) -> tensor<2x8xf32> {
  // expected-error @+1 {{C1: operands and result must have one type}}
  %d = parax.gelu_grad tanh %x, %dy : (tensor<2x8xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
  return %d : tensor<2x8xf32>
}

// -----

func.func @layer_norm_grad_dy(%x: tensor<2x64xf32>, %w: tensor<64xf32>, %dy: tensor<4x64xf32>) -> tensor<2x64xf32> {
  // expected-error @+1 {{C2: dy must have x's type}}
  %d = parax.layer_norm_grad %x, %w, %dy {eps = 1.0e-5 : f64} : (tensor<2x64xf32>, tensor<64xf32>, tensor<4x64xf32>) -> tensor<2x64xf32>
  return %d : tensor<2x64xf32>
}

// -----

func.func @layer_norm_weight_grad_result(%x: tensor<2x64xf32>) -> tensor<32xf32> {
  // expected-error @+1 {{C2: the result must be [64] of x's element type}}
  %d = parax.layer_norm_weight_grad %x, %x {eps = 1.0e-5 : f64} : (tensor<2x64xf32>, tensor<2x64xf32>) -> tensor<32xf32>
  return %d : tensor<32xf32>
}

// -----

func.func @position_embedding_grad_shape(%dy: tensor<2x8x64xf32>) -> tensor<128x64xf32> {
  // expected-error @+1 {{C1: expected a [1, S, H] dy and a [P, H] result}}
  %d = parax.position_embedding_grad %dy : (tensor<2x8x64xf32>) -> tensor<128x64xf32>
  return %d : tensor<128x64xf32>
}

// -----

func.func @position_embedding_grad_rows(%dy: tensor<1x8x64xf32>) -> tensor<16x64xf32> {
  // expected-error @+1 {{C2: positions 10 .. 17 exceed the table's 16 rows}}
  %d = parax.position_embedding_grad %dy {offset = 10} : (tensor<1x8x64xf32>) -> tensor<16x64xf32>
  return %d : tensor<16x64xf32>
}

// -----

func.func @sigmoid_grad_types(%x: tensor<2x8xf32>, %dy: tensor<2x4xf32>) -> tensor<2x8xf32> {
  // expected-error @+1 {{C1: operands and result must have one type}}
  %d = parax.sigmoid_grad %x, %dy : (tensor<2x8xf32>, tensor<2x4xf32>) -> tensor<2x8xf32>
  return %d : tensor<2x8xf32>
}

// -----

func.func @router_grad_gate(%x: tensor<2x4x16xf32>, %g: tensor<4x8xf32>, %dw: tensor<2x4x2xf32>) -> tensor<2x4x4xf32> {
  // expected-error @+1 {{C1: gate must be [num_experts, H] = [4, 16]}}
  %d = parax.router_grad softmax %x, %g, %dw {num_experts = 4, top_k = 2} : (tensor<2x4x16xf32>, tensor<4x8xf32>, tensor<2x4x2xf32>) -> tensor<2x4x4xf32>
  return %d : tensor<2x4x4xf32>
}

// -----

func.func @router_grad_dweights(%x: tensor<2x4x16xf32>, %g: tensor<4x16xf32>, %dw: tensor<2x4x3xf32>) -> tensor<2x4x4xf32> {
  // expected-error @+1 {{C4: dweights must have x's shape with the last dimension 2}}
  %d = parax.router_grad softmax %x, %g, %dw {num_experts = 4, top_k = 2} : (tensor<2x4x16xf32>, tensor<4x16xf32>, tensor<2x4x3xf32>) -> tensor<2x4x4xf32>
  return %d : tensor<2x4x4xf32>
}

// -----

func.func @router_grad_result(%x: tensor<2x4x16xf32>, %g: tensor<4x16xf32>, %dw: tensor<2x4x2xf32>) -> tensor<2x4x2xf32> {
  // expected-error @+1 {{C4: the result must have x's shape with the last dimension 4}}
  %d = parax.router_grad softmax %x, %g, %dw {num_experts = 4, top_k = 2} : (tensor<2x4x16xf32>, tensor<4x16xf32>, tensor<2x4x2xf32>) -> tensor<2x4x2xf32>
  return %d : tensor<2x4x2xf32>
}

// -----

func.func @router_grad_top_k(%x: tensor<2x4x16xf32>, %g: tensor<4x16xf32>, %dw: tensor<2x4x5xf32>) -> tensor<2x4x4xf32> {
  // expected-error @+1 {{C2: top_k must be in [1, num_experts], got 5}}
  %d = parax.router_grad softmax %x, %g, %dw {num_experts = 4, top_k = 5} : (tensor<2x4x16xf32>, tensor<4x16xf32>, tensor<2x4x5xf32>) -> tensor<2x4x4xf32>
  return %d : tensor<2x4x4xf32>
}

// -----

func.func @experts_grad_stacks(%x: tensor<2x4x16xf32>, %w: tensor<2x4x2xf32>, %i: tensor<2x4x2xi32>,
                               %wg: tensor<4x24x16xf32>, %wd: tensor<4x16x24xf32>) {
  // expected-error @+1 {{C1: w_up must have w_gate's shape [4, 24, 16]}}
  %dx, %dw, %dg, %du, %dd = parax.experts_grad %x, %w, %i, %wg, %wd, %wd, %x : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>, tensor<4x16x24xf32>, tensor<2x4x16xf32>) -> (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>, tensor<4x16x24xf32>)
  return
}

// -----

func.func @experts_grad_results(%x: tensor<2x4x16xf32>, %w: tensor<2x4x2xf32>, %i: tensor<2x4x2xi32>,
                                %wg: tensor<4x24x16xf32>, %wd: tensor<4x16x24xf32>) {
  // expected-error @+1 {{C3: dy must have x's type, and the results the types of x, weights, w_gate, w_up and w_down}}
  %dx, %dw, %dg, %du, %dd = parax.experts_grad %x, %w, %i, %wg, %wg, %wd, %x : (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<2x4x2xi32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x16x24xf32>, tensor<2x4x16xf32>) -> (tensor<2x4x16xf32>, tensor<2x4x2xf32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>, tensor<4x24x16xf32>)
  return
}

// -----

func.func @router_aux_loss_coef(%x: tensor<2x4x16xf32>, %g: tensor<4x16xf32>) -> tensor<2x4x2xf32> {
  // expected-error @+1 {{C6: aux_loss_coef must not be negative}}
  %w, %i = parax.router softmax %x, %g {num_experts = 4, top_k = 2, aux_loss_coef = -0.1 : f64} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> (tensor<2x4x2xf32>, tensor<2x4x2xi32>)
  return %w : tensor<2x4x2xf32>
}

// -----

func.func @router_sequence_aux_rank(%x: tensor<8x16xf32>, %g: tensor<4x16xf32>) -> tensor<8x2xf32> {
  // expected-error @+1 {{C7: sequence_aux needs x of rank 3 ([B, S, H]), got rank 2}}
  %w, %i = parax.router softmax %x, %g {num_experts = 4, top_k = 2, aux_loss_coef = 0.1 : f64, sequence_aux} : (tensor<8x16xf32>, tensor<4x16xf32>) -> (tensor<8x2xf32>, tensor<8x2xi32>)
  return %w : tensor<8x2xf32>
}

// -----

func.func @router_load_sequences(%x: tensor<2x4x16xf32>, %g: tensor<4x16xf32>) -> tensor<3x4xf32> {
  // expected-error @+1 {{C4: the result must be [4] or [B, 4] (x [B, S, H]) of f32}}
  %l = parax.router_load softmax %x, %g {num_experts = 4, top_k = 2} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> tensor<3x4xf32>
  return %l : tensor<3x4xf32>
}

// -----

func.func @router_aux_grad_sequences(%x: tensor<8x16xf32>, %g: tensor<4x16xf32>, %load: tensor<2x4xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{C1: gate must be [num_experts, H] and load [num_experts] or [B, num_experts] (x [B, S, H]), num_experts = 4}}
  %d = parax.router_aux_grad sigmoid %x, %g, %load {num_experts = 4, coefficient = 0.02, num_tokens = 4, num_sequences = 2} : (tensor<8x16xf32>, tensor<4x16xf32>, tensor<2x4xf32>) -> tensor<8x4xf32>
  return %d : tensor<8x4xf32>
}

// -----

func.func @router_aux_grad_num_sequences(%x: tensor<2x4x16xf32>, %g: tensor<4x16xf32>, %load: tensor<2x4xf32>) -> tensor<2x4x4xf32> {
  // expected-error @+1 {{C3: coefficient must not be negative and num_tokens and num_sequences must be positive}}
  %d = parax.router_aux_grad sigmoid %x, %g, %load {num_experts = 4, coefficient = 0.02, num_tokens = 4, num_sequences = 0} : (tensor<2x4x16xf32>, tensor<4x16xf32>, tensor<2x4xf32>) -> tensor<2x4x4xf32>
  return %d : tensor<2x4x4xf32>
}

// -----

func.func @balance_loss_sequences(%load: tensor<2x4xf32>, %scores: tensor<4xf32>) -> tensor<f32> {
  // expected-error @+1 {{C1: load and scores must be [num_experts] or [B, num_experts] alike, of f32, num_experts = 4}}
  %b = parax.balance_loss %load, %scores {num_experts = 4, coefficient = 0.02, num_tokens = 4, num_sequences = 2} : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<f32>
  return %b : tensor<f32>
}

// -----

func.func @router_load_result(%x: tensor<2x4x16xf32>, %g: tensor<4x16xf32>) -> tensor<4xbf16> {
  // expected-error @+1 {{C4: the result must be [4] or [B, 4] (x [B, S, H]) of f32}}
  %l = parax.router_load softmax %x, %g {num_experts = 4, top_k = 2} : (tensor<2x4x16xf32>, tensor<4x16xf32>) -> tensor<4xbf16>
  return %l : tensor<4xbf16>
}

// -----

func.func @router_aux_grad_load(%x: tensor<2x4x16xf32>, %g: tensor<4x16xf32>, %load: tensor<3xf32>) -> tensor<2x4x4xf32> {
  // expected-error @+1 {{C1: gate must be [num_experts, H] and load [num_experts] or [B, num_experts] (x [B, S, H]), num_experts = 4}}
  %d = parax.router_aux_grad softmax %x, %g, %load {num_experts = 4, coefficient = 0.02, num_tokens = 8} : (tensor<2x4x16xf32>, tensor<4x16xf32>, tensor<3xf32>) -> tensor<2x4x4xf32>
  return %d : tensor<2x4x4xf32>
}

// -----

func.func @router_aux_grad_tokens(%x: tensor<2x4x16xf32>, %g: tensor<4x16xf32>, %load: tensor<4xf32>) -> tensor<2x4x4xf32> {
  // expected-error @+1 {{C3: coefficient must not be negative and num_tokens and num_sequences must be positive}}
  %d = parax.router_aux_grad softmax %x, %g, %load {num_experts = 4, coefficient = 0.02, num_tokens = 0} : (tensor<2x4x16xf32>, tensor<4x16xf32>, tensor<4xf32>) -> tensor<2x4x4xf32>
  return %d : tensor<2x4x4xf32>
}

// -----

func.func @balance_loss_experts(%load: tensor<4xf32>, %scores: tensor<3xf32>) -> tensor<f32> {
  // expected-error @+1 {{C1: load and scores must be [num_experts] or [B, num_experts] alike, of f32, num_experts = 4}}
  %b = parax.balance_loss %load, %scores {num_experts = 4, coefficient = 0.02, num_tokens = 8} : (tensor<4xf32>, tensor<3xf32>) -> tensor<f32>
  return %b : tensor<f32>
}

// -----

func.func @balance_loss_scalar(%load: tensor<4xf32>, %scores: tensor<4xf32>) -> tensor<1xf32> {
  // expected-error @+1 {{C2: the result must be a rank-0 f32 tensor}}
  %b = parax.balance_loss %load, %scores {num_experts = 4, coefficient = 0.02, num_tokens = 8} : (tensor<4xf32>, tensor<4xf32>) -> tensor<1xf32>
  return %b : tensor<1xf32>
}

// -----

func.func @balance_loss_coefficient(%load: tensor<4xf32>, %scores: tensor<4xf32>) -> tensor<f32> {
  // expected-error @+1 {{C3: coefficient must not be negative and num_tokens and num_sequences must be positive}}
  %b = parax.balance_loss %load, %scores {num_experts = 4, coefficient = -1.0, num_tokens = 8} : (tensor<4xf32>, tensor<4xf32>) -> tensor<f32>
  return %b : tensor<f32>
}

// -----

func.func @negative_attention_value_dim(%q: tensor<1x4x2x16xf32>, %k: tensor<1x4x1x16xf32>) {
  // expected-error @+1 {{C10: value_dim (24) must be in [1, 16], v's channels}}
  %o = parax.attention %q, %k, %k {causal, num_heads = 2, num_kv_heads = 1, head_dim = 16, scale = 0.25 : f64, value_dim = 24}
      : (tensor<1x4x2x16xf32>, tensor<1x4x1x16xf32>, tensor<1x4x1x16xf32>) -> tensor<1x4x2x24xf32>
  return
}

// -----

func.func @negative_attention_value_dim_result(%q: tensor<1x4x2x16xf32>, %k: tensor<1x4x1x16xf32>) {
  // expected-error @+1 {{C4: result must be [B, S, num_heads, Dv] of q's element type}}
  %o = parax.attention %q, %k, %k {causal, num_heads = 2, num_kv_heads = 1, head_dim = 16, scale = 0.25 : f64, value_dim = 8}
      : (tensor<1x4x2x16xf32>, tensor<1x4x1x16xf32>, tensor<1x4x1x16xf32>) -> tensor<1x4x2x16xf32>
  return
}

// -----

func.func @negative_logsumexp_shape(%x: tensor<2x4x16xf32>) {
  // expected-error @+1 {{C1: the result must have x's shape with a last dimension of 1}}
  %0 = parax.logsumexp %x : (tensor<2x4x16xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_cross_entropy_lse_without_vocab_axes(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>, %lse: tensor<2x4x1xf32>) {
  // expected-error @+1 {{C6: an lse is given with vocab_grid and vocab_axes, and only then}}
  %0 = parax.cross_entropy %l, %y, %lse : (tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4x1xf32>) -> tensor<f32>
  return
}

// -----

parax.grid @g(tp = 2)
func.func @negative_cross_entropy_grad_vocab_axes_without_lse(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>) {
  // expected-error @+1 {{C6: an lse is given with vocab_grid and vocab_axes, and only then}}
  %0 = parax.cross_entropy_grad %l, %y {vocab_grid = @g, vocab_axes = ["tp"]} : (tensor<2x4x16xf32>, tensor<2x4xi32>) -> tensor<2x4x16xf32>
  return
}

// -----

parax.grid @g(tp = 2)
func.func @negative_cross_entropy_lse_shape(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>, %lse: tensor<2x4x2xf32>) {
  // expected-error @+1 {{C6: lse must have the logits' shape with a last dimension of 1, got 'tensor<2x4x2xf32>'}}
  %0 = parax.cross_entropy %l, %y, %lse {vocab_grid = @g, vocab_axes = ["tp"]} : (tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4x2xf32>) -> tensor<f32>
  return
}

// -----

parax.grid @g(tp = 2)
func.func @negative_cross_entropy_lse_before_count(%l: tensor<2x4x16xf32>, %y: tensor<2x4xi32>, %lse: tensor<2x4x1xf32>, %n: tensor<f32>) {
  // expected-error @+1 {{C6: after the labels come at most a count (rank 0) and an lse, in that order, got 2 operand(s)}}
  %0 = parax.cross_entropy %l, %y, %lse, %n {ignore_index = -100 : i64, vocab_grid = @g, vocab_axes = ["tp"]} : (tensor<2x4x16xf32>, tensor<2x4xi32>, tensor<2x4x1xf32>, tensor<f32>) -> tensor<f32>
  return
}

// -----

func.func @negative_ring_window_shape(%c: tensor<1x3x2x8xf32>, %u: tensor<1x2x2x8xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C1: cache and update must be rank-4 tensors of one element type that agree outside dimension 1, the window [B, C + S, heads, D] of that type and the result the cache's type}}
  %0:2 = parax.ring_cache_update %c, %u, %p : (tensor<1x3x2x8xf32>, tensor<1x2x2x8xf32>, tensor<i32>) -> (tensor<1x3x2x8xf32>, tensor<1x3x2x8xf32>)
  return
}

// -----

func.func @negative_ring_attention_without_window(%q: tensor<1x1x2x8xf32>, %k: tensor<1x4x2x8xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C13: ring needs a position operand and a window}}
  %0 = parax.attention %q, %k, %k, %p {causal, ring, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.25 : f64}
      : (tensor<1x1x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<i32>) -> tensor<1x1x2x8xf32>
  return
}

// -----

func.func @negative_ring_shorter_than_its_window(%q: tensor<1x2x2x8xf32>, %k: tensor<1x4x2x8xf32>, %p: tensor<i32>) {
  // expected-error @+1 {{C13: a ring's 2 cached rows cannot hold the 3 earlier keys a window of 4 sees}}
  %0 = parax.attention %q, %k, %k, %p {causal, ring, window = 4, num_heads = 2, num_kv_heads = 2, head_dim = 8, scale = 0.25 : f64}
      : (tensor<1x2x2x8xf32>, tensor<1x4x2x8xf32>, tensor<1x4x2x8xf32>, tensor<i32>) -> tensor<1x2x2x8xf32>
  return
}
