"""A generation loop over one program (`--cache C`, `parax-run --generate`):
the step writes its keys and values into KV caches at a run-time position
and the runtime keeps the caches where the step runs. The oracle: every
step's logits equal numpy's forward pass over the same tokens, on one rank
and on every kind of partitioning, under a real mpirun."""

import os
import subprocess

import numpy as np
import pytest

from conftest import Model, replicas, tool
from cuda_cases import ABSORBED_MLA

CAPACITY, PROMPT, NEW = 12, 3, 6


def check_generation(model, tokens, logits, prompt_len, tol=1e-4):
    """Each step's logits against numpy on the tokens so far (teacher
    forcing on parax's own choices); each generated token is the most likely
    of parax's logits, and numpy's too wherever its choice is clear."""
    expected = model_reference(model, tokens[:, :-1])
    assert logits.shape == expected.shape
    np.testing.assert_allclose(logits, expected, atol=tol, rtol=tol)
    generated = tokens[:, prompt_len:]
    assert (logits[:, prompt_len - 1:].argmax(-1) == generated).all()
    top2 = np.sort(expected[:, prompt_len - 1:], axis=-1)[..., -2:]
    clear = top2[..., 1] - top2[..., 0] > 10 * tol
    assert (expected[:, prompt_len - 1:].argmax(-1)[clear] == generated[clear]).all()


def check_prefilled_generation(step, exe, ranks, prompt, prefill, chunks, chunk):
    """Generation after a prefill of `chunks` chunks of `chunk` tokens: the
    run says so, the prompt leads the tokens and every step is numpy's."""
    proc = step.generate(exe, ranks, prompt, NEW, prefill=prefill, expect_ok=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"prefill of {chunks} chunk(s) of {chunk} tokens" in proc.stdout, proc.stdout
    tokens, logits = step.generate(exe, ranks, prompt, NEW, prefill=prefill)
    assert (tokens[:, :prompt.shape[1]] == prompt).all()
    check_generation(step, tokens, logits, prompt.shape[1])


def model_reference(model, tokens):
    from parax import reference
    return reference.forward(model.cfg, model.weights, tokens)


def prompt_for(model, rows, seed=3):
    return np.random.default_rng(seed).integers(0, model.cfg.vocab, size=(rows, PROMPT))


@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gpt2", "tiny-mixtral", "tiny-qwen2-moe",
                                    "tiny-deepseek-v3"])
def test_single_rank_generation_matches_numpy(tmp_path, preset):
    model = Model(str(tmp_path), preset, seq=1, cache=CAPACITY)
    prompt = prompt_for(model, 2)
    tokens, logits = model.generate(model.compile("single"), 1, prompt, NEW)
    assert tokens.shape == (2, PROMPT + NEW) and (tokens[:, :PROMPT] == prompt).all()
    check_generation(model, tokens, logits, PROMPT)


# (preset, workload pins, ranks)
GENERATION_PLANS = [
    ("tiny-llama", "tp=2,dp=1", 2),
    ("tiny-llama", "tp=4,dp=1", 4),   # 2 KV heads: replicated over 4 ranks
    ("tiny-llama", "pp=2,dp=1", 2),   # each stage keeps its layers' caches
    ("tiny-llama", "dp=2", 2),        # each replica its own rows and caches
    ("tiny-llama", "dp=2,tp=2,pp=2", 8),
    ("tiny-gpt2", "tp=2,dp=1", 2),
    ("tiny-mixtral", "ep=2,tp=1,dp=1", 2),
    ("tiny-mixtral", "ep=2,tp=2,dp=1", 4),
    ("tiny-qwen2-moe", "ep=2,dp=1", 2),
    ("tiny-deepseek-v3", "tp=2,dp=1", 2),
]


@pytest.mark.parametrize("preset,pins,ranks", GENERATION_PLANS,
                         ids=[f"{p[0]}-{p[1]}" for p in GENERATION_PLANS])
def test_sharded_generation_matches_numpy(tmp_path, preset, pins, ranks):
    dp = replicas(pins)
    model = Model(str(tmp_path), preset, seq=1, cache=CAPACITY)
    exe = model.compile("sharded", f"decode:batch={2 * dp},context={CAPACITY},{pins}", ranks)
    prompt = prompt_for(model, 2 * dp)
    tokens, logits = model.generate(exe, ranks, prompt, NEW)
    assert tokens.shape == (2 * dp, PROMPT + NEW)
    check_generation(model, tokens, logits, PROMPT)


def step_and_prefill(tmp_path, pins, ranks, prefilled):
    """Tiny Llama's generation step for 2 rows a replica over caches of
    CAPACITY + 4, planned with `pins`, and (`prefilled`) a prefill program
    of 3-token chunks planned alike (else None): (model, step, prefill)."""
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY + 4)
    workload = f"decode:batch={2 * replicas(pins)},context={CAPACITY + 4},{pins}" if pins else None
    exe = model.compile("step", workload, ranks)
    prefill = None
    if prefilled:
        chunked = Model(os.path.join(str(tmp_path), "prefill"), "tiny-llama", seq=3, cache=CAPACITY + 4)
        prefill = chunked.compile("prefill", workload, ranks)
    return model, exe, prefill


# (pins, ranks, prefill?): rows beyond one batch a replica run as microbatches
MICROBATCH_PLANS = [(None, 1, False), ("pp=2,dp=1", 2, False), ("dp=2,pp=2", 4, False),
                    ("tp=2,pp=2", 4, True), ("pp=2,dp=1", 2, True)]


@pytest.mark.parametrize("pins,ranks,prefilled", MICROBATCH_PLANS,
                         ids=[f"{p[0] or 'single'}{'-prefill' if p[2] else ''}" for p in MICROBATCH_PLANS])
