// RUN: parax-opt %s --parax-model-summary -split-input-file -verify-diagnostics --allow-unregistered-dialect -o /dev/null

// An op the cost model does not know is reported, never silently skipped.

func.func @negative_unknown_op(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = parax.silu %x : (tensor<4xf32>) -> tensor<4xf32>
  // expected-warning @+1 {{op has no cost model; it is not counted in the summary}}
  %z = "test.mystery"(%y) : (tensor<4xf32>) -> tensor<4xf32>
  return %z : tensor<4xf32>
}
