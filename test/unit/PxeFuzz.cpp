// parax-pxe-fuzz - hostile executables against the runtime: a valid .pxe is
// mutated at random (fields of any message set to edge values, repeated
// fields cut or grown, map entries dropped, bytes of the file flipped or cut)
// and each mutant is loaded, validated and, when it is accepted, prepared and
// run on all its ranks (threads of this process, in-process communicators);
// then the weights and the inputs are damaged the same way (bytes changed,
// mostly in their headers, or the file cut) and used by the valid
// executable (weights in a folder, a sharded or box-wise checkpoint: one of
// its files, the index half the time, in a copy of the folder). Every
// mutant must end in a named error, a stall the watchdog
// ends, or a run: a crash, an uncaught exception or a hang (the harness's
// timeout) is a failure.
//
//   parax-pxe-fuzz SEED.pxe WEIGHTS.safetensors|WEIGHTS/ [INPUT.npy ...]
//       [--mutants N] [--seed S] [--device cpu|cuda]
//
// --device cuda (parax-pxe-fuzz-simt: the CUDA backend on the SIMT emulator,
// whose device allocations are exact, so that under AddressSanitizer a
// kernel reading past a buffer fails) prepares and runs the accepted mutants
// on the CUDA backend instead; one-rank executables only (the emulator's
// NCCL joins the ranks of an MPI world, not threads).
//
// Prints, before each mutant, what was changed (so that a crash names it),
// and at the end how many were refused at parse, at validation, at prepare,
// at run, how many stalled, and how many ran.

#include "parax/runtime/Checkpoint.h"
#include "parax/runtime/Communicator.h"
#include "parax/runtime/Executable.h"
#include "parax/runtime/Executor.h"
#ifdef PARAX_WITH_CUDA
#include "parax/runtime/CudaExecutor.h"
#endif

#include <google/protobuf/descriptor.h>
#include <google/protobuf/io/coded_stream.h>
#include <google/protobuf/io/zero_copy_stream_impl_lite.h>
#include <google/protobuf/message.h>
#include <google/protobuf/reflection.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <mutex>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

using namespace parax::runtime;
namespace pb = google::protobuf;
namespace pxe = parax::pxe;

