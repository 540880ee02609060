func.func @f(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %a = parax.silu %x : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %b = parax.mul %a, %x : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %c = parax.add %b, %a : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  return %c : tensor<2x4xf32>
}
