"""The oracle: a partitioned program on N ranks under a real mpirun computes
what the unpartitioned graph computes on one, and the single-rank program
computes what an independent numpy implementation does.

Tolerances (fp32 everywhere): single rank vs numpy 1e-4 absolute; sharded vs
single rank 1e-5 absolute (only the order of floating-point sums differs).
"""

import math
import json
import os
import re

import numpy as np
import pytest

from conftest import MPI_ENV, Model, replicas, tool, uneven_boxes
from parax import reference

NUMPY_TOL = 1e-4
SHARDED_TOL = 1e-5


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gpt2", "tiny-mixtral", "tiny-qwen2-moe",
                                    "tiny-deepseek-v3"])
def test_single_rank_matches_numpy(tmp_path, preset):
    model = Model(str(tmp_path), preset)
    logits = model.run(model.compile("single"), 1)
    ref = model.reference()
    assert logits.shape == ref.shape
    assert np.abs(logits - ref).max() < NUMPY_TOL


# (preset, layers, workload pins, ranks)
PLANS = [
    ("tiny-llama", None, "tp=2,dp=1", 2),
    ("tiny-llama", None, "tp=4,dp=1", 4),      # 2 KV heads on 4 ranks: replicated KV
    ("tiny-llama", None, "pp=2,dp=1", 2),
    ("tiny-llama", 4, "pp=4,dp=1", 4),
    ("tiny-llama", None, "dp=2", 2),
    ("tiny-llama", None, "tp=2,pp=2,dp=1", 4),
    ("tiny-llama", None, "dp=2,tp=2", 4),
    ("tiny-llama", None, "dp=2,tp=2,pp=2", 8),
    ("tiny-gpt2", None, "tp=2,dp=1", 2),
    ("tiny-mixtral", None, "ep=2,dp=1", 2),
    ("tiny-mixtral", None, "ep=4,dp=1", 4),    # (the planner's batch: 4 replicas)
    ("tiny-mixtral", None, "ep=2,tp=2,dp=1", 4),
    ("tiny-qwen2-moe", None, "ep=2,dp=1", 2),
    ("tiny-deepseek-v3", None, "ep=2,dp=1", 2),
    ("tiny-deepseek-v3", None, "tp=2,dp=1", 2),
    # Qwen2 (q/k/v biases, tied embeddings), Qwen3 (each head's q and k
    # normalised: a norm over a split of heads), Qwen3-MoE, Mistral.
    ("tiny-qwen2", None, "tp=2,dp=1", 2),
    ("tiny-qwen3", None, "tp=2,dp=1", 2),
    ("tiny-qwen3", None, "cp=2,tp=1,dp=1", 2),
    ("tiny-qwen3-moe", None, "ep=2,tp=2,dp=1", 4),
    ("tiny-mistral", None, "tp=2,pp=2,dp=1", 4),
    ("tiny-phi3", None, "tp=2,dp=1", 2),  # (pieces of the fused tensors on each rank)
    # Gemma 3: 1 + w norms (the q/k ones over a split of heads), the
    # embedding's scale on a split table, local and global layers on stages.
    ("tiny-gemma3", None, "tp=2,pp=2,dp=1", 4),
    ("tiny-gemma2", None, "tp=2,dp=1", 2),  # soft-capped scores over split heads, capped logits
    # Context parallelism: each rank a piece of every sequence, keys and
    # values gathered for attention (rope, causal mask and GPT-2's position
    # table offset by the piece).
    ("tiny-llama", None, "cp=2,tp=1,dp=1", 2),
    ("tiny-llama", None, "cp=4,tp=1,dp=1", 4),
    ("tiny-llama", None, "cp=2,tp=2,dp=1", 4),  # (with sequence parallelism inside each piece)
    ("tiny-llama", None, "cp=2,pp=2,tp=1,dp=1", 4),
    ("tiny-llama", None, "cp=2,dp=2,tp=1", 4),
    ("tiny-gpt2", None, "cp=2,tp=1,dp=1", 2),
    ("tiny-gpt2", None, "cp=2,tp=2,dp=1", 4),
]


@pytest.mark.parametrize("preset,layers,pins,ranks", PLANS,
                         ids=[f"{p[0]}-{p[2]}" for p in PLANS])
def test_sharded_matches_single_rank(tmp_path, preset, layers, pins, ranks):
    dp = replicas(pins)
    model = Model(str(tmp_path), preset, layers=layers, rows=2 * dp)
    single = model.run(model.compile("single"), 1)
    workload = f"prefill:batch={2 * dp if dp > 1 else max(2, ranks)},seq=8,{pins}"
    profile = os.path.join(str(tmp_path), "sharded-profile.json")
    sharded = model.run(model.compile("sharded", workload, ranks), ranks, extra=["--profile", profile])
    assert np.abs(sharded - single).max() < SHARDED_TOL
    assert np.abs(sharded - model.reference()).max() < NUMPY_TOL
    assert_ran_sharded(model, pins, ranks, profile)


@pytest.mark.parametrize("preset,pins,ranks,batch", [("tiny-llama", "tp=2,dp=1", 2, 2), ("tiny-gpt2", "tp=2,dp=1", 2, 2),
                                                     ("tiny-llama", "tp=2,pp=2,dp=1", 4, 4),
                                                     ("tiny-llama", "tp=2,dp=1,sp=1", 2, 1)],
                         ids=["llama-tp2", "gpt2-tp2", "llama-tp2-pp2", "llama-tp2-sp-one-sequence"])
def test_tp_overlap_chunks_compute_the_same(tmp_path, preset, pins, ranks, batch):
    """--parax-tp-overlap splits the GEMMs beside each TP collective into
    row chunks, each chunk with a collective of its own (one sequence under
    sequence parallelism: along the sequence, viewed as the ranks' pieces):
    the program computes what the unsplit one does (the same rows reach the
    same ranks) and numpy."""
    model = Model(str(tmp_path), preset, batch=batch, rows=batch)
    workload = f"prefill:batch={batch},seq=8,{pins}"
    plain = model.run(model.compile("sharded", workload, ranks), ranks)
    chunked = model.run(model.compile("chunked", workload, ranks, after=["--parax-tp-overlap=chunks=2"]), ranks)
    with open(os.path.join(str(tmp_path), "chunked.mlir")) as f:
        ir = f.read()
    assert ir.count("parax.concat") >= 2 and ir.count("parax.slice") >= 4, ir
    assert np.abs(chunked - plain).max() < SHARDED_TOL
    assert np.abs(chunked - model.reference()).max() < NUMPY_TOL


# The collectives a parallel dimension needs a rank to run (a forward pass):
# tp's partial sums reduced (or sequence-parallel gathers and scatters), cp's
# keys and values gathered, pp's activations sent and received, ep's tokens
# exchanged (the MoE dispatch and combine: all-to-alls).
NEEDS = {"tp": {"all_reduce", "reduce_scatter", "all_gather"}, "cp": {"all_gather"},
         "pp": {"send", "recv"}, "ep": {"moe_dispatch", "moe_combine", "all_to_all"}}


