"""GPU checks in two halves, so a GPU machine without the compiler can run
them: `prepare` (here: compiler + CPU runtime) compiles each case and stores
what the CPU backend and numpy compute; `check` (there: parax-run, mpirun,
numpy) runs the same executables with `--device cuda` and compares.

    python3 cuda_cases.py prepare DIR        # needs $PARAX_BUILD_DIR/bin/parax-opt etc.
    python3 cuda_cases.py check DIR [--bin BIN] [--json OUT.json] [--device cpu]
    python3 cuda_cases.py bench DIR [--bin BIN] [--json OUT.json]

test_cuda.py runs both halves in one process on a machine that has both.
Tolerance: 1e-4 absolute against the CPU backend and against numpy for fp32
programs (fp32 storage and math on both backends, no TF32); bf16 programs
(bf16 GEMMs on the GPU, fp32 math on the CPU) within 3 % of the largest
|output|.
"""

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))

TOL = 1e-4
# (Each process's mpiruns keep their session directories under a base of
# its own: Open MPI 4.1 removes /tmp/ompi.<host>.<uid> when a job ends, and
# a job of a test running beside it then fails to create its own there.)
_SESSIONS = tempfile.mkdtemp(prefix="parax-ompi-")
atexit.register(shutil.rmtree, _SESSIONS, True)
MPI_ENV = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMPI_MCA_btl_vader_single_copy_mechanism="none", OMP_NUM_THREADS="1",
               OMPI_MCA_rmaps_base_oversubscribe="1", OMPI_MCA_orte_tmpdir_base=_SESSIONS,
               # (When a rank exits with an error, mpirun sends the others
               # SIGTERM and waits this many seconds before SIGKILL: Open MPI
               # 4.1's default of 1 s cost each refused run 2 s.)
               OMPI_MCA_odls_base_sigkill_timeout="0",
               # (One machine: the point-to-point layer Open MPI 4.1 picks
               # here anyway, named, so that MPI_Init skips probing UCX and
               # the others first: a 2-rank job's start 0.31 -> 0.11 s.)
               OMPI_MCA_pml="ob1")

# DeepSeek-V3's weight-absorbed attention (the caches hold the latent), with
# widths that differ from each other (latent 24, no-rope keys 16, values 8):
# a per-head weight read the wrong way round cannot pass.
ABSORBED_MLA = {"mla": "absorbed", "overrides": {"kv_lora_rank": 24, "v_head_dim": 8}}

