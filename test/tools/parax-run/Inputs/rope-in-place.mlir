func.func @f(%x: tensor<2x4xf32>) -> tensor<1x2x1x4xf32> {
  %a = parax.silu %x : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %r = parax.reshape %a : (tensor<2x4xf32>) -> tensor<1x2x1x4xf32>
  %q = parax.rope %r {theta = 10000.0 : f64, rotary_dim = 4, position_offset = 5} : (tensor<1x2x1x4xf32>) -> tensor<1x2x1x4xf32>
  return %q : tensor<1x2x1x4xf32>
}