def test_microbatches_each_keep_their_caches(tmp_path, pins, ranks, prefilled):
    """Three batches a replica: three microbatches, each with its own KV
    caches, run in turn on every stage (stage 1 on microbatch m while stage 0
    is on m + 1). Every row's logits are numpy's on its own tokens; the
    rows equal what one batch at a time generates."""
    dp, micro = replicas(pins), 3
    model, exe, prefill = step_and_prefill(tmp_path, pins, ranks, prefilled)
    prompt = np.random.default_rng(5).integers(0, model.cfg.vocab, size=(2 * dp * micro, 7))
    proc = model.generate(exe, ranks, prompt, NEW, prefill=prefill, expect_ok=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{2 * dp * micro} row(s) after a prompt of 7" in proc.stdout, proc.stdout
    assert f"{micro} microbatch(es)" in proc.stdout, proc.stdout
    tokens, logits = model.generate(exe, ranks, prompt, NEW, prefill=prefill)
    check_generation(model, tokens, logits, 7)
    # The same rows, one batch a replica at a time.
    for k in range(micro):
        rows = [r for rep in range(dp) for r in range((rep * micro + k) * 2, (rep * micro + k) * 2 + 2)]
        alone, _ = model.generate(exe, ranks, prompt[rows], NEW, prefill=prefill)
        assert (alone == tokens[rows]).all(), k


# (pins, ranks, microbatches a replica, prefill?)
RAGGED_PLANS = [(None, 1, 1, False), ("tp=2,dp=1", 2, 1, False), ("pp=2,dp=1", 2, 2, False),
                ("dp=2", 2, 1, False), (None, 1, 2, True), ("tp=2,pp=2", 4, 2, True)]
RAGGED_LENGTHS = [7, 3, 5, 6, 4, 7, 3, 5]


def ragged_prompt(model, lengths, seed=9):
    """Prompts of `lengths` tokens, each padded with -1 to the longest."""
    prompt = np.random.default_rng(seed).integers(0, model.cfg.vocab, size=(len(lengths), max(lengths)))
    for row, length in enumerate(lengths):
        prompt[row, length:] = -1
    return prompt


def check_ragged_rows(model, prompt, lengths, tokens, logits, new):
    """Each row: its prompt, `new` tokens, then -1; its logits numpy's on
    its own tokens up to its last one, NaN after; its tokens the most likely
    of its logits."""
    assert tokens.shape == (len(lengths), max(lengths) + new)
    for row, length in enumerate(lengths):
        end = length + new
        assert (tokens[row, :length] == prompt[row, :length]).all(), row
        assert (tokens[row, end:] == -1).all() and (tokens[row, :end] >= 0).all(), row
        expected = model_reference(model, tokens[row:row + 1, :end - 1])[0]
        np.testing.assert_allclose(logits[row, :end - 1], expected, atol=1e-4, rtol=1e-4)
        assert np.isnan(logits[row, end - 1:]).all(), row
        assert (logits[row, length - 1:end - 1].argmax(-1) == tokens[row, length:end]).all(), row


@pytest.mark.parametrize("pins,ranks,micro,prefilled", RAGGED_PLANS,
                         ids=[f"{p[0] or 'single'}-x{p[2]}{'-prefill' if p[3] else ''}" for p in RAGGED_PLANS])
def test_prompts_of_different_lengths_each_get_their_tokens(tmp_path, pins, ranks, micro, prefilled):
    """Prompts of different lengths in one batch (each padded with -1 at
    its end): every row gets NEW tokens after its own prompt, computed as
    if it ran alone. The rows still in their prompts take their own next
    tokens while the others generate (a prefill covers the shortest
    prompt's whole chunks)."""
    rows = 2 * replicas(pins) * micro
    model, exe, prefill = step_and_prefill(tmp_path, pins, ranks, prefilled)
    lengths = RAGGED_LENGTHS[:rows]
    prompt = ragged_prompt(model, lengths)
    proc = model.generate(exe, ranks, prompt, NEW, prefill=prefill, expect_ok=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{rows} row(s) after prompts of {min(lengths)} to 7" in proc.stdout, proc.stdout
    if prefilled:
        assert "prefill of 1 chunk(s) of 3 tokens" in proc.stdout, proc.stdout
    tokens, logits = model.generate(exe, ranks, prompt, NEW, prefill=prefill)
    check_ragged_rows(model, prompt, lengths, tokens, logits, NEW)


def test_a_ragged_row_that_stops_gives_the_stop_token_to_its_own_end(tmp_path):
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY + 4)
    exe = model.compile("single")
    lengths = [7, 3]
    prompt = ragged_prompt(model, lengths)
    free, _ = model.generate(exe, 1, prompt, NEW)
    stop = int(free[1, 3])  # the short row's first generated token
    if stop in free[0, 7:]:
        pytest.skip("the long row would stop too")
    tokens, logits = model.generate(exe, 1, prompt, NEW, extra=("--stop-token", str(stop)))
    assert (tokens[0] == free[0]).all()
    assert (tokens[1, 3:3 + NEW] == stop).all() and (tokens[1, 3 + NEW:] == -1).all()


def test_malformed_ragged_prompts_are_refused(tmp_path):
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY)
    exe = model.compile("single")
    prompt = prompt_for(model, 2)
    prompt[1, 1] = -1  # a token after the -1 that ends the row
    proc = model.generate(exe, 1, prompt, 2, expect_ok=False)
    assert proc.returncode != 0
    assert (f"--generate: prompt row 1 has token {prompt[1, 2]} at position 2, after the -1 that ends it"
            in proc.stderr), proc.stderr
    prompt[1] = -1
    proc = model.generate(exe, 1, prompt, 2, expect_ok=False)
    assert "--generate: prompt row 1 is empty (it starts with -1)" in proc.stderr, proc.stderr


def test_each_rank_keeps_only_its_kv_heads(tmp_path):
    """Under TP the caches are inputs split by KV heads, written in place by
    cache_update: no rank holds (or gathers) another's heads."""
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY)
    model.compile("tp2", f"decode:batch=2,context={CAPACITY},tp=2,dp=1", 2)
    with open(os.path.join(str(tmp_path), "tp2.mlir")) as f:
        text = f.read()
    updates = [line for line in text.splitlines() if "parax.cache_update" in line]
    assert len(updates) == 4
    for line in updates:  # [B, C, 1 of 2 KV heads, D], read straight from an argument
        assert "(tensor<2x12x1x16xf32>, tensor<2x1x1x16xf32>, tensor<i32>)" in line, line
        assert "parax.cache_update %arg" in line, line


def test_generation_errors_are_named(tmp_path):
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY)
    exe = model.compile("single")
    prompt = prompt_for(model, 2)
    # More tokens than the caches hold.
    proc = model.generate(exe, 1, prompt, CAPACITY, expect_ok=False)
    assert proc.returncode != 0
    assert ("the prompt's 3 tokens and 12 generated ones need 14 cache rows; the step's caches "
            "hold 12") in proc.stderr, proc.stderr
    # Rows that are not the step's batch.
    proc = model.generate(exe, 1, prompt_for(model, 3), 2, expect_ok=False)
    assert "not a multiple of the executable's batch 2" in proc.stderr, proc.stderr
    # --steps has no meaning there.
    proc = model.generate(exe, 1, prompt, 2, extra=("--steps", "3"), expect_ok=False)
    assert "--generate runs one step per token: it takes no --steps" in proc.stderr, proc.stderr
    # A program that is no generation step.
    plain = Model(os.path.join(str(tmp_path), "plain"), "tiny-llama", seq=1)
    proc = plain.generate(plain.compile("plain"), 1, prompt, 2, expect_ok=False)
    assert "--generate needs a step with a run-time position and KV caches" in proc.stderr, proc.stderr
    prefill = Model(os.path.join(str(tmp_path), "prefill"), "tiny-llama", seq=4)
    proc = prefill.generate(prefill.compile("prefill"), 1, prompt, 2, expect_ok=False)
    assert "--generate needs a generation step whose first input is one token per row" in proc.stderr


