func.func @f(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %g = parax.silu %x : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %u = parax.sigmoid %x : (tensor<2x4xf32>) -> tensor<2x4xf32>
  %dy = parax.add %g, %u : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %d0 = parax.swiglu_grad %g, %u, %dy {operand = 0 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %d1 = parax.swiglu_grad %g, %u, %dy {operand = 1 : i64} : (tensor<2x4xf32>, tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  %r = parax.add %d0, %d1 : (tensor<2x4xf32>, tensor<2x4xf32>) -> tensor<2x4xf32>
  return %r : tensor<2x4xf32>
}
