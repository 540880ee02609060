// RUN: parax-opt %s -split-input-file -verify-diagnostics

// Invalid grids, shardings and parax attributes give errors located at the op
// or function that carries them.

// expected-error @+1 {{C2: grid axis sizes must be positive, got 0}}
parax.grid @g(dp = 0)

// -----

// expected-error @+1 {{C3: grid axis 'tp' is declared twice}}
parax.grid @g(tp = 2, tp = 4)

// -----

// expected-error @+1 {{expected '='}}
parax.grid @g(tp)

// -----

parax.grid @g(dp = 2, tp = 4)
// expected-error @+1 {{argument #0: unknown grid axis 'ep' (grid @g has axes ["dp", "tp"])}}
func.func @negative_unknown_axis(%x: tensor<8x8xf32> {parax.sharding = #parax.sharding<@g, [{ep}, {}]>}) {
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
// expected-error @+1 {{grid axis 'tp' is used twice in one sharding}}
func.func @negative_axis_twice(%x: tensor<8x8xf32> {parax.sharding = #parax.sharding<@g, [{tp}, {tp}]>}) {
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
// An axis may not both split a dimension and hold a partial sum.
// expected-error @+1 {{grid axis 'tp' is used twice in one sharding}}
func.func @negative_split_and_partial(%x: tensor<8x8xf32> {parax.sharding = #parax.sharding<@g, [{tp}, {}], partial = {tp}>}) {
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
// expected-error @+1 {{argument #0: dimension 1 of size 6 is not divisible by 4 (split over grid axes {tp})}}
func.func @negative_not_divisible(%x: tensor<8x6xf32> {parax.sharding = #parax.sharding<@g, [{}, {tp}]>}) {
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
// Two axes on one dimension multiply: 12 is not divisible by 2 x 4.
// expected-error @+1 {{dimension 0 of size 12 is not divisible by 8 (split over grid axes {dp, tp})}}
func.func @negative_not_divisible_multi(%x: tensor<12x8xf32> {parax.sharding = #parax.sharding<@g, [{dp, tp}, {}]>}) {
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
// expected-error @+1 {{argument #0: sharding has 1 dimension entries but the value has rank 2}}
func.func @negative_rank_mismatch(%x: tensor<8x8xf32> {parax.sharding = #parax.sharding<@g, [{dp}]>}) {
  return
}

// -----

// expected-error @+1 {{argument #0: sharding refers to unknown grid @nowhere}}
func.func @negative_unknown_grid(%x: tensor<8x8xf32> {parax.sharding = #parax.sharding<@nowhere, [{dp}, {}]>}) {
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
// expected-error @+1 {{result #0: dimension 0 of size 6 is not divisible by 4}}
func.func @negative_function_result(%x: tensor<6xf32>) -> (tensor<6xf32> {parax.sharding = #parax.sharding<@g, [{tp}]>}) {
  return %x : tensor<6xf32>
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_op_result(%x: tensor<8x6xf32>) {
  // expected-error @+1 {{result #0: dimension 1 of size 6 is not divisible by 4}}
  %y = parax.silu %x {parax.shardings = [#parax.sharding<@g, [{}, {tp}]>]} : (tensor<8x6xf32>) -> tensor<8x6xf32>
  return
}

// -----

parax.grid @g(dp = 2, tp = 4)
func.func @negative_shardings_count(%x: tensor<8x8xf32>, %gate: tensor<4x8xf32>) {
  // expected-error @+1 {{'parax.shardings' must list one sharding per result (2)}}
  %w, %i = parax.router softmax %x, %gate {num_experts = 4, top_k = 2, parax.shardings = [#parax.sharding<@g, [{dp}, {}]>]}
      : (tensor<8x8xf32>, tensor<4x8xf32>) -> (tensor<8x2xf32>, tensor<8x2xi32>)
  return
}

// -----

func.func @negative_shardings_entry(%x: tensor<8x8xf32>) {
  // expected-error @+1 {{result #0: expected a #parax.sharding, got "tp"}}
  %y = parax.silu %x {parax.shardings = ["tp"]} : (tensor<8x8xf32>) -> tensor<8x8xf32>
  return
}

// -----

// expected-error @+1 {{expected '{'}}
func.func @negative_sharding_syntax(%x: tensor<8xf32> {parax.sharding = #parax.sharding<@g, [tp]>}) {
  return
}

// -----

// expected-error @+1 {{argument #0: 'parax.param' must be a non-empty checkpoint tensor name}}
func.func @negative_param_empty(%w: tensor<8xf32> {parax.param = ""}) {
  return
}

// -----

// expected-error @+1 {{argument #0: 'parax.param' must be a non-empty checkpoint tensor name}}
func.func @negative_param_not_string(%w: tensor<8xf32> {parax.param = 3 : i64}) {
  return
}

// -----

// expected-error @+1 {{argument #0: a parameter must be a tensor of static shape}}
func.func @negative_param_dynamic(%w: tensor<?xf32> {parax.param = "w"}) {
  return
}

// -----

// A piece of a fused checkpoint tensor (--parax-split-fused-params).

// expected-error @+1 {{argument #0: 'parax.param_offset' belongs on a parameter}}
func.func @negative_piece_not_param(%w: tensor<8xf32> {parax.param_offset = array<i64: 8>, parax.param_shape = array<i64: 24>}) {
  return
}

// -----

// expected-error @+1 {{argument #0: 'parax.param_offset' needs 'parax.param_shape' too}}
func.func @negative_piece_no_shape(%w: tensor<8xf32> {parax.param = "w", parax.param_offset = array<i64: 8>}) {
  return
}

// -----

// expected-error @+1 {{argument #0: 'parax.param_shape' must be an array<i64> with one entry per dimension of the argument}}
func.func @negative_piece_rank(%w: tensor<8xf32> {parax.param = "w", parax.param_offset = array<i64: 8>, parax.param_shape = array<i64: 8, 24>}) {
  return
}

// -----

// expected-error @+1 {{argument #0: the box at offset 20 of extent 8 in dimension 1 is outside the checkpoint tensor (extent 24)}}
func.func @negative_piece_outside(%w: tensor<4x8xf32> {parax.param = "w", parax.param_offset = array<i64: 0, 20>, parax.param_shape = array<i64: 4, 24>}) {
  return
}

// -----

// expected-error @+1 {{argument #0: the box at offset -1 of extent 4 in dimension 0 is outside the checkpoint tensor (extent 4)}}
func.func @negative_piece_negative(%w: tensor<4x8xf32> {parax.param = "w", parax.param_offset = array<i64: -1, 0>, parax.param_shape = array<i64: 4, 24>}) {
  return
}

// -----

// expected-error @+1 {{argument #0: expected a #parax.sharding, got "tp"}}
func.func @negative_arg_sharding_type(%x: tensor<8xf32> {parax.sharding = "tp"}) {
  return
}

// -----

// expected-error @+1 {{argument #0: unknown parax argument attribute 'parax.weight'}}
func.func @negative_unknown_arg_attr(%w: tensor<8xf32> {parax.weight = "w"}) {
  return
}

// -----

func.func @negative_layer_type(%x: tensor<8xf32>) {
  // expected-error @+1 {{'parax.layer' must be an integer}}
  %y = parax.silu %x {parax.layer = "three"} : (tensor<8xf32>) -> tensor<8xf32>
  return
}

// -----

func.func @negative_layer_value(%x: tensor<8xf32>) {
  // expected-error @+1 {{'parax.layer' must be >= -1 (-1 is the prologue)}}
  %y = parax.silu %x {parax.layer = -2 : i64} : (tensor<8xf32>) -> tensor<8xf32>
  return
}

// -----

func.func @negative_unknown_op_attr(%x: tensor<8xf32>) {
  // expected-error @+1 {{unknown parax attribute 'parax.stage_id'}}
  %y = parax.silu %x {parax.stage_id = 1 : i64} : (tensor<8xf32>) -> tensor<8xf32>
  return
}

// -----

// expected-error @+1 {{argument #0: 'parax.input' must be a non-negative integer input index}}
func.func @negative_input_index(%x: tensor<8xi32> {parax.input = -1 : i64}) {
  return
}

// -----

// expected-error @+1 {{argument #0: a parameter cannot also be input #0}}
func.func @negative_input_on_param(%w: tensor<8xf32> {parax.input = 0 : i64, parax.param = "w"}) {
  return
}

// -----

// expected-error @+1 {{result #0: 'parax.loss_term' must be "balance" or "mtp" (the loss terms: the load-balancing losses', multi-token prediction's)}}
func.func @negative_loss_term(%x: tensor<f32>) -> (tensor<f32> {parax.loss_term = "router"}) {
  return %x : tensor<f32>
}

// -----

// expected-error @+1 {{result #0: 'parax.stage_part' is a unit attribute on a gradient ('parax.grad')}}
func.func @negative_stage_part_not_a_gradient(%x: tensor<4xf32>) -> (tensor<4xf32> {parax.stage_part}) {
  return %x : tensor<4xf32>
}

// -----

// expected-error @+1 {{result #0: 'parax.stage_part' is a unit attribute on a gradient ('parax.grad')}}
func.func @negative_stage_part_value(%x: tensor<4xf32>) -> (tensor<4xf32> {parax.grad = "w", parax.stage_part = 1 : i64}) {
  return %x : tensor<4xf32>
}

// -----

// The plan and the pipeline are typed attributes: each field checked.
// expected-error @+1 {{pipeline: stage 2 is not one of 2 stages (0 .. stages - 1)}}
func.func @stage_past_the_stages() attributes {parax.pipeline = #parax.pipeline<stage = 2, stages = 2>} {
  return
}

// -----

// expected-error @+1 {{pipeline: schedule must be gpipe, 1f1b or interleaved, got 'zigzag'}}
func.func @unknown_schedule() attributes {parax.pipeline = #parax.pipeline<stage = 0, stages = 2, schedule = "zigzag">} {
  return
}

// -----

// expected-error @+1 {{plan: zero must be a ZeRO stage, 0 to 3, got 4}}
func.func @zero_four() attributes {parax.plan = #parax.plan<zero = 4>} {
  return
}

// -----

// expected-error @+1 {{plan: tp must be at least 1, got 0}}
func.func @no_tensor_parallel_ranks() attributes {parax.plan = #parax.plan<tp = 0>} {
  return
}

// -----

// expected-error @+1 {{plan: recompute must be none, selective or full, got 'all'}}
func.func @unknown_recompute() attributes {parax.plan = #parax.plan<recompute = "all">} {
  return
}

// -----

// expected-error @+1 {{'parax.plan' must be a #parax.plan<...> on a function}}
func.func @a_dictionary_plan() attributes {parax.plan = {tp = 2 : i64}} {
  return
}

// -----

// expected-error @+1 {{struct is missing required parameter: stage}}
func.func @a_pipeline_without_its_stage() attributes {parax.pipeline = #parax.pipeline<stages = 2>} {
  return
}