def test_one_step_at_a_position_outside_the_cache_is_refused(tmp_path):
    """A plain run of a generation step: the position input is checked
    against the cache before anything runs."""
    model = Model(str(tmp_path), "tiny-llama", seq=1, past=CAPACITY, cache=CAPACITY)
    exe = model.compile("single")
    proc = model.run(exe, 1, expect_ok=False)
    assert proc.returncode != 0
    assert "position 12: 1 token(s) from there do not fit a KV cache of 12" in proc.stderr, proc.stderr
    np.save(os.path.join(str(tmp_path), "position.npy"), np.array(-1, dtype=np.int32))
    proc = model.run(exe, 1, expect_ok=False)
    assert "position -1 is negative (stage 0 instruction" in proc.stderr, proc.stderr
    np.save(os.path.join(str(tmp_path), "position.npy"), np.array(CAPACITY - 1, dtype=np.int32))
    logits = model.run(exe, 1)
    assert logits.shape == (2, 1, model.cfg.vocab)


def test_builder_refuses_what_a_generation_step_cannot_be():
    from parax.models import build_model, load_config
    llama, gpt2 = load_config("tiny-llama"), load_config("tiny-gpt2")
    with pytest.raises(ValueError, match="sequence 8 does not fit a cache of 4 tokens"):
        build_model(llama, seq=8, cache=4)
    with pytest.raises(ValueError, match="cache .* replaces past and return_kv"):
        build_model(llama, seq=1, cache=8, past=4)
    with pytest.raises(ValueError, match="inference: no loss"):
        build_model(llama, seq=1, cache=8, loss=True)
    with pytest.raises(ValueError, match=f"cache capacity {gpt2.max_positions + 1} exceeds n_positions"):
        build_model(gpt2, seq=1, cache=gpt2.max_positions + 1)


@pytest.mark.parametrize("preset,seq", [("tiny-llama", 1), ("tiny-llama", 5), ("tiny-gpt2", 3),
                                        ("tiny-deepseek-v3", 1)])
def test_one_step_over_a_half_full_cache_matches_the_whole_sequence(tmp_path, preset, seq):
    """A generation step run once (plain inputs: tokens, position 7, caches
    holding 7 tokens' keys and values and noise beyond) equals the whole
    sequence's forward pass at its last positions: rows past the position
    are never read, several new tokens see each other causally."""
    model = Model(str(tmp_path), preset, seq=seq, past=7, cache=CAPACITY + 4)
    got = model.run(model.compile("single"), 1)
    np.testing.assert_allclose(got, model.reference(), atol=1e-4, rtol=1e-4)