namespace {

/// The values a hostile file would put in an integer field.
int64_t edgeValue(std::mt19937_64 &rng, int64_t original) {
  static const int64_t edges[] = {-1, 0, 1, 2, 3, 7, 64, 1 << 20, int64_t(1) << 31, int64_t(1) << 40,
                                  INT32_MAX, INT64_MAX, INT64_MIN};
  switch (rng() % 3) {
  case 0: return edges[rng() % (sizeof edges / sizeof edges[0])];
  case 1: return original + static_cast<int64_t>(rng() % 5) - 2;
  default: return static_cast<int64_t>(rng() % 64);
  }
}

/// Element `k` of a repeated field in a fixed order. A map's entries, seen
/// as a repeated field, come in the order of the map's hashing, which
/// protobuf seeds differently in every process: they are taken sorted by
/// their bytes (the key first), so that a seed names the same mutants in
/// every run.
int elementIndex(const pb::Message &message, const pb::FieldDescriptor *field, int k) {
  if (!field->is_map()) return k;
  const pb::Reflection *reflection = message.GetReflection();
  std::vector<std::pair<std::string, int>> entries;
  for (int i = 0, n = reflection->FieldSize(message, field); i < n; ++i)
    entries.emplace_back(reflection->GetRepeatedMessage(message, field, i).SerializePartialAsString(), i);
  std::sort(entries.begin(), entries.end());
  return entries[k].second;
}

/// The message's bytes with map entries in key order (see elementIndex).
std::string serializeDeterministically(const pb::Message &message) {
  std::string bytes;
  {
    pb::io::StringOutputStream stream(&bytes);
    pb::io::CodedOutputStream coded(&stream);
    coded.SetSerializationDeterministic(true);
    message.SerializePartialToCodedStream(&coded); // what SerializeToString writes, without its checks
  }
  return bytes;
}

/// Changes one field somewhere below `message`; returns what it did.
std::string mutate(pb::Message &message, std::mt19937_64 &rng, const std::string &path) {
  const pb::Descriptor *type = message.GetDescriptor();
  const pb::Reflection *reflection = message.GetReflection();
  std::vector<const pb::FieldDescriptor *> fields;
  for (int i = 0; i < type->field_count(); ++i) fields.push_back(type->field(i));
  if (fields.empty()) return path + ": nothing to change";
  const pb::FieldDescriptor *field = fields[rng() % fields.size()];
  std::string where = path + "." + field->name();
  if (field->is_repeated()) {
    int n = reflection->FieldSize(message, field);
    int action = rng() % 4;
    if (n > 0 && action == 0) { // drop the last element
      reflection->SwapElements(&message, field, elementIndex(message, field, n - 1), n - 1);
      reflection->RemoveLast(&message, field);
      return where + ": last of " + std::to_string(n) + " removed";
    }
    if (n > 0 && action == 1 && field->cpp_type() != pb::FieldDescriptor::CPPTYPE_MESSAGE) {
      reflection->SwapElements(&message, field, rng() % n, rng() % n);
      return where + ": two elements swapped";
    }
    if (n == 0 || action == 2) { // grow by one
      switch (field->cpp_type()) {
      case pb::FieldDescriptor::CPPTYPE_INT32: reflection->AddInt32(&message, field, edgeValue(rng, 0)); break;
      case pb::FieldDescriptor::CPPTYPE_INT64: reflection->AddInt64(&message, field, edgeValue(rng, 0)); break;
      case pb::FieldDescriptor::CPPTYPE_STRING: reflection->AddString(&message, field, "tp"); break;
      case pb::FieldDescriptor::CPPTYPE_MESSAGE:
        if (n > 0)
          reflection->AddMessage(&message, field)
              ->CopyFrom(reflection->GetRepeatedMessage(message, field, elementIndex(message, field, 0)));
        else reflection->AddMessage(&message, field);
        break;
      default: return where + ": left";
      }
      return where + ": one element added";
    }
    int k = rng() % n;
    where += "[" + std::to_string(k) + "]";
    k = elementIndex(message, field, k);
    switch (field->cpp_type()) {
    case pb::FieldDescriptor::CPPTYPE_INT32: {
      int64_t v = edgeValue(rng, reflection->GetRepeatedInt32(message, field, k));
      reflection->SetRepeatedInt32(&message, field, k, static_cast<int32_t>(v));
      return where + " = " + std::to_string(static_cast<int32_t>(v));
    }
    case pb::FieldDescriptor::CPPTYPE_INT64: {
      int64_t v = edgeValue(rng, reflection->GetRepeatedInt64(message, field, k));
      reflection->SetRepeatedInt64(&message, field, k, v);
      return where + " = " + std::to_string(v);
    }
    case pb::FieldDescriptor::CPPTYPE_STRING: {
      static const char *names[] = {"", "tp", "dp", "pp", "linear", "model.norm.weight", "x{e}"};
      std::string v = names[rng() % (sizeof names / sizeof names[0])];
      reflection->SetRepeatedString(&message, field, k, v);
      return where + " = '" + v + "'";
    }
    case pb::FieldDescriptor::CPPTYPE_MESSAGE:
      return mutate(*reflection->MutableRepeatedMessage(&message, field, k), rng, where);
    default: return where + ": left";
    }
  }
  switch (field->cpp_type()) {
  case pb::FieldDescriptor::CPPTYPE_INT32: {
    int64_t v = edgeValue(rng, reflection->GetInt32(message, field));
    reflection->SetInt32(&message, field, static_cast<int32_t>(v));
    return where + " = " + std::to_string(static_cast<int32_t>(v));
  }
  case pb::FieldDescriptor::CPPTYPE_INT64: {
    int64_t v = edgeValue(rng, reflection->GetInt64(message, field));
    reflection->SetInt64(&message, field, v);
    return where + " = " + std::to_string(v);
  }
  case pb::FieldDescriptor::CPPTYPE_UINT32: {
    uint32_t v = static_cast<uint32_t>(edgeValue(rng, reflection->GetUInt32(message, field)));
    reflection->SetUInt32(&message, field, v);
    return where + " = " + std::to_string(v);
  }
  case pb::FieldDescriptor::CPPTYPE_DOUBLE: {
    static const double values[] = {0.0, -1.0, 1e300, -1e300, std::nan(""), 1e-30};
    double v = values[rng() % 6];
    reflection->SetDouble(&message, field, v);
    return where + " = " + std::to_string(v);
  }
  case pb::FieldDescriptor::CPPTYPE_BOOL:
    reflection->SetBool(&message, field, !reflection->GetBool(message, field));
    return where + " flipped";
  case pb::FieldDescriptor::CPPTYPE_ENUM: {
    int v = static_cast<int>(rng() % 8) - 1;
    reflection->SetEnumValue(&message, field, v);
    return where + " = " + std::to_string(v);
  }
  case pb::FieldDescriptor::CPPTYPE_STRING: {
    static const char *names[] = {"", "linear", "attention", "cache_update", "all_reduce", "send", "nonesuch",
                                  "model.layers.0.mlp.up_proj.weight"};
    std::string v = names[rng() % (sizeof names / sizeof names[0])];
    reflection->SetString(&message, field, v);
    return where + " = '" + v + "'";
  }
  case pb::FieldDescriptor::CPPTYPE_MESSAGE:
    return mutate(*reflection->MutableMessage(&message, field), rng, where);
  default: return where + ": left";
  }
}

/// Changes one attribute of one instruction, keeping its kind: a number
/// set to an edge value or scaled, a flag flipped, a list element changed
/// (the values a kernel sees: an epsilon of 0, a scale of NaN, a head count
/// of 3). Mutants of these that the runtime accepts must compute the same
/// on every backend.
std::string mutateAttribute(pxe::Executable &exe, std::mt19937_64 &rng) {
  if (exe.stages_size() == 0) return "exe.stages: none to change";
  int s = rng() % exe.stages_size();
  pxe::Stage &stage = *exe.mutable_stages(s);
  if (stage.instructions_size() == 0) return "exe.stages[" + std::to_string(s) + "]: no instructions";
  int k = rng() % stage.instructions_size();
  pxe::Instruction &instruction = *stage.mutable_instructions(k);
  std::string where = "exe.stages[" + std::to_string(s) + "].instructions[" + std::to_string(k) + "] (" +
                      opName(instruction) + ")";
  if (instruction.attrs().empty()) return where + ": no attributes";
  std::vector<std::string> names;
  for (const auto &[name, value] : instruction.attrs()) names.push_back(name);
  std::sort(names.begin(), names.end());
  const std::string &name = names[rng() % names.size()];
  pxe::Attr &attr = (*instruction.mutable_attrs())[name];
  where += "." + name;
  switch (attr.value_case()) {
  case pxe::Attr::kI: attr.set_i(edgeValue(rng, attr.i())); return where + " = " + std::to_string(attr.i());
  case pxe::Attr::kF: {
    const double values[] = {0.0, -1.0, 1e-30, 1e300, std::nan(""), attr.f() * 2, attr.f() / 2, -attr.f()};
    attr.set_f(values[rng() % 8]);
    return where + " = " + std::to_string(attr.f());
  }
  case pxe::Attr::kB: attr.set_b(!attr.b()); return where + " flipped";
  case pxe::Attr::kInts: {
    auto &list = *attr.mutable_ints()->mutable_values();
    if (list.empty()) return where + ": an empty list";
    int j = rng() % list.size();
    list[j] = edgeValue(rng, list[j]);
    return where + "[" + std::to_string(j) + "] = " + std::to_string(list[j]);
  }
  case pxe::Attr::kStrings: {
    auto &list = *attr.mutable_strings()->mutable_values();
    if (list.empty()) return where + ": an empty list";
    static const char *axes[] = {"", "tp", "dp", "pp", "ep", "cp", "nonesuch"};
    int j = rng() % list.size();
    list[j] = axes[rng() % (sizeof axes / sizeof axes[0])];
    return where + "[" + std::to_string(j) + "] = '" + list[j] + "'";
  }
  default: return where + ": left";
  }
}

enum class Outcome { Prepare, Run, Stalled, Ran };
const char *outcomeName(Outcome o) {
  switch (o) {
  case Outcome::Prepare: return "refused at prepare";
  case Outcome::Run: return "failed running";
  case Outcome::Stalled: return "stalled";
  case Outcome::Ran: return "ran";
  }
  return "?";
}

std::string shortest(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

/// Where two runs' outputs differ by more than `tolerance` times the largest
/// finite |value| of the first, or than `tolerance` where that is below 1
/// (as cuda_cases.py's one-op cases compare: a gradient that a damaged
/// weight shrank to 1e-11 is all rounding noise, 1e-13 on the CPU and 5e-9
/// on the GPU); a NaN or an infinity must be at the same place in both,
/// integers equal. Empty when they agree.
std::string difference(const std::vector<Tensor> &cpu, const std::vector<Tensor> &cuda, double tolerance) {
  if (cpu.size() != cuda.size())
    return std::to_string(cpu.size()) + " outputs on cpu, " + std::to_string(cuda.size()) + " on cuda";
  for (size_t k = 0; k < cpu.size(); ++k) {
    const Tensor &a = cpu[k], &b = cuda[k];
    std::string which = "output " + std::to_string(k);
    if (a.isInt != b.isInt || a.shape != b.shape)
      return which + ": " + a.shapeString() + " on cpu, " + b.shapeString() + " on cuda";
    if (a.isInt) {
      if (a.i != b.i) return which + ": integers differ";
      continue;
    }
    double scale = 0;
    for (float v : a.f)
      if (std::isfinite(v)) scale = std::max(scale, std::fabs(double(v)));
    for (size_t j = 0; j < a.f.size() && j < b.f.size(); ++j) {
      float x = a.f[j], y = b.f[j];
      bool same = std::isfinite(x) && std::isfinite(y) ? std::fabs(double(x) - y) <= tolerance * std::max(scale, 1.0)
                                                       : (std::isnan(x) && std::isnan(y)) || x == y;
      if (!same)
        return which + "[" + std::to_string(j) + "]: " + shortest(x) + " on cpu, " + shortest(y) +
               " on cuda (largest |value| " + shortest(scale) + ")";
    }
  }
  return "";
}

/// Rank r's inputs: under data parallelism (a "dp" axis of D ranks) its
/// replica's block of the rows, as parax-run gives it; all of them
/// otherwise, or where the rows do not split (the executable then says
/// what it expected).
std::vector<Tensor> inputsOfRank(const pxe::Executable &exe, int r, const std::vector<Tensor> &inputs) {
  int64_t replicas = 1, replica = 0;
  for (int i = 0; i < exe.grid().axis_names_size() && i < exe.grid().shape_size(); ++i)
    if (exe.grid().axis_names(i) == "dp" && r < exe.ranks_size() && i < exe.ranks(r).values_size()) {
      replicas = exe.grid().shape(i);
      replica = exe.ranks(r).values(i);
    }
  if (replicas <= 1 || replica < 0 || replica >= replicas) return inputs;
  std::vector<Tensor> mine;
  for (const Tensor &t : inputs) {
    if (t.shape.empty() || t.shape[0] % replicas || !t.hasValues()) {
      mine.push_back(t);
      continue;
    }
    int64_t rows = t.shape[0] / replicas;
    mine.push_back(t.rowBlock(replica * rows, rows));
  }
  return mine;
}

/// Prepares and runs `exe` on all its ranks, each a thread with an
/// in-process communicator: run only when every rank prepared; a rank that
/// fails cancels the others' waits (as parax-run's MPI_Abort ends the job),
/// and ranks still waiting after 10 s are cancelled (as the stall watchdog
/// does).
/// One rank's executor (CPU or CUDA) prepared and run; with `outputs`,
/// its outputs, with `error`, why it stopped.
template <typename Backend, typename... Device>
Outcome runOneRank(const pxe::Executable &exe, const Checkpoint &weights, const std::vector<Tensor> &inputs,
                   std::vector<Tensor> *outputs, std::string *error, Device... device) {
  Backend executor;
  Status s = executor.prepare(exe, 0, nullptr, weights, inputs, device...);
  Outcome outcome = Outcome::Prepare;
  if (s.isOk()) {
    s = executor.run();
    outcome = s.isOk() ? Outcome::Ran : Outcome::Run;
  }
  if (!s.isOk() && error) *error = s.message();
  if (s.isOk() && outputs) *outputs = executor.outputs();
  return outcome;
}

/// With `cuda`, on the CUDA backend (one rank). With `outputs` and
/// `error`, a one-rank run's outputs and why it stopped.
Outcome prepareAndRun(const pxe::Executable &exe, const Checkpoint &weights, const std::vector<Tensor> &inputs,
                      bool cuda = false, std::vector<Tensor> *outputs = nullptr, std::string *error = nullptr) {
  int n = static_cast<int>(gridSize(exe));
#ifdef PARAX_WITH_CUDA
  if (cuda) {
    if (n != 1) return Outcome::Prepare; // refused before the first mutant
    return runOneRank<CudaExecutor>(exe, weights, inputs, outputs, error, 0);
  }
#endif
  if (n == 1) return runOneRank<Executor>(exe, weights, inputs, outputs, error);
  std::vector<int64_t> shape(exe.grid().shape().begin(), exe.grid().shape().end());
  std::vector<std::unique_ptr<Communicator>> comms = createThreadCommunicators(shape);
  std::vector<Executor> executors(n);
  std::vector<Status> prepared(n, Status::ok()), ran(n, Status::ok());
  std::mutex mutex;
  std::condition_variable cv;
  int ready = 0, finished = 0;
  auto rank = [&](int r) {
    prepared[r] = executors[r].prepare(exe, r, comms[r].get(), weights, inputsOfRank(exe, r, inputs));
    bool all = true;
    {
      std::unique_lock<std::mutex> lock(mutex);
      ++ready;
      cv.notify_all();
      cv.wait(lock, [&] { return ready == n; });
      for (const Status &p : prepared) all = all && p.isOk();
    }
    if (all) {
      ran[r] = executors[r].run();
      if (!ran[r].isOk()) cancelThreadCommunicators(*comms[r]);
    }
    std::lock_guard<std::mutex> lock(mutex);
    ++finished;
    cv.notify_all();
  };
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) threads.emplace_back(rank, r);
  bool stalled = false;
  {
    std::unique_lock<std::mutex> lock(mutex);
    stalled = !cv.wait_for(lock, std::chrono::seconds(10), [&] { return finished == n; });
  }
  if (stalled) cancelThreadCommunicators(*comms[0]);
  for (std::thread &t : threads) t.join();
  for (const Status &p : prepared)
    if (!p.isOk()) return Outcome::Prepare;
  if (stalled) return Outcome::Stalled;
  for (const Status &r : ran)
    if (!r.isOk()) return Outcome::Run;
  return Outcome::Ran;
}

} // namespace

