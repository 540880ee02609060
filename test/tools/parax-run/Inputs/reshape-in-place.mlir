func.func @f(%x: tensor<2x4xf32>) -> tensor<8xf32> {
  %a = parax.silu %x : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %r = parax.reshape %a : (tensor<2x4xf32>) -> tensor<8xf32>
  %s = parax.silu %r : (tensor<8xf32>) -> tensor<8xf32>
  return %s : tensor<8xf32>
}
