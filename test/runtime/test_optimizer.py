"""The optimizer step (parax-run --optimizer): a training step's gradients
applied to every rank's parameter boxes, under a real mpirun.

The oracle, in two parts:
- one rank's updated weights equal an independent numpy SGD / AdamW
  (PyTorch's update rules: bias-corrected moments, decoupled weight decay
  on matrices only, clipping by the global norm) applied to the gradients
  parax-run writes for the same weights, step after step (1e-6);
- N ranks (TP, DP, DP with ZeRO-1, PP with a tied embedding, CP, and
  combinations) give the single rank's weights and losses after three
  AdamW steps (weights within 1e-5). There AdamW runs with eps 1e-3:
  Adam divides each gradient by its own magnitude, so with a tiny eps a
  gradient near zero turns the ~1e-7 differences that the order of sums
  leaves into updates of up to lr; eps 1e-3 bounds that gain by lr / eps."""

import json
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import MPI_ENV, ROOT, Model, tool
from parax import reference
from parax.checkpoint import load_safetensors, save_safetensors

SINGLE_TOL = 1e-6
SHARDED_TOL = 1e-5
ADAMW = ["--optimizer", "adamw", "--lr", "1e-2", "--weight-decay", "0.1", "--eps", "1e-6"]
SHARDED_ADAMW = ["--optimizer", "adamw", "--lr", "1e-2", "--weight-decay", "0.1", "--eps", "1e-3"]


def train(model, exe, ranks, steps, settings, extra=()):
    """Runs `steps` optimizer steps: (updated weights, each step's loss, stdout)."""
    saved = os.path.join(model.dir, "trained.safetensors")
    losses = os.path.join(model.dir, "losses.npy")
    proc = model.run(exe, ranks, outputs=0, expect_ok=False,
                     extra=[*settings, "--steps", str(steps), "--save-weights", saved, "--losses", losses, *extra])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return load_safetensors(saved), np.load(losses), proc.stdout


def gradients_at(model, exe, weights):
    """The loss and {name: gradient} parax-run writes (--output-dir) for `weights`."""
    save_safetensors(model.checkpoint, weights)
    results = model.run_to_dir(exe, 1)
    return float(results.pop("result0")), results


def numpy_adamw(weights, grads, state, step, lr=1e-2, b1=0.9, b2=0.999, eps=1e-6, decay=0.1, clip=0.0):
    norm = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads.values()))
    scale = clip / (norm + 1e-6) if clip and norm > clip else 1.0
    out = {}
    for name, w in weights.items():
        g = grads[name].astype(np.float64) * scale
        m, v = state.get(name, (0.0, 0.0))
        m = b1 * m + (1 - b1) * g
        v = b2 * v + (1 - b2) * g * g
        state[name] = (m, v)
        w = w.astype(np.float64) * (1 - lr * (decay if w.ndim >= 2 else 0.0))
        out[name] = (w - lr * (m / (1 - b1 ** step)) / (np.sqrt(v / (1 - b2 ** step)) + eps)).astype(np.float32)
    return out, norm


def test_adamw_matches_numpy_over_three_steps(tmp_path):
    """Three AdamW steps on one rank (clipping active: the norm bound below
    the gradients' norm) equal numpy's AdamW applied to the gradients
    parax-run computes at each step's weights."""
    model = Model(str(tmp_path), "tiny-llama", loss=True)
    exe = model.compile("train", autodiff=True)
    weights = dict(model.weights)
    state, expected, norms = {}, weights, []
    for step in range(1, 4):
        loss, grads = gradients_at(model, exe, expected)
        expected, norm = numpy_adamw(expected, grads, state, step, clip=0.5)
        norms.append(norm)
    assert min(norms) > 0.5  # clipping did something every step
    save_safetensors(model.checkpoint, weights)
    trained, losses, stdout = train(model, exe, 1, 3, ADAMW + ["--clip-grad-norm", "0.5"])
    assert losses.shape == (3,) and "(clipped)" in stdout
    assert set(trained) == set(weights)
    for name in weights:
        assert np.abs(trained[name] - expected[name]).max() < SINGLE_TOL, name
        assert np.abs(trained[name] - weights[name]).max() > 1e-3, name  # every parameter moved


def test_sgd_matches_numpy(tmp_path):
    """One SGD step with weight decay on matrices: w - lr (g + wd w)."""
    model = Model(str(tmp_path), "tiny-gpt2", loss=True)
    exe = model.compile("train", autodiff=True)
    _, grads = gradients_at(model, exe, model.weights)
    trained, _, _ = train(model, exe, 1, 1, ["--optimizer", "sgd", "--lr", "0.5", "--weight-decay", "0.01"])
    for name, w in model.weights.items():
        expected = w - 0.5 * (grads[name] + (0.01 * w if w.ndim >= 2 else 0))
        assert np.abs(trained[name] - expected).max() < SINGLE_TOL, name


def schedule_lr(step, lr=0.5, warmup=2, decay=5, min_lr=0.05):
    """Megatron's warm-up then cosine decay, written out independently."""
    if step <= warmup:
        return lr * step / warmup
    progress = min(1.0, (step - warmup) / (decay - warmup))
    return min_lr + (lr - min_lr) * 0.5 * (1 + np.cos(np.pi * progress))


def test_learning_rate_schedule_matches_numpy(tmp_path):
    """SGD over 6 steps with 2 warm-up steps, then cosine decay to 0.05 by
    step 5 (and 0.05 after): each step's update is numpy's SGD at the
    schedule's learning rate for that step, on the gradients parax-run
    computes at the step's weights; the printed rates are the schedule's."""
    model = Model(str(tmp_path), "tiny-llama", loss=True)
    exe = model.compile("train", autodiff=True)
    expected = dict(model.weights)
    for step in range(1, 7):
        _, grads = gradients_at(model, exe, expected)
        expected = {k: (w - schedule_lr(step) * grads[k]).astype(np.float32) for k, w in expected.items()}
    save_safetensors(model.checkpoint, model.weights)
    trained, _, stdout = train(model, exe, 1, 6, ["--optimizer", "sgd", "--lr", "0.5", "--lr-schedule", "cosine",
                                                  "--warmup-steps", "2", "--decay-steps", "5", "--min-lr", "0.05"])
    rates = [float(r) for r in re.findall(r"learning rate ([0-9.e-]+)", stdout)]
    assert np.allclose(rates, [schedule_lr(t) for t in range(1, 7)], rtol=1e-5), rates
    for name in expected:
        assert np.abs(trained[name] - expected[name]).max() < SINGLE_TOL, name


def test_loss_falls_on_a_repeated_batch(tmp_path):
    """Twelve AdamW steps over one batch: the model fits it (the loss falls
    below 60 % of the first step's), and each step's loss is what a run
    without the optimizer computes at the weights the step starts from."""
    model = Model(str(tmp_path), "tiny-llama", loss=True)
    exe = model.compile("train", autodiff=True)
    trained, losses, _ = train(model, exe, 1, 12, ADAMW)
    assert losses[-1] < 0.6 * losses[0], losses
    assert np.all(np.diff(losses[:4]) < 0), losses
    loss_after, _ = gradients_at(model, exe, trained)  # the 13th step's loss
    assert loss_after < losses[-1]


