//===- parax-plan.cpp - rank TP / PP / DP / EP plans for a model ----------===//
//
//   parax-plan MODEL.mlir|PRESET --cluster C [--profile P] --workload W [--top K] [--json]
//
// A PRESET is built with the Python model builder (python -m parax.models) at
// the workload's sequence length. Exit status: 0 with plans, 1 on bad input,
// 2 when nothing fits (the explanation is printed).
//
//===----------------------------------------------------------------------===//

#include "parax/Dialect/Parax/IR/ParaxOps.h"
#include "parax/InitAll.h"
#include "parax/Plan/Calibration.h"
#include "parax/Plan/Planner.h"
#include "parax/Plan/Timeline.h"

#include "mlir/Dialect/Func/IR/FuncOps.h"
#include "mlir/IR/MLIRContext.h"
#include "mlir/IR/Verifier.h"
#include "mlir/Parser/Parser.h"
#include "llvm/ADT/StringExtras.h"
#include "llvm/Support/CommandLine.h"
#include "llvm/Support/FileSystem.h"
#include "llvm/Support/FormatVariadic.h"
#include "llvm/Support/InitLLVM.h"
#include "llvm/Support/MemoryBuffer.h"
#include "llvm/Support/Program.h"
#include "llvm/Support/SourceMgr.h"
#include "llvm/Support/raw_ostream.h"

#include <chrono>
#include <cstdlib>

using namespace llvm;
using namespace parax::plan;

// parax-plan's own options: --help lists these only (not the options every
// LLVM library registers).
static cl::OptionCategory planOptions("parax-plan options");

static cl::opt<std::string> input(cl::Positional, cl::Optional,
                                  cl::desc("<model.mlir | preset>"), cl::cat(planOptions));
static cl::opt<std::string> clusterOpt("cluster",
                                       cl::desc("cluster preset (PRESET[:nodes=N]) or JSON file"), cl::cat(planOptions));
static cl::opt<std::string> workloadOpt(
    "workload",
    cl::desc("train:batch=B,seq=S | prefill:batch=B,seq=S | "
             "decode:batch=B,context=C, then any of "
             "tp= pp= dp= ep= cp= (pin a degree), mbs=, zero=0..3, "
             "recompute=none|selective|full, "
             "schedule=gpipe|1f1b|interleaved, chunks=, capacity= (expert "
             "capacity, >= 1), gemm=fp8|bf16|f16|f32 (the GEMMs' dtype), "
             "sp=0|1, attention=flash|materialized, kv=<dtype>, "
             "objective=latency|throughput, latency_ms= (docs/planner.md)"),
    cl::cat(planOptions));
static cl::opt<int> topOpt("top", cl::init(5), cl::desc("number of plans to show"), cl::cat(planOptions));
static cl::opt<bool> jsonOpt("json", cl::desc("print JSON instead of a table"), cl::cat(planOptions));
static cl::opt<bool> timingOpt("timing",
                               cl::desc("print the search time to stderr"), cl::cat(planOptions));
static cl::opt<std::string> timelineOpt(
    "timeline", cl::value_desc("file"),
    cl::desc("write the best plan's step as Chrome trace events (chrome://tracing, "
             "ui.perfetto.dev), simulated with the plan's costs: training, each pipeline stage's "
             "passes in the order parax-run runs them; prefill and decode, the microbatches "
             "through the stages"),
    cl::cat(planOptions));
static cl::opt<std::string> profileOpt(
    "profile", cl::init("roofline"), cl::value_desc("name|file.json"),
    cl::desc("the software stack's profile"), // (the shipped names added in main)
    cl::cat(planOptions));
static cl::list<std::string> calibrateOpt(
    "calibrate", cl::CommaSeparated, cl::value_desc("P.json,..."),
    cl::desc("fit the cluster (--cluster, its counts and memory kept) and a profile to what "
             "parax-run --profile measured; write them with --calibrated (docs/cost-model.md, "
             "Calibration)"),
    cl::cat(planOptions));
static cl::opt<std::string> calibratedOpt(
    "calibrated", cl::value_desc("prefix"),
    cl::desc("--calibrate's output: <prefix>.cluster.json and <prefix>.profile.json"),
    cl::cat(planOptions));
static cl::opt<bool> explainOpt("explain",
                                cl::desc("after the table: the best plan's cost terms with their inputs "
                                         "(each distinct layer's ops and collectives, each GEMM's and attention's work on a device "
                                         "and the rate it is costed at, how the step adds up)"),
                                cl::cat(planOptions));