def test_front_door_compiles_and_generates(tmp_path):
    """python3 -m parax compile --cache (a step and a prefill of 2-token
    chunks), then run --generate --prefill: planned for TP2 on the oracle
    cluster, the tokens numpy would pick."""
    import sys
    from conftest import ORACLE_CLUSTER, ROOT
    from parax import reference
    from parax.checkpoint import random_weights, save_safetensors
    from parax.models import load_config
    cfg = load_config("tiny-llama")
    weights = random_weights(cfg, seed=4)
    checkpoint, exe = str(tmp_path / "w.safetensors"), str(tmp_path / "gen.pxe")
    save_safetensors(checkpoint, weights)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    front = [sys.executable, "-m", "parax"]
    prefill = str(tmp_path / "prefill.pxe")
    for seq, out in (("1", exe), ("2", prefill)):
        subprocess.run(front + ["compile", "tiny-llama", "--cluster", f"{ORACLE_CLUSTER}:devices_per_node=2",
                                "--workload", "decode:batch=2,context=16,tp=2,dp=1", "--batch", "2", "--seq", seq,
                                "--cache", "16", "--dtype", "f32", "-o", out],
                       check=True, capture_output=True, timeout=120, env=env)
    prompt = str(tmp_path / "prompt.npy")
    np.save(prompt, np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32))
    out, logits = str(tmp_path / "tokens.npy"), str(tmp_path / "logits.npy")
    proc = subprocess.run(front + ["run", exe, "--weights", checkpoint, "--input", prompt, "--output", out,
                                   "--output", logits, "--ranks", "2", "--generate", "5", "--prefill", prefill],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "5 token(s) generated for each of 2 row(s) after a prompt of 3" in proc.stdout, proc.stdout
    assert "prefill of 1 chunk(s) of 2 tokens" in proc.stdout, proc.stdout
    drawn = str(tmp_path / "drawn.npy")
    subprocess.run(front + ["run", exe, "--weights", checkpoint, "--input", prompt, "--output", drawn,
                            "--ranks", "2", "--generate", "5", "--temperature", "2.0", "--seed", "1"],
                   check=True, capture_output=True, timeout=120, env=env)
    assert np.load(drawn).shape == (2, 8)
    tokens = np.load(out)
    expected = reference.forward(cfg, weights, tokens[:, :-1])
    np.testing.assert_allclose(np.load(logits), expected, atol=1e-4, rtol=1e-4)
    assert (expected[:, 2:].argmax(-1) == tokens[:, 3:]).all()


def test_front_door_joins_an_outer_launchers_job(tmp_path):
    """`run --launcher none` under an external mpirun: each of the two
    ranks mpirun starts is a `parax run`, whose parax-run joins mpirun's job.
    The same TP2 prefill's logits as the job parax launches itself."""
    import sys
    from conftest import MPI_ENV, ORACLE_CLUSTER, ROOT
    from parax.checkpoint import random_weights, save_safetensors
    from parax.models import load_config
    checkpoint, exe = str(tmp_path / "w.safetensors"), str(tmp_path / "tp2.pxe")
    save_safetensors(checkpoint, random_weights(load_config("tiny-llama"), seed=5))
    env = dict(MPI_ENV, PYTHONPATH=os.path.join(ROOT, "python"))
    front = [sys.executable, "-m", "parax"]
    subprocess.run(front + ["compile", "tiny-llama", "--cluster", f"{ORACLE_CLUSTER}:devices_per_node=2",
                            "--workload", "prefill:batch=2,seq=8,tp=2,dp=1", "--batch", "2", "--seq", "8",
                            "--dtype", "f32", "-o", exe], check=True, capture_output=True, timeout=120, env=env)
    tokens = str(tmp_path / "tokens.npy")
    np.save(tokens, np.arange(16, dtype=np.int32).reshape(2, 8))
    ours, outer = str(tmp_path / "ours.npy"), str(tmp_path / "outer.npy")
    run = ["run", exe, "--weights", checkpoint, "--input", tokens, "--ranks", "2"]
    subprocess.run(front + run + ["--output", ours], check=True, capture_output=True, timeout=120, env=env)
    proc = subprocess.run(["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none"] + front + run +
                          ["--output", outer, "--launcher", "none"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 rank(s) on cpu" in proc.stdout, proc.stdout
    np.testing.assert_array_equal(np.load(outer), np.load(ours))


def test_the_python_api_compiles_and_runs(tmp_path):
    """parax.compile then parax.run: an Executable that knows its ranks,
    run on numpy arrays, numpy's logits back (the oracle cluster's plan
    splits even this tiny model)."""
    import parax
    from conftest import ORACLE_CLUSTER
    from parax import reference
    from parax.checkpoint import random_weights, save_safetensors
    from parax.models import load_config
    cfg = load_config("tiny-llama")
    weights = random_weights(cfg, seed=6)
    checkpoint = str(tmp_path / "w.safetensors")
    save_safetensors(checkpoint, weights)
    exe = parax.compile("tiny-llama", f"{ORACLE_CLUSTER}:devices_per_node=2", "prefill:batch=2,seq=8,tp=2,dp=1",
                        str(tmp_path / "api.pxe"), batch=2, seq=8, dtype="f32")
    assert exe.ranks == 2
    tokens = np.arange(16, dtype=np.int32).reshape(2, 8)
    logits = parax.run(exe, checkpoint, [tokens])[0]
    np.testing.assert_allclose(logits, reference.forward(cfg, weights, tokens), atol=1e-4, rtol=1e-4)


def test_front_door_from_text_to_tokens_and_training(tmp_path):
    """The front door's remaining verbs: init-weights (a checkpoint under
    the model's names), tokens (texts through the folder's tokenizer.json,
    rows padded with -1), generate (run --generate: the greedy tokens numpy
    picks) and train (run --optimizer, adamw by default)."""
    import sys
    from conftest import MPI_ENV, ROOT
    from tokenizers import Tokenizer, models, pre_tokenizers
    from parax import reference
    from parax.checkpoint import load_safetensors
    from parax.models import load_config
    from parax.models.builder import parameter_shapes
    env = dict(MPI_ENV, PYTHONPATH=os.path.join(ROOT, "python"))
    front = [sys.executable, "-m", "parax"]
    cfg = load_config("tiny-llama")
    checkpoint = str(tmp_path / "w.safetensors")
    subprocess.run(front + ["init-weights", "tiny-llama", "-o", checkpoint, "--seed", "3"],
                   check=True, capture_output=True, timeout=60, env=env)
    weights = load_safetensors(checkpoint)
    assert set(weights) == set(parameter_shapes(cfg))
    # a word-level tokenizer of 4 words, saved as a model folder's
    folder = tmp_path / "model"
    folder.mkdir()
    tokenizer = Tokenizer(models.WordLevel({"[UNK]": 0, "the": 5, "cat": 9, "sat": 17}, unk_token="[UNK]"))
    tokenizer.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer.save(str(folder / "tokenizer.json"))
    prompt = str(tmp_path / "prompt.npy")
    subprocess.run(front + ["tokens", str(folder), "the cat sat", "the cat", "-o", prompt],
                   check=True, capture_output=True, timeout=60, env=env)
    np.testing.assert_array_equal(np.load(prompt), [[5, 9, 17], [5, 9, -1]])
    step = str(tmp_path / "step.pxe")
    subprocess.run(front + ["compile", "tiny-llama", "--cluster", "dgx-h100:devices_per_node=1",
                            "--workload", "decode:batch=2,context=16", "--batch", "2", "--seq", "1", "--cache", "16",
                            "--dtype", "f32", "-o", step], check=True, capture_output=True, timeout=120, env=env)
    out = str(tmp_path / "generated.npy")
    proc = subprocess.run(front + ["generate", step, "--weights", checkpoint, "--input", prompt, "--output", out,
                                   "--ranks", "1", "--tokens", "4"], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tokens = np.load(out)
    assert tokens.shape == (2, 7)
    logits = reference.forward(cfg, weights, tokens[:1, :6])
    assert (logits[0, 2:].argmax(-1) == tokens[0, 3:]).all()
    train = str(tmp_path / "train.pxe")
    subprocess.run(front + ["compile", "tiny-llama", "--cluster", "dgx-h100:devices_per_node=1",
                            "--workload", "train:batch=2,seq=8", "--batch", "2", "--seq", "8", "--dtype", "f32",
                            "--train", "-o", train], check=True, capture_output=True, timeout=120, env=env)
    tokens8, labels8 = str(tmp_path / "t8.npy"), str(tmp_path / "l8.npy")
    np.save(tokens8, np.arange(16, dtype=np.int32).reshape(2, 8))
    np.save(labels8, np.arange(1, 17, dtype=np.int32).reshape(2, 8))
    losses = str(tmp_path / "losses.npy")
    proc = subprocess.run(front + ["train", train, "--weights", checkpoint, "--input", tokens8, "--input", labels8,
                                   "--ranks", "1", "--steps", "3", "--lr", "0.01", "--losses", losses],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "AdamW" in proc.stdout or "adamw" in proc.stdout, proc.stdout
    values = np.load(losses)
    assert values.shape == (3,) and values[-1] < values[0], values


PREFILL_PLANS = [(None, 1), ("tp=2,dp=1", 2), ("pp=2,dp=1", 2), ("dp=2", 2)]


@pytest.mark.parametrize("pins,ranks", PREFILL_PLANS, ids=[p[0] or "single" for p in PREFILL_PLANS])
@pytest.mark.parametrize("prompt_len", [7, 6])
def test_prefill_chunks_then_steps_match_numpy(tmp_path, pins, ranks, prompt_len):
    """--prefill: the prompt's whole chunks of 3 through a second program
    (built like the step with --seq 3, planned alike) that writes the same
    caches, the rest (7: one token) and the generated tokens through the
    step; every position's logits against numpy."""
    dp = replicas(pins)
    step = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY + 4)
    chunked = Model(os.path.join(str(tmp_path), "prefill"), "tiny-llama", seq=3, cache=CAPACITY + 4)
    workload = f"decode:batch={2 * dp},context={CAPACITY + 4},{pins}"
    exe = step.compile("step", workload if pins else None, ranks)
    prefill = chunked.compile("prefill", workload if pins else None, ranks)
    prompt = np.random.default_rng(8).integers(0, step.cfg.vocab, size=(2 * dp, prompt_len))
    check_prefilled_generation(step, exe, ranks, prompt, prefill, 2, 3)


def test_prefill_errors_are_named(tmp_path):
    step = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY)
    exe = step.compile("step")
    prompt = prompt_for(step, 2)
    other = Model(os.path.join(str(tmp_path), "b4"), "tiny-llama", batch=4, seq=3, cache=CAPACITY)
    proc = step.generate(exe, 1, prompt, 2, prefill=other.compile("b4"), expect_ok=False)
    assert "--prefill: its inputs are not the step's (tokens [2, P]" in proc.stderr, proc.stderr
    small = Model(os.path.join(str(tmp_path), "c8"), "tiny-llama", seq=3, cache=8)
    proc = step.generate(exe, 1, prompt, 2, prefill=small.compile("c8"), expect_ok=False)
    assert "--prefill: its input #2 [2, 8, 2, 16] is not the step's [2, 12, 2, 16]" in proc.stderr, proc.stderr
    tp2 = Model(os.path.join(str(tmp_path), "tp2"), "tiny-llama", seq=3, cache=CAPACITY)
    prefill = tp2.compile("tp2", f"decode:batch=2,context={CAPACITY},tp=2,dp=1", 2)
    proc = step.generate(exe, 1, prompt, 2, prefill=prefill, expect_ok=False)
    assert "--prefill: its grid is not the step's" in proc.stderr, proc.stderr
    proc = step.run(exe, 1, extra=("--prefill", prefill), expect_ok=False)
    assert "--prefill is part of --generate" in proc.stderr, proc.stderr


@pytest.mark.parametrize("tool_name,device", [("parax-run", "cpu"), ("parax-run-simt", "cuda")])
def test_a_token_outside_the_vocabulary_is_refused_on_both_backends(tmp_path, tool_name, device):
    """Before the step that would read it: the CUDA embedding cannot report
    one (it would read a zero embedding), so the host checks the ids it
    uploads."""
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY)
    exe = model.compile("single")
    prompt = prompt_for(model, 2)
    prompt[1, 2] = model.cfg.vocab
    proc = model.generate(exe, 1, prompt, 2, extra=("--device", device), expect_ok=False,
                          tool_name=tool_name)
    assert proc.returncode != 0
    assert "token id 256 (element 1 of this rank's part) is outside the vocabulary of 256" in proc.stderr, \
        proc.stderr


MASK = (1 << 64) - 1


def splitmix64(z):
    z = (z + 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    return z ^ (z >> 31)


def sample(logits, temperature, top_k, seed, row, position, top_p=1.0):
    """The sampler parax-run documents, written again: softmax(logits / T)
    over the top k (ties to the lower id), then over the fewest of those,
    most likely first, holding top_p of their weight; inverse CDF at the
    SplitMix64 uniform of (seed, row, position)."""
    logits = logits.astype(np.float32)
    order = sorted(range(len(logits)), key=lambda i: (-logits[i], i))
    k = top_k if 0 < top_k < len(logits) else len(logits)
    kept = order[:k] if k < len(logits) or top_p < 1 else list(range(len(logits)))
    top = logits[order[0]]
    weights = [np.exp(np.float64(np.float32(logits[i] - top)) / temperature) for i in kept]
    if top_p < 1:
        wanted, held, n = top_p * sum(weights), 0.0, 0
        while n < len(kept) and (n == 0 or held < wanted):
            held += weights[n]
            n += 1
        kept, weights = kept[:n], weights[:n]
    u = (splitmix64(splitmix64(splitmix64(seed) ^ row) ^ position) >> 11) * 2.0 ** -53 * sum(weights)
    total = 0.0
    for i, w in zip(kept, weights):
        total += w
        if u < total:
            return i
    return kept[-1]


@pytest.mark.parametrize("pins,ranks,top_k,top_p", [(None, 1, 20, 1.0), (None, 1, 0, 1.0), ("tp=2,dp=1", 2, 5, 1.0),
                                                   ("dp=2", 2, 20, 1.0), (None, 1, 0, 0.9), ("tp=2,dp=1", 2, 40, 0.7)])
def test_sampled_generation_is_the_documented_draw(tmp_path, pins, ranks, top_k, top_p):
    """--temperature/--top-k/--top-p/--seed: every drawn token is what the
    sampler, written again in numpy, draws from parax's own logits
    (reproducible anywhere: one rank or many), and the logits are numpy's on
    those tokens. Another seed draws another sequence."""
    dp = replicas(pins)
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY)
    exe = model.compile("step", f"decode:batch={2 * dp},context={CAPACITY},{pins}" if pins else None, ranks)
    prompt = prompt_for(model, 2 * dp)
    options = ("--temperature", "1.5", "--top-k", str(top_k), "--top-p", str(top_p), "--seed", "42")
    tokens, logits = model.generate(exe, ranks, prompt, NEW, extra=options)
    expected = model_reference(model, tokens[:, :-1])
    np.testing.assert_allclose(logits, expected, atol=1e-4, rtol=1e-4)
    for row in range(tokens.shape[0]):
        for position in range(PROMPT, PROMPT + NEW):
            assert tokens[row, position] == sample(logits[row, position - 1], 1.5, top_k, 42, row, position,
                                                   top_p)
    other, _ = model.generate(exe, ranks, prompt, NEW, extra=options[:-1] + ("43",))
    assert not np.array_equal(other, tokens)


def test_sampling_options_belong_to_generate(tmp_path):
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY)
    exe = model.compile("single")
    proc = model.run(exe, 1, extra=("--temperature", "0.7"), expect_ok=False)
    assert "--temperature, --top-k, --top-p, --seed and --stop-token are part of --generate" in proc.stderr, \
        proc.stderr
    proc = model.generate(exe, 1, prompt_for(model, 2), 2, extra=("--top-p", "0"), expect_ok=False)
    assert "--top-p must be a probability in (0, 1], got '0'" in proc.stderr, proc.stderr
    proc = model.generate(exe, 1, prompt_for(model, 2), 2, extra=("--top-k", "2.5"), expect_ok=False)
    assert "--top-k must be a non-negative integer, got '2.5'" in proc.stderr, proc.stderr


@pytest.mark.parametrize("pins,ranks", [(None, 1), ("pp=2,dp=1", 2)])
def test_a_stop_token_ends_rows_then_the_loop(tmp_path, pins, ranks):
    """--stop-token: a row that generates it generates nothing more (its
    later tokens are the stop token); when every row has, the loop ends and
    the logits hold the positions run. Rows 0 and 1 share a prompt (they stop
    together), row 2 does not."""
    model = Model(str(tmp_path), "tiny-llama", batch=3, seq=1, cache=CAPACITY)
    exe = model.compile("step", f"decode:batch=3,context={CAPACITY},{pins}" if pins else None, ranks)
    prompt = prompt_for(model, 3)
    prompt[1] = prompt[0]
    free, _ = model.generate(exe, ranks, prompt, NEW)
    stop = int(free[0, PROMPT + 1])  # row 0's second generated token
    tokens, logits = model.generate(exe, ranks, prompt, NEW, extra=("--stop-token", str(stop)))
    for row in range(3):
        generated = list(free[row, PROMPT:])
        end = PROMPT + (generated.index(stop) + 1 if stop in generated else NEW)
        assert (tokens[row, :end] == free[row, :end]).all()
        assert (tokens[row, end:] == stop).all()
    # The positions run computed what numpy does on those tokens (a stopped
    # row's input is the stop token from then on).
    np.testing.assert_allclose(logits, model_reference(model, tokens[:, :logits.shape[1]]), atol=1e-4, rtol=1e-4)
    if stop in free[2, PROMPT:]:  # every row stopped: the loop ended early
        assert logits.shape[1] < PROMPT + NEW - 1


def test_every_row_stopping_ends_the_loop_early(tmp_path):
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY)
    exe = model.compile("single")
    prompt = prompt_for(model, 2)
    prompt[1] = prompt[0]
    free, _ = model.generate(exe, 1, prompt, NEW)
    stop = int(free[0, PROMPT])  # the first generated token: both rows stop at once
    proc = model.generate(exe, 1, prompt, NEW, extra=("--stop-token", str(stop)), expect_ok=False)
    assert "every row gave the stop token after 1 token(s)" in proc.stdout, proc.stdout
    tokens, logits = model.generate(exe, 1, prompt, NEW, extra=("--stop-token", str(stop)))
    assert logits.shape[1] == PROMPT and (tokens[:, PROMPT:] == stop).all()