def test_step_rows_take_the_next_batch(tmp_path):
    """--step-rows: four rows, two a step, cycling: step 1 takes rows 0-1,
    step 2 rows 2-3. Each step's loss is the loss of its rows at the
    weights the step starts from."""
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, rows=4)
    exe = model.compile("train", autodiff=True)
    sgd = ["--optimizer", "sgd", "--lr", "0.1", "--step-rows", "2"]
    _, losses, _ = train(model, exe, 1, 2, sgd)
    after_one, _, _ = train(model, exe, 1, 1, sgd)
    part = Model(str(tmp_path / "part"), "tiny-llama", loss=True, batch=2)
    part_exe = part.compile("train", autodiff=True)
    for rows, weights, loss in ((slice(0, 2), model.weights, losses[0]), (slice(2, 4), after_one, losses[1])):
        np.save(part.tokens_path, model.tokens[rows])
        np.save(part.labels_path, model.labels[rows])
        assert abs(gradients_at(part, part_exe, weights)[0] - loss) < 1e-6


# (preset, workload pins, ranks, extra settings)
PLANS = [
    ("tiny-llama", "tp=2,dp=1", 2, []),
    ("tiny-llama", "dp=2", 2, []),
    ("tiny-llama", "dp=2", 2, ["--zero"]),
    ("tiny-llama", "pp=2,dp=1", 2, []),
    ("tiny-llama", "cp=2,tp=1,dp=1", 2, []),
    ("tiny-llama", "dp=2,tp=2,pp=2", 8, ["--zero", "--clip-grad-norm", "0.5"]),
    ("tiny-gpt2", "tp=2,pp=2,dp=1", 4, []),  # fused QKV in pieces; the tied embedding on both stages
    ("tiny-gpt2", "dp=2,tp=2", 4, ["--zero"]),
    # the tied embedding's parts added on both stages before ZeRO's
    # reduce-scatter; the copies stay equal (every stage the same sum)
    ("tiny-gpt2", "dp=2,pp=2", 4, ["--zero"]),
    # MoE: the experts' stacks updated in their EP boxes (each rank its
    # experts), saved one tensor per expert; DeepSeek-V3's correction bias,
    # which has no gradient, stays as loaded.
    ("tiny-mixtral", "ep=2,dp=1", 2, []),
    ("tiny-mixtral", "dp=2,ep=2", 4, ["--zero"]),
    # ZeRO over the ranks holding each box: without dp, the dense weights'
    # state over ep, every weight's over cp, the norms' over tp.
    ("tiny-mixtral", "ep=2,dp=1", 2, ["--zero"]),
    ("tiny-llama", "cp=2,tp=1,dp=1", 2, ["--zero"]),
    ("tiny-llama", "tp=2,dp=1", 2, ["--zero"]),
    ("tiny-qwen2-moe", "ep=2,tp=2,dp=1", 4, []),
    ("tiny-deepseek-v3", "ep=2,dp=1", 2, []),
]


@pytest.mark.parametrize("preset,pins,ranks,extra", PLANS,
                         ids=[f"{p[0][5:]}-{p[1]}{'-zero' if '--zero' in p[3] else ''}" for p in PLANS])
def test_sharded_training_matches_single_rank(tmp_path, preset, pins, ranks, extra):
    dp = int(re.search(r"dp=(\d+)", pins).group(1))
    model = Model(str(tmp_path), preset, loss=True, batch=2, rows=2 * dp)
    single = Model(str(tmp_path / "one"), preset, loss=True, batch=2 * dp)
    clip = [a for a in extra if a != "--zero"]
    want, want_losses, _ = train(single, single.compile("train", autodiff=True), 1, 3, SHARDED_ADAMW + clip)
    exe = model.compile("sharded", f"prefill:batch={2 * dp},seq=8,{pins}", ranks, autodiff=True)
    got, losses, stdout = train(model, exe, ranks, 3, SHARDED_ADAMW + extra)
    assert np.abs(losses - want_losses).max() < 1e-5, (losses, want_losses)
    assert set(got) == set(want)
    for name in want:
        assert np.abs(got[name] - want[name]).max() < SHARDED_TOL, name
    if "--zero" in extra:
        assert "(ZeRO-1)" in stdout
    for name in want:
        if "e_score_correction_bias" in name:  # no gradient: as loaded
            assert np.array_equal(got[name], model.weights[name]), name


def test_zero_splits_the_optimizer_state(tmp_path):
    """ZeRO-1 over two replicas: each rank holds half the AdamW state. A
    plan's ZeRO stage reaches the executable: planned for training with
    zero=1 pinned, parax-run splits the states without --zero."""
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, rows=4)
    exe = model.compile("dp2", "prefill:batch=4,seq=8,dp=2", 2, autodiff=True)
    state = {}
    for zero in (["--no-zero"], ["--zero"]):
        _, _, stdout = train(model, exe, 2, 1, ADAMW + zero)
        state[zero[0]] = int(re.search(r"(\d+) bytes of optimizer state", stdout).group(1))
    assert state["--no-zero"] > 0 and abs(state["--zero"] - state["--no-zero"] / 2) <= 64, state
    planned = model.compile("zero1", "train:batch=4,seq=8,dp=2,zero=1", 2, autodiff=True)
    _, _, stdout = train(model, planned, 2, 1, ADAMW)
    assert "(ZeRO-1)" in stdout and int(re.search(r"(\d+) bytes of optimizer", stdout).group(1)) == state["--zero"]
    # The plan's ZeRO-2 and -3 reach parax-run too: on the host optimizer
    # they split the AdamW state as ZeRO-1 does, and the summary says what
    # it keeps whole.
    for stage, said in ((2, "(ZeRO-2; the host optimizer keeps whole gradient sums, as ZeRO-1)"),
                        (3, "(ZeRO-3; the host optimizer keeps whole gradient sums and parameters, as ZeRO-1)")):
        planned = model.compile(f"zero{stage}", f"train:batch=4,seq=8,dp=2,zero={stage}", 2, autodiff=True)
        _, _, stdout = train(model, planned, 2, 1, ADAMW)
        assert said in stdout, stdout
        assert int(re.search(r"(\d+) bytes of optimizer", stdout).group(1)) == state["--zero"]


