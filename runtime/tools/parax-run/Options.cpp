// Options.cpp - parax-run's command line (Options.h).

#include "Options.h"

#include <sys/stat.h>

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>
#include <vector>

namespace parax::run {

bool launchedByMpi() {
  for (const char *name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "SLURM_PROCID"})
    if (std::getenv(name))
      return true;
  return false;
}

bool isFolderPath(const std::string &path) {
  struct stat st;
  return (!path.empty() && path.back() == '/') || (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode));
}


namespace {

using Die = std::function<void(const std::string &)>;

// One flag: its name, its value's placeholder (null: a switch), the
// section of the help it is in, its help text, and what it sets.
struct Flag {
  const char *name, *value, *section, *help;
  std::function<void(Options &, const std::string &)> set;
};

// Values, checked: a count in [lo, hi] (`what` in the message), a number.
long long count(const std::string &flag, const std::string &text, long long lo, long long hi, const std::string &what,
                const Die &die) {
  char *end = nullptr;
  long long n = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end || n < lo || n > hi) die(flag + " must be " + what + ", got '" + text + "'");
  return n;
}

double number(const std::string &text, bool *ok) {
  char *end = nullptr;
  double n = std::strtod(text.c_str(), &end);
  *ok = !text.empty() && !*end && std::isfinite(n);
  return n;
}

// --lr, --beta1, --beta2, --eps, --weight-decay, --clip-grad-norm, --min-lr
Flag real(const char *name, const char *help, double OptimizerConfig::*slot, const Die &die) {
  return Flag{name, "X", "training", help, [=](Options &o, const std::string &text) {
                std::string arg = name;
                bool ok;
                double n = number(text, &ok);
                bool beta = arg == "--beta1" || arg == "--beta2";
                bool positive = arg == "--lr" || arg == "--eps";
                if (!ok || n < 0 || (beta && n >= 1) || (positive && n == 0))
                  die(arg + " must be a " +
                      (beta ? "number in [0, 1)" : positive ? "positive number" : "non-negative number") +
                      ", got '" + text + "'");
                o.optimizer.*slot = n;
                o.optimizerSettings = true;
              }};
}

// A path into `slot` (`training`: a setting of the optimizer's).
Flag path(const char *name, const char *value, const char *section, const char *help, std::string Options::*slot,
          bool training) {
  return Flag{name, value, section, help, [=](Options &o, const std::string &text) {
                o.*slot = text;
                if (training) o.optimizerSettings = true;
              }};
}

// --temperature, --top-k, --seed
Flag sampling(const char *name, const char *value, const char *help, const Die &die) {
  return Flag{name, value, "generation", help, [=](Options &o, const std::string &text) {
                std::string arg = name;
                bool ok;
                double n = number(text, &ok);
                bool whole = ok && n == static_cast<double>(static_cast<long long>(n));
                if (!ok || !(n >= 0) || (arg != "--temperature" && (!whole || n > 9e15)))
                  die(arg + " must be a non-negative " + (arg == "--temperature" ? "number" : "integer") +
                      ", got '" + text + "'");
                if (arg == "--temperature") o.sampling.temperature = n;
                else if (arg == "--top-k") o.sampling.topK = static_cast<int64_t>(n);
                else o.sampling.seed = static_cast<uint64_t>(n);
                o.samplingGiven = true;
              }};
}