@pytest.mark.parametrize("pins,ranks", [(None, 1), ("pp=2,dp=1", 2)])
def test_a_stopped_microbatch_runs_no_more_steps(tmp_path, pins, ranks):
    """Two microbatches: the first's rows share a prompt and stop at their
    first generated token, the second's go on. The stopped microbatch runs
    nothing more (its logits are NaN from then on, its tokens the stop
    token); the other's tokens and logits are what it computes alone."""
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY)
    exe = model.compile("step", f"decode:batch=2,context={CAPACITY},{pins}" if pins else None, ranks)
    prompt = prompt_for(model, 4)
    prompt[1] = prompt[0]
    free, _ = model.generate(exe, ranks, prompt, NEW)
    stop = int(free[0, PROMPT])
    if stop in free[2:, PROMPT:]:
        pytest.skip("the second microbatch would stop too: no longer a test of one stopping alone")
    tokens, logits = model.generate(exe, ranks, prompt, NEW, extra=("--stop-token", str(stop)))
    assert logits.shape == (4, PROMPT + NEW - 1, model.cfg.vocab)
    assert (tokens[:2, PROMPT:] == stop).all() and (tokens[2:] == free[2:]).all()
    assert np.isnan(logits[:2, PROMPT:]).all() and not np.isnan(logits[:2, :PROMPT]).any()
    assert not np.isnan(logits[2:]).any()
    np.testing.assert_allclose(logits[2:], model_reference(model, tokens[2:, :-1]), atol=1e-4, rtol=1e-4)
    np.testing.assert_allclose(logits[:2, :PROMPT], model_reference(model, tokens[:2, :PROMPT]), atol=1e-4,
                               rtol=1e-4)


