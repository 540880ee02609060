// Simt.cpp - the SIMT emulator's kernel execution and runtime API (see
// Simt.h): blocks one after another, each block's threads as fibers that
// switch at __syncthreads(); memory in host allocations that are tracked so
// that copies outside them fail.

#include "Simt.h"

#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <string>
#include <vector>

// Under AddressSanitizer the fibers' stack switches are announced to it, and
// allocations are exact, so a kernel reading past a buffer is reported.
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#define PARAX_SIMT_ASAN 1
#else
#define PARAX_SIMT_ASAN 0
#endif

namespace parax::simt {
namespace {

// The launching code's stack, learnt when the first fiber starts.
const void *homeStack = nullptr;
size_t homeStackSize = 0;
#if PARAX_SIMT_ASAN
void enterStack(void **save, const void *bottom, size_t size) { __sanitizer_start_switch_fiber(save, bottom, size); }
void enteredStack(void *save, bool learnHome) {
  __sanitizer_finish_switch_fiber(save, learnHome ? &homeStack : nullptr, learnHome ? &homeStackSize : nullptr);
}
#else
void enterStack(void **, const void *, size_t) {}
void enteredStack(void *, bool) {}
#endif

constexpr size_t kStackBytes = 256 * 1024; // virtual; pages appear when used
constexpr int kSharedDefault = 48 * 1024, kSharedOptIn = 227 * 1024; // H100/H200
constexpr int kMultiprocessors = 132;                                // H100/H200 SXM

// Fibers switch stacks without system calls where the platform allows
// (x86-64: paraxSimtSwitch below); elsewhere through ucontext, whose
// swapcontext saves and restores the signal mask, a system call each way.
#if defined(__x86_64__)
#define PARAX_SIMT_OWN_SWITCH 1
#else
#define PARAX_SIMT_OWN_SWITCH 0
#endif

struct Fiber {
#if PARAX_SIMT_OWN_SWITCH
  void *sp = nullptr; // its stack pointer while it is switched out
#else
  ucontext_t context;
#endif
  ThreadContext thread;
  char *stack = nullptr; // a guard page below kStackBytes
  void *fakeStack = nullptr; // AddressSanitizer's bookkeeping across switches
  bool done = false, waiting = false, started = false;
  uint64_t warpSyncs = 0; // WMMA *_sync calls so far in this block
};

struct State {
#if PARAX_SIMT_OWN_SWITCH
  void *home = nullptr; // the launching code's stack pointer, between fibers
#else
  ucontext_t home; // the launching code, between fibers
#endif
  std::vector<Fiber> fibers;
  Fiber *running = nullptr;
  bool direct = false; // this block's threads after the first run as plain calls
  const std::function<void()> *body = nullptr;
  std::vector<unsigned char> shared; // dynamic shared memory, 128-byte aligned within
  std::string fault;                 // a rule broken by the running kernel
  std::map<uintptr_t, size_t> allocations; // base -> bytes
  size_t allocated = 0;                     // their sum
  std::map<const void *, int> sharedOptIn;  // kernel -> bytes of dynamic shared memory
  cudaError_t lastError = cudaSuccess;
  cudaError_t sticky = cudaSuccess; // a failed kernel spoils the context
  bool hung = false;                 // an injected NCCL hang (see ncclFault)
  int device = 0;
  bool capturing = false;                   // a stream capture is open
  cudaError_t captureError = cudaSuccess;   // what spoiled it
  std::vector<std::function<void()>> captured;
};

State &state() {
  static State s;
  return s;
}

void fail(cudaError_t error, const std::string &message) {
  std::fprintf(stderr, "simt: %s\n", message.c_str());
  State &s = state();
  s.lastError = error;
  if (error == cudaErrorLaunchFailure)
    s.sticky = error;
}

#if PARAX_SIMT_OWN_SWITCH
} // namespace
} // namespace parax::simt
// paraxSimtSwitch(from, to): pushes the callee-saved registers and the
// SSE/x87 control words on the running stack, stores the stack pointer in
// *from, loads `to` and pops what was pushed there: the System V ABI's
// callee-saved state, as Boost.Context's x86-64 switch keeps it.
extern "C" void paraxSimtSwitch(void **from, void *to);
asm(R"(
  .pushsection .text
  .p2align 4
  .globl paraxSimtSwitch
  .hidden paraxSimtSwitch
  .type paraxSimtSwitch, @function
paraxSimtSwitch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  leaq -8(%rsp), %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  leaq 8(%rsp), %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size paraxSimtSwitch, .-paraxSimtSwitch
  .popsection
)");
namespace parax::simt {
namespace {
#endif

void fiberMain() {
  State &s = state();
  enteredStack(nullptr, true);
  (*s.body)();
  s.running->done = true;
  enterStack(nullptr, homeStack, homeStackSize); // this fiber's stack ends here
#if PARAX_SIMT_OWN_SWITCH
  static void *dead; // (not on this stack: the frame never unwinds)
  paraxSimtSwitch(&dead, s.home); // never comes back
  std::abort();
#endif
  // Returning resumes `home` (uc_link).
}

/// Makes fiber f's first context: its stack set to run fiberMain.
void prepareFiber(Fiber &f) {
#if PARAX_SIMT_OWN_SWITCH
  // From the stack's top (16-byte aligned): a null return address for
  // fiberMain (entered as if called: the stack pointer 8 past a multiple
  // of 16), fiberMain's address for the switch's `ret`, six registers'
  // zeros and the current SSE/x87 control words.
  auto *top = reinterpret_cast<uint64_t *>(f.stack + kStackBytes);
  uint64_t *sp = top - 9;
#if PARAX_SIMT_ASAN
  // The last fiber on this stack ended inside fiberMain without unwinding
  // it: AddressSanitizer's marks of that frame go.
  __asan_unpoison_memory_region(f.stack + kStackBytes - 4096, 4096);
#endif
  std::memset(sp, 0, 9 * sizeof(uint64_t));
  top[-2] = reinterpret_cast<uint64_t>(&fiberMain);
  uint32_t mxcsr = 0;
  uint16_t fpucw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpucw));
  std::memcpy(sp, &mxcsr, 4);
  std::memcpy(reinterpret_cast<char *>(sp) + 4, &fpucw, 2);
  f.sp = sp;
#else
  State &s = state();
  getcontext(&f.context);
  f.context.uc_stack.ss_sp = f.stack;
  f.context.uc_stack.ss_size = kStackBytes;
  f.context.uc_link = &s.home;
  makecontext(&f.context, fiberMain, 0);
#endif
}

