// RUN: parax-translate --to-executable %s -split-input-file -verify-diagnostics -o /dev/null

// Every error of the translation to an executable, by its text (issue 45).
// (The two-grid and foreign-op errors: test/Target/to-executable.test.)

// A dtype the runtime has no storage for.
// expected-error @+1 {{no executable dtype for 'f64'}}
func.func @forward(%x: tensor<4xf64>) -> tensor<4xf64> {
  return %x : tensor<4xf64>
}

// -----

// A dynamic shape: the runtime's buffers are placed at load.
// expected-error @+1 {{executables hold static tensors only}}
func.func @forward(%x: tensor<?xf32>) -> tensor<?xf32> {
  return %x : tensor<?xf32>
}

// -----

// Two functions claim one pipeline stage.
func.func @first(%x: tensor<4xf32>) -> tensor<4xf32> attributes {parax.pipeline = #parax.pipeline<stage = 0, stages = 1>} {
  return %x : tensor<4xf32>
}
// expected-error @+1 {{two functions for pipeline stage 0}}
func.func @second(%x: tensor<4xf32>) -> tensor<4xf32> attributes {parax.pipeline = #parax.pipeline<stage = 0, stages = 1>} {
  return %x : tensor<4xf32>
}

// -----

// A pipeline attribute that is not a #parax.pipeline (a dictionary without
// its stage: the translator once cast the missing entry unchecked).
// expected-error @+1 {{'parax.pipeline' must be a #parax.pipeline<...> on a function}}
func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> attributes {parax.pipeline = {stages = 2 : i64}} {
  return %x : tensor<4xf32>
}

// -----

// Stages that do not start at 0.
// expected-error @+1 {{pipeline stages must be 0 .. n-1}}
func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> attributes {parax.pipeline = #parax.pipeline<stage = 1, stages = 2>} {
  return %x : tensor<4xf32>
}

// -----

// Nothing to translate: declarations only.
// expected-error @+1 {{no function to translate}}
module {
  func.func private @declared(tensor<4xf32>) -> tensor<4xf32>
}

// -----

// An attribute the executable format cannot hold.
func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{attribute 'scales' has no executable form}}
  %y = parax.silu %x {scales = [1.5 : f32]} : (tensor<4xf32>) -> tensor<4xf32>
  return %y : tensor<4xf32>
}

// -----

// A split result that is not the stage's own work (an input passed through).
parax.grid @g(tp = 2)
func.func @forward(%x: tensor<4xf32> {parax.global_sharding = #parax.sharding<@g, [{tp}]>})
    -> (tensor<4xf32> {parax.global_sharding = #parax.sharding<@g, [{tp}]>}) {
  // expected-error @+1 {{result #0 is split but not computed by the stage alone}}
  return %x : tensor<4xf32>
}

// -----

// An earlier stage's results must say which of the program's they are.
func.func @stage0(%x: tensor<4xf32>) -> tensor<4xf32> attributes {parax.pipeline = #parax.pipeline<stage = 0, stages = 2>} {
  %y = parax.silu %x : (tensor<4xf32>) -> tensor<4xf32>
  // expected-error @+1 {{an earlier pipeline stage returns results that do not say which ('parax.result')}}
  return %y : tensor<4xf32>
}
func.func @stage1(%x: tensor<4xf32>) -> tensor<4xf32> attributes {parax.pipeline = #parax.pipeline<stage = 1, stages = 2>} {
  return %x : tensor<4xf32>
}

// -----

// A grid of more ranks than any executable runs on (its rank table alone
// would not fit in memory).
// expected-error @+1 {{the grid has more than 16777216 ranks: no executable runs on that many}}
parax.grid @g(dp = 65536, tp = 65536)
func.func @forward(%x: tensor<4xf32>) -> tensor<4xf32> {
  return %x : tensor<4xf32>
}
