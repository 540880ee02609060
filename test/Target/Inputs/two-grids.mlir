parax.grid @a(tp = 2)
parax.grid @b(dp = 2)
func.func @forward(%x: tensor<2x4xf32>) -> tensor<2x4xf32> {
  return %x : tensor<2x4xf32>
}
