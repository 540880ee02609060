"""Hostile executables: parax-pxe-fuzz mutates a valid .pxe at random
(fields of every message set to edge values, repeated fields cut, grown or
reordered, attributes changed, bytes of the file flipped or cut) and loads,
validates, prepares and runs each mutant on all its ranks (threads with
in-process communicators, a rank that fails cancelling the others' waits);
then it damages the weights and the inputs and runs the valid executable on
them. Every mutant must end
in a named error or a run -- never a crash, an uncaught exception or a hang.
(ctest cuda-simt-asan runs the same over the emulator's cases under
AddressSanitizer, which also catches reads past a buffer that happen not to
crash.) Before the runtime checked each op's shapes (OpShapes.cpp), the
200th mutant of GPT-2 -- a linear's bias one dimension short -- corrupted
the heap."""

import re
import subprocess

import pytest

from conftest import Model, tool, uneven_boxes

# (preset, builder options, workload pins, ranks): several ranks run as
# threads of the fuzzer with in-process communicators.
SEEDS = [("tiny-llama", {}, None, 1), ("tiny-gpt2", {}, None, 1), ("tiny-mixtral", {}, None, 1),
         ("tiny-qwen2-moe", {}, None, 1), ("tiny-deepseek-v3", {}, None, 1),
         ("tiny-llama", {"seq": 1, "past": 5, "cache": 12}, None, 1),
         ("tiny-llama", {}, "tp=2,pp=2,dp=1", 4), ("tiny-mixtral", {}, "ep=2,tp=1,dp=1", 2),
         ("tiny-deepseek-v3", {}, "tp=2,dp=1", 2),
         # each replica its own rows (the fuzzer slices them as parax-run
         # does); each rank a piece of every sequence
         ("tiny-llama", {"rows": 4}, "dp=2,tp=2", 4), ("tiny-gpt2", {}, "cp=2,tp=1,dp=1", 2),
         # training steps (--parax-autodiff): the gradient ops, gradients sent
         # back a stage
         ("tiny-llama", {"loss": True, "autodiff": True}, None, 1),
         ("tiny-gpt2", {"loss": True, "autodiff": True}, "tp=2,pp=2,dp=1", 4),
         # the experts' and the router's gradients, EP's exchanges back
         ("tiny-mixtral", {"loss": True, "autodiff": True}, "ep=2,tp=1,dp=1", 2)]


@pytest.mark.parametrize("preset,build,pins,ranks", SEEDS,
                         ids=[f"{p}{'-cache-step' if 'cache' in b else ''}{'-train' if 'autodiff' in b else ''}"
                              f"{'-' + w if w else ''}" for p, b, w, _ in SEEDS])
def test_mutants_end_in_a_named_error_or_a_run(tmp_path, preset, build, pins, ranks):
    build = dict(build)
    autodiff = build.pop("autodiff", False)
    model = Model(str(tmp_path), preset, **build)
    exe = model.compile("seed", f"prefill:batch=2,seq=8,{pins}" if pins else None, ranks, autodiff=autodiff)
    for seed in (1, 2):
        proc = subprocess.run([tool("parax-pxe-fuzz"), exe, model.checkpoint, *model.inputs,
                               "--mutants", "4000", "--seed", str(seed)],
                              capture_output=True, text=True, timeout=300)
        last = proc.stderr.strip().splitlines()[-1:] if proc.stderr else []
        assert proc.returncode == 0, f"crashed after {last}\n{proc.stdout}"
        counts = re.search(r"4000 mutants: (\d+) unreadable, (\d+) refused by the validator, (\d+) at prepare, "
                           r"(\d+) failed running, (\d+) stalled \(ended by the watchdog\), (\d+) ran", proc.stdout)
        assert counts, proc.stdout
        unreadable, refused, prepare, failed, stalled, ran = map(int, counts.groups())
        assert unreadable + refused + prepare + failed + stalled + ran == 4000
        # The mutants reach every stage: some damage the file, most are
        # refused by the validator, some are harmless and run.
        assert unreadable > 0 and refused > 0 and ran > 0, proc.stdout
        # Then the weights and inputs damaged (a .npy dimension that threw
        # std::invalid_argument out of the reader before).
        files = re.search(r"1000 damaged weights or inputs: (\d+) refused, (\d+) ran; (\d+) of them typed "
                          r"\(a dtype or an integer's width changed\): (\d+) ran", proc.stdout)
        assert files and int(files.group(1)) > 0, proc.stdout
        # A float weight stored as integers (or ints as floats), tokens
        # widened to int64 past 32 bits (issue 45 R1, R7): each refused,
        # never read as what it is not.
        assert int(files.group(3)) > 0 and int(files.group(4)) == 0, proc.stdout


def test_a_seed_that_does_not_run_fails_the_fuzzer(tmp_path):
    """Issue 45 R12: given inputs the unmutated executable refuses (here
    none: the tokens are missing), every mutant was refused at prepare and
    the fuzzer exited 0 having tested nothing. Now it fails, saying so."""
    model = Model(str(tmp_path), "tiny-llama")
    exe = model.compile("seed")
    proc = subprocess.run([tool("parax-pxe-fuzz"), exe, model.checkpoint, "--mutants", "50"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "does not run with these weights and inputs (refused at prepare: the executable wants input #0" \
        in proc.stderr
    assert "testing nothing" in proc.stderr


@pytest.mark.parametrize("pins,ranks", [(None, 1), ("tp=2,dp=1", 2)], ids=["single", "tp2"])
def test_damaged_box_checkpoints_end_in_a_named_error_or_a_run(tmp_path, pins, ranks):
    """Weights from a box-wise checkpoint (numpy's uneven boxes and runs):
    the fuzzer damages one of its files at a time in a copy of the folder,
    the index half the time (bytes changed -- digits, brackets, quotes --
    or the file cut), and runs the valid executable from it. Every one
    ends in a named error or a run, never a crash or a hang."""
    from parax.checkpoint import save_boxes
    model = Model(str(tmp_path), "tiny-llama")
    exe = model.compile("seed", f"prefill:batch=2,seq=8,{pins}" if pins else None, ranks)
    folder = str(tmp_path / "boxes")
    save_boxes(folder, uneven_boxes(model.weights), 3)
    proc = subprocess.run([tool("parax-pxe-fuzz"), exe, folder, *model.inputs, "--mutants", "2000", "--seed", "3"],
                          capture_output=True, text=True, timeout=300)
    last = proc.stderr.strip().splitlines()[-1:] if proc.stderr else []
    assert proc.returncode == 0, f"crashed after {last}\n{proc.stdout}"
    files = re.search(r"500 damaged weights or inputs: (\d+) refused, (\d+) ran;", proc.stdout)
    assert files and int(files.group(1)) > 0 and int(files.group(2)) > 0, proc.stdout
    assert "boxes.index.json" in proc.stderr and "boxes-00002-of-00003.safetensors" in proc.stderr


def test_a_malformed_npy_shape_is_a_named_error(tmp_path):
    model = Model(str(tmp_path), "tiny-llama")
    exe = model.compile("single")
    with open(model.tokens_path, "rb") as f:
        data = bytearray(f.read())
    at = data.index(b"(2, 8)")
    data[at:at + 6] = b"(2, x)"
    with open(model.tokens_path, "wb") as f:
        f.write(data)
    proc = model.run(exe, 1, expect_ok=False)
    assert proc.returncode != 0
    assert "tokens.npy: the shape's dimension 'x' is not a count" in proc.stderr, proc.stderr