LAST_LOGITS_PLANS = [(None, 1), ("tp=2,dp=1", 2), ("pp=2,dp=1", 2), ("dp=2", 2)]


@pytest.mark.parametrize("pins,ranks", LAST_LOGITS_PLANS, ids=[p[0] or "single" for p in LAST_LOGITS_PLANS])
@pytest.mark.parametrize("preset", ["tiny-llama", "tiny-gpt2"])
def test_last_logits_are_the_last_positions(tmp_path, preset, pins, ranks):
    """A graph built with last_logits (the final norm and lm head see the
    last position alone: logits [batch, 1, vocab]) computes what the whole
    forward pass gives there, on every kind of partitioning."""
    dp = replicas(pins)
    model = Model(str(tmp_path), preset, seq=8, last_logits=True, rows=2 * dp)
    with open(model.ir) as f:
        assert "parax.slice" in f.read()
    exe = model.compile("last", f"prefill:batch={2 * dp},seq=8,{pins}" if pins else None, ranks)
    got = model.run(exe, ranks)
    assert got.shape == (2 * dp, 1, model.cfg.vocab)
    np.testing.assert_allclose(got, model.reference()[:, -1:], atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("pins,ranks", PREFILL_PLANS[:3], ids=[p[0] or "single" for p in PREFILL_PLANS[:3]])
def test_a_prefill_of_last_logits_generates_the_same_tokens(tmp_path, pins, ranks):
    """--prefill with a program built --last-logits: the same tokens as a
    prefill of every position's logits; the logits output holds each
    chunk's last position (numpy's) and NaN at the positions it skipped."""
    step = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY + 4)
    workload = f"decode:batch=2,context={CAPACITY + 4},{pins}" if pins else None
    exe = step.compile("step", workload, ranks)
    every = Model(os.path.join(str(tmp_path), "every"), "tiny-llama", seq=3, cache=CAPACITY + 4)
    last = Model(os.path.join(str(tmp_path), "last"), "tiny-llama", seq=3, cache=CAPACITY + 4, last_logits=True)
    prompt = np.random.default_rng(8).integers(0, step.cfg.vocab, size=(2, 7))
    want, _ = step.generate(exe, ranks, prompt, NEW, prefill=every.compile("prefill", workload, ranks))
    tokens, logits = step.generate(exe, ranks, prompt, NEW, prefill=last.compile("prefill", workload, ranks))
    assert (tokens == want).all()
    skipped = [0, 1, 3, 4]  # two chunks of 3: positions 2 and 5 are their last
    assert np.isnan(logits[:, skipped]).all()
    kept = [p for p in range(logits.shape[1]) if p not in skipped]
    assert not np.isnan(logits[:, kept]).any()
    np.testing.assert_allclose(logits[:, kept], model_reference(step, tokens[:, :-1])[:, kept], atol=1e-4, rtol=1e-4)


def test_a_stalled_rank_ends_a_generation_naming_what_the_other_waits_in(tmp_path):
    """PP2 generation, one rank stopped (SIGSTOP) mid-loop: the other waits
    for activations, or for the generated tokens the last stage sends, and
    the job ends after the timeout naming it, instead of hanging."""
    import re
    from conftest import MPI_ENV, run_with_a_stalled_rank
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=50000)
    exe = model.compile("pp2", "decode:batch=2,context=50000,pp=2,dp=1", 2)
    prompt = os.path.join(str(tmp_path), "prompt.npy")
    np.save(prompt, prompt_for(model, 2).astype(np.int32))
    cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", tool("parax-run"), exe,
           "--weights", model.checkpoint, "--input", prompt, "--generate", "49990",
           "--output", os.path.join(str(tmp_path), "tokens.npy")]
    out, err, code = run_with_a_stalled_rank(cmd, dict(MPI_ENV, PARAX_COLLECTIVE_TIMEOUT="2"))
    assert code != 0, out + err
    assert re.search(r"parax-run: rank [01]: (recv|send|receiving the generated tokens|sending the generated "
                     r"tokens)[\w ()-]* has not finished after 2 s", err), err[-2000:]


@pytest.mark.parametrize("pins,ranks", [("tp=2,dp=1", 2), ("pp=2,dp=1", 2)])
def test_a_prefill_chunk_planned_as_a_prefill_goes_with_its_step(tmp_path, pins, ranks):
    """The prefill program planned as what it is (prefill:batch=2,seq=4,
    with the step's pins; the step planned for decode): its caches are the
    step's boxes, whatever layouts the planner picks for its activations
    (sequence parallelism among them), and the loop computes numpy's
    logits."""
    step = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY + 4)
    exe = step.compile("step", f"decode:batch=2,context={CAPACITY + 4},{pins}", ranks)
    chunked = Model(os.path.join(str(tmp_path), "prefill"), "tiny-llama", seq=4, cache=CAPACITY + 4)
    prefill = chunked.compile("prefill", f"prefill:batch=2,seq=4,{pins}", ranks)
    if "tp=2" in pins:  # sequence parallelism between the layers, the caches by KV heads
        with open(os.path.join(chunked.dir, "prefill.mlir")) as f:
            assert "parax.reduce_scatter" in f.read()
    prompt = np.random.default_rng(8).integers(0, step.cfg.vocab, size=(2, 9))
    check_prefilled_generation(step, exe, ranks, prompt, prefill, 2, 4)