# name -> (preset, layers, batch, seq, loss, workload pins or None, ranks[, dtype[, past[,
# return_kv[, cache[, Model options]]]]]) (past: a step over a KV cache of that many tokens, their keys
# and values inputs; planned as decode at that context; return_kv: the step
# also returns its new keys and values, each result compared; cache: a
# generation step over caches of that capacity, run at position `past`)
CASES = {
    "llama": ("tiny-llama", None, 2, 8, False, None, 1),
    "gpt2": ("tiny-gpt2", None, 2, 8, False, None, 1),
    "mixtral": ("tiny-mixtral", None, 2, 8, False, None, 1),
    "qwen2-moe": ("tiny-qwen2-moe", None, 2, 8, False, None, 1),
    "deepseek-v3": ("tiny-deepseek-v3", None, 2, 8, False, None, 1),
    "llama-seq200": ("tiny-llama", None, 1, 200, False, None, 1),  # several key tiles
    "llama-loss": ("tiny-llama", None, 2, 8, True, None, 1),
    "llama-tp2": ("tiny-llama", None, 2, 8, False, "tp=2,dp=1", 2),
    "llama-pp2": ("tiny-llama", None, 2, 8, False, "pp=2,dp=1", 2),
    "llama-dp2": ("tiny-llama", None, 2, 8, False, "dp=2", 2),
    "llama-dp2-tp2-pp2": ("tiny-llama", None, 8, 8, False, "dp=2,tp=2,pp=2", 8),
    "llama-loss-tp2-pp2": ("tiny-llama", None, 2, 8, True, "tp=2,pp=2,dp=1", 4),
    "gpt2-tp2": ("tiny-gpt2", None, 2, 8, False, "tp=2,dp=1", 2),
    "mixtral-ep2-tp2": ("tiny-mixtral", None, 4, 8, False, "ep=2,tp=2,dp=1", 4),
    "qwen2-moe-ep2": ("tiny-qwen2-moe", None, 2, 8, False, "ep=2,dp=1", 2),
    "deepseek-v3-ep2": ("tiny-deepseek-v3", None, 2, 8, False, "ep=2,dp=1", 2),
    "deepseek-v3-tp2": ("tiny-deepseek-v3", None, 2, 8, False, "tp=2,dp=1", 2),
    # An expert capacity: each rank's dispatch holds 1.9 x its own pairs'
    # rows (its router sends one rank 30 of 32), filled member by member.
    "qwen2-moe-ep2-capacity": ("tiny-qwen2-moe", None, 2, 8, False, "ep=2,dp=1,capacity=1.9", 2),
    # Context parallelism: each rank 100 of 200 positions, keys and values
    # gathered; its queries' causal edge and RoPE offset by its piece (key
    # tiles cut mid-piece), on CUDA cores and (bf16) tensor cores; GPT-2's
    # position table with TP.
    "llama-cp2-seq200": ("tiny-llama", None, 1, 200, False, "cp=2,tp=1,dp=1", 2),
    "llama-bf16-cp2-seq200": ("tiny-llama", None, 1, 200, False, "cp=2,tp=1,dp=1", 2, "bf16"),
    "gpt2-cp2-tp2": ("tiny-gpt2", None, 2, 8, False, "cp=2,tp=2,dp=1", 4),
    # Sliding windows (37 keys over 100 positions: windows that begin
    # mid-tile), on CUDA cores, tensor cores (bf16), over a decode step's
    # cache and with the queries split over 2 ranks (CP2); Gemma 2's
    # soft-capped scores, with its local layers windowed too (their
    # gradients: the train-*-window cases).
    "mistral-window": ("tiny-mistral", None, 1, 100, False, None, 1, "f32", 0, False, 0,
                       {"overrides": {"sliding_window": 37}}),
    "mistral-bf16-window": ("tiny-mistral", None, 1, 100, False, None, 1, "bf16", 0, False, 0,
                            {"overrides": {"sliding_window": 37}}),
    "mistral-decode-window": ("tiny-mistral", None, 2, 1, False, None, 1, "f32", 100, False, 0,
                              {"overrides": {"sliding_window": 37}}),
    "mistral-window-cp2": ("tiny-mistral", None, 1, 100, False, "cp=2,tp=1,dp=1", 2, "f32", 0, False, 0,
                           {"overrides": {"sliding_window": 37}}),
    "gemma2-window": ("tiny-gemma2", None, 1, 100, False, None, 1, "f32", 0, False, 0,
                      {"overrides": {"sliding_window": 37}}),
    "gemma2-bf16-window": ("tiny-gemma2", None, 1, 100, False, None, 1, "bf16", 0, False, 0,
                           {"overrides": {"sliding_window": 37}}),
    # LongRoPE on half a head (Phi-4-mini's partial rotary): the factor on
    # the turning channels alone, in the rope kernel.
    "phi3-longrope-partial": ("tiny-phi3", None, 1, 32, False, None, 1, "f32", 0, False, 0,
                              {"overrides": {"original_max_positions": 16, "rotary_dim": 8,
                                             "rope_scaling": {"rope_type": "longrope",
                                                              "short_factor": [1.0, 1.2, 1.6, 2.5],
                                                              "long_factor": [1.0, 2.0, 4.0, 8.0]}}}),
    # Gemma 3: 1 + w norms and the embedding's scale, forward and backward.
    "gemma3": ("tiny-gemma3", None, 2, 8, False, None, 1),
    "gemma3-loss-tp2": ("tiny-gemma3", None, 2, 8, True, "tp=2,dp=1", 2),
    # bf16 storage throughout (GEMMs on tensor cores with fp32 accumulation,
    # every other op in fp32 math, each result rounded to bf16; collectives
    # in bf16): against the CPU backend's fp32 math from the same bf16
    # checkpoint within BF16_REL of the largest |logit| (or of the loss).
    "llama-bf16": ("tiny-llama", None, 2, 8, False, None, 1, "bf16"),
    "mixtral-bf16": ("tiny-mixtral", None, 2, 8, False, None, 1, "bf16"),
    "llama-bf16-tp2-pp2": ("tiny-llama", None, 2, 8, False, "tp=2,pp=2,dp=1", 4, "bf16"),
    "gpt2-bf16-tp2": ("tiny-gpt2", None, 2, 8, False, "tp=2,dp=1", 2, "bf16"),
    "qwen2-moe-bf16-ep2": ("tiny-qwen2-moe", None, 2, 8, False, "ep=2,dp=1", 2, "bf16"),
    "deepseek-v3-bf16-ep2": ("tiny-deepseek-v3", None, 2, 8, False, "ep=2,dp=1", 2, "bf16"),
    "llama-loss-bf16-dp2-tp2": ("tiny-llama", None, 4, 8, True, "dp=2,tp=2", 4, "bf16"),
    # Decode steps over a KV cache: attention split over the keys (300
    # cached keys: five chunks), KV heads split (tp2) and replicated (tp4),
    # MLA's value width, bf16, and three new tokens at once (a causal edge
    # inside the last chunk).
    "llama-decode": ("tiny-llama", None, 2, 1, False, None, 1, "f32", 300),
    "llama-decode-3": ("tiny-llama", None, 2, 3, False, None, 1, "f32", 125),
    "llama-decode-tp2": ("tiny-llama", None, 2, 1, False, "tp=2,dp=1", 2, "f32", 300),
    "llama-decode-tp4": ("tiny-llama", None, 2, 1, False, "tp=4,dp=1", 4, "f32", 300),
    "deepseek-v3-decode": ("tiny-deepseek-v3", None, 2, 1, False, None, 1, "f32", 70),
    "gpt2-decode-bf16": ("tiny-gpt2", None, 2, 1, False, None, 1, "bf16", 100),
    "llama-decode-return-kv-tp2-pp2": ("tiny-llama", None, 2, 1, False, "tp=2,pp=2,dp=1", 4, "f32", 300, True),
    # Generation steps (caches written in place at a run-time position,
    # rows beyond it noise no kernel may read): the split decode kernel
    # (chunks past the position empty), the tiled kernels on CUDA cores and
    # on tensor cores (8 new tokens), the position table read at the
    # position (GPT-2), MLA, and KV heads split over TP.
    "llama-cache-step": ("tiny-llama", None, 2, 1, False, None, 1, "f32", 200, False, 300),
    "llama-cache-step-8": ("tiny-llama", None, 2, 8, False, None, 1, "f32", 100, False, 300),
    "llama-cache-step-8-bf16": ("tiny-llama", None, 2, 8, False, None, 1, "bf16", 100, False, 300),
    "llama-cache-step-tp2": ("tiny-llama", None, 2, 1, False, "tp=2,dp=1", 2, "f32", 200, False, 300),
    "gpt2-cache-step-bf16": ("tiny-gpt2", None, 2, 1, False, None, 1, "bf16", 50, False, 64),
    "deepseek-v3-cache-step": ("tiny-deepseek-v3", None, 2, 1, False, None, 1, "f32", 30, False, 64),
    # the absorbed form: per-head GEMMs (strided batched, bf16) on a rank's
    # heads, the one latent KV head on every rank
    "deepseek-v3-absorbed-cache-step-bf16-tp2": ("tiny-deepseek-v3", None, 2, 1, False, "tp=2,dp=1", 2, "bf16", 30,
                                                 False, 64, ABSORBED_MLA),
}
# Generation loops (parax-run --generate, fp32): name -> (preset, batch,
# workload pins or None, ranks, cache capacity, prompt length, tokens to
# generate[, options]). Options: "chunk": P, --prefill with a program of
# that --seq sharing the step's weights and caches ("last_logits": built
# --last-logits); "run": parax-run's sampling options; "micro": the prompt's
# batches per replica (microbatches, each with its own caches); "ragged":
# each row's prompt length (shorter ones padded with -1); "model": Model
# options of both programs ("prefill_model": of the prefill's). The GPU's
# tokens must be the CPU backend's, and every position's logits within TOL
# of the CPU's and of numpy's (on those tokens; NaN where the prefill
# computed none, on both). The first runs 67 steps, crossing a 64-key tile
# of the decode kernel.
GENERATE = {
    "generate-llama": ("tiny-llama", 2, None, 1, 80, 60, 8),
    "generate-gpt2": ("tiny-gpt2", 2, None, 1, 24, 4, 8),
    "generate-llama-tp2-pp2": ("tiny-llama", 2, "tp=2,pp=2,dp=1", 4, 24, 4, 8),
    "generate-llama-prefill": ("tiny-llama", 2, None, 1, 80, 61, 8, {"chunk": 20}),
    "generate-deepseek-v3-prefill-tp2": ("tiny-deepseek-v3", 2, "tp=2,dp=1", 2, 32, 9, 6, {"chunk": 4}),
    "generate-llama-sampled": ("tiny-llama", 2, None, 1, 24, 4, 8, {"run": "--temperature 1.0 --top-k 10 --seed 3"}),
    # Prompt rows of several batches: one program (and KV caches) per
    # microbatch, borrowing microbatch 0's weights.
    "generate-llama-micro3": ("tiny-llama", 2, None, 1, 24, 4, 8, {"micro": 3}),
    "generate-llama-pp2-micro2-prefill": ("tiny-llama", 2, "pp=2,dp=1", 2, 24, 7, 6, {"chunk": 3, "micro": 2}),
    # A prefill whose logits are its last position's alone (a slice before
    # the final norm and the lm head).
    "generate-gpt2-tp2-prefill-last": ("tiny-gpt2", 2, "tp=2,dp=1", 2, 24, 9, 6, {"chunk": 4, "last_logits": True}),
    # Prompts of different lengths: rows still in their prompts take their
    # own tokens while the others generate; a row's logits end at its last
    # token (NaN after).
    "generate-llama-ragged-micro2-prefill": ("tiny-llama", 2, None, 1, 24, 9, 6,
                                             {"chunk": 3, "micro": 2, "ragged": [9, 4, 6, 3]}),
    # Unplanned GPT-2 slices its fused QKV weight once at prepare (moves of
    # parameters): the other programs of the rank take those slices from
    # the first instead of keeping copies.
    "generate-gpt2-micro2-prefill": ("tiny-gpt2", 2, None, 1, 24, 7, 4, {"chunk": 3, "micro": 2}),
    "generate-deepseek-v3-absorbed-tp2-prefill": ("tiny-deepseek-v3", 2, "tp=2,dp=1", 2, 32, 9, 6,
                                                  {"chunk": 4, "model": ABSORBED_MLA}),
    # the same caches written by a prefill of the explicit form's attention
    # (each cached latent expanded per head)
    "generate-deepseek-v3-absorbed-tp2-prefill-expanded": (
        "tiny-deepseek-v3", 2, "tp=2,dp=1", 2, 32, 9, 6,
        {"chunk": 4, "model": ABSORBED_MLA, "prefill_model": dict(ABSORBED_MLA, mla="expanded")}),
    # A sliding window of 37 keys over rings of its last 36 tokens: prefill
    # chunks of 20 (more than the ring holds: the last 36 kept) and steps
    # far past the ring's rows, over positions that wrap it twice; the
    # first chunk's window rows of negative position unseen; under TP2 too.
    "generate-mistral-ring-prefill": ("tiny-mistral", 2, None, 1, 96, 61, 24,
                                      {"chunk": 20, "model": {"overrides": {"sliding_window": 37}}}),
    "generate-mistral-ring-tp2-prefill": ("tiny-mistral", 2, "tp=2,dp=1", 2, 48, 9, 30,
                                          {"chunk": 4, "model": {"overrides": {"sliding_window": 37}}}),
}
BF16_REL = 3e-2
# Training steps (--parax-autodiff): name -> (preset, batch, seq, workload
# pins or None, ranks[, dtype[, parax-run options[, load-balancing loss
# weight[, {"micro": microbatches a replica, "layers": n}]]]]). The program
# returns the loss, then every parameter's gradient; each against the CPU
# backend's, the loss against numpy's too.
TRAIN = {
    "train-llama": ("tiny-llama", 2, 8, None, 1),
    "train-llama-tp2": ("tiny-llama", 2, 8, "tp=2,dp=1", 2),
    "train-llama-cp2-seq100": ("tiny-llama", 1, 100, "cp=2,tp=1,dp=1", 2),  # strided queries
    # the same in bf16: the attention gradient's tensor-core kernels with a
    # rank's 50 queries at every second position (stride 2) over 100 keys
    "train-llama-bf16-cp2-seq100": ("tiny-llama", 1, 100, "cp=2,tp=1,dp=1", 2, "bf16"),
    "train-llama-tp4": ("tiny-llama", 2, 8, "tp=4,dp=1", 4),  # KV heads replicated: head_axes
    # the same in bf16: the tensor-core gradient with a KV head no local
    # query head reads (its dK, dV zero on the rank)
    "train-llama-bf16-tp4": ("tiny-llama", 2, 8, "tp=4,dp=1", 4, "bf16"),
    "train-llama-tp2-pp2": ("tiny-llama", 2, 8, "tp=2,pp=2,dp=1", 4),  # gradients sent back a stage
    "train-llama-bf16-dp2-tp2": ("tiny-llama", 2, 8, "dp=2,tp=2", 4, "bf16"),
    "train-gpt2": ("tiny-gpt2", 2, 8, None, 1),  # biases, LayerNorms, GELU, positions, fused QKV
    # Sliding windows (37 keys over 100 positions) and Gemma 2's capped
    # scores (its local layers windowed too) through the attention's
    # gradient: CUDA cores, and tensor cores in bf16.
    "train-mistral-window-seq100": ("tiny-mistral", 1, 100, None, 1, "f32", [], 0.0,
                                    {"overrides": {"sliding_window": 37}}),
    "train-mistral-bf16-window-seq100": ("tiny-mistral", 1, 100, None, 1, "bf16", [], 0.0,
                                         {"overrides": {"sliding_window": 37}}),
    "train-gemma2-window-seq100": ("tiny-gemma2", 1, 100, None, 1, "f32", [], 0.0,
                                   {"overrides": {"sliding_window": 37}}),
    "train-gemma2-bf16-window-seq100": ("tiny-gemma2", 1, 100, None, 1, "bf16", [], 0.0,
                                        {"overrides": {"sliding_window": 37}}),
    "train-gpt2-cp2-tp2": ("tiny-gpt2", 2, 8, "cp=2,tp=2,dp=1", 4),
    # ignore_index -100 (a prompt's and padding's labels): the count of the
    # others every rank's, the loss their mean (labels dealt out over cp)
    "train-llama-bf16-ignored-cp2-tp2": ("tiny-llama", 2, 8, "cp=2,tp=2,dp=1", 4, "bf16", [], 0.0,
                                         {"ignore_index": -100}),
    # Mixture of experts: the router's and the experts' gradients; under EP
    # dy dispatched, dx and the router weights' gradients combined back.
    "train-mixtral-ep2": ("tiny-mixtral", 2, 8, "ep=2,dp=1", 2),
    "train-mixtral-bf16-ep2": ("tiny-mixtral", 2, 8, "ep=2,dp=1", 2, "bf16"),
    "train-mixtral-bf16-ep2-capacity": ("tiny-mixtral", 2, 8, "ep=2,dp=1,capacity=1.5", 2, "bf16"),
    # with a load-balancing loss: the load (f32 counts) all-reduced over ep
    "train-mixtral-bf16-aux-ep2": ("tiny-mixtral", 2, 8, "ep=2,dp=1", 2, "bf16", [], 0.5),
    # DeepSeek-V3's sequence-wise balance loss: a load row per sequence, each
    # rank's own sequence whole under ep (normalised sigmoid scores)
    "train-deepseek-v3-bf16-seq-aux-ep2": ("tiny-deepseek-v3", 2, 8, "ep=2,dp=1", 2, "bf16", [], 0.5,
                                           {"overrides": {"sequence_aux": True}}),
    "train-deepseek-v3": ("tiny-deepseek-v3", 2, 8, None, 1),  # sigmoid router, groups, bias; MLA
    # multi-token prediction (one depth, weight 0.3): the shifted tokens and
    # labels, a weighted loss and its gradient, the shared embedding and
    # head; under ep each rank's sequences
    "train-deepseek-v3-bf16-mtp-ep2": ("tiny-deepseek-v3", 2, 8, "ep=2,dp=1", 2, "bf16", [], 0.0,
                                       {"mtp_weight": 0.3}),
    # its auxiliary-loss-free balancing: the router biases moved after step
    # 1 (0.5: enough to change step 2's routing, whose loss and gradients
    # are compared)
    "train-deepseek-v3-bias": ("tiny-deepseek-v3", 2, 8, None, 1, "f32",
                               ["--optimizer", "sgd", "--lr", "0.1", "--bias-update-speed", "0.5"]),
    # Optimizer steps (parax-run --optimizer): two steps, the second's loss
    # and gradients compared, so the first's update (on the device: fp32
    # master copies and moments there, the parameters rounded from them,
    # the moves of parameters run again: GPT-2's fused QKV slices) must
    # match the CPU backend's.
    "train-gpt2-sgd": ("tiny-gpt2", 2, 8, None, 1, "f32", ["--optimizer", "sgd", "--lr", "0.5"]),
    "train-llama-adamw-tp2-pp2": ("tiny-llama", 2, 8, "tp=2,pp=2,dp=1", 4, "f32",
                                  ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3", "--clip-grad-norm", "1"]),
    "train-llama-bf16-adamw-dp2-tp2-zero": ("tiny-llama", 2, 8, "dp=2,tp=2", 4, "bf16",
                                            ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3", "--zero"]),
    # three replicas: no box of the tiny Llama is a multiple of 3 (ZeRO's
    # chunks padded, the last replica's shorter, the new values gathered
    # through a padded staging box)
    "train-llama-adamw-dp3-zero": ("tiny-llama", 1, 8, "dp=3,tp=1", 3, "f32",
                                   ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3", "--zero",
                                    "--weight-decay", "0.1"]),
    # ZeRO-2: the gradient sums kept as each rank's chunk, every
    # microbatch's gradients reduce-scattered into them (the running sums
    # added to the rank's own block first: test_device_optimizer's two
    # microbatches a step); the norms' state and sums split over dp x tp
    # (replicated over tp), the matrices' over dp.
    "train-llama-bf16-adamw-dp2-tp2-zero2": ("tiny-llama", 2, 8, "dp=2,tp=2", 4, "bf16",
                                             ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3",
                                              "--zero-stage", "2"]),
    # Context parallelism: every gradient a partial sum over cp, returned
    # so; the device optimizer sums each microbatch's as it is written and
    # all-reduces the step's sums over cp (buckets over the cp group, the
    # mean divided by the microbatches alone); with ZeRO-2 over dp x cp
    # (each microbatch reduce-scattered over the four ranks holding the
    # box, the mean divided by the two replicas).
    "train-llama-adamw-cp2-micro2": ("tiny-llama", 2, 8, "cp=2,tp=1,dp=1", 2, "f32",
                                     ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3"], 0.0,
                                     {"micro": 2}),
    "train-llama-bf16-adamw-dp2-cp2-zero2": ("tiny-llama", 2, 8, "dp=2,cp=2,tp=1", 4, "bf16",
                                             ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3",
                                              "--zero-stage", "2"]),
    # ZeRO-3: the parameters kept as chunks, each gathered before the
    # instructions that read it (forward and backward apart)
    "train-llama-bf16-adamw-dp2-tp2-zero3": ("tiny-llama", 2, 8, "dp=2,tp=2", 4, "bf16",
                                             ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3",
                                              "--zero-stage", "3"]),
    # without dp: the dense weights' over ep, the experts' not split (each
    # rank holds its own)
    "train-mixtral-adamw-ep2-zero2": ("tiny-mixtral", 2, 8, "ep=2,dp=1", 2, "f32",
                                      ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3", "--zero-stage", "2"]),
    "train-qwen2-moe-adamw-ep2-tp2": ("tiny-qwen2-moe", 2, 8, "ep=2,tp=2,dp=1", 4, "f32",
                                      ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3"]),
    # Pipeline stages over several microbatches: 1F1B, each microbatch in
    # flight in an activation set of its own, a stage's trailing sends
    # grouped with the next half's leading receives (the emulator's sends
    # wait for their receives, as NCCL's may: apart, neighbours deadlock).
    # Four stages: the middle ones receive and send in both halves.
    "train-llama-pp4-micro6": ("tiny-llama", 1, 8, "pp=4,dp=1", 4, "f32", [], 0.0, {"micro": 6, "layers": 4}),
    # the device optimizer summing the backward halves' gradients
    "train-llama-bf16-adamw-dp2-pp2-micro3": ("tiny-llama", 1, 8, "dp=2,pp=2", 4, "bf16",
                                              ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3"], 0.0,
                                              {"micro": 3}),
    # --per-token-loss: each microbatch's losses and gradients over the
    # step's count of labels (ignore_index), the device optimizer's sums
    "train-llama-adamw-ignored-per-token-dp2-micro2": ("tiny-llama", 2, 8, "dp=2", 2, "f32",
                                                       ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3",
                                                        "--per-token-loss"], 0.0,
                                                       {"micro": 2, "ignore_index": -100}),
    # experts' all-to-alls inside the halves
    "train-mixtral-ep2-pp2-micro2": ("tiny-mixtral", 2, 8, "ep=2,pp=2,dp=1", 4, "f32", [], 0.0, {"micro": 2}),
    # a tied weight on both stages (multi-token prediction's embedding and
    # head; GPT-2's embedding): each stage returns its part of the
    # gradient, the parts added once the step's microbatches have run
    "train-deepseek-v3-mtp-pp2-micro3": ("tiny-deepseek-v3", 2, 8, "pp=2,dp=1", 2, "f32", [], 0.0,
                                         {"micro": 3, "mtp_weight": 0.3}),
    # ... over four stages (the first and the last hold it)
    "train-gpt2-pp4-micro4": ("tiny-gpt2", 1, 8, "pp=4,dp=1", 4, "f32", [], 0.0, {"micro": 4, "layers": 4}),
    # ... under interleaved 1F1B (the head on virtual stage 3, the
    # embedding on 0); with the device optimizer, the parts exchanged and
    # added on the GPU after the data-parallel all-reduce (ZeRO-2: each
    # rank's chunk of the sums)
    "train-gpt2-pp2-chunks2-micro4": ("tiny-gpt2", 1, 8, "pp=2,dp=1,schedule=interleaved,chunks=2", 2, "f32", [],
                                      0.0, {"micro": 4, "layers": 4}),
    "train-gpt2-adamw-dp2-pp2-chunks2-micro2": ("tiny-gpt2", 1, 8, "dp=2,pp=2,schedule=interleaved,chunks=2", 4,
                                                "f32", ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3"],
                                                0.0, {"micro": 2, "layers": 4}),
    "train-gpt2-bf16-adamw-dp2-pp2-zero2-micro2": ("tiny-gpt2", 1, 8, "dp=2,pp=2", 4, "bf16",
                                                   ["--optimizer", "adamw", "--lr", "1e-2", "--eps", "1e-3",
                                                    "--zero-stage", "2"], 0.0, {"micro": 2}),
    # Interleaved 1F1B: each step's receives (a forward and a backward
    # range's) in one group with the step before's sends; four stages of
    # two chunks each, the last chunk's activations wrapping to stage 0.
    "train-llama-pp4-chunks2-micro8": ("tiny-llama", 1, 8, "pp=4,dp=1,schedule=interleaved,chunks=2", 4, "f32", [],
                                       0.0, {"micro": 8, "layers": 8}),
    # the device optimizer: each backward range's gradients summed, the
    # last microbatch's reduced over the replicas range by range
    "train-llama-bf16-adamw-dp2-pp2-chunks2-micro4": ("tiny-llama", 1, 8, "dp=2,pp=2,schedule=interleaved,chunks=2",
                                                      4, "bf16", ["--optimizer", "adamw", "--lr", "1e-2", "--eps",
                                                                  "1e-3"], 0.0, {"micro": 4, "layers": 4}),
}

