// RUN: parax-opt %s -split-input-file -verify-diagnostics

// Malformed input gets an error at its location, never a crash.

func.func @negative_unknown_op(%x: tensor<4xf32>) {
  // expected-error @+1 {{custom op 'parax.softmax' is unknown}}
  %y = parax.softmax %x : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @negative_wrong_operand_count(%x: tensor<4xf32>) {
  // expected-error @+1 {{number of operands and types do not match: got 2 operands and 1 types}}
  %y = parax.silu %x, %x : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @negative_missing_attribute(%x: tensor<2x4xf32>, %w: tensor<4xf32>) {
  // expected-error @+1 {{requires attribute 'eps'}}
  %y = parax.rms_norm %x, %w : (tensor<2x4xf32>, tensor<4xf32>) -> tensor<2x4xf32>
  return
}

// -----

func.func @negative_attribute_type(%x: tensor<1x4x2x8xf32>) {
  // expected-error @+1 {{attribute 'rotary_dim' failed to satisfy constraint: 64-bit signless integer attribute}}
  %y = parax.rope %x {theta = 1.0e4 : f64, rotary_dim = "eight"} : (tensor<1x4x2x8xf32>) -> tensor<1x4x2x8xf32>
  return
}

// -----

func.func @negative_undefined_value(%x: tensor<4xf32>) {
  // expected-error @+1 {{use of undeclared SSA value name}}
  %y = parax.silu %nothere : (tensor<4xf32>) -> tensor<4xf32>
  return
}

// -----

func.func @negative_non_tensor(%x: f32) {
  // expected-error @+1 {{operand #0 must be statically shaped tensor of floating-point values}}
  %y = "parax.silu"(%x) : (f32) -> f32
  return
}
