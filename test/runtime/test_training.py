"""The training step (--parax-autodiff): the gradients of the loss by every
parameter, on one rank against finite differences of the independent numpy
forward pass (in float64), and on N ranks under a real mpirun against one
rank (the oracle).

Tolerances: a gradient's directional derivative <g, d> (d random, one per
parameter) within 1e-3 relative of the central difference of numpy's loss
(step 1e-4; fp32 gradients); sharded vs single rank 1e-6 absolute
(gradients are ~1e-1; only the order of sums differs)."""

import os
import re

import numpy as np
import pytest

from conftest import Model

FD_TOL = 1e-3
SHARDED_TOL = 1e-6
# fp32 sums in another order (a TP split, its all-reduce): relative to the
# largest |gradient| (tiny-Llama's about 0.5; Gemma 3's 3.4, its embeddings
# scaled by sqrt(hidden) = 8, differ by 1.7e-6 of it under TP2)
SHARDED_REL_TOL = 4e-6


def gradients(model, exe, ranks, extra=()):
    """The loss and a {parameter name: gradient} dict (the pieces of a fused
    tensor, each a result of its own with its box, put together)."""
    text = open(exe.replace(".pxe", ".mlir")).read()
    # Each result's gradient name (and piece), by its index: a partitioned
    # stage returns the gradients of the parameters it holds, each marked
    # with the result it is (several stages may return one).
    found = re.findall(r'(?:parax\.global_sharding = #parax\.sharding<[^>]*>, )?parax\.grad = "([^"]+)"'
                       r'(?:, parax\.param_offset = array<i64: ([0-9, ]+)>)?'
                       r'(?:, parax\.param_shape = array<i64: [0-9, ]+>)?(?:, parax\.result = (\d+) : i64)?', text)
    numbered = {int(k): (name, offset) for name, offset, k in found if k}
    results = [numbered[k] for k in sorted(numbered)] if numbered else [(n, o) for n, o, _ in found]
    outs = model.run(exe, ranks, outputs=1 + len(results), extra=extra)
    grads = {}
    for (name, offset), grad in zip(results, outs[1:]):
        if "{e}" in name:  # a stack of experts: one gradient per expert, as checkpoints name them
            grads.update({name.replace("{e}", str(e)): g for e, g in enumerate(grad)})
            continue
        if not offset:
            grads[name] = grad
            continue
        whole = grads.setdefault(name, np.zeros(model.weights[name].shape, np.float32))
        start = [int(o) for o in offset.split(",")]
        whole[tuple(slice(o, o + n) for o, n in zip(start, grad.shape))] = grad
    return float(outs[0]), grads


def numpy_loss(model, weights):
    """numpy's loss (float64): the cross-entropy, plus multi-token
    prediction's and an MoE model's load-balancing loss when it has them."""
    return model.reference_loss(weights)


def replica_means(tmp_path, model, dp, **options):
    """The loss and gradients of `dp` one-rank runs, each over one
    replica's share of `model`'s rows (its tokens and labels), averaged:
    what data-parallel replicas that each take their own mean give."""
    rows = len(model.tokens) // dp
    runs = []
    for r in range(dp):
        one = Model(str(tmp_path / f"replica{r}"), model.preset, loss=True, batch=rows, **options)
        share = slice(r * rows, (r + 1) * rows)
        one.labels = model.labels[share]
        np.save(one.tokens_path, model.tokens[share])
        np.save(one.labels_path, one.labels)
        runs.append(gradients(one, one.compile("train", autodiff=True), 1))
    return sum(run[0] for run in runs) / dp, {k: sum(run[1][k] for run in runs) / dp for k in runs[0][1]}


def check_directional_derivatives(model, weights, grads, names, seed):
    """Each named gradient's directional derivative <g, d> (d random)
    equals the central difference of numpy's float64 loss (FD_TOL)."""
    rng = np.random.default_rng(seed)
    eps = 1e-4
    for name in names:
        grad = grads[name]
        direction = rng.standard_normal(grad.shape)
        plus, minus = dict(weights), dict(weights)
        plus[name] = weights[name] + eps * direction
        minus[name] = weights[name] - eps * direction
        expected = (numpy_loss(model, plus) - numpy_loss(model, minus)) / (2 * eps)
        got = float((grad.astype(np.float64) * direction).sum())
        assert abs(got - expected) <= FD_TOL * max(abs(expected), 1e-3), (name, got, expected)


SEQUENCE_AUX = {"sequence_aux": True}  # DeepSeek-V3's sequence-wise balance loss


@pytest.mark.parametrize("preset,aux,overrides",
                         [("tiny-llama", 0, None), ("tiny-gpt2", 0, None), ("tiny-mixtral", 0, None),
                          ("tiny-qwen2-moe", 0, None), ("tiny-deepseek-v3", 0, None),
                          ("tiny-mixtral", 0.5, None), ("tiny-qwen2-moe", 0.5, None),
                          ("tiny-deepseek-v3", 0.5, SEQUENCE_AUX),
                          ("tiny-qwen2-moe", 0.5, SEQUENCE_AUX)],
                         ids=["llama", "gpt2", "mixtral", "qwen2-moe", "deepseek-v3", "mixtral-aux", "qwen2-moe-aux",
                              "deepseek-v3-seq-aux", "qwen2-moe-seq-aux"])