OP_TOL = 1e-5  # one-op cases, relative to the largest |output|
OP_TOL_BF16 = 1e-2


def _run(cmd, timeout=300, env=None):
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if proc.returncode != 0:
        raise RuntimeError(" ".join(cmd) + "\n" + proc.stdout + proc.stderr)
    return proc


def parax_run(bin_dir, weights, exe, ranks, inputs, output, device, steps=1, timeout=300,
              tool="parax-run", env=None, launcher=False, more_outputs=(), generate=0, extra=()):
    # One rank runs without a launcher (parax-run then skips MPI), unless
    # `launcher` (then the CUDA backend gets a one-rank NCCL communicator).
    launcher = [] if ranks == 1 and not launcher else ["mpirun", "-np", str(ranks), "--oversubscribe",
                                                        "--bind-to", "none"]
    cmd = launcher + [os.path.join(bin_dir, tool), exe, "--weights", weights,
                      "--output", output, "--device", device]
    cmd += ["--generate", str(generate)] if generate else ["--steps", str(steps)]
    cmd += list(extra)
    for path in inputs:
        cmd += ["--input", path]
    for path in more_outputs:  # the executable's further results, in order
        cmd += ["--output", path]
    proc = _run(cmd, timeout=timeout, env=dict(MPI_ENV, **(env or {})))
    return np.load(output), proc.stdout + proc.stderr


def prepare(name, root):
    """Compiles case `name` under root/name; stores the CPU and numpy results
    (with the tools of $PARAX_BUILD_DIR, default build/, as the tests do)."""
    from conftest import Model, replicas  # the compiler half: pytest's helpers
    preset, layers, batch, seq, loss, pins, ranks, *rest = CASES[name]
    dtype = rest[0] if rest else "f32"
    past = rest[1] if len(rest) > 1 else 0
    return_kv = rest[2] if len(rest) > 2 else False
    cache = rest[3] if len(rest) > 3 else 0
    options = rest[4] if len(rest) > 4 else {}
    case_dir = os.path.join(root, name)
    os.makedirs(case_dir, exist_ok=True)
    dp = replicas(pins)  # data-parallel replicas take their own rows: the inputs hold dp batches
    model = Model(case_dir, preset, layers=layers, batch=batch, seq=seq, loss=loss, dtype=dtype,
                  past=past, return_kv=return_kv, rows=batch * dp, cache=cache, **options)
    single = model.compile("single")
    outputs = 1 + 2 * model.cfg.layers if return_kv else 1
    cpu, *more = model.run(single, 1, outputs=outputs) if return_kv else [model.run(single, 1)]
    for k, extra in enumerate(more, 1):  # the new keys and values: against the CPU backend
        np.save(os.path.join(case_dir, f"cpu{k}.npy"), extra)
    ref = np.float32(model.reference_loss()) if loss else model.reference()
    workload = (f"decode:batch={batch * dp},context={cache or past}" if past else
                f"prefill:batch={batch * dp},seq={seq}")
    exe = single if pins is None else model.compile("sharded", f"{workload},{pins}", ranks)
    np.save(os.path.join(case_dir, "cpu.npy"), cpu)
    np.save(os.path.join(case_dir, "numpy.npy"), ref)
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        tol = TOL if dtype == "f32" else BF16_REL * float(np.abs(cpu).max())
        json.dump({"exe": os.path.basename(exe), "ranks": ranks, "tolerance": tol, "outputs": outputs,
                   "inputs": [os.path.basename(p) for p in model.inputs]}, f)


