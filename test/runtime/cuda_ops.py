"""One-op programs: each CUDA kernel against the CPU backend, op by op, with
the shapes that stress it (rows wider than a block, several key tiles,
partial and interleaved RoPE, grouped heads, Dv != Dqk, broadcasts, groups
in the router, a label outside the vocabulary...). cuda_cases.py prepares
and checks them with the model cases.

Each entry: name -> (function arguments, body, result type, values), where
an argument is (name, type, param) -- param names a checkpoint tensor, else
the argument is an input -- and `values` maps an argument to a generator
kind ("normal", "ids:V", "experts:E" for router indices, "ones",
"position:P" for a generation step's run-time position P, "nan-rows:I,J"
for normal values with rows I, J (the last dimension's vectors) NaN,
"huge-rows:I,J" with those rows times 1e25).
"""

import re

import numpy as np

from parax.checkpoint import round_to_bf16

F = "f32"


def t(*shape, elem=F):
    return "tensor<" + "x".join(str(s) for s in shape) + ("x" if shape else "") + elem + ">"


OPS = {
    "embedding": (
        [("ids", t(2, 5, elem="i32"), None), ("table", t(300, 40), "table")],
        "parax.embedding %ids, %table", t(2, 5, 40), {"ids": "ids:300"}),
    "position_embedding": (
        [("table", t(64, 40), "table")],
        "parax.position_embedding %table {offset = 7 : i64}", t(1, 5, 40), {}),
    "linear": (
        [("x", t(3, 5, 70), None), ("w", t(70, 90), "w")],
        "parax.linear %x, %w", t(3, 5, 90), {}),
    # A few rows (a decode step's, at most 8): fewRowsLinearKernel reads
    # each byte of W once over splits of k -- 3 rows, 264 columns (the
    # third tile of 128 fp32 columns, the second of 256 bf16 ones,
    # partial), k = 610 in 4 uneven splits of 153 rows (not a multiple of
    # the 8 warps'); 8 rows with a bias; 9 rows (cuBLAS again). (Its W
    # kept small: the GPU bundle carries every case's weights.)
    "linear-few-rows": (
        [("x", t(1, 3, 610), None), ("w", t(610, 264), "w")],
        "parax.linear %x, %w", t(1, 3, 264), {}),
    "linear-few-rows-bias": (
        [("x", t(8, 1, 96), None), ("w", t(96, 40), "w"), ("b", t(40), "b")],
        "parax.linear %x, %w, %b", t(8, 1, 40), {}),
    # The same with W stored [n, k] (a Hugging Face projection's layout,
    # every model's): 5 rows, a bias, 70 columns (a partial block of 32 and
    # warp of 4), k = 600 (the lanes' third step of 256 bf16 values partial).
    "linear-few-rows-transposed-bias": (
        [("x", t(5, 1, 600), None), ("w", t(70, 600), "w"), ("b", t(70), "b")],
        "parax.linear %x, %w, %b {transpose_w}", t(5, 1, 70), {}),
    "linear-nine-rows": (
        [("x", t(9, 1, 64), None), ("w", t(64, 48), "w")],
        "parax.linear %x, %w", t(9, 1, 48), {}),
    "linear-transposed-bias": (
        [("x", t(3, 5, 70), None), ("w", t(90, 70), "w"), ("b", t(90), "b")],
        "parax.linear %x, %w, %b {transpose_w}", t(3, 5, 90), {}),
    # A linear per head (multi-head latent attention's absorbed form): 5
    # heads' rows 5 * 40 apart, each through its own weight.
    "head_linear": (
        [("x", t(3, 2, 5, 40), None), ("w", t(5, 40, 24), "w")],
        "parax.head_linear %x, %w", t(3, 2, 5, 24), {}),
    "head_linear-transposed": (
        [("x", t(2, 1, 6, 48), None), ("w", t(6, 20, 48), "w")],
        "parax.head_linear %x, %w {transpose_w}", t(2, 1, 6, 20), {}),
    "rms_norm-wide": (  # a row wider than a block of 256 threads
        [("x", t(3, 700), None), ("w", t(700), "w")],
        "parax.rms_norm %x, %w {eps = 1.0e-06 : f64}", t(3, 700), {}),
    "layer_norm-odd": (
        [("x", t(4, 3, 37), None), ("w", t(37), "w"), ("b", t(37), "b")],
        "parax.layer_norm %x, %w, %b {eps = 1.0e-05 : f64}", t(4, 3, 37), {}),
    # Rows of 1e25s (a diverging run's, or a damaged weight's): their
    # squares overflow fp32, so the statistics are summed in double, as on
    # the CPU (in fp32 the GPU normalised such a row to 0).
    "rms_norm-huge": (
        [("x", t(3, 700), None), ("w", t(700), "w")],
        "parax.rms_norm %x, %w {eps = 1.0e-06 : f64}", t(3, 700), {"x": "huge-rows:1"}),
    "layer_norm-huge": (
        [("x", t(4, 3, 37), None), ("w", t(37), "w"), ("b", t(37), "b")],
        "parax.layer_norm %x, %w, %b {eps = 1.0e-05 : f64}", t(4, 3, 37), {"x": "huge-rows:0,5"}),
    "rope-partial-offset": (
        [("x", t(2, 6, 3, 16), None)],
        "parax.rope %x {theta = 10000.0 : f64, rotary_dim = 8, position_offset = 1000}",
        t(2, 6, 3, 16), {}),
    "rope-interleaved-llama3": (
        [("x", t(1, 9, 2, 32), None)],
        'parax.rope %x {theta = 500000.0 : f64, rotary_dim = 32, interleaved, position_offset = 3,'
        ' scaling = {rope_type = "llama3", factor = 8.0 : f64, low_freq_factor = 1.0 : f64,'
        ' high_freq_factor = 4.0 : f64, original_max_position_embeddings = 16 : i64}}',
        t(1, 9, 2, 32), {}),
    "attention-gqa-tiles": (  # 300 keys: three 128-key tiles; 6 heads over 2 KV heads
        [("q", t(1, 300, 6, 16), None), ("k", t(1, 300, 2, 16), None), ("v", t(1, 300, 2, 16), None)],
        "parax.attention %q, %k, %v {causal, head_dim = 16 : i64, num_heads = 6 : i64,"
        " num_kv_heads = 2 : i64, scale = 0.25 : f64}", t(1, 300, 6, 16), {}),
    "attention-full-dv": (  # not causal; value width differs from query width
        [("q", t(2, 7, 4, 24), None), ("k", t(2, 7, 4, 24), None), ("v", t(2, 7, 4, 16), None)],
        "parax.attention %q, %k, %v {head_dim = 24 : i64, num_heads = 4 : i64,"
        " num_kv_heads = 4 : i64, scale = 0.2 : f64}", t(2, 7, 4, 16), {}),
    "attention-wide-heads": (  # 512-wide heads: smaller tiles to fit shared memory
        [("q", t(1, 5, 2, 512), None), ("k", t(1, 5, 2, 512), None), ("v", t(1, 5, 2, 512), None)],
        "parax.attention %q, %k, %v {causal, head_dim = 512 : i64, num_heads = 2 : i64,"
        " num_kv_heads = 2 : i64, scale = 0.04 : f64}", t(1, 5, 2, 512), {}),
    # DeepSeek-V3's latent attention at its widths, as its absorbed form
    # reads it: one KV head of 576-wide keys whose first 512 channels are
    # the values (v is k, value_dim), in the split decode kernel: 16 heads
    # (a TP8 rank's) in one block of rows; all 128 in blocks of rows that
    # fit shared memory, each reading the keys once. 20 queries (a prefill
    # chunk) in the tiled kernels (bf16: tensor cores).
    "attention-latent-decode-16-heads": (
        [("q", t(1, 1, 16, 576), None), ("k", t(1, 300, 1, 576), None)],
        "parax.attention %q, %k, %k {causal, head_dim = 576 : i64, num_heads = 16 : i64,"
        " num_kv_heads = 1 : i64, scale = 0.07 : f64, value_dim = 512 : i64}", t(1, 1, 16, 512), {}),
    "attention-latent-decode-128-heads": (
        [("q", t(1, 1, 128, 576), None), ("k", t(1, 90, 1, 576), None)],
        "parax.attention %q, %k, %k {causal, head_dim = 576 : i64, num_heads = 128 : i64,"
        " num_kv_heads = 1 : i64, scale = 0.07 : f64, value_dim = 512 : i64}", t(1, 1, 128, 512), {}),
    "attention-latent-chunk": (
        [("q", t(1, 20, 4, 96), None), ("k", t(1, 20, 1, 96), None)],
        "parax.attention %q, %k, %k {causal, head_dim = 96 : i64, num_heads = 4 : i64,"
        " num_kv_heads = 1 : i64, scale = 0.1 : f64, value_dim = 64 : i64}", t(1, 20, 4, 64), {}),
    # 3 queries of 40 heads over one KV head: 120 rows, two blocks of 64
    # (the second starting at the query in position 1).
    "attention-decode-row-blocks": (
        [("q", t(2, 3, 40, 32), None), ("k", t(2, 150, 1, 32), None), ("v", t(2, 150, 1, 24), None)],
        "parax.attention %q, %k, %v {causal, head_dim = 32 : i64, num_heads = 40 : i64,"
        " num_kv_heads = 1 : i64, scale = 0.15 : f64}", t(2, 3, 40, 24), {}),
    # A few queries over many keys: split over the keys (flash-decoding).
    "attention-decode-split": (  # 700 keys: 11 chunks; 8 heads over 2 KV heads in one block each
        [("q", t(2, 1, 8, 16), None), ("k", t(2, 700, 2, 16), None), ("v", t(2, 700, 2, 16), None)],
        "parax.attention %q, %k, %v {causal, head_dim = 16 : i64, num_heads = 8 : i64,"
        " num_kv_heads = 2 : i64, scale = 0.25 : f64}", t(2, 1, 8, 16), {}),
    "attention-decode-masked-chunk": (  # 4 queries, 129 keys: the last chunk (key 128)
        # is masked for the first three
        [("q", t(1, 4, 4, 32), None), ("k", t(1, 129, 4, 32), None), ("v", t(1, 129, 4, 32), None)],
        "parax.attention %q, %k, %v {causal, head_dim = 32 : i64, num_heads = 4 : i64,"
        " num_kv_heads = 4 : i64, scale = 0.17 : f64}", t(1, 4, 4, 32), {}),
    "attention-decode-full-dv": (  # not causal; value width differs
        [("q", t(2, 2, 4, 24), None), ("k", t(2, 100, 2, 24), None), ("v", t(2, 100, 2, 16), None)],
        "parax.attention %q, %k, %v {head_dim = 24 : i64, num_heads = 4 : i64,"
        " num_kv_heads = 2 : i64, scale = 0.2 : f64}", t(2, 2, 4, 16), {}),
    # A generation step's ops at a run-time position (a device scalar): the
    # keys and cache rows past it are noise no kernel may read.
    "rope-position": (
        [("x", t(2, 3, 3, 16), None), ("pos", t(elem="i32"), None)],
        "parax.rope %x, %pos {theta = 10000.0 : f64, rotary_dim = 8}", t(2, 3, 3, 16), {"pos": "position:500"}),
    "position_embedding-position": (
        [("table", t(64, 40), "table"), ("pos", t(elem="i32"), None)],
        "parax.position_embedding %table, %pos", t(1, 5, 40), {"pos": "position:37"}),
    "attention-decode-position": (  # the split kernel: chunks past key 171 empty
        [("q", t(2, 1, 8, 16), None), ("k", t(2, 300, 2, 16), None), ("v", t(2, 300, 2, 16), None),
         ("pos", t(elem="i32"), None)],
        "parax.attention %q, %k, %v, %pos {causal, head_dim = 16 : i64, num_heads = 8 : i64,"
        " num_kv_heads = 2 : i64, scale = 0.25 : f64}", t(2, 1, 8, 16), {"pos": "position:170"}),
    "attention-tiles-position": (  # 20 queries: the tiled kernels (bf16: tensor cores)
        [("q", t(1, 20, 4, 16), None), ("k", t(1, 200, 2, 16), None), ("v", t(1, 200, 2, 16), None),
         ("pos", t(elem="i32"), None)],
        "parax.attention %q, %k, %v, %pos {causal, head_dim = 16 : i64, num_heads = 4 : i64,"
        " num_kv_heads = 2 : i64, scale = 0.25 : f64}", t(1, 20, 4, 16), {"pos": "position:90"}),
    "cache_update": (  # written in place into the input's memory, then returned
        [("cache", t(2, 40, 2, 16), None), ("new", t(2, 3, 2, 16), None), ("pos", t(elem="i32"), None)],
        "parax.cache_update %cache, %new, %pos", t(2, 40, 2, 16), {"pos": "position:17"}),
    "add-broadcast": (
        [("a", t(2, 1, 5), None), ("b", t(1, 3, 1), None)],
        "parax.add %a, %b", t(2, 3, 5), {}),
    "mul-broadcast": (
        [("a", t(2, 4, 1), None), ("b", t(2, 4, 33), None)],
        "parax.mul %a, %b", t(2, 4, 33), {}),
    "silu": ([("x", t(3, 333), None)], "parax.silu %x", t(3, 333), {}),
    "sigmoid": ([("x", t(3, 333), None)], "parax.sigmoid %x", t(3, 333), {}),
    "gelu-tanh": ([("x", t(3, 333), None)], "parax.gelu tanh %x", t(3, 333), {}),
    "gelu-erf": ([("x", t(3, 333), None)], "parax.gelu none %x", t(3, 333), {}),
    "swiglu": ([("g", t(3, 333), None), ("u", t(3, 333), None)], "parax.swiglu %g, %u",
               t(3, 333), {}),
    "reshape": ([("x", t(2, 3, 20), None)], "parax.reshape %x", t(2, 3, 4, 5), {}),
    "transpose": ([("x", t(2, 3, 4, 5), None)],
                  "parax.transpose %x {permutation = array<i64: 2, 0, 3, 1>}", t(4, 2, 5, 3), {}),
    "broadcast": ([("x", t(2, 1, 3, 1), None)], "parax.broadcast %x", t(2, 4, 3, 5), {}),
    "slice": ([("x", t(2, 9, 5), None)], "parax.slice %x {dim = 1 : i64, start = 3 : i64}",
              t(2, 4, 5), {}),
    "concat": ([("a", t(2, 3, 5), None), ("b", t(2, 3, 2), None), ("c", t(2, 3, 1), None)],
               "parax.concat %a, %b, %c {dim = 2 : i64}", t(2, 3, 8), {}),
    "router-softmax": (
        [("x", t(2, 5, 40), None), ("gate", t(8, 40), "gate")],
        "parax.router softmax %x, %gate {num_experts = 8 : i64, top_k = 2 : i64, normalize}",
        (t(2, 5, 2), t(2, 5, 2, elem="i32")), {}),
    "router-sigmoid-groups-bias": (
        [("x", t(2, 5, 40), None), ("gate", t(16, 40), "gate"), ("bias", t(16), "bias")],
        "parax.router sigmoid %x, %gate, %bias {num_experts = 16 : i64, top_k = 4 : i64, normalize,"
        " num_groups = 4 : i64, topk_groups = 2 : i64, scaling_factor = 2.5 : f64}",
        (t(2, 5, 4), t(2, 5, 4, elem="i32")), {}),
    # NaN scores (a diverging run's): experts ranked NaN last, ties by index
    # (ExpertChoice.h), on both backends -- tokens 0 and 7 all NaN (softmax:
    # every score NaN, experts 0 and 1 chosen); a whole group NaN (experts
    # 4-7: the GPU's group choice once wrote before its scratch), one expert
    # of another (9), and a token all NaN.
    "router-softmax-nan": (
        [("x", t(2, 5, 40), None), ("gate", t(8, 40), "gate")],
        "parax.router softmax %x, %gate {num_experts = 8 : i64, top_k = 2 : i64, normalize}",
        (t(2, 5, 2), t(2, 5, 2, elem="i32")), {"x": "nan-rows:0,7"}),
    "router-sigmoid-groups-bias-nan": (
        [("x", t(2, 5, 40), None), ("gate", t(16, 40), "gate"), ("bias", t(16), "bias")],
        "parax.router sigmoid %x, %gate, %bias {num_experts = 16 : i64, top_k = 4 : i64, normalize,"
        " num_groups = 4 : i64, topk_groups = 2 : i64, scaling_factor = 2.5 : f64}",
        (t(2, 5, 4), t(2, 5, 4, elem="i32")), {"x": "nan-rows:3", "gate": "nan-rows:4,5,6,7,9"}),
    # (FFN 100: the grouped GEMM's 64-column tiles and the few-row kernel's
    # 32-column blocks each end partial; in bf16 the down-projection's k of
    # 100 is not in 16-byte pieces, so it takes the grouped GEMM while gate
    # and up take the few-row kernel)
    "experts": (
        [("x", t(2, 3, 40), None), ("w", t(2, 3, 2), None), ("idx", t(2, 3, 2, elem="i32"), None),
         ("wg", t(4, 100, 40), "wg"), ("wu", t(4, 100, 40), "wu"), ("wd", t(4, 40, 100), "wd")],
        "parax.experts %x, %w, %idx, %wg, %wu, %wd", t(2, 3, 40), {"idx": "experts:4"}),
    "experts-many-rows": (  # ~100 rows per expert: several row tiles of the grouped GEMM
        [("x", t(3, 50, 24), None), ("w", t(3, 50, 2), None), ("idx", t(3, 50, 2, elem="i32"), None),
         ("wg", t(3, 72, 24), "wg"), ("wu", t(3, 72, 24), "wu"), ("wd", t(3, 24, 72), "wd")],
        "parax.experts %x, %w, %idx, %wg, %wu, %wd", t(3, 50, 24), {"idx": "experts:3"}),
    "experts-unused-rows": (  # expert -1: a dispatch slot no pair filled
        [("x", t(8, 40), None), ("w", t(8, 1), None), ("idx", t(8, 1, elem="i32"), None),
         ("wg", t(2, 24, 40), "wg"), ("wu", t(2, 24, 40), "wu"), ("wd", t(2, 40, 24), "wd")],
        "parax.experts %x, %w, %idx, %wg, %wu, %wd", t(8, 40), {"idx": "experts-holes:2"}),
    # Collectives over a group of one (grid @g: tp = 1), run under mpirun with
    # a one-rank communicator: NCCL's path (its stream, events, the
    # watchdog) on a machine with one GPU, which cannot hold two NCCL ranks.
    "all_reduce": (
        [("x", t(2, 6, 40), None)], 'parax.all_reduce %x over @g ["tp"]', t(2, 6, 40), {}),
    "all_gather": (
        [("x", t(2, 6, 40), None)], 'parax.all_gather %x over @g ["tp"] dim 1', t(2, 6, 40), {}),
    "reduce_scatter": (
        [("x", t(2, 6, 40), None)], 'parax.reduce_scatter %x over @g ["tp"] dim 1', t(2, 6, 40), {}),
    "all_to_all": (
        [("x", t(2, 6, 40), None)], 'parax.all_to_all %x over @g ["tp"] split 2 concat 1', t(2, 6, 40), {}),
    "cross_entropy": (
        [("logits", t(2, 6, 1000), None), ("labels", t(2, 6, elem="i32"), None)],
        "parax.cross_entropy %logits, %labels", t(elem="f32"), {"labels": "ids:1000"}),
    # ignore_index: every third label -100, the mean over label_count's count
    "label_count": (
        [("labels", t(2, 6, elem="i32"), None)],
        "parax.label_count %labels {ignore_index = -100 : i64}", t(elem="f32"), {"labels": "ids-ignored:1000"}),
    "cross_entropy-ignored": (  # a count of every rank's 8 counted of the 12 here (and more elsewhere)
        [("logits", t(2, 6, 1000), None), ("labels", t(2, 6, elem="i32"), None), ("count", t(elem="f32"), None)],
        "parax.cross_entropy %logits, %labels, %count {ignore_index = -100 : i64}", t(elem="f32"),
        {"labels": "ids-ignored:1000", "count": "count:20"}),
    # Multi-token prediction: the labels two ahead (the last two -100), a
    # depth's loss and its gradient weighted 0.15.
    "shift": (
        [("labels", t(3, 7, elem="i32"), None)],
        "parax.shift %labels {shift = 2 : i64, fill = -100 : i64}", t(3, 7, elem="i32"), {"labels": "ids:1000"}),
    "cross_entropy-weighted": (
        [("logits", t(2, 6, 1000), None), ("labels", t(2, 6, elem="i32"), None), ("count", t(elem="f32"), None)],
        "parax.cross_entropy %logits, %labels, %count {ignore_index = -100 : i64, weight = 0.15 : f64}",
        t(elem="f32"), {"labels": "ids-ignored:1000", "count": "count:20"}),
    "cross_entropy_grad-weighted": (
        [("logits", t(2, 6, 1000), None), ("labels", t(2, 6, elem="i32"), None), ("count", t(elem="f32"), None)],
        "parax.cross_entropy_grad %logits, %labels, %count {ignore_index = -100 : i64, weight = 0.15 : f64}",
        t(2, 6, 1000), {"labels": "ids-ignored:1000", "count": "count:20"}),
    # The training step's gradient ops (--parax-autodiff).
    "cross_entropy_grad-ignored": (
        [("logits", t(2, 6, 1000), None), ("labels", t(2, 6, elem="i32"), None), ("count", t(elem="f32"), None)],
        "parax.cross_entropy_grad %logits, %labels, %count {ignore_index = -100 : i64}", t(2, 6, 1000),
        {"labels": "ids-ignored:1000", "count": "count:20"}),
    "cross_entropy_grad": (  # a rank's 12 of 48 tokens (num_tokens)
        [("logits", t(2, 6, 1000), None), ("labels", t(2, 6, elem="i32"), None)],
        "parax.cross_entropy_grad %logits, %labels {num_tokens = 48 : i64}", t(2, 6, 1000),
        {"labels": "ids:1000"}),
    # Vocab-parallel cross-entropy (grid @g: its one rank holds the whole
    # vocabulary): every token's logsumexp, the loss and its gradient read it.
    "logsumexp": (
        [("x", t(2, 6, 1000), None)], "parax.logsumexp %x", t(2, 6, 1), {}),
    "cross_entropy-vocab": (
        [("logits", t(2, 6, 1000), None), ("labels", t(2, 6, elem="i32"), None), ("lse", t(2, 6, 1), None)],
        'parax.cross_entropy %logits, %labels, %lse {vocab_grid = @g, vocab_axes = ["tp"]}', t(elem="f32"),
        {"labels": "ids:1000"}),
    "cross_entropy_grad-vocab": (  # ignored labels, the mean over their count
        [("logits", t(2, 6, 1000), None), ("labels", t(2, 6, elem="i32"), None), ("count", t(elem="f32"), None),
         ("lse", t(2, 6, 1), None)],
        'parax.cross_entropy_grad %logits, %labels, %count, %lse {ignore_index = -100 : i64, vocab_grid = @g, '
        'vocab_axes = ["tp"]}', t(2, 6, 1000), {"labels": "ids-ignored:1000", "count": "count:20"}),
    "linear_weight_grad": (
        [("x", t(3, 5, 70), None), ("dy", t(3, 5, 90), None)],
        "parax.linear_weight_grad %x, %dy", t(70, 90), {}),
    "linear_weight_grad-transposed": (
        [("x", t(3, 5, 70), None), ("dy", t(3, 5, 90), None)],
        "parax.linear_weight_grad %x, %dy {transpose_w}", t(90, 70), {}),
    "rms_norm_grad-wide": (
        [("x", t(3, 700), None), ("w", t(700), "w"), ("dy", t(3, 700), None)],
        "parax.rms_norm_grad %x, %w, %dy {eps = 1.0e-06 : f64}", t(3, 700), {}),
    "rms_norm_grad-huge": (
        [("x", t(3, 700), None), ("w", t(700), "w"), ("dy", t(3, 700), None)],
        "parax.rms_norm_grad %x, %w, %dy {eps = 1.0e-06 : f64}", t(3, 700), {"x": "huge-rows:2"}),
    "rms_norm_weight_grad": (
        [("x", t(2, 9, 300), None), ("dy", t(2, 9, 300), None)],
        "parax.rms_norm_weight_grad %x, %dy {eps = 1.0e-05 : f64}", t(300), {}),
    "swiglu_grad-gate": (
        [("g", t(3, 333), None), ("u", t(3, 333), None), ("dy", t(3, 333), None)],
        "parax.swiglu_grad %g, %u, %dy {operand = 0 : i64}", t(3, 333), {}),
    "swiglu_grad-up": (
        [("g", t(3, 333), None), ("u", t(3, 333), None), ("dy", t(3, 333), None)],
        "parax.swiglu_grad %g, %u, %dy {operand = 1 : i64}", t(3, 333), {}),
    "attention_grad-gqa": (  # causal, 6 heads over 2 KV heads, Dv != D
        [("q", t(1, 70, 6, 16), None), ("k", t(1, 70, 2, 16), None), ("v", t(1, 70, 2, 8), None),
         ("do", t(1, 70, 6, 8), None)],
        "parax.attention_grad %q, %k, %v, %do {causal, head_dim = 16 : i64, num_heads = 6 : i64,"
        " num_kv_heads = 2 : i64, scale = 0.25 : f64}",
        (t(1, 70, 6, 16), t(1, 70, 2, 16), t(1, 70, 2, 8)), {}),
    "attention_grad-past": (  # causal with 4 earlier keys; then not causal
        [("q", t(2, 5, 4, 8), None), ("k", t(2, 9, 4, 8), None), ("v", t(2, 9, 4, 8), None),
         ("do", t(2, 5, 4, 8), None)],
        "parax.attention_grad %q, %k, %v, %do {causal, head_dim = 8 : i64, num_heads = 4 : i64,"
        " num_kv_heads = 4 : i64, scale = 0.35 : f64}",
        (t(2, 5, 4, 8), t(2, 9, 4, 8), t(2, 9, 4, 8)), {}),
    # causal, Llama's head width: 4 query tiles of 32 (the last partial), 4
    # heads a KV head, 10 earlier keys (the query and key tiles misaligned)
    "attention_grad-tiles": (
        [("q", t(1, 100, 4, 128), None), ("k", t(1, 110, 1, 128), None), ("v", t(1, 110, 1, 128), None),
         ("do", t(1, 100, 4, 128), None)],
        "parax.attention_grad %q, %k, %v, %do {causal, head_dim = 128 : i64, num_heads = 4 : i64,"
        " num_kv_heads = 1 : i64, scale = 0.088 : f64}",
        (t(1, 100, 4, 128), t(1, 110, 1, 128), t(1, 110, 1, 128)), {}),
    "attention_grad-wide": (  # not causal, more keys than queries, head widths 160 and 96: tiles of 16
        [("q", t(2, 20, 2, 160), None), ("k", t(2, 37, 2, 160), None), ("v", t(2, 37, 2, 96), None),
         ("do", t(2, 20, 2, 96), None)],
        "parax.attention_grad %q, %k, %v, %do {head_dim = 160 : i64, num_heads = 2 : i64,"
        " num_kv_heads = 2 : i64, scale = 0.08 : f64}",
        (t(2, 20, 2, 160), t(2, 37, 2, 160), t(2, 37, 2, 96)), {}),
    # bf16: tensor cores -- three 64-query tiles (the last partial) and three
    # 64-key tiles, the first query tile seeing only the first key tile; 6
    # heads over 2 KV heads, values 16 wide beside 32
    "attention_grad-tensor-cores": (
        [("q", t(2, 150, 6, 32), None), ("k", t(2, 150, 2, 32), None), ("v", t(2, 150, 2, 16), None),
         ("do", t(2, 150, 6, 16), None)],
        "parax.attention_grad %q, %k, %v, %do {causal, head_dim = 32 : i64, num_heads = 6 : i64,"
        " num_kv_heads = 2 : i64, scale = 0.18 : f64}",
        (t(2, 150, 6, 32), t(2, 150, 2, 32), t(2, 150, 2, 16)), {}),
    # 256-wide heads: tensor-core tiles would not fit a block's shared
    # memory, so bf16 too runs on CUDA cores (tiles of 16)
    "attention_grad-heads256": (
        [("q", t(1, 20, 2, 256), None), ("k", t(1, 26, 1, 256), None), ("v", t(1, 26, 1, 256), None),
         ("do", t(1, 20, 2, 256), None)],
        "parax.attention_grad %q, %k, %v, %do {causal, head_dim = 256 : i64, num_heads = 2 : i64,"
        " num_kv_heads = 1 : i64, scale = 0.06 : f64}",
        (t(1, 20, 2, 256), t(1, 26, 1, 256), t(1, 26, 1, 256)), {}),
    "embedding_grad": (  # ids repeat: rows gather several tokens' gradients
        [("ids", t(3, 40, elem="i32"), None), ("dy", t(3, 40, 24), None)],
        "parax.embedding_grad %ids, %dy", t(50, 24), {"ids": "ids:50"}),
    "sum_to-bias": (  # a bias's gradient: every token summed
        [("x", t(3, 5, 70), None)], "parax.sum_to %x", t(1, 1, 70), {}),
    "sum_to-middle": (  # a broadcast add's: the batch summed, then a middle dimension
        [("x", t(4, 3, 5, 6), None)], "parax.sum_to %x", t(1, 3, 1, 6), {}),
    "gelu_grad-tanh": ([("x", t(3, 333), None), ("dy", t(3, 333), None)],
                       "parax.gelu_grad tanh %x, %dy", t(3, 333), {}),
    "gelu_grad-erf": ([("x", t(3, 333), None), ("dy", t(3, 333), None)],
                      "parax.gelu_grad none %x, %dy", t(3, 333), {}),
    # x of 1e25 (x^2 overflows fp32): the tanh form's derivative is 1 there,
    # not 0 * inf (NaN on the GPU before; the CPU computes in double).
    "gelu_grad-tanh-huge": ([("x", t(3, 333), None), ("dy", t(3, 333), None)],
                            "parax.gelu_grad tanh %x, %dy", t(3, 333), {"x": "huge-rows:1"}),
    "gelu_grad-erf-huge": ([("x", t(3, 333), None), ("dy", t(3, 333), None)],
                           "parax.gelu_grad none %x, %dy", t(3, 333), {"x": "huge-rows:1"}),
    "sigmoid_grad": ([("x", t(3, 333), None), ("dy", t(3, 333), None)],
                     "parax.sigmoid_grad %x, %dy", t(3, 333), {}),
    # Gemma 2's final logits, capped at 1.5 (the random values cross it).
    "softcap": ([("x", t(3, 333), None)], "parax.softcap %x {cap = 1.5 : f64}", t(3, 333), {}),
    "softcap_grad": ([("x", t(3, 333), None), ("dy", t(3, 333), None)],
                     "parax.softcap_grad %x, %dy {cap = 1.5 : f64}", t(3, 333), {}),
    # Mixture of experts' gradients: the router's choice made again, the
    # experts' five gradients (an unused dispatch row adds nothing).
    "router_grad-softmax": (
        [("x", t(2, 5, 40), None), ("gate", t(8, 40), "gate"), ("dw", t(2, 5, 2), None)],
        "parax.router_grad softmax %x, %gate, %dw {num_experts = 8 : i64, top_k = 2 : i64, normalize}",
        t(2, 5, 8), {}),
    "router_grad-sigmoid-groups-bias": (
        [("x", t(2, 5, 40), None), ("gate", t(16, 40), "gate"), ("dw", t(2, 5, 4), None), ("bias", t(16), "bias")],
        "parax.router_grad sigmoid %x, %gate, %dw, %bias {num_experts = 16 : i64, top_k = 4 : i64, normalize,"
        " num_groups = 4 : i64, topk_groups = 2 : i64, scaling_factor = 2.5 : f64}",
        t(2, 5, 16), {}),
    # The load-balancing loss's pieces (f32 only: the load is f32 counts).
    "router_load-softmax": (
        [("x", t(2, 5, 40), None), ("gate", t(8, 40), "gate")],
        "parax.router_load softmax %x, %gate {num_experts = 8 : i64, top_k = 2 : i64, normalize}", t(8), {}),
    "router_load-sigmoid-groups-bias": (
        [("x", t(2, 5, 40), None), ("gate", t(16, 40), "gate"), ("bias", t(16), "bias")],
        "parax.router_load sigmoid %x, %gate, %bias {num_experts = 16 : i64, top_k = 4 : i64,"
        " num_groups = 4 : i64, topk_groups = 2 : i64}", t(16), {}),
    "router_load-sigmoid-groups-bias-nan": (  # the NaN cases' choices counted (see router-*-nan)
        [("x", t(2, 5, 40), None), ("gate", t(16, 40), "gate"), ("bias", t(16), "bias")],
        "parax.router_load sigmoid %x, %gate, %bias {num_experts = 16 : i64, top_k = 4 : i64,"
        " num_groups = 4 : i64, topk_groups = 2 : i64}", t(16), {"x": "nan-rows:3", "gate": "nan-rows:4,5,6,7,9"}),
    "router_load-scores-softmax": (  # each expert's scores summed over the tokens, not the choices
        [("x", t(2, 5, 40), None), ("gate", t(8, 40), "gate")],
        "parax.router_load softmax %x, %gate {num_experts = 8 : i64, top_k = 2 : i64, normalize, scores}", t(8),
        {}),
    "router_load-scores-sigmoid": (
        [("x", t(2, 5, 40), None), ("gate", t(8, 40), "gate")],
        "parax.router_load sigmoid %x, %gate {num_experts = 8 : i64, top_k = 2 : i64, scores}", t(8), {}),
    "balance_loss": (
        [("load", t(8), None), ("scores", t(8), None)],
        "parax.balance_loss %load, %scores {num_experts = 8 : i64, coefficient = 0.5 : f64, num_tokens = 20 : i64}",
        t(elem="f32"), {}),
    "router_aux_grad-softmax": (
        [("x", t(2, 5, 40), None), ("gate", t(8, 40), "gate"), ("load", t(8), None)],
        "parax.router_aux_grad softmax %x, %gate, %load {num_experts = 8 : i64, coefficient = 0.5 : f64,"
        " num_tokens = 20 : i64}", t(2, 5, 8), {}),
    "router_aux_grad-sigmoid": (
        [("x", t(2, 5, 40), None), ("gate", t(8, 40), "gate"), ("load", t(8), None)],
        "parax.router_aux_grad sigmoid %x, %gate, %load {num_experts = 8 : i64, coefficient = 0.5 : f64,"
        " num_tokens = 10 : i64}", t(2, 5, 8), {}),
    # DeepSeek-V3's sequence-wise balance loss: a load row per sequence,
    # the sigmoid's scores normalised per token.
    "router_load-sequences-sigmoid-bias": (
        [("x", t(3, 5, 40), None), ("gate", t(16, 40), "gate"), ("bias", t(16), "bias")],
        "parax.router_load sigmoid %x, %gate, %bias {num_experts = 16 : i64, top_k = 4 : i64,"
        " num_groups = 4 : i64, topk_groups = 2 : i64}", t(3, 16), {}),
    "router_load-sequences-scores-sigmoid": (
        [("x", t(3, 5, 40), None), ("gate", t(8, 40), "gate")],
        "parax.router_load sigmoid %x, %gate {num_experts = 8 : i64, top_k = 2 : i64, scores}", t(3, 8), {}),
    "router_load-sequences-scores-softmax": (
        [("x", t(3, 5, 40), None), ("gate", t(8, 40), "gate")],
        "parax.router_load softmax %x, %gate {num_experts = 8 : i64, top_k = 2 : i64, scores}", t(3, 8), {}),
    "balance_loss-sequences": (
        [("load", t(3, 8), None), ("scores", t(3, 8), None)],
        "parax.balance_loss %load, %scores {num_experts = 8 : i64, coefficient = 0.5 : f64, num_tokens = 5 : i64,"
        " num_sequences = 6 : i64}", t(elem="f32"), {}),
    "router_aux_grad-sequences-sigmoid": (
        [("x", t(3, 5, 40), None), ("gate", t(8, 40), "gate"), ("load", t(3, 8), None)],
        "parax.router_aux_grad sigmoid %x, %gate, %load {num_experts = 8 : i64, coefficient = 0.5 : f64,"
        " num_tokens = 5 : i64, num_sequences = 3 : i64}", t(3, 5, 8), {}),
    "router_aux_grad-sequences-softmax": (
        [("x", t(3, 5, 40), None), ("gate", t(8, 40), "gate"), ("load", t(3, 8), None)],
        "parax.router_aux_grad softmax %x, %gate, %load {num_experts = 8 : i64, coefficient = 0.5 : f64,"
        " num_tokens = 5 : i64, num_sequences = 3 : i64}", t(3, 5, 8), {}),
    "experts_grad": (
        [("x", t(2, 3, 40), None), ("w", t(2, 3, 2), None), ("idx", t(2, 3, 2, elem="i32"), None),
         ("wg", t(4, 30, 40), "wg"), ("wu", t(4, 30, 40), "wu"), ("wd", t(4, 40, 30), "wd"),
         ("dy", t(2, 3, 40), None)],
        "parax.experts_grad %x, %w, %idx, %wg, %wu, %wd, %dy",
        (t(2, 3, 40), t(2, 3, 2), t(4, 30, 40), t(4, 30, 40), t(4, 40, 30)), {"idx": "experts:4"}),
    "experts_grad-unused-rows": (
        [("x", t(8, 24), None), ("w", t(8, 1), None), ("idx", t(8, 1, elem="i32"), None),
         ("wg", t(2, 16, 24), "wg"), ("wu", t(2, 16, 24), "wu"), ("wd", t(2, 24, 16), "wd"),
         ("dy", t(8, 24), None)],
        "parax.experts_grad %x, %w, %idx, %wg, %wu, %wd, %dy",
        (t(8, 24), t(8, 1), t(2, 16, 24), t(2, 16, 24), t(2, 24, 16)), {"idx": "experts-holes:2"}),
    "moe_combine-per_choice": (  # each pair's row in place, not summed per token
        [("rows", t(12, 7), None), ("idx", t(2, 3, 2, elem="i32"), None)],
        'parax.moe_combine %rows, %idx over @g ["tp"] {num_experts = 4 : i64, per_choice}', t(2, 3, 2, 7),
        {"idx": "experts:4"}),
    "layer_norm_grad-wide": (
        [("x", t(3, 700), None), ("w", t(700), "w"), ("dy", t(3, 700), None)],
        "parax.layer_norm_grad %x, %w, %dy {eps = 1.0e-05 : f64}", t(3, 700), {}),
    "layer_norm_weight_grad": (
        [("x", t(2, 9, 300), None), ("dy", t(2, 9, 300), None)],
        "parax.layer_norm_weight_grad %x, %dy {eps = 1.0e-05 : f64}", t(300), {}),
    "position_embedding_grad": (
        [("dy", t(1, 5, 40), None)], "parax.position_embedding_grad %dy {offset = 7 : i64}", t(64, 40), {}),
    "rope-inverse": (
        [("x", t(2, 6, 3, 16), None)],
        "parax.rope %x {theta = 10000.0 : f64, rotary_dim = 8, position_offset = 5, inverse}",
        t(2, 6, 3, 16), {}),
}