def test_gradients_match_finite_differences(tmp_path, preset, aux, overrides):
    """Tiny Llama, GPT-2, Mixtral, Qwen2-MoE and DeepSeek-V3, 2 layers, one
    rank: every parameter's gradient (GPT-2: biases, LayerNorms, the
    position table, the fused QKV weight through its slices, the embedding
    tied to the head; MoE: the router through its top-k (softmax or sigmoid,
    normalised or not, groups, scaling), the stacked experts, Qwen2-MoE's
    sigmoid-gated shared expert; DeepSeek-V3: MLA's slices, concats and
    broadcast) along a random direction equals the central difference of
    numpy's float64 loss; the loss itself numpy's. With a load-balancing
    loss (weight 0.5, large enough to matter: HF's is 0.001-0.02) the
    gradients are those of the cross-entropy plus it, and so is the loss
    returned. DeepSeek-V3's sequence-wise loss (sigmoid scores normalised
    per token; each layer's, per sequence) and the same under softmax
    (Qwen2-MoE's router) likewise."""
    model = Model(str(tmp_path), preset, loss=True, aux_loss=aux, overrides=overrides)
    loss, grads = gradients(model, model.compile("train", autodiff=True), 1)
    weights = {k: v.astype(np.float64) for k, v in model.weights.items()}
    assert abs(loss - numpy_loss(model, weights)) < 1e-4
    # (DeepSeek-V3's router correction bias chooses experts only: no gradient.)
    assert set(grads) == {name for name in model.weights if "e_score_correction_bias" not in name}
    for name, grad in grads.items():
        assert grad.shape == model.weights[name].shape, name
    check_directional_derivatives(model, weights, grads, list(grads), seed=7)


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gpt2"])
def test_ignored_labels_are_not_counted(tmp_path, preset):
    """ignore_index = -100 (Hugging Face's; a fine-tuning batch's prompt
    and padding): those tokens add nothing to the loss, which is the mean
    over the others (numpy's), and every gradient is that loss's (finite
    differences of numpy's)."""
    model = Model(str(tmp_path), preset, loss=True, ignore_index=-100)
    assert (~model.counted()).sum() == 8  # 3 prompt tokens a row, 2 padded
    exe = model.compile("train", autodiff=True)
    loss, grads = gradients(model, exe, 1)
    weights = {k: v.astype(np.float64) for k, v in model.weights.items()}
    assert abs(loss - numpy_loss(model, weights)) < 1e-4
    unmasked = Model(str(tmp_path / "all"), preset, loss=True)
    assert abs(loss - gradients(unmasked, unmasked.compile("train", autodiff=True), 1)[0]) > 1e-3
    head = "lm_head.weight" if "lm_head.weight" in grads else "transformer.wte.weight"
    check_directional_derivatives(model, weights, grads, sorted(grads)[:6] + [head], seed=3)


@pytest.mark.parametrize("preset,pins,ranks", [
    ("tiny-llama", "tp=2,dp=1", 2), ("tiny-llama", "cp=2,tp=1,dp=1", 2), ("tiny-llama", "tp=2,pp=2,dp=1", 4),
    ("tiny-llama", "cp=2,tp=2,dp=1", 4), ("tiny-gpt2", "tp=2,dp=1", 2), ("tiny-mixtral", "ep=2,dp=1", 2),
    ("tiny-llama", "dp=2", 2)],
    ids=["tp2", "cp2", "tp2-pp2", "cp2-tp2", "gpt2-tp2", "mixtral-ep2", "dp2"])
def test_ignored_labels_under_sharding(tmp_path, preset, pins, ranks):
    """The count of labels that are not ignore_index is every rank's: the
    labels load whole, each rank counts them all (label_count) and the
    loss slices its own tokens (tp's sequence split, cp's cyclic one, ep's
    sequences). Loss and gradients equal one rank's. Data-parallel
    replicas each take the mean over their own counted tokens, as
    microbatches do (Megatron-LM's and Hugging Face's per-batch mean; not
    one mean over the step's tokens): DP2 equals the mean of the two
    halves' one-rank runs."""
    dp = 2 if "dp=2" in pins else 1
    model = Model(str(tmp_path), preset, loss=True, batch=2, rows=2 * dp, ignore_index=-100)
    exe = model.compile("sharded", f"prefill:batch={2 * dp},seq=8,{pins}", ranks, autodiff=True)
    assert "parax.label_count" in open(exe.replace(".pxe", ".mlir")).read()
    loss, sharded = gradients(model, exe, ranks)
    single_loss, single = replica_means(tmp_path, model, dp, ignore_index=-100)
    assert abs(loss - single_loss) < 1e-5
    for name in single:
        tol = max(SHARDED_TOL, SHARDED_REL_TOL * float(np.abs(single[name]).max()))
        assert np.abs(sharded[name] - single[name]).max() < tol, name


@pytest.mark.parametrize("pins,ranks,rows", [("dp=2", 2, 4), (None, 1, 4), ("pp=2,dp=1", 2, 8),
                                             ("dp=2,tp=2", 4, 8)],
                         ids=["dp2", "2micro", "pp2-4micro", "dp2-tp2-2micro"])
def test_per_token_loss_is_one_mean_over_the_step(tmp_path, pins, ranks, rows):
    """parax-run --per-token-loss: the loss and gradients are the mean over
    every counted label of the step, whichever replica or microbatch holds
    it (Megatron-LM's calculate_per_token_loss; Hugging Face's
    num_items_in_batch): replicas and microbatches of batch 2 whose rows
    count different numbers of labels (row 0 has 2 more ignored) give one
    rank's run over all the rows in one batch. Without the flag they give
    the mean of each batch's mean, which differs."""
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, rows=rows, ignore_index=-100)
    dp = 2 if pins and "dp=2" in pins else 1
    workload = pins and f"prefill:batch={2 * dp},seq=8,{pins}"
    exe = model.compile("micro", workload, ranks, autodiff=True)
    loss, grads = gradients(model, exe, ranks, extra=["--per-token-loss"])
    whole = Model(str(tmp_path / "whole"), "tiny-llama", loss=True, batch=rows, ignore_index=-100)
    whole_loss, whole_grads = gradients(whole, whole.compile("whole", autodiff=True), 1)
    assert abs(whole_loss - whole.reference_loss()) < 1e-4
    assert abs(loss - whole_loss) < 1e-5
    for name in whole_grads:
        assert np.abs(grads[name] - whole_grads[name]).max() < SHARDED_TOL, name
    per_batch, _ = gradients(model, exe, ranks)
    assert abs(per_batch - whole_loss) > 1e-3


def test_per_token_loss_needs_counted_labels(tmp_path):
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2)
    proc = model.run(model.compile("train", autodiff=True), 1, outputs=0, expect_ok=False,
                     extra=["--per-token-loss"])
    assert proc.returncode != 0
    assert "--per-token-loss: the executable counts no labels" in proc.stderr, proc.stderr
    infer = Model(str(tmp_path / "infer"), "tiny-llama")
    proc = infer.run(infer.compile("forward"), 1, outputs=0, expect_ok=False, extra=["--per-token-loss"])
    assert proc.returncode != 0 and "--per-token-loss: the executable is no training step" in proc.stderr, \
        proc.stderr
    mtp = Model(str(tmp_path / "mtp"), "tiny-deepseek-v3", loss=True, batch=2, mtp_weight=0.3)
    proc = mtp.run(mtp.compile("train", autodiff=True), 1, outputs=0, expect_ok=False, extra=["--per-token-loss"])
    assert proc.returncode != 0 and "--per-token-loss: multi-token prediction's labels (shifted)" in proc.stderr, \
        proc.stderr