int main(int argc, char **argv) {
  std::string seedPath, weightsPath;
  std::vector<std::string> inputPaths;
  long mutants = 200;
  uint64_t seed = 1;
  double tolerance = 1e-4;
  bool onCuda = false;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--mutants" && i + 1 < argc) mutants = std::atol(argv[++i]);
    else if (arg == "--seed" && i + 1 < argc) seed = std::strtoull(argv[++i], nullptr, 10);
    else if (arg == "--device" && i + 1 < argc) {
      std::string device = argv[++i];
      if (device != "cpu" && device != "cuda") {
        std::fprintf(stderr, "parax-pxe-fuzz: --device must be cpu or cuda, got '%s'\n", device.c_str());
        return 2;
      }
      onCuda = device == "cuda";
    } else if (arg == "--tolerance" && i + 1 < argc) tolerance = std::atof(argv[++i]);
    else if (seedPath.empty()) seedPath = arg;
    else if (weightsPath.empty()) weightsPath = arg;
    else inputPaths.push_back(arg);
  }
  if (seedPath.empty() || weightsPath.empty()) {
    std::fprintf(stderr, "usage: parax-pxe-fuzz SEED.pxe WEIGHTS.safetensors [INPUT.npy ...] "
                         "[--mutants N] [--seed S] [--device cpu|cuda [--tolerance T]]\n");
    return 2;
  }
  auto original = loadExecutable(seedPath);
  auto weights = Checkpoint::open(weightsPath);
  if (!original.isOk() || !weights.isOk()) {
    std::fprintf(stderr, "parax-pxe-fuzz: the seed does not load: %s%s\n",
                 original.isOk() ? "" : original.status().message().c_str(),
                 weights.isOk() ? "" : weights.status().message().c_str());
    return 2;
  }