def prepare_generate(name, root):
    """Generation case `name`: its executable, prompt, and what the CPU
    backend generates (tokens, each step's logits) and numpy computes on
    those tokens."""
    from conftest import Model, replicas
    from parax import reference
    preset, batch, pins, ranks, capacity, prompt_len, new, *rest = GENERATE[name]
    more = rest[0] if rest else {}
    options = more.get("run", "").split()
    micro = more.get("micro", 1)  # the prompt's batches per replica
    case_dir = os.path.join(root, name)
    os.makedirs(case_dir, exist_ok=True)
    dp = replicas(pins)
    workload = None if pins is None else f"decode:batch={batch * dp},context={capacity},{pins}"
    model = Model(case_dir, preset, batch=batch, seq=1, cache=capacity, **more.get("model", {}))
    exe = model.compile("step", workload, ranks)
    prefill = None
    if "chunk" in more:  # in the case's directory: the executables travel, the rest is made again
        chunked = Model(os.path.join(case_dir, "chunk"), preset, batch=batch, seq=more["chunk"], cache=capacity,
                        last_logits=more.get("last_logits", False),
                        **more.get("prefill_model", more.get("model", {})))
        os.replace(chunked.compile("prefill", workload, ranks), os.path.join(case_dir, "prefill.pxe"))
        prefill = os.path.join(case_dir, "prefill.pxe")
        import shutil
        shutil.rmtree(chunked.dir)
    prompt = np.random.default_rng(5).integers(0, model.cfg.vocab, (batch * dp * micro, prompt_len))
    lengths = more.get("ragged", [prompt_len] * len(prompt))
    for row, length in enumerate(lengths):
        prompt[row, length:] = -1
    tokens, logits = model.generate(exe, ranks, prompt, new, prefill=prefill, extra=options)
    np.save(os.path.join(case_dir, "cpu_tokens.npy"), tokens)
    np.save(os.path.join(case_dir, "cpu.npy"), logits)
    expected = np.full(logits.shape, np.nan)  # each row on its own tokens, up to its last
    for row, length in enumerate(lengths):
        end = length + new
        expected[row, :end - 1] = reference.forward(model.cfg, model.weights, tokens[row:row + 1, :end - 1])[0]
    np.save(os.path.join(case_dir, "numpy.npy"), expected)
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        json.dump({"exe": os.path.basename(exe), "ranks": ranks, "tolerance": TOL, "generate": new,
                   "inputs": ["prompt.npy"], "prefill": "prefill.pxe" if prefill else None,
                   "options": options, "micro": micro}, f)


def prepare_train(name, root):
    """Training case `name`: its executable (the loss and the gradients), and
    the CPU backend's results and numpy's loss."""
    import re
    from conftest import Model, replicas
    preset, batch, seq, pins, ranks, *rest = TRAIN[name]
    dtype = rest[0] if rest else "f32"
    options = rest[1] if len(rest) > 1 else []  # an optimizer's: two steps, as check runs
    aux = rest[2] if len(rest) > 2 else 0.0  # an MoE's load-balancing loss weight
    more = rest[3] if len(rest) > 3 else {}
    micro = more.get("micro", 1)
    case_dir = os.path.join(root, name)
    os.makedirs(case_dir, exist_ok=True)
    dp = replicas(pins)
    model = Model(case_dir, preset, layers=more.get("layers"), batch=batch, seq=seq, loss=True, dtype=dtype,
                  rows=batch * dp * micro, aux_loss=aux, overrides=more.get("overrides"),
                  ignore_index=more.get("ignore_index"), mtp_weight=more.get("mtp_weight"))
    # The CPU backend runs the same executable (a plan's gradients may be
    # pieces of fused tensors; test_training.py checks them against one rank).
    # (a training workload for a schedule's pins: interleaved chunks)
    workload = (f"train:batch={batch * dp * micro},seq={seq},mbs={batch},{pins}" if "schedule=" in (pins or "")
                else f"prefill:batch={batch * dp},seq={seq},{pins}")
    exe = model.compile("single", autodiff=True) if pins is None else model.compile(
        "sharded", workload, ranks, autodiff=True)
    with open(exe.replace(".pxe", ".mlir")) as f:  # partitioned: each result numbered (stages return some each)
        text = f.read()
    numbered = [int(k) for k in re.findall(r"parax\.result = (\d+)", text)]
    outputs = 1 + (max(numbered) if numbered else len(re.findall(r"parax\.grad = ", text)))
    cpu, *grads = model.run(exe, ranks, outputs=outputs, extra=options + ["--steps", "2"] if options else ())
    for k, grad in enumerate(grads, 1):
        np.save(os.path.join(case_dir, f"cpu{k}.npy"), grad)
    np.save(os.path.join(case_dir, "cpu.npy"), cpu)
    np.save(os.path.join(case_dir, "numpy.npy"), np.float32(model.reference_loss()))
    largest = max(float(np.abs(g).max()) for g in grads)
    with open(os.path.join(case_dir, "case.json"), "w") as f:  # (bf16: the loss's, the gradients')
        json.dump({"exe": os.path.basename(exe), "ranks": ranks, "outputs": outputs,
                   "tolerance": TOL if dtype == "f32" else BF16_REL * float(abs(cpu)),
                   "more_tolerance": TOL if dtype == "f32" else BF16_REL * largest,
                   # (after an optimizer step numpy's loss, at the first weights, is no reference)
                   "numpy": not options,
                   "options": options, "inputs": [os.path.basename(p) for p in model.inputs],
                   "micro": micro}, f)


def prepare_op(case, root, bin_dir):
    """One-op case `case` (cuda_ops.py) under root/op-<case>: its executable,
    inputs, weights and the CPU backend's result."""
    import cuda_ops
    from parax.checkpoint import save_safetensors
    case_dir = os.path.join(root, "op-" + case)
    os.makedirs(case_dir, exist_ok=True)
    ir, exe = os.path.join(case_dir, "op.mlir"), os.path.join(case_dir, "op.pxe")
    with open(ir, "w") as f:
        f.write(cuda_ops.mlir(case))
    _run([os.path.join(bin_dir, "parax-translate"), "--to-executable", ir, "-o", exe])
    inputs, params = cuda_ops.values(case)
    names = []
    for i, v in enumerate(inputs):
        names.append(f"input{i}.npy")
        np.save(os.path.join(case_dir, names[-1]), v)
    bf16 = cuda_ops.is_bf16(case)
    save_safetensors(os.path.join(case_dir, "weights.safetensors"), params, dtype="bf16" if bf16 else "f32")
    cpu, _ = parax_run(bin_dir, os.path.join(case_dir, "weights.safetensors"), exe, 1,
                       [os.path.join(case_dir, n) for n in names],
                       os.path.join(case_dir, "cpu.npy"), "cpu")
    with open(os.path.join(case_dir, "case.json"), "w") as f:
        # fp32: only the order of the sums differs; bf16: the GPU rounds
        # each result to bf16 (the CPU backend keeps fp32).
        json.dump({"exe": "op.pxe", "ranks": 1, "inputs": names, "numpy": False,
                   "launcher": cuda_ops.is_collective(case),
                   "tolerance": (OP_TOL_BF16 if bf16 else OP_TOL) * max(1.0, float(np.abs(cpu).max()))}, f)


def is_multi_rank(name, root):
    """Whether prepared case `name` runs on several ranks (or, one-op, under
    mpirun): whether it has collectives."""
    with open(os.path.join(root, name, "case.json")) as f:
        case = json.load(f)
    return case["ranks"] > 1 or case.get("launcher", False)


def all_cases():
    """Model cases, then one-op cases (named op-<case>)."""
    import cuda_ops
    return list(CASES) + list(GENERATE) + list(TRAIN) + ["op-" + c for c in cuda_ops.cases()]


def prepare_any(name, root, bin_dir):
    if name.startswith("op-"):
        prepare_op(name[3:], root, bin_dir)
    elif name in GENERATE:
        prepare_generate(name, root)
    elif name in TRAIN:
        prepare_train(name, root)
    else:
        prepare(name, root)


def check(name, root, bin_dir, device="cuda", tool="parax-run", env=None, timeout=300):
    """Runs case `name` on the GPU; returns its figures (raises on a failed run).
    (`device="cpu"` checks the harness itself on a machine without a GPU;
    `tool="parax-run-simt"` runs the CUDA backend on the SIMT emulator.)"""
    case_dir = os.path.join(root, name)
    with open(os.path.join(case_dir, "case.json")) as f:
        case = json.load(f)
    # Two steps: the second replays the step as a CUDA graph where the stage
    # allows it (one rank, no collectives), and its output is the one compared.
    # A generation case writes its tokens, then every step's logits.
    generate = case.get("generate", 0)
    more = [os.path.join(case_dir, f"gpu{k}.npy") for k in range(1, case.get("outputs", 1))]
    first = os.path.join(case_dir, "gpu.npy")
    if generate:
        first, more = os.path.join(case_dir, "gpu_tokens.npy"), [first]
    gpu, log = parax_run(bin_dir, os.path.join(case_dir, "weights.safetensors"),
                         os.path.join(case_dir, case["exe"]), case["ranks"],
                         [os.path.join(case_dir, p) for p in case["inputs"]],
                         first, device, steps=2,
                         timeout=timeout, tool=tool, env=env, launcher=case.get("launcher", False),
                         more_outputs=more, generate=generate,
                         extra=(["--prefill", os.path.join(case_dir, case["prefill"])] if case.get("prefill") else [])
                         + case.get("options", []))
    same_tokens = True
    if generate:
        same_tokens = bool(np.array_equal(gpu, np.load(os.path.join(case_dir, "cpu_tokens.npy"))))
        gpu, more = np.load(more[0]), []
    cpu = np.load(os.path.join(case_dir, "cpu.npy"))
    # One-op cases have no numpy result: the CPU backend stands for it (it is
    # checked against numpy model by model in the numerics suite).
    ref = np.load(os.path.join(case_dir, "numpy.npy")) if case.get("numpy", True) else cpu
    if gpu.shape != cpu.shape or gpu.dtype != cpu.dtype:
        raise RuntimeError(f"{name}: GPU output {gpu.dtype}{gpu.shape}, CPU {cpu.dtype}{cpu.shape}")
    # NaN where the CPU computed nothing (a --last-logits prefill's other
    # positions) must be NaN on the GPU too; any other NaN fails the case.
    skipped = np.isnan(cpu)
    computed = ~skipped
    def largest(diff):
        return float(diff[computed].max(initial=0.0))
    vs_cpu = largest(np.abs(gpu.astype(np.float64) - cpu))
    vs_numpy = largest(np.abs(gpu.astype(np.float64) - ref))
    if not np.array_equal(np.isnan(gpu), skipped):
        vs_cpu = float("inf")
    tol = case["tolerance"]
    first_ok = vs_cpu < tol
    more_ok = True  # further results (new keys and values, gradients): against the CPU's
    for k, path in enumerate(more, 1):
        extra, want = np.load(path), np.load(os.path.join(case_dir, f"cpu{k}.npy"))
        if extra.shape != want.shape:
            raise RuntimeError(f"{name}: GPU result {k} {extra.shape}, CPU {want.shape}")
        diff = float(np.abs(extra.astype(np.float64) - want).max())
        diff = float("inf") if np.isnan(diff) else diff  # (max() would drop a NaN)
        vs_cpu = max(vs_cpu, diff)
        more_ok = more_ok and diff < case.get("more_tolerance", tol)
    # Optimizer steps on the CUDA backend run on the device.
    device_optimizer = "optimizer on the device" in log
    return {"case": name, "ranks": case["ranks"], "max_abs_vs_cpu": vs_cpu,
            "max_abs_vs_numpy": vs_numpy, "tolerance": tol,
            "ok": (first_ok and more_ok and vs_numpy < tol and same_tokens and
                   (device_optimizer or device != "cuda" or "--optimizer" not in case.get("options", []))),
            "device_optimizer": device_optimizer,
            "same_tokens": same_tokens,
            "host_staged": "host memory and MPI" in log, "cuda_graph": "as one CUDA graph" in log,
            # (ranks sharing a GPU under PARAX_COLLECTIVES=nccl: how, and NCCL's version)
            "collectives_note": next((l for l in log.splitlines() if "PARAX_COLLECTIVES=nccl" in l), ""),
            "graph_refused": "no CUDA graph" in log, "overlap": overlapping(log), "profile_ms": profile_of(log),
            "hoisted": hoisted(log), "temporaries": temporaries_of(log),
            "cache_in_place": _counted(log, "KV-cache concat(s) read in place by attention"),
            "attention_path": attention_path(log),
            "cache_writes_in_place": _counted(log, "KV cache(s) written in place"),
            "shared_parameters": _shared_parameters(log), "step_parameters": _counted(log, "parameter(s) and"),
            "shared_caches": _counted(log, "KV cache(s) shared with the prefill program"),
            "microbatch_shared": _counted(log, "parameter(s) of microbatch 0 shared"),
            "borrowing_temporaries": _counted(log, "program(s) running in another's temporary memory"),
            "shared_moves": _counted(log, "result(s) of parameter moves shared with another program"),
            "micro": case.get("micro", 1),
            "in_flight": in_flight(log), "activation_sets": _counted(log, "activation sets a rank"),
            "early_reductions": _counted(log, "gradient reduction(s) issued during the backward pass"),
            "nccl": case.get("launcher", False) or (case["ranks"] > 1 and "host memory and MPI" not in log)}