# (workload pins, ranks)
TRAIN_PLANS = [
    ("tp=2,dp=1", 2),            # Megatron TP with sequence parallelism
    ("tp=4,dp=1", 4),            # 2 KV heads on 4 ranks: KV heads replicated, dk/dv partial sums
    ("dp=2", 2),                 # replicas' gradients averaged
    ("dp=2,tp=2", 4),
    ("cp=2,tp=1,dp=1", 2),       # context parallelism: dk/dv partial over cp
    ("cp=2,tp=2,dp=1", 4),
    ("pp=2,dp=1", 2),            # gradients sent back to the earlier stage
    ("tp=2,pp=2,dp=1", 4),
    ("cp=2,pp=2,tp=1,dp=1", 4),
    ("dp=2,tp=2,pp=2", 8),
]
# GPT-2: the fused QKV weight split into pieces by the plan (each piece's
# gradient a result of its own), biases (row-parallel: added on one rank),
# the position table's gradient (per rank its positions' rows under CP).
GPT2_PLANS = [("tp=2,dp=1", 2), ("cp=2,tp=1,dp=1", 2), ("dp=2", 2), ("tp=2,pp=2,dp=1", 4)]


# Mixture of experts: the experts' stacks split over `ep` (tokens dispatched
# to their experts' ranks and the gradients sent back: moe_dispatch /
# experts_grad / moe_combine), each expert's FFN over `tp`, the router and
# attention replicated over `ep`, whose ranks take their own rows.
MOE_PLANS = [
    ("tiny-mixtral", "ep=2,dp=1", 2),
    ("tiny-mixtral", "ep=2,tp=2,dp=1", 4),
    ("tiny-mixtral", "tp=2,dp=1", 2),
    ("tiny-mixtral", "dp=2,ep=2", 4),
    ("tiny-mixtral", "ep=2,pp=2,dp=1", 4),
    ("tiny-mixtral", "ep=2,cp=2,tp=1,dp=1", 4),   # each ep rank its sequences, each cp rank its positions
    # An expert capacity (a rank's exchanges hold 1.5 x its own pairs'
    # rows, here enough): the gradients' dispatch of dy fits the same rows.
    ("tiny-mixtral", "ep=2,dp=1,capacity=1.5", 2),
    ("tiny-mixtral", "ep=2,pp=2,dp=1,capacity=1.5", 4),
    ("tiny-mixtral", "ep=2,tp=2,dp=1,capacity=1.5", 4),
    ("tiny-mixtral", "dp=2,ep=2,capacity=1.5", 4),
    ("tiny-qwen2-moe", "ep=2,dp=1", 2),
    ("tiny-qwen2-moe", "ep=2,tp=2,dp=1", 4),
    ("tiny-deepseek-v3", "ep=2,dp=1", 2),
    ("tiny-deepseek-v3", "tp=2,dp=1", 2),
    ("tiny-deepseek-v3", "ep=2,cp=2,tp=1,dp=1", 4),  # MLA's keys and values gathered over cp
    # Gemma 3 (not MoE): the 1 + w norms' and the scaled embedding's
    # gradients under TP (sequence parallelism) and two stages.
    ("tiny-gemma3", "tp=2,pp=2,dp=1", 4),
    ("tiny-gemma2", "tp=2,dp=1", 2),
]


@pytest.mark.parametrize("preset,pins,ranks", [("tiny-llama", *p) for p in TRAIN_PLANS] +
                         [("tiny-gpt2", *p) for p in GPT2_PLANS] + MOE_PLANS,
                         ids=[p[0] for p in TRAIN_PLANS] + ["gpt2-" + p[0] for p in GPT2_PLANS] +
                         [f"{p[0][5:]}-{p[1]}" for p in MOE_PLANS])
def test_sharded_gradients_match_single_rank(tmp_path, preset, pins, ranks):
    check_sharded_against_single_rank(tmp_path, preset, pins, ranks)


def check_sharded_against_single_rank(tmp_path, preset, pins, ranks, after=(), batch=2, **options):
    """`pins` on `ranks` ranks (dp replicas of `batch` rows each): the loss
    and every gradient equal one rank's over all the rows (within
    SHARDED_TOL, or SHARDED_REL_TOL of the largest |gradient| where that is
    more). `after`: passes after the partition. Returns the sharded model."""
    dp = int(re.search(r"dp=(\d+)", pins).group(1))
    model = Model(str(tmp_path), preset, loss=True, batch=batch, rows=batch * dp, **options)
    single_model = Model(str(tmp_path / "one"), preset, loss=True, batch=batch * dp, **options)
    single_loss, single = gradients(single_model, single_model.compile("train", autodiff=True), 1)
    exe = model.compile("sharded", f"prefill:batch={batch * dp},seq=8,{pins}", ranks, autodiff=True, after=after)
    loss, sharded = gradients(model, exe, ranks)
    assert abs(loss - single_loss) < 1e-5
    assert set(sharded) == set(single)
    for name in single:
        tol = max(SHARDED_TOL, SHARDED_REL_TOL * float(np.abs(single[name]).max()))
        assert np.abs(sharded[name] - single[name]).max() < tol, name
    return model


@pytest.mark.parametrize("preset,pins,ranks,batch", [("tiny-llama", "tp=2,dp=1", 2, 2),
                                                     ("tiny-llama", "tp=2,dp=1,sp=1", 2, 1),
                                                     ("tiny-gpt2", "tp=2,pp=2,dp=1", 4, 2)],
                         ids=["llama-tp2", "llama-tp2-sp-one-sequence", "gpt2-tp2-pp2"])
def test_tp_overlap_chunks_keep_the_gradients(tmp_path, preset, pins, ranks, batch):
    """--parax-tp-overlap (the GEMMs beside each TP collective in two row
    chunks, each chunk with a collective of its own; one sequence under
    sequence parallelism: the sequence viewed as the ranks' pieces, each
    piece's rows cut alike): the training step's loss and gradients still
    equal one rank's, and the program holds the chunks (the forward's and
    the backward's GEMMs)."""
    model = check_sharded_against_single_rank(tmp_path, preset, pins, ranks, batch=batch,
                                              after=["--parax-tp-overlap=chunks=2"])
    with open(os.path.join(model.dir, "sharded.mlir")) as f:
        ir = f.read()
    assert ir.count("parax.concat") >= 4, ir.count("parax.concat")