# Case-name suffixes of an op's results, by their count.
RESULT_SUFFIXES = {2: ("-weights", "-indices"), 3: ("-dq", "-dk", "-dv"),
                   5: ("-dx", "-dweights", "-dw_gate", "-dw_up", "-dw_down")}


# Ops with an f32 operand or result whatever the storage: no bf16 case.
# (The vocab-parallel ones' lse: in bf16 programs too, the SIMT model cases.)
F32_ONLY = ("router_load", "router_aux_grad", "balance_loss", "label_count", "shift", "logsumexp",
            "cross_entropy-vocab", "cross_entropy_grad-vocab")


def cases():
    """Case names: an op with two results gives one case per result; each
    case also in bf16 storage (suffix -bf16), but those of F32_ONLY."""
    names = []
    for name, (_, _, result, _) in OPS.items():
        names += ([name + suffix for suffix in RESULT_SUFFIXES[len(result)]] if isinstance(result, tuple)
                  else [name])
    return names + [n + "-bf16" for n in names if not n.startswith(F32_ONLY)]


def is_bf16(case):
    return case.endswith("-bf16")


def _op(case):
    if is_bf16(case):
        case = case[:-len("-bf16")]
    for suffixes in RESULT_SUFFIXES.values():
        for k, suffix in enumerate(suffixes):
            if case.endswith(suffix) and case[:-len(suffix)] in OPS:
                return case[:-len(suffix)], k
    return case, 0