static cl::opt<bool> printProfile("print-profile",
                                  cl::desc("print the profile as JSON and exit"), cl::cat(planOptions));
static cl::opt<bool> printCluster("print-cluster",
                                  cl::desc("print the cluster as JSON and exit"), cl::cat(planOptions));

#ifndef PARAX_PYTHON_EXECUTABLE
#define PARAX_PYTHON_EXECUTABLE "python3"
#endif
#ifndef PARAX_PYTHON_DIR
#define PARAX_PYTHON_DIR ""
#endif

// Builds a preset with the Python model builder into `path`.
static bool buildPreset(StringRef preset, int64_t seq, StringRef path) {
  const char *python = std::getenv("PARAX_PYTHON");
  std::string exe = python ? python : PARAX_PYTHON_EXECUTABLE;
  ErrorOr<std::string> found = sys::findProgramByName(exe);
  if (!found) {
    errs() << "parax-plan: cannot find the Python interpreter '" << exe << "'\n";
    return false;
  }
  std::string seqText = std::to_string(seq);
  SmallVector<StringRef> args = {*found, "-m", "parax.models", preset,
                                 "--seq", seqText, "-o", path};
  // The child inherits our environment, with the package on its path.
  ::setenv("PYTHONPATH", PARAX_PYTHON_DIR, /*overwrite=*/1);
  std::string error;
  int rc = sys::ExecuteAndWait(*found, args, /*Env=*/std::nullopt, {},
                               /*SecondsToWait=*/300, 0, &error);
  if (rc != 0) {
    errs() << "parax-plan: building preset '" << preset << "' failed"
           << (error.empty() ? "" : ": " + error) << "\n";
    return false;
  }
  return true;
}