@pytest.mark.parametrize("preset,pins,ranks,batch", [
    ("tiny-mixtral", "ep=2,dp=1", 2, 2), ("tiny-mixtral", "ep=2,tp=2,dp=1", 4, 2),
    ("tiny-qwen2-moe", "ep=2,dp=1", 2, 2), ("tiny-mixtral", "cp=2,tp=1,dp=1,ep=1", 2, 1),
    ("tiny-mixtral", "dp=2,ep=2", 4, 4), ("tiny-mixtral", "pp=2,ep=2,dp=1", 4, 2)],
    ids=["mixtral-ep2", "mixtral-ep2-tp2", "qwen2-moe-ep2", "mixtral-cp2", "mixtral-dp2-ep2", "mixtral-pp2-ep2"])
def test_load_balancing_gradients_are_over_every_token(tmp_path, preset, pins, ranks, batch):
    """The load-balancing loss's gradient needs every token's load: with
    the tokens split (over ep, cp) each rank's router_load is a partial sum,
    all-reduced before router_aux_grad, and the gradients equal one rank's.
    Every layer's routers balance together (transformers' form): under
    PP2 each stage's layer load goes to the other stage.
    Data-parallel replicas (dp) each balance their own rows, as each
    replica's loss is its own (one rank given one replica's rows)."""
    dp = 2 if "dp=2" in pins else 1
    model = Model(str(tmp_path), preset, loss=True, batch=batch // dp, rows=batch, aux_loss=0.5)
    exe = model.compile("sharded", f"prefill:batch={batch},seq=8,{pins}", ranks, autodiff=True)
    text = open(exe.replace(".pxe", ".mlir")).read()
    assert "parax.router_load" in text and "parax.router_aux_grad" in text
    loss, sharded = gradients(model, exe, ranks)
    if dp == 1:
        one = Model(str(tmp_path / "one"), preset, loss=True, batch=batch, aux_loss=0.5)
        single_loss, single = gradients(one, one.compile("train", autodiff=True), 1)
    else:  # each replica its own rows and its own balance: the mean of two one-rank runs
        single_loss, single = replica_means(tmp_path, model, dp, aux_loss=0.5)
    assert abs(loss - single_loss) < 1e-5
    for name in single:
        tol = max(SHARDED_TOL, SHARDED_REL_TOL * float(np.abs(single[name]).max()))
        assert np.abs(sharded[name] - single[name]).max() < tol, name


@pytest.mark.parametrize("preset,pins,ranks,batch", [
    ("tiny-deepseek-v3", "ep=2,dp=1", 2, 2), ("tiny-deepseek-v3", "tp=2,dp=1", 2, 2),
    ("tiny-deepseek-v3", "ep=2,tp=2,dp=1", 4, 2), ("tiny-deepseek-v3", "cp=2,tp=1,dp=1,ep=1", 2, 1),
    ("tiny-deepseek-v3", "dp=2,ep=2", 4, 4), ("tiny-deepseek-v3", "pp=2,ep=2,dp=1", 4, 2),
    ("tiny-qwen2-moe", "ep=2,dp=1", 2, 2)],
    ids=["deepseek-v3-ep2", "deepseek-v3-tp2", "deepseek-v3-ep2-tp2", "deepseek-v3-cp2", "deepseek-v3-dp2-ep2",
         "deepseek-v3-pp2-ep2", "qwen2-moe-ep2"])
def test_sequence_balance_gradients_match_single_rank(tmp_path, preset, pins, ranks, batch):
    """DeepSeek-V3's sequence-wise balance loss (`sequence_aux`): each
    sequence's load is its own, so with the sequences split (ep, dp) each
    rank's rows of the per-sequence load are whole and the loss a partial
    sum over the sequences; with one sequence split (cp) its load is a
    partial sum, all-reduced before router_aux_grad. Unlike the batch-wise
    loss, data-parallel replicas give one rank's result over all the rows
    (the mean over sequences does not depend on who holds them). The
    gradients and the loss (cross-entropy plus the balance loss) equal one
    rank's, which test_gradients_match_finite_differences holds to numpy."""
    model = Model(str(tmp_path), preset, loss=True, batch=batch // (2 if "dp=2" in pins else 1), rows=batch,
                  aux_loss=0.5, overrides=SEQUENCE_AUX)
    exe = model.compile("sharded", f"prefill:batch={batch},seq=8,{pins}", ranks, autodiff=True)
    text = open(exe.replace(".pxe", ".mlir")).read()
    # (a load per sequence: [sequences, experts])
    assert re.search(r"parax\.router_load .*-> tensor<\d+x8xf32>", text) and "parax.router_aux_grad" in text
    loss, sharded = gradients(model, exe, ranks)
    one = Model(str(tmp_path / "one"), preset, loss=True, batch=batch, aux_loss=0.5, overrides=SEQUENCE_AUX)
    single_loss, single = gradients(one, one.compile("train", autodiff=True), 1)
    assert abs(single_loss - one.reference_loss()) < 1e-4
    assert abs(loss - single_loss) < 1e-5
    for name in single:
        tol = max(SHARDED_TOL, SHARDED_REL_TOL * float(np.abs(single[name]).max()))
        assert np.abs(sharded[name] - single[name]).max() < tol, name


@pytest.mark.parametrize("preset", ["tiny-mixtral", "tiny-qwen2-moe", "tiny-deepseek-v3"])
def test_moe_gradients_under_context_parallelism(tmp_path, preset):
    """One sequence split over cp=2 (an MoE model's microbatch is one
    sequence under CP): each rank routes its own tokens, so the experts'
    gradients are partial sums over cp, all-reduced when returned; the
    gradients equal one rank's."""
    model = Model(str(tmp_path), preset, loss=True, batch=1)
    single_loss, single = gradients(model, model.compile("train", autodiff=True), 1)
    exe = model.compile("cp2", "prefill:batch=1,seq=8,cp=2,tp=1,dp=1,ep=1", 2, autodiff=True)
    loss, sharded = gradients(model, exe, 2)
    assert abs(loss - single_loss) < 1e-5
    for name in single:
        tol = max(SHARDED_TOL, SHARDED_REL_TOL * float(np.abs(single[name]).max()))
        assert np.abs(sharded[name] - single[name]).max() < tol, name


# (workload pins, ranks, layers, rows: microbatches of 2 rows)
MICRO_PLANS = [
    (None, 1, 2, 4),
    ("pp=2,dp=1", 2, 2, 4),
    ("pp=2,tp=2,dp=1", 4, 2, 8),   # 4 microbatches, 2 in flight on stage 0
    ("pp=4,dp=1", 4, 4, 12),       # 6 microbatches; stage s keeps 4 - s in flight
]


@pytest.mark.parametrize("preset,pins,ranks,layers,rows,balance",
                         [("tiny-llama", *p, {}) for p in MICRO_PLANS] +
                         [("tiny-mixtral", "ep=2,pp=2,dp=1", 4, 2, 8, {}),  # EP's exchanges inside 1F1B
                          # the sequence-wise balance loss: each microbatch's sequences' mean, averaged
                          ("tiny-deepseek-v3", "ep=2,pp=2,dp=1", 4, 2, 8,
                           {"aux_loss": 0.5, "overrides": SEQUENCE_AUX}),
                          # multi-token prediction: each microbatch's depth counted over its own rows
                          ("tiny-deepseek-v3", "ep=2,pp=2,dp=1", 4, 2, 8, {"mtp_weight": 0.3}),
                          # the embedding tied to the head: the first stage sends its gradient's
                          # sum back to the last, which receives it in its tail, after the next
                          # microbatch's range (the first stage runs that forward pass first)
                          ("tiny-gpt2", "pp=2,dp=1", 2, 2, 8, {}),
                          # ... from a stage that is not a neighbour: the last stage's gradient
                          # of it sent after the one its neighbour waits for
                          ("tiny-gpt2", "pp=4,dp=1", 4, 4, 12, {}),
                          ("tiny-llama", "pp=4,dp=1", 4, 4, 8, {"overrides": {"mtp_layers": 1}, "mtp_weight": 0.3})],
                         ids=["single", "pp2", "tp2-pp2-4micro", "pp4-6micro", "mixtral-ep2-pp2-4micro",
                              "deepseek-v3-seq-aux-ep2-pp2-4micro", "deepseek-v3-mtp-ep2-pp2-4micro", "gpt2-pp2-4micro",
                              "gpt2-pp4-6micro", "llama-mtp-pp4-4micro"])
def test_microbatch_gradients_are_averaged(tmp_path, preset, pins, ranks, layers, rows, balance):
    """Rows through an executable of batch 2: microbatches, whose gradients
    parax-run averages (each a mean over its tokens), equal the gradients
    of one batch of all the rows on one rank. Through pipeline stages the
    microbatches run 1F1B: a stage runs the forward halves of as many
    microbatches as stages follow it, then one forward and one backward
    half in turn, each microbatch in flight with activations of its own."""
    model = Model(str(tmp_path), preset, loss=True, batch=2, rows=rows, layers=layers, **balance)
    whole = Model(str(tmp_path / "whole"), preset, loss=True, batch=rows, layers=layers, **balance)
    workload = pins and f"prefill:batch=2,seq=8,{pins}"
    exe = model.compile("micro", workload, ranks, autodiff=True)
    loss, micro = gradients(model, exe, ranks)
    whole_loss, grads = gradients(whole, whole.compile("whole", autodiff=True), 1)
    assert abs(loss - whole_loss) < 1e-5
    for name in grads:
        assert np.abs(micro[name] - grads[name]).max() < SHARDED_TOL, name
    if pins and "pp" in pins:
        proc = model.run(exe, ranks, outputs=0, expect_ok=False)
        assert proc.returncode == 0, proc.stderr
        assert f"schedule 1f1b over {rows // 2} microbatches" in proc.stdout, proc.stdout


# (preset, workload pins or None, ranks, rows: microbatches of 2)
RECOMPUTE_PLANS = [("tiny-llama", None, 1, 2), ("tiny-llama", "tp=2,pp=2,dp=1", 4, 2),
                   ("tiny-llama", "pp=2,dp=1", 2, 4), ("tiny-mixtral", "ep=2,dp=1", 2, 2),
                   ("tiny-gpt2", "tp=2,dp=1", 2, 2), ("tiny-llama", "cp=2,tp=2,dp=1", 4, 2),
                   ("tiny-deepseek-v3", "tp=2,dp=1", 2, 2)]


@pytest.mark.parametrize("mode", ["selective", "full"])
@pytest.mark.parametrize("preset,pins,ranks,rows", RECOMPUTE_PLANS,
                         ids=[f"{p[0][5:]}-{p[1] or 'one'}-{p[3] // 2}micro" for p in RECOMPUTE_PLANS])
def test_recomputed_activations_give_the_same_gradients(tmp_path, preset, pins, ranks, rows, mode):
    """--parax-recompute: each layer's forward ops (all, or the cheap ones:
    DeepSeek-V3's kv_b_proj up-projection among them) run again before its
    gradient ops, which read the copies (collectives included: TP's
    all-reduces, EP's dispatch and combine, a pipeline stage's; under 1F1B
    with two microbatches too); the loss and every
    gradient are those of the step that kept its activations (the same ops
    on the same values)."""
    model = Model(str(tmp_path), preset, loss=True, batch=2, rows=rows)
    workload = pins and f"prefill:batch=2,seq=8,{pins}"
    kept_loss, kept = gradients(model, model.compile("kept", workload, ranks, autodiff=True), ranks)
    exe = model.compile("again", workload, ranks, autodiff=True, recompute=mode)
    text = open(exe.replace(".pxe", ".mlir")).read()
    kept_text = open(os.path.join(model.dir, "kept.mlir")).read()
    op = "parax.rms_norm " if preset != "tiny-gpt2" else "parax.layer_norm "
    assert text.count(op) > kept_text.count(op), "nothing was recomputed"
    if preset == "tiny-deepseek-v3":  # kv_b_proj, 8x its latent: made again from the latent's norm
        assert text.count("parax.linear ") > kept_text.count("parax.linear "), "kv_b_proj was not recomputed"
    if pins and "pp=2" in pins:
        # Stage 0 receives its gradient before it recomputes anything: 1F1B
        # runs the copies in the backward half (after the first receive).
        def before_receive(mlir):
            first_stage = mlir.split("func.func")[1]
            return first_stage.split("parax.recv")[0].count(op)
        assert before_receive(text) == before_receive(kept_text)
    loss, again = gradients(model, exe, ranks)
    assert abs(loss - kept_loss) < 1e-6
    for name in kept:
        assert np.abs(again[name] - kept[name]).max() < 1e-6, name


@pytest.mark.parametrize("schedule,said", [
    ("gpipe", ["schedule gpipe over 4 microbatches (4 in flight on stage 0)"]),
    ("1f1b", ["schedule 1f1b over 4 microbatches (2 in flight on stage 0)"]),
    ("interleaved", ["schedule interleaved 1f1b (2 model chunks a stage) over 4 microbatches (4 in flight on stage 0)"]),
])
def test_the_plans_pipeline_schedule_is_run_or_named(tmp_path, schedule, said):
    """A plan's schedule reaches parax-run: GPipe runs every forward half
    before the backward halves (stage 0 holds all 4 microbatches at once,
    1F1B 2), interleaved 1F1B each stage's two model chunks in turn; each
    gives one batch's gradients."""
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, rows=8, layers=4)
    whole = Model(str(tmp_path / "whole"), "tiny-llama", loss=True, batch=8, layers=4)
    exe = model.compile(schedule, f"train:batch=8,seq=8,pp=2,dp=1,mbs=2,schedule={schedule}", 2, autodiff=True)
    ir = open(exe.replace(".pxe", ".mlir")).read()  # (1f1b, the default, is not printed)
    assert ('schedule = ' not in ir) if schedule == "1f1b" else (f'schedule = "{schedule}"' in ir)
    loss, grads = gradients(model, exe, 2)
    whole_loss, want = gradients(whole, whole.compile("whole", autodiff=True), 1)
    assert abs(loss - whole_loss) < 1e-5
    for name in want:
        assert np.abs(grads[name] - want[name]).max() < SHARDED_TOL, name
    proc = model.run(exe, 2, outputs=0, expect_ok=False)
    assert proc.returncode == 0 and all(s in proc.stdout for s in said), proc.stdout + proc.stderr