/// From the launching code into fiber f (until it waits or ends).
void switchToFiber(Fiber &f) {
  State &s = state();
#if PARAX_SIMT_OWN_SWITCH
  paraxSimtSwitch(&s.home, f.sp);
#else
  swapcontext(&s.home, &f.context);
#endif
}

/// From the running fiber f back to the launching code.
void switchHome(Fiber &f) {
  State &s = state();
#if PARAX_SIMT_OWN_SWITCH
  paraxSimtSwitch(&f.sp, s.home);
#else
  swapcontext(&f.context, &s.home);
#endif
}

char *newStack() {
  long page = sysconf(_SC_PAGESIZE);
  void *p = mmap(nullptr, kStackBytes + page, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED) {
    std::perror("simt: mmap of a fiber stack");
    std::abort();
  }
  mprotect(p, page, PROT_NONE); // overflow faults instead of corrupting
  return static_cast<char *>(p) + page;
}

std::string coords(uint3 b) {
  return "(" + std::to_string(b.x) + ", " + std::to_string(b.y) + ", " + std::to_string(b.z) + ")";
}

bool &reverseOrder() {
  static bool reverse = [] {
    const char *order = std::getenv("PARAX_SIMT_ORDER");
    return order && std::string(order) == "reverse";
  }();
  return reverse;
}