def assert_ran_sharded(model, pins, ranks, profile):
    """What each rank held and exchanged (issue 45: a partitioner that
    quietly kept every weight whole on every rank, or ran each rank's
    work alone, would pass the comparisons of the outputs): every rank's
    --profile gives the parameter values it loaded and the instructions it
    ran. Under tp, pp or ep each rank holds less than the whole model and
    the model-parallel ranks of a replica hold all of it between them; under
    dp and cp alone each holds all of it. Each dimension of more than one
    rank runs its collectives (pp: a stage sends or receives) over groups of
    its size."""
    whole = sum(w.size for w in model.weights.values())
    degrees = {axis: int(size) for axis, size in (item.split("=") for item in pins.split(","))}
    runs = [json.load(open(profile if r == 0 else f"{profile}.rank{r}")) for r in range(ranks)]
    held = [int(run["parameter_values"]) for run in runs]
    split = [axis for axis in ("tp", "pp", "ep") if degrees.get(axis, 1) > 1]
    if split:
        assert max(held) < whole, (held, whole)
        # The ranks of one replica and one piece of the sequence: the model
        # between them.
        axes = runs[0]["grid"]["axes"]
        first = [h for h, run in zip(held, runs)
                 if all(c == 0 for axis, c in zip(axes, run["coordinates"]) if axis not in split)]
        assert len(first) == int(np.prod([degrees[axis] for axis in split])) and sum(first) >= whole, (held, whole)
    else:
        assert held == [whole] * ranks, (held, whole)
    for axis, size in degrees.items():
        if size <= 1 or axis not in NEEDS:
            continue
        for r, run in enumerate(runs):
            ran = {inst["op"] for inst in run["instructions"] if inst["op"] in NEEDS[axis] and
                   (axis == "pp" or axis in inst["attrs"].get("axes", []))}
            assert ran, (axis, r, [inst["op"] for inst in run["instructions"]])


@pytest.mark.parametrize("pins,ranks", [("cp=2,tp=1,dp=1", 2), ("tp=2,pp=2,dp=1", 4)])
def test_sliding_window_sharded_matches_single_rank(tmp_path, pins, ranks):
    """Mistral with a window of 3 keys over 8 tokens: under context
    parallelism each rank's queries see their last 3 keys of the gathered
    sequence (positions, not the piece's rows); under TP and PP every
    stage's attention keeps its window."""
    model = Model(str(tmp_path), "tiny-mistral", rows=2, overrides={"sliding_window": 3})
    assert "window = 3" in open(model.ir).read()
    single = model.run(model.compile("single"), 1)
    sharded = model.run(model.compile("sharded", f"prefill:batch={max(2, ranks)},seq=8,{pins}", ranks), ranks)
    assert np.abs(sharded - single).max() < SHARDED_TOL
    assert np.abs(single - model.reference()).max() < NUMPY_TOL


@pytest.mark.parametrize("preset", ["tiny-mixtral", "tiny-qwen2-moe", "tiny-deepseek-v3"])
def test_context_parallel_moe_routes_each_ranks_tokens(tmp_path, preset):
    """Context parallelism over an MoE model, one sequence: its tokens
    ([1 x S] merged) keep the sequence split, so each rank routes its own
    positions through the experts; keys and values (MLA's too) gathered."""
    model = Model(str(tmp_path), preset, batch=1, rows=1)
    single = model.run(model.compile("single"), 1)
    exe = model.compile("sharded", "prefill:batch=1,seq=8,cp=2,tp=1,dp=1,ep=1", 2)
    with open(os.path.join(str(tmp_path), "sharded.mlir")) as f:
        text = f.read()
    # Experts on 4 of the 8 positions a rank: the split reached them.
    experts = [line for line in text.splitlines() if "= parax.experts" in line]
    assert experts and all(": (tensor<1x4x64xf32>," in line for line in experts), experts
    sharded = model.run(exe, 2)
    assert np.abs(sharded - single).max() < SHARDED_TOL
    assert np.abs(sharded - model.reference()).max() < NUMPY_TOL


# A step over a KV cache: the cache's keys and values are inputs (the numpy
# reference's, of the earlier tokens alone), and the step's logits must equal
# the whole sequence's forward pass at its last positions -- which also holds
# the reference's cache to its own full pass.
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gpt2", "tiny-mixtral", "tiny-qwen2-moe",
                                    "tiny-deepseek-v3"])
@pytest.mark.parametrize("seq", [1, 3], ids=["decode", "chunk-of-3"])
def test_step_over_a_kv_cache_matches_the_whole_sequence(tmp_path, preset, seq):
    model = Model(str(tmp_path), preset, seq=seq, past=6)
    logits = model.run(model.compile("single"), 1)
    ref = model.reference()
    assert logits.shape == ref.shape == (2, seq, model.cfg.vocab)
    assert np.abs(logits - ref).max() < NUMPY_TOL


DECODE_PLANS = [
    ("tiny-llama", "tp=2,dp=1", 2),
    ("tiny-llama", "tp=4,dp=1", 4),      # 2 KV heads on 4 ranks: the cache replicated
    ("tiny-llama", "pp=2,dp=1", 2),      # each stage loads its layers' cache only
    ("tiny-llama", "dp=2,tp=2,pp=2", 8),
    ("tiny-gpt2", "tp=2,dp=1", 2),
    ("tiny-mixtral", "ep=2,tp=2,dp=1", 4),
    ("tiny-deepseek-v3", "tp=2,dp=1", 2),
]


@pytest.mark.parametrize("preset,pins,ranks", DECODE_PLANS,
                         ids=[f"{p[0]}-{p[1]}" for p in DECODE_PLANS])
def test_decode_step_sharded_matches_single_rank(tmp_path, preset, pins, ranks):
    dp = replicas(pins)
    model = Model(str(tmp_path), preset, seq=1, past=6, rows=2 * dp)
    single = model.run(model.compile("single"), 1)
    sharded = model.run(model.compile("sharded", f"decode:batch={2 * dp},context=6,{pins}", ranks), ranks)
    assert np.abs(sharded - single).max() < SHARDED_TOL
    assert np.abs(sharded - model.reference()).max() < NUMPY_TOL


# (pins, ranks[, the decode step's pins]): a long prompt may take context
# parallelism, which a decode step (one token a sequence) cannot.
CHAIN_PLANS = [(None, 1), ("tp=2,dp=1", 2), ("pp=2,dp=1", 2), ("tp=2,pp=2,dp=1", 4),
               ("cp=2,tp=1,dp=1", 2, "tp=2,dp=1")]