// Every flag parax-run takes, in the order --help lists them. `die` ends
// the run naming a bad value (the help needs none of them).
std::vector<Flag> flags(const Die &die) {
  return {
      {"--weights", "W", "run",
       "the checkpoint: a .safetensors file, a sharded checkpoint's index (*.index.json), a box-wise one, or a "
       "folder holding one",
       [](Options &o, const std::string &v) { o.weights = v; }},
      {"--input", "X.npy", "run", "an input, in the program's order (tokens, then labels, ...); once each",
       [](Options &o, const std::string &v) { o.inputs.push_back(v); }},
      {"--output", "OUT.npy", "run",
       "a result, in the program's order (the logits; a decode step built --return-kv: then each layer's new keys "
       "and values; a training step: the loss, then each parameter's gradient, averaged over microbatches and "
       "replicas)",
       [](Options &o, const std::string &v) { o.outputs.push_back(v); }},
      path("--output-dir", "DIR", "run",
           "every result into DIR (an existing folder): a gradient as <checkpoint name>.npy (a fused tensor's piece "
           "<name>@<offsets>.npy), any other result as result<k>.npy",
           &Options::outputDir, false),
      {"--steps", "K", "run",
       "run K steps (with --optimizer: K optimizer steps); 0: prepare only (load the weights, plan memory): every "
       "rank reports the parameter values it holds and, on cuda, the device memory it took",
       [&](Options &o, const std::string &v) {
         o.steps = static_cast<int>(count("--steps", v, 0, 1000000000, "a count of steps", die));
         o.stepsGiven = true;
       }},
      {"--device", "cpu|cuda", "run", "where the program runs (default cpu)",
       [](Options &o, const std::string &v) { o.device = v; }},
      {"--quiet", nullptr, "run", "no line a training step and no generation progress: the summary only",
       [](Options &o, const std::string &) { o.quiet = true; }},
      {"--allow-unused-weights", nullptr, "run",
       "run although the checkpoint holds tensors the program never reads (refused otherwise: a model other "
       "than the one compiled)",
       [](Options &o, const std::string &) { o.allowUnusedWeights = true; }},
      path("--profile", "P.json", "run",
           "each instruction's wall time, the median over the steps (cuda: over 3 more steps timed by device "
           "events), with its shapes, attributes and the ranks a collective spans (rank 0: P.json, rank r: "
           "P.json.rank<r>): what parax-plan --calibrate fits a cluster and profile to",
           &Options::profilePath, false),
      {"--generate", "K", "generation",
       "K tokens after each prompt row (--input: the prompt's tokens [rows, L], a shorter prompt ending in -1s) "
       "with a generation step (built --seq 1 --cache C): outputs the tokens [rows, L + K] and each step's "
       "logits [rows, L + K - 1, V]; rows of several batches a replica run as microbatches, each with its own "
       "KV caches",
       [&](Options &o, const std::string &v) {
         o.generate = static_cast<long>(count("--generate", v, 1, 1000000, "a positive count of tokens", die));
       }},
      path("--prefill", "CHUNK.pxe", "generation",
           "the prompt's first tokens in chunks of CHUNK's --seq (built like the step, with --seq P), writing the "
           "same caches",
           &Options::prefillPath, false),
      sampling("--temperature", "T", "draw each token from softmax(logits / T) (default: the most likely)", die),
      sampling("--top-k", "K", "draw from the K most likely (0: all)", die),
      {"--top-p", "P", "generation",
       "then from the fewest of them, most likely first, holding P of their probability (default 1: all)",
       [&](Options &o, const std::string &v) {
         bool ok;
         double n = number(v, &ok);
         if (!ok || !(n > 0 && n <= 1)) die("--top-p must be a probability in (0, 1], got '" + v + "'");
         o.sampling.topP = n;
         o.samplingGiven = true;
       }},
      sampling("--seed", "S", "draws reproducible from S", die),
      {"--stop-token", "ID", "generation",
       "a row that generates ID generates nothing more (its later tokens are ID); the loop ends when every row "
       "has",
       [&](Options &o, const std::string &v) {
         o.stopToken = count("--stop-token", v, 0, INT32_MAX, "a token id", die);
       }},
      {"--optimizer", "sgd|adamw", "training",
       "with a training step (compile --train): each step's gradients (averaged over its microbatches and the "
       "replicas) update every rank's parameter boxes in place, in fp32 (cuda: the device optimizer)",
       [&](Options &o, const std::string &v) {
         o.optimizer.kind = v;
         if (v != "sgd" && v != "adamw") die("--optimizer must be sgd or adamw, got '" + v + "'");
       }},
      real("--lr", "the learning rate (default 1e-3)", &OptimizerConfig::lr, die),
      real("--beta1", "AdamW's beta1 (default 0.9)", &OptimizerConfig::beta1, die),
      real("--beta2", "AdamW's beta2 (default 0.999)", &OptimizerConfig::beta2, die),
      real("--eps", "AdamW's epsilon (default 1e-8)", &OptimizerConfig::eps, die),
      real("--weight-decay", "decoupled weight decay, matrices only (default 0)", &OptimizerConfig::weightDecay, die),
      real("--clip-grad-norm", "the gradients' global L2 norm at most N (default: no clipping)",
           &OptimizerConfig::clipNorm, die),
      {"--lr-schedule", "constant|linear|cosine", "training", "the learning rate's schedule (default constant)",
       [&](Options &o, const std::string &v) {
         o.optimizer.schedule = v;
         if (v != "constant" && v != "linear" && v != "cosine")
           die("--lr-schedule must be constant, linear or cosine, got '" + v + "'");
         o.optimizerSettings = true;
       }},
      {"--warmup-steps", "W", "training", "the learning rate t/W at first",
       [&](Options &o, const std::string &v) {
         o.optimizer.warmupSteps = count("--warmup-steps", v, 0, 1000000000, "a count of steps", die);
         o.optimizerSettings = true;
       }},
      {"--decay-steps", "D", "training", "down to --min-lr by step D (default: the run's last step)",
       [&](Options &o, const std::string &v) {
         o.optimizer.decaySteps = count("--decay-steps", v, 0, 1000000000, "a count of steps", die);
         o.optimizerSettings = true;
       }},
      real("--min-lr", "where a schedule decays to (default 0)", &OptimizerConfig::minLr, die),
      {"--zero", nullptr, "training",
       "ZeRO-1: AdamW's states split over the ranks holding each box, gradients reduce-scattered, parameters "
       "all-gathered (by default the plan's stage)",
       [&](Options &o, const std::string &) {
         o.zeroGiven = o.optimizer.zero = true;
         o.optimizer.zeroStage = 1;
         o.optimizerSettings = true;
       }},
      {"--no-zero", nullptr, "training", "no ZeRO, whatever the plan says",
       [&](Options &o, const std::string &) {
         o.zeroGiven = true;
         o.optimizer.zero = false;
         o.optimizer.zeroStage = 0;
         o.optimizerSettings = true;
       }},
      {"--zero-stage", "0|1|2|3", "training",
       "the ZeRO stage (cuda's device optimizer, 2: the gradient sums split too; 3: the parameters too, each "
       "gathered before the instructions that read it)",
       [&](Options &o, const std::string &v) {
         if (v != "0" && v != "1" && v != "2" && v != "3") die("--zero-stage must be 0, 1, 2 or 3, got '" + v + "'");
         o.zeroGiven = true;
         o.optimizer.zeroStage = std::stoi(v);
         o.optimizer.zero = o.optimizer.zeroStage > 0;
         o.optimizerSettings = true;
       }},
      {"--step-rows", "R", "training", "each step takes the next R rows of the inputs, cycling (default: all)",
       [&](Options &o, const std::string &v) {
         o.stepRows = count("--step-rows", v, 1, LLONG_MAX, "a positive count of rows", die);
         o.optimizerSettings = true;
       }},
      {"--per-token-loss", nullptr, "training",
       "with labels ignored (built with ignore_index): the loss the mean over every counted label of the step "
       "(default: each microbatch's mean, averaged)",
       [](Options &o, const std::string &) { o.perTokenLoss = true; }},
      {"--bias-update-speed", "G", "training",
       "DeepSeek-V3's auxiliary-loss-free balancing: after each step every router's correction bias moves G "
       "towards balance",
       [&](Options &o, const std::string &v) {
         bool ok;
         o.biasSpeed = number(v, &ok);
         if (!ok || o.biasSpeed <= 0) die("--bias-update-speed must be a positive number, got '" + v + "'");
         o.optimizerSettings = true;
       }},
      {"--skip-nonfinite", nullptr, "training",
       "a step whose gradients are not finite is skipped (counted at the end) instead of stopping the run",
       [&](Options &o, const std::string &) {
         o.optimizer.skipNonfinite = true;
         o.optimizerSettings = true;
       }},
      path("--losses", "L.npy", "training", "each step's loss", &Options::lossesPath, false),
      {"--balance-losses", "B.npy", "training", "each step's MoE load-balancing loss (already in the loss)",
       [](Options &o, const std::string &v) { o.terms[0].path = v; }},
      {"--mtp-losses", "M.npy", "training", "each step's weighted multi-token prediction loss (already in the loss)",
       [](Options &o, const std::string &v) { o.terms[1].path = v; }},
      path("--log-json", "L.jsonl", "training",
           "one JSON object a training step (step, loss and its terms, grad_norm, clipped, lr, seconds, "
           "tokens_per_s, eta_s), quiet or not",
           &Options::logJsonPath, false),
      path("--save-weights", "OUT", "checkpoints",
           "the updated parameters: OUT.safetensors (whole tensors), or OUT/ (a folder): a sharded checkpoint, "
           "each rank writing its share",
           &Options::saveWeights, false),
      path("--save-optimizer", "S", "checkpoints",
           "AdamW's moments and step count, to resume (a file or a folder, as --save-weights)",
           &Options::saveOptimizer, true),
      path("--load-optimizer", "S", "checkpoints", "resume from --save-optimizer's state", &Options::loadOptimizer,
           true),
      {"--save-format", "whole|boxes", "checkpoints",
       "boxes: --save-weights OUT/ and --save-optimizer S/ write each rank's own boxes, nothing gathered "
       "(boxes.index.json: each tensor's boxes), read back under any plan (default whole)",
       [&](Options &o, const std::string &v) {
         o.saveFormat = v;
         if (v != "whole" && v != "boxes") die("--save-format must be whole or boxes, got '" + v + "'");
         o.optimizerSettings = true;
       }},
      {"--save-every", "K", "checkpoints",
       "also every K steps (but the last): OUT/ as OUT/step-0000000K/, OUT.safetensors as "
       "OUT-step-0000000K.safetensors",
       [&](Options &o, const std::string &v) {
         o.saveEvery = count("--save-every", v, 1, LLONG_MAX, "a positive count of steps", die);
         o.optimizerSettings = true;
       }},
  };
}