def test_zero_splits_the_state_over_every_rank_holding_a_box(tmp_path):
    """ZeRO shares each box's AdamW state over the ranks of its stage that
    hold the same box (the planner's dp x ep x cp), not over dp alone:
    Mixtral under EP2 without dp keeps its experts' state (each rank its
    own experts) and half its dense weights' (held by both ranks). Rank 0's
    state is 8 bytes a value of that, each shared box's half rounded up."""
    model = Model(str(tmp_path), "tiny-mixtral", loss=True, batch=2)
    exe = model.compile("ep2", "prefill:batch=2,seq=8,ep=2,dp=1", 2, autodiff=True)
    state = {}
    for zero in (["--no-zero"], ["--zero"]):
        _, _, stdout = train(model, exe, 2, 1, ADAMW + zero)
        state[zero[0]] = int(re.search(r"(\d+) bytes of optimizer state on rank 0", stdout).group(1))
    experts = sum(w.size for n, w in model.weights.items() if ".experts." in n)
    dense = [w.size for n, w in model.weights.items() if ".experts." not in n and "correction_bias" not in n]
    assert experts and dense
    assert state["--no-zero"] == 8 * (sum(dense) + experts // 2), state
    assert state["--zero"] == 8 * (sum((n + 1) // 2 for n in dense) + experts // 2), state


def saved_then_resumed(model, exe, ranks, tmp_path, extra=()):
    """Two AdamW steps saved (--save-weights, --save-optimizer), then two
    more from what was saved (--load-optimizer): (the saved state, the
    resumed weights); `model` then loads the halfway weights."""
    import shutil
    state = str(tmp_path / "state.safetensors")
    train(model, exe, ranks, 2, SHARDED_ADAMW + [*extra, "--save-optimizer", state])
    halfway = str(tmp_path / "halfway.safetensors")
    shutil.copy(os.path.join(model.dir, "trained.safetensors"), halfway)
    model.checkpoint = halfway
    resumed, _, _ = train(model, exe, ranks, 2, SHARDED_ADAMW + [*extra, "--load-optimizer", state])
    return load_safetensors(state), resumed


def test_a_run_resumes_from_saved_weights_and_moments(tmp_path):
    """Four AdamW steps in one run equal two steps saved (--save-weights,
    --save-optimizer: PyTorch's names, exp_avg and exp_avg_sq, and the step
    count) and two more from what was saved (--load-optimizer), on one rank
    and resumed on two (DP2 with ZeRO-1: each replica reads its share)."""
    one = Model(str(tmp_path / "one"), "tiny-llama", loss=True, batch=4)
    exe = one.compile("train", autodiff=True)
    want, _, _ = train(one, exe, 1, 4, SHARDED_ADAMW)
    saved, resumed = saved_then_resumed(one, exe, 1, tmp_path)
    state, halfway = str(tmp_path / "state.safetensors"), one.checkpoint
    assert set(saved) == {f"{n}.{m}" for n in one.weights for m in ("exp_avg", "exp_avg_sq")} | {"optimizer.step"}
    assert saved["optimizer.step"].tolist() == [2.0]
    for name in want:
        assert np.abs(resumed[name] - want[name]).max() < SINGLE_TOL, name
    two = Model(str(tmp_path / "two"), "tiny-llama", loss=True, batch=2, rows=4)
    two.checkpoint = halfway
    dp2 = two.compile("dp2", "prefill:batch=4,seq=8,dp=2", 2, autodiff=True)
    resumed, _, _ = train(two, dp2, 2, 2, SHARDED_ADAMW + ["--zero", "--load-optimizer", state])
    for name in want:
        assert np.abs(resumed[name] - want[name]).max() < SHARDED_TOL, name
    proc = one.run(exe, 1, outputs=0, expect_ok=False,
                   extra=SHARDED_ADAMW + ["--load-optimizer", halfway])
    assert proc.returncode != 0 and "--load-optimizer" in proc.stderr and "no optimizer step count" in proc.stderr


@pytest.mark.parametrize("zero", [[], ["--zero"]], ids=["", "zero"])
def test_moe_run_resumes_under_expert_parallelism(tmp_path, zero):
    """Mixtral under EP2: the saved moments of the experts' stacks are one
    tensor per expert (as the weights are), and four steps equal two saved
    plus two resumed (each rank reading its experts' moments; with ZeRO,
    its half of the dense weights' moments, which both ranks hold)."""
    model = Model(str(tmp_path), "tiny-mixtral", loss=True, batch=2)
    exe = model.compile("ep2", "prefill:batch=2,seq=8,ep=2,dp=1", 2, autodiff=True)
    want, _, _ = train(model, exe, 2, 4, SHARDED_ADAMW + zero)
    saved, resumed = saved_then_resumed(model, exe, 2, tmp_path, zero)
    assert set(saved) == {f"{n}.{m}" for n in model.weights for m in ("exp_avg", "exp_avg_sq")} | {"optimizer.step"}
    for name in want:
        assert np.abs(resumed[name] - want[name]).max() < SINGLE_TOL, name


@pytest.mark.parametrize("preset,pins,ranks", [("tiny-llama", "dp=2,tp=2", 4), ("tiny-mixtral", "ep=2,dp=1", 2)],
                         ids=["llama-dp2-tp2", "mixtral-ep2"])
def test_sharded_checkpoints_are_written_by_every_rank(tmp_path, preset, pins, ranks):
    """--save-weights DIR/ and --save-optimizer DIR/: a sharded checkpoint,
    each rank putting together and writing its share of the whole tensors
    (model-0000k-of-0000n.safetensors, one per rank, and rank 0's
    model.safetensors.index.json): the same tensors as the single file;
    and a run resumed from the two folders (--weights DIR, --load-optimizer
    DIR) equals four steps in one run."""
    from parax.checkpoint import INDEX, load_checkpoint
    dp = int(re.search(r"dp=(\d+)", pins).group(1))
    model = Model(str(tmp_path), preset, loss=True, batch=2, rows=2 * dp)
    exe = model.compile("sharded", f"prefill:batch={2 * dp},seq=8,{pins}", ranks, autodiff=True)
    want, _, _ = train(model, exe, ranks, 4, SHARDED_ADAMW)
    single, state_file = str(tmp_path / "single.safetensors"), str(tmp_path / "state.safetensors")
    weights_dir, state_dir = str(tmp_path / "weights") + "/", str(tmp_path / "state") + "/"
    model.run(exe, ranks, outputs=0, extra=[*SHARDED_ADAMW, "--steps", "2", "--save-weights", single,
                                            "--save-optimizer", state_file])
    model.run(exe, ranks, outputs=0, extra=[*SHARDED_ADAMW, "--steps", "2", "--save-weights", weights_dir,
                                            "--save-optimizer", state_dir])
    shards = sorted(f for f in os.listdir(weights_dir) if f.endswith(".safetensors"))
    assert shards == [f"model-{k:05d}-of-{ranks:05d}.safetensors" for k in range(1, ranks + 1)], shards
    assert os.path.exists(os.path.join(state_dir, INDEX))
    for folder, file in ((weights_dir, single), (state_dir, state_file)):
        got, whole = load_checkpoint(folder), load_safetensors(file)
        assert set(got) == set(whole)
        for name in whole:
            np.testing.assert_array_equal(got[name], whole[name], err_msg=name)
    model.checkpoint = weights_dir
    resumed, _, _ = train(model, exe, ranks, 2, SHARDED_ADAMW + ["--load-optimizer", state_dir])
    for name in want:
        assert np.abs(resumed[name] - want[name]).max() < SINGLE_TOL, name


# (preset, the plan saving: pins, ranks, extra; the plan resuming: pins,
# ranks; the ranks (from 1) whose files hold the weights, the optimizer state)
BOX_PLANS = [
    # the weights: the dp=1 replica writes none; ZeRO's state: every rank
    # its own chunk of each box (a run of its elements)
    ("tiny-llama", ("dp=2,tp=2", 4, ["--zero"]), ("tp=2,pp=2,dp=1", 4), ([1, 2], [1, 2, 3, 4])),
    # fused QKV in pieces; the tied embedding, held by both stages, written once
    ("tiny-gpt2", ("tp=2,pp=2,dp=1", 4, []), (None, 1), ([1, 2, 3, 4], [1, 2, 3, 4])),
    # each rank its experts' boxes, one per expert; the dense weights once
    ("tiny-mixtral", ("ep=2,dp=1", 2, []), ("tp=2,dp=1", 2), ([1, 2], [1, 2])),
    # ZeRO over ep: the dense weights' state in two runs, each rank's
    # experts' whole; the tied embedding's parts across two stages, each
    # stage's state chunked over dp, the first stage's written
    ("tiny-mixtral", ("ep=2,dp=1", 2, ["--zero"]), (None, 1), ([1, 2], [1, 2])),
    ("tiny-gpt2", ("dp=2,pp=2", 4, ["--zero"]), ("tp=2,dp=1", 2), ([1, 3], [1, 2, 3, 4])),
]


@pytest.mark.parametrize("preset,saving,resuming,files", BOX_PLANS,
                         ids=[f"{p[0][5:]}-{p[1][0]}{'-zero' if p[1][2] else ''}" for p in BOX_PLANS])
def test_box_checkpoints_are_written_where_the_boxes_are(tmp_path, preset, saving, resuming, files):
    """--save-format boxes: each rank writes the parameter and AdamW boxes
    it holds (the first rank of replica 0 holding each box; under ZeRO
    each rank its own chunk of the state, a run of a box's elements),
    nothing gathered; rank 0 writes boxes.index.json. Put back together by numpy
    (parax.checkpoint.load_boxes, which checks the boxes tile each tensor)
    they equal the whole tensors the same run saves with --save-format
    whole, every value once; and two steps resumed from them under another
    plan (--weights DIR, --load-optimizer DIR: each rank reading its boxes
    from whichever saved boxes overlap them) equal four steps on one rank."""
    import subprocess
    import sys
    from parax.checkpoint import BOX_INDEX, load_boxes, load_checkpoint
    (pins, ranks, extra), (later_pins, later_ranks) = saving, resuming
    dp = int(re.search(r"dp=(\d+)", pins).group(1))
    one = Model(str(tmp_path / "one"), preset, loss=True, batch=2 * dp)
    want, _, _ = train(one, one.compile("train", autodiff=True), 1, 4, SHARDED_ADAMW)
    model = Model(str(tmp_path / "saving"), preset, loss=True, batch=2, rows=2 * dp)
    exe = model.compile("sharded", f"prefill:batch={2 * dp},seq=8,{pins}", ranks, autodiff=True)
    single, state_file = str(tmp_path / "single.safetensors"), str(tmp_path / "state.safetensors")
    weights_dir, state_dir = str(tmp_path / "weights") + "/", str(tmp_path / "state") + "/"
    settings = [*SHARDED_ADAMW, *extra, "--steps", "2"]
    model.run(exe, ranks, outputs=0, extra=[*settings, "--save-weights", single, "--save-optimizer", state_file])
    model.run(exe, ranks, outputs=0, extra=[*settings, "--save-weights", weights_dir, "--save-optimizer", state_dir,
                                            "--save-format", "boxes"])
    for folder, file, count in ((weights_dir, single, files[0]), (state_dir, state_file, files[1])):
        written = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        assert written == [f"boxes-{k:05d}-of-{ranks:05d}.safetensors" for k in count], written
        got, whole = load_boxes(folder), load_safetensors(file)
        assert set(got) == set(whole)
        for name in whole:
            np.testing.assert_array_equal(got[name], whole[name], err_msg=name)
        boxes = {}  # every value written once: the files hold exactly the model's values
        for f in written:
            boxes.update(load_safetensors(os.path.join(folder, f)))
        assert sum(b.size for b in boxes.values()) == sum(w.size for w in whole.values())
        with open(os.path.join(folder, BOX_INDEX)) as f:
            runs = '"range"' in f.read()
        assert runs == (folder == state_dir and "--zero" in extra), folder
    # the front door's offline conversion: one file, and Hugging Face's sharded form
    for out in (str(tmp_path / "converted.safetensors"), str(tmp_path / "converted") + "/"):
        proc = subprocess.run([sys.executable, "-m", "parax", "checkpoint", weights_dir, "-o", out, "--shards", "2"],
                              capture_output=True, text=True, timeout=120,
                              env=dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python")))
        assert proc.returncode == 0, proc.stderr
        converted, whole = load_checkpoint(out), load_safetensors(single)
        assert set(converted) == set(whole)
        for name in whole:
            np.testing.assert_array_equal(converted[name], whole[name], err_msg=name)
    later = Model(str(tmp_path / "resuming"), preset, loss=True, batch=2 * dp)
    later.checkpoint = weights_dir
    later_exe = later.compile("later", later_pins and f"prefill:batch={2 * dp},seq=8,{later_pins}", later_ranks,
                              autodiff=True)
    resumed, _, _ = train(later, later_exe, later_ranks, 2, SHARDED_ADAMW + ["--load-optimizer", state_dir])
    for name in want:
        assert np.abs(resumed[name] - want[name]).max() < SHARDED_TOL, name


@pytest.mark.parametrize("form", ["file", "boxes"])
def test_a_run_saves_every_k_steps(tmp_path, form):
    """--save-every 2 over 5 AdamW steps on DP2 with ZeRO-1: checkpoints
    of steps 2 and 4 beside the last (W-step-00000002.safetensors for a
    file; W/step-00000002/ for a folder, here box-wise), the run's losses
    and weights those of a run that saves nothing, and one step resumed on
    one rank from step 4's weights and moments equals the run's last."""
    from parax.checkpoint import load_checkpoint
    model = Model(str(tmp_path / "dp2"), "tiny-llama", loss=True, batch=2, rows=4)
    exe = model.compile("dp2", "prefill:batch=4,seq=8,dp=2", 2, autodiff=True)
    plain, plain_losses, _ = train(model, exe, 2, 5, SHARDED_ADAMW + ["--zero"])
    weights, state = str(tmp_path / "w"), str(tmp_path / "s")
    if form == "file":
        weights, state, extra = weights + ".safetensors", state + ".safetensors", []
        at = lambda path, t: path.replace(".safetensors", f"-step-{t:08d}.safetensors")
    else:
        weights, state, extra = weights + "/", state + "/", ["--save-format", "boxes"]
        at = lambda path, t: os.path.join(path, f"step-{t:08d}")
    losses = os.path.join(model.dir, "losses-every.npy")
    model.run(exe, 2, outputs=0, extra=[*SHARDED_ADAMW, "--zero", "--steps", "5", "--save-every", "2", *extra,
                                        "--save-weights", weights, "--save-optimizer", state, "--losses", losses])
    np.testing.assert_array_equal(np.load(losses), plain_losses)
    last = load_checkpoint(weights)
    for name in plain:
        np.testing.assert_array_equal(last[name], plain[name], err_msg=name)
    for t in (2, 4):
        assert os.path.exists(at(weights, t)) and os.path.exists(at(state, t)), t
    assert not os.path.exists(at(weights, 5)) and not os.path.exists(at(weights, 6))
    one = Model(str(tmp_path / "one"), "tiny-llama", loss=True, batch=4)
    one.checkpoint = at(weights, 4)
    resumed, _, _ = train(one, one.compile("train", autodiff=True), 1, 1,
                          SHARDED_ADAMW + ["--load-optimizer", at(state, 4)])
    for name in plain:
        assert np.abs(resumed[name] - plain[name]).max() < SHARDED_TOL, name


def test_bad_optimizer_requests_are_named(tmp_path):
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, rows=4)
    train_exe = model.compile("train", autodiff=True)
    infer = Model(str(tmp_path / "infer"), "tiny-llama")
    infer_exe = infer.compile("forward")

    def fails(m, exe, args, *needles):
        proc = m.run(exe, 1, outputs=0, expect_ok=False, extra=args)
        assert proc.returncode != 0, proc.stdout
        for needle in needles:
            assert needle in proc.stderr, proc.stderr

    fails(infer, infer_exe, ["--optimizer", "adamw"], "no loss")
    fails(model, train_exe, ["--optimizer", "adam"], "--optimizer must be sgd or adamw")
    fails(model, train_exe, ["--optimizer", "adamw", "--lr", "-1"], "--lr must be a positive number")
    fails(model, train_exe, ["--optimizer", "adamw", "--beta2", "1"], "--beta2 must be a number in [0, 1)")
    fails(model, train_exe, ["--optimizer", "sgd", "--zero"], "--zero", "adamw")
    fails(model, train_exe, ["--optimizer", "sgd", "--zero-stage", "2"], "--zero-stage", "adamw")
    fails(model, train_exe, ["--optimizer", "adamw", "--zero-stage", "4"], "--zero-stage must be 0, 1, 2 or 3, got '4'")
    fails(model, train_exe, ["--lr", "0.1"], "belong to --optimizer")
    fails(model, train_exe, ["--optimizer", "sgd", "--step-rows", "3"], "--step-rows 3 does not divide")
    fails(model, train_exe, ["--optimizer", "sgd", "--generate", "2"], "--generate")
    fails(model, train_exe, ["--optimizer", "sgd", "--save-optimizer", "x"], "SGD has none")
    fails(model, train_exe, ["--optimizer", "sgd", "--lr-schedule", "step"], "--lr-schedule must be")
    fails(model, train_exe, ["--optimizer", "sgd", "--lr", "0.1", "--min-lr", "0.2"], "--min-lr is above --lr")
    fails(model, train_exe, ["--optimizer", "sgd", "--save-format", "dcp"], "--save-format must be whole or boxes")
    fails(model, train_exe, ["--optimizer", "sgd", "--save-format", "boxes"], "--save-format boxes: nothing is saved")
    fails(model, train_exe, ["--optimizer", "sgd", "--save-format", "boxes", "--save-weights", "w.safetensors"],
          "--save-format boxes writes a folder", "'w.safetensors' is not one")
    fails(model, train_exe, ["--save-format", "boxes"], "belong to --optimizer")
    fails(model, train_exe, ["--optimizer", "sgd", "--save-every", "0"], "--save-every must be a positive count")
    fails(model, train_exe, ["--optimizer", "sgd", "--save-every", "2"], "--save-every K: nothing is saved")


def test_front_door_compiles_and_trains(tmp_path):
    """`python3 -m parax compile --train` then `run --optimizer`: a planned
    training step (DP2 x TP2 on 4 ranks, full recomputation pinned: the
    plan's choice is applied, --parax-recompute) trained 6 steps with AdamW
    and ZeRO-1; the loss falls, as without recomputation, and the weights
    are saved."""
    import subprocess
    import sys
    from conftest import ORACLE_CLUSTER, ROOT
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, rows=4)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    front = [sys.executable, "-m", "parax"]
    runs = {}
    for recompute in ("none", "full"):
        exe = str(tmp_path / f"front-{recompute}.pxe")
        subprocess.run(front + ["compile", "tiny-llama", "--cluster", f"{ORACLE_CLUSTER}:devices_per_node=4",
                                "--workload", f"train:batch=4,seq=8,dp=2,tp=2,pp=1,recompute={recompute}",
                                "--batch", "2", "--seq", "8", "--dtype", "f32", "--train", "-o", exe],
                       check=True, capture_output=True, timeout=120, env=env)
        losses, saved = str(tmp_path / f"losses-{recompute}.npy"), str(tmp_path / "saved.safetensors")
        plot = str(tmp_path / "losses.svg")
        proc = subprocess.run(front + ["run", exe, "--weights", model.checkpoint, "--ranks", "4", "--steps", "6",
                                       *[a for p in model.inputs for a in ("--input", p)],
                                       "--optimizer", "adamw", "--lr", "0.01", "--zero", "--losses", losses,
                                       "--save-weights", saved, *(["--plot", plot] if recompute == "full" else [])],
                              capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "(ZeRO-1)" in proc.stdout, proc.stdout
        runs[recompute] = (np.load(losses), int(re.search(r"(\d+) instructions on rank 0", proc.stdout).group(1)))
    values = runs["full"][0]
    assert values.shape == (6,) and values[-1] < values[0], values
    # --plot: the loss curve drawn, a point a step at the run's losses
    points = re.findall(r"<title>step (\d+): ([-0-9.e+]+)</title>", open(plot).read())
    assert [int(step) for step, _ in points] == list(range(1, 7)), points
    assert np.allclose([float(loss) for _, loss in points], values, rtol=1e-5), (points, values)
    assert np.abs(values - runs["none"][0]).max() < 1e-6
    assert runs["full"][1] > runs["none"][1], runs  # the recomputed ops
    assert set(load_safetensors(saved)) == set(model.weights)


def numpy_bias_step(model, speed):
    """DeepSeek-V3's auxiliary-loss-free balancing, one step, in numpy: each
    MoE layer's correction bias moves `speed` towards balance, b_e +=
    speed * sign(mean load - load_e), the loads being that layer's expert
    choices over the step's tokens (routed with the loaded weights)."""
    routers = []
    reference.forward(model.cfg, model.weights, model.tokens, routers=routers)
    names = sorted((n for n in model.weights if n.endswith("gate.e_score_correction_bias")),
                   key=lambda n: int(n.split(".")[2]))
    assert len(names) == len(routers)
    moved = {}
    for name, (_, top) in zip(names, routers):
        load = np.bincount(top.reshape(-1), minlength=model.cfg.num_experts).astype(np.float64)
        moved[name] = (model.weights[name] + speed * np.sign(load.mean() - load)).astype(np.float32)
    return moved


@pytest.mark.parametrize("pins,ranks", [(None, 1), ("ep=2,dp=1", 2), ("dp=2,ep=2", 4)],
                         ids=["single", "ep2", "dp2-ep2"])
def test_router_bias_moves_towards_balance(tmp_path, pins, ranks):
    """--bias-update-speed 0.01 (DeepSeek-V3's auxiliary-loss-free
    balancing): after one step each router's correction bias equals numpy's
    rule on the loads of the step's tokens -- summed over the ranks that
    routed them (EP ranks and replicas each their own sequences) -- while
    every other weight takes its SGD step as before."""
    dp = 2 if pins and "dp=2" in pins else 1
    model = Model(str(tmp_path), "tiny-deepseek-v3", loss=True, batch=2, rows=2 * dp)
    exe = model.compile("train", autodiff=True) if pins is None else \
        model.compile("sharded", f"prefill:batch={2 * dp},seq=8,{pins}", ranks, autodiff=True)
    sgd = ["--optimizer", "sgd", "--lr", "0.1"]
    trained, _, _ = train(model, exe, ranks, 1, sgd, extra=["--bias-update-speed", "0.01"])
    without, _, _ = train(model, exe, ranks, 1, sgd)
    want = numpy_bias_step(model, 0.01)
    for name, bias in want.items():
        assert np.abs(trained[name] - bias).max() < 1e-7, (name, trained[name], bias)
        assert np.array_equal(without[name], model.weights[name]), name  # off: as loaded
    assert any(not np.array_equal(b, model.weights[n]) for n, b in want.items())
    for name in trained:
        if name not in want:
            assert np.array_equal(trained[name], without[name]), name


def test_bias_update_speed_needs_a_router_bias(tmp_path):
    model = Model(str(tmp_path), "tiny-mixtral", loss=True, batch=2, rows=2)
    proc = model.run(model.compile("train", autodiff=True), 1, outputs=0, expect_ok=False,
                     extra=["--optimizer", "sgd", "--bias-update-speed", "0.001"])
    assert proc.returncode != 0
    assert "--bias-update-speed: no router of this executable has a correction bias" in proc.stderr, proc.stderr
    proc = model.run(model.compile("train", autodiff=True), 1, outputs=0, expect_ok=False,
                     extra=["--bias-update-speed", "0.001"])
    assert proc.returncode != 0 and "--bias-update-speed and --log-json belong to --optimizer" in proc.stderr, \
        proc.stderr


@pytest.mark.parametrize("preset,overrides,pins,ranks", [
    ("tiny-mixtral", None, None, 1), ("tiny-mixtral", None, "ep=2,dp=1", 2),
    ("tiny-deepseek-v3", {"sequence_aux": True}, None, 1),
    ("tiny-deepseek-v3", {"sequence_aux": True}, "dp=2,ep=2", 4)],
    ids=["mixtral", "mixtral-ep2", "deepseek-v3-seq-aux", "deepseek-v3-seq-aux-dp2-ep2"])
def test_load_balancing_loss_is_logged_apart(tmp_path, preset, overrides, pins, ranks):
    """The MoE load-balancing loss is in the loss trained (and returned
    first) and is also returned apart, after the gradients, so parax-run
    logs it beside the loss (Megatron-LM logs the two apart):
    --balance-losses B.npy holds each step's, printed with the step's loss
    and in the summary; --output-dir writes it as balance_loss.npy. Step
    1's equals numpy's balance loss at the loaded weights and the loss
    minus it numpy's cross-entropy (one rank over every row: the
    sequence-wise loss is each sequence's, so DP2 x EP2 gives the same)."""
    dp = 2 if pins and "dp=2" in pins else 1
    model = Model(str(tmp_path), preset, loss=True, batch=2, rows=2 * dp, aux_loss=0.5, overrides=overrides)
    exe = model.compile("train", autodiff=True) if pins is None else \
        model.compile("sharded", f"prefill:batch={2 * dp},seq=8,{pins}", ranks, autodiff=True)
    balance_path = os.path.join(model.dir, "balance.npy")
    _, losses, stdout = train(model, exe, ranks, 2, ["--optimizer", "sgd", "--lr", "0.1"],
                              extra=["--balance-losses", balance_path])
    balances = np.load(balance_path)
    assert balances.shape == (2,) and balances[0] != balances[1]
    routers = []
    logits = reference.forward(model.cfg, model.weights, model.tokens, routers=routers).astype(np.float64)
    expected = reference.load_balancing_loss(model.cfg, routers, len(model.tokens))
    assert expected > 0.1  # (weight 0.5: a term that matters)
    assert abs(balances[0] - expected) < 1e-5, (balances[0], expected)
    ce = reference.cross_entropy(logits, model.labels)
    assert abs(losses[0] - balances[0] - ce) < 1e-4, (losses[0], balances[0], ce)
    assert f"step 1: loss {losses[0]:.6f} (load balancing {balances[0]:.6f})" in stdout, stdout
    assert f"(load balancing {balances[0]:.6f} -> {balances[1]:.6f}) over 2 step(s)" in stdout, stdout
    if ranks == 1:
        results = model.run_to_dir(exe, 1)
        assert abs(float(results["balance_loss"]) - expected) < 1e-5
        assert abs(float(results["result0"]) - expected - ce) < 1e-4


def test_balance_losses_need_a_load_balancing_loss(tmp_path):
    model = Model(str(tmp_path), "tiny-mixtral", loss=True, batch=2, rows=2)
    proc = model.run(model.compile("train", autodiff=True), 1, outputs=0, expect_ok=False,
                     extra=["--optimizer", "sgd", "--balance-losses", os.path.join(str(tmp_path), "b.npy")])
    assert proc.returncode != 0
    assert "--balance-losses: the executable returns no load-balancing loss" in proc.stderr, proc.stderr


def test_front_door_trains_with_ignored_labels(tmp_path):
    """`compile --train --ignore-index -100`: the step's loss is the mean
    over the labels that are not -100 (a fine-tuning batch's prompts and
    padding), numpy's, on TP2 from the planned front door."""
    import subprocess
    import sys
    from conftest import ORACLE_CLUSTER, ROOT
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, ignore_index=-100)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    front = [sys.executable, "-m", "parax"]
    exe = str(tmp_path / "front.pxe")
    subprocess.run(front + ["compile", "tiny-llama", "--cluster", f"{ORACLE_CLUSTER}:devices_per_node=2",
                            "--workload", "train:batch=2,seq=8,tp=2,dp=1,pp=1", "--batch", "2", "--seq", "8",
                            "--dtype", "f32", "--train", "--ignore-index", "-100", "-o", exe],
                   check=True, capture_output=True, timeout=120, env=env)
    losses = str(tmp_path / "losses.npy")
    proc = subprocess.run(front + ["run", exe, "--weights", model.checkpoint, "--ranks", "2", "--steps", "1",
                                   *[a for p in model.inputs for a in ("--input", p)],
                                   "--optimizer", "sgd", "--losses", losses],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert abs(float(np.load(losses)[0]) - model.reference_loss()) < 1e-5


def test_front_door_trains_multi_token_prediction(tmp_path):
    """`python3 -m parax compile --train --mtp-weight 0.3` (DeepSeek-V3's
    one depth, planned EP2 x PP2 with 2 microbatches) then `run
    --optimizer adamw`: step 1's loss is numpy's (the cross-entropy plus
    0.3 times the depth's), the loss falls over 6 steps, and the module's
    weights are saved with the others."""
    import subprocess
    import sys
    from conftest import ORACLE_CLUSTER, ROOT
    model = Model(str(tmp_path), "tiny-deepseek-v3", loss=True, batch=2, rows=4, mtp_weight=0.3)
    whole = Model(str(tmp_path / "whole"), "tiny-deepseek-v3", loss=True, batch=4, mtp_weight=0.3)
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    front = [sys.executable, "-m", "parax"]
    exe = str(tmp_path / "front.pxe")
    subprocess.run(front + ["compile", "tiny-deepseek-v3", "--cluster", f"{ORACLE_CLUSTER}:devices_per_node=4",
                            "--workload", "train:batch=4,seq=8,mbs=1,ep=2,pp=2,dp=1,tp=1", "--batch", "2",
                            "--seq", "8", "--dtype", "f32", "--train", "--mtp-weight", "0.3", "-o", exe],
                   check=True, capture_output=True, timeout=120, env=env)
    losses, saved = str(tmp_path / "losses.npy"), str(tmp_path / "saved.safetensors")
    proc = subprocess.run(front + ["run", exe, "--weights", model.checkpoint, "--ranks", "4", "--steps", "6",
                                   *[a for p in model.inputs for a in ("--input", p)],
                                   "--optimizer", "adamw", "--lr", "0.01", "--losses", losses,
                                   "--save-weights", saved],
                          capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    values = np.load(losses)
    assert abs(values[0] - whole.reference_loss()) < 1e-5, (values[0], whole.reference_loss())
    assert values[-1] < values[0], values
    assert set(load_safetensors(saved)) == set(model.weights)
    assert "model.layers.2.eh_proj.weight" in model.weights


@pytest.mark.parametrize("pins,ranks", [(None, 1), ("ep=2,pp=2,dp=1", 4)], ids=["one", "ep2-pp2"])
def test_multi_token_prediction_loss_is_logged_apart(tmp_path, pins, ranks):
    """Multi-token prediction's weighted loss (0.3 x the depth's) is in the
    loss trained and also returned apart: --mtp-losses M.npy holds each
    step's, printed with the step's loss beside the load-balancing loss
    (DeepSeek-V3's sequence-wise one, 0.5) and in the summary;
    --output-dir writes it as mtp_loss.npy. Step 1's is 0.3 x numpy's
    depth loss, and the loss minus both terms numpy's cross-entropy."""
    model = Model(str(tmp_path), "tiny-deepseek-v3", loss=True, batch=2, rows=2, mtp_weight=0.3, aux_loss=0.5,
                  overrides={"sequence_aux": True})
    exe = model.compile("train", autodiff=True) if pins is None else \
        model.compile("sharded", f"prefill:batch=2,seq=8,{pins}", ranks, autodiff=True)
    paths = [os.path.join(model.dir, f"{name}.npy") for name in ("mtp", "balance")]
    _, losses, stdout = train(model, exe, ranks, 2, ["--optimizer", "sgd", "--lr", "0.1"],
                              extra=["--mtp-losses", paths[0], "--balance-losses", paths[1]])
    mtp, balances = np.load(paths[0]), np.load(paths[1])
    assert mtp.shape == (2,) and mtp[0] != mtp[1]
    routers, trunk = [], []
    logits = reference.forward(model.cfg, model.weights, model.tokens, routers=routers, trunk=trunk)
    depth, = reference.multi_token_prediction(model.cfg, model.weights, model.tokens, model.labels, trunk[0], 1,
                                              routers=routers)
    assert abs(mtp[0] - 0.3 * depth) < 1e-5, (mtp[0], 0.3 * depth)
    assert abs(balances[0] - reference.load_balancing_loss(model.cfg, routers, len(model.tokens))) < 1e-5
    ce = reference.cross_entropy(logits, model.labels)
    assert abs(losses[0] - mtp[0] - balances[0] - ce) < 1e-4
    assert (f"step 1: loss {losses[0]:.6f} (load balancing {balances[0]:.6f}) "
            f"(multi-token prediction {mtp[0]:.6f})") in stdout, stdout
    assert f"(multi-token prediction {mtp[0]:.6f} -> {mtp[1]:.6f}) over 2 step(s)" in stdout, stdout
    if ranks == 1:
        results = model.run_to_dir(exe, 1)
        assert abs(float(results["mtp_loss"]) - 0.3 * depth) < 1e-5
    plain = Model(str(tmp_path / "plain"), "tiny-deepseek-v3", loss=True, batch=2)
    proc = plain.run(plain.compile("train", autodiff=True), 1, outputs=0, expect_ok=False,
                     extra=["--optimizer", "sgd", "--mtp-losses", paths[0]])
    assert proc.returncode != 0
    assert "--mtp-losses: the executable returns no multi-token prediction loss (built without --mtp-weight)" \
        in proc.stderr, proc.stderr


def test_nonfinite_gradients_stop_the_run_or_skip_the_step(tmp_path):
    """Issue 45 R11: NaN weights trained to the end with rc 0 and saved
    NaN weights. A step whose gradients are not finite now stops the run
    before its update, naming the step (no weights saved); with
    --skip-nonfinite the step is skipped, counted, and the weights saved
    are the ones loaded."""
    model = Model(str(tmp_path), "tiny-llama", loss=True)
    exe = model.compile("train", autodiff=True)
    weights = dict(model.weights)
    weights["model.layers.0.mlp.up_proj.weight"] = weights["model.layers.0.mlp.up_proj.weight"].copy()
    weights["model.layers.0.mlp.up_proj.weight"][3, 5] = np.nan
    save_safetensors(model.checkpoint, weights)
    saved = os.path.join(model.dir, "trained.safetensors")
    proc = model.run(exe, 1, outputs=0, expect_ok=False,
                     extra=[*ADAMW, "--steps", "2", "--save-weights", saved])
    assert proc.returncode != 0
    assert "optimizer step 1: the gradients are not finite (their global norm is nan)" in proc.stderr, proc.stderr
    assert not os.path.exists(saved)
    proc = model.run(exe, 1, outputs=0, expect_ok=False,
                     extra=[*ADAMW, "--steps", "2", "--save-weights", saved, "--skip-nonfinite"])
    assert proc.returncode == 0, proc.stderr
    assert "2 step(s) skipped: their gradients were not finite" in proc.stdout
    kept = load_safetensors(saved)
    for name, w in weights.items():
        np.testing.assert_array_equal(kept[name], w)


def test_loaded_moments_adamw_could_not_have_made_are_refused(tmp_path):
    """Issue 45 R11: optimizer state with a negative second moment (or a
    NaN) made every update NaN, the run ending with rc 0. Refused at load,
    naming the tensor."""
    model = Model(str(tmp_path), "tiny-llama", loss=True)
    exe = model.compile("train", autodiff=True)
    state = str(tmp_path / "state.safetensors")
    train(model, exe, 1, 1, [*ADAMW, "--save-optimizer", state])
    moments = load_safetensors(state)
    name = "model.layers.1.mlp.down_proj.weight.exp_avg_sq"
    moments[name] = moments[name].copy()
    moments[name].reshape(-1)[7] = -1.0
    save_safetensors(state, moments)
    proc = model.run(exe, 1, outputs=0, expect_ok=False, extra=[*ADAMW, "--steps", "1", "--load-optimizer", state])
    assert proc.returncode != 0
    assert f"'{name}' holds -1.000000 at element 7 of this rank's box: a negative second moment" in proc.stderr


def test_shards_of_two_saves_are_refused_together(tmp_path):
    """Issue 45 R4: a sharded checkpoint saved over by a run that died part
    way (one shard new, the index and the other shard the last save's)
    loaded with rc 0 and logits of neither. Each save names itself in every
    file and its index (written last, once every rank's shard is): files of
    two saves together are refused, by parax-run and by Python, naming the
    shard."""
    import shutil
    from parax.checkpoint import load_checkpoint
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, rows=4)
    exe = model.compile("sharded", "prefill:batch=4,seq=8,dp=2,tp=1", 2, autodiff=True)
    first, second = str(tmp_path / "first") + "/", str(tmp_path / "second") + "/"
    for folder, steps in ((first, "1"), (second, "2")):
        model.run(exe, 2, outputs=0, extra=[*SHARDED_ADAMW, "--steps", steps, "--save-weights", folder])
    load_checkpoint(first)  # whole: it loads
    shard = "model-00002-of-00002.safetensors"
    shutil.copy(os.path.join(second, shard), os.path.join(first, shard))
    with pytest.raises(ValueError, match=f"{shard}: written by another save"):
        load_checkpoint(first)
    model.checkpoint = first
    proc = model.run(exe, 2, outputs=0, expect_ok=False, extra=[*SHARDED_ADAMW, "--steps", "1"])
    assert proc.returncode != 0
    assert f"{shard}: written by another save (" in proc.stderr and "files of two saves mixed" in proc.stderr


def test_a_shard_damaged_after_its_save_is_refused_by_name(tmp_path):
    """Issue 45: an index records each of its files' size and CRC-32
    (metadata.parax_files), parax-run's and Python's alike, and both loaders
    check them: a shard damaged in place after a complete save (one byte of
    a weight flipped, the size unchanged) or truncated is refused, naming
    the file, where before the loader read the damaged weight with rc 0."""
    import shutil
    from parax.checkpoint import load_checkpoint, save_sharded, save_boxes
    model = Model(str(tmp_path), "tiny-llama", loss=True, batch=2, rows=4)
    exe = model.compile("sharded", "prefill:batch=4,seq=8,dp=2,tp=1", 2, autodiff=True)
    saved = str(tmp_path / "saved") + "/"
    model.run(exe, 2, outputs=0, extra=[*SHARDED_ADAMW, "--steps", "1", "--save-weights", saved])
    with open(os.path.join(saved, "model.safetensors.index.json")) as f:
        files = json.load(f)["metadata"]["parax_files"]
    shard = "model-00002-of-00002.safetensors"
    assert set(files) == {"model-00001-of-00002.safetensors", shard}
    assert files[shard]["bytes"] == os.path.getsize(os.path.join(saved, shard))
    whole = load_checkpoint(saved)  # as saved: it loads

    def damaged(folder, file, how):
        copy = str(tmp_path / f"{how}-{os.path.basename(folder.rstrip('/'))}") + "/"
        shutil.copytree(folder, copy)
        path = os.path.join(copy, file)
        if how == "flipped":  # the last byte: a weight's, not the header's
            with open(path, "r+b") as f:
                f.seek(-1, os.SEEK_END)
                byte = f.read(1)
                f.seek(-1, os.SEEK_END)
                f.write(bytes([byte[0] ^ 0x40]))
        else:
            os.truncate(path, os.path.getsize(path) - 4)
        return copy, path

    for how, text in (("flipped", "(damaged since it was saved); refused"),
                      ("truncated", "(truncated or replaced since it was saved); refused")):
        copy, path = damaged(saved, shard, how)
        with pytest.raises(ValueError, match=re.escape(text)):
            load_checkpoint(copy)
        model.checkpoint = copy
        proc = model.run(exe, 2, outputs=0, expect_ok=False, extra=[*SHARDED_ADAMW, "--steps", "1"])
        assert proc.returncode != 0
        assert f"{path}: " in proc.stderr and text in proc.stderr, proc.stderr[-2000:]

    # Python's writers record them too (sharded and box-wise), and a file
    # the records do not name is refused.
    for kind in ("sharded", "boxes"):
        folder = str(tmp_path / f"python-{kind}") + "/"
        if kind == "sharded":
            save_sharded(folder, whole, 2)
            file, index = shard, "model.safetensors.index.json"
        else:
            name = sorted(whole)[0]
            save_boxes(folder, {name: (whole[name], [((0,) * whole[name].ndim, whole[name].shape, 1)])}, 2)
            file, index = "boxes-00002-of-00002.safetensors", "boxes.index.json"
        load_checkpoint(folder)
        copy, _ = damaged(folder, file, "flipped")
        with pytest.raises(ValueError, match=re.escape("(damaged since it was saved)")):
            load_checkpoint(copy)
        with open(os.path.join(folder, index)) as f:
            edited = json.load(f)
        del edited["metadata"]["parax_files"][file]
        with open(os.path.join(folder, index), "w") as f:
            json.dump(edited, f)
        with pytest.raises(ValueError, match="records no size and checksum for its file"):
            load_checkpoint(folder)


def test_training_steps_report_progress_unless_quiet(tmp_path):
    """Issue 48: each training step prints its loss and also its time,
    tokens/s and the time left; --quiet leaves the summary alone."""
    model = Model(str(tmp_path), "tiny-llama", loss=True)
    exe = model.compile("train", autodiff=True)
    loud = model.run(exe, 1, outputs=0, expect_ok=False, extra=[*ADAMW, "--steps", "3"])
    assert loud.returncode == 0, loud.stderr
    steps = re.findall(r"step (\d): loss [0-9.]+, .*; ([0-9.]+) ms, (\d+) tokens/s, (\d+):(\d\d):(\d\d) left",
                       loud.stdout)
    assert [int(s[0]) for s in steps] == [1, 2, 3], loud.stdout
    assert all(float(s[1]) > 0 and int(s[2]) > 0 for s in steps)
    quiet = model.run(exe, 1, outputs=0, expect_ok=False, extra=[*ADAMW, "--steps", "3", "--quiet"])
    assert quiet.returncode == 0, quiet.stderr
    assert "step 1:" not in quiet.stdout and "adamw: loss" in quiet.stdout, quiet.stdout


def test_on_a_terminal_the_steps_redraw_one_progress_line(tmp_path):
    """Issue 48: attached to a terminal (a pseudo-terminal of 80 columns
    here), one rank started by hand redraws one line in place -- a bar, the
    step of the steps, the loss, tokens/s, the time left -- and the summary
    starts on a line of its own; piped, or under mpirun (whose ranks get a
    pseudo-terminal whatever mpirun's output is), every step is a line of
    its own (the test above)."""
    import fcntl
    import pty
    import struct
    import termios
    model = Model(str(tmp_path), "tiny-llama", loss=True)
    exe = model.compile("train", autodiff=True)
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    proc = subprocess.Popen([tool("parax-run"), exe, "--weights", model.checkpoint,
                             *[arg for path in model.inputs for arg in ("--input", path)], *ADAMW, "--steps", "3"],
                            stdout=terminal, stderr=subprocess.PIPE, env=MPI_ENV)
    os.close(terminal)
    out = b""
    while True:
        try:
            chunk = os.read(controller, 4096)
        except OSError:  # (the terminal closed: the run ended)
            break
        if not chunk:
            break
        out += chunk
    os.close(controller)
    assert proc.wait(timeout=120) == 0, proc.stderr.read()
    text = out.decode()
    frames = re.findall(r"\r\[([#.]{20})\] step (\d)/3 loss [0-9.]+ \d+ tok/s \d+:\d\d:\d\d left\x1b\[K", text)
    assert [f[1] for f in frames] == ["1", "2", "3"], repr(text)
    assert frames[-1][0] == "#" * 20 and frames[0][0].count("#") == 7, frames
    assert "parax-run: step" not in text and re.search(r"left\x1b\[K\r?\nparax-run: 1 rank\(s\)", text), repr(text)


def test_log_json_writes_a_line_a_training_step(tmp_path):
    """Issue 48: --log-json L.jsonl, quiet or not, writes one JSON object a
    training step: the same loss, learning rate and clipping the losses
    file and the printed lines say. Without --optimizer it is refused."""
    model = Model(str(tmp_path), "tiny-llama", loss=True)
    exe = model.compile("train", autodiff=True)
    log, losses = str(tmp_path / "log.jsonl"), str(tmp_path / "losses.npy")
    proc = model.run(exe, 1, outputs=0, expect_ok=False,
                     extra=[*ADAMW, "--steps", "3", "--quiet", "--clip-grad-norm", "1e-3", "--log-json", log,
                            "--losses", losses])
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in open(log)]
    assert [line["step"] for line in lines] == [1, 2, 3]
    np.testing.assert_allclose([line["loss"] for line in lines], np.load(losses), rtol=1e-6)
    assert all(line["clipped"] and line["grad_norm"] > 1e-3 and line["seconds"] > 0 and line["tokens_per_s"] > 0
               and line["eta_s"] >= 0 for line in lines), lines
    refused = model.run(exe, 1, outputs=0, expect_ok=False, extra=["--log-json", log])
    assert refused.returncode != 0 and "--log-json belong to --optimizer" in refused.stderr, refused.stderr