def _shared_parameters(log):
    """The step's parameters in its prefill program's memory ("N of M
    parameter(s) and ... shared with the prefill program"; 0: absent)."""
    import re
    m = re.search(r"(\d+) of \d+ parameter\(s\) and", log)
    return int(m.group(1)) if m else 0


def attention_path(log):
    """How parax-run says the attention ops ran: (ops through cuDNN, ops,
    what it says of the rest: the first op on parax's kernels and why, an
    op cuDNN failed at run time; None if nothing), or None without
    attention ops."""
    import re
    m = re.search(r"attention: (\d+) of (\d+) op\(s\) through cuDNN(?: [0-9.]+)?(.*)$", log, re.M)
    if not m:
        return None
    rest = re.sub(r"^, the rest on parax's kernels \((.*)\)$", r"\1", m.group(3).strip())
    return int(m.group(1)), int(m.group(2)), rest or None


def _counted(log, what):
    """The number parax-run's summary line puts before `what` (0: absent)."""
    import re
    m = re.search(r"(\d+) " + re.escape(what), log)
    return int(m.group(1)) if m else 0


def in_flight(log):
    """Microbatches stage 0 holds at once under a 1F1B, GPipe or interleaved
    1F1B schedule (0: no schedule)."""
    import re
    m = re.search(r"schedule [\w ]+(?:\(\d+ model chunks a stage\) )?over \d+ microbatches "
                  r"\((\d+) in flight on stage 0\)", log)
    return int(m.group(1)) if m else 0


def hoisted(log):
    """Parameter moves the writer rank ran once at prepare."""
    return _counted(log, "parameter move(s) run once at prepare")


def overlapping(log):
    """Instructions the writer rank issued while a collective ran."""
    return _counted(log, "instruction(s) overlapping collectives")


def temporaries_of(log):
    """parax-run's device memory for temporaries: bytes of the shared arena,
    of the most live at once (the lower bound), of one allocation each, and
    how many more were written in an operand's memory."""
    import re
    m = re.search(r"temporaries share (\d+) bytes \(live at once: (\d+), one allocation each: (\d+); "
                  r"(\d+) more written in place\)", log)
    return dict(zip(("arena_bytes", "live_bytes", "unshared_bytes", "in_place"), map(int, m.groups()))) if m else {}


def step_ms_of(log):
    """parax-run's median step time."""
    return float(log.split("step time ")[1].split(" ms")[0])


def _bench_block():
    """The bench's weight values: one random block of 2^20, tiled (timing
    does not depend on the values; gigabytes of fresh normals took a minute)."""
    return 0.02 * np.random.default_rng(0).standard_normal(1 << 20, dtype=np.float32)


# --- performance (figures, not pass/fail) ------------------------------------

# name -> (preset, layers, batch, seq, dtype, tokens in the KV cache[, cache
# capacity: a generation step at position `tokens`, its caches written in
# place, against the decode step whose cache is joined by a concat])
BENCH = {
    "llama3-8b-1layer-prefill2048": ("llama3-8b", 1, 1, 2048, "f32", 0),
    "llama3-8b-1layer-decode-ctx4096": ("llama3-8b", 1, 1, 1, "f32", 4096),
    "llama3-8b-1layer-prefill2048-bf16": ("llama3-8b", 1, 1, 2048, "bf16", 0),
    "llama3-8b-1layer-decode-ctx4096-bf16": ("llama3-8b", 1, 1, 1, "bf16", 4096),
    "llama3-8b-1layer-decode8-ctx4096-bf16": ("llama3-8b", 1, 8, 1, "bf16", 4096),
    "llama3-8b-1layer-decode-generate-ctx4096-bf16": ("llama3-8b", 1, 1, 1, "bf16", 4096, 4097),
    "llama3-8b-1layer-decode8-generate-ctx4096-bf16": ("llama3-8b", 1, 8, 1, "bf16", 4096, 4097),
}


# A whole generation loop (parax-run --generate --prefill): name -> (preset,
# layers, batch, dtype, prompt length = the prefill's chunk (built
# --last-logits), tokens to generate[, microbatches[, DeepSeek-V3's
# attention form]]). Prefill time, the steps' median, tokens/s, and what
# the step borrowed of the prefill program's memory.
DEEPSEEK_ATTENTION = os.path.join(ROOT, "bench", "configs", "deepseek-v3-attention-1layer.json")
BENCH_GENERATE = {
    "llama3-8b-1layer-generate8-prompt2048-bf16": ("llama3-8b", 1, 8, "bf16", 2048, 64),
    # 16 rows in one batch, and as 2 microbatches of 8 (a 7th element: the
    # microbatches), each with its own caches, both reading the weights:
    # the trade-off the planner weighs for inference (docs/cost-model.md).
    "llama3-8b-1layer-generate16-prompt512-bf16": ("llama3-8b", 1, 16, "bf16", 512, 64),
    "llama3-8b-1layer-generate2x8-prompt512-bf16": ("llama3-8b", 1, 8, "bf16", 512, 64, 2),
    # DeepSeek-V3's attention at its widths (one dense layer, a small
    # vocabulary), explicit and weight-absorbed (its caches 71x smaller;
    # its attention over 576/512-wide heads, 128 of them over one latent).
    "deepseek-v3-attention-generate8-prompt2048-bf16": (DEEPSEEK_ATTENTION, 1, 8, "bf16", 2048, 64, 1, "explicit"),
    "deepseek-v3-attention-absorbed-generate8-prompt2048-bf16": (DEEPSEEK_ATTENTION, 1, 8, "bf16", 2048, 64, 1,
                                                                 "absorbed"),
}


def kv_values_per_token(cfg, mla="explicit"):
    """Values a token's KV cache holds a layer: keys and values of every KV
    head, DeepSeek-V3's every head's (192 + 128), or its one latent row
    (576) in the absorbed form."""
    if cfg.family == "deepseek_v3":
        if mla == "absorbed":
            return cfg.kv_lora_rank + cfg.qk_rope_dim
        return cfg.heads * (cfg.qk_nope_dim + cfg.qk_rope_dim + cfg.v_head_dim)
    return 2 * cfg.kv_heads * cfg.head_dim


# One op alone: name -> ((batch, seq, heads, kv heads, head width, keys),
# dtype, PARAX_ATTENTION), causal attention with Llama-3-8B's shapes: fp32
# (CUDA cores), bf16 through cuDNN's SDPA (the default where it takes the
# shape), bf16 on parax's tensor-core kernel (kernels) and on CUDA cores,
# at 2,048 and 8,192 tokens (PyTorch's SDPA backends on the same shapes:
# bench/gpu/torch_attention.py); a decode step over 4096 cached keys split
# over the keys, and not (at batch 1 the unsplit kernels have 32 blocks for
# 132 SMs).
BENCH_ATTENTION = {
    "attention-llama3-8b-prefill2048": ((1, 2048, 32, 8, 128, 2048), "f32", ""),
    "attention-llama3-8b-prefill2048-bf16": ((1, 2048, 32, 8, 128, 2048), "bf16", ""),
    "attention-llama3-8b-prefill2048-bf16-kernels": ((1, 2048, 32, 8, 128, 2048), "bf16", "kernels"),
    "attention-llama3-8b-prefill2048-bf16-cuda-cores": ((1, 2048, 32, 8, 128, 2048), "bf16", "cuda-cores"),
    "attention-llama3-8b-prefill8192-bf16": ((1, 8192, 32, 8, 128, 8192), "bf16", ""),
    "attention-llama3-8b-prefill8192-bf16-kernels": ((1, 8192, 32, 8, 128, 8192), "bf16", "kernels"),
    "attention-llama3-8b-decode1-ctx4096-bf16": ((1, 1, 32, 8, 128, 4097), "bf16", ""),
    "attention-llama3-8b-decode1-ctx4096-bf16-no-split": ((1, 1, 32, 8, 128, 4097), "bf16", "no-split"),
    "attention-llama3-8b-decode8-ctx4096-bf16": ((8, 1, 32, 8, 128, 4097), "bf16", ""),
    "attention-llama3-8b-decode8-ctx4096-bf16-no-split": ((8, 1, 32, 8, 128, 4097), "bf16", "no-split"),
}


