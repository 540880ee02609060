"""The runtime as a library (issue 46): examples/embed/session.cpp runs,
trains and generates through Session (parax/runtime/Session.h), without
parax-run. What it computes is what parax-run computes for the same
executable, weights and inputs, on one rank and on several under a real
mpirun, and numpy's; bad use is refused by name."""
import os
import re
import subprocess

import numpy as np
import pytest

from conftest import MPI_ENV, Model, tool

ADAMW_LR = "1e-2"


def session(args, ranks=1, expect_ok=True):
    proc = subprocess.run(["mpirun", "-np", str(ranks), "--oversubscribe", "--bind-to", "none",
                           tool("parax-embed-session"), *args],
                          capture_output=True, text=True, timeout=180, env=MPI_ENV)
    if expect_ok:
        assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


# (workload pins, ranks): one rank, and each kind of split the session's
# plain microbatch loop runs (a pipeline's stages one microbatch at a time).
PLANS = [(None, 1), ("tp=2,dp=1", 2), ("pp=2,dp=1", 2), ("dp=2", 2)]


@pytest.mark.parametrize("pins,ranks", PLANS, ids=[p[0] or "single" for p in PLANS])
def test_session_runs_what_parax_run_runs(tmp_path, pins, ranks):
    """Logits of a forward program: the session's equal parax-run's (the
    same kernels in the same order) and numpy's. Under dp=2 each replica's
    writer holds its rows; replica 0's are compared."""
    model = Model(str(tmp_path), "tiny-llama", batch=2, rows=4 if pins == "dp=2" else 2)
    exe = model.compile("fwd", f"prefill:batch=4,seq=8,{pins}" if pins else None, ranks)
    want = model.run(exe, ranks)
    out = str(tmp_path / "session.npy")
    session(["run", exe, model.checkpoint, out, *model.inputs], ranks)
    got = np.load(out)
    np.testing.assert_array_equal(got, want[:got.shape[0]])
    np.testing.assert_allclose(got, model.reference()[:got.shape[0]], atol=1e-4, rtol=1e-4)


def losses_of(text):
    return [float(v) for v in re.findall(r"step \d+: loss ([-0-9.e+]+),", text)]


@pytest.mark.parametrize("pins,ranks", PLANS, ids=[p[0] or "single" for p in PLANS])
def test_session_trains_as_parax_run_trains(tmp_path, pins, ranks):
    """Three AdamW steps: the session's losses are parax-run's (the same
    Trainer, the same order of averaging, clipping and updates), the first
    numpy's loss; the loss falls."""
    model = Model(str(tmp_path), "tiny-llama", loss=True, rows=4 if pins == "dp=2" else 2)
    exe = model.compile("train", f"train:batch=4,seq=8,{pins},zero=0" if pins else None, ranks, autodiff=True)
    losses = str(tmp_path / "losses.npy")
    model.run(exe, ranks, outputs=0,
              extra=["--optimizer", "adamw", "--lr", ADAMW_LR, "--steps", "3", "--quiet", "--losses", losses])
    want = np.load(losses)
    proc = session(["train", exe, model.checkpoint, "3", ADAMW_LR, *model.inputs], ranks)
    got = losses_of(proc.stdout)
    assert len(got) == 3, proc.stdout
    np.testing.assert_allclose(got, want, rtol=1e-5)
    np.testing.assert_allclose(got[0], model.reference_loss(), rtol=1e-4)
    assert got[2] < got[0]


GENERATION = [(None, 1), ("tp=2,dp=1", 2), ("pp=2,dp=1", 2)]


@pytest.mark.parametrize("pins,ranks", GENERATION, ids=[p[0] or "single" for p in GENERATION])
def test_session_generates_what_parax_run_generates(tmp_path, pins, ranks):
    """Greedy generation of 6 tokens after prompts of 3 (one row's 2, padded
    with -1): the session's tokens are parax-run --generate's."""
    model = Model(str(tmp_path), "tiny-llama", seq=1, cache=12)
    exe = model.compile("step", f"decode:batch=2,context=12,{pins}" if pins else None, ranks)
    prompt = np.random.default_rng(3).integers(0, model.cfg.vocab, size=(2, 3)).astype(np.int32)
    prompt[1, 2] = -1
    want, _ = model.generate(exe, ranks, prompt, 6)
    prompt_path, out = str(tmp_path / "prompt.npy"), str(tmp_path / "session.npy")
    np.save(prompt_path, prompt)
    session(["generate", exe, model.checkpoint, "6", prompt_path, out], ranks)
    np.testing.assert_array_equal(np.load(out), want)


def test_session_refuses_bad_use_by_name(tmp_path):
    """A grid of 2 ranks opened on 1, weights of another model, rows that
    are no multiple of the batch, a forward program asked to train."""
    model = Model(str(tmp_path), "tiny-llama")
    tp2 = model.compile("tp2", "prefill:batch=2,seq=8,tp=2,dp=1", 2)
    out = str(tmp_path / "o.npy")
    proc = session(["run", tp2, model.checkpoint, out, *model.inputs], 1, expect_ok=False)
    assert proc.returncode != 0
    assert "the executable's grid has 2 ranks but MPI started 1" in proc.stderr, proc.stderr
    single = model.compile("single")
    other = Model(str(tmp_path / "other"), "tiny-gpt2")
    proc = session(["run", single, other.checkpoint, out, *model.inputs], 1, expect_ok=False)
    assert proc.returncode != 0 and "the program reads no tensor named" in proc.stderr, proc.stderr
    three = str(tmp_path / "three.npy")
    np.save(three, np.zeros((3, 8), np.int32))
    proc = session(["run", single, model.checkpoint, out, three], 1, expect_ok=False)
    assert proc.returncode != 0
    assert "input #0 has 3 rows, not a multiple of the executable's batch 2" in proc.stderr, proc.stderr
    proc = session(["train", single, model.checkpoint, "1", ADAMW_LR, *model.inputs], 1, expect_ok=False)
    assert proc.returncode != 0 and "returns no gradients (build it with --parax-autodiff)" in proc.stderr, \
        proc.stderr
    assert not os.path.exists(out)
