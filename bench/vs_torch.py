"""parax-run on the CPU against transformers on PyTorch (not a test): the
same model and weights (issue 46's Llama: hidden 1024, GQA 8/2, FFN 2816,
4 layers, vocabulary 32,000, about 110 M parameters, fp32), threads
pinned equal, interleaved rounds; each row's median on each side and
their ratio (parax / PyTorch; below 1: parax is faster).

Rows (the issue's targets in brackets):
- prefill of 512 tokens, one thread                          [<= 0.8]
- a decode step of one sequence, one thread                   [<= 0.9]
- a decode step of 8 sequences, one thread                    [<= 0.9]
- a training step with AdamW, 256 tokens, one thread          [<= 1.0]
- TP2: prefill of 512 tokens on 2 ranks of one thread against
  parax on one rank of 2 threads (parax / parax)              [<= 1.0]
  (the plan parax-plan picks for tp=2: sequence-parallel)

    .venv/bin/python bench/vs_torch.py [--build build] [--rounds 3] [--only NAME] [--keep DIR]
"""

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))

CONFIG = {"model_type": "llama", "hidden_size": 1024, "intermediate_size": 2816, "num_hidden_layers": 4,
          "num_attention_heads": 8, "num_key_value_heads": 2, "vocab_size": 32000,
          "max_position_embeddings": 2048, "rms_norm_eps": 1e-5}
PREFILL, TRAIN, PROMPT, GENERATED, STEPS = 512, 256, 32, 32, 5
MPI_ENV = {"OMPI_ALLOW_RUN_AS_ROOT": "1", "OMPI_ALLOW_RUN_AS_ROOT_CONFIRM": "1",
           "OMPI_MCA_btl_vader_single_copy_mechanism": "none"}

# transformers' side: one script, the row's kind in argv; prints "ms X".
TORCH = r"""
import sys, time, statistics, numpy as np, torch, transformers
kind, folder, tokens, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
torch.set_num_threads(int(sys.argv[5]))
m = transformers.AutoModelForCausalLM.from_pretrained(folder, torch_dtype=torch.float32,
                                                      attn_implementation="sdpa")
ids = torch.tensor(np.load(tokens), dtype=torch.long)
times = []
if kind == "train":
    m.train()
    labels = torch.tensor(np.load(sys.argv[6]), dtype=torch.long)
    opt = torch.optim.AdamW(m.parameters(), lr=1e-4)
    for _ in range(steps):
        t = time.perf_counter()
        logits = m(ids).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter() - t)
else:
    m.eval()
    with torch.no_grad():
        if kind == "prefill":
            for _ in range(steps):
                t = time.perf_counter()
                m(ids, use_cache=False)
                times.append(time.perf_counter() - t)
        else:
            out = m(ids, use_cache=True)
            for _ in range(steps):
                tok = out.logits[:, -1:].argmax(-1)
                t = time.perf_counter()
                out = m(tok, past_key_values=out.past_key_values, use_cache=True)
                times.append(time.perf_counter() - t)
print(f"ms {statistics.median(times) * 1e3:.3f}")
"""


