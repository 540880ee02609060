func.func @f(%logits: tensor<2x3x10xf32>, %labels: tensor<2x3xi32>) -> tensor<f32> {
  %y = parax.cross_entropy %logits, %labels : (tensor<2x3x10xf32>, tensor<2x3xi32>) -> tensor<f32>
  return %y : tensor<f32>
}
