// RUN: parax-opt %s -split-input-file --parax-export-shard -verify-diagnostics

// Upstream shardings split a dimension in blocks only: a plan that deals a
// sequence out over a cyclic axis (context parallelism) cannot be written
// as them.
// expected-error @+1 {{export: upstream shard has no cyclic split (cyclic_axes ["cp"])}}
parax.grid @g(cp = 2) {cyclic_axes = ["cp"]}
func.func @f(%x: tensor<2x8x16xf32>) -> tensor<2x8x16xf32> {
  return %x : tensor<2x8x16xf32>
}

// -----

// Ops with no linalg form are named, not skipped: a linear per head, and
// attention whose values are the first channels of v.
parax.grid @g(tp = 2)
func.func @head_linear(%x: tensor<1x1x4x8xf32>, %w: tensor<4x8x16xf32>) -> tensor<1x1x4x16xf32> {
  // expected-error @+1 {{export: no linalg form for 'parax.head_linear' (the export covers 2-D linear, silu, swiglu, add and attention's two contractions}}
  %y = parax.head_linear %x, %w : (tensor<1x1x4x8xf32>, tensor<4x8x16xf32>) -> tensor<1x1x4x16xf32>
  return %y : tensor<1x1x4x16xf32>
}

// -----

parax.grid @g(tp = 2)
func.func @values_inside_keys(%q: tensor<1x4x2x16xf32>, %k: tensor<1x4x2x16xf32>) -> tensor<1x4x2x8xf32> {
  // expected-error @+1 {{export: attention with value_dim (values inside v's channels) has no linalg form yet}}
  %o = parax.attention %q, %k, %k {causal, num_heads = 2, num_kv_heads = 2, head_dim = 16, scale = 0.25 : f64, value_dim = 8}
      : (tensor<1x4x2x16xf32>, tensor<1x4x2x16xf32>, tensor<1x4x2x16xf32>) -> tensor<1x4x2x8xf32>
  return %o : tensor<1x4x2x8xf32>
}