# (preset, workload pins, ranks, layers, rows: microbatches of 2)
INTERLEAVED_PLANS = [
    ("tiny-llama", "pp=2,chunks=2", 2, 4, 8),
    ("tiny-llama", "pp=2,chunks=3", 2, 6, 4),       # odd chunks; as many microbatches as stages
    ("tiny-llama", "pp=2,chunks=2", 2, 6, 8),       # each stage's 3 layers in chunks of 2 and 1
    ("tiny-llama", "pp=2,tp=2,chunks=2", 4, 4, 8),
    ("tiny-llama", "pp=2,dp=2,chunks=2", 4, 4, 16),
    ("tiny-llama", "pp=4,chunks=2", 4, 8, 16),       # the last chunk's activations wrap to stage 0
    ("tiny-gpt2", "pp=2,chunks=2", 2, 4, 8),         # the tied embedding on virtual stages 0 and 3
    ("tiny-llama", "pp=2,chunks=2", 2, 4, 8, {"overrides": {"mtp_layers": 1}, "mtp_weight": 0.3}),  # ... and MTP's
    ("tiny-mixtral", "pp=2,ep=2,chunks=2", 4, 4, 8),  # EP's exchanges inside the chunks
]


@pytest.mark.parametrize("preset,pins,ranks,layers,rows,options", [p if len(p) > 5 else p + ({},) for p in INTERLEAVED_PLANS],
                         ids=[f"{p[0][5:]}{'-mtp' if len(p) > 5 else ''}-{p[1].replace(',', '-').replace('=', '')}"
                              for p in INTERLEAVED_PLANS])
