//===- ParaxOps.td - parax dialect operations --------------*- tablegen -*-===//
//
// Transformer-level ops. Each op's constraints are numbered (C1, C2, ...) in
// its description; the verifier's messages and the -verify-diagnostics tests
// (test/Dialect/Parax/ops-invalid.mlir) follow the same numbering.
//
//===----------------------------------------------------------------------===//

#ifndef PARAX_DIALECT_PARAX_IR_PARAXOPS_TD
#define PARAX_DIALECT_PARAX_IR_PARAXOPS_TD

include "parax/Dialect/Parax/IR/ParaxBase.td"
include "parax/Dialect/Parax/IR/ParaxInterfaces.td"
include "mlir/IR/SymbolInterfaces.td"
include "mlir/Interfaces/SideEffectInterfaces.td"

def Parax_FloatTensor : StaticShapeTensorOf<[AnyFloat]>;
def Parax_IndexTensor : StaticShapeTensorOf<[I32, I64]>;
// Values moved but not computed on: floats or integers (labels dealt out).
def Parax_DataTensor : StaticShapeTensorOf<[AnyFloat, I32, I64]>;
// A run-time position in a sequence (a generation step's first position).
def Parax_Position : 0DTensorOf<[I32, I64]>;

// A compute op of a model graph: pure, with a cost.
// `costOverrides` names the interface methods the op defines instead of the
// defaults (every operand read once, every result written once).
class Parax_Op<string mnemonic, list<Trait> traits = [],
               list<string> costOverrides = []>
    : Op<Parax_Dialect, mnemonic,
         !listconcat(traits, [Pure, DeclareOpInterfaceMethods<Parax_CostOpInterface,
                                                             costOverrides>])> {
  let hasVerifier = 1;
}

// Default textual form: operands, attributes, functional type.
class Parax_FunctionalOp<string mnemonic, list<Trait> traits = [],
                         list<string> costOverrides = []>
    : Parax_Op<mnemonic, traits, costOverrides> {
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
}

//===----------------------------------------------------------------------===//
// Device grid
//===----------------------------------------------------------------------===//

