func.func @f(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %y = parax.silu %x : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}