def test_interleaved_1f1b_gives_one_batchs_gradients(tmp_path, preset, pins, ranks, layers, rows, options):
    """Interleaved 1F1B (Megatron's virtual pipeline): the layers cut into
    pp x chunks virtual stages, virtual stage c on stage c % pp; each stage
    runs its chunks' forward and backward passes in Megatron's order, the
    microbatches in groups of pp. The loss and every gradient are one
    batch's of all the rows on one rank."""
    pinned = dict(kv.split("=") for kv in pins.split(","))
    pp, chunks, dp = (int(pinned.get(k, 1)) for k in ("pp", "chunks", "dp"))
    model = Model(str(tmp_path), preset, loss=True, batch=2, rows=rows, layers=layers, **options)
    whole = Model(str(tmp_path / "whole"), preset, loss=True, batch=rows, layers=layers, **options)
    extra = "" if "dp=" in pins else ",dp=1"
    exe = model.compile("chunks", f"train:batch={rows},seq=8,mbs=2,schedule=interleaved,{pins}{extra}", ranks,
                        autodiff=True)
    text = open(exe.replace(".pxe", ".mlir")).read()
    assert text.count(f"chunks = {chunks},") == pp, "every stage function runs its chunks"
    # Each stage's chunks begin their forward passes (but the first) and
    # their backward passes (but the last stage's last chunk) at a marked
    # receive.
    assert text.count("range_start") == pp * (2 * chunks - 1) - 1
    loss, grads = gradients(model, exe, ranks)
    whole_loss, want = gradients(whole, whole.compile("whole", autodiff=True), 1)
    assert abs(loss - whole_loss) < 1e-5
    for name in want:
        assert np.abs(grads[name] - want[name]).max() < SHARDED_TOL, name
    proc = model.run(exe, ranks, outputs=0, expect_ok=False)
    assert proc.returncode == 0, proc.stderr
    said = f"schedule interleaved 1f1b ({chunks} model chunks a stage) over {rows // 2 // dp} microbatches"
    assert said in proc.stdout, proc.stdout


@pytest.mark.parametrize("mode", ["selective", "full"])
def test_interleaved_1f1b_with_recomputed_activations(tmp_path, mode):
    """--parax-recompute under interleaved chunks: each chunk's copies run
    in its backward range (after the receive that begins it); one batch's
    loss and gradients still."""
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, rows=8, layers=4)
    whole = Model(str(tmp_path / "whole"), "tiny-llama", loss=True, batch=8, layers=4)
    exe = model.compile("chunks", "train:batch=8,seq=8,mbs=2,schedule=interleaved,pp=2,chunks=2,dp=1", 2,
                        autodiff=True, recompute=mode)
    loss, grads = gradients(model, exe, 2)
    whole_loss, want = gradients(whole, whole.compile("whole", autodiff=True), 1)
    assert abs(loss - whole_loss) < 1e-5
    for name in want:
        assert np.abs(grads[name] - want[name]).max() < SHARDED_TOL, name