// Runs one block to completion; false (with the error set) on a barrier
// that only some of its threads reach.
bool runBlock(const char *kernel, uint3 block, dim3 grid, dim3 threads) {
  State &s = state();
  unsigned n = threads.x * threads.y * threads.z;
  for (unsigned t = 0; t < n; ++t) {
    Fiber &f = s.fibers[t];
    f.thread.thread = {t % threads.x, (t / threads.x) % threads.y, t / (threads.x * threads.y)};
    f.thread.block = block;
    f.thread.blockSize = threads;
    f.thread.gridSize = grid;
    f.done = f.waiting = f.started = false;
    f.warpSyncs = 0;
  }
  bool reverse = reverseOrder();
  // The first thread (in the order run) runs as a fiber. If it ends without
  // __syncthreads(), the block's other threads run as plain calls on this
  // stack, one after another in the same order: what their fibers would
  // do, without two context switches (and their signal-mask system calls)
  // a thread. A barrier one of them then reaches is the error below (the
  // thread goes on past it; the launch fails).
  s.direct = false;
  for (bool first = true;; first = false) {
    unsigned done = 0, waiting = 0;
    for (unsigned i = 0; i < n; ++i) {
      Fiber &f = s.fibers[reverse ? n - 1 - i : i];
      if (first && i == 1 && done == 1)
        s.direct = true;
      if (s.direct) {
        f.waiting = false;
        s.running = &f;
        (*s.body)();
        s.running = nullptr;
        f.done = !f.waiting;
      } else if (!f.done) {
        if (!f.started) { // (its context made when it first runs)
          prepareFiber(f);
          f.started = true;
        }
        f.waiting = false;
        s.running = &f;
        void *save = nullptr;
        enterStack(&save, f.stack, kStackBytes);
        switchToFiber(f);
        enteredStack(save, false);
        s.running = nullptr;
      }
      done += f.done;
      waiting += f.waiting;
    }
    // WMMA's *_sync calls are warp-wide: every lane of a warp must make
    // each one (a lane that skips or adds one leaves the GPU undefined).
    for (unsigned w = 0; w * 32 < n; ++w)
      for (unsigned lane = w * 32 + 1; lane < std::min(n, w * 32 + 32); ++lane)
        if (s.fibers[lane].warpSyncs != s.fibers[w * 32].warpSyncs) {
          fail(cudaErrorLaunchFailure,
               std::string(kernel) + ": lanes of warp " + std::to_string(w) + " of block " + coords(block) +
                   " made different numbers of WMMA *_sync calls (" + std::to_string(s.fibers[w * 32].warpSyncs) +
                   " and " + std::to_string(s.fibers[lane].warpSyncs) + "): divergent warp-wide operations");
          return false;
        }
    if (done == n)
      return true;
    if (done > 0) {
      fail(cudaErrorLaunchFailure,
           std::string(kernel) + ": __syncthreads() reached by " + std::to_string(waiting) +
               " threads of block " + coords(block) + " while " + std::to_string(done) +
               " had exited (a GPU hangs or misbehaves here)");
      return false;
    }
    // Every thread is at the barrier: release them all.
  }
}

} // namespace

void warpSync() {
  if (state().running)
    ++state().running->warpSyncs;
}

int warpLane() {
  const ThreadContext &t = current();
  unsigned threads = t.blockSize.x * t.blockSize.y * t.blockSize.z;
  unsigned linear = t.thread.x + t.blockSize.x * (t.thread.y + t.blockSize.y * t.thread.z);
  if (linear / 32 * 32 + 32 > threads)
    fault("wmma: a warp of fewer than 32 threads (the block's size is not a multiple of 32)");
  return static_cast<int>(linear % 32);
}

const ThreadContext &current() {
  State &s = state();
  if (!s.running) {
    std::fprintf(stderr, "simt: threadIdx/blockIdx used outside a kernel\n");
    std::abort();
  }
  return s.running->thread;
}

