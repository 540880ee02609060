"""python3 -m parax: the front door that chains the tools.

    python3 -m parax compile MODEL --cluster C --workload W -o model.pxe
        MODEL: a preset or config.json (built with --batch/--seq/--layers/--dtype,
        --past P [--return-kv] for a step over a KV cache, --cache C for a
        generation step, --last-logits for a prefill that returns the last
        position's logits only, --mla absorbed for DeepSeek-V3's latent KV
        cache) or a .mlir file; plans (printing the ranked
        table), partitions and translates. A program's batch is what one
        replica runs at once: where the best plan for --workload runs
        another than --batch (data or expert parallel), the model is built
        with that, the plan pinned, and a line says so.
    python3 -m parax plan MODEL --cluster C --workload W [--profile P] [--html report.html]
        the ranked plans (parax-plan's table; a training MODEL is built
        with its loss); --html: a page of the best plan's time by term,
        each pipeline stage's memory by kind and the step's pipeline
        timeline, drawn in SVG.
    python3 -m parax models [MODEL ...]
        python3 -m parax.models: the presets (--list), a model's parax IR.
    python3 -m parax init-weights MODEL -o W.safetensors [--seed S] [--layers N]
        random weights for MODEL under its checkpoint names (N(0, 0.02), norms 1).
    python3 -m parax tokens MODEL_FOLDER "text" ... -o tokens.npy
        the texts as token ids by the model's own tokenizer.json (a row a text,
        shorter rows padded with -1: parax-run's prompt form).
    python3 -m parax train model.pxe ... / generate step.pxe ... --tokens K
        run with --optimizer (default adamw) / run --generate K.
    python3 -m parax run model.pxe --weights W.safetensors --input tokens.npy
                         [--output logits.npy ...] --ranks N [--generate K [--prefill P.pxe]]
                         [--launcher 'srun -n {ranks}']
        runs it under mpirun (N: the executable's grid size), or the
        --launcher given (a cluster's: srun, mpirun with a hostfile);
        --generate K: K tokens after the prompt --input, with a
        generation step (and a prefill program for the prompt's chunks);
        training (--optimizer): --plot losses.svg draws the loss a step.
    From Python: parax.plan(...), parax.compile(...), parax.run(...)
        return Plan / Executable objects and numpy arrays (parax/api.py).
    python3 -m parax demo
        the README's main job: a tiny Llama planned, partitioned and run on 4
        CPU ranks, compared with the single-rank run; then 8 tokens generated
        on 4 ranks and on 1, compared.
"""

import argparse
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

from .checkpoint import load_safetensors, random_weights, save_safetensors
from .models import build_model, load_config
from .models.builder import parameter_shapes

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BIN = os.path.join(os.environ.get("PARAX_BUILD_DIR", os.path.join(ROOT, "build")), "bin")
ORACLE_CLUSTER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "oracle-cluster.json")
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none",
               OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "1"))


class ToolError(RuntimeError):
    pass


def _tool(name):
    """A C++ tool: in $PARAX_BUILD_DIR/bin (default: the repository's
    build/bin), else on PATH (an installed `parax` command)."""
    import shutil
    path = os.path.join(BIN, name)
    if os.path.exists(path):
        return path
    found = shutil.which(name)
    if found and "PARAX_BUILD_DIR" not in os.environ:
        return found
    raise ToolError(f"{path} is not built (run scripts/setup.sh; or put the tools' folder on PATH)")