@pytest.mark.parametrize("plan", CHAIN_PLANS, ids=[p[0] or "single" for p in CHAIN_PLANS])
def test_prefill_then_decode_with_the_cache_parax_returned(tmp_path, plan):
    """Generation, one step: a prefill that returns its keys and values
    (--return-kv), then a decode step fed that cache (parax's own, gathered
    from the ranks), each on the plan's ranks; the step's logits equal the
    whole sequence's forward pass (numpy) at the new position, and the keys
    and values it returns equal numpy's for the new token."""
    from parax import reference
    pins, ranks = plan[:2]
    P = 8 if "cp=" in (pins or "") else 7
    prefill = Model(str(tmp_path / "prefill"), "tiny-llama", seq=P, return_kv=True)
    workload = f"prefill:batch=2,seq={P},{pins}" if pins else None
    outs = prefill.run(prefill.compile("prefill", workload, ranks), ranks, outputs=1 + 2 * 2)
    assert np.abs(outs[0] - prefill.reference()).max() < NUMPY_TOL
    decode = Model(str(tmp_path / "decode"), "tiny-llama", seq=1, past=P, return_kv=True)
    decode.past_tokens = prefill.tokens
    np.save(decode.tokens_path, decode.tokens)
    decode.inputs = [decode.tokens_path]
    for k, cache in enumerate(outs[1:]):  # layer 0 key, value, layer 1 key, value
        assert cache.shape == (2, P, 2, 16)
        decode.inputs.append(os.path.join(decode.dir, f"cache{k}.npy"))
        np.save(decode.inputs[-1], cache)
    pins = plan[2] if len(plan) > 2 else pins
    workload = f"decode:batch=2,context={P},{pins}" if pins else None
    step = decode.run(decode.compile("decode", workload, ranks), ranks, outputs=1 + 2 * 2)
    assert np.abs(step[0] - decode.reference()).max() < NUMPY_TOL
    cache = reference.KVCache()
    reference.forward(decode.cfg, decode.weights, np.concatenate([prefill.tokens, decode.tokens], 1), cache)
    for layer in range(2):
        assert np.abs(step[1 + 2 * layer] - cache.keys[layer][:, P:]).max() < NUMPY_TOL
        assert np.abs(step[2 + 2 * layer] - cache.values[layer][:, P:]).max() < NUMPY_TOL


def test_more_outputs_than_results_is_refused(tmp_path):
    model = Model(str(tmp_path), "tiny-llama")
    proc = model.run(model.compile("single"), 1, outputs=2, expect_ok=False)
    assert proc.returncode != 0
    assert "the executable has 1 result(s) but 2 --output files were given" in proc.stdout + proc.stderr