# The attention gradient alone (flash-style tiles), causal, Llama-3-8B's
# shapes: name -> ((batch, seq, heads, kv heads, head width), dtype,
# PARAX_ATTENTION); timed beside the forward of the same shape
# (BENCH_ATTENTION's prefill cases): fp32 (CUDA cores), bf16 through
# cuDNN (its forward graph again for the output and row statistics, then
# its backward graph), on parax's tensor-core kernels and on CUDA cores.
BENCH_ATTENTION_GRAD = {
    "attention-grad-llama3-8b-prefill2048": ((1, 2048, 32, 8, 128), "f32", ""),
    "attention-grad-llama3-8b-prefill2048-bf16": ((1, 2048, 32, 8, 128), "bf16", ""),
    "attention-grad-llama3-8b-prefill2048-bf16-kernels": ((1, 2048, 32, 8, 128), "bf16", "kernels"),
    "attention-grad-llama3-8b-prefill2048-bf16-cuda-cores": ((1, 2048, 32, 8, 128), "bf16", "cuda-cores"),
    "attention-grad-llama3-8b-prefill8192-bf16": ((1, 8192, 32, 8, 128), "bf16", ""),
    "attention-grad-llama3-8b-prefill8192-bf16-kernels": ((1, 8192, 32, 8, 128), "bf16", "kernels"),
}


def _attention_grad_mlir(B, S, H, KH, D, dtype):
    q, kv = f"tensor<{B}x{S}x{H}x{D}x{dtype}>", f"tensor<{B}x{S}x{KH}x{D}x{dtype}>"
    return (f"func.func @f(%q: {q}, %k: {kv}, %v: {kv}, %do: {q}) -> ({q}, {kv}, {kv}) {{\n"
            f"  %dq, %dk, %dv = parax.attention_grad %q, %k, %v, %do {{causal, head_dim = {D} : i64,"
            f" num_heads = {H} : i64, num_kv_heads = {KH} : i64, scale = {D ** -0.5} : f64}}"
            f" : ({q}, {kv}, {kv}, {q}) -> ({q}, {kv}, {kv})\n"
            f"  return %dq, %dk, %dv : {q}, {kv}, {kv}\n}}\n")


# MoE experts alone at decode size, bf16: name -> ((tokens, top_k, experts,
# hidden, ffn), PARAX_EXPERTS). DeepSeek-V3's expert shape (hidden 7168,
# ffn 2048, top-8), 16 experts on the rank: 1.4 GB of weights. 32 tokens:
# 16 rows an expert on average, the grouped GEMM's tiles against
# per-expert cuBLAS calls; 16 tokens: 8 rows, the grouped few-row kernel
# (groupedFewRowsKernel) against per-expert few-row GEMMs.
BENCH_EXPERTS = {
    "experts-deepseek-v3-decode32-grouped": ((32, 8, 16, 7168, 2048), "grouped"),
    "experts-deepseek-v3-decode32-per-expert": ((32, 8, 16, 7168, 2048), "per-expert"),
    "experts-deepseek-v3-decode16-grouped": ((16, 8, 16, 7168, 2048), "grouped"),
    "experts-deepseek-v3-decode16-per-expert": ((16, 8, 16, 7168, 2048), "per-expert"),
}


# A training step, bf16: name -> (preset, layers, batch, seq). Timed three
# ways: the gradients alone, then with AdamW on the device (the default)
# and on the host (PARAX_CUDA_OPTIMIZER=host: each step's gradients copied
# to the host and the parameters back): what the optimizer costs each way.
BENCH_TRAIN = {
    "llama2-7b-1layer-train-adamw-bf16": ("llama2-7b", 1, 1, 1024),
}


def _experts_mlir(T, K, E, H, F):
    x, w, idx = f"tensor<{T}x{H}xbf16>", f"tensor<{T}x{K}xbf16>", f"tensor<{T}x{K}xi32>"
    up, down = f"tensor<{E}x{F}x{H}xbf16>", f"tensor<{E}x{H}x{F}xbf16>"
    return (f"func.func @f(%x: {x}, %w: {w}, %idx: {idx}, %wg: {up} {{parax.param = \"wg\"}},\n"
            f"    %wu: {up} {{parax.param = \"wu\"}}, %wd: {down} {{parax.param = \"wd\"}}) -> {x} {{\n"
            f"  %y = parax.experts %x, %w, %idx, %wg, %wu, %wd : ({x}, {w}, {idx}, {up}, {up}, {down}) -> {x}\n"
            f"  return %y : {x}\n}}\n")


def _attention_mlir(B, S, H, KH, D, T, dtype="f32"):
    q, kv = f"tensor<{B}x{S}x{H}x{D}x{dtype}>", f"tensor<{B}x{T}x{KH}x{D}x{dtype}>"
    return (f"func.func @f(%q: {q}, %k: {kv}, %v: {kv}) -> {q} {{\n"
            f"  %y = parax.attention %q, %k, %v {{causal, head_dim = {D} : i64, num_heads = {H} : i64,"
            f" num_kv_heads = {KH} : i64, scale = {D ** -0.5} : f64}} : ({q}, {kv}, {kv}) -> {q}\n"
            f"  return %y : {q}\n}}\n")


def prepare_bench(root, bin_dir):
    """Only the executables travel (weights and inputs are made where they run)."""
    from parax.models import build_model, load_config
    def one_op(name, text):  # root/name/op.pxe of one op's function
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        ir = os.path.join(d, "op.mlir")
        with open(ir, "w") as f:
            f.write(text)
        _run([os.path.join(bin_dir, "parax-translate"), "--to-executable", ir, "-o", os.path.join(d, "op.pxe")])
        os.remove(ir)

    for name, (dims, dtype, _) in BENCH_ATTENTION.items():
        one_op(name, _attention_mlir(*dims, dtype))
    for name, (preset, layers, batch, dtype, prompt, new, *more) in BENCH_GENERATE.items():
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        cfg = load_config(preset, layers=layers)
        for program, seq in (("step", 1), ("prefill", prompt)):
            ir = os.path.join(d, program + ".mlir")
            with open(ir, "w") as f:
                # The prefill returns its last position's logits only, as a
                # server's would: not [8, 2048, 128256] of them.
                f.write(build_model(cfg, batch=batch, seq=seq, dtype=dtype, cache=prompt + new,
                                    last_logits=program == "prefill", mla=more[1] if len(more) > 1 else "explicit"))
            _run([os.path.join(bin_dir, "parax-translate"), "--to-executable", ir,
                  "-o", os.path.join(d, program + ".pxe")])
            if program == "step":  # the planner's step time for these rows and microbatches (one H200)
                micro = more[0] if more else 1
                planned = os.path.join(d, "planned.mlir")
                _run([os.path.join(bin_dir, "parax-opt"), ir, "--parax-plan=cluster=dgx-h200:devices_per_node=1 "
                      f"workload=decode:batch={batch * micro},context={prompt + new // 2},mbs={batch}",
                      "-o", planned])
                with open(os.path.join(d, "planned.json"), "w") as f:
                    json.dump({"step_time_s": plan_figure(planned, "step_time_s")}, f)
                os.remove(planned)
            os.remove(ir)
    for name, (preset, layers, batch, seq) in BENCH_TRAIN.items():
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        ir, train = os.path.join(d, "model.mlir"), os.path.join(d, "train.mlir")
        with open(ir, "w") as f:
            f.write(build_model(load_config(preset, layers=layers), batch=batch, seq=seq, dtype="bf16", loss=True))
        _run([os.path.join(bin_dir, "parax-opt"), ir, "--parax-autodiff", "-o", train])
        _run([os.path.join(bin_dir, "parax-translate"), "--to-executable", train, "-o", os.path.join(d, "train.pxe")])
        os.remove(ir)
        os.remove(train)
    for name, (dims, dtype, _) in BENCH_ATTENTION_GRAD.items():
        one_op(name, _attention_grad_mlir(*dims, dtype))
    for name, (dims, _) in BENCH_EXPERTS.items():
        one_op(name, _experts_mlir(*dims))
    for name, (preset, layers, batch, seq, dtype, past, *cache) in BENCH.items():
        d = os.path.join(root, name)
        os.makedirs(d, exist_ok=True)
        ir = os.path.join(d, "model.mlir")
        with open(ir, "w") as f:
            f.write(build_model(load_config(preset, layers=layers), batch=batch, seq=seq, dtype=dtype,
                                past=0 if cache else past, cache=cache[0] if cache else 0))
        _run([os.path.join(bin_dir, "parax-translate"), "--to-executable", ir,
              "-o", os.path.join(d, "model.pxe")])
        # What the planner expects of this program on one H200 (the device
        # machine's GPU), its memory and step time, for the summary to set
        # beside what the runtime allocated and took there.
        planned = os.path.join(d, "planned.mlir")
        _run([os.path.join(bin_dir, "parax-opt"), ir, "--parax-plan=cluster=dgx-h200:devices_per_node=1 "
              + (f"workload=decode:batch={batch},context={past}" if past else
                 f"workload=prefill:batch={batch},seq={seq}"), "-o", planned])
        with open(os.path.join(d, "planned.json"), "w") as f:
            json.dump({key: plan_figure(planned, key) for key in ("memory_per_device_bytes", "step_time_s")}, f)
        os.remove(planned)
        os.remove(ir)


def plan_figure(path, key="memory_per_device_bytes"):
    """An f64 of the parax.plan of a planned module (MLIR may print it as its
    bits: 0x...)."""
    import re
    import struct
    with open(path) as f:
        text = re.search(key + r" = ([^ ,}]+)", f.read()).group(1)
    return struct.unpack(">d", bytes.fromhex(text[2:]))[0] if text.startswith("0x") else float(text)


def profile_of(log):
    """parax-run's PARAX_CUDA_PROFILE=1 lines: op -> milliseconds of one step."""
    import re
    return {m.group(1): float(m.group(2))
            for m in re.finditer(r"parax-run: profile: (\S+)\s+([0-9.]+) ms", log)}


def _profiled(env, device):
    """`env` with PARAX_CUDA_PROFILE=1 on the GPU: one more step, op by op."""
    return dict(env, PARAX_CUDA_PROFILE="1") if device == "cuda" else env or None


def _kernel_time(log, flops):
    """A one-op bench's device time from the profiled step: the step time
    also holds reading the result back to the host (33 MB for a prefill's
    attention output in fp32), which a kernel's figure must not."""
    profile = profile_of(log)
    ms = profile.get("total")
    return {"profile_ms": profile, "kernel_ms": ms, "kernel_tflops": flops / ms / 1e9} if ms else {}


def _planned(case_dir):
    """The planner's figures for a bench case ({} if not recorded)."""
    path = os.path.join(case_dir, "planned.json")
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def _bench_weights(preset, layers, dtype, arrays, weights_dir):
    """The checkpoint of a bench preset in `dtype` (a tiled random block; the
    norms ones): its path, written once. `arrays` caches each preset's fp32
    weights."""
    from parax.checkpoint import save_safetensors
    from parax.models import load_config
    from parax.models.builder import parameter_shapes
    label = os.path.splitext(os.path.basename(preset))[0]  # (a preset, or a config.json's path)
    weights_path = os.path.join(weights_dir, f"weights-{label}-{layers}-{dtype}.safetensors")
    if not os.path.exists(weights_path):
        if (preset, layers) not in arrays:
            block = _bench_block()
            weights = {}
            for key, shape in parameter_shapes(load_config(preset, layers=layers)).items():
                if "{e}" in key:
                    raise RuntimeError("bench presets are dense")
                weights[key] = np.ones(shape, np.float32) if "norm" in key else np.resize(block, shape)
            arrays[(preset, layers)] = weights
        save_safetensors(weights_path, arrays[(preset, layers)], dtype=dtype)
    return weights_path