def test_replicas_that_stop_at_different_positions_join_their_logits(tmp_path):
    """DP2 with --stop-token: replica 0's rows stop at their first token,
    replica 1's go on; each replica ends its own loop (they never wait for
    each other), and the writer joins their logits at the longest run, NaN
    where replica 0 ran nothing."""
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=CAPACITY)
    exe = model.compile("dp2", f"decode:batch=4,context={CAPACITY},dp=2", 2)
    prompt = prompt_for(model, 4)
    prompt[1] = prompt[0]
    free, _ = model.generate(exe, 2, prompt, NEW)
    stop = int(free[0, PROMPT])
    if stop in free[2:, PROMPT:]:
        pytest.skip("replica 1 would stop too: no longer a test of replicas stopping apart")
    proc = model.generate(exe, 2, prompt, NEW, extra=("--stop-token", str(stop)), expect_ok=False)
    assert proc.returncode == 0 and "every row gave the stop token" not in proc.stdout, proc.stdout
    tokens, logits = model.generate(exe, 2, prompt, NEW, extra=("--stop-token", str(stop)))
    assert logits.shape == (4, PROMPT + NEW - 1, model.cfg.vocab)
    assert (tokens[:2, PROMPT:] == stop).all() and (tokens[2:] == free[2:]).all()
    assert np.isnan(logits[:2, PROMPT:]).all() and not np.isnan(logits[2:]).any()
    np.testing.assert_allclose(logits[2:], model_reference(model, tokens[2:, :-1]), atol=1e-4, rtol=1e-4)


# DeepSeek-V3's multi-head latent attention in its weight-absorbed form
# (`--mla absorbed`): the caches hold the latent (ABSORBED_MLA: widths that
# differ from each other).
ABSORBED_PLANS = [(None, 1), ("tp=2,dp=1", 2), ("tp=4,dp=1", 4), ("pp=2,dp=1", 2), ("dp=2,tp=2", 4)]


def absorbed(tmp, seq=1, **kwargs):
    return Model(tmp, "tiny-deepseek-v3", seq=seq, **ABSORBED_MLA, **kwargs)


@pytest.mark.parametrize("pins,ranks", ABSORBED_PLANS, ids=[p[0] or "single" for p in ABSORBED_PLANS])
def test_absorbed_latent_attention_generates_as_numpy(tmp_path, pins, ranks):
    """The absorbed form generates what numpy's explicit form computes on
    one rank and under TP (the heads and their kv_b_proj slices split, the
    one latent KV head kept whole on every rank), PP and DP x TP; each
    layer has one cache, [B, C, 1, 24 + 8], whose first 24 channels are the
    values."""
    dp = replicas(pins)
    model = absorbed(str(tmp_path), cache=CAPACITY)
    with open(model.ir) as f:
        ir = f.read()
    assert "%cache_1_key: tensor<2x12x1x32xf32>" in ir and "%cache_1_value" not in ir
    assert "value_dim = 24" in ir
    assert ir.count("parax.head_linear") == 2 * model.cfg.layers
    workload = f"decode:batch={2 * dp},context={CAPACITY},{pins}" if pins else None
    exe = model.compile("step", workload, ranks)
    prompt = prompt_for(model, 2 * dp)
    tokens, logits = model.generate(exe, ranks, prompt, NEW)
    check_generation(model, tokens, logits, PROMPT)


@pytest.mark.parametrize("pins,ranks", [(None, 1), ("tp=2,dp=1", 2)])
def test_absorbed_step_over_numpy_latents_matches_the_whole_sequence(tmp_path, pins, ranks):
    """Caches holding numpy's latents of 7 tokens ([normed latent, rotated
    rope key], the normed latent the values) and noise beyond:
    one step of 2 tokens equals the whole sequence's explicit forward pass."""
    model = absorbed(str(tmp_path), seq=2, past=7, cache=CAPACITY + 4)
    workload = f"decode:batch=2,context={CAPACITY + 4},{pins}" if pins else None
    got = model.run(model.compile("step", workload, ranks), ranks)
    np.testing.assert_allclose(got, model.reference(), atol=1e-4, rtol=1e-4)


def test_absorbed_forward_and_prefill_match_numpy(tmp_path):
    """A plain forward pass of the absorbed form (no cache) is numpy's; a
    prefill program of 3-token chunks writes the latent caches its step
    reads."""
    plain = absorbed(os.path.join(str(tmp_path), "plain"), seq=6)
    got = plain.run(plain.compile("tp2", "prefill:batch=2,seq=6,tp=2,dp=1", 2), 2)
    np.testing.assert_allclose(got, plain.reference(), atol=1e-4, rtol=1e-4)
    step = absorbed(str(tmp_path), cache=CAPACITY + 4)
    chunked = absorbed(os.path.join(str(tmp_path), "prefill"), seq=3, cache=CAPACITY + 4)
    prompt = np.random.default_rng(8).integers(0, step.cfg.vocab, size=(2, 7))
    check_prefilled_generation(step, step.compile("step"), 1, prompt, chunked.compile("prefill"), 2, 3)


@pytest.mark.parametrize("pins,ranks", [(None, 1), ("tp=2,dp=1", 2), ("pp=2,dp=1", 2)])
def test_expanded_prefill_writes_the_latent_caches_the_absorbed_step_reads(tmp_path, pins, ranks):
    """--mla expanded (the latent cache read in the explicit form, every
    cached latent expanded per head): its forward pass and a step of 2
    tokens over numpy's latents are numpy's, and as the prefill of an
    absorbed generation step it writes the caches that step reads."""
    plain = Model(os.path.join(str(tmp_path), "plain"), "tiny-deepseek-v3", seq=6,
                  **dict(ABSORBED_MLA, mla="expanded"))
    got = plain.run(plain.compile("plain", "prefill:batch=2,seq=6,tp=2,dp=1", 2), 2)
    np.testing.assert_allclose(got, plain.reference(), atol=1e-4, rtol=1e-4)
    half = Model(os.path.join(str(tmp_path), "half"), "tiny-deepseek-v3", seq=2, past=7, cache=CAPACITY + 4,
                 **dict(ABSORBED_MLA, mla="expanded"))
    got = half.run(half.compile("half"), 1)
    np.testing.assert_allclose(got, half.reference(), atol=1e-4, rtol=1e-4)
    workload = f"decode:batch=2,context={CAPACITY + 4},{pins}" if pins else None
    step = absorbed(str(tmp_path), cache=CAPACITY + 4)
    chunked = Model(os.path.join(str(tmp_path), "prefill"), "tiny-deepseek-v3", seq=3, cache=CAPACITY + 4,
                    **dict(ABSORBED_MLA, mla="expanded"))
    exe, prefill = step.compile("step", workload, ranks), chunked.compile("prefill", workload, ranks)
    prompt = np.random.default_rng(8).integers(0, step.cfg.vocab, size=(2, 7))
    check_prefilled_generation(step, exe, ranks, prompt, prefill, 2, 3)