def mlir(case):
    """The one-op function; it returns the case's result of the op (bf16
    cases: every f32 tensor but a loss in bf16). A collective's function
    comes in a module with its grid."""
    text = _mlir(case)
    if " @g" in OPS[_op(case)[0]][1]:  # (a collective's, or a vocab-parallel op's)
        text = "module {\n  parax.grid @g (tp = 1)\n" + text + "}\n"
    return text.replace("xf32>", "xbf16>") if is_bf16(case) else text


def is_collective(case):
    """Run under mpirun (a one-rank communicator), not as a bare process."""
    return " over @g " in OPS[_op(case)[0]][1]


def _mlir(case):
    name, k = _op(case)
    args, body, result, _ = OPS[name]
    params = ",\n    ".join(
        f"%{a}: {ty}" + (f' {{parax.param = "{p}"}}' if p else "") for a, ty, p in args)
    results = result if isinstance(result, tuple) else (result,)
    # (in the body's order, an argument used twice typed twice)
    types = {a: ty for a, ty, _ in args}
    operand_types = ", ".join(types[a] for a in re.findall(r"%(\w+)", body.split("{")[0]))
    names = ", ".join(f"%r{i}" for i in range(len(results)))
    # Collectives print their types as `T -> T` (`(T, T) -> T` for two operands).
    if " over @g " in body:
        signature = (f"({operand_types}) -> {results[0]}" if "," in operand_types
                     else f"{operand_types} -> {results[0]}")
    else:
        signature = f"({operand_types}) -> ({', '.join(results)})"
    return (f"func.func @f(\n    {params}) -> {results[k]} {{\n"
            f"  {names} = {body} : {signature}\n"
            f"  return %r{k} : {results[k]}\n}}\n")