#ifdef PARAX_WITH_CUDA
  if (onCuda && gridSize(original.value()) != 1) {
    std::fprintf(stderr, "parax-pxe-fuzz: --device cuda fuzzes one-rank executables; %s has %lld ranks\n",
                 seedPath.c_str(), static_cast<long long>(gridSize(original.value())));
    return 2;
  }
  if (onCuda && cudaDeviceCount() == 0) {
    std::fprintf(stderr, "parax-pxe-fuzz: --device cuda: no CUDA device\n");
    return 2;
  }
#else
  if (onCuda) {
    std::fprintf(stderr, "parax-pxe-fuzz: --device cuda: this parax-pxe-fuzz was built without CUDA "
                         "(parax-pxe-fuzz-simt runs the CUDA backend on the emulator)\n");
    return 2;
  }
#endif
  std::vector<Tensor> inputs;
  for (const std::string &path : inputPaths) {
    auto t = readNpy(path);
    if (!t.isOk()) {
      std::fprintf(stderr, "parax-pxe-fuzz: %s\n", t.status().message().c_str());
      return 2;
    }
    inputs.push_back(t.value());
  }
  std::mt19937_64 rng(seed);
  long parse = 0, invalid = 0, prepare = 0, failedRun = 0, stalled = 0, ran = 0;
  long compared = 0, cudaAlone = 0, disagreements = 0; // --device cuda: against the CPU backend
  // Prepares and runs `exe` on the chosen backend; on cuda also on the CPU
  // backend, which must agree: both refuse, or both run and compute the
  // same (or only the device refuses, by name: a combination it cannot run,
  // the CPU computing every dtype in fp32).
  auto runAndCompare = [&](const pxe::Executable &exe, const Checkpoint &checkpoint,
                           const std::vector<Tensor> &given, const std::string &what, bool values = true) {
    std::vector<Tensor> onDevice, onCpu;
    std::string deviceError, cpuError;
    Outcome outcome = prepareAndRun(exe, checkpoint, given, onCuda, &onDevice, &deviceError);
    if (!onCuda) return outcome;
    Outcome cpu = prepareAndRun(exe, checkpoint, given, false, &onCpu, &cpuError);
    auto named = [](Outcome o, const std::string &error) {
      return std::string(outcomeName(o)) + (error.empty() ? "" : " (" + error + ")");
    };
    std::string differs = cpu != outcome ? "cpu " + named(cpu, cpuError) + ", cuda " + named(outcome, deviceError)
                          : outcome == Outcome::Ran && values ? difference(onCpu, onDevice, tolerance)
                                                    : std::string();
    if (cpu == Outcome::Ran && outcome == Outcome::Run) {
      std::fprintf(stderr, "%s: refused on cuda alone: %s\n", what.c_str(), deviceError.c_str());
      ++cudaAlone;
    } else if (!differs.empty()) {
      std::fprintf(stderr, "%s: the backends disagree: %s\n", what.c_str(), differs.c_str());
      ++disagreements;
    } else if (outcome == Outcome::Ran) {
      ++compared;
    }
    return outcome;
  };
  // The seed itself must run: else every mutant is refused for what the
  // seed lacks, and the run passes having tested nothing.
  {
    std::string seedError;
    Outcome seedOutcome = prepareAndRun(original.value(), *weights.value(), inputs, onCuda, nullptr, &seedError);
    if (seedOutcome != Outcome::Ran) {
      std::fprintf(stderr,
                   "parax-pxe-fuzz: the unmutated %s does not run with these weights and inputs (%s%s%s): "
                   "every mutant would be refused for that, testing nothing\n",
                   seedPath.c_str(), outcomeName(seedOutcome), seedError.empty() ? "" : ": ", seedError.c_str());
      return 2;
    }
  }
  for (long m = 0; m < mutants; ++m) {
    pxe::Executable exe = original.value();
    std::string what;
    for (int k = 0, n = 1 + rng() % 3; k < n; ++k)
      what += std::string(k ? "; " : "") + (rng() % 4 == 0 ? mutateAttribute(exe, rng) : mutate(exe, rng, "exe"));
    std::string bytes = serializeDeterministically(exe);
    if (rng() % 8 == 0 && !bytes.empty()) { // the file itself damaged
      if (rng() % 2) {
        bytes.resize(rng() % bytes.size());
        what += "; file cut to " + std::to_string(bytes.size()) + " bytes";
      } else {
        size_t at = rng() % bytes.size();
        bytes[at] = static_cast<char>(rng());
        what += "; byte " + std::to_string(at) + " changed";
      }
    }
    std::fprintf(stderr, "mutant %ld: %s\n", m, what.c_str());
    std::fflush(stderr);
    pxe::Executable parsed;
    if (!parsed.ParseFromString(bytes)) {
      ++parse;
      continue;
    }
    Status s = validateExecutable(parsed);
    if (!s.isOk()) {
      if (s.message().empty()) {
        std::fprintf(stderr, "mutant %ld: refused without a message\n", m);
        return 1;
      }
      ++invalid;
      continue;
    }
    if (gridSize(parsed) != gridSize(original.value())) { // parax-run refuses a world size unlike the grid's
      ++invalid;
      continue;
    }
    Outcome outcome = runAndCompare(parsed, *weights.value(), inputs, "mutant " + std::to_string(m));
    switch (outcome) {
    case Outcome::Prepare: ++prepare; break;
    case Outcome::Run: ++failedRun; break;
    case Outcome::Stalled: ++stalled; break;
    case Outcome::Ran: ++ran; break;
    }
  }
  std::printf("parax-pxe-fuzz: %ld mutants: %ld unreadable, %ld refused by the validator, %ld at prepare, "
              "%ld failed running, %ld stalled (ended by the watchdog), %ld ran\n",
              mutants, parse, invalid, prepare, failedRun, stalled, ran);

  // The weights and the inputs damaged instead: bytes of a file's header
  // (or anywhere) changed, or the file cut, then opened and used by the
  // valid executable.
  auto readFile = [](const std::string &path) {
    std::ifstream in(path, std::ios::binary);
    std::stringstream bytes;
    bytes << in.rdbuf();
    return bytes.str();
  };
  // Typed damage (issue 45 R1, R7): a safetensors tensor's dtype swapped
  // for another of its width (F32 <-> I32, BF16 <-> F16), or an int32 .npy
  // rewritten as int64 with one element past 32 bits; "" when the file is
  // neither.
  auto retype = [&](const std::string &bytes, std::string &what) -> std::string {
    if (bytes.size() > 10 && bytes.compare(0, 6, "\x93NUMPY") == 0 && bytes[6] == 1) {
      size_t length = static_cast<uint8_t>(bytes[8]) | static_cast<uint8_t>(bytes[9]) << 8;
      std::string header = bytes.substr(10, length);
      size_t open = header.find("'shape': ("), close = header.find(')', open);
      size_t count = bytes.size() > 10 + length ? (bytes.size() - 10 - length) / 4 : 0;
      if (header.find("'<i4'") == std::string::npos || open == std::string::npos ||
          close == std::string::npos || count == 0)
        return "";
      std::vector<int64_t> values(count);
      for (size_t i = 0; i < count; ++i) {
        int32_t v;
        std::memcpy(&v, bytes.data() + 10 + length + 4 * i, 4);
        values[i] = v;
      }
      size_t at = rng() % count;
      values[at] += int64_t(1) << 32;
      std::string dict = "{'descr': '<i8', 'fortran_order': False, 'shape': (" +
                         header.substr(open + 10, close - open - 10) + "), }";
      while ((10 + dict.size() + 1) % 64) dict += ' ';
      dict += '\n';
      std::string out = std::string("\x93NUMPY\x01\x00", 8);
      out += static_cast<char>(dict.size() & 0xff);
      out += static_cast<char>(dict.size() >> 8);
      out += dict;
      out.append(reinterpret_cast<const char *>(values.data()), 8 * count);
      what = "int32 widened to int64, element " + std::to_string(at) + " past 32 bits";
      return out;
    }
    static const std::pair<const char *, const char *> swaps[] = {
        {"\"dtype\":\"F32\"", "\"dtype\":\"I32\""}, {"\"dtype\":\"I32\"", "\"dtype\":\"F32\""},
        {"\"dtype\":\"BF16\"", "\"dtype\":\"F16\""}, {"\"dtype\":\"F16\"", "\"dtype\":\"BF16\""}};
    std::vector<std::pair<size_t, int>> found; // (where, which swap)
    size_t headerEnd = bytes.size() > 8 ? std::min<size_t>(bytes.size(), 8 + (size_t(1) << 20)) : 0;
    for (int k = 0; k < 4; ++k)
      for (size_t at = bytes.find(swaps[k].first); at != std::string::npos && at < headerEnd;
           at = bytes.find(swaps[k].first, at + 1))
        found.push_back({at, k});
    if (found.empty())
      return "";
    auto [at, k] = found[rng() % found.size()];
    std::string out = bytes;
    out.replace(at, std::strlen(swaps[k].first), swaps[k].second);
    what = std::string("dtype at byte ") + std::to_string(at) + ": " + swaps[k].first + " -> " + swaps[k].second;
    return out;
  };
  auto damage = [&](std::string bytes, std::string &what) {
    if (bytes.empty()) return bytes;
    if (rng() % 4 == 0) {
      std::string typed = retype(bytes, what);
      if (!typed.empty()) return typed;
    }
    if (rng() % 4 == 0) {
      bytes.resize(rng() % bytes.size());
      what = "cut to " + std::to_string(bytes.size()) + " bytes";
      return bytes;
    }
    for (int k = 0, n = 1 + rng() % 3; k < n; ++k) {
      size_t at = rng() % 2 ? rng() % std::min<size_t>(bytes.size(), 256) : rng() % bytes.size();
      bytes[at] = static_cast<char>(rng() % 3 == 0 ? "0123456789{}[],:\" -"[rng() % 18] : rng());
      what += (k ? ", byte " : "byte ") + std::to_string(at);
    }
    return bytes;
  };
  std::string scratch = seedPath + ".damaged";
  // Weights in a folder (a sharded or a box-wise checkpoint): one of its
  // files damaged in a copy of the folder -- the index half the time.
  namespace fs = std::filesystem;
  std::vector<std::string> weightFiles;
  std::string weightCopy = seedPath + ".damaged-weights";
  if (fs::is_directory(weightsPath)) {
    fs::remove_all(weightCopy);
    fs::create_directories(weightCopy);
    for (const fs::directory_entry &entry : fs::directory_iterator(weightsPath)) {
      std::string name = entry.path().filename().string();
      fs::copy_file(entry.path(), weightCopy + "/" + name);
      // (the index first)
      if (name.size() > 11 && name.compare(name.size() - 11, 11, ".index.json") == 0)
        weightFiles.insert(weightFiles.begin(), name);
      else
        weightFiles.push_back(name);
    }
  }
  bool bf16 = false; // a program storing bf16
  for (const pxe::Stage &stage : original.value().stages())
    for (const pxe::Buffer &b : stage.buffers()) bf16 = bf16 || b.dtype() == pxe::BF16;
  long files = 0, refusedFiles = 0, ranFiles = 0, typedFiles = 0, typedRan = 0;
  for (long m = 0; m < mutants / 4; ++m, ++files) {
    std::string what;
    bool weightsHit = inputPaths.empty() || rng() % 2;
    size_t which = weightsHit ? 0 : rng() % inputPaths.size();
    std::string file = weightsHit ? weightsPath : inputPaths[which], target = scratch;
    if (weightsHit && !weightFiles.empty()) { // a file of the folder's copy
      file = weightFiles[rng() % 2 ? 0 : rng() % weightFiles.size()];
      target = weightCopy + "/" + file;
      file = weightsPath + "/" + file;
    }
    std::string bytes = damage(readFile(file), what);
    bool typed = what.rfind("dtype", 0) == 0 || what.rfind("int32 widened", 0) == 0;
    typedFiles += typed;
    std::fprintf(stderr, "damaged %s %ld: %s\n", file.c_str(), m, what.c_str());
    std::fflush(stderr);
    for (const std::string &path : {scratch, target}) { // (scratch: kept if the backends disagree)
      std::ofstream out(path, std::ios::binary);
      out << bytes;
    }
    std::shared_ptr<Checkpoint> checkpoint = weights.value();
    std::vector<Tensor> given = inputs;
    if (weightsHit) {
      auto opened = Checkpoint::open(weightFiles.empty() ? scratch : weightCopy);
      if (target != scratch) { // the copy whole again for the next
        std::ofstream out(target, std::ios::binary);
        out << readFile(file);
      }
      if (!opened.isOk()) {
        ++refusedFiles;
        continue;
      }
      checkpoint = opened.value();
    } else {
      auto read = readNpy(scratch);
      if (!read.isOk()) {
        ++refusedFiles;
        continue;
      }
      given[which] = read.value();
    }
    long before = disagreements;
    // A bf16 program's damaged weight (a key projection of 1e37) makes its
    // attention one-hot on whichever key rounds largest, and bf16 storage
    // and the CPU's fp32 pick different keys: only the outcomes compared.
    bool values = !(weightsHit && bf16);
    if (runAndCompare(original.value(), *checkpoint, given, "damaged file " + std::to_string(m), values) ==
        Outcome::Ran) {
      ++ranFiles;
      if (typed) { // read as what it is not, or truncated: a silent wrong answer
        ++typedRan;
        std::fprintf(stderr, "damaged file %ld (%s) ran\n", m, what.c_str());
      }
    } else {
      ++refusedFiles;
    }
    if (disagreements > before) { // kept to replay with parax-run
      std::string kept = scratch + "-" + std::to_string(m);
      std::rename(scratch.c_str(), kept.c_str());
      std::fprintf(stderr, "damaged file %ld: kept as %s\n", m, kept.c_str());
    }
  }
  std::remove(scratch.c_str());
  if (!weightFiles.empty()) fs::remove_all(weightCopy);
  std::printf("parax-pxe-fuzz: %ld damaged weights or inputs: %ld refused, %ld ran; %ld of them typed (a "
              "dtype or an integer's width changed): %ld ran\n",
              files, refusedFiles, ranFiles, typedFiles, typedRan);
  if (onCuda) // the mutants and the damaged files
    std::printf("parax-pxe-fuzz: on cuda and on cpu: %ld ran alike (within %g of the largest |output|, at least 1), "
                "%ld refused running on cuda alone, %ld disagreed\n", compared, tolerance, cudaAlone, disagreements);
  return 0;
}