def _bench_model(name, root, bin_dir, device, arrays, weights_dir):
    """One BENCH case: 10 steps; its figures."""
    from parax.models import load_config
    from parax.models.builder import parameter_shapes
    preset, layers, batch, seq, dtype, past, *capacity = BENCH[name]
    d = os.path.join(root, name)
    cfg = load_config(preset, layers=layers)
    shapes = parameter_shapes(cfg)
    weights_path = _bench_weights(preset, layers, dtype, arrays, weights_dir)
    tokens = os.path.join(d, "tokens.npy")
    np.save(tokens, np.random.default_rng(1).integers(0, cfg.vocab, (batch, seq)).astype(np.int32))
    inputs = [tokens]
    kv_shape = (batch, past, cfg.kv_heads, cfg.head_dim)
    if capacity:  # a generation step: at position `past` of caches of that capacity
        inputs.append(os.path.join(d, "position.npy"))
        np.save(inputs[-1], np.array(past, dtype=np.int32))
    if past:  # the cache: the same values for every layer's keys and values
        rows = capacity[0] if capacity else past
        cache = os.path.join(weights_dir, f"cache-{batch}x{rows}x{cfg.kv_heads}x{cfg.head_dim}.npy")
        np.save(cache, np.resize(_bench_block(), (batch, rows) + kv_shape[2:]) * 50)
        inputs += [cache] * (2 * layers)
    _, log = parax_run(bin_dir, weights_path, os.path.join(d, "model.pxe"), 1, inputs,
                       os.path.join(d, "out.npy"), device, steps=10, timeout=500,
                       env={"PARAX_CUDA_PROFILE": "1"} if device == "cuda" else None)
    step_ms = step_ms_of(log)
    params = sum(int(np.prod(s)) for s in shapes.values())
    matmul = params - cfg.vocab * cfg.hidden  # the embedding is a gather
    tokens_n = batch * seq
    flops = 2 * matmul * tokens_n + 4 * batch * seq * (past + seq) * cfg.heads * cfg.head_dim * layers
    # Bytes a step must read at least: every weight but the embedding
    # table (a gather reads only the tokens' rows), and the KV cache; bf16
    # programs keep their GEMM weights and cache in bf16 on the device (the
    # norms stay fp32).
    width = 2 if dtype == "bf16" else 4
    weight_bytes = width * matmul
    kv_bytes = width * 2 * layers * int(np.prod(kv_shape))
    planned = _planned(d)
    return {"case": name, "step_ms_median_of_10": step_ms,
            "tflops": flops / step_ms / 1e9, "weight_bytes": weight_bytes, "kv_bytes": kv_bytes,
            "weights_read_tb_per_s": weight_bytes / step_ms / 1e9, "profile_ms": profile_of(log),
            "temporaries": temporaries_of(log), "device_bytes": _counted(log, "bytes of device memory"),
            "planned_bytes": planned.get("memory_per_device_bytes", 0),
            "planned_step_ms": 1e3 * planned.get("step_time_s", 0)}


def _bench_train(name, root, bin_dir, device, arrays, weights_dir):
    """One BENCH_TRAIN case: 5 steps each of the gradients alone and AdamW on
    the device, 3 of AdamW on the host (8.6 s a step on an H200's host); the
    median step times, and the device's time for the gradients alone (op by
    op)."""
    from parax.models import load_config
    from parax.models.builder import parameter_shapes
    preset, layers, batch, seq = BENCH_TRAIN[name]
    d = os.path.join(root, name)
    cfg = load_config(preset, layers=layers)
    weights_path = _bench_weights(preset, layers, "bf16", arrays, weights_dir)
    rng = np.random.default_rng(1)
    inputs = [os.path.join(d, "tokens.npy"), os.path.join(d, "labels.npy")]
    for path in inputs:
        np.save(path, rng.integers(0, cfg.vocab, (batch, seq)).astype(np.int32))
    adamw = ["--optimizer", "adamw", "--lr", "1e-5"]
    times, logs = {}, {}
    # (The gradients alone are profiled: their step also reads every
    # gradient back to the host, 1.9 GB here, which the others do not.)
    for how, env, extra in (("gradients", _profiled({}, device), []), ("device", None, adamw),
                            ("host", {"PARAX_CUDA_OPTIMIZER": "host"}, adamw)):
        _, logs[how] = parax_run(bin_dir, weights_path, os.path.join(d, "train.pxe"), 1, inputs,
                                 os.path.join(d, "out.npy"), device, steps=3 if how == "host" else 5, timeout=300,
                                 env=env, extra=extra)
        times[how] = step_ms_of(logs[how])
    params = sum(int(np.prod(s)) for s in parameter_shapes(cfg).values())
    # What the device optimizer must move at least, per parameter: the bf16
    # gradient read and its fp32 sum written, the sum read back for the
    # norm and the update, master, m and v read and written, the bf16
    # parameter written.
    update_bytes = params * (2 + 4 + 4 + 4 + 3 * 8 + 2)
    return {"case": name, "params": params, "gradients_ms": times["gradients"], "device_ms": times["device"],
            "host_ms": times["host"], "update_bytes": update_bytes,
            "gradients_device_ms": profile_of(logs["gradients"]).get("total"),
            "on_device": "optimizer on the device" in logs["device"],
            "device_bytes": _counted(logs["device"], "bytes of device memory")}


