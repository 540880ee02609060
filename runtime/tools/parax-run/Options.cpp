// Options.cpp - parax-run's command line (Options.h).

#include "Options.h"

#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace parax::run {

bool isFolderPath(const std::string &path) {
  struct stat st;
  return (!path.empty() && path.back() == '/') || (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
}

void usage() {
  std::fprintf(stderr,
               "usage: mpirun -np N parax-run MODEL.pxe --weights W.safetensors "
               "--input X.npy [--input Y.npy] [--output OUT.npy [--output OUT2.npy]] [--steps K] "
               "[--device cpu|cuda]\n"
               "       mpirun -np N parax-run STEP.pxe --weights W.safetensors --input PROMPT.npy "
               "--generate K [--output TOKENS.npy [--output LOGITS.npy]] [--device cpu|cuda]\n"
               "  (every flag takes its value as --flag VALUE or --flag=VALUE; --quiet: no line a\n"
               "  training step and no generation progress, the summary only)\n"
               "  --log-json L.jsonl: with --optimizer, one JSON object a training step (step, loss and\n"
               "  its terms, grad_norm, clipped, lr, seconds, tokens_per_s, eta_s), quiet or not\n"
               "  --generate K: greedy generation of K tokens per prompt row with a generation\n"
               "  step (built --seq 1 --cache C): the prompt's tokens are fed one step each,\n"
               "  then each step's most likely token; the KV caches stay where the step runs\n"
               "  (on the device) and are written in place. Outputs: the prompt and the\n"
               "  generated tokens [rows, L + K], and each step's logits [rows, L + K - 1, V]. A\n"
               "  shorter prompt ends with -1s: its row gets K tokens after its own prompt, then -1s\n"
               "  (logits NaN past its last token). Rows of\n"
               "  several batches per replica run as microbatches, each with its own caches, in\n"
               "  turn on every pipeline stage (stage s+1 on one while stage s is on the next)\n"
               "  --prefill CHUNK.pxe: the prompt's first tokens in chunks of CHUNK's --seq (built like\n"
               "  the step, with --seq P, and planned alike), which writes the same caches; the\n"
               "  CUDA backend shares the weights and caches of both programs\n"
               "  --temperature T [--top-k K] [--top-p P] [--seed S]: draw each token from\n"
               "  softmax(logits / T) over the K most likely (0: all), then over the fewest of them,\n"
               "  most likely first, holding P of their probability (default 1: all),\n"
               "  reproducibly from S (default: the most likely)\n"
               "  --stop-token ID: a row that generates ID generates nothing more (its later tokens\n"
               "  are ID); a microbatch whose rows all have runs no more steps (its LOGITS are NaN\n"
               "  there), and the loop ends when every row has (LOGITS then holds the positions run)\n"
               "  --output: the executable's results in order (the logits; with a decode step\n"
               "  built --return-kv, then each layer's new keys and values; a training step's\n"
               "  loss, then each parameter's gradient, averaged over microbatches and replicas)\n"
               "  --output-dir DIR: every result into DIR (an existing folder): a gradient as\n"
               "  <checkpoint name>.npy (a fused tensor's piece <name>@<offsets>.npy), any other\n"
               "  result as result<k>.npy\n"
               "  --optimizer sgd|adamw: with a training step (--parax-autodiff), --steps K optimizer\n"
               "  steps: each step's gradients (averaged over its microbatches and the replicas)\n"
               "  update every rank's parameter boxes in place, in fp32 (on cuda: the device optimizer,\n"
               "  fp32 masters and moments in device memory; PARAX_CUDA_OPTIMIZER=host below: on the\n"
               "  host). --lr (1e-3), --beta1 (0.9),\n"
               "  --beta2 (0.999), --eps (1e-8), --weight-decay (0: decoupled, matrices only),\n"
               "  --clip-grad-norm N (the gradients' global L2 norm at most N), --lr-schedule\n"
               "  constant|linear|cosine (default constant) with --warmup-steps W (lr t/W at first),\n"
               "  --decay-steps D (down to --min-lr by step D; default the run's last step),\n"
               "  --zero (ZeRO-1: the\n"
               "  AdamW states split over the ranks holding each box (dp, and ep, cp, tp where the\n"
               "  box is replicated): gradients reduce-scattered, parameters all-gathered),\n"
               "  --zero-stage 0|1|2|3 (on cuda's device optimizer, 2: the gradient sums split too,\n"
               "  each microbatch's gradients reduce-scattered; 3: the parameters too, each gathered\n"
               "  before the instructions that read it); by default the plan's stage; --no-zero: never). --step-rows R: each step takes the next R rows of the\n"
               "  inputs, cycling (default: all rows every step). --losses L.npy: each step's loss.\n"
               "  --balance-losses B.npy: each step's MoE load-balancing loss; --mtp-losses M.npy:\n"
               "  each step's multi-token prediction loss, weighted (both already in the loss; also\n"
               "  printed with it).\n"
               "  --per-token-loss: with labels ignored (built with ignore_index), the loss the mean\n"
               "  over every counted label of the step, all microbatches and replicas together\n"
               "  (default: each microbatch's mean, averaged)\n"
               "  --bias-update-speed G: DeepSeek-V3's auxiliary-loss-free balancing: after each\n"
               "  step every router's correction bias moves G towards balance (b_e += G sign(mean\n"
               "  load - load_e), the loads counted over the step's tokens on every rank)\n"
               "  --save-weights OUT.safetensors: the updated parameters (F32, whole tensors); OUT/\n"
               "  (a folder): a sharded checkpoint, each rank writing its share of the whole tensors\n"
               "  (model-0000k-of-0000n.safetensors, model.safetensors.index.json)\n"
               "  --save-optimizer S.safetensors / --load-optimizer S.safetensors: AdamW's moments\n"
               "  (<name>.exp_avg, <name>.exp_avg_sq) and step count (optimizer.step), to resume\n"
               "  (a folder: sharded likewise). --weights and --load-optimizer read a .safetensors\n"
               "  file, a sharded checkpoint's index (*.index.json) or a folder holding one\n"
               "  --save-format boxes: --save-weights OUT/ and --save-optimizer S/ write each rank's\n"
               "  own boxes, nothing gathered (boxes-0000k-of-0000n.safetensors, one a rank holding\n"
               "  boxes, and boxes.index.json: each tensor's boxes); read back under any plan\n"
               "  (default: whole, gathered whole tensors)\n"
               "  --save-every K: also every K steps (but the last), OUT/ as OUT/step-0000000K/ and\n"
               "  OUT.safetensors as OUT-step-0000000K.safetensors (K counts a resumed run's steps)\n"
               "  --steps 0: prepare only (load the weights, plan memory); every rank reports\n"
               "  the parameter values it holds and, on cuda, the device memory it took (with\n"
               "  --generate: every program of the loop, every microbatch's)\n"
               "  --skip-nonfinite: with --optimizer, a step whose gradients are not finite is skipped (no\n"
               "  update; counted at the end) instead of stopping the run, which is the default\n"
               "  --allow-unused-weights: run although the checkpoint holds tensors the program never\n"
               "  reads (refused otherwise: a model other than the one compiled)\n"
               "  --profile P.json: each instruction's wall time, the median over the steps (cuda:\n"
               "  over 3 more steps timed by device events), with its shapes, attributes and the\n"
               "  ranks a collective spans (rank 0: P.json, rank r: P.json.rank<r>): what\n"
               "  parax-plan --calibrate fits a cluster and profile to\n"
               "  PARAX_COLLECTIVE_TIMEOUT=S (or PARAX_NCCL_TIMEOUT): a collective not finished\n"
               "  after S seconds ends the job, naming rank and operation (default 300)\n"
               "  PARAX_CUDA_OVERLAP=0: the GPU waits for each collective right after it (by\n"
               "  default only before the first instruction that touches its buffers)\n"
               "  PARAX_CUDA_GRAPHS=0: no CUDA graphs (by default a stage without collectives\n"
               "  or host synchronisations replays its steps after the first as one graph)\n"
               "  PARAX_ATTENTION=cuda-cores: bf16 attention and its gradient without tensor cores\n"
               "  PARAX_CUDA_PROFILE=1: after the timed steps, one more step timed op by op\n"
               "  PARAX_CUDA_FUSE_GELU=0: no gelu in cuBLASLt's GELU_BIAS epilogue (by default\n"
               "  fused into a biased linear when the epilogue computes the gelu's form)\n"
               "  PARAX_EXPERTS=grouped|per-expert: MoE experts as one grouped GEMM per\n"
               "  projection, or cuBLAS GEMMs per expert (by default grouped while experts\n"
               "  average at most 128 rows)\n"
               "  PARAX_CUDA_SHARE_TEMPORARIES=0: one device allocation per temporary (by\n"
               "  default temporaries whose lifetimes do not meet share memory)\n"
               "  PARAX_CUDA_POISON_DEAD=1: a check: every temporary is filled with NaN\n"
               "  after its last use, so that a late reader computes NaN\n"
               "  PARAX_CUDA_OPTIMIZER=host: the optimizer on the host (fp32 masters there, the\n"
               "  gradients copied to the host and the parameters back each step; by default\n"
               "  masters, moments and gradients stay on the device)\n"
               "  PARAX_CUDA_BUCKET_BYTES=N: without ZeRO, the device optimizer all-reduces the\n"
               "  gradient sums over dp in buckets of up to N bytes (default 25 MiB; 1: a box each)\n");
}

Options parseOptions(int argc, char **argv, const std::function<void(const std::string &)> &die) {
  Options o;
  // --name=value is --name value.
  std::vector<std::string> words;
  for (int i = 1; i < argc; ++i) {
    std::string word = argv[i];
    size_t eq = word.find('=');
    if (word.rfind("--", 0) == 0 && eq != std::string::npos) {
      words.push_back(word.substr(0, eq));
      words.push_back(word.substr(eq + 1));
    } else {
      words.push_back(word);
    }
  }
  std::vector<char *> split = {argv[0]};
  for (std::string &word : words) split.push_back(word.data());
  split.push_back(nullptr);
  argc = static_cast<int>(split.size()) - 1;
  argv = split.data();
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        usage();
        die("missing value after " + arg);
      }
      return argv[++i];
    };
    // The flag's value, a positive count of `what`.
    auto positiveCount = [&](const char *what) {
      std::string text = value();
      char *end = nullptr;
      long long n = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end || n < 1) die(arg + " must be a positive count of " + what + ", got '" + text + "'");
      return n;
    };
    if (arg == "--weights") o.weights = value();
    else if (arg == "--input") o.inputs.push_back(value());
    else if (arg == "--output") o.outputs.push_back(value());
    else if (arg == "--output-dir") o.outputDir = value();
    else if (arg == "--steps") {
      std::string text = value();
      char *end = nullptr;
      long n = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end || n < 0 || n > 1000000000) die("--steps must be a count of steps, got '" + text + "'");
      o.steps = static_cast<int>(n);
      o.stepsGiven = true;
    }
    else if (arg == "--generate") {
      std::string text = value();
      char *end = nullptr;
      o.generate = std::strtol(text.c_str(), &end, 10);
      if (text.empty() || *end || o.generate < 1 || o.generate > 1000000)
        die("--generate must be a positive count of tokens, got '" + text + "'");
    }
    else if (arg == "--prefill") o.prefillPath = value();
    else if (arg == "--profile") o.profilePath = value();
    else if (arg == "--optimizer") {
      o.optimizer.kind = value();
      if (o.optimizer.kind != "sgd" && o.optimizer.kind != "adamw")
        die("--optimizer must be sgd or adamw, got '" + o.optimizer.kind + "'");
    }
    else if (arg == "--bias-update-speed") {
      std::string text = value();
      char *end = nullptr;
      o.biasSpeed = std::strtod(text.c_str(), &end);
      if (text.empty() || *end || !std::isfinite(o.biasSpeed) || o.biasSpeed <= 0)
        die("--bias-update-speed must be a positive number, got '" + text + "'");
      o.optimizerSettings = true;
    }
    else if (arg == "--lr" || arg == "--beta1" || arg == "--beta2" || arg == "--eps" || arg == "--weight-decay" ||
             arg == "--clip-grad-norm" || arg == "--min-lr") {
      std::string text = value();
      char *end = nullptr;
      double number = std::strtod(text.c_str(), &end);
      bool beta = arg == "--beta1" || arg == "--beta2";
      if (text.empty() || *end || !std::isfinite(number) || number < 0 || (beta && number >= 1) ||
          ((arg == "--lr" || arg == "--eps") && number == 0))
        die(arg + " must be a " + (beta ? "number in [0, 1)" : arg == "--lr" || arg == "--eps" ? "positive number"
                                                                                              : "non-negative number") +
            ", got '" + text + "'");
      double &slot = arg == "--lr"      ? o.optimizer.lr
                     : arg == "--beta1" ? o.optimizer.beta1
                     : arg == "--beta2" ? o.optimizer.beta2
                     : arg == "--eps"   ? o.optimizer.eps
                     : arg == "--weight-decay" ? o.optimizer.weightDecay
                     : arg == "--min-lr"       ? o.optimizer.minLr
                                               : o.optimizer.clipNorm;
      slot = number;
      o.optimizerSettings = true;
    }
    else if (arg == "--warmup-steps" || arg == "--decay-steps") {
      std::string text = value();
      char *end = nullptr;
      long long n = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end || n < 0 || n > 1000000000)
        die(arg + " must be a count of steps, got '" + text + "'");
      (arg == "--warmup-steps" ? o.optimizer.warmupSteps : o.optimizer.decaySteps) = n;
      o.optimizerSettings = true;
    }
    else if (arg == "--lr-schedule") {
      o.optimizer.schedule = value();
      if (o.optimizer.schedule != "constant" && o.optimizer.schedule != "linear" && o.optimizer.schedule != "cosine")
        die("--lr-schedule must be constant, linear or cosine, got '" + o.optimizer.schedule + "'");
      o.optimizerSettings = true;
    }
    else if (arg == "--zero" || arg == "--no-zero") {
      o.zeroGiven = true;
      o.optimizer.zero = arg == "--zero";
      o.optimizer.zeroStage = o.optimizer.zero ? 1 : 0;
      o.optimizerSettings = true;
    }
    else if (arg == "--zero-stage") {
      std::string text = value();
      if (text != "0" && text != "1" && text != "2" && text != "3")
        die("--zero-stage must be 0, 1, 2 or 3, got '" + text + "'");
      o.zeroGiven = true;
      o.optimizer.zeroStage = std::stoi(text);
      o.optimizer.zero = o.optimizer.zeroStage > 0;
      o.optimizerSettings = true;
    }
    else if (arg == "--save-weights") o.saveWeights = value();
    else if (arg == "--save-every") {
      o.saveEvery = positiveCount("steps");
      o.optimizerSettings = true;
    }
    else if (arg == "--save-format") {
      o.saveFormat = value();
      if (o.saveFormat != "whole" && o.saveFormat != "boxes")
        die("--save-format must be whole or boxes, got '" + o.saveFormat + "'");
      o.optimizerSettings = true;
    }
    else if (arg == "--losses") o.lossesPath = value();
    else if (arg == o.terms[0].flag) o.terms[0].path = value();
    else if (arg == o.terms[1].flag) o.terms[1].path = value();
    else if (arg == "--per-token-loss") o.perTokenLoss = true;
    else if (arg == "--allow-unused-weights") o.allowUnusedWeights = true;
    else if (arg == "--skip-nonfinite") { o.optimizer.skipNonfinite = true; o.optimizerSettings = true; }
    else if (arg == "--quiet") o.quiet = true;
    else if (arg == "--log-json") o.logJsonPath = value();
    else if (arg == "--save-optimizer") { o.saveOptimizer = value(); o.optimizerSettings = true; }
    else if (arg == "--load-optimizer") { o.loadOptimizer = value(); o.optimizerSettings = true; }
    else if (arg == "--step-rows") {
      o.stepRows = positiveCount("rows");
      o.optimizerSettings = true;
    }
    else if (arg == "--stop-token") {
      std::string text = value();
      char *end = nullptr;
      o.stopToken = std::strtoll(text.c_str(), &end, 10);
      if (text.empty() || *end || o.stopToken < 0 || o.stopToken > INT32_MAX)
        die("--stop-token must be a token id, got '" + text + "'");
    }
    else if (arg == "--top-p") {
      std::string text = value();
      char *end = nullptr;
      double p = std::strtod(text.c_str(), &end);
      if (text.empty() || *end || !(p > 0 && p <= 1))
        die("--top-p must be a probability in (0, 1], got '" + text + "'");
      o.sampling.topP = p;
      o.samplingGiven = true;
    }
    else if (arg == "--temperature" || arg == "--top-k" || arg == "--seed") {
      std::string text = value();
      char *end = nullptr;
      double number = std::strtod(text.c_str(), &end);
      bool whole = number == static_cast<double>(static_cast<long long>(number));
      if (text.empty() || *end || !(number >= 0) || (arg != "--temperature" && (!whole || number > 9e15)))
        die(arg + " must be a non-negative " + (arg == "--temperature" ? "number" : "integer") + ", got '" + text + "'");
      if (arg == "--temperature") o.sampling.temperature = number;
      else if (arg == "--top-k") o.sampling.topK = static_cast<int64_t>(number);
      else o.sampling.seed = static_cast<uint64_t>(number);
      o.samplingGiven = true;
    }
    else if (arg == "--device") o.device = value();
    else if (arg == "--help" || arg == "-h") { usage(); o.help = true; return o; }
    else if (!arg.empty() && arg[0] == '-') die("unknown option " + arg);
    else o.model = arg;
  }
  if (o.model.empty() || o.weights.empty()) {
    usage();
    die("an executable and --weights are required");
  }
  if (o.steps == 0 && (!o.outputs.empty() || !o.outputDir.empty())) die("--steps 0 prepares only: it writes no --output");
  if (!o.outputDir.empty() && !o.outputs.empty()) die("--output-dir writes every result: it takes no --output");
  if (!o.outputDir.empty() && o.generate > 0) die("--generate writes its tokens and logits with --output, not --output-dir");
  if (!o.outputDir.empty()) {
    struct stat info;
    if (stat(o.outputDir.c_str(), &info) != 0 || !S_ISDIR(info.st_mode))
      die("--output-dir " + o.outputDir + ": not a directory");
  }
  if (o.generate > 0 && o.stepsGiven && o.steps != 0)
    die("--generate runs one step per token: it takes no --steps (--steps 0: prepare its programs only)");
  if (!o.prefillPath.empty() && o.generate <= 0) die("--prefill is part of --generate");
  if ((o.samplingGiven || o.stopToken >= 0) && o.generate <= 0)
    die("--temperature, --top-k, --top-p, --seed and --stop-token are part of --generate");
  if (o.device != "cpu" && o.device != "cuda") die("--device must be cpu or cuda");
  const bool trains = o.trains();
  if (!trains && (o.optimizerSettings || !o.saveWeights.empty() || !o.lossesPath.empty() || !o.logJsonPath.empty() ||
                  std::any_of(o.terms.begin(), o.terms.end(), [](const LossTerm &t) { return !t.path.empty(); })))
    die("--lr, --beta1, --beta2, --eps, --weight-decay, --clip-grad-norm, --lr-schedule, --warmup-steps, "
        "--decay-steps, --min-lr, --zero, --step-rows, --save-weights, --losses, --balance-losses, --mtp-losses, "
        "--save-optimizer, --load-optimizer, --skip-nonfinite, --save-format, --save-every, --bias-update-speed "
        "and --log-json belong to --optimizer");
  if (trains && o.generate > 0) die("--optimizer trains a training step: it takes no --generate");
  if ((!o.saveOptimizer.empty() || !o.loadOptimizer.empty()) && o.optimizer.kind != "adamw")
    die("--save-optimizer and --load-optimizer keep AdamW's moments: SGD has none (--optimizer adamw)");
  if (o.saveEvery > 0 && o.saveWeights.empty() && o.saveOptimizer.empty())
    die("--save-every K: nothing is saved (--save-weights or --save-optimizer)");
  {
    // Two things written to one path: the later would replace the earlier
    // (the weights lost under the optimizer's state), after every step ran.
    std::vector<std::pair<std::string, std::string>> written = {
        {"--save-weights", o.saveWeights}, {"--save-optimizer", o.saveOptimizer}, {"--losses", o.lossesPath}};
    for (const LossTerm &t : o.terms) written.push_back({t.flag, t.path});
    for (const std::string &out : o.outputs) written.push_back({"--output", out});
    for (size_t a = 0; a < written.size(); ++a)
      for (size_t b = a + 1; b < written.size(); ++b)
        if (!written[a].second.empty() && written[a].second == written[b].second)
          die(written[a].first + " and " + written[b].first + " both write '" + written[a].second +
              "': give each its own path");
  }
  if (o.saveFormat == "boxes") {
    if (o.saveWeights.empty() && o.saveOptimizer.empty())
      die("--save-format boxes: nothing is saved (--save-weights or --save-optimizer)");
    for (const std::string *path : {&o.saveWeights, &o.saveOptimizer})
      if (!path->empty() && !isFolderPath(*path))
        die("--save-format boxes writes a folder (one file a rank and boxes.index.json): '" + *path +
            "' is not one (end it with '/')");
  }
  if (o.zeroGiven && o.optimizer.zero && o.optimizer.kind != "adamw")
    die("--zero and --zero-stage split AdamW's states: they need --optimizer adamw");
#ifndef PARAX_WITH_CUDA
  if (o.device == "cuda") die("--device cuda: this parax-run was built without CUDA");
#endif
  return o;
}

} // namespace parax::run