// The environment switches (none changes a result; checks and fallbacks).
const std::pair<const char *, const char *> kEnvironment[] = {
    {"OMP_NUM_THREADS=T", "CPU: T threads a GEMM (oneDNN's, on OpenMP; default: the cores mpirun bound the rank "
                          "to, else the node's cores shared among its ranks)"},
    {"PARAX_COLLECTIVE_TIMEOUT=S (or PARAX_NCCL_TIMEOUT)",
     "a collective not finished after S seconds ends the job, naming rank and operation (default 300)"},
    {"PARAX_CUDA_OVERLAP=0", "the GPU waits for each collective right after it"},
    {"PARAX_CUDA_GRAPHS=0", "no CUDA graphs"},
    {"PARAX_ATTENTION=kernels", "attention and its gradient on parax's own kernels, never cuDNN's SDPA"},
    {"PARAX_ATTENTION=cuda-cores", "bf16 attention and its gradient on parax's kernels without tensor cores"},
    {"PARAX_CUDA_PROFILE=1", "after the timed steps, one more step timed op by op"},
    {"PARAX_CUDA_FUSE_GELU=0", "no gelu in cuBLASLt's GELU_BIAS epilogue"},
    {"PARAX_EXPERTS=grouped|per-expert", "MoE experts as one grouped GEMM a projection, or GEMMs per expert"},
    {"PARAX_CUDA_SHARE_TEMPORARIES=0", "one device allocation a temporary"},
    {"PARAX_CUDA_POISON_DEAD=1", "a check: every temporary filled with NaN after its last use"},
    {"PARAX_CUDA_OPTIMIZER=host", "the optimizer on the host (fp32 masters there)"},
    {"PARAX_CUDA_BUCKET_BYTES=N", "without ZeRO, the device optimizer's gradient buckets of up to N bytes"},
};

} // namespace