def Parax_GridOp : Op<Parax_Dialect, "grid", [Symbol]> {
  let summary = "a device grid with named axes";
  let description = [{
    Declares a logical grid of devices; shardings name its axes. The last axis
    is the innermost (consecutive ranks), so `tp` placed last keeps a
    tensor-parallel group inside one node.

    ```mlir
    parax.grid @cluster(pp = 2, dp = 4, tp = 8)
    parax.grid @long(cp = 4, tp = 2) {cyclic_axes = ["cp"]}
    ```

    A dimension split over a `cyclic_axes` axis (which must come first among
    the dimension's axes) is dealt out element by element: of `N` ranks
    along it, rank `c` holds elements `c, c + N, c + 2N, ...` (then split
    by the dimension's other axes in blocks), not a block. Context
    parallelism so balances causal attention: every rank holds early and
    late positions alike.

    C1: at least one axis. C2: every size is positive. C3: axis names are
    non-empty and unique. C4: `cyclic_axes` are axes of the grid.
  }];
  let arguments = (ins SymbolNameAttr:$sym_name, StrArrayAttr:$axis_names,
                       DenseI64ArrayAttr:$shape,
                       OptionalAttr<StrArrayAttr>:$cyclic_axes);
  let assemblyFormat = "$sym_name custom<GridAxes>($axis_names, $shape) attr-dict";
  let hasVerifier = 1;
  let extraClassDeclaration = [{
    /// Size of the named axis, or std::nullopt when the grid has no such axis.
    std::optional<int64_t> getAxisSize(::llvm::StringRef name);
    /// Number of devices of the grid.
    int64_t getNumDevices();
  }];
}

//===----------------------------------------------------------------------===//
// Embeddings
//===----------------------------------------------------------------------===//

def Parax_EmbeddingOp : Parax_FunctionalOp<"embedding", [], ["getBytesRead"]> {
  let summary = "token embedding lookup";
  let description = [{
    Gathers rows of `table : [V, H]` at `ids`; the result has the shape of
    `ids` with `H` appended.

    ```mlir
    %h = parax.embedding %ids, %wte : (tensor<2x16xi32>, tensor<256x64xf32>) -> tensor<2x16x64xf32>
    ```

    With `scale`, each row is multiplied by it (Gemma's embeddings, scaled
    by the square root of the hidden size).

    C1: `table` has rank 2. C2: result shape = `ids` shape + [H]. C3: result
    element type = `table` element type. C4: `vocab_grid` and `vocab_axes`
    come together. C5: `scale`, when present, is finite and positive.

    After partitioning, a vocab-parallel embedding names the grid axes its
    table's rows are split over (`vocab_grid`, `vocab_axes`): the local table
    holds rows `c·V .. (c+1)·V - 1` for this rank's coordinate `c` along them;
    ids outside give zeros (a partial sum over those axes).
  }];
  let arguments = (ins Parax_IndexTensor:$ids, Parax_FloatTensor:$table,
                       OptionalAttr<FlatSymbolRefAttr>:$vocab_grid,
                       OptionalAttr<StrArrayAttr>:$vocab_axes,
                       OptionalAttr<F64Attr>:$scale);
  let results = (outs Parax_FloatTensor:$result);
  // (the form before `scale`, which embedders call)
  let builders = [
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$ids, "::mlir::Value":$table, "::mlir::FlatSymbolRefAttr":$vocab_grid,
                   "::mlir::ArrayAttr":$vocab_axes), [{
      build($_builder, $_state, result, ids, table, vocab_grid, vocab_axes, ::mlir::FloatAttr());
    }]>];
}

def Parax_PositionEmbeddingOp : Parax_FunctionalOp<"position_embedding", [], ["getBytesRead"]> {
  let summary = "learned absolute position embedding";
  let description = [{
    Rows `offset .. offset + S - 1` of `table : [P, H]` as a `[1, S, H]`
    tensor, to be added (broadcast over the batch) to the token embedding, as
    in GPT-2/3. With a `position` operand (a generation step over a KV
    cache), the rows start at its run-time value `p` instead: `p .. p + S - 1`
    (the runtime refuses `p + S > P`).

    ```mlir
    %p = parax.position_embedding %wpe {offset = 0} : (tensor<128x64xf32>) -> tensor<1x16x64xf32>
    %p = parax.position_embedding %wpe, %pos : (tensor<128x64xf32>, tensor<i32>) -> tensor<1x1x64xf32>
    ```

    After partitioning with the sequence split (context parallelism),
    `seq_grid`/`seq_axes` say that the result's `S` rows are this rank's
    piece: at coordinate `c` along `seq_axes` (`N` ranks), rows `offset + c·S
    ..` of the table; with `seq_cyclic` (the first of `seq_axes` is a cyclic
    axis of size `N1`, this rank at `c1` on it and at `g` along the others),
    row `i` is row `offset + (g·S + i)·N1 + c1`.

    C1: `table` has rank 2 and the result is `[1, S, H]` with H from the
    table. C2: `offset >= 0` and `offset + S <= P` (`offset + N·S <= P` with
    `seq_axes`). C3: with `position`, `offset` is 0. C4: `seq_grid` and
    `seq_axes` come together, name axes of a grid, and take no `position`.
  }];
  let arguments = (ins Parax_FloatTensor:$table,
                       Optional<Parax_Position>:$position,
                       DefaultValuedAttr<I64Attr, "0">:$offset,
                       OptionalAttr<FlatSymbolRefAttr>:$seq_grid,
                       OptionalAttr<StrArrayAttr>:$seq_axes,
                       UnitAttr:$seq_cyclic);
  let results = (outs Parax_FloatTensor:$result);
}

//===----------------------------------------------------------------------===//
// Linear algebra
//===----------------------------------------------------------------------===//

def Parax_LinearOp : Parax_Op<"linear"> {
  let summary = "y = x · W (+ bias)";
  let description = [{
    `x : [..., in]`, `W : [in, out]` (or `[out, in]` with `transpose_w`, the
    Hugging Face `nn.Linear` layout), optional `bias : [out]`; the result is
    `[..., out]`. Column-parallel splits `out`; row-parallel splits `in`.

    ```mlir
    %y = parax.linear %x, %w {transpose_w} : (tensor<2x16x64xf32>, tensor<128x64xf32>) -> tensor<2x16x128xf32>
    ```

    C1: `x` has rank >= 1 and `W` rank 2. C2: `x`'s last dimension = `in`.
    C3: `bias`, when present, is `[out]`. C4: result = `x` shape with the last
    dimension replaced by `out`. C5: one element type for all operands and the
    result.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$weight,
                       Optional<Parax_FloatTensor>:$bias,
                       UnitAttr:$transpose_w);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = [{
    $x `,` $weight (`,` $bias^)? attr-dict `:` functional-type(operands, results)
  }];
  let extraClassDeclaration = [{
    int64_t getInFeatures();
    int64_t getOutFeatures();
  }];
}

def Parax_HeadLinearOp : Parax_FunctionalOp<"head_linear"> {
  let summary = "y[..., g, :] = x[..., g, :] · W[g]: a linear per head";
  let description = [{
    `x : [..., G, in]`, `W : [G, in, out]` (or `[G, out, in]` with
    `transpose_w`); head (group) `g` of every row goes through its own
    weight `W[g]`; the result is `[..., G, out]`. Multi-head latent
    attention's weight-absorbed form uses it twice: each head's no-rope
    query through its slice of `kv_b_proj` into the latent space, and each
    head's latent output back out of it. Tensor parallelism splits the heads
    (`G`, with `W`'s dimension 0); splitting `in` makes a partial sum, as a
    row-parallel linear.

    ```mlir
    %y = parax.head_linear %x, %w {transpose_w} : (tensor<2x1x4x32xf32>, tensor<4x16x32xf32>) -> tensor<2x1x4x16xf32>
    ```

    C1: `x` has rank >= 2 and `W` rank 3. C2: `x`'s last dimension = `in`.
    C3: `x`'s heads (dimension -2) number `W`'s `G`. C4: result = `x` shape
    with the last dimension replaced by `out`. C5: one element type for all
    operands and the result (C2, C4, C5 as `parax.linear`'s).
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$weight,
                       UnitAttr:$transpose_w);
  let results = (outs Parax_FloatTensor:$result);
  let extraClassDeclaration = [{
    int64_t getInFeatures();
    int64_t getOutFeatures();
  }];
}

//===----------------------------------------------------------------------===//
// Normalisation and position encoding
//===----------------------------------------------------------------------===//

def Parax_RmsNormOp : Parax_FunctionalOp<"rms_norm"> {
  let summary = "RMSNorm over the last dimension";
  let description = [{
    `y = x / sqrt(mean(x^2) + eps) * (weight + offset)` over the last
    dimension (`offset`: 0 when absent; Gemma's norms scale by `1 + w`).

    ```mlir
    %y = parax.rms_norm %x, %w {eps = 1.0e-05 : f64} : (tensor<2x16x64xf32>, tensor<64xf32>) -> tensor<2x16x64xf32>
    ```

    C1: `weight` is `[H]` with H = `x`'s last dimension. C2: result type =
    `x` type. C3: `eps > 0`. C4: `offset`, when present, is finite.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$weight, F64Attr:$eps,
                       OptionalAttr<F64Attr>:$offset);
  let results = (outs Parax_FloatTensor:$result);
  // (the form before `offset`, which embedders call)
  let builders = [
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$x, "::mlir::Value":$weight, "::mlir::FloatAttr":$eps), [{
      build($_builder, $_state, result, x, weight, eps, ::mlir::FloatAttr());
    }]>];
}

def Parax_LayerNormOp : Parax_FunctionalOp<"layer_norm"> {
  let summary = "LayerNorm over the last dimension";
  let description = [{
    `y = (x - mean) / sqrt(var + eps) * weight + bias` over the last dimension.

    ```mlir
    %y = parax.layer_norm %x, %w, %b {eps = 1.0e-05 : f64} : (tensor<2x16x64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<2x16x64xf32>
    ```

    C1: `weight` and `bias` are `[H]` with H = `x`'s last dimension. C2:
    result type = `x` type. C3: `eps > 0`.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$weight,
                       Parax_FloatTensor:$bias, F64Attr:$eps);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_RopeOp : Parax_FunctionalOp<"rope"> {
  let summary = "rotary position embedding";
  let description = [{
    Rotates the first `rotary_dim` features of every head of
    `x : [B, S, heads, head_dim]` by position-dependent angles
    `pos / theta^(2i / rotary_dim)`, positions `position_offset .. + S - 1`,
    or, with a `position` operand (a generation step over a KV cache), its
    run-time value `p .. p + S - 1`.
    Pairs are `(i, i + rotary_dim/2)` (Llama's rotate-half layout), or
    `(2i, 2i+1)` with `interleaved`. `rotary_dim < head_dim` is partial
    rotary (the rest passes through). `scaling` carries a Hugging Face
    `rope_scaling` dictionary (`rope_type` = `llama3` or `yarn` with its
    factors) unchanged, or LongRoPE's (`rope_type` = `longrope`) with the
    one list of per-pair factors the program's positions select
    (`ext_factors`: pair `i` turns at `pos / (ext_factors[i] ·
    theta^(2i / rotary_dim))`).

    ```mlir
    %q = parax.rope %x {theta = 500000.0 : f64, rotary_dim = 16} : (tensor<2x16x4x16xf32>) -> tensor<2x16x4x16xf32>
    ```

    After partitioning with the sequence split (context parallelism),
    `seq_grid`/`seq_axes` say that `x`'s `S` positions are this rank's piece:
    at coordinate `c` along `seq_axes`, positions `position_offset + c·S ..`
    (with `seq_cyclic`, position `i` is `position_offset + (g·S + i)·N1 +
    c1`, as for `parax.position_embedding`).

    With `inverse`, every pair turns by the opposite angle: the transpose of
    the rotation, which is how a gradient flows back through a rope.

    C1: `x` has rank 4 and the result has its type. C2: `theta > 0`. C3:
    `rotary_dim` is positive, even and at most `head_dim`. C4:
    `position_offset >= 0`. C5: `scaling`, when present, has a string
    `rope_type` of `llama3`, `yarn`, `linear` or `longrope` and a float
    `factor`, and the fields its kind reads (`longrope`: `ext_factors`,
    `rotary_dim / 2` finite positive f64s). C6:
    `position` and a non-zero `position_offset` do not come together. C7:
    `seq_grid` and `seq_axes` come together, name axes of a grid, and take no
    `position`.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Optional<Parax_Position>:$position,
                       F64Attr:$theta,
                       I64Attr:$rotary_dim,
                       UnitAttr:$interleaved,
                       UnitAttr:$inverse,
                       DefaultValuedAttr<I64Attr, "0">:$position_offset,
                       OptionalAttr<DictionaryAttr>:$scaling,
                       OptionalAttr<FlatSymbolRefAttr>:$seq_grid,
                       OptionalAttr<StrArrayAttr>:$seq_axes,
                       UnitAttr:$seq_cyclic);
  let results = (outs Parax_FloatTensor:$result);
}

//===----------------------------------------------------------------------===//
// Attention
//===----------------------------------------------------------------------===//

def Parax_AttentionOp : Parax_FunctionalOp<"attention"> {
  let summary = "scaled dot-product attention, grouped-query";
  let description = [{
    `q : [B, S, num_heads, head_dim]`, `k : [B, Skv, num_kv_heads, head_dim]`,
    `v : [B, Skv, num_kv_heads, Dv]`; query head `h` attends to KV head
    `h / (num_heads / num_kv_heads)`. `softmax(q · kᵀ · scale) · v`, with
    query `i` seeing keys `0 .. i + Skv - S` when `causal`. The result is
    `[B, S, num_heads, Dv]`. No `S × Skv` matrix is part of the op's
    contract: kernels may (and the CUDA one does) tile it away.

    ```mlir
    %o = parax.attention %q, %k, %v {causal, num_heads = 4, num_kv_heads = 2, head_dim = 16, scale = 0.25 : f64}
        : (tensor<2x16x4x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x2x16xf32>) -> tensor<2x16x4x16xf32>
    ```

    C1: `q`, `k`, `v` and the result have rank 4. C2: `q` has `num_heads`
    heads of `head_dim`; `k` has `num_kv_heads` heads of `head_dim`; `v` has
    `num_kv_heads` heads. C3: `num_kv_heads` divides `num_heads` (unless the
    query heads are a rank's slice, below). C4: batch sizes agree, `k` and
    `v` have one sequence length, and the result is `[B, S, num_heads, Dv]`.
    C5: `scale > 0`. C6: with `causal`, `Skv >= S` (`Skv >= N·S` with
    `seq_axes`). C7: `head_grid` and `head_axes` come together. C8: a
    `position` operand needs `causal`. C9: `seq_grid` and `seq_axes` come
    together, name axes of a grid, and take no `position`. C11: `window`,
    when present, is positive and comes with `causal`.

    With `window = W` (a sliding window: Mistral's, Gemma 3's local layers),
    a query sees the last `W` of the keys it would see without it (its own
    included). With `softcap = c` (Gemma 2), each scaled score `s` becomes
    `c · tanh(s / c)` before the mask and the softmax (C12: `c` finite and
    positive).

    With a `position` operand `p` (run-time; a generation step), `k` and `v`
    are a KV cache of capacity `Skv` (written by `parax.cache_update`) whose
    rows `0 .. p + S - 1` hold this sequence's tokens: query `i` (at position
    `p + i`) sees keys `0 .. p + i`; rows beyond are never read. The runtime
    refuses `p + S > Skv`.

    With `ring` and a `position` operand `p`, `k` and `v` are instead a
    `parax.ring_cache_update`'s window: row `r` holds position `p - (Skv - S) + r` (a
    ring cache's last `Skv - S` tokens, then the step's `S`); query `i`
    sees rows `.. Skv - S + i` of non-negative position, under its window
    (C13: `ring` needs `position` and `window`, and `Skv - S >= window -
    1`, so that the rows hold every key a window sees).

    After partitioning with fewer KV heads than tensor-parallel ranks
    (Megatron replicates KV heads), `head_grid`/`head_axes` say that `q`'s
    heads are this rank's slice: local head `j` at coordinate `c` along
    `head_axes` is global head `c · num_heads + j`, and attends to global KV
    head `(c · num_heads + j) / (num_heads · P / num_kv_heads)` of the
    replicated `k`, `v` (P: the ranks along `head_axes`).

    After partitioning with the queries' sequence split (context
    parallelism: each rank keeps its piece of the queries and gathers the
    keys and values), `seq_grid`/`seq_axes` say that `q`'s `S` queries are
    this rank's piece: at coordinate `c` along `seq_axes` (`N` ranks), local
    query `i` is query `p(i) = c·S + i` of `N·S` (with `seq_cyclic`, `p(i) =
    (g·S + i)·N1 + c1`, as for `parax.position_embedding`) and, with
    `causal`, sees keys `0 .. p(i) + Skv - N·S`.

    With `value_dim = Dv`, the values are the first `Dv` channels of `v`'s
    (C10: `Dv` is at most `v`'s last dimension; the result is `[B, S,
    num_heads, Dv]`): `v` may then be `k` itself, as in multi-head latent
    attention's absorbed form, whose one cache row `[latent, rope key]` is
    the key and whose latent is the value.
  }];
  let arguments = (ins Parax_FloatTensor:$q, Parax_FloatTensor:$k,
                       Parax_FloatTensor:$v, Optional<Parax_Position>:$position,
                       UnitAttr:$causal,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads,
                       I64Attr:$head_dim, F64Attr:$scale,
                       OptionalAttr<I64Attr>:$value_dim,
                       OptionalAttr<FlatSymbolRefAttr>:$head_grid,
                       OptionalAttr<StrArrayAttr>:$head_axes,
                       OptionalAttr<FlatSymbolRefAttr>:$seq_grid,
                       OptionalAttr<StrArrayAttr>:$seq_axes,
                       UnitAttr:$seq_cyclic,
                       OptionalAttr<I64Attr>:$window,
                       OptionalAttr<F64Attr>:$softcap,
                       UnitAttr:$ring);
  let results = (outs Parax_FloatTensor:$result);
  let extraClassDeclaration = [{
    /// The values' width: `value_dim`, else `v`'s last dimension.
    int64_t getValueWidth();
  }];
}

def Parax_CacheUpdateOp : Parax_FunctionalOp<"cache_update", [],
                                            ["getBytesRead", "getBytesWritten"]> {
  let summary = "write a step's keys or values into a KV cache";
  let description = [{
    `cache : [B, C, heads, D]` with rows `p .. p + S - 1` along the sequence
    (dimension 1) replaced by `update : [B, S, heads, D]`, where `p` is the
    run-time value of `position`; the other rows are `cache`'s. A generation
    step writes its new keys (after RoPE) and values so, and its attention
    reads the result with the same `position`.

    ```mlir
    %k = parax.cache_update %cache, %new, %pos : (tensor<2x64x2x16xf32>, tensor<2x1x2x16xf32>, tensor<i32>) -> tensor<2x64x2x16xf32>
    ```

    C1: `cache` and `update` have rank 4 and one element type; the result
    has `cache`'s type. C2: they agree outside dimension 1, and `S <= C`.
    The runtime refuses `p < 0` or `p + S > C`.

    The runtimes write the rows in place when `cache` is a program input
    read by nothing else: after a step, that input's buffer holds the
    result, which is how `parax-run --generate` keeps the cache on the
    device from one step to the next (docs/executable.md).
  }];
  let arguments = (ins Parax_FloatTensor:$cache, Parax_FloatTensor:$update,
                       Parax_Position:$position);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_RingCacheUpdateOp : Parax_FunctionalOp<"ring_cache_update", [],
                                                ["getBytesRead", "getBytesWritten"]> {
  let summary = "write a step's keys or values into a ring KV cache, and read the window";
  let description = [{
    A sliding-window layer's KV cache as a ring of the window's last tokens,
    whatever the context: `cache : [B, C, heads, D]` holds the token at
    position `t` in row `t mod C`, and `update : [B, S, heads, D]` holds
    the tokens at positions `p .. p + S - 1` (`p` the run-time value of
    `position`). Two results:
    - `window : [B, C + S, heads, D]`, what the step's attention reads: the
      cache's tokens at positions `p - C .. p - 1`, oldest first, then the
      update's rows; row `r` holds position `p - C + r`. Rows of negative
      position (`p < C`: the ring not yet full) hold whatever the ring holds
      and are never read by the `parax.attention` with `ring` that takes
      them;
    - `result : [B, C, heads, D]`, the cache with row `(p + i) mod C`
      replaced by the update's row `i` (when `S > C`, its last `C` rows).

    A cache of `W - 1` rows so serves a window of `W` keys whatever the
    context and whatever the step's `S` (a prefill chunk or one token).

    ```mlir
    %window, %ring = parax.ring_cache_update %cache, %new, %pos : (tensor<2x3x2x16xf32>, tensor<2x1x2x16xf32>, tensor<i32>) -> (tensor<2x4x2x16xf32>, tensor<2x3x2x16xf32>)
    ```

    C1: `cache` and `update` have rank 4 and one element type, and agree
    outside dimension 1; `window` is `[B, C + S, heads, D]` and `result`
    the cache's type.

    As with `parax.cache_update`, the runtimes write the rows in place when
    `cache` is a program input read by nothing else (the window is read
    first): after a step, that input's buffer holds `result`.
  }];
  let arguments = (ins Parax_FloatTensor:$cache, Parax_FloatTensor:$update,
                       Parax_Position:$position);
  let results = (outs Parax_FloatTensor:$window, Parax_FloatTensor:$result);
}

//===----------------------------------------------------------------------===//
// Elementwise
//===----------------------------------------------------------------------===//

class Parax_BinaryOp<string mnemonic, string what> : Parax_FunctionalOp<mnemonic> {
  let summary = "elementwise " # what;
  let description = [{
    Elementwise on operands of equal rank; a dimension of size 1 broadcasts
    against the other operand's (numpy rules, ranks equal).

    C1: equal ranks and element types. C2: each dimension pair is equal or
    one of them is 1. C3: the result has the broadcast shape.
  }];
  let arguments = (ins Parax_FloatTensor:$lhs, Parax_FloatTensor:$rhs);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_AddOp : Parax_BinaryOp<"add", "addition">;
def Parax_MulOp : Parax_BinaryOp<"mul", "multiplication">;

class Parax_UnaryOp<string mnemonic, string what> : Parax_FunctionalOp<mnemonic> {
  let summary = "elementwise " # what;
  let description = [{
    C1: the result type equals the operand type.
  }];
  let arguments = (ins Parax_FloatTensor:$x);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_SiluOp : Parax_UnaryOp<"silu", "SiLU, x · sigmoid(x)">;
def Parax_SigmoidOp : Parax_UnaryOp<"sigmoid", "logistic sigmoid">;

def Parax_SoftcapOp : Parax_FunctionalOp<"softcap"> {
  let summary = "elementwise soft-capping, cap · tanh(x / cap)";
  let description = [{
    Gemma 2's final logits: each value squashed into (-cap, cap).

    ```mlir
    %y = parax.softcap %x {cap = 30.0 : f64} : (tensor<2x16x256xf32>) -> tensor<2x16x256xf32>
    ```

    C1: the result type equals the operand type. C2: `cap` is finite and
    positive.
  }];
  let arguments = (ins Parax_FloatTensor:$x, F64Attr:$cap);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_GeluOp : Parax_Op<"gelu"> {
  let summary = "elementwise GELU";
  let description = [{
    Exact (`none`, erf) or `tanh`-approximated GELU (GPT-2's `gelu_new`).

    ```mlir
    %y = parax.gelu tanh %x : (tensor<2x16x256xf32>) -> tensor<2x16x256xf32>
    ```

    C1: the result type equals the operand type.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_GeluApproxAttr:$approximate);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = "`` $approximate $x attr-dict `:` functional-type(operands, results)";
}

def Parax_SwigluOp : Parax_FunctionalOp<"swiglu"> {
  let summary = "gated SiLU, silu(gate) · up";
  let description = [{
    The gate of Llama's MLP as one op: `silu(gate) * up`.

    C1: `gate`, `up` and the result have one type.
  }];
  let arguments = (ins Parax_FloatTensor:$gate, Parax_FloatTensor:$up);
  let results = (outs Parax_FloatTensor:$result);
}

//===----------------------------------------------------------------------===//
// Shape manipulation
//===----------------------------------------------------------------------===//

def Parax_ReshapeOp : Parax_FunctionalOp<"reshape", [], ["getBytesRead", "getBytesWritten"]> {
  let summary = "reshape (a view: no data moves)";
  let description = [{
    ```mlir
    %y = parax.reshape %x : (tensor<2x16x64xf32>) -> tensor<2x16x4x16xf32>
    ```

    C1: static shapes with equal element counts and one element type
    (floating point or integer).
  }];
  let arguments = (ins Parax_DataTensor:$x);
  let results = (outs Parax_DataTensor:$result);
}

def Parax_TransposeOp : Parax_FunctionalOp<"transpose"> {
  let summary = "permute dimensions";
  let description = [{
    `result.shape[i] = x.shape[permutation[i]]`.

    C1: `permutation` is a permutation of `0 .. rank-1`. C2: the result shape
    follows it; element types agree.
  }];
  let arguments = (ins Parax_FloatTensor:$x, DenseI64ArrayAttr:$permutation);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_SliceOp : Parax_FunctionalOp<"slice", [], ["getBytesRead"]> {
  let summary = "contiguous slice along one dimension";
  let description = [{
    Elements `start .. start + size - 1` of dimension `dim` (`size` is the
    result's extent there).

    ```mlir
    %y = parax.slice %x {dim = 3, start = 0} : (tensor<2x16x4x24xf32>) -> tensor<2x16x4x16xf32>
    ```

    C1: `0 <= dim < rank`. C2: the result equals `x` except along `dim`.
    C3: `start >= 0` and the slice lies inside `x`.
  }];
  let arguments = (ins Parax_FloatTensor:$x, I64Attr:$dim, I64Attr:$start);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_ConcatOp : Parax_Op<"concat"> {
  let summary = "concatenate along one dimension";
  let description = [{
    ```mlir
    %y = parax.concat %a, %b {dim = 3} : (tensor<2x16x4x16xf32>, tensor<2x16x4x8xf32>) -> tensor<2x16x4x24xf32>
    ```

    C1: at least one input, all of one rank and element type; `0 <= dim <
    rank`. C2: inputs agree outside `dim`; the result's extent along `dim` is
    their sum.
  }];
  let arguments = (ins Variadic<Parax_FloatTensor>:$inputs, I64Attr:$dim);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = "$inputs attr-dict `:` functional-type(operands, results)";
}

def Parax_BroadcastOp : Parax_FunctionalOp<"broadcast"> {
  let summary = "broadcast size-1 dimensions to the result shape";
  let description = [{
    ```mlir
    %y = parax.broadcast %x : (tensor<2x16x1x8xf32>) -> tensor<2x16x4x8xf32>
    ```

    C1: equal ranks and element types; every dimension of `x` equals the
    result's or is 1.
  }];
  let arguments = (ins Parax_FloatTensor:$x);
  let results = (outs Parax_FloatTensor:$result);
}

//===----------------------------------------------------------------------===//
// Mixture of experts
//===----------------------------------------------------------------------===//

def Parax_RouterOp : Parax_Op<"router"> {
  let summary = "MoE router: scores, top-k experts and their weights";
  let description = [{
    `logits = x · gateᵀ` with `gate : [E, H]` (the checkpoint layout);
    scores = `softmax` or `sigmoid` of the logits. Experts are chosen by the
    top-k of `scores + bias` (DeepSeek-V3's correction bias, used for the
    choice only), restricted, when `num_groups > 1`, to the `topk_groups`
    groups of experts whose best two biased scores sum highest. The weights
    are the chosen experts' scores, divided by their sum when `normalize`,
    times `scaling_factor`. Results: `weights : [..., top_k]` (element type
    of `x`) and `indices : [..., top_k]` (i32), in descending score order.

    Mixtral: softmax, normalize (equivalent to a softmax over the top-k
    logits). Qwen2-MoE: softmax, no normalize. DeepSeek-V3: sigmoid, bias,
    8 groups / top 4, normalize, scaling 2.5.

    ```mlir
    %w, %i = parax.router softmax %x, %g {num_experts = 8, top_k = 2, normalize}
        : (tensor<2x16x64xf32>, tensor<8x64xf32>) -> (tensor<2x16x2xf32>, tensor<2x16x2xi32>)
    ```

    C1: `gate` is `[num_experts, H]` with H = `x`'s last dimension; `bias`,
    when present, is `[num_experts]`. C2: `0 < top_k <= num_experts`. C3:
    `num_groups` divides `num_experts` and is at most 64,
    `0 < topk_groups <= num_groups`, and
    the allowed groups hold at least `top_k` experts. C4: both results have
    `x`'s shape with the last dimension replaced by `top_k`; `weights` has
    `x`'s element type, `indices` is i32. C5: `scaling_factor > 0`. C6:
    `aux_loss_coef >= 0`.

    `aux_loss_coef` (training only; Hugging Face's `router_aux_loss_coef`):
    the load-balancing loss `coef · E · Σ_e f_e · P_e` (Switch Transformer;
    Mixtral's form: `f_e` the routed choices to expert e over the tokens,
    `P_e` the mean score) takes part in the training step's gradient
    (--parax-autodiff: `parax.router_load`, `parax.router_aux_grad`) but not
    in the loss value returned, as Megatron-LM reports it apart.

    `sequence_aux` (with `aux_loss_coef`, DeepSeek-V3's complementary
    sequence-wise balance loss, §2.1.2; Hugging Face's `seq_aux` with
    `aux_loss_alpha`): per layer and per sequence (`x` is `[B, S, H]`),
    `α · Σ_e f_e · P_e` with `f_e = E / (K · S) · (the sequence's choices
    of e)` and `P_e` the mean over the sequence of the normalised scores
    `s_e / Σ_j s_j`; averaged over the sequences and summed over the
    layers. C7: `sequence_aux` needs `x` of rank 3.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$gate,
                       Optional<Parax_FloatTensor>:$bias,
                       Parax_ScoreFuncAttr:$score_func,
                       I64Attr:$num_experts, I64Attr:$top_k,
                       UnitAttr:$normalize,
                       DefaultValuedAttr<F64Attr, "1.0">:$scaling_factor,
                       DefaultValuedAttr<I64Attr, "1">:$num_groups,
                       DefaultValuedAttr<I64Attr, "1">:$topk_groups,
                       DefaultValuedAttr<F64Attr, "0.0">:$aux_loss_coef,
                       UnitAttr:$sequence_aux);
  let results = (outs Parax_FloatTensor:$weights, StaticShapeTensorOf<[I32]>:$indices);
  let assemblyFormat = [{
    `` $score_func $x `,` $gate (`,` $bias^)? attr-dict `:` functional-type(operands, results)
  }];
}

def Parax_ExpertsOp : Parax_Op<"experts", [], ["getBytesRead"]> {
  let summary = "routed gated FFN experts, combined by the router's weights";
  let description = [{
    For every token `t` and each of its `k` choices `e = indices[t, j]`:
    `y[t] += weights[t, j] · down_e(silu(gate_e(x[t])) · up_e(x[t]))`. A
    choice outside `0 .. E-1` (an unused row after `moe_dispatch`, -1)
    contributes nothing.
    Expert weights are stacked in checkpoint layout: `w_gate, w_up : [E, F, H]`,
    `w_down : [E, H, F]`. Routing is dropless: every chosen (token, expert)
    pair is computed, so sharded and unsharded runs agree exactly.

    ```mlir
    %y = parax.experts %x, %w, %i, %wg, %wu, %wd
        : (tensor<2x16x64xf32>, tensor<2x16x2xf32>, tensor<2x16x2xi32>,
           tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32>) -> tensor<2x16x64xf32>
    ```

    C1: `w_gate` and `w_up` are `[E, F, H]`, `w_down` is `[E, H, F]`, with H
    = `x`'s last dimension. C2: `weights` and `indices` have `x`'s shape with
    the last dimension replaced by one `k`. C3: the result has `x`'s type.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$weights,
                       Parax_IndexTensor:$indices, Parax_FloatTensor:$w_gate,
                       Parax_FloatTensor:$w_up, Parax_FloatTensor:$w_down);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = "operands attr-dict `:` functional-type(operands, results)";
  let extraClassDeclaration = [{
    int64_t getNumExperts();
    int64_t getFfnDim();
    int64_t getTopK();
  }];
}

//===----------------------------------------------------------------------===//
// Loss
//===----------------------------------------------------------------------===//

// The cross-entropy's and its gradient's operands after the labels: a
// count (rank 0), then a vocab-parallel op's lse.
defvar crossEntropyOperands = [{
  /// label_count's count (with ignore_index), or null.
  ::mlir::Value getCount() {
    for (::mlir::Value v : getExtras())
      if (::llvm::cast<::mlir::ShapedType>(v.getType()).getRank() == 0)
        return v;
    return {};
  }
  /// The whole vocabulary's logsumexp of every token (vocab-parallel), or null.
  ::mlir::Value getLse() {
    for (::mlir::Value v : getExtras())
      if (::llvm::cast<::mlir::ShapedType>(v.getType()).getRank() != 0)
        return v;
    return {};
  }
}];

def Parax_CrossEntropyOp : Parax_FunctionalOp<"cross_entropy"> {
  let summary = "mean token cross-entropy of logits against labels";
  let description = [{
    `mean_t(logsumexp(logits[t]) - logits[t, labels[t]])`, a scalar f32.

    ```mlir
    %l = parax.cross_entropy %logits, %labels : (tensor<2x16x256xf32>, tensor<2x16xi32>) -> tensor<f32>
    ```

    After partitioning with the tokens split over ranks (as the labels
    are), the local op sums its own tokens' terms over `num_tokens`, the
    `T` of the whole mean: a partial sum of the loss.

    With `ignore_index` (Hugging Face's -100: a prompt's or a padding's
    labels), a token whose label is `ignore_index` adds nothing and the
    mean is over the counted tokens: `count`, the number of labels that
    are not `ignore_index` (`parax.label_count`, every rank's tokens'),
    divides the sum (none counted: the loss is 0).

    ```mlir
    %n = parax.label_count %labels {ignore_index = -100 : i64} : (tensor<2x16xi32>) -> tensor<f32>
    %l = parax.cross_entropy %logits, %labels, %n {ignore_index = -100 : i64}
        : (tensor<2x16x256xf32>, tensor<2x16xi32>, tensor<f32>) -> tensor<f32>
    ```

    With `weight` (a multi-token prediction depth's share of the loss,
    DeepSeek-V3's λ / D), the loss times `weight`. A function's loss may be
    a sum of such losses (`parax.add`): the main cross-entropy and each
    depth's.

    Vocab-parallel (after partitioning with the logits split on their last
    dimension): the local op names the grid axes the vocabulary is split over
    (`vocab_grid`, `vocab_axes`; this rank's logits are the classes `c·V ..
    (c+1)·V - 1` for its coordinate `c` along them) and reads `lse`, every
    token's logsumexp over the whole vocabulary (`[..., 1]` f32: its
    `parax.logsumexp` over each rank's logits, gathered, then taken again).
    A token's term `lse - logit[label]` is added by the rank holding its
    label: the result is a partial sum over those axes, no logit moved.

    ```mlir
    %l = parax.cross_entropy %logits, %labels, %lse {vocab_grid = @g, vocab_axes = ["tp"], num_tokens = 32 : i64}
        : (tensor<2x16x128xf32>, tensor<2x16xi32>, tensor<2x16x1xf32>) -> tensor<f32>
    ```

    C1: `labels` has `logits`' shape without the last dimension. C2: the
    result is a rank-0 f32 tensor. C3: `num_tokens`, when present, is at
    least the logits' token count. C4: `count` (a rank-0 f32) is given with
    `ignore_index` and only then. C5: `weight`, when present, is a positive
    finite number. C6: after `labels`, at most a `count` and an `lse`, in
    that order; `lse` (the logits' shape with a last dimension of 1) is
    given with `vocab_grid` and `vocab_axes` and only then.
  }];
  let arguments = (ins Parax_FloatTensor:$logits, Parax_IndexTensor:$labels,
                       Variadic<TensorOf<[F32]>>:$extras,
                       OptionalAttr<I64Attr>:$num_tokens,
                       OptionalAttr<I64Attr>:$ignore_index,
                       OptionalAttr<F64Attr>:$weight,
                       OptionalAttr<FlatSymbolRefAttr>:$vocab_grid,
                       OptionalAttr<StrArrayAttr>:$vocab_axes);
  let results = (outs 0DTensorOf<[F32]>:$result);
  let extraClassDeclaration = crossEntropyOperands;
}

def Parax_LogSumExpOp : Parax_FunctionalOp<"logsumexp"> {
  let summary = "log of the sum of exponentials over the last dimension";
  let description = [{
    `result[..., 0] = log(sum_c exp(x[..., c]))` in f32 (shifted by the
    row's maximum). Vocab-parallel cross-entropy takes it twice: over each
    rank's logits, and over those gathered, the whole vocabulary's.

    ```mlir
    %p = parax.logsumexp %logits : (tensor<2x16x128xbf16>) -> tensor<2x16x1xf32>
    ```

    C1: the result is f32 of `x`'s shape with a last dimension of 1.
  }];
  let arguments = (ins Parax_FloatTensor:$x);
  let results = (outs TensorOf<[F32]>:$result);
}

def Parax_ShiftOp : Parax_FunctionalOp<"shift"> {
  let summary = "token ids or labels moved earlier along the sequence";
  let description = [{
    `result[b, s] = x[b, s + shift]` where `s + shift` is inside the
    sequence, `fill` at the last `shift` positions: the tokens `shift`
    positions ahead. Multi-token prediction (DeepSeek-V3 §2.2) reads the
    token after the next at depth 1: its module's input tokens are the
    inputs shifted by 1 (a filled position's loss is not counted), its
    labels the labels shifted by 1 with `fill` the loss's `ignore_index`.

    ```mlir
    %t = parax.shift %labels {shift = 1 : i64, fill = -100 : i64} : (tensor<2x16xi32>) -> tensor<2x16xi32>
    ```

    C1: `x` is [batch, sequence] and the result has its type. C2: `0 <
    shift < sequence`.
  }];
  let arguments = (ins Parax_IndexTensor:$x, I64Attr:$shift, I64Attr:$fill);
  let results = (outs Parax_IndexTensor:$result);
}

def Parax_LabelCountOp : Parax_FunctionalOp<"label_count"> {
  let summary = "how many labels the cross-entropy counts";
  let description = [{
    The number of `labels` that are not `ignore_index`, a scalar f32: the
    divisor of `parax.cross_entropy`'s mean with `ignore_index`. With the
    tokens split over ranks, each rank's count is a partial sum (all-reduced
    before the loss reads it).

    ```mlir
    %n = parax.label_count %labels {ignore_index = -100 : i64} : (tensor<2x16xi32>) -> tensor<f32>
    ```

    C1: the result is a rank-0 f32 tensor.
  }];
  let arguments = (ins Parax_IndexTensor:$labels, I64Attr:$ignore_index);
  let results = (outs 0DTensorOf<[F32]>:$result);
}


//===----------------------------------------------------------------------===//
// Gradients (written by --parax-autodiff)
//===----------------------------------------------------------------------===//

def Parax_CrossEntropyGradOp : Parax_FunctionalOp<"cross_entropy_grad"> {
  let summary = "gradient of the mean token cross-entropy by its logits";
  let description = [{
    `(softmax(logits[t]) - onehot(labels[t])) / T` for every token `t` of the
    `T` tokens: the gradient of `parax.cross_entropy` of the same operands
    (the loss itself the root, its gradient 1). After partitioning with the
    tokens split over ranks, the local op computes its own tokens' rows and
    `num_tokens` holds the `T` of the whole mean.

    ```mlir
    %d = parax.cross_entropy_grad %logits, %labels : (tensor<2x16x256xf32>, tensor<2x16xi32>) -> tensor<2x16x256xf32>
    ```

    With `ignore_index` and `count` (as `parax.cross_entropy`'s): 0 for
    an ignored token, the others divided by `count`. With `weight`: times
    `weight`.

    Vocab-parallel (`vocab_grid`, `vocab_axes`, `lse`: as
    `parax.cross_entropy`'s): `exp(logits - lse)`, less 1 at the label
    where this rank holds it.

    C1: `labels` has `logits`' shape without the last dimension. C2: the
    result has `logits`' type. C3: `num_tokens`, when present, is at least
    the logits' token count. C4: `count` (a rank-0 f32) is given with
    `ignore_index` and only then. C5: `weight`, when present, is a positive
    finite number. C6: as `parax.cross_entropy`'s.
  }];
  let arguments = (ins Parax_FloatTensor:$logits, Parax_IndexTensor:$labels,
                       Variadic<TensorOf<[F32]>>:$extras,
                       OptionalAttr<I64Attr>:$num_tokens,
                       OptionalAttr<I64Attr>:$ignore_index,
                       OptionalAttr<F64Attr>:$weight,
                       OptionalAttr<FlatSymbolRefAttr>:$vocab_grid,
                       OptionalAttr<StrArrayAttr>:$vocab_axes);
  let results = (outs Parax_FloatTensor:$result);
  let extraClassDeclaration = crossEntropyOperands;
}

def Parax_LinearWeightGradOp : Parax_FunctionalOp<"linear_weight_grad"> {
  let summary = "gradient of a linear layer by its weight";
  let description = [{
    For `y = parax.linear x, W`: `dW = xᵀ · dy` summed over every leading
    (token) dimension, `[in, out]`, or `[out, in]` with `transpose_w` (the
    weight's own layout). The gradient by `x` is a `parax.linear` of `dy`
    and `W` with `transpose_w` flipped; a bias's is a sum of `dy` over its
    tokens, not covered here.

    ```mlir
    %dw = parax.linear_weight_grad %x, %dy {transpose_w} : (tensor<2x16x64xf32>, tensor<2x16x128xf32>) -> tensor<128x64xf32>
    ```

    C1: `x` and `dy` have one rank (at least 2) and agree on every
    dimension but the last. C2: the result is `[in, out]` (`[out, in]` with
    `transpose_w`) of `x`'s element type.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$dy,
                       UnitAttr:$transpose_w);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_RmsNormGradOp : Parax_FunctionalOp<"rms_norm_grad"> {
  let summary = "gradient of RMSNorm by its input";
  let description = [{
    For `y = parax.rms_norm x, w`, with `r = 1 / sqrt(mean(x^2) + eps)` and
    `g = dy · (w + offset)` over the last dimension (`H` wide; `offset` as
    the norm's):
    `dx = r · g - x · r^3 · mean(g · x)`.

    ```mlir
    %dx = parax.rms_norm_grad %x, %w, %dy {eps = 1.0e-05 : f64} : (tensor<2x16x64xf32>, tensor<64xf32>, tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
    ```

    C1: `weight` is `[H]` with H = `x`'s last dimension. C2: `dy` and the
    result have `x`'s type. C3: `eps > 0`. C4: `offset`, when present, is
    finite.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$weight,
                       Parax_FloatTensor:$dy, F64Attr:$eps, OptionalAttr<F64Attr>:$offset);
  let results = (outs Parax_FloatTensor:$result);
  let builders = [
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$x, "::mlir::Value":$weight, "::mlir::Value":$dy, "::mlir::FloatAttr":$eps), [{
      build($_builder, $_state, result, x, weight, dy, eps, ::mlir::FloatAttr());
    }]>];
}

def Parax_RmsNormWeightGradOp : Parax_FunctionalOp<"rms_norm_weight_grad"> {
  let summary = "gradient of RMSNorm by its weight";
  let description = [{
    `dw = sum over tokens of dy · x · r`, `r = 1 / sqrt(mean(x^2) + eps)`
    per token: a `[H]` vector.

    ```mlir
    %dw = parax.rms_norm_weight_grad %x, %dy {eps = 1.0e-05 : f64} : (tensor<2x16x64xf32>, tensor<2x16x64xf32>) -> tensor<64xf32>
    ```

    C1: `dy` has `x`'s type. C2: the result is `[H]` of `x`'s element type.
    C3: `eps > 0`.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$dy, F64Attr:$eps);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_SwigluGradOp : Parax_FunctionalOp<"swiglu_grad"> {
  let summary = "gradient of swiglu by one of its operands";
  let description = [{
    For `y = silu(gate) · up`: with `operand = 0`, `dgate = dy · up ·
    silu'(gate)` (`silu'(g) = s + g · s · (1 - s)`, `s = sigmoid(g)`); with
    `operand = 1`, `dup = dy · silu(gate)`.

    ```mlir
    %dg = parax.swiglu_grad %gate, %up, %dy {operand = 0} : (tensor<2x16x128xf32>, tensor<2x16x128xf32>, tensor<2x16x128xf32>) -> tensor<2x16x128xf32>
    ```

    C1: `gate`, `up`, `dy` and the result have one type. C2: `operand` is 0
    or 1.
  }];
  let arguments = (ins Parax_FloatTensor:$gate, Parax_FloatTensor:$up,
                       Parax_FloatTensor:$dy, I64Attr:$operand);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_AttentionGradOp : Parax_FunctionalOp<"attention_grad"> {
  let summary = "gradient of attention by its queries, keys and values";
  let description = [{
    For `o = parax.attention q, k, v` with the same attributes, given `do`
    (`dout`): `dq`, `dk`, `dv`, of `q`'s, `k`'s and `v`'s types. With `P`
    the softmax of the scores: `dv = Pᵀ · do`, `dP = do · vᵀ`, `dS = P ·
    (dP - rowsum(dP · P))`, `dq = scale · dS · k`, `dk = scale · dSᵀ · q`,
    each KV head summing over the query heads that read it. The
    attributes mean what they mean on `parax.attention` (no run-time
    position: a training step has none).

    ```mlir
    %dq, %dk, %dv = parax.attention_grad %q, %k, %v, %do {causal, num_heads = 4, num_kv_heads = 2, head_dim = 16, scale = 0.25 : f64}
        : (tensor<2x16x4x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x4x16xf32>)
        -> (tensor<2x16x4x16xf32>, tensor<2x16x2x16xf32>, tensor<2x16x2x16xf32>)
    ```

    C1-C7, C9: as `parax.attention`'s, `dout` taking the place of its
    result. C10: `dq`, `dk`, `dv` have `q`'s, `k`'s and `v`'s types.
  }];
  let arguments = (ins Parax_FloatTensor:$q, Parax_FloatTensor:$k,
                       Parax_FloatTensor:$v, Parax_FloatTensor:$dout,
                       UnitAttr:$causal,
                       I64Attr:$num_heads, I64Attr:$num_kv_heads,
                       I64Attr:$head_dim, F64Attr:$scale,
                       OptionalAttr<FlatSymbolRefAttr>:$head_grid,
                       OptionalAttr<StrArrayAttr>:$head_axes,
                       OptionalAttr<FlatSymbolRefAttr>:$seq_grid,
                       OptionalAttr<StrArrayAttr>:$seq_axes,
                       UnitAttr:$seq_cyclic,
                       OptionalAttr<I64Attr>:$window,
                       OptionalAttr<F64Attr>:$softcap);
  let results = (outs Parax_FloatTensor:$dq, Parax_FloatTensor:$dk,
                      Parax_FloatTensor:$dv);
}

def Parax_EmbeddingGradOp : Parax_FunctionalOp<"embedding_grad"> {
  let summary = "gradient of an embedding lookup by its table";
  let description = [{
    For `h = parax.embedding ids, table`: `dtable[v] = sum of dy[t] over the
    tokens t with ids[t] = v` (rows no token reads are zero), of the
    table's shape `[V, H]`.

    ```mlir
    %dt = parax.embedding_grad %ids, %dy : (tensor<2x16xi32>, tensor<2x16x64xf32>) -> tensor<256x64xf32>
    ```

    After partitioning with the table's rows split (`vocab_grid`,
    `vocab_axes`, as `parax.embedding`'s), the local result holds rows `c·V
    ..` and ids outside them add nothing.

    With `scale` (the embedding's), each row of `dy` is multiplied by it.

    C1: the result has rank 2 and `dy` has `ids`' shape with the result's
    `H` appended. C2: `vocab_grid` and `vocab_axes` come together. C3:
    `scale`, when present, is finite and positive.
  }];
  let arguments = (ins Parax_IndexTensor:$ids, Parax_FloatTensor:$dy,
                       OptionalAttr<FlatSymbolRefAttr>:$vocab_grid,
                       OptionalAttr<StrArrayAttr>:$vocab_axes,
                       OptionalAttr<F64Attr>:$scale);
  let results = (outs Parax_FloatTensor:$result);
  let builders = [
    OpBuilder<(ins "::mlir::Type":$result, "::mlir::Value":$ids, "::mlir::Value":$dy, "::mlir::FlatSymbolRefAttr":$vocab_grid,
                   "::mlir::ArrayAttr":$vocab_axes), [{
      build($_builder, $_state, result, ids, dy, vocab_grid, vocab_axes, ::mlir::FloatAttr());
    }]>];
}

def Parax_SumToOp : Parax_FunctionalOp<"sum_to"> {
  let summary = "sum over the dimensions a broadcast would have added";
  let description = [{
    The gradient of a broadcast: `x` summed over every dimension where the
    result has size 1 (the result broadcasts to `x`'s shape). A linear's
    bias gradient (its output gradient summed over the tokens, then
    reshaped to `[out]`), a broadcast add's.

    ```mlir
    %db = parax.sum_to %dy : (tensor<2x16x64xf32>) -> tensor<1x1x64xf32>
    ```

    C1: the result has `x`'s rank and element type, and each of its
    dimensions is `x`'s or 1.
  }];
  let arguments = (ins Parax_FloatTensor:$x);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_GeluGradOp : Parax_Op<"gelu_grad"> {
  let summary = "gradient of GELU by its input";
  let description = [{
    `dy · gelu'(x)`, for the exact (`none`) or `tanh`-approximated GELU.

    ```mlir
    %dx = parax.gelu_grad tanh %x, %dy : (tensor<2x16x256xf32>, tensor<2x16x256xf32>) -> tensor<2x16x256xf32>
    ```

    C1: `x`, `dy` and the result have one type.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$dy,
                       Parax_GeluApproxAttr:$approximate);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = "`` $approximate $x `,` $dy attr-dict `:` functional-type(operands, results)";
}

def Parax_LayerNormGradOp : Parax_FunctionalOp<"layer_norm_grad"> {
  let summary = "gradient of LayerNorm by its input";
  let description = [{
    For `y = parax.layer_norm x, w, b`, with `x̂ = (x - mean) · r`, `r = 1 /
    sqrt(var + eps)` and `g = dy · w` over the last dimension:
    `dx = r · (g - mean(g) - x̂ · mean(g · x̂))`. (The bias's gradient is a
    `parax.sum_to` of `dy`.)

    ```mlir
    %dx = parax.layer_norm_grad %x, %w, %dy {eps = 1.0e-05 : f64} : (tensor<2x16x64xf32>, tensor<64xf32>, tensor<2x16x64xf32>) -> tensor<2x16x64xf32>
    ```

    C1: `weight` is `[H]` with H = `x`'s last dimension. C2: `dy` and the
    result have `x`'s type. C3: `eps > 0`.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$weight,
                       Parax_FloatTensor:$dy, F64Attr:$eps);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_LayerNormWeightGradOp : Parax_FunctionalOp<"layer_norm_weight_grad"> {
  let summary = "gradient of LayerNorm by its weight";
  let description = [{
    `dw = sum over tokens of dy · x̂`, `x̂` the normalised `x`: a `[H]`
    vector.

    ```mlir
    %dw = parax.layer_norm_weight_grad %x, %dy {eps = 1.0e-05 : f64} : (tensor<2x16x64xf32>, tensor<2x16x64xf32>) -> tensor<64xf32>
    ```

    C1: `dy` has `x`'s type. C2: the result is `[H]` of `x`'s element type.
    C3: `eps > 0`.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$dy, F64Attr:$eps);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_PositionEmbeddingGradOp : Parax_FunctionalOp<"position_embedding_grad"> {
  let summary = "gradient of a position embedding by its table";
  let description = [{
    For `p = parax.position_embedding table {offset}`: the table's
    gradient, `dy`'s rows at rows `offset ..` (as the forward op read them)
    and zeros elsewhere, of the table's shape `[P, H]`.

    ```mlir
    %dt = parax.position_embedding_grad %dy {offset = 0} : (tensor<1x16x64xf32>) -> tensor<128x64xf32>
    ```

    After partitioning with the sequence split, `seq_grid`/`seq_axes`/
    `seq_cyclic` place this rank's rows as `parax.position_embedding`'s do
    (the other rows zero: a partial sum over those axes).

    C1: `dy` is `[1, S, H]` and the result `[P, H]` of its element type.
    C2: `offset >= 0` and `offset + S <= P` (`offset + N·S <= P` with
    `seq_axes`). C3: `seq_grid` and `seq_axes` come together and name axes
    of a grid.
  }];
  let arguments = (ins Parax_FloatTensor:$dy,
                       DefaultValuedAttr<I64Attr, "0">:$offset,
                       OptionalAttr<FlatSymbolRefAttr>:$seq_grid,
                       OptionalAttr<StrArrayAttr>:$seq_axes,
                       UnitAttr:$seq_cyclic);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_SoftcapGradOp : Parax_FunctionalOp<"softcap_grad"> {
  let summary = "gradient of soft-capping by its input";
  let description = [{
    `dy · (1 - tanh(x / cap)^2)`.

    ```mlir
    %dx = parax.softcap_grad %x, %dy {cap = 30.0 : f64} : (tensor<2x16x256xf32>, tensor<2x16x256xf32>) -> tensor<2x16x256xf32>
    ```

    C1: `x`, `dy` and the result have one type. C2: `cap` is finite and
    positive.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$dy, F64Attr:$cap);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_SigmoidGradOp : Parax_FunctionalOp<"sigmoid_grad"> {
  let summary = "gradient of the logistic sigmoid by its input";
  let description = [{
    `dy · s · (1 - s)` with `s = sigmoid(x)`.

    ```mlir
    %dx = parax.sigmoid_grad %x, %dy : (tensor<2x16x1xf32>, tensor<2x16x1xf32>) -> tensor<2x16x1xf32>
    ```

    C1: `x`, `dy` and the result have one type.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$dy);
  let results = (outs Parax_FloatTensor:$result);
}

def Parax_RouterGradOp : Parax_Op<"router_grad"> {
  let summary = "gradient of the MoE router's weights by its logits";
  let description = [{
    For `%w, %i = parax.router x, gate[, bias]` with the same attributes,
    given `dweights` (the gradient of `%w`): the gradient of the loss by the
    router's logits `x · gateᵀ`, `[..., num_experts]`. The choice of
    experts is made again as the router made it (the indices get no
    gradient; neither does the correction bias, used for the choice only).
    With `S` the sum of the chosen scores and `c` the scaling factor, a
    chosen expert `e = i[j]` gets `ds_e = c · (dw_j / S - Σ_k dw_k · s_{i[k]}
    / S²)` when `normalize`, else `c · dw_j`; the others 0. Then through the
    scores: softmax `dl = s · (ds - Σ_e ds_e · s_e)`, sigmoid `dl = ds · s ·
    (1 - s)`. The gradients by `x` and `gate` are a `parax.linear` of `dl`
    and `gate`, and a `parax.linear_weight_grad` of `x` and `dl`.

    ```mlir
    %dl = parax.router_grad softmax %x, %g, %dw {num_experts = 8, top_k = 2, normalize}
        : (tensor<2x16x64xf32>, tensor<8x64xf32>, tensor<2x16x2xf32>) -> tensor<2x16x8xf32>
    ```

    C1-C3, C5: as `parax.router`'s. C4: `dweights` has `x`'s shape with the
    last dimension replaced by `top_k`; the result has `x`'s shape with the
    last dimension replaced by `num_experts`, and `x`'s element type.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$gate,
                       Parax_FloatTensor:$dweights,
                       Optional<Parax_FloatTensor>:$bias,
                       Parax_ScoreFuncAttr:$score_func,
                       I64Attr:$num_experts, I64Attr:$top_k,
                       UnitAttr:$normalize,
                       DefaultValuedAttr<F64Attr, "1.0">:$scaling_factor,
                       DefaultValuedAttr<I64Attr, "1">:$num_groups,
                       DefaultValuedAttr<I64Attr, "1">:$topk_groups,
                       DefaultValuedAttr<F64Attr, "0.0">:$aux_loss_coef,
                       UnitAttr:$sequence_aux);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = [{
    `` $score_func $x `,` $gate `,` $dweights (`,` $bias^)? attr-dict `:` functional-type(operands, results)
  }];
}

def Parax_RouterLoadOp : Parax_Op<"router_load"> {
  let summary = "how many routed choices each expert receives";
  let description = [{
    For `parax.router x, gate[, bias]` with the same attributes: `load[e]`,
    the number of (token, choice) pairs routed to expert e, as a float
    vector `[num_experts]` (the choice made again); with `scores`, the sum
    of the tokens' scores of expert e instead (the load-balancing loss's
    `P_e` times the tokens). Summed over tokens: with the tokens split over
    ranks, a partial sum (the load-balancing loss needs every token's, so
    it is all-reduced).

    Per sequence, with a result `[B, num_experts]` for `x` `[B, S, H]`:
    row b counts sequence b's tokens alone (the sequence-wise balance
    loss's), and with `scores` sums their normalised scores `s_e / Σ_j s_j`
    (the same as the scores under softmax). With a sequence split over
    ranks, a partial sum over the axes that split it.

    ```mlir
    %l = parax.router_load softmax %x, %g {num_experts = 8, top_k = 2}
        : (tensor<2x16x64xf32>, tensor<8x64xf32>) -> tensor<8xf32>
    ```

    C1-C3, C5: as `parax.router`'s. C4: the result is `[num_experts]` or,
    for `x` of rank 3, `[B, num_experts]`, of f32 (counts beyond bf16's
    exact integers).
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$gate,
                       Optional<Parax_FloatTensor>:$bias,
                       Parax_ScoreFuncAttr:$score_func,
                       I64Attr:$num_experts, I64Attr:$top_k,
                       UnitAttr:$normalize,
                       DefaultValuedAttr<F64Attr, "1.0">:$scaling_factor,
                       DefaultValuedAttr<I64Attr, "1">:$num_groups,
                       DefaultValuedAttr<I64Attr, "1">:$topk_groups,
                       UnitAttr:$scores);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = [{
    `` $score_func $x `,` $gate (`,` $bias^)? attr-dict `:` functional-type(operands, results)
  }];
}

def Parax_BalanceLossOp : Parax_Op<"balance_loss"> {
  let summary = "the MoE load-balancing loss's value";
  let description = [{
    `coefficient · E · Σ_e (load_e / T) · (scores_e / T)` with `load` the
    routed choices per expert and `scores` the sums of the experts' scores
    (`parax.router_load` without and with `scores`, every row's) over the
    `T = num_tokens` rows: transformers' `load_balancing_loss_func` for
    Mixtral and Qwen2-MoE, weighted. A scalar f32, added by
    `--parax-autodiff` to the cross-entropy it returns.

    Per sequence (`load` and `scores` `[B, num_experts]`, a row a sequence
    of `T = num_tokens` tokens): the mean over the `num_sequences`
    sequences (every rank's) of each row's loss, `coefficient · E ·
    Σ_b Σ_e (load_be / T) · (scores_be / T) / num_sequences`; with the
    sequences split over ranks, each rank's rows give a partial sum.
    DeepSeek-V3's sequence-wise loss is this with `coefficient = α /
    top_k`.

    ```mlir
    %b = parax.balance_loss %load, %scores {coefficient = 0.02, num_experts = 8, num_tokens = 32}
        : (tensor<8xf32>, tensor<8xf32>) -> tensor<f32>
    ```

    C1: `load` and `scores` are `[num_experts]` or `[B, num_experts]`
    alike, of f32. C2: the result is a rank-0 f32 tensor. C3:
    `coefficient >= 0`, `num_tokens > 0`, `num_sequences > 0`.
  }];
  let arguments = (ins TensorOf<[F32]>:$load, TensorOf<[F32]>:$scores,
                       I64Attr:$num_experts, F64Attr:$coefficient,
                       I64Attr:$num_tokens,
                       DefaultValuedAttr<I64Attr, "1">:$num_sequences);
  let results = (outs TensorOf<[F32]>:$result);
  let assemblyFormat = [{
    $load `,` $scores attr-dict `:` functional-type(operands, results)
  }];
}

def Parax_RouterAuxGradOp : Parax_Op<"router_aux_grad"> {
  let summary = "gradient of the MoE load-balancing loss by the router's logits";
  let description = [{
    For the loss `coefficient · E · Σ_e (load_e / T) · P_e`, with `P_e =
    (1 / T) Σ_t s_te` the mean of the routers' scores `s = softmax(x ·
    gateᵀ)` (or sigmoid) over the `T = num_tokens` rows and `load` the
    routed choices per expert (`parax.router_load`, every row's): with
    `g_e = coefficient · E · load_e / T²`, the gradient by token t's logits,
    `s_t · (g - Σ_e g_e · s_te)` (softmax) or `g · s_t · (1 - s_t)`
    (sigmoid), `[..., num_experts]`. `--parax-autodiff` balances every
    layer's routers together, as transformers' `load_balancing_loss_func`
    does: `load` sums their loads and `T` counts layers × tokens. After
    partitioning with the tokens split, each rank computes its tokens'
    rows; `num_tokens` stays the whole's.

    Per sequence (`x` `[B, S, H]`, `load` `[B, num_experts]`: each
    sequence's choices, `T = num_tokens` its tokens, `N = num_sequences`
    every rank's sequences): the loss is `parax.balance_loss`'s per
    sequence form over the normalised scores `s' = s / Σ_j s_j`; with
    `g_be = coefficient · E · load_be / (T² · N)`, token t of sequence b
    gets `(g_b - Σ_e g_be · s'_te) / Σ_j s_tj` by its scores, then through
    the sigmoid (`s · (1 - s)`); under softmax (`s' = s`) as above.

    ```mlir
    %d = parax.router_aux_grad softmax %x, %g, %load {num_experts = 8, coefficient = 0.02, num_tokens = 32}
        : (tensor<2x16x64xf32>, tensor<8x64xf32>, tensor<8xf32>) -> tensor<2x16x8xf32>
    ```

    C1: `gate` is `[num_experts, H]`, `load` `[num_experts]` or, for `x`
    `[B, S, H]`, `[B, num_experts]` (f32). C2: the result
    has `x`'s shape with the last dimension `num_experts`, and `x`'s
    element type. C3: `coefficient >= 0`, `num_tokens > 0`,
    `num_sequences > 0`.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$gate,
                       TensorOf<[F32]>:$load,
                       Parax_ScoreFuncAttr:$score_func,
                       I64Attr:$num_experts, F64Attr:$coefficient,
                       I64Attr:$num_tokens,
                       DefaultValuedAttr<I64Attr, "1">:$num_sequences);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = [{
    `` $score_func $x `,` $gate `,` $load attr-dict `:` functional-type(operands, results)
  }];
}

def Parax_ExpertsGradOp : Parax_FunctionalOp<"experts_grad", [], ["getBytesRead"]> {
  let summary = "gradient of the routed experts by their inputs and weights";
  let description = [{
    For `y = parax.experts x, weights, indices, w_gate, w_up, w_down`, given
    `dy`: for every (token t, choice j) with expert `e = indices[t, j]` (and
    `g = gate_e(x[t])`, `u = up_e(x[t])`, `a = silu(g) · u`, `o =
    down_e(a)`), `dweights[t, j] = dy[t] · o`; with `do = weights[t, j] ·
    dy[t]`: `dw_down[e] += do ⊗ a`, `da = do · w_down[e]`, `dg = da · u ·
    silu'(g)`, `du = da · silu(g)`, `dw_gate[e] += dg ⊗ x[t]`, `dw_up[e] +=
    du ⊗ x[t]`, `dx[t] += dg · w_gate[e] + du · w_up[e]`. A choice outside
    `0 .. E-1` (an unused row after `moe_dispatch`) contributes nothing;
    an expert no token chose gets zero gradients.

    ```mlir
    %dx, %dw, %dg, %du, %dd = parax.experts_grad %x, %w, %i, %wg, %wu, %wd, %dy
        : (tensor<2x16x64xf32>, tensor<2x16x2xf32>, tensor<2x16x2xi32>,
           tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32>, tensor<2x16x64xf32>)
        -> (tensor<2x16x64xf32>, tensor<2x16x2xf32>, tensor<8x96x64xf32>, tensor<8x96x64xf32>, tensor<8x64x96xf32>)
    ```

    C1, C2: as `parax.experts`'. C3: `dy` has `x`'s type; the results have
    the types of `x`, `weights`, `w_gate`, `w_up` and `w_down`.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$weights,
                       Parax_IndexTensor:$indices, Parax_FloatTensor:$w_gate,
                       Parax_FloatTensor:$w_up, Parax_FloatTensor:$w_down,
                       Parax_FloatTensor:$dy);
  let results = (outs Parax_FloatTensor:$dx, Parax_FloatTensor:$dweights,
                      Parax_FloatTensor:$dw_gate, Parax_FloatTensor:$dw_up,
                      Parax_FloatTensor:$dw_down);
}

//===----------------------------------------------------------------------===//
// Communication (per-rank programs after --parax-partition)
//===----------------------------------------------------------------------===//

// A collective over the ranks that differ only in `axes` of `grid`; every
// rank of such a group runs the op on its local tensor. "P" below is the
// product of the sizes of `axes`.
class Parax_CommOp<string mnemonic, list<Trait> traits = []>
    : Op<Parax_Dialect, mnemonic,
         !listconcat(traits, [DeclareOpInterfaceMethods<SymbolUserOpInterface>,
                              DeclareOpInterfaceMethods<Parax_CostOpInterface>])> {
  code commonDeclaration = [{
    /// Product of the sizes of `axes` in `grid` (0 if the grid is unknown).
    int64_t getGroupSize(::mlir::SymbolTableCollection &symbols);
  }];
  let extraClassDeclaration = commonDeclaration;
}

def Parax_AllReduceOp : Parax_CommOp<"all_reduce"> {
  let summary = "sum over a group of ranks";
  let description = [{
    Every rank receives the sum of all ranks' `x`: turns a partial sum over
    `axes` into a whole value.

    ```mlir
    %y = parax.all_reduce %x over @g ["tp"] : tensor<2x16x64xf32> -> tensor<2x16x64xf32>
    ```

    C1: `grid` names a `parax.grid`; `axes` are distinct axes of it, in
    the grid's order (a group's ranks are ordered major to minor, as the
    grid's axes are). C2: the result type equals the operand type.
  }];
  let arguments = (ins Parax_FloatTensor:$x, FlatSymbolRefAttr:$grid,
                       StrArrayAttr:$axes);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = "$x `over` $grid $axes attr-dict `:` type($x) `->` type($result)";
}

def Parax_AllGatherOp : Parax_CommOp<"all_gather"> {
  let summary = "concatenate the ranks' pieces along a dimension";
  let description = [{
    Rank order along `axes` (major to minor) is the order of the pieces.

    ```mlir
    %y = parax.all_gather %x over @g ["tp"] dim 2 : tensor<2x16x16xf32> -> tensor<2x16x64xf32>
    ```

    C1: as all_reduce. C2: the result equals `x` except along `dim`, where
    it is P times larger.
  }];
  let arguments = (ins Parax_FloatTensor:$x, FlatSymbolRefAttr:$grid,
                       StrArrayAttr:$axes, I64Attr:$dim);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = "$x `over` $grid $axes `dim` $dim attr-dict `:` type($x) `->` type($result)";
}

def Parax_ReduceScatterOp : Parax_CommOp<"reduce_scatter"> {
  let summary = "sum over a group, each rank keeping its piece";
  let description = [{
    ```mlir
    %y = parax.reduce_scatter %x over @g ["tp"] dim 1 : tensor<2x16x64xf32> -> tensor<2x4x64xf32>
    ```

    C1: as all_reduce. C2: the result equals `x` except along `dim`, where
    it is P times smaller (`x`'s extent divisible by P).
  }];
  let arguments = (ins Parax_FloatTensor:$x, FlatSymbolRefAttr:$grid,
                       StrArrayAttr:$axes, I64Attr:$dim);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = "$x `over` $grid $axes `dim` $dim attr-dict `:` type($x) `->` type($result)";
}

def Parax_AllToAllOp : Parax_CommOp<"all_to_all"> {
  let summary = "re-split: scatter along one dimension, gather along another";
  let description = [{
    Each rank splits `x` into P pieces along `split_dim`, sends piece i to
    rank i of the group, and concatenates what it receives along
    `concat_dim`.

    ```mlir
    %y = parax.all_to_all %x over @g ["tp"] split 2 concat 1 : tensor<2x4x64xf32> -> tensor<2x16x16xf32>
    ```

    C1: as all_reduce. C2: `split_dim` != `concat_dim`; the result equals `x`
    except: `split_dim` P times smaller, `concat_dim` P times larger.
  }];
  let arguments = (ins Parax_FloatTensor:$x, FlatSymbolRefAttr:$grid,
                       StrArrayAttr:$axes, I64Attr:$split_dim, I64Attr:$concat_dim);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = [{
    $x `over` $grid $axes `split` $split_dim `concat` $concat_dim attr-dict `:` type($x) `->` type($result)
  }];
}

def Parax_ShardSliceOp : Parax_CommOp<"shard_slice", [Pure]> {
  let summary = "keep this rank's piece of a replicated value (no communication)";
  let description = [{
    The piece at this rank's coordinate along `axes` (major to minor) of the
    `P` equal pieces of `x` along `dim`.

    ```mlir
    %y = parax.shard_slice %x over @g ["tp"] dim 2 : tensor<2x16x64xf32> -> tensor<2x16x16xf32>
    ```

    C1: as all_reduce. C2: as reduce_scatter. `x` may be integer (labels
    dealt out over the ranks that split their tokens).
  }];
  let arguments = (ins Parax_DataTensor:$x, FlatSymbolRefAttr:$grid,
                       StrArrayAttr:$axes, I64Attr:$dim);
  let results = (outs Parax_DataTensor:$result);
  let assemblyFormat = "$x `over` $grid $axes `dim` $dim attr-dict `:` type($x) `->` type($result)";
}

def Parax_ToPartialOp : Parax_CommOp<"to_partial", [Pure]> {
  let summary = "view a replicated value as a partial sum (no communication)";
  let description = [{
    The rank at coordinate 0 along `axes` keeps `x`, the others hold zeros,
    so the sum over the group is `x` (a bias added before the all-reduce of a
    row-parallel linear).

    ```mlir
    %y = parax.to_partial %b over @g ["tp"] : tensor<64xf32> -> tensor<64xf32>
    ```

    C1: as all_reduce. C2: the result type equals the operand type.
  }];
  let arguments = (ins Parax_FloatTensor:$x, FlatSymbolRefAttr:$grid,
                       StrArrayAttr:$axes);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = "$x `over` $grid $axes attr-dict `:` type($x) `->` type($result)";
}

def Parax_MoeDispatchOp : Parax_CommOp<"moe_dispatch"> {
  let summary = "expert parallelism: send each routed token to its expert's rank";
  let description = [{
    The `num_experts` experts are spread over the `P` ranks of `axes`, rank
    r owning experts `r·E/P .. (r+1)·E/P - 1`. Every (token t, choice j)
    with expert `e = indices[t, j]` goes to e's rank with its router weight
    `weights[t, j]` (an all-to-all of the routed rows only). The receiver's
    `R` rows hold what arrives, rank 0's rows first, then rank 1's..., each
    rank's in (token, choice) order, then unused rows: `rows[R, H]`,
    `row_weights[R, 1]`, and `row_experts[R, 1]` (the local expert index, -1
    for an unused row). Every rank's T·k pairs could choose one rank's
    experts: R = P·T·k holds any routing; a smaller R (the plan's expert
    capacity, `capacity=` in the workload) holds less memory, and a step
    that routes more than R rows to a rank stops with an error naming the
    rank and the counts. Dropless either way: no token is ever dropped, so
    the result equals the unsharded experts.

    ```mlir
    %r, %rw, %re = parax.moe_dispatch %x, %w, %i over @g ["ep"] {num_experts = 8}
        : (tensor<2x8x64xf32>, tensor<2x8x2xf32>, tensor<2x8x2xi32>)
        -> (tensor<128x64xf32>, tensor<128x1xf32>, tensor<128x1xi32>)
    ```

    C1: as all_reduce. C2: `num_experts` divides by P. C3: `weights` and
    `indices` have `x`'s leading shape and one `k`; with T tokens, the results
    are `[R, H]`, `[R, 1]` (x's element type) and `[R, 1]` (i32), T·k ≤ R ≤
    P·T·k.
  }];
  let arguments = (ins Parax_FloatTensor:$x, Parax_FloatTensor:$weights,
                       StaticShapeTensorOf<[I32]>:$indices,
                       FlatSymbolRefAttr:$grid, StrArrayAttr:$axes,
                       I64Attr:$num_experts);
  let results = (outs Parax_FloatTensor:$rows, Parax_FloatTensor:$row_weights,
                      StaticShapeTensorOf<[I32]>:$row_experts);
  let assemblyFormat = [{
    $x `,` $weights `,` $indices `over` $grid $axes attr-dict `:`
    `(` type($x) `,` type($weights) `,` type($indices) `)` `->`
    `(` type($rows) `,` type($row_weights) `,` type($row_experts) `)`
  }];
}

def Parax_MoeCombineOp : Parax_CommOp<"moe_combine"> {
  let summary = "expert parallelism: return expert outputs and sum per token";
  let description = [{
    The inverse all-to-all of `moe_dispatch`: the rows that arrived go back
    to the ranks they came from, and each token's `k` rows (already scaled by their
    router weights) are summed into the token. `indices` are the token's
    expert choices, as given to the dispatch. With `per_choice`, the rows
    are not summed: the result is `[..., k, H]`, row (t, j) in place (the
    backward pass returns each choice's router-weight gradient so).

    ```mlir
    %y = parax.moe_combine %rows, %i over @g ["ep"] {num_experts = 8}
        : (tensor<128x64xf32>, tensor<2x8x2xi32>) -> tensor<2x8x64xf32>
    ```

    C1: as all_reduce. C2: `num_experts` divides by P. C3: with `indices` of
    T tokens and k choices, `rows` is `[R, H]`, T·k ≤ R ≤ P·T·k (the
    dispatch's R, its rows in its order), and the result is
    `indices`' leading shape with `H` appended (`indices`' shape with `H`
    appended with `per_choice`).
  }];
  let arguments = (ins Parax_FloatTensor:$rows, StaticShapeTensorOf<[I32]>:$indices,
                       FlatSymbolRefAttr:$grid, StrArrayAttr:$axes,
                       I64Attr:$num_experts, UnitAttr:$per_choice);
  let results = (outs Parax_FloatTensor:$result);
  let assemblyFormat = [{
    $rows `,` $indices `over` $grid $axes attr-dict `:` `(` type($rows) `,`
    type($indices) `)` `->` type($result)
  }];
}

def Parax_SendOp : Parax_CommOp<"send"> {
  let summary = "send a tensor to the rank at another coordinate of one axis";
  let description = [{
    The peer has this rank's coordinates except `peer` along the single axis
    in `axes` (a pipeline stage boundary: axis `pp`).

    ```mlir
    parax.send %h over @g ["pp"] to 1 : tensor<2x16x64xf32>
    ```

    C1: as all_reduce, with exactly one axis. C2: `0 <= peer < size`.
  }];
  let arguments = (ins AnyRankedTensor:$x, FlatSymbolRefAttr:$grid,
                       StrArrayAttr:$axes, I64Attr:$peer);
  let assemblyFormat = "$x `over` $grid $axes `to` $peer attr-dict `:` type($x)";
}

def Parax_RecvOp : Parax_CommOp<"recv"> {
  let summary = "receive a tensor from the rank at another coordinate of one axis";
  let description = [{
    ```mlir
    %h = parax.recv over @g ["pp"] from 0 : tensor<2x16x64xf32>
    ```

    C1: as all_reduce, with exactly one axis. C2: `0 <= peer < size`.
  }];
  let arguments = (ins FlatSymbolRefAttr:$grid, StrArrayAttr:$axes, I64Attr:$peer);
  let results = (outs AnyRankedTensor:$result);
  let assemblyFormat = "`over` $grid $axes `from` $peer attr-dict `:` type($result)";
}

#endif // PARAX_DIALECT_PARAX_IR_PARAXOPS_TD