def test_decode_step_loads_each_rank_its_kv_heads(tmp_path):
    """Under TP the cache arrives split by KV heads: no rank loads all of it
    (nor cuts it every step)."""
    model = Model(str(tmp_path), "tiny-llama", seq=1, past=6)
    exe = model.compile("sharded", "decode:batch=2,context=6,tp=2,dp=1", 2)
    text = open(os.path.join(model.dir, "sharded.mlir")).read()
    # 2 layers x (key, value): [2, 6, 2 KV heads, 16] globally, one head a rank.
    assert text.count("tensor<2x6x1x16xf32> {parax.global_sharding") == 4
    assert "parax.shard_slice %arg" not in text  # no input is cut after loading
    proc = model.run(exe, 2, expect_ok=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_decode_step_without_its_cache_names_the_input(tmp_path):
    model = Model(str(tmp_path), "tiny-llama", seq=1, past=6)
    exe = model.compile("single")
    model.inputs = model.inputs[:3]  # tokens and layer 0's cache only
    proc = model.run(exe, 1, expect_ok=False)
    assert proc.returncode != 0
    assert "wants input #3 but 3 were given" in proc.stderr + proc.stdout
    model.inputs += [model.tokens_path] * 2  # layer 1's cache of the wrong shape
    proc = model.run(exe, 1, expect_ok=False)
    assert proc.returncode != 0
    assert "input #3 has shape [2, 1], the executable expects [2, 6, 2, 16]" in proc.stderr + proc.stdout


def test_fused_weight_is_loaded_in_pieces(tmp_path):
    """GPT-2's c_attn holds q, k and v side by side in one checkpoint
    tensor. Under TP2 each rank loads its half of every tensor-parallel
    weight -- of q, k and v each, not the whole fused tensor -- and the
    partitioned program still computes the single-rank logits."""
    model = Model(str(tmp_path), "tiny-gpt2")
    single = model.run(model.compile("single"), 1)
    exe = model.compile("tp2", "prefill:batch=2,seq=8,tp=2,dp=1", 2)
    proc = model.run(exe, 2, expect_ok=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # Megatron-style TP2 of GPT-2: q/k/v, fc and the vocabulary embedding
    # column-split, both projections row-split; norms, position embedding
    # and the row-split projections' biases whole on every rank.
    halved = ("wte.weight", "attn.c_attn.", "attn.c_proj.weight", "mlp.c_fc.", "mlp.c_proj.weight")
    per_rank = sum(v.size // 2 if any(h in k for h in halved) else v.size
                   for k, v in model.weights.items())
    assert f", {per_rank} parameter values loaded" in proc.stdout, proc.stdout
    sharded = np.load(os.path.join(str(tmp_path), "out.npy"))
    assert np.abs(sharded - single).max() < SHARDED_TOL


def test_piece_outside_its_checkpoint_tensor_is_refused(tmp_path):
    """An executable (edited through protoc's text format) whose piece of
    the fused c_attn weight starts at column 160 of 192, 64 wide: refused
    before anything is read, with the field named."""
    import shutil
    import subprocess
    protoc = shutil.which("protoc")
    if not protoc:
        pytest.skip("protoc not installed")
    model = Model(str(tmp_path), "tiny-gpt2")
    exe = model.compile("tp2", "prefill:batch=2,seq=8,tp=2,dp=1", 2)
    proto_dir = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                             "runtime", "proto")
    schema = ["-I", proto_dir, os.path.join(proto_dir, "parax", "runtime", "executable.proto")]
    with open(exe, "rb") as f:
        text = subprocess.run([protoc, "--decode=parax.pxe.Executable", *schema], input=f.read(),
                              capture_output=True, check=True, timeout=60).stdout
    piece = b"param_offset: 0\n    param_offset: 0\n    param_shape: 64\n    param_shape: 192"
    assert piece in text
    text = text.replace(piece, piece.replace(b"param_offset: 0\n    param_shape", b"param_offset: 160\n    param_shape"), 1)
    with open(exe, "wb") as f:
        f.write(subprocess.run([protoc, "--encode=parax.pxe.Executable", *schema], input=text,
                               capture_output=True, check=True, timeout=60).stdout)
    proc = model.run(exe, 2, expect_ok=False)
    assert proc.returncode != 0
    assert "stages[0].buffers[5].param_offset: dimension 1: the piece lies outside the checkpoint tensor" \
        in proc.stderr, proc.stderr


def test_parameter_moves_run_once(tmp_path):
    """On one rank GPT-2 slices its fused c_attn weight and bias into q, k
    and v (6 slices a layer) and its position embedding once: moves of
    parameters only, which prepare runs once; every step still computes
    the numpy logits."""
    model = Model(str(tmp_path), "tiny-gpt2")
    exe = model.compile("single")
    for steps in ("1", "3"):
        proc = model.run(exe, 1, extra=("--steps", steps), expect_ok=False)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f", {6 * model.cfg.layers + 1} parameter move(s) run once at prepare" in proc.stdout, proc.stdout
        logits = np.load(os.path.join(str(tmp_path), "out.npy"))
        assert np.abs(logits - model.reference()).max() < NUMPY_TOL, steps


def test_fused_weight_of_the_wrong_shape_names_it(tmp_path):
    """A checkpoint whose fused tensor does not have the shape the pieces
    were cut from is refused with the tensor named, not read past."""
    from parax.checkpoint import save_safetensors
    model = Model(str(tmp_path), "tiny-gpt2")
    exe = model.compile("tp2", "prefill:batch=2,seq=8,tp=2,dp=1", 2)
    weights = dict(model.weights)
    name = "transformer.h.1.attn.c_attn.weight"
    weights[name] = weights[name][:, :96]
    save_safetensors(model.checkpoint, weights)
    proc = model.run(exe, 2, expect_ok=False)
    assert proc.returncode != 0
    assert f"tensor '{name}' has shape [64, 96], the executable expects [64, 192]" in proc.stderr, proc.stderr


def test_wrong_rank_count_is_refused(tmp_path):
    model = Model(str(tmp_path), "tiny-llama")
    proc = model.run(model.compile("tp2", "prefill:batch=2,seq=8,tp=2,dp=1", 2), 3,
                     expect_ok=False)
    assert proc.returncode != 0
    assert "grid has 2 ranks but mpirun started 3 (use mpirun -np 2)" in proc.stderr


def test_deepseek_test_data_exercises_the_routing_rule(tmp_path):
    """The tiny DeepSeek-V3's test data (the conftest Model's weights and
    tokens) spreads over the experts and both groups, and valuing a group
    by its best expert instead of its top-2 sum would route some token
    elsewhere: a wrong group rule changes the logits the numerics tests
    compare (with random routing biases all 16 tokens went to the same two
    experts, and such a bug survived every test)."""
    model = Model(str(tmp_path), "tiny-deepseek-v3")
    cfg = model.cfg
    routers = []
    reference.forward(cfg, model.weights, model.tokens, routers=routers)
    scores, top = routers[0]
    assert len(set(top.ravel().tolist())) >= 6
    per = cfg.num_experts // cfg.num_groups
    assert len(set((top[:, 0] // per).tolist())) == cfg.num_groups
    choice = (scores + model.weights["model.layers.1.mlp.gate.e_score_correction_bias"]).reshape(
        len(scores), cfg.num_groups, per)
    by_top2 = np.argmax(np.sort(choice, axis=-1)[..., -2:].sum(-1), axis=-1)
    by_best = np.argmax(choice.max(-1), axis=-1)
    assert (by_top2 != by_best).any()
    # and parax computes it as numpy does
    logits = model.run(model.compile("single"), 1)
    assert np.abs(logits - model.reference()).max() < NUMPY_TOL


def test_missing_weight_names_it(tmp_path):
    model = Model(str(tmp_path), "tiny-llama")
    from parax.checkpoint import save_safetensors
    weights = dict(model.weights)
    del weights["model.layers.1.mlp.down_proj.weight"]
    save_safetensors(model.checkpoint, weights)
    proc = model.run(model.compile("single"), 1, expect_ok=False)
    assert proc.returncode != 0
    assert "no tensor 'model.layers.1.mlp.down_proj.weight' (a missing weight)" in proc.stderr


@pytest.mark.parametrize("preset,name", [
    ("tiny-llama", "model.layers.0.mlp.up_proj.weight"),
    # one expert's tensor of a stack (its part of the stack was left zero,
    # rc 0, found by parax-pxe-fuzz's dtype mutations)
    ("tiny-mixtral", "model.layers.0.block_sparse_moe.experts.1.w3.weight")])
def test_a_float_parameter_stored_as_integers_is_refused(tmp_path, preset, name):
    """Issue 45 R1: an F32 parameter whose safetensors header says I32 (the
    same byte size): refused, named (it crashed in cblas_sgemm)."""
    from safetensors.numpy import save_file
    model = Model(str(tmp_path), preset)
    weights = dict(model.weights)
    weights[name] = weights[name].view(np.int32)
    save_file(weights, model.checkpoint)
    proc = model.run(model.compile("single"), 1, expect_ok=False)
    assert proc.returncode != 0
    assert f"checkpoint tensor '{name}' holds integers, the program reads floats there" in proc.stderr


def test_a_program_larger_than_the_memory_it_may_take_is_refused_with_figures(tmp_path):
    """Issue 45 R2: `--steps 0` ("does it fit?") of a program whose buffers
    need 6 GB, under a 4 GB address-space limit: refused with both
    figures before anything is allocated (it aborted in std::bad_alloc)."""
    import subprocess
    model = Model(str(tmp_path), "tiny-llama", batch=4096, seq=128)
    exe = model.compile("single")
    command = (f"ulimit -v 4000000; exec {tool('parax-run')} {exe} --weights {model.checkpoint} "
               f"--input {model.tokens_path} --steps 0")
    proc = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=120, env=MPI_ENV)
    assert proc.returncode != 0
    assert "rank 0 (stage 0) needs 6.04 GB of host memory for its buffers; " in proc.stderr, proc.stderr
    assert "GB are available" in proc.stderr


def test_int64_tokens_outside_32_bits_are_refused(tmp_path):
    """Issue 45 R7: int64 token ids of 2^32 + 5 were truncated to token 5
    (identical logits): refused, naming the element and its value."""
    model = Model(str(tmp_path), "tiny-llama")
    tokens = model.tokens.astype(np.int64)
    tokens[1, 3] = 2 ** 32 + 5
    np.save(model.tokens_path, tokens)
    proc = model.run(model.compile("single"), 1, expect_ok=False)
    assert proc.returncode != 0
    assert "element 11 is 4294967301, outside the 32-bit range" in proc.stderr


def test_an_executable_path_that_is_a_folder_is_named(tmp_path):
    """Issue 45 R13: a directory given as the executable ("format_version:
    is 0" before)."""
    model = Model(str(tmp_path), "tiny-llama")
    folder = tmp_path / "exe.pxe"
    folder.mkdir()
    proc = model.run(str(folder), 1, expect_ok=False)
    assert proc.returncode != 0
    assert f"{folder}: not a file (an executable is a .pxe file)" in proc.stderr


def test_flags_take_their_value_after_an_equals_sign_too(tmp_path):
    """Issue 46: `--weights=W` was "unknown option"; --name=value is
    --name value for every flag (the same logits either way)."""
    import subprocess
    model = Model(str(tmp_path), "tiny-llama")
    exe = model.compile("single")
    spaced = model.run(exe, 1)
    out = str(tmp_path / "equals.npy")
    proc = subprocess.run([tool("parax-run"), exe, f"--weights={model.checkpoint}",
                           *[f"--input={path}" for path in model.inputs], f"--output={out}", "--steps=1"],
                          capture_output=True, text=True, timeout=120, env=MPI_ENV)
    assert proc.returncode == 0, proc.stderr
    assert np.array_equal(np.load(out), spaced)


def test_the_help_lists_every_flag_it_parses():
    """parax-run --help is generated from the flags it parses (Options.cpp):
    each flag once, with its value's placeholder, in its section; a flag
    it does not know, a switch given a value, a flag missing its value are
    refused by name."""
    import subprocess
    proc = subprocess.run([tool("parax-run"), "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    listed = re.findall(r"^  (--[a-z0-9-]+)", proc.stderr, re.M)
    assert len(listed) == len(set(listed)) > 40, listed
    for line in ("  --zero-stage 0|1|2|3", "  --save-every K", "  --temperature T", "  --quiet"):
        assert line in proc.stderr, line
    assert [s for s in ("run:", "generation:", "training:", "checkpoints:", "environment:") if s not in proc.stderr] == []
    for args, text in ((["--frobnicate"], "unknown option --frobnicate"),
                       (["--quiet=1"], "--quiet takes no value"),
                       (["--steps"], "missing value after --steps")):
        proc = subprocess.run([tool("parax-run"), "m.pxe", *args], capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and text in proc.stderr, (args, proc.stderr[-300:])


def test_two_outputs_to_one_path_are_refused_before_a_step(tmp_path):
    """Issue 45 R5: --save-weights and --save-optimizer naming one file ran
    and kept only the optimizer's state: refused before any step."""
    model = Model(str(tmp_path), "tiny-llama", loss=True)
    exe = model.compile("train", autodiff=True)
    same = str(tmp_path / "x.safetensors")
    proc = model.run(exe, 1, expect_ok=False, extra=["--optimizer", "adamw", "--steps", "2",
                                                     "--save-weights", same, "--save-optimizer", same])
    assert proc.returncode != 0
    assert f"--save-weights and --save-optimizer both write '{same}'" in proc.stderr
    assert not os.path.exists(same)


def test_weights_the_program_never_reads_are_refused(tmp_path):
    """A checkpoint of another model than the one compiled (here a Llama
    with q/k/v and o_proj biases, which parax's Llama does not build) is
    refused, its unread tensors named; --allow-unused-weights runs it."""
    model = Model(str(tmp_path), "tiny-llama")
    from parax.checkpoint import save_safetensors
    weights = dict(model.weights)
    rng = np.random.default_rng(3)
    for layer in range(model.cfg.layers):
        for proj in ("q_proj", "o_proj"):
            rows = weights[f"model.layers.{layer}.self_attn.{proj}.weight"].shape[0]
            weights[f"model.layers.{layer}.self_attn.{proj}.bias"] = rng.standard_normal(rows).astype(np.float32)
    save_safetensors(model.checkpoint, weights)
    exe = model.compile("single")
    proc = model.run(exe, 1, expect_ok=False)
    assert proc.returncode != 0
    assert ("the program reads no tensor named model.layers.0.self_attn.o_proj.bias, "
            "model.layers.0.self_attn.q_proj.bias, model.layers.1.self_attn.o_proj.bias") in proc.stderr
    assert "--allow-unused-weights" in proc.stderr
    logits = model.run(exe, 1, extra=["--allow-unused-weights"])
    assert np.abs(logits - model.reference()).max() < NUMPY_TOL


@pytest.mark.parametrize("damage,message", [
    (lambda b: b[: len(b) // 2], "not a parax executable"),
    (lambda b: b"\x08\x07" + b[2:], "format_version"),
    (lambda b: b"garbage" * 10, "not a parax executable"),
])
def test_hostile_executable_gets_a_named_error(tmp_path, damage, message):
    model = Model(str(tmp_path), "tiny-llama")
    exe = model.compile("single")
    with open(exe, "rb") as f:
        data = f.read()
    with open(exe, "wb") as f:
        f.write(damage(data))
    proc = model.run(exe, 1, expect_ok=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def test_unpaired_pipeline_transfer_is_refused(tmp_path):
    """A pipeline executable whose stage 1 receives what stage 0 never sends
    would leave rank 1 waiting forever: it is refused before running, with
    the instruction named."""
    import subprocess
    model = Model(str(tmp_path), "tiny-llama")
    model.compile("pp2", "prefill:batch=2,seq=8,pp=2,dp=1", 2)
    with open(os.path.join(str(tmp_path), "pp2.mlir")) as f:
        lines = [line for line in f if "parax.send" not in line]
    with open(os.path.join(str(tmp_path), "nosend.mlir"), "w") as f:
        f.writelines(lines)
    exe = os.path.join(str(tmp_path), "nosend.pxe")
    subprocess.run([tool("parax-translate"), "--to-executable", os.path.join(str(tmp_path), "nosend.mlir"),
                    "-o", exe], check=True, timeout=60)
    proc = model.run(exe, 2, expect_ok=False)
    assert proc.returncode != 0
    assert ("stages[1].instructions[0] (recv): has no matching send in stages[0] (stage 0 -> stage 1): "
            "a rank would wait forever") in proc.stderr, proc.stderr


@pytest.mark.parametrize("settle", [1.0, 0.0], ids=["mid-run", "at-start-up"])
def test_a_stalled_rank_ends_the_job_naming_rank_and_operation(tmp_path, settle):
    """One rank stops (SIGSTOP) in the middle of a TP run, or as soon as it
    exists (in MPI's start-up or communicator set-up): what the other waits
    in -- a collective, the barrier between steps, MPI_Init, MPI_Comm_split
    -- does not return, and the job ends after the timeout with the rank and
    the operation named, instead of hanging."""
    import re
    from conftest import run_with_a_stalled_rank
    model = Model(str(tmp_path), "tiny-llama")
    exe = model.compile("tp2", "prefill:batch=2,seq=8,tp=2,dp=1", 2)
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", tool("parax-run"), exe,
           "--weights", model.checkpoint, "--input", model.tokens_path, "--steps", "1000000"]
    out, err, code = run_with_a_stalled_rank(cmd, dict(MPI_ENV, PARAX_COLLECTIVE_TIMEOUT="2"), settle=settle)
    assert code != 0, out + err
    # (the operation as the runtime names it, e.g. "all_gather (onto the
    # group's first rank)")
    assert re.search(r"parax-run: rank [01]: [\w ()'-]+ has not finished after 2 s", err), err[-2000:]


def test_corrupt_checkpoint_is_refused(tmp_path):
    model = Model(str(tmp_path), "tiny-llama")
    with open(model.checkpoint, "r+b") as f:
        f.write((10 ** 12).to_bytes(8, "little"))
    proc = model.run(model.compile("single"), 1, expect_ok=False)
    assert proc.returncode != 0
    assert "exceeds the file" in proc.stderr


@pytest.mark.parametrize("pins,ranks,dtype", [(None, 1, "f32"), ("tp=2,pp=2,dp=1", 4, "f32"), (None, 1, "bf16")],
                         ids=["single", "tp2-pp2", "bf16"])
def test_sharded_checkpoint_loads_as_one_file(tmp_path, pins, ranks, dtype):
    """A Hugging Face sharded checkpoint (3 shard files and
    model.safetensors.index.json; bf16 as published checkpoints are):
    --weights given the index or its folder gives the logits the single
    file gives, each rank reading its boxes from whichever shard holds each
    tensor; so does a folder holding a lone model.safetensors."""
    import shutil
    from parax.checkpoint import INDEX, save_sharded
    model = Model(str(tmp_path), "tiny-llama", dtype=dtype)
    exe = model.compile("model", pins and f"prefill:batch=2,seq=8,{pins}", ranks)
    want = model.run(exe, ranks)
    folder, lone = str(tmp_path / "sharded"), str(tmp_path / "lone")
    save_sharded(folder, model.weights, 3, dtype=dtype)
    os.makedirs(lone)
    shutil.copy(model.checkpoint, os.path.join(lone, "model.safetensors"))
    for weights in (folder, os.path.join(folder, INDEX), lone):
        model.checkpoint = weights
        np.testing.assert_array_equal(model.run(exe, ranks), want)


@pytest.mark.parametrize("damage,message", [
    (lambda index: index["weight_map"].update({"lm_head.weight": "../model-00001-of-00002.safetensors"}),
     "is not a plain file name in the index's folder"),
    (lambda index: index["weight_map"].update({"lm_head.weight": "missing.safetensors"}),
     "missing.safetensors: cannot open the checkpoint"),
    (lambda index: index["weight_map"].update({"ghost.weight": "model-00001-of-00002.safetensors"}),
     "tensor 'ghost.weight' is not in its shard model-00001-of-00002.safetensors"),
    (lambda index: index.pop("weight_map"), "no \"weight_map\" object"),
    (lambda index: index["weight_map"].pop("lm_head.weight"), "no tensor 'lm_head.weight' (a missing weight)"),
], ids=["path-outside", "missing-shard", "tensor-not-in-shard", "no-weight-map", "unmapped-tensor"])
def test_bad_sharded_checkpoint_is_named(tmp_path, damage, message):
    """A damaged or hostile index gets an error naming the problem: a shard
    outside the index's folder, a shard file that is not there, a tensor
    its shard does not hold, no weight_map, a tensor the model needs that
    the index does not map."""
    from parax.checkpoint import INDEX, save_sharded
    model = Model(str(tmp_path), "tiny-llama")
    folder = str(tmp_path / "sharded")
    save_sharded(folder, model.weights, 2)
    assert_refused_once_damaged(model, folder, INDEX, damage, message)


@pytest.mark.parametrize("shard", ["../../other.safetensors", "/tmp/other.safetensors", "link.safetensors"],
                         ids=["dot-dot", "absolute", "symlink"])
def test_an_index_naming_a_file_outside_its_folder_is_refused_by_both_loaders(tmp_path, shard):
    """Issue 45 R6: `python -m parax checkpoint` (parax.checkpoint) read
    files an index named outside its folder; both loaders followed
    symbolic links. Each is refused, by Python and by parax-run alike."""
    import json as _json
    from parax.checkpoint import INDEX, load_checkpoint, save_sharded
    model = Model(str(tmp_path), "tiny-llama")
    folder = str(tmp_path / "sharded")
    save_sharded(folder, model.weights, 2)
    outside = tmp_path / "other.safetensors"
    os.replace(os.path.join(folder, "model-00002-of-00002.safetensors"), outside)
    if shard == "link.safetensors":
        os.symlink(outside, os.path.join(folder, shard))
    path = os.path.join(folder, INDEX)
    with open(path) as f:
        index = _json.load(f)
    index["weight_map"] = {name: (shard if file == "model-00002-of-00002.safetensors" else file)
                           for name, file in index["weight_map"].items()}
    with open(path, "w") as f:
        _json.dump(index, f)
    message = "a symbolic link" if shard == "link.safetensors" else "not a plain file name in the index's folder"
    with pytest.raises(ValueError, match=message):
        load_checkpoint(folder)
    model.checkpoint = folder
    proc = model.run(model.compile("single"), 1, expect_ok=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


def assert_refused_once_damaged(model, folder, index_name, damage, message):
    """`damage` applied to the checkpoint index `folder`/`index_name` (its
    JSON), the model's run from that folder fails, naming `message`."""
    import json as _json
    path = os.path.join(folder, index_name)
    with open(path) as f:
        index = _json.load(f)
    damage(index)
    with open(path, "w") as f:
        _json.dump(index, f)
    model.checkpoint = folder
    proc = model.run(model.compile("single"), 1, expect_ok=False)
    assert proc.returncode != 0
    assert message in proc.stderr, proc.stderr


@pytest.mark.parametrize("preset,pins,ranks", [("tiny-llama", None, 1), ("tiny-llama", "tp=2,pp=2,dp=1", 4),
                                               ("tiny-mixtral", "ep=2,dp=1", 2)],
                         ids=["llama-single", "llama-tp2-pp2", "mixtral-ep2"])
def test_box_checkpoint_loads_under_any_split(tmp_path, preset, pins, ranks):
    """A box-wise checkpoint (boxes.index.json and the boxes' files, here
    written by numpy with boxes no plan's split matches, some held as runs
    of their elements) gives the logits the single file gives: each rank
    puts its boxes together from every saved box they overlap; the folder
    or its index may be given."""
    from parax.checkpoint import BOX_INDEX, save_boxes
    model = Model(str(tmp_path), preset)
    exe = model.compile("model", pins and f"prefill:batch=2,seq=8,{pins}", ranks)
    want = model.run(exe, ranks)
    folder = str(tmp_path / "boxes")
    save_boxes(folder, uneven_boxes(model.weights), 3)
    for weights in (folder, os.path.join(folder, BOX_INDEX)):
        model.checkpoint = weights
        np.testing.assert_array_equal(model.run(exe, ranks), want)


def _box(index, name, k=0):
    return index["tensors"][name]["boxes"][k]


@pytest.mark.parametrize("damage,message", [
    (lambda index: _box(index, "lm_head.weight").update(start=[200, 0]),
     "tensor 'lm_head.weight': the box at [200, 0] of size [85, 21] lies outside its shape [256, 64]"),
    (lambda index: _box(index, "lm_head.weight", 1).update(start=[80, 21]),
     "tensor 'lm_head.weight': the boxes at [80, 21] and [85, 0] overlap"),
    (lambda index: index["tensors"]["lm_head.weight"]["boxes"].pop(),
     "tensor 'lm_head.weight': its boxes cover 13873 of its 16384 elements"),
    (lambda index: _box(index, "lm_head.weight").update(file="../boxes-00001-of-00003.safetensors"),
     "box 'lm_head.weight@0,0' is in '../boxes-00001-of-00003.safetensors', which is not a plain file name"),
    (lambda index: _box(index, "lm_head.weight").update(file="missing.safetensors"),
     "missing.safetensors: cannot open the checkpoint"),
    (lambda index: _box(index, "lm_head.weight").update(file=_box(index, "lm_head.weight", 1)["file"]),
     "box 'lm_head.weight@0,0' is not in its file boxes-0000"),
    (lambda index: index["tensors"]["lm_head.weight"].update(shape=[256, 64, 1]),
     "tensor 'lm_head.weight': the box at [0, 0] of size [85, 21] lies outside its shape [256, 64, 1]"),
    (lambda index: index["tensors"]["lm_head.weight"].pop("boxes"), "tensor 'lm_head.weight': no \"boxes\" array"),
    (lambda index: index["tensors"].pop("lm_head.weight"), "no tensor 'lm_head.weight' (a missing weight)"),
    (lambda index: index.update(tensors=[]), "\"tensors\" is not an object"),
    (lambda index: _box(index, "lm_head.weight", 4).update(range=[2000, 6000]),
     "tensor 'lm_head.weight': the box at [171, 0] has a range that is not [begin, end) within its 5440 elements"),
    (lambda index: _box(index, "lm_head.weight", 4).update(range=[2000, 5440]),
     "tensor 'lm_head.weight': the boxes at [171, 0] and [171, 0] overlap"),
    (lambda index: (_box(index, "lm_head.weight", 3).update(range=[0, 2928]),
                    _box(index, "lm_head.weight", 4).update(range=[2928, 5440])),
     "box 'lm_head.weight@171,0#0' has shape [2929] in boxes-"),
], ids=["outside", "overlap", "gap", "path-outside", "missing-file", "box-not-in-file", "wrong-rank",
        "no-boxes", "unlisted-tensor", "tensors-not-object", "range-outside", "runs-overlap", "run-moved"])
def test_bad_box_checkpoint_is_named(tmp_path, damage, message):
    """A damaged or hostile box-wise index gets an error naming the tensor
    and the problem: a box outside its tensor, boxes or runs of a box that
    overlap or leave a gap (they must tile the tensor), a run outside its
    box, a file outside the index's folder or not there, a box its file
    does not hold or holds at another size, a tensor the model needs that
    the index does not list."""
    from parax.checkpoint import BOX_INDEX, save_boxes
    model = Model(str(tmp_path), "tiny-llama")
    folder = str(tmp_path / "boxes")
    save_boxes(folder, uneven_boxes(model.weights), 3)
    assert_refused_once_damaged(model, folder, BOX_INDEX, damage, message)


def test_a_folder_without_a_checkpoint_is_named(tmp_path):
    model = Model(str(tmp_path), "tiny-llama")
    model.checkpoint = str(tmp_path / "empty")
    os.makedirs(model.checkpoint)
    proc = model.run(model.compile("single"), 1, expect_ok=False)
    assert proc.returncode != 0
    assert "a folder without model.safetensors.index.json or model.safetensors (nor a box-wise" in proc.stderr


def test_front_door_demo_runs_end_to_end():
    """The README's main job: plan, partition, translate, mpirun on 4 ranks."""
    import re
    import subprocess
    import sys
    from conftest import ROOT
    proc = subprocess.run([sys.executable, "-m", "parax", "demo"], capture_output=True, text=True,
                          timeout=300, cwd=ROOT,
                          env=dict(MPI_ENV, PYTHONPATH=os.path.join(ROOT, "python")))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "parax-run: 4 rank(s)" in proc.stdout
    assert "largest |difference| between the 4-rank and single-rank logits" in proc.stdout
    assert "2 microbatch(es)" in proc.stdout  # 4 rows, two batches of the step's 2
    assert "8 token(s) generated for each of 4 row(s) after prompts of 2 to 4" in proc.stdout
    assert "the 4-rank and single-rank generations are the same" in proc.stdout
    cp = re.search(r"largest \|difference\| between the CP2 and single-rank logits: (\S+)", proc.stdout)
    assert cp and float(cp.group(1)) < 1e-5, proc.stdout


def test_data_parallel_replicas_take_their_own_rows(tmp_path):
    """dp=2: each replica runs its half of the rows (two microbatches of
    the executable's batch each, not all four), and the writer joins the
    replicas' logits in order; the loss is the mean over both. Rows that do
    not split into whole batches per replica are refused."""
    model = Model(str(tmp_path), "tiny-llama", batch=2, rows=8)
    exe = model.compile("dp2", "prefill:batch=8,seq=8,dp=2", 2)
    proc = model.run(exe, 2, expect_ok=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 microbatch(es)" in proc.stdout  # of the 4 batches, each replica runs 2
    logits = np.load(os.path.join(model.dir, "out.npy"))
    assert logits.shape == (8, 8, model.cfg.vocab)
    assert np.abs(logits - model.reference()).max() < NUMPY_TOL
    model.tokens = model.tokens[:6]
    np.save(model.tokens_path, model.tokens)
    proc = model.run(exe, 2, expect_ok=False)
    assert proc.returncode != 0
    assert ("input #0 has 6 rows, not a multiple of the executable's batch 2 times its 2 "
            "data-parallel replicas") in proc.stdout + proc.stderr


def test_expert_parallel_ranks_take_their_own_sequences(tmp_path):
    """ep=2: the two expert-parallel ranks of a replica run one sequence each
    (the batch is split over ep; they exchange tokens only for the experts)
    instead of both running both, and the logits still match one rank."""
    model = Model(str(tmp_path), "tiny-mixtral", batch=2)
    single = model.run(model.compile("single"), 1)
    exe = model.compile("ep2", "prefill:batch=2,seq=8,ep=2,dp=1", 2)
    text = open(os.path.join(model.dir, "ep2.mlir")).read()
    assert "%arg0: tensor<1x8xi32> {parax.global_sharding = #parax.sharding<@plan_forward, [{ep}, {}]>" in text
    assert text.count('all_gather') == 1 and 'over @plan_forward ["ep"] dim 0' in text  # the logits, once
    sharded = model.run(exe, 2)
    assert np.abs(sharded - single).max() < SHARDED_TOL


def dispatch_rows(mlir_path):
    """The rows each moe_dispatch of a partitioned program holds."""
    import re
    text = open(mlir_path).read()
    return [int(r) for r in re.findall(r"parax\.moe_dispatch .*-> \(tensor<(\d+)x", text)]


@pytest.mark.parametrize("preset,pins,ranks,pairs", [("tiny-mixtral", "ep=4,dp=1,capacity=2", 4, 16),
                                                     ("tiny-qwen2-moe", "ep=2,dp=1,capacity=1.9", 2, 16)],
                         ids=["mixtral-ep4", "qwen2-moe-ep2"])
def test_expert_capacity_holds_fewer_rows_and_matches_single_rank(tmp_path, preset, pins, ranks, pairs):
    """capacity=c: a rank's dispatch holds c x its own (token, choice)
    pairs (one sequence of 8 tokens a rank), not every rank's, and the
    logits still match one rank's and numpy's (no token dropped). (Tiny
    random routers are unbalanced: Qwen2-MoE's routes 30 of its 32 pairs to
    one rank of two here.)"""
    model = Model(str(tmp_path), preset, batch=ranks)
    single = model.run(model.compile("single"), 1)
    exe = model.compile("sharded", f"prefill:batch={ranks},seq=8,{pins}", ranks)
    capacity = float(pins.split("capacity=")[1])
    rows = dispatch_rows(os.path.join(model.dir, "sharded.mlir"))
    assert rows and set(rows) == {math.ceil(capacity * pairs)}, rows
    sharded = model.run(exe, ranks)
    assert np.abs(sharded - single).max() < SHARDED_TOL
    assert np.abs(sharded - model.reference()).max() < NUMPY_TOL


def test_parax_run_reports_the_least_expert_capacity_that_fits(tmp_path):
    """parax-run's summary names the busiest expert-parallel rank's rows as
    a multiple of a rank's own pairs (these tokens: 30 of 16, 1.875): the
    least capacity= the steps fit. At 1.875 (30 rows) they run and match
    one rank; at 1.8125 (29 rows) they stop."""
    model = Model(str(tmp_path), "tiny-qwen2-moe", batch=2)
    single = model.run(model.compile("single"), 1)
    proc = model.run(model.compile("every", "prefill:batch=2,seq=8,ep=2,dp=1", 2), 2, expect_ok=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "expert routing: the busiest rank was sent 1.875 x its own (token, choice) pairs" in proc.stdout, proc.stdout
    exe = model.compile("fits", "prefill:batch=2,seq=8,ep=2,dp=1,capacity=1.875", 2)
    assert set(dispatch_rows(os.path.join(model.dir, "fits.mlir"))) == {30}
    assert np.abs(model.run(exe, 2) - single).max() < SHARDED_TOL
    proc = model.run(model.compile("short", "prefill:batch=2,seq=8,ep=2,dp=1,capacity=1.8125", 2), 2,
                     expect_ok=False)
    assert proc.returncode != 0 and "is routed 30 (token, choice) rows, more than the 29" in proc.stderr, proc.stderr


def test_expert_capacity_too_small_for_the_routing_names_the_rank(tmp_path):
    """capacity=1 over ep=2: a rank holds its own 16 pairs' rows; the
    router sends one rank more (these tokens: 18 and 14), so every rank
    stops at the first dispatch with the counts -- no row dropped, no hang."""
    model = Model(str(tmp_path), "tiny-mixtral", batch=2)
    exe = model.compile("sharded", "prefill:batch=2,seq=8,ep=2,dp=1,capacity=1", 2)
    assert set(dispatch_rows(os.path.join(model.dir, "sharded.mlir"))) == {16}
    proc = model.run(exe, 2, expect_ok=False)
    assert proc.returncode != 0
    out = proc.stdout + proc.stderr
    assert "moe_dispatch: expert-parallel rank" in out and "the 16 its exchange holds" in out, out


def test_pipeline_with_several_microbatches(tmp_path):
    """PP4 over four microbatches: inputs holding four times the executable's
    batch run as four microbatches flowing through the stages."""
    model = Model(str(tmp_path), "tiny-llama", layers=4, batch=1)
    model.tokens = np.random.default_rng(7).integers(0, model.cfg.vocab, (4, 8)).astype(np.int32)
    np.save(model.tokens_path, model.tokens)
    single = model.run(model.compile("single"), 1)
    exe = model.compile("pp4", "prefill:batch=1,seq=8,pp=4,dp=1", 4)
    for steps in ("1", "2"):  # the second step starts again from the first microbatch
        sharded = model.run(exe, 4, extra=("--steps", steps))
        assert sharded.shape == (4, 8, model.cfg.vocab)
        assert np.abs(sharded - single).max() < SHARDED_TOL, steps
        assert np.abs(sharded - model.reference()).max() < NUMPY_TOL, steps


LOSS_PLANS = [("tp=2,dp=1", 2), ("pp=2,dp=1", 2), ("dp=2", 2), ("dp=2,tp=2,pp=2", 8),
              ("cp=2,tp=1,dp=1", 2)]


@pytest.mark.parametrize("pins,ranks", [(None, 1)] + LOSS_PLANS,
                         ids=["single"] + [p[0] for p in LOSS_PLANS])
def test_training_loss_matches_numpy(tmp_path, pins, ranks):
    """`--loss`: the mean token cross-entropy, one scalar, on every plan
    (data-parallel replicas: the mean of their means over equal shares)."""
    dp = replicas(pins)
    batch = max(2, ranks // dp)
    model = Model(str(tmp_path), "tiny-llama", batch=batch, loss=True, rows=batch * dp)
    if pins is None:
        exe = model.compile("single")
    else:
        exe = model.compile("sharded", f"prefill:batch={batch * dp},seq=8,{pins}", ranks)
    loss = model.run(exe, ranks)
    assert loss.shape == ()
    assert abs(float(loss) - model.reference_loss()) < NUMPY_TOL


def test_training_loss_under_expert_and_data_parallelism(tmp_path):
    """Mixtral, ep2 x dp2 (4 ranks): each replica takes 2 of the 4 sequences,
    each EP rank one of them; the loss gathers the logits over ep and is the
    mean over the replicas."""
    model = Model(str(tmp_path), "tiny-mixtral", batch=2, loss=True, rows=4)
    loss = model.run(model.compile("ep2dp2", "prefill:batch=4,seq=8,ep=2,dp=2", 4), 4)
    assert loss.shape == ()
    assert abs(float(loss) - model.reference_loss()) < NUMPY_TOL


@pytest.mark.parametrize("preset,pins,ranks", [("tiny-llama", None, 1), ("tiny-mixtral", None, 1),
                                               ("tiny-llama", "tp=2,pp=2,dp=1", 4)],
                         ids=["llama", "mixtral", "llama-tp2-pp2"])
def test_bf16_executable_computes_in_fp32_on_the_cpu(tmp_path, preset, pins, ranks):
    """A bf16 program and checkpoint: the CPU backend computes in fp32 from
    the checkpoint's bf16 values, so it matches numpy on those values."""
    model = Model(str(tmp_path), preset, dtype="bf16")
    exe = model.compile("single") if pins is None else \
        model.compile("sharded", f"prefill:batch=2,seq=8,{pins}", ranks)
    logits = model.run(exe, ranks)
    assert np.abs(logits - model.reference()).max() < NUMPY_TOL


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gpt2"])
def test_one_row_decode_matches_numpy(tmp_path, preset):
    """A decode step of one sequence (every linear one row: the CPU backend
    calls a GEMV, with the weight as nn.Linear stores it and as GPT-2's
    Conv1D does) against the numpy reference."""
    model = Model(str(tmp_path), preset, batch=1, rows=1, seq=1, past=5)
    logits = model.run(model.compile("single"), 1)
    assert np.abs(logits - model.reference()).max() < NUMPY_TOL