void syncthreads() {
  State &s = state();
  Fiber *f = s.running;
  f->waiting = true;
  if (s.direct) // (no fiber to suspend: the launch fails after this block)
    return;
  enterStack(&f->fakeStack, homeStack, homeStackSize);
  switchHome(*f);
  enteredStack(f->fakeStack, false);
}

void *dynamicShared() {
  uintptr_t p = reinterpret_cast<uintptr_t>(state().shared.data());
  return reinterpret_cast<void *>((p + 127) / 128 * 128);
}

void fault(const char *what) {
  State &s = state();
  if (s.fault.empty())
    s.fault = what;
}

bool record(std::function<void()> work) {
  State &s = state();
  if (!s.capturing)
    return false;
  s.captured.push_back(std::move(work));
  return true;
}

namespace {
/// The kernels that ran, by name (PARAX_SIMT_KERNELS=FILE: written there
/// at exit, one a line, sorted): which path an op took, for tests.
struct KernelLog {
  const char *path = std::getenv("PARAX_SIMT_KERNELS");
  std::mutex mutex; // (ranks are threads)
  std::set<std::string> names;
  ~KernelLog() {
    if (!path)
      return;
    if (FILE *f = std::fopen(path, "w")) {
      for (const std::string &name : names)
        std::fprintf(f, "%s\n", name.c_str());
      std::fclose(f);
    }
  }
};
KernelLog &kernelLog() {
  static KernelLog log;
  return log;
}
} // namespace

void launch(const void *function, const char *kernel, dim3 grid, dim3 block, size_t shared,
            cudaStream_t stream, std::function<void()> body) {
  State &s = state();
  if (s.capturing) {
    s.captured.push_back([=] { launch(function, kernel, grid, block, shared, stream, body); });
    return;
  }
  if (defer(stream, [=] { launch(function, kernel, grid, block, shared, stream, body); }))
    return;
  if (s.sticky != cudaSuccess)
    return fail(s.sticky, std::string(kernel) + ": launched after an earlier kernel failed");
  if (s.running)
    return fail(cudaErrorLaunchFailure, std::string(kernel) + ": launched from inside a kernel");
  uint64_t threads = uint64_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || block.z > 64)
    return fail(cudaErrorInvalidConfiguration,
                std::string(kernel) + ": " + std::to_string(threads) +
                    " threads per block (1..1024, z at most 64)");
  if (grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.x > 2147483647u || grid.y > 65535 ||
      grid.z > 65535)
    return fail(cudaErrorInvalidConfiguration,
                std::string(kernel) + ": grid " + coords({grid.x, grid.y, grid.z}) +
                    " (x 1..2^31-1, y and z 1..65535)");
  auto optIn = s.sharedOptIn.find(function);
  size_t allowed = std::max(kSharedDefault, optIn == s.sharedOptIn.end() ? 0 : optIn->second);
  if (shared > allowed)
    return fail(cudaErrorInvalidValue, std::string(kernel) + ": " + std::to_string(shared) +
                                           " bytes of dynamic shared memory (" + std::to_string(allowed) +
                                           " allowed: 48 KiB, more through cudaFuncSetAttribute)");
  while (s.fibers.size() < threads) {
    s.fibers.emplace_back();
    s.fibers.back().stack = newStack();
  }
  if (KernelLog &log = kernelLog(); log.path) {
    std::lock_guard<std::mutex> lock(log.mutex);
    log.names.insert(kernel);
  }
  s.shared.assign(shared + 128, 0xff);
  s.body = &body;
  s.fault.clear();
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x)
        if (!runBlock(kernel, {x, y, z}, grid, block))
          return;
  if (!s.fault.empty())
    fail(cudaErrorLaunchFailure, std::string(kernel) + ": " + s.fault);
}

void setReverseOrder(bool reverse) { reverseOrder() = reverse; }