def sh(cmd, env, timeout=900):
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if out.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}\n{out.stdout[-2000:]}{out.stderr[-2000:]}")
    return out.stdout + out.stderr


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--build", default=os.path.join(ROOT, "build"))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--only", help="rows whose name contains this")
    parser.add_argument("--keep", metavar="DIR", help="build the models, weights and executables in DIR and keep "
                        "them (to profile a row by hand), instead of a temporary folder")
    args = parser.parse_args()
    import numpy as np
    from parax.checkpoint import random_weights, save_pretrained, save_safetensors
    from parax.models import build_model, load_config
    bin_ = os.path.join(args.build, "bin")
    blas = set()  # parax-run's GEMM kernels, as it reports them

    def env(threads):
        return dict(os.environ, **MPI_ENV, OMP_NUM_THREADS=str(threads))

    if args.keep:
        os.makedirs(args.keep, exist_ok=True)
    with tempfile.TemporaryDirectory() if not args.keep else contextlib.nullcontext(args.keep) as tmp:
        path = lambda name: os.path.join(tmp, name)
        with open(path("config.json"), "w") as f:
            json.dump(CONFIG, f)
        cfg = load_config(path("config.json"))
        weights = random_weights(cfg)
        save_safetensors(path("w.safetensors"), weights)
        save_pretrained(path("hf"), CONFIG, weights)
        rng = np.random.default_rng(0)

        def tokens(name, rows, cols):
            np.save(path(name), rng.integers(0, CONFIG["vocab_size"], (rows, cols)).astype(np.int32))
            return path(name)

        def compile_(name, passes=(), **built):
            with open(path(name + ".mlir"), "w") as f:
                f.write(build_model(cfg, dtype="f32", **built))
            ir = path(name + ".mlir")
            if passes:
                sh([os.path.join(bin_, "parax-opt"), ir, *passes, "-o", path(name + ".opt.mlir")], env(1))
                ir = path(name + ".opt.mlir")
            sh([os.path.join(bin_, "parax-translate"), "--to-executable", ir, "-o", path(name + ".pxe")], env(1))
            return path(name + ".pxe")

        def parax(exe, inputs, extra, ranks=1, threads=1):
            cmd = ["mpirun", "-np", str(ranks), "--bind-to", "none", "--oversubscribe"] if ranks > 1 else []
            cmd += [os.path.join(bin_, "parax-run"), exe, "--weights", path("w.safetensors")]
            for i in inputs:
                cmd += ["--input", i]
            text = sh(cmd + extra, env(threads))
            blas.update(re.findall(r"(oneDNN [0-9.]+ sgemm, [^,\n]*? kernels)", text))
            return float(re.search(r"step time ([0-9.]+) ms", text).group(1))

        def torch_(kind, toks, labels=None, threads=1, steps=STEPS):
            cmd = [sys.executable, "-c", TORCH, kind, path("hf"), toks, str(steps), str(threads)]
            return float(re.search(r"ms ([0-9.]+)", sh(cmd + ([labels] if labels else []), env(threads))).group(1))

        prefill_tokens = tokens("prefill.npy", 1, PREFILL)
        train_tokens, train_labels = tokens("train.npy", 1, TRAIN), tokens("labels.npy", 1, TRAIN)
        prompts = {rows: tokens(f"prompt{rows}.npy", rows, PROMPT) for rows in (1, 8)}
        prefill = compile_("prefill", batch=1, seq=PREFILL)
        steps = {rows: compile_(f"step{rows}", batch=rows, seq=1, cache=PROMPT + GENERATED) for rows in (1, 8)}
        train = compile_("train", ["--parax-autodiff"], batch=1, seq=TRAIN, loss=True)
        oracle = os.path.join(ROOT, "python", "parax", "oracle-cluster.json")
        tp2 = compile_("prefill-tp2", [f"--parax-plan=cluster={oracle}:devices_per_node=2 "
                                       f"workload=prefill:batch=1,seq={PREFILL},tp=2,pp=1,dp=1",
                                       "--parax-partition"], batch=1, seq=PREFILL)
        steps_arg = ["--steps", str(STEPS)]
        rows = [
            ("prefill 512 tokens, 1 thread", 0.8,
             lambda: parax(prefill, [prefill_tokens], steps_arg), lambda: torch_("prefill", prefill_tokens)),
            ("decode step, batch 1, 1 thread", 0.9,
             lambda: parax(steps[1], [prompts[1]], ["--generate", str(GENERATED)]),
             lambda: torch_("decode", prompts[1], steps=GENERATED)),
            ("decode step, batch 8, 1 thread", 0.9,
             lambda: parax(steps[8], [prompts[8]], ["--generate", str(GENERATED)]),
             lambda: torch_("decode", prompts[8], steps=GENERATED)),
            ("training step with AdamW, 256 tokens, 1 thread", 1.0,
             lambda: parax(train, [train_tokens, train_labels], steps_arg + ["--optimizer", "adamw"]),
             lambda: torch_("train", train_tokens, train_labels)),
            ("TP2 prefill: 2 ranks x 1 thread / 1 rank x 2 threads (parax / parax)", 1.0,
             lambda: parax(tp2, [prefill_tokens], steps_arg, ranks=2),
             lambda: parax(prefill, [prefill_tokens], steps_arg, threads=2)),
        ]
        rows = [r for r in rows if not args.only or args.only in r[0]]
        times = {name: ([], []) for name, *_ in rows}
        for round_ in range(args.rounds):
            for name, _, mine, theirs in rows:  # interleaved: each row's two sides back to back
                times[name][0].append(mine())
                times[name][1].append(theirs())
            print(f"round {round_ + 1} done", file=sys.stderr, flush=True)
    print(f"| workload | parax ms | other ms | ratio | target |")
    print("|---|---|---|---|---|")
    for name, target, *_ in rows:
        a, b = statistics.median(times[name][0]), statistics.median(times[name][1])
        print(f"| {name} | {a:.2f} | {b:.2f} | {a / b:.2f} | <= {target} {'(met)' if a / b <= target else ''} |")
    print(f"(medians of {args.rounds} interleaved rounds; parax-run's step is the median of its steps, "
          f"transformers' likewise; parax-run's GEMMs: {'; '.join(sorted(blas))})")


if __name__ == "__main__":
    main()