def test_interleaved_1f1b_needs_microbatches_in_groups_of_the_stages(tmp_path):
    """Megatron's rule: the microbatches come in groups of pp. An executable
    built for 4 run with 3 stops with the reason, before any step."""
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, rows=6, layers=4)
    exe = model.compile("chunks", "train:batch=8,seq=8,mbs=2,schedule=interleaved,pp=2,chunks=2,dp=1", 2,
                        autodiff=True)
    proc = model.run(exe, 2, outputs=0, expect_ok=False)
    assert proc.returncode != 0
    assert "interleaved 1F1B over 2 stages needs the microbatches (3) to be a multiple of the stages" in proc.stderr


def test_output_dir_writes_each_gradient_under_its_name(tmp_path):
    """`parax-run --output-dir DIR`: the loss as result0.npy and every
    gradient as <checkpoint name>.npy (a piece of GPT-2's fused QKV weight,
    split by the plan, as <name>@<offsets>.npy; a stack of experts one file
    per expert), the same values --output writes; a folder that does not
    exist is named."""
    model = Model(str(tmp_path), "tiny-gpt2", loss=True)
    exe = model.compile("tp2", "prefill:batch=2,seq=8,tp=2,dp=1", 2, autodiff=True)
    loss, grads = gradients(model, exe, 2)
    out = tmp_path / "grads"
    out.mkdir()
    model.run(exe, 2, extra=["--output-dir", str(out)], outputs=0)
    files = sorted(p.name for p in out.iterdir())
    assert "result0.npy" in files and any("@" in name for name in files), files
    assert float(np.load(out / "result0.npy")) == loss
    for name in model.weights:
        pieces = [f for f in files if f == name + ".npy" or f.startswith(name + "@")]
        assert pieces, name
        if pieces == [name + ".npy"]:
            assert np.array_equal(np.load(out / pieces[0]), grads[name]), name
        else:  # each piece where its offsets put it
            for piece in pieces:
                offset = [int(o) for o in piece[len(name) + 1:-len(".npy")].split(",")]
                value = np.load(out / piece)
                box = tuple(slice(o, o + n) for o, n in zip(offset, value.shape))
                assert np.array_equal(value, grads[name][box]), piece
    proc = model.run(exe, 2, extra=["--output-dir", str(tmp_path / "missing")], outputs=0, expect_ok=False)
    assert proc.returncode != 0 and "--output-dir" in proc.stderr and "not a directory" in proc.stderr
    # A stack of experts: one file per expert, as the checkpoint names them.
    moe = Model(str(tmp_path / "moe"), "tiny-mixtral", loss=True)
    exe = moe.compile("ep2", "prefill:batch=2,seq=8,ep=2,dp=1", 2, autodiff=True)
    _, grads = gradients(moe, exe, 2)
    out = tmp_path / "moe-grads"
    out.mkdir()
    moe.run(exe, 2, extra=["--output-dir", str(out)], outputs=0)
    assert sorted(p.name for p in out.iterdir()) == sorted(["result0.npy"] + [n + ".npy" for n in moe.weights])
    for name in moe.weights:
        assert np.array_equal(np.load(out / (name + ".npy")), grads[name]), name


@pytest.mark.parametrize("preset,overrides,aux", [("tiny-deepseek-v3", None, 0), ("tiny-llama", {"mtp_layers": 2}, 0),
                                                  ("tiny-deepseek-v3", SEQUENCE_AUX, 0.5)],
                         ids=["deepseek-v3", "llama-2-depths", "deepseek-v3-seq-aux"])
def test_multi_token_prediction_matches_numpy(tmp_path, preset, overrides, aux):
    """DeepSeek-V3's multi-token prediction (one depth, its preset's
    num_nextn_predict_layers; Llama given two), weight 0.3: the loss is the
    cross-entropy plus 0.3 / D times each depth's (its module's decoder
    layer, eh_proj over [enorm(embedding of the tokens k ahead);
    hnorm(hidden)], its own final norm, the shared embedding and head, the
    labels k ahead, the last k positions not counted), numpy's; every
    gradient, the shared embedding's and head's (read by the trunk and
    each depth) and the modules' own, is that loss's (finite differences
    of numpy's). With DeepSeek-V3's sequence-wise balance loss the module's
    router is balanced too."""
    model = Model(str(tmp_path), preset, loss=True, overrides=overrides, mtp_weight=0.3, aux_loss=aux)
    text = open(model.ir).read()
    assert text.count("parax.shift") == 2 * model.mtp_depths and text.count("parax.cross_entropy") == 1 + model.mtp_depths
    loss, grads = gradients(model, model.compile("train", autodiff=True), 1)
    weights = {k: v.astype(np.float64) for k, v in model.weights.items()}
    assert abs(loss - numpy_loss(model, weights)) < 1e-4
    plain = Model(str(tmp_path / "plain"), preset, loss=True, overrides=overrides, aux_loss=aux)
    assert abs(loss - gradients(plain, plain.compile("train", autodiff=True), 1)[0]) > 1e-2
    assert set(grads) == {name for name in model.weights if "e_score_correction_bias" not in name}
    last = f"model.layers.{model.cfg.layers + model.mtp_depths - 1}"
    names = [n for n in sorted(grads) if n.startswith(last) and "experts.3" not in n][:8]
    names += ["model.embed_tokens.weight", "lm_head.weight", "model.layers.0.self_attn.o_proj.weight"]
    check_directional_derivatives(model, weights, grads, names, seed=5)


MTP_PLANS = [("tiny-deepseek-v3", "ep=2,dp=1", 2), ("tiny-deepseek-v3", "tp=2,dp=1", 2),
             ("tiny-deepseek-v3", "pp=2,dp=1", 2), ("tiny-deepseek-v3", "ep=2,tp=2,dp=1", 4),
             ("tiny-deepseek-v3", "dp=2,ep=2", 4), ("tiny-deepseek-v3", "pp=2,ep=2,dp=1", 4),
             ("tiny-llama", "tp=2,pp=2,dp=1", 4), ("tiny-llama", "dp=2", 2)]


