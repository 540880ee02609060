// RUN: parax-opt %s -split-input-file --parax-recompute=mode=full -verify-diagnostics
// RUN: not parax-opt %s --parax-recompute=mode=sometimes 2>&1 | FileCheck %s --check-prefix=MODE

// MODE: --parax-recompute: mode must be none, selective, full or plan, got 'sometimes'

// expected-error @+1 {{--parax-recompute needs a training step: run --parax-autodiff first}}
func.func @negative_forward_only(%x: tensor<2x4x8xf32>, %labels: tensor<2x4xi32>) -> tensor<f32> {
  %l = parax.cross_entropy %x, %labels : (tensor<2x4x8xf32>, tensor<2x4xi32>) -> tensor<f32>
  return %l : tensor<f32>
}