def _shape(ty):
    inner = ty[len("tensor<"):-1].split("x")
    return tuple(int(s) for s in inner[:-1]), inner[-1]


def values(case, seed=0):
    """(inputs in argument order, parameters by checkpoint name)."""
    args, _, _, kinds = OPS[_op(case)[0]]
    rng = np.random.default_rng(seed)
    inputs, params = [], {}
    for arg, ty, param in args:
        shape, elem = _shape(ty)
        kind = kinds.get(arg, "normal")
        if kind.startswith("ids:"):
            v = rng.integers(0, int(kind[4:]), shape).astype(np.int32)
        elif kind.startswith("ids-ignored:"):  # some labels the loss does not count (-100)
            v = rng.integers(0, int(kind[12:]), shape).astype(np.int32)
            v.flat[::3] = -100
        elif kind.startswith("count:"):  # a count of labels, a scalar
            v = np.array(float(kind[6:]), dtype=np.float32)
        elif kind.startswith("experts:"):
            v = rng.integers(0, int(kind[8:]), shape).astype(np.int32)
        elif kind.startswith("position:"):
            v = np.array(int(kind[9:]), dtype=np.int32)
        elif kind.startswith("experts-holes:"):
            v = rng.integers(-1, int(kind[14:]), shape).astype(np.int32)
            v.flat[0] = -1
        else:
            v = rng.standard_normal(shape).astype(np.float32)
            if is_bf16(case):  # values bf16 holds exactly: both backends start equal
                v = round_to_bf16(v)
            if kind.startswith("nan-rows:"):
                rows = v.reshape(-1, shape[-1])
                rows[[int(r) for r in kind[9:].split(",")]] = np.nan
            if kind.startswith("huge-rows:"):  # (1e25 in bf16 too)
                rows = v.reshape(-1, shape[-1])
                rows[[int(r) for r in kind[10:].split(",")]] *= np.float32(1e25)
        (params.__setitem__(param, v) if param else inputs.append(v))
    return inputs, params
