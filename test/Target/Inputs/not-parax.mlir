func.func private @other(tensor<2x4xf32>) -> tensor<2x4xf32>
func.func @forward(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  %y = func.call @other(%x) : (tensor<2x4xf32>) -> tensor<2x4xf32>
  return %y : tensor<2x4xf32>
}