const char *ncclFault() {
  static long operations = 0; // NCCL operations issued so far
  const char *after = std::getenv("PARAX_SIMT_NCCL_FAULT_AFTER");
  if (after && operations++ < std::atol(after))
    return "";
  const char *fault = std::getenv("PARAX_SIMT_NCCL_FAULT");
  return fault ? fault : "";
}

void markHung() { state().hung = true; }

void clearErrors() { state().lastError = state().sticky = cudaSuccess; }

bool isDeviceRange(const void *ptr, size_t bytes) {
  State &s = state();
  uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
  auto it = s.allocations.upper_bound(p);
  if (it == s.allocations.begin())
    return false;
  --it;
  return p >= it->first && p + bytes <= it->first + it->second;
}

} // namespace parax::simt

using parax::simt::isDeviceRange;
using parax::simt::record;
using parax::simt::state;
using parax::simt::kMultiprocessors;
using parax::simt::kSharedOptIn;

namespace {
// A call a GPU refuses while a capture is open: it spoils the capture.
bool refusedInCapture(const char *call) {
  auto &s = state();
  if (!s.capturing)
    return false;
  std::fprintf(stderr, "simt: %s during a stream capture\n", call);
  s.captureError = cudaErrorStreamCaptureUnsupported;
  return true;
}

std::string range(const void *p, size_t bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "[%p, +%zu)", p, bytes);
  return text;
}
cudaError_t invalid(const char *call, const std::string &what) {
  std::fprintf(stderr, "simt: %s: %s\n", call, what.c_str());
  return cudaErrorInvalidValue;
}
} // namespace

__nv_bfloat16 __float2bfloat16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) // NaN stays NaN
    return {static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u); // round to nearest even
  return {static_cast<uint16_t>(u >> 16)};
}

