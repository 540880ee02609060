func.func @f(%q: tensor<1x2x1x2048xf32>, %k: tensor<1x2x1x2048xf32>, %v: tensor<1x2x1x2048xf32>) -> tensor<1x2x1x2048xf32> {
  %y = parax.attention %q, %k, %v {causal, head_dim = 2048 : i64, num_heads = 1 : i64, num_kv_heads = 1 : i64, scale = 0.02 : f64} : (tensor<1x2x1x2048xf32>, tensor<1x2x1x2048xf32>, tensor<1x2x1x2048xf32>) -> tensor<1x2x1x2048xf32>
  return %y : tensor<1x2x1x2048xf32>
}