int main(int argc, char **argv) {
  InitLLVM init(argc, argv);
  cl::HideUnrelatedOptions(planOptions);
  // The shipped profiles, as Profile.cpp lists them.
  static const std::string profileHelp =
      "the software stack's profile: " + llvm::join(profileNames(), ", ") +
      " (roofline, the default: ideal kernels), or a JSON file (docs/cost-model.md, Profiles)";
  profileOpt.setDescription(profileHelp);
  cl::ParseCommandLineOptions(argc, argv, "parax planner\n");

  // A profile stands alone: --print-profile needs nothing else.
  Expected<Profile> profile = resolveProfile(profileOpt);
  if (!profile) {
    errs() << "parax-plan: " << toString(profile.takeError()) << "\n";
    return 1;
  }
  if (printProfile) {
    outs() << profile->toJson() << "\n";
    return 0;
  }
  if (clusterOpt.empty()) {
    errs() << "parax-plan: needs --cluster (a preset such as dgx-h100:nodes=4, or a JSON file)\n";
    return 1;
  }
  Expected<ClusterSpec> cluster = resolveCluster(clusterOpt);
  if (!cluster) {
    errs() << "parax-plan: " << toString(cluster.takeError()) << "\n";
    return 1;
  }
  if (printCluster) {
    outs() << cluster->toJson() << "\n";
    return 0;
  }
  if (!calibrateOpt.empty()) {
    if (calibratedOpt.empty()) {
      errs() << "parax-plan: --calibrate needs --calibrated PREFIX (where to write the fit)\n";
      return 1;
    }
    std::vector<std::string> texts, names;
    for (const std::string &path : calibrateOpt) {
      ErrorOr<std::unique_ptr<MemoryBuffer>> file = MemoryBuffer::getFile(path);
      if (!file) {
        errs() << "parax-plan: --calibrate: cannot read '" << path << "': " << file.getError().message() << "\n";
        return 1;
      }
      texts.push_back((*file)->getBuffer().str());
      names.push_back(path);
    }
    Expected<Calibration> fit = calibrate(*cluster, texts, names);
    if (!fit) {
      errs() << "parax-plan: " << toString(fit.takeError()) << "\n";
      return 1;
    }
    for (auto [suffix, text] : {std::pair<const char *, std::string>{".cluster.json", fit->cluster.toJson()},
                                {".profile.json", fit->cluster.profile.toJson()}}) {
      std::error_code ec;
      raw_fd_ostream file(calibratedOpt + suffix, ec);
      if (ec) {
        errs() << "parax-plan: --calibrated: cannot write '" << calibratedOpt + suffix << "': " << ec.message()
               << "\n";
        return 1;
      }
      file << text << "\n";
    }
    outs() << fit->report << formatv("wrote {0}.cluster.json and {0}.profile.json\n", calibratedOpt);
    return 0;
  }
  if (input.empty() || workloadOpt.empty()) {
    errs() << "parax-plan: needs a model (MODEL.mlir or a preset) and --workload\n";
    return 1;
  }
  cluster->profile = *profile;
  Expected<Workload> workload = parseWorkload(workloadOpt);
  if (!workload) {
    errs() << "parax-plan: " << toString(workload.takeError()) << "\n";
    return 1;
  }
  std::string path = input;
  SmallString<128> temp;
  if (!sys::fs::exists(path)) {
    if (std::error_code ec = sys::fs::createTemporaryFile("parax-plan", "mlir", temp)) {
      errs() << "parax-plan: cannot create a temporary file: " << ec.message() << "\n";
      return 1;
    }
    int64_t seq = workload->kind == WorkloadKind::Decode ? 16 : workload->seq;
    if (!buildPreset(input, seq, temp))
      return 1;
    path = temp.str().str();
  }

  mlir::DialectRegistry registry;
  parax::registerAllDialects(registry);
  mlir::MLIRContext context(registry);
  context.loadAllAvailableDialects();
  llvm::SourceMgr sourceMgr;
  mlir::SourceMgrDiagnosticHandler handler(sourceMgr, &context);
  mlir::OwningOpRef<mlir::ModuleOp> module =
      mlir::parseSourceFile<mlir::ModuleOp>(path, sourceMgr, &context);
  if (!temp.empty())
    sys::fs::remove(temp);
  if (!module)
    return 1;
  mlir::func::FuncOp model;
  for (auto function : module->getOps<mlir::func::FuncOp>())
    if (!function.isExternal() && !function.getBody().getOps<parax::EmbeddingOp>().empty()) {
      model = function;
      break;
    }
  if (!model) {
    errs() << "parax-plan: " << input << " has no model function (a func.func "
           << "with a parax.embedding)\n";
    return 1;
  }
  mlir::FailureOr<ModelGraph> graph = analyzeModel(model);
  if (mlir::failed(graph))
    return 1;
  *workload = resolveWorkload(*workload, *graph);
  if (workload->kind != WorkloadKind::Decode && graph->irSeq != workload->seq)
    errs() << formatv("parax-plan: note: the IR was built for sequence {0}; "
                      "costs are scaled to the workload's {1}\n",
                      graph->irSeq, workload->seq);

  PlanOptions options;
  options.topK = topOpt;
  auto start = std::chrono::steady_clock::now();
  PlanResult result = searchPlans(*graph, *cluster, *workload, options);
  double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (jsonOpt)
    outs() << formatv("{0:2}", plansToJson(result, *cluster, *workload)) << "\n";
  else
    outs() << formatPlans(result, *cluster, *workload);
  if (explainOpt && !jsonOpt && !result.plans.empty())
    outs() << explainPlan(*graph, *cluster, *workload, result.plans.front());
  if (timingOpt)
    errs() << formatv("search time: {0:F4} s ({1} configurations)\n", seconds,
                      result.evaluated);
  if (!timelineOpt.empty() && result.plans.empty())
    errs() << "parax-plan: --timeline: no plan, so no timeline written to '" << timelineOpt << "'\n";
  if (!timelineOpt.empty() && !result.plans.empty()) {
    const Plan &best = result.plans.front();
    Expected<PipelineTimeline> timeline = workload->kind == WorkloadKind::Train
                                              ? simulatePipeline(best)
                                              : simulateInference(best);
    if (!timeline) {
      errs() << "parax-plan: --timeline: " << toString(timeline.takeError()) << "\n";
      return 1;
    }
    std::error_code ec;
    raw_fd_ostream file(timelineOpt, ec);
    if (ec) {
      errs() << "parax-plan: --timeline: cannot write '" << timelineOpt << "': " << ec.message() << "\n";
      return 1;
    }
    writeChromeTrace(best, *timeline, file);
    if (workload->kind == WorkloadKind::Train)
      errs() << formatv("timeline: {0}: the pipeline in parax-run's order takes {1:F3} s a step, simulated "
                        "({2:F3} s with what follows it); the plan's formula: {3:F3} s\n",
                        timelineOpt, timeline->makespan, timeline->makespan + best.tailTime, best.stepTime);
    else
      errs() << formatv("timeline: {0}: {1} microbatch(es) through {2} stage(s) take {3:F4} s, simulated; "
                        "the plan's formula: {4:F4} s\n",
                        timelineOpt, best.microBatches, best.pp, timeline->makespan, best.stepTime);
  }
  return result.plans.empty() ? 2 : 0;
}