float __bfloat162float(__nv_bfloat16 x) {
  uint32_t u = uint32_t(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

cudaError_t cudaGetDeviceCount(int *count) {
  const char *env = std::getenv("PARAX_SIMT_DEVICES");
  *count = env ? std::atoi(env) : 64;
  return *count > 0 ? cudaSuccess : cudaErrorNoDevice;
}

cudaError_t cudaSetDevice(int device) {
  int count = 0;
  cudaGetDeviceCount(&count);
  if (device < 0 || device >= count)
    return cudaErrorInvalidDevice;
  state().device = device;
  return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) {
  if (refusedInCapture("cudaMalloc"))
    return cudaErrorStreamCaptureUnsupported;
  // 256-byte aligned as CUDA's; exactly `bytes` long, so that reading past
  // the end is caught under AddressSanitizer.
  size_t free = 0, total = 0;
  cudaMemGetInfo(&free, &total);
  void *p = nullptr;
  if (bytes > free || posix_memalign(&p, 256, std::max<size_t>(bytes, 1)) != 0)
    return state().lastError = cudaErrorMemoryAllocation;
  std::memset(p, 0xff, bytes); // never-written floats read as NaN
  state().allocations[reinterpret_cast<uintptr_t>(p)] = bytes;
  state().allocated += bytes;
  *ptr = p;
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t *free, size_t *total) {
  static const size_t limit = [] {
    const char *env = std::getenv("PARAX_SIMT_DEVICE_MEMORY");
    return env ? static_cast<size_t>(std::strtoull(env, nullptr, 10)) : size_t(141) << 30;
  }();
  *total = limit;
  *free = limit > state().allocated ? limit - state().allocated : 0;
  return cudaSuccess;
}

cudaError_t cudaFree(void *ptr) {
  if (!ptr)
    return cudaSuccess;
  if (refusedInCapture("cudaFree"))
    return cudaErrorStreamCaptureUnsupported;
  parax::simt::runLazyStreams(); // cudaFree waits for the device
  auto &allocations = state().allocations;
  auto it = allocations.find(reinterpret_cast<uintptr_t>(ptr));
  if (it == allocations.end())
    return invalid("cudaFree", range(ptr, 0) + " is not an allocation's start");
  state().allocated -= it->second;
  allocations.erase(it);
  std::free(ptr);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t stream) {
  if (state().sticky != cudaSuccess)
    return state().sticky;
  if (bytes == 0)
    return cudaSuccess;
  bool dstDevice = kind == cudaMemcpyHostToDevice || kind == cudaMemcpyDeviceToDevice;
  bool srcDevice = kind == cudaMemcpyDeviceToHost || kind == cudaMemcpyDeviceToDevice;
  if (kind == cudaMemcpyDefault || kind == cudaMemcpyHostToHost)
    dstDevice = isDeviceRange(dst, 1), srcDevice = isDeviceRange(src, 1);
  if (dstDevice && !isDeviceRange(dst, bytes))
    return invalid("cudaMemcpy", "destination " + range(dst, bytes) + " is not inside one allocation");
  if (srcDevice && !isDeviceRange(src, bytes))
    return invalid("cudaMemcpy", "source " + range(src, bytes) + " is not inside one allocation");
  if (!dstDevice && isDeviceRange(dst, 1))
    return invalid("cudaMemcpy", "destination " + range(dst, bytes) + " is device memory, the kind says host");
  if (!srcDevice && isDeviceRange(src, 1))
    return invalid("cudaMemcpy", "source " + range(src, bytes) + " is device memory, the kind says host");
  if (state().capturing) {
    if (!dstDevice || !srcDevice) { // pageable host memory cannot be captured
      refusedInCapture("cudaMemcpyAsync to or from host memory");
      return cudaErrorStreamCaptureUnsupported;
    }
    record([=] { std::memmove(dst, src, bytes); });
    return cudaSuccess;
  }
  if (!parax::simt::defer(stream, [=] { std::memmove(dst, src, bytes); }))
    std::memmove(dst, src, bytes);
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  if (refusedInCapture("cudaMemcpy (synchronous)"))
    return cudaErrorStreamCaptureUnsupported;
  return cudaMemcpyAsync(dst, src, bytes, kind, nullptr);
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t stream) {
  if (bytes && !isDeviceRange(dst, bytes))
    return invalid("cudaMemset", range(dst, bytes) + " is not inside one allocation");
  auto work = [=] { std::memset(dst, value, bytes); };
  if (!record(work) && !parax::simt::defer(stream, work))
    work();
  return cudaSuccess;
}

// A lazy stream (see parax::simt::setLazyStreams) keeps its work in a queue
// and runs it, in order, only when something waits for it.
struct SimtStream {
  bool lazy = false;
  bool running = false; // its queue is running: its work runs at once
  std::deque<std::function<void()>> queue;
  uint64_t issued = 0, finished = 0; // work items so far
};
// An event is complete once its stream has finished `position` items.
struct SimtEvent {
  SimtStream *stream = nullptr;
  uint64_t position = 0;
  bool timing = true, recorded = false;
  std::chrono::steady_clock::time_point when; // of the last record
};

namespace parax::simt {
namespace {
bool &lazyStreams() {
  static bool lazy = [] {
    const char *mode = std::getenv("PARAX_SIMT_STREAMS");
    return mode && std::string(mode) == "lazy";
  }();
  return lazy;
}

// Runs `stream`'s queue until `position` items have finished.
void runUntil(SimtStream *stream, uint64_t position) {
  if (!stream || stream->running)
    return;
  stream->running = true;
  while (stream->finished < position && !stream->queue.empty()) {
    std::function<void()> work = std::move(stream->queue.front());
    stream->queue.pop_front();
    work();
    ++stream->finished;
  }
  stream->running = false;
}
void runAll(SimtStream *stream) {
  if (stream)
    runUntil(stream, stream->issued);
}
std::vector<SimtStream *> &lazyStreamList() {
  static std::vector<SimtStream *> streams;
  return streams;
}
} // namespace

void runLazyStreams() {
  for (SimtStream *stream : lazyStreamList())
    runAll(stream);
}

void setLazyStreams(bool lazy) { lazyStreams() = lazy; }

bool defer(cudaStream_t stream, std::function<void()> work) {
  if (!stream || !stream->lazy || stream->running)
    return false;
  stream->queue.push_back(std::move(work));
  ++stream->issued;
  return true;
}
} // namespace parax::simt

cudaError_t cudaStreamCreate(cudaStream_t *stream) {
  *stream = new SimtStream;
  return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t *stream, unsigned flags) {
  *stream = new SimtStream;
  (*stream)->lazy = (flags & cudaStreamNonBlocking) && parax::simt::lazyStreams();
  if ((*stream)->lazy)
    parax::simt::lazyStreamList().push_back(*stream);
  return cudaSuccess;
}
cudaError_t cudaStreamDestroy(cudaStream_t stream) {
  parax::simt::runAll(stream); // as on a GPU, its work still completes
  auto &lazy = parax::simt::lazyStreamList();
  lazy.erase(std::remove(lazy.begin(), lazy.end(), stream), lazy.end());
  delete stream;
  return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t stream) {
  if (refusedInCapture("cudaStreamSynchronize"))
    return cudaErrorStreamCaptureUnsupported;
  parax::simt::runAll(stream);
  return state().sticky;
}
cudaError_t cudaStreamQuery(cudaStream_t stream) {
  if (refusedInCapture("cudaStreamQuery"))
    return cudaErrorStreamCaptureUnsupported;
  parax::simt::runAll(stream);
  return state().sticky;
}
cudaError_t cudaStreamWaitEvent(cudaStream_t stream, cudaEvent_t event, unsigned) {
  if (!event)
    return cudaErrorInvalidValue;
  if (state().capturing)
    return cudaSuccess; // captured work replays in issue order: a dependency already holds
  SimtStream *waited = event->stream;
  uint64_t position = event->position; // as recorded now: the event may be recorded again
  if (waited && waited != stream &&
      !parax::simt::defer(stream, [waited, position] { parax::simt::runUntil(waited, position); }))
    parax::simt::runUntil(waited, position); // `stream` runs at once: so must what it waits for
  return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *event, unsigned flags) {
  *event = new SimtEvent;
  (*event)->timing = !(flags & cudaEventDisableTiming);
  return cudaSuccess;
}
cudaError_t cudaEventCreate(cudaEvent_t *event) { return cudaEventCreateWithFlags(event, 0); }
cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end) {
  if (!start || !end || !start->timing || !end->timing)
    return cudaErrorInvalidValue; // as on a GPU: events created without timing
  if (!start->recorded || !end->recorded || start->stream || end->stream)
    return cudaErrorInvalidValue; // not recorded, or on a lazy stream (no time kept there)
  *ms = std::chrono::duration<float, std::milli>(end->when - start->when).count();
  return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t event, cudaStream_t stream) {
  if (!event)
    return cudaErrorInvalidValue;
  if (state().capturing)
    return cudaSuccess; // a node of the graph, not a record of the event (as on a GPU)
  // Only a lazy stream has unfinished work to wait for.
  event->stream = stream && stream->lazy ? stream : nullptr;
  event->position = event->stream ? stream->issued : 0;
  event->recorded = true;
  event->when = std::chrono::steady_clock::now();
  return cudaSuccess;
}
cudaError_t cudaEventRecordWithFlags(cudaEvent_t event, cudaStream_t stream, unsigned flags) {
  if (!event)
    return cudaErrorInvalidValue;
  if (state().capturing && (flags & cudaEventRecordExternal)) {
    parax::simt::record([event] { // a real record, at each replay (which runs in order)
      event->stream = nullptr;
      event->recorded = true;
      event->when = std::chrono::steady_clock::now();
    });
    return cudaSuccess;
  }
  return cudaEventRecord(event, stream);
}

cudaError_t cudaEventQuery(cudaEvent_t event) {
  if (!event)
    return cudaErrorInvalidValue;
  if (refusedInCapture("cudaEventQuery"))
    return cudaErrorStreamCaptureUnsupported;
  parax::simt::runUntil(event->stream, event->position); // time passes
  return state().hung ? cudaErrorNotReady : state().sticky;
}
cudaError_t cudaEventDestroy(cudaEvent_t event) {
  delete event;
  return cudaSuccess;
}

cudaError_t cudaFuncSetAttribute(const void *kernel, cudaFuncAttribute attribute, int value) {
  if (refusedInCapture("cudaFuncSetAttribute"))
    return cudaErrorStreamCaptureUnsupported;
  if (attribute != cudaFuncAttributeMaxDynamicSharedMemorySize || value < 0 || value > kSharedOptIn)
    return invalid("cudaFuncSetAttribute", std::to_string(value) + " bytes of dynamic shared memory (at most " +
                                               std::to_string(kSharedOptIn) + ")");
  state().sharedOptIn[kernel] = value;
  return cudaSuccess;
}

cudaError_t cudaDeviceGetAttribute(int *value, cudaDeviceAttr attribute, int) {
  if (attribute == cudaDevAttrMultiProcessorCount) {
    *value = kMultiprocessors;
    return cudaSuccess;
  }
  if (attribute != cudaDevAttrMaxSharedMemoryPerBlockOptin)
    return cudaErrorInvalidValue;
  *value = kSharedOptIn;
  return cudaSuccess;
}

struct SimtGraph {
  std::vector<std::function<void()>> work;
};

cudaError_t cudaStreamBeginCapture(cudaStream_t stream, cudaStreamCaptureMode) {
  auto &s = state();
  if (!stream)
    return invalid("cudaStreamBeginCapture", "the legacy default stream cannot be captured");
  if (s.capturing)
    return invalid("cudaStreamBeginCapture", "a capture is already open");
  s.capturing = true;
  s.captureError = cudaSuccess;
  s.captured.clear();
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t, cudaGraph_t *graph) {
  auto &s = state();
  if (!s.capturing)
    return invalid("cudaStreamEndCapture", "no capture is open");
  s.capturing = false;
  *graph = nullptr;
  if (s.captureError != cudaSuccess)
    return cudaErrorStreamCaptureInvalidated;
  *graph = new SimtGraph{std::move(s.captured)};
  s.captured.clear();
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t *exec, cudaGraph_t graph, unsigned long long) {
  if (!graph)
    return cudaErrorInvalidValue;
  *exec = new SimtGraph(*graph);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t) {
  if (!exec)
    return cudaErrorInvalidValue;
  if (refusedInCapture("cudaGraphLaunch"))
    return cudaErrorStreamCaptureUnsupported;
  for (const auto &work : exec->work)
    work();
  return state().sticky;
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  delete exec;
  return cudaSuccess;
}
cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  delete graph;
  return cudaSuccess;
}

cudaError_t cudaGetLastError() {
  auto &s = state();
  cudaError_t e = s.lastError;
  s.lastError = s.sticky;
  return e;
}

const char *cudaGetErrorString(cudaError_t error) {
  switch (error) {
  case cudaSuccess: return "no error";
  case cudaErrorInvalidValue: return "invalid argument";
  case cudaErrorMemoryAllocation: return "out of memory";
  case cudaErrorInvalidConfiguration: return "invalid configuration argument";
  case cudaErrorInvalidDevicePointer: return "invalid device pointer";
  case cudaErrorInvalidDevice: return "invalid device ordinal";
  case cudaErrorNoDevice: return "no CUDA-capable device is detected";
  case cudaErrorNotReady: return "device not ready";
  case cudaErrorLaunchFailure: return "unspecified launch failure";
  case cudaErrorStreamCaptureUnsupported: return "operation not permitted when stream is capturing";
  case cudaErrorStreamCaptureInvalidated: return "operation failed due to a previous error during capture";
  }
  return "unknown error";
}