def _bench_generate(name, root, bin_dir, device, arrays, weights_dir):
    """One BENCH_GENERATE case: the prompt through the prefill program, then
    the steps; its figures."""
    from parax.models import load_config
    from parax.models.builder import parameter_shapes
    preset, layers, batch, dtype, prompt, new, *more = BENCH_GENERATE[name]
    micro = more[0] if more else 1
    rows = batch * micro
    d = os.path.join(root, name)
    cfg = load_config(preset, layers=layers)
    weights_path = _bench_weights(preset, layers, dtype, arrays, weights_dir)
    tokens = os.path.join(d, "prompt.npy")
    np.save(tokens, np.random.default_rng(1).integers(0, cfg.vocab, (rows, prompt)).astype(np.int32))
    _, log = parax_run(bin_dir, weights_path, os.path.join(d, "step.pxe"), 1, [tokens],
                       os.path.join(d, "out.npy"), device, timeout=500, generate=new,
                       extra=["--prefill", os.path.join(d, "prefill.pxe")])
    import re
    prefill = re.search(r"prefill of 1 chunk\(s\) of \d+ tokens in ([0-9.]+) ms", log)
    width = 2 if dtype == "bf16" else 4
    matmul = sum(int(np.prod(s)) for s in parameter_shapes(cfg).values()) - cfg.vocab * cfg.hidden
    # What a step reads at least, at the steps' middle position: every
    # microbatch reads the weights.
    kv_bytes = width * layers * rows * (prompt + new // 2) * kv_values_per_token(cfg, *more[1:2])
    return {"case": name, "step_ms_median": step_ms_of(log), "prefill_ms": float(prefill.group(1)) if prefill else 0,
            "tokens_per_s": _counted(log, "tokens/s at the median step"), "steps": new - 1,
            "rows": rows, "micro": micro,
            "planned_step_ms": 1e3 * _planned(d).get("step_time_s", 0),
            "weight_bytes": width * matmul * micro, "kv_bytes": kv_bytes,
            "shared_parameters": _shared_parameters(log),
            "shared_caches": _counted(log, "KV cache(s) shared with the prefill program"),
            "device_bytes": _counted(log, "bytes of device memory")}


def attention_rows(q, k, v, rows):
    """numpy causal attention (grouped heads) for the queries `rows` only:
    [B, len(rows), H, D] (with more keys than queries, the queries are the
    last positions). Cheap at any sequence length."""
    H, KH = q.shape[2], k.shape[2]
    past = k.shape[1] - q.shape[1]
    k = np.repeat(k.astype(np.float64), H // KH, axis=2)
    v = np.repeat(v.astype(np.float64), H // KH, axis=2)
    out = []
    for r in rows:
        seen = past + r + 1
        scores = np.einsum("bhd,bthd->bht", q[:, r].astype(np.float64), k[:, :seen]) / np.sqrt(q.shape[3])
        p = np.exp(scores - scores.max(axis=2, keepdims=True))
        out.append(np.einsum("bht,bthd->bhd", p / p.sum(axis=2, keepdims=True), v[:, :seen]))
    return np.stack(out, axis=1)


def _bench_attention(name, root, bin_dir, device):
    """Times the kernel and checks it at this shape: sampled query rows
    (tile edges, the first and last) against numpy, within 1e-4 (fp32) or
    1 % (bf16) of the largest |output|."""
    from parax.checkpoint import round_to_bf16, save_safetensors
    (B, S, H, KH, D, T), dtype, kernel = BENCH_ATTENTION[name]
    d = os.path.join(root, name)
    rng = np.random.default_rng(2)
    inputs, values = [], []
    for arg, heads, rows_of in (("q", H, S), ("k", KH, T), ("v", KH, T)):
        inputs.append(os.path.join(d, arg + ".npy"))
        values.append(rng.standard_normal((B, rows_of, heads, D), dtype=np.float32))
        np.save(inputs[-1], values[-1])
    weights_path = os.path.join(d, "empty.safetensors")
    save_safetensors(weights_path, {})
    _, log = parax_run(bin_dir, weights_path, os.path.join(d, "op.pxe"), 1, inputs,
                       os.path.join(d, "out.npy"), device, steps=10, timeout=300,
                       env=_profiled({"PARAX_ATTENTION": kernel} if kernel else {}, device))
    step_ms = step_ms_of(log)
    # The causal half only: q.k and p.v over the keys each query sees.
    flops = 4 * B * H * D * (S * (T - S) + S * (S + 1) / 2)
    kv_bytes = 2 * B * T * KH * D * (2 if dtype == "bf16" else 4)
    rows = sorted({r for r in (0, 1, 31, 32, 63, 64, 65, S // 2, S - 2, S - 1) if 0 <= r < S})
    if dtype == "bf16":  # the GPU reads the inputs rounded to bf16
        values = [round_to_bf16(v) for v in values]
    want = attention_rows(*values, rows)
    got = np.load(os.path.join(d, "out.npy"))[:, rows].astype(np.float64)
    diff = float(np.abs(got - want).max())
    tolerance = (1e-2 if dtype == "bf16" else 1e-4) * float(np.abs(want).max())
    return {"case": name, "step_ms_median_of_10": step_ms, "tflops": flops / step_ms / 1e9,
            **_kernel_time(log, flops), "kv_bytes": kv_bytes, "rows_vs_numpy": diff, "tolerance": tolerance,
            "ok": diff < tolerance, "attention_path": attention_path(log)}


def _bench_attention_grad(name, root, bin_dir, device):
    """Times the attention gradient (dq, dk, dv: 5 GEMMs' worth of flops
    over the causal half, as FlashAttention-2 counts them) and checks dq's
    sampled rows against numpy (1e-3 of the largest |dq| in fp32, 2 % in
    bf16)."""
    from parax.checkpoint import round_to_bf16, save_safetensors
    (B, S, H, KH, D), dtype, kernel = BENCH_ATTENTION_GRAD[name]
    d = os.path.join(root, name)
    rng = np.random.default_rng(4)
    values = [rng.standard_normal((B, S, heads, D), dtype=np.float32) for heads in (H, KH, KH, H)]
    inputs = [os.path.join(d, n + ".npy") for n in ("q", "k", "v", "do")]
    for path, value in zip(inputs, values):
        np.save(path, value)
    weights_path = os.path.join(d, "empty.safetensors")
    save_safetensors(weights_path, {})
    _, log = parax_run(bin_dir, weights_path, os.path.join(d, "op.pxe"), 1, inputs,
                       os.path.join(d, "dq.npy"), device, steps=10, timeout=300,
                       env=_profiled({"PARAX_ATTENTION": kernel} if kernel else {}, device))
    step_ms = step_ms_of(log)
    flops = 5 * 2 * B * H * D * S * (S + 1) / 2
    if dtype == "bf16":
        values = [round_to_bf16(v) for v in values]
    q, k, v, do = (x.astype(np.float64) for x in values)
    k, v = np.repeat(k, H // KH, axis=2), np.repeat(v, H // KH, axis=2)
    rows = sorted({r for r in (0, 1, 31, 32, 63, 64, S // 2, S - 1) if r < S})
    scale = D ** -0.5
    want = []
    for r in rows:  # dq of query r: scale * sum_t P (dP - D) k_t over the keys it sees
        scores = np.einsum("bhd,bthd->bht", q[:, r], k[:, :r + 1]) * scale
        p = np.exp(scores - scores.max(axis=2, keepdims=True))
        p /= p.sum(axis=2, keepdims=True)
        dp = np.einsum("bhd,bthd->bht", do[:, r], v[:, :r + 1])
        ds = p * (dp - (p * dp).sum(axis=2, keepdims=True)) * scale
        want.append(np.einsum("bht,bthd->bhd", ds, k[:, :r + 1]))
    want = np.stack(want, axis=1)
    got = np.load(os.path.join(d, "dq.npy"))[:, rows].astype(np.float64)
    diff = float(np.abs(got - want).max())
    tolerance = (2e-2 if dtype == "bf16" else 1e-3) * float(np.abs(want).max())
    return {"case": name, "step_ms_median_of_10": step_ms, "tflops": flops / step_ms / 1e9,
            **_kernel_time(log, flops), "rows_vs_numpy": diff, "tolerance": tolerance, "ok": diff < tolerance,
            "attention_path": attention_path(log)}


def _experts_rows(block, x, w, idx, tokens, E, H, F):
    """numpy experts for `tokens` only, from the bench's weights (`block`
    tiled for gate and down, -block for up, rounded to bf16 as stored): [len(tokens), H] in float64, the
    SwiGLU rounded to bf16 before the down projection as the GPU does."""
    from parax.checkpoint import round_to_bf16
    rounded = round_to_bf16(block)  # (rounding commutes with tiling, and with the sign: up is -gate)

    def stacked(e, rows, cols):  # expert e of np.resize(rounded, (E, rows, cols))
        return np.resize(np.roll(rounded, -(e * rows * cols % rounded.size)), (rows, cols))

    y = np.zeros((len(tokens), H))
    for e in np.unique(idx[tokens]):  # each expert's matrices built once
        wg, wd = stacked(e, F, H), stacked(e, H, F)
        for i, t in enumerate(tokens):
            chosen = idx[t] == e  # (a token may choose e more than once)
            if not chosen.any():
                continue
            weight = float(w[t][chosen].sum(dtype=np.float64))
            gate = (wg @ round_to_bf16(x[t])).astype(np.float64)
            act = round_to_bf16((gate / (1 + np.exp(-gate)) * -gate).astype(np.float32))
            y[i] += weight * (wd @ act).astype(np.float64)
    return y


def _bench_experts(name, root, bin_dir, device, weights_dir):
    """Times the experts and checks sampled tokens against numpy (1 % of
    the largest |output|)."""
    from parax.checkpoint import save_safetensors
    (T, K, E, H, F), path = BENCH_EXPERTS[name]
    d = os.path.join(root, name)
    weights_path = os.path.join(weights_dir, f"experts-{E}x{H}x{F}.safetensors")
    block = _bench_block()
    if not os.path.exists(weights_path):
        save_safetensors(weights_path, {"wg": np.resize(block, (E, F, H)), "wu": np.resize(-block, (E, F, H)),
                                        "wd": np.resize(block, (E, H, F))}, dtype="bf16")
    rng = np.random.default_rng(3)
    inputs = [os.path.join(d, n) for n in ("x.npy", "w.npy", "idx.npy")]
    np.save(inputs[0], rng.standard_normal((T, H), dtype=np.float32))
    np.save(inputs[1], np.full((T, K), 1.0 / K, np.float32))
    np.save(inputs[2], rng.integers(0, E, (T, K)).astype(np.int32))
    _, log = parax_run(bin_dir, weights_path, os.path.join(d, "op.pxe"), 1, inputs,
                       os.path.join(d, "out.npy"), device, steps=10, timeout=300,
                       env={"PARAX_EXPERTS": path, "PARAX_CUDA_PROFILE": "1"})
    step_ms = step_ms_of(log)
    x, w, idx = (np.load(p) for p in inputs)
    used = len(np.unique(idx))
    weight_bytes = 2 * 3 * used * H * F  # the used experts' bf16 weights, read once
    tokens = [0, T // 2, T - 1]
    want = _experts_rows(block, x, w, idx, tokens, E, H, F)
    diff = float(np.abs(np.load(os.path.join(d, "out.npy"))[tokens].astype(np.float64) - want).max())
    tolerance = 1e-2 * float(np.abs(want).max())
    return {"case": name, "step_ms_median_of_10": step_ms, "tflops": 2 * T * K * 3 * H * F / step_ms / 1e9,
            "weight_bytes": weight_bytes, "weights_read_tb_per_s": weight_bytes / step_ms / 1e9,
            "profile_ms": profile_of(log), "rows_vs_numpy": diff, "tolerance": tolerance, "ok": diff < tolerance}


def bench(root, bin_dir, device="cuda", report=lambda result: None, only=None):
    """Every benchmark, quickest first (the attention kernels, the bf16
    layers, the experts, then fp32: a run cut short keeps the figures that
    matter most);
    `report` gets each result as it comes. A failed case is reported with
    its error and the others still run."""
    import shutil
    import tempfile
    results, arrays = [], {}
    weights_dir = tempfile.mkdtemp(prefix="parax-bench-")  # gigabytes: never in the cases
    bf16 = [n for n in BENCH if BENCH[n][4] == "bf16"]
    order = (list(BENCH_ATTENTION) + list(BENCH_ATTENTION_GRAD) + bf16 + list(BENCH_GENERATE) + list(BENCH_EXPERTS) +
             list(BENCH_TRAIN) +
             [n for n in BENCH if n not in bf16])
    if only is not None:  # a subset (a second GPU run retrying what failed)
        unknown = set(only) - set(order)
        if unknown:
            raise SystemExit(f"unknown bench cases: {', '.join(sorted(unknown))}")
        order = [n for n in order if n in only]
    try:
        for name in order:
            start = time.time()
            try:
                if name in BENCH_ATTENTION:
                    r = _bench_attention(name, root, bin_dir, device)
                elif name in BENCH_ATTENTION_GRAD:
                    r = _bench_attention_grad(name, root, bin_dir, device)
                elif name in BENCH_EXPERTS:
                    r = _bench_experts(name, root, bin_dir, device, weights_dir)
                elif name in BENCH_TRAIN:
                    r = _bench_train(name, root, bin_dir, device, arrays, weights_dir)
                elif name in BENCH_GENERATE:
                    r = _bench_generate(name, root, bin_dir, device, arrays, weights_dir)
                else:
                    r = _bench_model(name, root, bin_dir, device, arrays, weights_dir)
            except Exception as e:
                r = {"case": name, "error": str(e)[-2000:]}
            r["seconds"] = round(time.time() - start, 2)
            results.append(r)
            report(r)
    finally:
        shutil.rmtree(weights_dir, ignore_errors=True)
    return results


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("verb", choices=["prepare", "check", "bench"])
    ap.add_argument("dir")
    ap.add_argument("--bin", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--json")
    ap.add_argument("--device", default="cuda", help="cpu: tests the harness itself")
    ap.add_argument("--tool", default="parax-run",
                    help="parax-run-simt: the CUDA backend on the SIMT emulator (no GPU)")
    ap.add_argument("--cases", help="comma-separated subset of the cases")
    ap.add_argument("--jobs", type=int, default=1, help="check: cases run at once")
    ap.add_argument("--case-timeout", type=float, default=300,
                    help="seconds one case may run before it counts as failed")
    args = ap.parse_args()
    os.makedirs(args.dir, exist_ok=True)
    sys.path.insert(0, HERE)
    if args.verb == "prepare":
        for name in args.cases.split(",") if args.cases else all_cases():
            prepare_any(name, args.dir, args.bin)
        prepare_bench(args.dir, args.bin)
        return 0
    results, failed = [], 0

    def save():  # after every case: a run cut short by its timeout keeps what it measured
        if args.json:
            with open(args.json, "w") as f:
                json.dump(results, f, indent=1)

    if args.verb == "check":
        from concurrent.futures import ThreadPoolExecutor, as_completed

        def one(name):
            start = time.time()
            try:
                r = check(name, args.dir, args.bin, args.device, args.tool, timeout=args.case_timeout)
            except Exception as e:  # report every case, then fail
                r = {"case": name, "ok": False, "error": str(e)[-2000:]}
            r["seconds"] = round(time.time() - start, 2)
            return r

        # --jobs N: N cases at once (each its own processes; on one GPU they
        # share it, which changes no result). Reported as they finish.
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            names = args.cases.split(",") if args.cases else all_cases()
            for future in as_completed([pool.submit(one, name) for name in names]):
                r = future.result()
                failed += not r["ok"]
                print(json.dumps(r), flush=True)
                results.append(r)
                save()
    else:
        def report(r):
            print(json.dumps(r), flush=True)
            results.append(r)
            save()
        bench(args.dir, args.bin, args.device, report, args.cases.split(",") if args.cases else None)
    save()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
