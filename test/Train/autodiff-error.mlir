// RUN: parax-opt %s -split-input-file --parax-autodiff -verify-diagnostics

// What --parax-autodiff cannot differentiate is named at the op or the
// function, never skipped.

func.func @negative_no_loss(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  // expected-error @+1 {{--parax-autodiff needs a function returning one loss (a parax.cross_entropy result or a sum of them), got 1 result(s) that is neither}}
  return %x : tensor<2x4xf32>
}

// -----

// A sum of losses whose terms are not all cross-entropies.
func.func @negative_sum_of_a_loss_and_a_count(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>,
                                              %w: tensor<8x8xf32> {parax.param = "w"}) -> tensor<f32> {
  %y = parax.linear %x, %w : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %n = parax.label_count %labels {ignore_index = -100 : i64} : (tensor<2x4xi32>) -> tensor<f32>
  %l = parax.cross_entropy %y, %labels, %n {ignore_index = -100 : i64} : (tensor<2x4x8xf32>, tensor<2x4xi32>, tensor<f32>) -> tensor<f32>
  %s = parax.add %l, %n : (tensor<f32>, tensor<f32>) -> tensor<f32>
  // expected-error @+1 {{--parax-autodiff needs a function returning one loss (a parax.cross_entropy result or a sum of them), got 1 result(s) that is neither}}
  return %s : tensor<f32>
}

// -----

func.func @negative_unsupported_op(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>,
                                   %w: tensor<8x8xf32> {parax.param = "w"}) -> tensor<f32> {
  %y = parax.linear %x, %w : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  // expected-error @+1 {{--parax-autodiff has no gradient for 'parax.silu' yet (covered: the ops of Llama, GPT-2, Mixtral, Qwen2-MoE and DeepSeek-V3 models)}}
  %z = parax.silu %y : (tensor<2x4x8xf32>) -> tensor<2x4x8xf32>
  %l = parax.cross_entropy %z, %labels : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{--parax-autodiff: slices of a value that do not tile one of its dimensions have no gradient yet}}
func.func @negative_untiled_slices(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>,
                                   %w: tensor<8x24xf32> {parax.param = "w"}) -> tensor<f32> {
  %a = parax.slice %w {dim = 1 : i64, start = 0 : i64} : (tensor<8x24xf32>) -> tensor<8x8xf32>
  %b = parax.slice %w {dim = 1 : i64, start = 16 : i64} : (tensor<8x24xf32>) -> tensor<8x8xf32>
  %y = parax.linear %x, %a : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %z = parax.linear %y, %b : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %l = parax.cross_entropy %z, %labels : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// expected-error @+1 {{--parax-autodiff: the loss does not depend on parameter 'unused' (argument #3)}}
func.func @negative_unused_parameter(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>,
                                     %w: tensor<8x8xf32> {parax.param = "w"},
                                     %u: tensor<8x8xf32> {parax.param = "unused"}) -> tensor<f32> {
  %y = parax.linear %x, %w : (tensor<2x4x8xf32>, tensor<8x8xf32>) -> tensor<2x4x8xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

func.func @negative_cache_step(%x: tensor<1x1x2x8xf32>, %p: tensor<i32>, %labels: tensor<1x1x2xi32>,
                               %w: tensor<8x8xf32> {parax.param = "w"}) -> tensor<f32> {
  %y = parax.linear %x, %w : (tensor<1x1x2x8xf32>, tensor<8x8xf32>) -> tensor<1x1x2x8xf32>
  // expected-error @+1 {{--parax-autodiff has no gradient for a step at a run-time position}}
  %r = parax.rope %y, %p {theta = 1.0e4 : f64, rotary_dim = 8} : (tensor<1x1x2x8xf32>, tensor<i32>) -> tensor<1x1x2x8xf32>
  %l = parax.cross_entropy %r, %labels : (tensor<1x1x2x8xf32>, tensor<1x1x2xi32>) -> tensor<f32>
  return %l : tensor<f32>
}

// -----

// Multi-head latent attention's absorbed form (inference): the values are
// the keys' first channels, and neither it nor head_linear has a gradient.
func.func @negative_values_inside_keys(%q: tensor<1x4x2x16xf32>, %k: tensor<1x4x1x16xf32>, %labels: tensor<1x4xi32>,
                                       %w: tensor<16x8xf32> {parax.param = "w"}) -> tensor<f32> {
  // expected-error @+1 {{'parax.attention' op with value_dim (values inside v's channels) has no gradient rule; train the model with separate keys and values}}
  %o = parax.attention %q, %k, %k {causal, num_heads = 2, num_kv_heads = 1, head_dim = 16, scale = 0.25 : f64, value_dim = 8}
      : (tensor<1x4x2x16xf32>, tensor<1x4x1x16xf32>, tensor<1x4x1x16xf32>) -> tensor<1x4x2x8xf32>
  %r = parax.reshape %o : (tensor<1x4x2x8xf32>) -> tensor<1x4x16xf32>
  %y = parax.linear %r, %w : (tensor<1x4x16xf32>, tensor<16x8xf32>) -> tensor<1x4x8xf32>
  %l = parax.cross_entropy %y, %labels : (tensor<1x4x8xf32>, tensor<1x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