void usage() {
  std::fprintf(stderr,
               "usage: mpirun -np N parax-run MODEL.pxe --weights W --input X.npy [--output OUT.npy] [--steps K]\n"
               "       mpirun -np N parax-run STEP.pxe --weights W --input PROMPT.npy --generate K [--output T.npy]\n"
               "       mpirun -np N parax-run TRAIN.pxe --weights W --input X.npy --input Y.npy --optimizer adamw\n"
               "(N: the executable's grid size; every flag takes its value as --flag VALUE or --flag=VALUE)\n");
  const char *section = "";
  for (const Flag &f : flags([](const std::string &) {})) {
    if (std::string(section) != f.section)
      std::fprintf(stderr, "\n%s:\n", section = f.section);
    std::string head = std::string("  ") + f.name + (f.value ? std::string(" ") + f.value : std::string());
    // the help in lines of at most 100 columns, under its own column
    std::string line = head + std::string(head.size() < 29 ? 29 - head.size() : 1, ' ');
    size_t indent = std::max<size_t>(29, head.size() + 1), at = 0;
    std::string help = f.help;
    while (at < help.size()) {
      size_t room = 100 - std::min<size_t>(line.size(), 90), end = std::min(help.size(), at + room);
      if (end < help.size())
        if (size_t space = help.rfind(' ', end); space != std::string::npos && space > at) end = space;
      line += help.substr(at, end - at);
      std::fprintf(stderr, "%s\n", line.c_str());
      at = end + (end < help.size() && help[end] == ' ');
      line = std::string(indent, ' ');
    }
  }
  std::fprintf(stderr, "\nenvironment:\n");
  for (const auto &[name, help] : kEnvironment)
    std::fprintf(stderr, "  %s: %s\n", name, help);
}

Options parseOptions(int argc, char **argv, const std::function<void(const std::string &)> &die) {
  Options o;
  const std::vector<Flag> table = flags(die);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      usage();
      o.help = true;
      return o;
    }
    if (arg.empty() || arg[0] != '-') {
      o.model = arg;
      continue;
    }
    // --name=value is --name value.
    std::string given;
    bool inline_ = false;
    if (size_t eq = arg.find('='); arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      given = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
      inline_ = true;
    }
    auto flag = std::find_if(table.begin(), table.end(), [&](const Flag &f) { return arg == f.name; });
    if (flag == table.end()) die("unknown option " + arg);
    if (flag->value && !inline_) {
      if (i + 1 >= argc) {
        usage();
        die("missing value after " + arg);
      }
      given = argv[++i];
    } else if (!flag->value && inline_) {
      die(arg + " takes no value");
    }
    flag->set(o, given);
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