def test_absorbed_weights_are_the_checkpoints_read_by_heads(tmp_path):
    """kv_b_proj.weight stays the checkpoint's [heads * (16 + 8), 24]; the
    program reads it as [heads, 24, 24]. Stored transposed ([24, 96]: as
    many elements), it is refused, named."""
    from parax.checkpoint import save_safetensors
    model = absorbed(str(tmp_path), cache=CAPACITY)
    name = "model.layers.0.self_attn.kv_b_proj.weight"
    assert model.weights[name].shape == (4 * 24, 24)
    exe = model.compile("step")
    weights = dict(model.weights)
    weights[name] = np.ascontiguousarray(weights[name].T)
    save_safetensors(model.checkpoint, weights)
    proc = model.generate(exe, 1, prompt_for(model, 2), 2, expect_ok=False)
    assert proc.returncode != 0
    assert f"tensor '{name}' has shape [24, 96], the executable expects [4, 24, 24]" in proc.stderr + proc.stdout


def test_builder_refuses_absorbed_attention_where_it_does_not_apply():
    from parax.models import build_model, load_config
    with pytest.raises(ValueError, match="mla=absorbed: tiny-llama .llama. has no multi-head latent attention"):
        build_model(load_config("tiny-llama"), seq=1, cache=8, mla="absorbed")
    with pytest.raises(ValueError, match="mla=absorbed is an inference form"):
        build_model(load_config("tiny-deepseek-v3"), seq=4, loss=True, mla="absorbed")
    with pytest.raises(ValueError, match="mla=expanded is an inference form"):
        build_model(load_config("tiny-deepseek-v3"), seq=4, loss=True, mla="expanded")
    with pytest.raises(ValueError, match="mla 'latent' is not one of explicit, absorbed, expanded"):
        build_model(load_config("tiny-deepseek-v3"), seq=4, mla="latent")


def test_front_door_compiles_absorbed_attention(tmp_path):
    """python3 -m parax compile --mla absorbed --cache: DeepSeek-V3's latent
    cache through the front door (a config.json of the tiny preset with
    ABSORBED_MLA's widths), planned TP2, generating what numpy's explicit
    form computes."""
    import json
    import sys
    from conftest import ORACLE_CLUSTER, ROOT
    from parax import reference
    from parax.checkpoint import random_weights, save_safetensors
    from parax.models import PRESETS, load_config
    config = dict(PRESETS["tiny-deepseek-v3"], kv_lora_rank=ABSORBED_MLA["overrides"]["kv_lora_rank"],
                  v_head_dim=ABSORBED_MLA["overrides"]["v_head_dim"])
    path = str(tmp_path / "config.json")
    with open(path, "w") as f:
        json.dump(config, f)
    cfg = load_config(path)
    weights = random_weights(cfg, seed=4)
    checkpoint, exe = str(tmp_path / "w.safetensors"), str(tmp_path / "gen.pxe")
    save_safetensors(checkpoint, weights)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    front = [sys.executable, "-m", "parax"]
    subprocess.run(front + ["compile", path, "--cluster", f"{ORACLE_CLUSTER}:devices_per_node=2",
                            "--workload", "decode:batch=2,context=16,tp=2,dp=1", "--batch", "2", "--seq", "1",
                            "--cache", "16", "--dtype", "f32", "--mla", "absorbed", "-o", exe],
                   check=True, capture_output=True, timeout=120, env=env)
    prompt, out, logits = (str(tmp_path / n) for n in ("prompt.npy", "tokens.npy", "logits.npy"))
    np.save(prompt, np.array([[1, 2, 3], [4, 5, 6]], dtype=np.int32))
    proc = subprocess.run(front + ["run", exe, "--weights", checkpoint, "--input", prompt, "--output", out,
                                   "--output", logits, "--ranks", "2", "--generate", "4"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    tokens = np.load(out)
    np.testing.assert_allclose(np.load(logits), reference.forward(cfg, weights, tokens[:, :-1]),
                               atol=1e-4, rtol=1e-4)


RING_PLANS = [(None, 1), ("tp=2,dp=1", 2), ("pp=2,dp=1", 2)]


@pytest.mark.parametrize("pins,ranks", RING_PLANS, ids=[p[0] or "single" for p in RING_PLANS])
@pytest.mark.parametrize("chunk,prompt_len", [(3, 7), (5, 11)])
def test_a_sliding_window_generates_over_a_ring_of_its_window(tmp_path, pins, ranks, chunk, prompt_len):
    """Mistral's window of 4 keys: each layer's caches hold its last 3
    tokens (a ring, `parax.ring_cache_update`), whatever the capacity asked
    (16) and however far the loop goes (past 16: a ring holds any
    position). Prefill chunks of 3 (the ring's rows) and 5 (more: the last 3
    kept), then steps; every position's logits against numpy's."""
    window = {"sliding_window": 4}
    step = Model(str(tmp_path), "tiny-mistral", seq=1, cache=16, overrides=window)
    chunked = Model(os.path.join(str(tmp_path), "prefill"), "tiny-mistral", seq=chunk, cache=16, overrides=window)
    ir = open(step.ir).read()
    assert ir.count("parax.ring_cache_update") == 4 and "parax.cache_update" not in ir
    assert ir.count("tensor<2x3x2x16xf32>") >= 4  # (each layer's key and value rings: 3 rows)
    workload = f"decode:batch=2,context=16,{pins}" if pins else None
    exe = step.compile("step", workload, ranks)
    prefill = chunked.compile("prefill", workload, ranks)
    prompt = np.random.default_rng(8).integers(0, step.cfg.vocab, size=(2, prompt_len))
    proc = step.generate(exe, ranks, prompt, 10, prefill=prefill, expect_ok=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"prefill of {prompt_len // chunk} chunk(s) of {chunk} tokens" in proc.stdout, proc.stdout
    tokens, logits = step.generate(exe, ranks, prompt, 10, prefill=prefill)
    assert tokens.shape == (2, prompt_len + 10) and prompt_len + 10 > 16
    check_generation(step, tokens, logits, prompt_len)


def test_local_layers_keep_rings_and_global_layers_their_capacity(tmp_path):
    """Gemma 3: its local layers (window 4) keep rings of 3 tokens, its
    global layer a cache of the capacity, which bounds the loop."""
    window = {"sliding_window": 4}
    step = Model(str(tmp_path), "tiny-gemma3", seq=1, cache=12, overrides=window)
    ir = open(step.ir).read()
    assert ir.count("parax.ring_cache_update") == 4 and ir.count("parax.cache_update") == 2
    exe = step.compile("step")
    prompt = prompt_for(step, 2)
    tokens, logits = step.generate(exe, 1, prompt, 9)
    check_generation(step, tokens, logits, PROMPT)
    proc = step.generate(exe, 1, prompt, 11, expect_ok=False)
    assert proc.returncode != 0 and "the step's caches hold 12" in proc.stdout + proc.stderr