def _run(cmd, env=None, timeout=600, capture=True):
    proc = subprocess.run(cmd, capture_output=capture, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise ToolError(f"{os.path.basename(cmd[0])} failed:\n{(proc.stdout or '')}{(proc.stderr or '')}")
    return proc.stdout if capture else ""


def compile_model(model, cluster, workload, output, batch=1, seq=None, layers=None,
                  dtype="bf16", workdir=None, show_plans=True, past=0, return_kv=False, cache=0,
                  last_logits=False, train=False, mla="explicit", ignore_index=None, mtp_weight=None,
                  tp_overlap=0):
    """Builds (if needed), plans, partitions and translates; returns the
    partitioned IR path. `train`: a training step (the model takes labels
    after the tokens; the program returns the loss, then the gradient of
    every parameter; the activations the plan chose to recompute are
    recomputed); `ignore_index`: labels of that value not counted;
    `mtp_weight`: multi-token prediction's loss weighted so (the config's
    depths); `tp_overlap` N >= 2: the GEMMs beside each tensor-parallel
    collective in N row chunks (--parax-tp-overlap, docs/partitioning.md)."""
    workdir = workdir or tempfile.mkdtemp(prefix="parax-")
    ir = model
    if not model.endswith(".mlir"):
        ir = os.path.join(workdir, "model.mlir")
        config = load_config(model, layers=layers)

        def build(rows):
            with open(ir, "w") as f:
                f.write(build_model(config, batch=rows, seq=seq, dtype=dtype, past=past, return_kv=return_kv,
                                    cache=cache, last_logits=last_logits, loss=train, mla=mla,
                                    ignore_index=ignore_index, mtp_weight=mtp_weight))
        build(batch)
        # The program's batch is what one replica runs at once (a microbatch
        # of each of its EP ranks): where the best plan runs another than
        # --batch, the model is built again with it, the plan pinned.
        plans = json.loads(_run([_tool("parax-plan"), ir, "--cluster", cluster, "--workload", workload, "--json",
                                 "--top", "1"]))["plans"]
        if plans and plans[0]["micro_batch"] * plans[0]["ep"] != batch:
            best = plans[0]
            rows = best["micro_batch"] * best["ep"]
            pins = {k: best[k] for k in ("tp", "pp", "dp", "ep", "cp")}
            pins["mbs"] = best["micro_batch"]
            if train:
                pins.update(sp=int(best["sequence_parallel"]), schedule=best["schedule"],
                            recompute=best["recompute"], zero=best["zero"])
                if best["schedule"] == "interleaved":
                    pins["chunks"] = best["virtual_stages"]
            workload = _pinned(workload, pins)
            print(f"parax: the best plan runs {rows} row(s) a replica at once (tp {best['tp']}, pp {best['pp']}, "
                  f"dp {best['dp']}, ep {best['ep']}): the program is built with batch {rows}, the plan pinned "
                  f"({workload})")
            build(rows)
    if show_plans:
        print(_run([_tool("parax-plan"), ir, "--cluster", cluster, "--workload", workload,
                    "--top", "3"]), end="")
    partitioned = os.path.join(workdir, "partitioned.mlir")
    _run([_tool("parax-opt"), ir, f"--parax-plan=cluster={cluster} workload={workload}",
          *(["--parax-autodiff", "--parax-recompute"] if train else []), "--parax-partition",
          *([f"--parax-tp-overlap=chunks={tp_overlap}"] if tp_overlap else []), "-o", partitioned])
    _run([_tool("parax-translate"), "--to-executable", partitioned, "-o", output])
    return partitioned


def planned_ir(model, workload, seq=None, layers=None, dtype="bf16", workdir="."):
    """The IR parax-plan reads for `model`: a .mlir file as it is, else the
    model built for the workload (a training step with its loss) in
    `workdir`."""
    if model.endswith(".mlir"):
        return model
    path = os.path.join(workdir, "model.mlir")
    with open(path, "w") as f:
        f.write(build_model(load_config(model, layers=layers), seq=seq, dtype=dtype,
                            loss=workload.startswith("train")))
    return path


def plan_model(model, cluster, workload, profile=None, seq=None, layers=None, dtype="bf16", html=None,
               top=5, workdir=None):
    """parax-plan's ranked table for `model` (a preset, config.json or
    folder, built for the workload: a training step with its loss; or a
    .mlir file); with `html`, a page of the best plan drawn (report.py).
    Returns the table's text."""
    from .report import plan_html
    workdir = workdir or tempfile.mkdtemp(prefix="parax-")
    ir = planned_ir(model, workload, seq, layers, dtype, workdir)
    cmd = [_tool("parax-plan"), ir, "--cluster", cluster, "--workload", workload, "--top", str(top)]
    if profile:
        cmd += ["--profile", profile]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if proc.returncode not in (0, 2):  # 2: no plan fits (the table says why)
        raise ToolError(f"parax-plan failed:\n{proc.stdout}{proc.stderr}")
    if html:
        trace_path = os.path.join(workdir, "trace.json")
        out = subprocess.run(cmd + ["--json", "--timeline", trace_path], capture_output=True, text=True,
                             timeout=600)
        result = json.loads(out.stdout)
        trace = None
        if os.path.exists(trace_path):
            with open(trace_path) as f:
                trace = json.load(f)
        with open(html, "w") as f:
            f.write(plan_html(result, trace))
    return proc.stdout


def init_weights(model, output, seed=0, layers=None):
    """Random weights for `model` under its checkpoint names."""
    cfg = load_config(model, layers=layers)
    save_safetensors(output, random_weights(cfg, seed=seed))
    return output


def text_tokens(model, texts, output):
    """`texts` as token ids by the model folder's tokenizer.json (the
    `tokenizers` package): a row a text, shorter rows padded with -1."""
    path = model if model.endswith(".json") else os.path.join(model, "tokenizer.json")
    if not os.path.exists(path):
        raise ValueError(f"{path}: no tokenizer.json (the model folder's tokenizer, as Hugging Face "
                         "saves it) to turn text into ids")
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(path)
    rows = [tokenizer.encode(text).ids for text in texts]
    if not rows or not all(rows):
        raise ValueError("a text gave no tokens")
    ids = np.full((len(rows), max(len(r) for r in rows)), -1, dtype=np.int32)
    for i, row in enumerate(rows):
        ids[i, :len(row)] = row
    np.save(output, ids)
    return ids


def _pinned(workload, pins):
    """`workload` (KIND:key=value,...) with `pins` set (over any it has)."""
    kind, _, rest = workload.partition(":")
    fields = dict(item.split("=", 1) for item in rest.split(",") if item)
    fields.update({k: str(v) for k, v in pins.items()})
    return kind + ":" + ",".join(f"{k}={v}" for k, v in fields.items())


def grid_size(partitioned):
    """Ranks of the grid in a partitioned module (1 without a grid)."""
    import re
    with open(partitioned) as f:
        m = re.search(r"parax\.grid @\S+ \(([^)]*)\)", f.read())
    n = 1
    if m:
        for item in m.group(1).split(","):
            n *= int(item.split("=")[1])
    return n


DEFAULT_LAUNCHER = "mpirun -np {ranks} --oversubscribe --bind-to none"


def launcher_command(launcher, ranks):
    """The launcher's words (`launcher`: a command line with {ranks} where
    the rank count goes, e.g. "srun -n {ranks}" or "mpirun -np {ranks}
    --hostfile hosts"; "none": no launcher -- this process is already one
    of the job's ranks, started by an outer mpirun or srun, and parax-run
    joins that job)."""
    import shlex
    if launcher == "none":
        return []
    if "{ranks}" not in launcher:
        raise ToolError(f"--launcher {launcher!r}: no {{ranks}} in it (where the rank count goes, "
                        "e.g. 'srun -n {ranks}')")
    words = shlex.split(launcher.replace("{ranks}", str(ranks)))
    if not words:
        raise ToolError("--launcher: empty")
    return words


def run_model(exe, weights, inputs, output=None, ranks=1, steps=1, generate=0, prefill=None,
              sampling=(), extra=(), launcher=DEFAULT_LAUNCHER):
    """`output`: a path, or a list of paths (one per result, in order).
    `generate` > 0: that many tokens after the prompt (the one input), the
    prompt's whole chunks through `prefill` (an executable) if given;
    `sampling`: parax-run's --temperature/--top-k/--top-p/--seed/--stop-token arguments;
    `extra`: any other parax-run arguments (--optimizer ...); `launcher`:
    how the ranks start (launcher_command)."""
    cmd = launcher_command(launcher, ranks) + [_tool("parax-run"), exe, "--weights", weights]
    cmd += ["--generate", str(generate)] if generate else ["--steps", str(steps)]
    cmd += (["--prefill", prefill] if prefill else []) + list(sampling) + list(extra)
    for path in inputs:
        cmd += ["--input", path]
    for path in [output] if isinstance(output, str) else (output or []):
        cmd += ["--output", path]
    return _run(cmd, env=MPI_ENV, timeout=600)


def _single_rank_training(ir, exe):
    """The training step of model `ir` (a loss) unpartitioned, as `exe`."""
    single = exe.replace(".pxe", ".mlir")
    _run([_tool("parax-opt"), ir, "--parax-autodiff", "-o", single])
    _run([_tool("parax-translate"), "--to-executable", single, "-o", exe])


def _adamw_one_rank_and_four(single_exe, exe, weights, inputs, work, clip=()):
    """8 AdamW steps on one rank and on 4 (with ZeRO-1), printed: (the 4
    ranks' losses, the largest difference of losses and trained weights)."""
    trained = []
    for exe_path, ranks, zero in ((single_exe, 1, []), (exe, 4, ["--zero"])):
        saved = os.path.join(work, f"trained{ranks}.safetensors")
        losses = os.path.join(work, f"losses{ranks}.npy")
        line = run_model(exe_path, weights, inputs, ranks=ranks, steps=8,
                         extra=["--optimizer", "adamw", "--lr", "1e-2", "--weight-decay", "0.1", "--eps", "1e-3",
                                *clip, *zero, "--save-weights", saved, "--losses", losses])
        print("  " + line.strip().splitlines()[-1])
        trained.append((np.load(losses), load_safetensors(saved)))
    (one_losses, one_w), (four_losses, four_w) = trained
    diff = max(float(np.abs(one_losses - four_losses).max()),
               max(float(np.abs(one_w[k] - four_w[k]).max()) for k in one_w))
    print(f"  losses (4 ranks): {' '.join(f'{v:.4f}' for v in four_losses)}")
    return four_losses, diff


def _saved_box_wise_then_resumed(single_exe, exe, weights, inputs, work, clip):
    """4 AdamW steps on 4 ranks (ZeRO-1) saved box-wise, then 4 more on one
    rank from what was saved, printed: the largest difference from the 8
    uninterrupted steps on one rank (_adamw_one_rank_and_four's)."""
    adamw = ["--optimizer", "adamw", "--lr", "1e-2", "--weight-decay", "0.1", "--eps", "1e-3", *clip]
    boxes, state = os.path.join(work, "boxes") + "/", os.path.join(work, "state") + "/"
    run_model(exe, weights, inputs, ranks=4, steps=4,
              extra=[*adamw, "--zero", "--save-weights", boxes, "--save-optimizer", state, "--save-format", "boxes"])
    for folder in (boxes, state):
        files = sorted(f for f in os.listdir(folder) if f.endswith(".safetensors"))
        print(f"  {os.path.basename(folder[:-1])}/: {', '.join(files)}, boxes.index.json")
    resumed = os.path.join(work, "resumed.safetensors")
    line = run_model(single_exe, boxes, inputs, ranks=1, steps=4,
                     extra=[*adamw, "--load-optimizer", state, "--save-weights", resumed])
    print("  " + line.strip().splitlines()[-1])
    want, got = load_safetensors(os.path.join(work, "trained1.safetensors")), load_safetensors(resumed)
    return max(float(np.abs(want[k] - got[k]).max()) for k in want)


def demo():
    work = tempfile.mkdtemp(prefix="parax-demo-")
    cfg = load_config("tiny-llama")
    print("== model: tiny-llama (2 layers, hidden 64, 4 query / 2 KV heads), batch 2 x 8 "
          "tokens, f32, random weights")
    ir = os.path.join(work, "model.mlir")
    with open(ir, "w") as f:
        f.write(build_model(cfg, batch=2, seq=8, dtype="f32"))
    weights = os.path.join(work, "weights.safetensors")
    save_safetensors(weights, random_weights(cfg, seed=0))
    tokens = os.path.join(work, "tokens.npy")
    np.save(tokens, np.random.default_rng(1).integers(0, cfg.vocab, (2, 8)).astype(np.int32))

    cluster = f"{ORACLE_CLUSTER}:devices_per_node=4"
    print("\n== plan (4 CPU ranks, costed as a slow device on a fast network so that a tiny "
          "model splits like a large one; tp=2 x pp=2 pinned)")
    exe = os.path.join(work, "model.pxe")
    partitioned = compile_model(ir, cluster, "prefill:batch=2,seq=8,tp=2,pp=2,dp=1", exe,
                                workdir=work)
    print("== collectives per rank (from --parax-specialize-rank)")
    for rank in range(4):
        text = _run([_tool("parax-opt"), partitioned, f"--parax-specialize-rank=rank={rank}",
                     "-o", os.devnull])
        lines = text.splitlines()
        ops = [l.strip().split(" ")[0] for l in lines if l.startswith("    ") and not
               l.strip().startswith("#")]
        counts = {k: ops.count(k) for k in sorted(set(ops))}
        print(f"  {lines[0]}  ->  " + ", ".join(f"{k} {v}" for k, v in counts.items()))

    single_exe = os.path.join(work, "single.pxe")
    _run([_tool("parax-translate"), "--to-executable", ir, "-o", single_exe])
    single_out, sharded_out = os.path.join(work, "single.npy"), os.path.join(work, "sharded.npy")
    print("\n== run: single rank, then 4 ranks under mpirun")
    print("  " + run_model(single_exe, weights, [tokens], single_out, ranks=1, steps=5).strip())
    print("  " + run_model(exe, weights, [tokens], sharded_out, ranks=4, steps=5).strip())
    diff = float(np.abs(np.load(sharded_out) - np.load(single_out)).max())
    print(f"\n== largest |difference| between the 4-rank and single-rank logits: {diff:.3g}")

    print("\n== context parallelism: the same batch on 2 ranks, each holding every other position "
          "of every sequence (cp=2, dealt out cyclically), keys and values gathered for attention")
    cp_dir = os.path.join(work, "cp")
    os.makedirs(cp_dir)
    cp_exe, cp_out = os.path.join(cp_dir, "model.pxe"), os.path.join(cp_dir, "logits.npy")
    compile_model(ir, f"{ORACLE_CLUSTER}:devices_per_node=2", "prefill:batch=2,seq=8,cp=2,tp=1,dp=1,pp=1",
                  cp_exe, workdir=cp_dir, show_plans=False)
    print("  " + run_model(cp_exe, weights, [tokens], cp_out, ranks=2, steps=5).strip())
    cp_diff = float(np.abs(np.load(cp_out) - np.load(single_out)).max())
    print(f"== largest |difference| between the CP2 and single-rank logits: {cp_diff:.3g}")

    print("\n== generate: a generation step (KV caches of 32 tokens written in place at a run-time "
          "position), 8 tokens after each row's prompt (of 4, 2, 3 and 4 tokens: a shorter one ends with "
          "-1s), greedy, for 4 rows: two microbatches of the "
          "step's batch of 2, each with its own caches (on 4 ranks, tp=2 x pp=2, stage 1 works on one "
          "while stage 0 works on the other); and on 1 rank")
    step_ir = os.path.join(work, "step.mlir")
    with open(step_ir, "w") as f:
        f.write(build_model(cfg, batch=2, seq=1, dtype="f32", cache=32))
    prompt = os.path.join(work, "prompt.npy")
    prompts = np.random.default_rng(2).integers(0, cfg.vocab, (4, 4)).astype(np.int32)
    prompts[1, 2:] = prompts[2, 3:] = -1
    np.save(prompt, prompts)
    step_exe, step_single = os.path.join(work, "step.pxe"), os.path.join(work, "step-single.pxe")
    compile_model(step_ir, cluster, "decode:batch=2,context=32,tp=2,pp=2,dp=1", step_exe, workdir=work,
                  show_plans=False)
    _run([_tool("parax-translate"), "--to-executable", step_ir, "-o", step_single])
    generated = []
    for exe_path, ranks in ((step_single, 1), (step_exe, 4)):
        out = os.path.join(work, f"generated-{ranks}.npy")
        print("  " + run_model(exe_path, weights, [prompt], out, ranks=ranks, generate=8).strip())
        generated.append(np.load(out))
    same = bool(np.array_equal(generated[0], generated[1]))
    print(f"  tokens (4 ranks): {generated[1].tolist()}")
    print(f"== the 4-rank and single-rank generations are {'the same' if same else 'DIFFERENT'}")

    print("\n== train: a training step (--parax-autodiff: the loss, then the gradient of each of the 21 "
          "parameters) for 4 rows, on 4 ranks (dp=2 x tp=2: each replica 2 rows, gradients averaged) "
          "and on 1 rank")
    train_dir = os.path.join(work, "train")
    os.makedirs(train_dir)
    train_ir = os.path.join(train_dir, "model.mlir")
    with open(train_ir, "w") as f:
        f.write(build_model(cfg, batch=2, seq=8, dtype="f32", loss=True))
    rows = np.random.default_rng(3).integers(0, cfg.vocab, (2, 4, 8)).astype(np.int32)
    train_inputs = [os.path.join(train_dir, name) for name in ("tokens.npy", "labels.npy")]
    for path, value in zip(train_inputs, rows):
        np.save(path, value)
    train_exe, train_single = os.path.join(train_dir, "train.pxe"), os.path.join(train_dir, "single.pxe")
    compile_model(train_ir, cluster, "train:batch=4,seq=8,dp=2,tp=2,pp=1", train_exe, workdir=train_dir,
                  show_plans=False, train=True)
    _single_rank_training(train_ir, train_single)
    results = []
    for exe_path, ranks in ((train_single, 1), (train_exe, 4)):
        outs = [os.path.join(train_dir, f"out{ranks}-{k}.npy") for k in range(22)]
        print("  " + run_model(exe_path, weights, train_inputs, outs, ranks=ranks).strip())
        results.append([np.load(out) for out in outs])
    train_diff = max(float(np.abs(a - b).max()) for a, b in zip(*results))
    print(f"  loss {float(results[1][0]):.6f}; largest gradient {max(float(np.abs(g).max()) for g in results[1][1:]):.3g}")
    print(f"== largest |difference| between the 4-rank and single-rank loss and gradients: {train_diff:.3g}")

    print("\n== train: 8 AdamW steps (lr 1e-2, weight decay 0.1, eps 1e-3, gradients clipped to norm 1) "
          "on 4 ranks (dp=2 x tp=2, ZeRO-1: each replica updates half of every box) and on 1 rank")
    four_losses, opt_diff = _adamw_one_rank_and_four(train_single, train_exe, weights, train_inputs, train_dir,
                                                     clip=["--clip-grad-norm", "1"])
    print(f"== largest |difference| between the 4-rank and single-rank losses and trained weights: {opt_diff:.3g}")

    print("\n== checkpoint box-wise: 4 of those AdamW steps on the 4 ranks, saved with --save-format boxes "
          "(each rank writes its own boxes and ZeRO chunks, nothing gathered), then 4 more resumed on 1 rank")
    box_diff = _saved_box_wise_then_resumed(train_single, train_exe, weights, train_inputs, train_dir,
                                            ["--clip-grad-norm", "1"])
    print(f"== largest |difference| between the resumed and the uninterrupted single-rank weights: {box_diff:.3g}")

    print("\n== train a mixture of experts: tiny-mixtral (4 experts, top 2), 8 AdamW steps on 4 ranks "
          "(dp=2 x ep=2: each rank holds 2 experts, tokens dispatched to their experts and the gradients "
          "sent back, ZeRO-1) and on 1 rank")
    moe_dir = os.path.join(work, "moe")
    os.makedirs(moe_dir)
    moe_cfg = load_config("tiny-mixtral")
    moe_ir = os.path.join(moe_dir, "model.mlir")
    with open(moe_ir, "w") as f:
        f.write(build_model(moe_cfg, batch=2, seq=8, dtype="f32", loss=True))
    moe_weights = os.path.join(moe_dir, "weights.safetensors")
    save_safetensors(moe_weights, random_weights(moe_cfg, seed=0))
    moe_exe, moe_single = os.path.join(moe_dir, "train.pxe"), os.path.join(moe_dir, "single.pxe")
    compile_model(moe_ir, cluster, "train:batch=4,seq=8,dp=2,ep=2,pp=1", moe_exe, workdir=moe_dir,
                  show_plans=False, train=True)
    _single_rank_training(moe_ir, moe_single)
    four_losses_moe, moe_diff = _adamw_one_rank_and_four(moe_single, moe_exe, moe_weights, train_inputs, moe_dir)
    print(f"== largest |difference| between the 4-rank and single-rank losses and trained weights "
          f"(every expert's): {moe_diff:.3g}")

    print("\n== train through interleaved 1F1B: tiny-llama with 4 layers on 2 ranks (pp=2, two model chunks a "
          "stage: layers 0 and 2 on rank 0, 1 and 3 on rank 1), 8 rows as 4 microbatches, the loss and "
          "gradients; and on 1 rank as one batch")
    il_dir = os.path.join(work, "interleaved")
    os.makedirs(il_dir)
    il_cfg = load_config("tiny-llama", layers=4)
    il_weights = os.path.join(il_dir, "weights.safetensors")
    save_safetensors(il_weights, random_weights(il_cfg, seed=0))
    il_rows = np.random.default_rng(4).integers(0, il_cfg.vocab, (2, 8, 8)).astype(np.int32)
    il_inputs = [os.path.join(il_dir, name) for name in ("tokens.npy", "labels.npy")]
    for path, value in zip(il_inputs, il_rows):
        np.save(path, value)
    results = []
    for batch, ranks in ((8, 1), (2, 2)):
        case_dir = os.path.join(il_dir, f"ranks{ranks}")
        os.makedirs(case_dir)
        il_ir = os.path.join(case_dir, "model.mlir")
        with open(il_ir, "w") as f:
            f.write(build_model(il_cfg, batch=batch, seq=8, dtype="f32", loss=True))
        il_exe = os.path.join(case_dir, "train.pxe")
        if ranks == 1:
            _single_rank_training(il_ir, il_exe)
        else:
            compile_model(il_ir, f"{ORACLE_CLUSTER}:devices_per_node=2",
                          "train:batch=8,seq=8,mbs=2,pp=2,dp=1,tp=1,schedule=interleaved,chunks=2", il_exe,
                          workdir=case_dir, show_plans=False, train=True)
        outs = [os.path.join(case_dir, f"out{k}.npy") for k in range(1 + len(parameter_shapes(il_cfg)))]
        print("  " + run_model(il_exe, il_weights, il_inputs, outs, ranks=ranks).strip())
        results.append([np.load(out) for out in outs])
    il_diff = max(float(np.abs(a - b).max()) for a, b in zip(*results))
    print(f"== largest |difference| between the interleaved 2-rank and single-rank loss and gradients: "
          f"{il_diff:.3g}")
    print(f"(files in {work})")
    fell = four_losses[-1] < four_losses[0] and four_losses_moe[-1] < four_losses_moe[0]
    return 0 if (diff < 1e-5 and cp_diff < 1e-5 and same and train_diff < 1e-5 and opt_diff < 1e-4 and
                 box_diff < 1e-4 and moe_diff < 1e-4 and fell and il_diff < 1e-5) else 1


def convert_checkpoint(source, output, shards):
    """Whole tensors from `source` (any checkpoint load_checkpoint reads)
    written as one safetensors file, or (`output` ending in '/') as a
    Hugging Face sharded checkpoint of `shards` files. The whole model
    passes through this process's memory: an offline conversion."""
    from .checkpoint import load_checkpoint, save_sharded
    tensors = load_checkpoint(source)
    if output.endswith("/") or os.path.isdir(output):
        save_sharded(output, tensors, shards)
    else:
        save_safetensors(output, tensors)
    print(f"{len(tensors)} tensors, {sum(a.size for a in tensors.values())} values -> {output}")


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python3 -m parax", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    def model_arguments(p):
        """What compile and plan both take: the model, the cluster, the workload."""
        p.add_argument("model", help="a preset (python -m parax.models --list), a config.json or Hugging Face "
                                     "model folder, or a .mlir file")
        p.add_argument("--cluster", required=True, help="a preset (dgx-h100, ...) or cluster JSON, with "
                                                        "overrides (dgx-h100:nodes=4,devices_per_node=8)")
        p.add_argument("--workload", required=True,
                       help="KIND:key=value,... -- train:batch=B,seq=S, prefill:batch=B,seq=S or "
                            "decode:batch=B,context=C; pins tp= pp= dp= ep= cp= mbs= ... (parax-plan --help)")

    c = sub.add_parser("compile", help="plan, partition and translate a model")
    model_arguments(c)
    c.add_argument("-o", "--output", required=True, help="the executable (.pxe)")
    c.add_argument("--batch", type=int, default=1,
                   help="the rows one replica runs at once (default 1; where the best plan runs another, "
                        "the model is built with that)")
    c.add_argument("--seq", type=int, help="positions a program takes (default: the config's)")
    c.add_argument("--layers", type=int, help="the first N decoder layers only")
    c.add_argument("--dtype", default="bf16", help="f32, bf16 or f16 (default bf16)")
    c.add_argument("--past", type=int, default=0, help="a step over a KV cache of P tokens")
    c.add_argument("--return-kv", action="store_true",
                   help="also return each layer's new keys and values")
    c.add_argument("--cache", type=int, default=0,
                   help="a generation step over KV caches of capacity C (run --generate)")
    c.add_argument("--train", action="store_true",
                   help="a training step: inputs tokens and labels; results the loss, then "
                        "each parameter's gradient (run with --optimizer to train)")
    c.add_argument("--ignore-index", type=int,
                   help="with --train: labels of this value are not counted (Hugging Face's -100)")
    c.add_argument("--mtp-weight", type=float,
                   help="with --train: multi-token prediction (the config's num_nextn_predict_layers "
                        "depths), its loss weighted this much (DeepSeek-V3: 0.3, then 0.1)")
    c.add_argument("--mla", default="explicit", choices=["explicit", "absorbed", "expanded"],
                   help="DeepSeek-V3's attention: absorbed caches the latent (inference); expanded "
                        "reads that cache in the explicit form (a prefill)")
    c.add_argument("--tp-overlap", type=int, default=0, metavar="N",
                   help="the GEMMs beside each tensor-parallel collective in N row chunks, so that a chunk's "
                        "transfer runs beside the next chunk's GEMMs (N >= 2; docs/partitioning.md)")
    c.add_argument("--last-logits", action="store_true",
                   help="logits of the last position only (a prefill program for run --prefill)")
    pl = sub.add_parser("plan", help="rank the plans of a model on a cluster (and draw the best)")
    model_arguments(pl)
    pl.add_argument("--profile", help="the software stack: roofline (default), megatron-core, megatron-bridge, "
                                      "fsdp, fsdp-compile, deepseek-v3, parax-cuda, ... or a profile JSON "
                                      "(`parax-plan --help` lists them)")
    pl.add_argument("--seq", type=int, help="positions the model is built with (default: the config's)")
    pl.add_argument("--layers", type=int, help="the first N decoder layers only")
    pl.add_argument("--dtype", default="bf16", help="f32, bf16 or f16 (default bf16)")
    pl.add_argument("--top", type=int, default=5, help="plans in the table (default 5)")
    pl.add_argument("--html", help="write a page of the best plan: its time by term, each stage's memory "
                                   "by kind, the step's pipeline timeline (SVG)")
    def run_arguments(r):
        r.add_argument("executable", help="a .pxe from compile (or parax-translate)")
        r.add_argument("--weights", required=True,
                       help="a .safetensors file, a sharded or box-wise index, or a folder holding one")
        r.add_argument("--input", action="append", default=[],
                       help="an input .npy, in the program's order (tokens, then labels, ...)")
        r.add_argument("--output", action="append", default=[], help="a result .npy, in the program's order")
        r.add_argument("--ranks", type=int, required=True,
                       help="the executable's grid size (its pp x dp x ep x cp x tp; compile prints it)")
        r.add_argument("--launcher", default=DEFAULT_LAUNCHER,
                       help="how the ranks start, {ranks} where their count goes (default: %(default)s; e.g. "
                            "'srun -n {ranks}' under Slurm, 'mpirun -np {ranks} --hostfile hosts --map-by ppr:8:node' "
                            "over several machines; each rank takes the GPU of its index among its node's ranks; "
                            "'none': this command is itself one of the ranks, started by an outer launcher, e.g. "
                            "mpirun -np 2 parax run ... --ranks 2 --launcher none)")
        r.add_argument("--steps", type=int, default=1, help="steps to run (with --optimizer: optimizer steps)")
        r.add_argument("--generate", type=int, default=0,
                       help="K tokens after the prompt (--input), with a generation step")
        r.add_argument("--prefill", help="with --generate: a program for the prompt's chunks "
                                         "(built like the step with --seq P)")
        for option, kind in (("--temperature", float), ("--top-k", int), ("--top-p", float), ("--seed", int),
                             ("--stop-token", int)):
            r.add_argument(option, type=kind, help="with --generate (see parax-run --help)")
        # Training (an executable built with compile --train): --steps optimizer steps.
        r.add_argument("--optimizer", choices=["sgd", "adamw"], help="train: --steps optimizer steps")
        for option, kind in (("--lr", float), ("--beta1", float), ("--beta2", float), ("--eps", float),
                             ("--weight-decay", float), ("--clip-grad-norm", float), ("--step-rows", int),
                             ("--lr-schedule", str), ("--warmup-steps", int), ("--decay-steps", int), ("--min-lr", float),
                             ("--save-weights", str), ("--losses", str), ("--balance-losses", str),
                             ("--save-optimizer", str), ("--load-optimizer", str), ("--save-format", str),
                             ("--save-every", int), ("--log-json", str)):
            r.add_argument(option, type=kind, help="with --optimizer (see parax-run --help)")
        r.add_argument("--zero", action="store_true", help="with --optimizer adamw: ZeRO-1")
        r.add_argument("--plot", help="with --optimizer: draw the loss a step as SVG in this file")
        r.add_argument("--per-token-loss", action="store_true",
                       help="labels ignored (compile --ignore-index): one mean over the step's counted labels")

    run_arguments(sub.add_parser("run", help="run an executable under mpirun"))
    run_arguments(sub.add_parser("train", help="run a training executable (compile --train): "
                                               "run with --optimizer, adamw unless given"))
    run_arguments(sub.add_parser("generate", help="generate with a generation step (compile --cache): "
                                                  "run --generate K, K from --tokens"))
    sub.choices["generate"].add_argument("--tokens", type=int, required=True, help="tokens to generate a row")
    m = sub.add_parser("models", help="python3 -m parax.models: the presets, a model's parax IR")
    m.add_argument("rest", nargs=argparse.REMAINDER, help="python3 -m parax.models' arguments")
    w = sub.add_parser("init-weights", help="random weights for a model, under its checkpoint names")
    w.add_argument("model", help="a preset, a config.json or a Hugging Face model folder")
    w.add_argument("-o", "--output", required=True, help="the .safetensors file")
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--layers", type=int, help="the first N decoder layers only")
    t = sub.add_parser("tokens", help="texts as token ids by a model folder's tokenizer.json")
    t.add_argument("model", help="a Hugging Face model folder (or its tokenizer.json)")
    t.add_argument("text", nargs="+", help="one text a row")
    t.add_argument("-o", "--output", required=True, help="the .npy of ids (rows padded with -1)")
    k = sub.add_parser("checkpoint", help="put a checkpoint together as whole tensors: a box-wise one "
                                          "(run --save-format boxes), a sharded one or a file")
    k.add_argument("source", help="a .safetensors file, an index (*.json) or a folder holding one")
    k.add_argument("-o", "--output", required=True,
                   help="OUT.safetensors, or OUT/ for a Hugging Face sharded checkpoint")
    k.add_argument("--shards", type=int, default=1, help="with OUT/: how many files")
    sub.add_parser("demo", help="the README's main job")
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["models"]:  # (its own parser: python3 -m parax.models)
        from .models.__main__ import main as models_main
        return models_main(argv[1:])
    args = parser.parse_args(argv)
    try:
        if args.command == "compile":
            compile_model(args.model, args.cluster, args.workload, args.output, args.batch,
                          args.seq, args.layers, args.dtype, past=args.past,
                          return_kv=args.return_kv, cache=args.cache, last_logits=args.last_logits,
                          train=args.train, mla=args.mla, ignore_index=args.ignore_index,
                          mtp_weight=args.mtp_weight, tp_overlap=args.tp_overlap)
            return 0
        if args.command == "plan":
            print(plan_model(args.model, args.cluster, args.workload, args.profile, args.seq, args.layers,
                             args.dtype, args.html, args.top), end="")
            if args.html:
                print(f"parax: wrote {args.html}")
            return 0
        if args.command == "init-weights":
            print(f"parax: wrote {init_weights(args.model, args.output, args.seed, args.layers)}")
            return 0
        if args.command == "tokens":
            ids = text_tokens(args.model, args.text, args.output)
            print(f"parax: wrote {args.output}: {ids.shape[0]} row(s) of up to {ids.shape[1]} token(s)")
            return 0
        if args.command == "train" and not args.optimizer:
            args.optimizer = "adamw"
        if args.command == "generate":
            args.generate = args.tokens
        if args.command in ("run", "train", "generate"):
            if args.plot and not args.optimizer:
                raise ValueError("--plot draws a training run's losses: it needs --optimizer")
            log = args.log_json
            if args.plot and not log:
                log = args.log_json = os.path.join(tempfile.mkdtemp(prefix="parax-"), "steps.jsonl")
            sampling = [arg for option, value in (("--temperature", args.temperature), ("--top-k", args.top_k),
                                                  ("--top-p", args.top_p), ("--seed", args.seed),
                                                  ("--stop-token", args.stop_token))
                        if value is not None for arg in (option, str(value))]
            training = [arg for option in ("--optimizer", "--lr", "--beta1", "--beta2", "--eps", "--weight-decay",
                                           "--clip-grad-norm", "--step-rows", "--save-weights", "--losses",
                                           "--balance-losses", "--lr-schedule", "--warmup-steps", "--decay-steps", "--min-lr",
                                           "--save-optimizer", "--load-optimizer", "--save-format", "--save-every", "--log-json")
                        for value in [getattr(args, option[2:].replace("-", "_"))] if value is not None
                        for arg in (option, str(value))] + (["--zero"] if args.zero else []) + \
                (["--per-token-loss"] if args.per_token_loss else [])
            print(run_model(args.executable, args.weights, args.input, args.output,
                            args.ranks, args.steps, args.generate, args.prefill, sampling, training,
                            launcher=args.launcher), end="")
            if args.plot:
                from .report import loss_svg, read_log
                with open(args.plot, "w") as f:
                    f.write(loss_svg(read_log(log)))
                print(f"parax: wrote {args.plot}")
            return 0
        if args.command == "checkpoint":
            convert_checkpoint(args.source, args.output, args.shards)
            return 0
        return demo()
    except (ToolError, ValueError, OSError, KeyError) as e:
        print(f"parax: error: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