@pytest.mark.parametrize("preset,pins,ranks", MTP_PLANS, ids=[f"{p[0][5:]}-{p[1]}" for p in MTP_PLANS])
def test_multi_token_prediction_under_sharding(tmp_path, preset, pins, ranks):
    """Multi-token prediction (weight 0.3; Llama two depths) on N ranks:
    loss and gradients equal one rank's over all the rows. The module
    reads the tokens shifted within each row (rows split over dp and ep as
    they are), its embedding and head are the trunk's (the pipeline's first
    and last stage hold the embedding both), its labels shifted and counted
    whole on every rank like the main loss's."""
    overrides = {"mtp_layers": 2} if preset == "tiny-llama" else None
    check_sharded_against_single_rank(tmp_path, preset, pins, ranks, overrides=overrides, mtp_weight=0.3)


def test_multi_token_prediction_has_no_context_parallelism(tmp_path):
    """A shift of the tokens needs each whole sequence: the planner offers
    no cp with multi-token prediction, and says so when cp is pinned."""
    from conftest import ORACLE_CLUSTER, tool
    import subprocess
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=1, overrides={"mtp_layers": 1}, mtp_weight=0.3)
    proc = subprocess.run([tool("parax-opt"), model.ir, f"--parax-plan=cluster={ORACLE_CLUSTER}:devices_per_node=2 "
                           "workload=prefill:batch=1,seq=8,cp=2,tp=1,dp=1"], capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert "none with multi-token prediction" in proc.stderr, proc.stderr


# Hand-written shardings (parax.shardings on the forward ops), so that the
# backward meets a given pattern whatever the planner would choose: x read
# by a column-parallel linear (its dx a partial sum over tp) and a
# replicated one (its dx whole); the partitioner adds the two as a partial
# sum (the whole one kept on one rank) and reduces it once, for the
# embedding's gradient.
HAND_SHARDED = """{grid}func.func @forward(%tokens: tensor<2x8xi32>, %labels: tensor<2x8xi32>,
    %table: tensor<64x16xf32> {{parax.param = "table"}},
    %w1: tensor<32x16xf32> {{parax.param = "w1"{w1}}},
    %w2: tensor<32x16xf32> {{parax.param = "w2"}}) -> tensor<f32> {{
  %x = parax.embedding %tokens, %table {whole3} : (tensor<2x8xi32>, tensor<64x16xf32>) -> tensor<2x8x16xf32>
  %y1 = parax.linear %x, %w1 {{transpose_w{column}}} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %y2 = parax.linear %x, %w2 {{transpose_w{whole}}} : (tensor<2x8x16xf32>, tensor<32x16xf32>) -> tensor<2x8x32xf32>
  %z = parax.add %y1, %y2 {whole3} : (tensor<2x8x32xf32>, tensor<2x8x32xf32>) -> tensor<2x8x32xf32>
  %l = parax.cross_entropy %z, %labels : (tensor<2x8x32xf32>, tensor<2x8xi32>) -> tensor<f32>
  return %l : tensor<f32>
}}
"""
HAND_SHARDINGS = {"grid": "parax.grid @g(tp = 2)\n",
                  "w1": ", parax.sharding = #parax.sharding<@g, [{tp}, {}]>",
                  "whole3": "{parax.shardings = [#parax.sharding<@g, [{}, {}, {}]>]}",
                  "column": ", parax.shardings = [#parax.sharding<@g, [{}, {}, {tp}]>]",
                  "whole": ", parax.shardings = [#parax.sharding<@g, [{}, {}, {}]>]"}


def test_hand_sharded_backward_sums_match_single_rank(tmp_path):
    """A partial sum plus a whole value in the backward (x's two dx):
    added as a partial sum, to_partial keeping the whole one on one rank;
    the loss and every gradient on 2 ranks equal one rank's."""
    import subprocess
    from conftest import MPI_ENV, tool
    from parax.checkpoint import save_safetensors
    rng = np.random.default_rng(5)
    weights = {"table": rng.standard_normal((64, 16)).astype(np.float32),
               "w1": rng.standard_normal((32, 16)).astype(np.float32) * 0.3,
               "w2": rng.standard_normal((32, 16)).astype(np.float32) * 0.3}
    save_safetensors(str(tmp_path / "w.safetensors"), weights)
    for name, high in (("tokens", 64), ("labels", 32)):
        np.save(tmp_path / f"{name}.npy", rng.integers(0, high, size=(2, 8)).astype(np.int32))
    results = {}
    for ranks, passes in ((1, ["--parax-autodiff"]), (2, ["--parax-autodiff", "--parax-partition"])):
        model = tmp_path / f"model{ranks}.mlir"
        model.write_text(HAND_SHARDED.format(**(HAND_SHARDINGS if ranks > 1 else dict.fromkeys(HAND_SHARDINGS, ""))))
        ir, exe = tmp_path / f"r{ranks}.mlir", tmp_path / f"r{ranks}.pxe"
        for cmd in ([tool("parax-opt"), str(model), *passes, "-o", str(ir)],
                    [tool("parax-translate"), "--to-executable", str(ir), "-o", str(exe)]):
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
            assert proc.returncode == 0, proc.stderr
        text = ir.read_text()
        if ranks == 2:
            assert "parax.to_partial" in text and text.count("parax.all_reduce") == 1, text
        names = ["loss"] + re.findall(r'parax\.grad = "(\w+)"', text)
        outs = [str(tmp_path / f"r{ranks}-{name}.npy") for name in names]
        proc = subprocess.run(["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none",
                               tool("parax-run"), str(exe), "--weights", str(tmp_path / "w.safetensors"),
                               "--input", str(tmp_path / "tokens.npy"), "--input", str(tmp_path / "labels.npy"),
                               *[a for out in outs for a in ("--output", out)]],
                              capture_output=True, text=True, timeout=120, env=MPI_ENV)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        results[ranks] = {name: np.load(out) for name, out in zip(names, outs)}
    assert set(results[1]) == set(results[2]) == {"loss", "table", "w1", "w2"}
    for name, want in results[1].items():
        assert np.abs(results[2][name] - want).max() < SHARDED_TOL, name
