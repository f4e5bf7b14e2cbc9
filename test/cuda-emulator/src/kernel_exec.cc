// The emulator's kernel executor: runs a launch's blocks one after another and, within a block,
// every CUDA thread as a coroutine on a pooled stack. A thread runs until it waits at a barrier or
// a warp operation (or exits); the schedule (forward, reverse, random) picks the next runnable
// thread. Misuse of barriers and warp operations is reported with rc_emu::deviceFault and stops
// the kernel; the stacks of threads left waiting are simply reused.
//
// Context switches use a small x86-64 routine that saves the callee-saved registers (device code
// cannot change the floating-point environment, so every coroutine keeps the host thread's MXCSR
// and x87 control word); other targets, or builds with RC_EMU_UCONTEXT defined, use ucontext.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "rc_emu/device.h"
#include "rc_emu/runtime.h"

#if defined(__x86_64__) && !defined(RC_EMU_UCONTEXT)
#define RC_EMU_ASM_CONTEXT 1
#else
#define RC_EMU_ASM_CONTEXT 0
#include <ucontext.h>
#endif

#if defined(__SANITIZE_ADDRESS__)
#define RC_EMU_ASAN 1
#include <sanitizer/asan_interface.h>
#include <sanitizer/common_interface_defs.h>
#else
#define RC_EMU_ASAN 0
#endif

#if RC_EMU_ASM_CONTEXT
// rc_emu_switch_context(save, load): saves the callee-saved state on the current stack, stores the
// stack pointer in *save, and resumes the context whose stack pointer is `load`.
// rc_emu_context_start: the first code a new context runs; calls r13(r12) and never returns.
extern "C" __attribute__((visibility("hidden"))) void rc_emu_switch_context(void** save, void* load);
extern "C" __attribute__((visibility("hidden"))) void rc_emu_context_start();
asm(R"(
  .text
  .p2align 4
  .globl rc_emu_switch_context
  .hidden rc_emu_switch_context
  .type rc_emu_switch_context, @function
rc_emu_switch_context:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
  .size rc_emu_switch_context, .-rc_emu_switch_context

  .p2align 4
  .globl rc_emu_context_start
  .hidden rc_emu_context_start
  .type rc_emu_context_start, @function
rc_emu_context_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size rc_emu_context_start, .-rc_emu_context_start
)");
#endif

namespace rc_emu {
namespace {

using detail::Site;
using detail::WarpOp;

// ---- configuration ---------------------------------------------------------------------------------

struct Settings {
  std::atomic<int> schedule{static_cast<int>(Schedule::kForward)};
  std::atomic<uint64_t> seed{0x5eed0f5eed5eedull};
  size_t stackBytes = 0;
};

#if RC_EMU_ASAN
constexpr size_t kDefaultStackKiB = 256;  // instrumented frames are much larger
#else
constexpr size_t kDefaultStackKiB = 64;
#endif
constexpr size_t kGuardBytes = 16 * 1024;  // PROT_NONE below every stack

size_t pageSize() {
  static const size_t bytes = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return bytes;
}

Settings& settings() {
  static Settings* s = [] {
    auto* created = new Settings();  // never destroyed: kernels may run during static destruction
    if (const char* name = std::getenv("RESNET_CUDA_EMU_SCHEDULE"); name != nullptr && *name != '\0') {
      if (std::strcmp(name, "forward") == 0) {
        created->schedule = static_cast<int>(Schedule::kForward);
      } else if (std::strcmp(name, "reverse") == 0) {
        created->schedule = static_cast<int>(Schedule::kReverse);
      } else if (std::strcmp(name, "random") == 0) {
        created->schedule = static_cast<int>(Schedule::kRandom);
      } else {
        std::fprintf(stderr, "RESNET_CUDA_EMU_SCHEDULE=%s: expected forward, reverse or random; using forward\n", name);
      }
    }
    if (const char* seed = std::getenv("RESNET_CUDA_EMU_SEED"); seed != nullptr && *seed != '\0') {
      created->seed = std::strtoull(seed, nullptr, 0);
    }
    size_t kib = kDefaultStackKiB;
    if (const char* stack = std::getenv("RESNET_CUDA_EMU_STACK_KB"); stack != nullptr && *stack != '\0') {
      const unsigned long long requested = std::strtoull(stack, nullptr, 10);
      if (requested >= 16 && requested <= 1024 * 1024) {
        kib = static_cast<size_t>(requested);
      } else {
        std::fprintf(stderr, "RESNET_CUDA_EMU_STACK_KB=%s: expected 16 to 1048576; using %zu\n", stack, kib);
      }
    }
    created->stackBytes = (kib * 1024 + pageSize() - 1) / pageSize() * pageSize();
    return created;
  }();
  return *s;
}

// ---- stacks ------------------------------------------------------------------------------------------

struct Stack {
  char* mapping;  // guard region, then the stack
  size_t mappingBytes;
  char* low;  // lowest usable byte
  size_t bytes;
  // Where the first frame starts below the top: stacks are page-aligned, so without a different
  // offset for each, the hot top frames of all threads would compete for the same cache sets.
  size_t color;
};

// Stacks of one host thread, reused across blocks and launches.
class StackPool {
 public:
  ~StackPool() {
    for (Stack* s : all_) {
      munmap(s->mapping, s->mappingBytes);
      delete s;
    }
  }

  Stack* acquire() {
    if (free_.empty()) {
      const size_t bytes = settings().stackBytes;
      const size_t guard = std::max(kGuardBytes, pageSize());
      void* mapping = mmap(nullptr, guard + bytes, PROT_READ | PROT_WRITE,
                           MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
      if (mapping == MAP_FAILED) {
        std::fprintf(stderr, "CUDA emulator: cannot map a %zu-byte thread stack\n", guard + bytes);
        std::abort();
      }
      if (mprotect(mapping, guard, PROT_NONE) != 0) {
        std::fprintf(stderr, "CUDA emulator: cannot protect a stack guard page\n");
        std::abort();
      }
      const size_t color = (all_.size() * 37 % 64) * 64;
      auto* s =
          new Stack{static_cast<char*>(mapping), guard + bytes, static_cast<char*>(mapping) + guard, bytes, color};
      all_.push_back(s);
      free_.push_back(s);
    }
    Stack* s = free_.back();
    free_.pop_back();
#if RC_EMU_ASAN
    // Frames of threads that never returned (abandoned after a fault, or the entry frame) leave
    // poisoned redzones behind.
    __asan_unpoison_memory_region(s->low, s->bytes);
#endif
    return s;
  }

  void release(Stack* s) { free_.push_back(s); }

 private:
  std::vector<Stack*> all_;
  std::vector<Stack*> free_;
};

// ---- contexts --------------------------------------------------------------------------------------

#if RC_EMU_ASM_CONTEXT
struct Context {
  void* sp = nullptr;
};

inline void switchContext(Context& from, const Context& to) { rc_emu_switch_context(&from.sp, to.sp); }

// The new context starts in entry(arg) on the top of `stack`.
void makeContext(Context& context, Stack& stack, void (*entry)(void*), void* arg) {
  // The frame rc_emu_switch_context pops: r15, r14, r13, r12, rbx, rbp, return address. After the
  // return into rc_emu_context_start the stack pointer is 16-byte aligned, as a call needs.
  const uintptr_t top = (reinterpret_cast<uintptr_t>(stack.low) + stack.bytes - stack.color) & ~uintptr_t{15};
  auto* frame = reinterpret_cast<uint64_t*>(top - 7 * sizeof(uint64_t));
  frame[0] = 0;                                  // r15
  frame[1] = 0;                                  // r14
  frame[2] = reinterpret_cast<uint64_t>(entry);  // r13
  frame[3] = reinterpret_cast<uint64_t>(arg);    // r12
  frame[4] = 0;                                  // rbx
  frame[5] = 0;                                  // rbp
  frame[6] = reinterpret_cast<uint64_t>(&rc_emu_context_start);
  context.sp = frame;
}
#else
struct Context {
  ucontext_t uc;
};

thread_local void (*tStartEntry)(void*) = nullptr;
thread_local void* tStartArg = nullptr;

void startTrampoline() { tStartEntry(tStartArg); }

inline void switchContext(Context& from, const Context& to) { swapcontext(&from.uc, &to.uc); }

void makeContext(Context& context, Stack& stack, void (*entry)(void*), void* arg) {
  getcontext(&context.uc);
  context.uc.uc_stack.ss_sp = stack.low;
  context.uc.uc_stack.ss_size = stack.bytes - stack.color;
  context.uc.uc_link = nullptr;
  // One context starts at a time on a host thread, and reads these first thing.
  tStartEntry = entry;
  tStartArg = arg;
  makecontext(&context.uc, &startTrampoline, 0);
}
#endif

// ---- the executor ----------------------------------------------------------------------------------

constexpr int kWarp = 32;
constexpr int kMaxThreads = static_cast<int>(kMaxThreadsPerBlock);
constexpr size_t kSharedGuardBytes = 64;
constexpr unsigned char kSharedGuardByte = 0xa5;

enum class State : uint8_t { kNotStarted, kRunnable, kWaiting, kDone };
enum class Wait : uint8_t { kNone, kBarrier, kWarpOp };

struct EmuThread {
  Context context;
  Stack* stack = nullptr;
  uint3 index{0, 0, 0};
  State state = State::kNotStarted;
  Wait wait = Wait::kNone;
  Site site{nullptr, 0};
  // Warp operation in progress: this lane's operands and, once complete, its result.
  WarpOp op = WarpOp::kSync;
  unsigned mask = 0;
  uint64_t bits = 0;
  int lane = 0;
  int width = kWarp;
  uint64_t result = 0;
#if RC_EMU_ASAN
  void* fakeStack = nullptr;
#endif
};

struct PendingWarpOp {
  WarpOp op;
  unsigned mask;
  unsigned arrived;
  Site site;
};

struct Warp {
  unsigned present = 0;  // lanes that exist
  unsigned exited = 0;
  std::vector<PendingWarpOp> pending;  // disjoint masks
};

bool sameSite(const Site& a, const Site& b) {
  return a.line == b.line &&
         (a.file == b.file || (a.file != nullptr && b.file != nullptr && std::strcmp(a.file, b.file) == 0));
}

std::string siteText(const Site& s) {
  std::ostringstream out;
  out << (s.file != nullptr ? s.file : "?") << ":" << s.line;
  return out.str();
}

std::string indexText(uint3 v) {
  std::ostringstream out;
  out << "(" << v.x << ", " << v.y << ", " << v.z << ")";
  return out.str();
}

std::string maskText(unsigned mask) {
  char text[16];
  std::snprintf(text, sizeof text, "0x%08x", mask);
  return text;
}

const char* opName(WarpOp op) {
  switch (op) {
    case WarpOp::kSync: return "__syncwarp";
    case WarpOp::kShflIdx: return "__shfl_sync";
    case WarpOp::kShflUp: return "__shfl_up_sync";
    case WarpOp::kShflDown: return "__shfl_down_sync";
    case WarpOp::kShflXor: return "__shfl_xor_sync";
    case WarpOp::kVote: return "__ballot_sync";
  }
  return "warp operation";
}

uint64_t splitMix(uint64_t& state) {
  uint64_t z = (state += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Without a popcnt target the builtin is a library call; this is as fast.
inline int popcount64(uint64_t v) {
  v = v - ((v >> 1) & 0x5555555555555555ull);
  v = (v & 0x3333333333333333ull) + ((v >> 2) & 0x3333333333333333ull);
  v = (v + (v >> 4)) & 0x0f0f0f0f0f0f0f0full;
  return static_cast<int>((v * 0x0101010101010101ull) >> 56);
}

// Threads that may run next, by linear index.
class ReadySet {
 public:
  void reset(int threads) {
    words_ = (threads + 63) / 64;
    for (int w = 0; w < words_; ++w) {
      const int bitsInWord = std::min(64, threads - 64 * w);
      bits_[w] = bitsInWord == 64 ? ~uint64_t{0} : (uint64_t{1} << bitsInWord) - 1;
    }
    count_ = threads;
  }
  void set(int i) {
    const uint64_t bit = uint64_t{1} << (i % 64);
    if ((bits_[i / 64] & bit) == 0) {
      bits_[i / 64] |= bit;
      ++count_;
    }
  }
  void clear(int i) {
    const uint64_t bit = uint64_t{1} << (i % 64);
    if ((bits_[i / 64] & bit) != 0) {
      bits_[i / 64] &= ~bit;
      --count_;
    }
  }
  int count() const { return count_; }
  int lowest() const {
    for (int w = 0; w < words_; ++w) {
      if (bits_[w] != 0) return 64 * w + __builtin_ctzll(bits_[w]);
    }
    return -1;
  }
  int highest() const {
    for (int w = words_ - 1; w >= 0; --w) {
      if (bits_[w] != 0) return 64 * w + 63 - __builtin_clzll(bits_[w]);
    }
    return -1;
  }
  // The k-th (from 0) ready thread in index order.
  int nth(int k) const {
    for (int w = 0; w < words_; ++w) {
      const int n = popcount64(bits_[w]);
      if (k < n) {
        uint64_t word = bits_[w];
        for (int i = 0; i < k; ++i) word &= word - 1;
        return 64 * w + __builtin_ctzll(word);
      }
      k -= n;
    }
    return -1;
  }

 private:
  std::array<uint64_t, kMaxThreads / 64> bits_{};
  int words_ = 0;
  int count_ = 0;
};

class Executor;
thread_local Executor* tExecutor = nullptr;

class Executor {
 public:
  bool running() const { return running_; }
  bool inThread() const { return running_ && current_ >= 0; }

  void run(const detail::KernelLaunch& launch, void (*body)(const void*), const void* context);

  void syncThreads(Site site);
  uint64_t warpOp(WarpOp op, unsigned mask, uint64_t bits, int lane, int width, Site site);
  // A device fault of the current thread, blamed on thread `blame` (default: the current one):
  // recordFault keeps the message, abandonThread leaves the thread for good. They are separate
  // calls so that the temporaries of the message are gone before the thread's stack is abandoned.
  [[gnu::noinline, gnu::cold]] void recordFault(const std::string& what, int blame = -1);
  [[noreturn, gnu::noinline, gnu::cold]] void abandonThread();

 private:
  static void threadMain(void* self);

  enum class Leaving { kNo, kExit, kFault };

  bool runBlock();
  int pick();
  void prepare(int t);
  int chooseNext();
  void switchAway(Leaving leaving, int next);
  void releasePendingStack();
  void block();
  void yieldAfterRelease();
  bool exitThread();
  void releaseStacks();
  std::string where(int t) const;
  std::string deadlockReport() const;
  void completeWarpOp(int warpIndex, const PendingWarpOp& op);
  // The fault messages, kept out of the barrier paths so that suspended threads' frames stay small.
  [[noreturn, gnu::noinline, gnu::cold]] void barrierFault(Site site);
  [[noreturn, gnu::noinline, gnu::cold]] void warpFault(WarpOp op, unsigned mask, int width, Site site,
                                                        const PendingWarpOp* conflicting);
  std::string warpFaultMessage(WarpOp op, unsigned mask, int width, Site site, const PendingWarpOp* conflicting) const;

  EmuThread& me() { return threads_[static_cast<size_t>(current_)]; }

  // The launch.
  const detail::KernelLaunch* launch_ = nullptr;
  void (*body_)(const void*) = nullptr;
  const void* context_ = nullptr;
  int threadCount_ = 0;
  Schedule schedule_ = Schedule::kForward;
  uint64_t rng_ = 0;
  unsigned char* shared_ = nullptr;
  size_t sharedBytes_ = 0;

  // The block.
  std::vector<EmuThread> threads_;
  std::vector<Warp> warps_;
  ReadySet ready_;
  int done_ = 0;
  int barrierWaiting_ = 0;
  Site barrierSite_{nullptr, 0};
  int barrierFirstWaiter_ = -1;
  int exited_ = 0;
  int firstExited_ = -1;

  // Switching: threads switch directly to the next thread; the scheduler's context (the host
  // thread's own stack) starts each block and gets control back when the block ends or faults.
  Context scheduler_;
  int current_ = -1;
  bool running_ = false;
  bool faultPending_ = false;
  std::string faultMessage_;
  Stack* pendingRelease_ = nullptr;  // of a thread that exited; released by whoever runs next
#if RC_EMU_ASAN
  void* schedulerFakeStack_ = nullptr;
  const void* schedulerStackBottom_ = nullptr;
  size_t schedulerStackSize_ = 0;
  bool enteringFromScheduler_ = false;
#endif

  StackPool stacks_;
};

std::string Executor::where(int t) const { return "thread " + indexText(threads_[static_cast<size_t>(t)].index); }

void Executor::run(const detail::KernelLaunch& launch, void (*body)(const void*), const void* context) {
  launch_ = &launch;
  body_ = body;
  context_ = context;
  threadCount_ = static_cast<int>(launch.block.x * launch.block.y * launch.block.z);
  schedule_ = rc_emu::schedule();
  if (schedule_ == Schedule::kRandom) {
    // A fresh stream per launch, from the seed and a launch counter: runs are repeatable.
    static std::atomic<uint64_t> launches{0};
    rng_ = scheduleSeed() ^ (0x9e3779b97f4a7c15ull * (launches.fetch_add(1) + 1));
    splitMix(rng_);
  }

  threads_.resize(static_cast<size_t>(threadCount_));
  for (int t = 0; t < threadCount_; ++t) {
    const unsigned x = static_cast<unsigned>(t) % launch.block.x;
    const unsigned y = static_cast<unsigned>(t) / launch.block.x % launch.block.y;
    const unsigned z = static_cast<unsigned>(t) / (launch.block.x * launch.block.y);
    threads_[static_cast<size_t>(t)].index = uint3{x, y, z};
  }
  warps_.resize(static_cast<size_t>((threadCount_ + kWarp - 1) / kWarp));
  for (size_t w = 0; w < warps_.size(); ++w) {
    const int lanes = std::min(kWarp, threadCount_ - static_cast<int>(w) * kWarp);
    warps_[w].present = lanes == kWarp ? 0xffffffffu : (1u << lanes) - 1u;
  }

  // Dynamic shared memory, 16-byte aligned, followed by guard bytes that must survive each block.
  sharedBytes_ = launch.sharedBytes;
  std::vector<unsigned char> sharedStorage(sharedBytes_ + kSharedGuardBytes + 16);
  shared_ = sharedStorage.data() + (16 - reinterpret_cast<uintptr_t>(sharedStorage.data()) % 16) % 16;

  detail::CurrentThread& cur = detail::tCurrent;
  cur.blockShape = launch.block;
  cur.gridShape = launch.grid;
  cur.dynamicShared = shared_;
  running_ = true;
  bool ok = true;
  for (unsigned z = 0; ok && z < launch.grid.z; ++z) {
    for (unsigned y = 0; ok && y < launch.grid.y; ++y) {
      for (unsigned x = 0; ok && x < launch.grid.x; ++x) {
        if (faulted()) {
          ok = false;
          break;
        }
        cur.block = uint3{x, y, z};
        static thread_local uint64_t blocks = 0;
        cur.blockSerial = ++blocks;
        ok = runBlock();
      }
    }
  }
  running_ = false;
  cur = detail::CurrentThread{{0, 0, 0}, {0, 0, 0}, dim3(), dim3(), nullptr};
  shared_ = nullptr;
}

bool Executor::runBlock() {
  std::memset(shared_, kUninitializedByte, sharedBytes_);
  std::memset(shared_ + sharedBytes_, kSharedGuardByte, kSharedGuardBytes);
  for (EmuThread& t : threads_) {
    t.state = State::kNotStarted;
    t.wait = Wait::kNone;
  }
  for (Warp& w : warps_) {
    w.exited = 0;
    w.pending.clear();
  }
  ready_.reset(threadCount_);
  done_ = 0;
  barrierWaiting_ = 0;
  barrierFirstWaiter_ = -1;
  exited_ = 0;
  firstExited_ = -1;
  faultPending_ = false;

  // The first thread runs until the block is over: every switch after that goes from thread to
  // thread, and the last one (or a fault) comes back here.
  prepare(pick());
#if RC_EMU_ASAN
  enteringFromScheduler_ = true;
  EmuThread& first = threads_[static_cast<size_t>(current_)];
  __sanitizer_start_switch_fiber(&schedulerFakeStack_, first.stack->low, first.stack->bytes);
#endif
  switchContext(scheduler_, threads_[static_cast<size_t>(current_)].context);
#if RC_EMU_ASAN
  __sanitizer_finish_switch_fiber(schedulerFakeStack_, nullptr, nullptr);
#endif
  current_ = -1;
  releasePendingStack();

  if (!faultPending_) {
    for (size_t i = 0; i < kSharedGuardBytes; ++i) {
      if (shared_[sharedBytes_ + i] != kSharedGuardByte) {
        faultPending_ = true;
        faultMessage_ = "kernel " + std::string(launch_->name) + ": block " + indexText(detail::tCurrent.block) +
                        ": wrote past the end of its " + std::to_string(sharedBytes_) +
                        " bytes of dynamic shared memory";
        break;
      }
    }
  }
  if (faultPending_) {
    releaseStacks();
    deviceFault(faultMessage_);
    return false;
  }
  return true;
}

void Executor::releaseStacks() {
  for (EmuThread& t : threads_) {
    if (t.stack != nullptr) {
      stacks_.release(t.stack);
      t.stack = nullptr;
    }
  }
}

int Executor::pick() {
  if (ready_.count() == 0) return -1;
  switch (schedule_) {
    case Schedule::kForward: return ready_.lowest();
    case Schedule::kReverse: return ready_.highest();
    case Schedule::kRandom: return ready_.nth(static_cast<int>(splitMix(rng_) % static_cast<uint64_t>(ready_.count())));
  }
  return -1;
}

// Makes thread t the current one (its stack and first frame ready if it has not started).
void Executor::prepare(int t) {
  EmuThread& thread = threads_[static_cast<size_t>(t)];
  ready_.clear(t);
  current_ = t;
  detail::tCurrent.thread = thread.index;
  if (thread.state == State::kNotStarted) {
    thread.stack = stacks_.acquire();
    makeContext(thread.context, *thread.stack, &Executor::threadMain, this);
  }
  thread.state = State::kRunnable;
  thread.wait = Wait::kNone;
}

void Executor::releasePendingStack() {
  if (pendingRelease_ != nullptr) {
    stacks_.release(pendingRelease_);
    pendingRelease_ = nullptr;
  }
}

void Executor::threadMain(void* self) {
  auto* ex = static_cast<Executor*>(self);
#if RC_EMU_ASAN
  const void* fromBottom = nullptr;
  size_t fromSize = 0;
  __sanitizer_finish_switch_fiber(nullptr, &fromBottom, &fromSize);
  if (ex->enteringFromScheduler_) {
    ex->schedulerStackBottom_ = fromBottom;
    ex->schedulerStackSize_ = fromSize;
    ex->enteringFromScheduler_ = false;
  }
#endif
  ex->releasePendingStack();
  // One thread after another on this stack, as long as the next one has not started yet.
  do {
    bool threw = false;
    try {
      ex->body_(ex->context_);
    } catch (const std::exception& e) {
      ex->recordFault(std::string("device code threw ") + (*e.what() != '\0' ? e.what() : "std::exception"));
      threw = true;
    } catch (...) {
      ex->recordFault("device code threw an exception");
      threw = true;
    }
    if (threw) ex->abandonThread();
  } while (ex->exitThread());
}

// The thread to run next, or -1 when the block is over, faulted or deadlocked (which this reports).
int Executor::chooseNext() {
  if (faultPending_) return -1;
  const int next = pick();
  if (next < 0 && done_ < threadCount_) {
    faultPending_ = true;
    faultMessage_ = "kernel " + std::string(launch_->name) + ": block " + indexText(detail::tCurrent.block) +
                    ": deadlock: no thread can run; " + deadlockReport();
  }
  return next;
}

// The current thread stops (it waits, exits or faulted): switches to thread `next` (from
// chooseNext), or back to the scheduler when there is none. Returns when the thread is resumed
// (never for kExit and kFault).
void Executor::switchAway(Leaving leaving, int next) {
  const int from = current_;
  EmuThread& self = threads_[static_cast<size_t>(from)];
  if (leaving == Leaving::kExit) {
    pendingRelease_ = self.stack;  // still in use until the switch
    self.stack = nullptr;
  }
  if (next == from) {  // the schedule picked the yielding thread itself
    ready_.clear(from);
    return;
  }
  Context* target = &scheduler_;
  if (next >= 0) {
    prepare(next);
    target = &threads_[static_cast<size_t>(next)].context;
  } else {
    current_ = -1;
  }
#if RC_EMU_ASAN
  const void* bottom = schedulerStackBottom_;
  size_t size = schedulerStackSize_;
  if (next >= 0) {
    bottom = threads_[static_cast<size_t>(next)].stack->low;
    size = threads_[static_cast<size_t>(next)].stack->bytes;
  }
  __sanitizer_start_switch_fiber(leaving == Leaving::kNo ? &self.fakeStack : nullptr, bottom, size);
#endif
  switchContext(self.context, *target);
  if (leaving != Leaving::kNo) std::abort();  // never resumed
#if RC_EMU_ASAN
  __sanitizer_finish_switch_fiber(self.fakeStack, nullptr, nullptr);
#endif
  releasePendingStack();
}

void Executor::block() {
  me().state = State::kWaiting;
  switchAway(Leaving::kNo, chooseNext());
}

// The last thread to arrive at a barrier or warp operation: it becomes runnable like the others it
// released, so that the schedule alone decides who continues first.
void Executor::yieldAfterRelease() {
  ready_.set(current_);
  switchAway(Leaving::kNo, chooseNext());
}

void Executor::recordFault(const std::string& what, int blame) {
  faultPending_ = true;
  faultMessage_ = "kernel " + std::string(launch_->name) + ": block " + indexText(detail::tCurrent.block) + ", " +
                  where(blame < 0 ? current_ : blame) + ": " + what;
}

void Executor::abandonThread() {
  switchAway(Leaving::kFault, -1);
  std::abort();  // never resumed
}

// The current thread has returned from the kernel. Returns true when the next thread to run has
// not started: it then runs on this stack (the caller loops); otherwise switches away for good.
bool Executor::exitThread() {
  const int t = current_;
  EmuThread& self = me();
  Warp& warp = warps_[static_cast<size_t>(t / kWarp)];
  const unsigned bit = 1u << (t % kWarp);
  if (barrierWaiting_ > 0) {
    recordFault("exited while " + where(barrierFirstWaiter_) + " waits at __syncthreads at " + siteText(barrierSite_));
    abandonThread();
  }
  for (const PendingWarpOp& op : warp.pending) {
    if ((op.mask & bit) != 0) {
      int waiter = t - t % kWarp + __builtin_ctz(op.arrived);
      recordFault("exited while " + where(waiter) + " waits for it at " + opName(op.op) + " (mask " +
                  maskText(op.mask) + ") at " + siteText(op.site));
      abandonThread();
    }
  }
  warp.exited |= bit;
  ++exited_;
  if (firstExited_ < 0) firstExited_ = t;
  self.state = State::kDone;
  ++done_;
  const int next = chooseNext();
  if (next >= 0 && threads_[static_cast<size_t>(next)].state == State::kNotStarted) {
    EmuThread& successor = threads_[static_cast<size_t>(next)];
    successor.stack = self.stack;
    self.stack = nullptr;
    ready_.clear(next);
    current_ = next;
    detail::tCurrent.thread = successor.index;
    successor.state = State::kRunnable;
    return true;
  }
  switchAway(Leaving::kExit, next);
  std::abort();  // never resumed
}

void Executor::syncThreads(Site site) {
  if (exited_ > 0 || (barrierWaiting_ > 0 && !sameSite(site, barrierSite_))) barrierFault(site);
  EmuThread& self = me();
  if (barrierWaiting_ == 0) {
    barrierSite_ = site;
    barrierFirstWaiter_ = current_;
  }
  self.wait = Wait::kBarrier;
  self.site = site;
  if (++barrierWaiting_ < threadCount_) {
    block();
    return;
  }
  // Everyone is here: all threads are runnable again (each one's state and wait are rewritten when
  // it runs; until then they only matter to a deadlock report, which needs no thread runnable).
  barrierWaiting_ = 0;
  barrierFirstWaiter_ = -1;
  ready_.reset(threadCount_);
  switchAway(Leaving::kNo, chooseNext());
}

void Executor::barrierFault(Site site) {
  if (exited_ > 0) {
    recordFault("reached __syncthreads at " + siteText(site) + " after " + where(firstExited_) +
                " exited: every thread of the block must reach it");
  } else {
    recordFault("reached __syncthreads at " + siteText(site) + " while " + where(barrierFirstWaiter_) +
                " waits at __syncthreads at " + siteText(barrierSite_));
  }
  abandonThread();
}

uint64_t Executor::warpOp(WarpOp op, unsigned mask, uint64_t bits, int lane, int width, Site site) {
  const int t = current_;
  const int warpIndex = t / kWarp;
  const unsigned bit = 1u << (t % kWarp);
  Warp& warp = warps_[static_cast<size_t>(warpIndex)];
  const bool badWidth =
      op != WarpOp::kSync && op != WarpOp::kVote && (width < 1 || width > kWarp || (width & (width - 1)) != 0);
  if ((mask & bit) == 0 || (mask & ~warp.present) != 0 || (mask & warp.exited) != 0 || badWidth) {
    warpFault(op, mask, width, site, nullptr);
  }
  PendingWarpOp* joined = nullptr;
  for (PendingWarpOp& pending : warp.pending) {
    if ((pending.mask & mask) == 0) continue;
    if (pending.mask != mask || pending.op != op || !sameSite(pending.site, site)) {
      warpFault(op, mask, width, site, &pending);
    }
    joined = &pending;
    break;
  }
  if (joined == nullptr) {
    warp.pending.push_back(PendingWarpOp{op, mask, 0, site});
    joined = &warp.pending.back();
  }
  EmuThread& self = me();
  self.op = op;
  self.mask = mask;
  self.bits = bits;
  self.lane = lane;
  self.width = width;
  self.site = site;
  self.wait = Wait::kWarpOp;
  joined->arrived |= bit;
  if (joined->arrived != mask) {
    block();
    return self.result;
  }
  const PendingWarpOp complete = *joined;
  warp.pending.erase(warp.pending.begin() + (joined - warp.pending.data()));
  completeWarpOp(warpIndex, complete);
  yieldAfterRelease();
  return self.result;
}

void Executor::warpFault(WarpOp op, unsigned mask, int width, Site site, const PendingWarpOp* conflicting) {
  recordFault(warpFaultMessage(op, mask, width, site, conflicting));
  abandonThread();
}

std::string Executor::warpFaultMessage(WarpOp op, unsigned mask, int width, Site site,
                                       const PendingWarpOp* conflicting) const {
  const int t = current_;
  const int warpIndex = t / kWarp;
  const Warp& warp = warps_[static_cast<size_t>(warpIndex)];
  const std::string call = std::string(opName(op)) + " at " + siteText(site) + " with mask " + maskText(mask);
  if (conflicting != nullptr) {
    const int waiter = warpIndex * kWarp + __builtin_ctz(conflicting->arrived);
    return call + " while " + where(waiter) + " waits at " + opName(conflicting->op) + " at " +
           siteText(conflicting->site) + " with mask " + maskText(conflicting->mask) +
           ": the lanes of a warp operation must call the same one";
  }
  if ((mask & (1u << (t % kWarp))) == 0) return call + ", which leaves out its own lane " + std::to_string(t % kWarp);
  if ((mask & ~warp.present) != 0) {
    return call + " names lanes that do not exist: the block has " + std::to_string(threadCount_) +
           " threads, so warp " + std::to_string(warpIndex) + " has lanes " + maskText(warp.present);
  }
  if ((mask & warp.exited) != 0) {
    return call + " waits for " + where(warpIndex * kWarp + __builtin_ctz(mask & warp.exited)) + ", which has exited";
  }
  return std::string(opName(op)) + " at " + siteText(site) + " with width " + std::to_string(width) +
         ": the width must be a power of two from 1 to 32";
}

// Every lane of the mask has arrived: computes each lane's result and makes the lanes runnable.
void Executor::completeWarpOp(int warpIndex, const PendingWarpOp& op) {
  const int base = warpIndex * kWarp;
  uint64_t ballot = 0;
  if (op.op == WarpOp::kVote) {
    for (int l = 0; l < kWarp; ++l) {
      if ((op.mask >> l & 1u) != 0 && threads_[static_cast<size_t>(base + l)].bits != 0) ballot |= uint64_t{1} << l;
    }
  }
  for (int l = 0; l < kWarp; ++l) {
    if ((op.mask >> l & 1u) == 0) continue;
    EmuThread& lane = threads_[static_cast<size_t>(base + l)];
    switch (op.op) {
      case WarpOp::kSync: lane.result = 0; break;
      case WarpOp::kVote: lane.result = ballot; break;
      default: {
        // The device's shuffle: the width splits the warp into segments; a source outside the
        // lane's segment (or past the warp) gives the lane its own value.
        const int b = lane.lane & 31;
        const int segMask = (kWarp - lane.width) & 31;
        const int clamp = op.op == WarpOp::kShflUp ? 0 : 31;
        const int maxLane = (l & segMask) | (clamp & ~segMask);
        const int minLane = l & segMask;
        int j = l;
        bool valid = false;
        switch (op.op) {
          case WarpOp::kShflUp:
            j = l - b;
            valid = j >= maxLane;
            break;
          case WarpOp::kShflDown:
            j = l + b;
            valid = j <= maxLane;
            break;
          case WarpOp::kShflXor:
            j = l ^ b;
            valid = j <= maxLane;
            break;
          default:
            j = minLane | (b & ~segMask);
            valid = j <= maxLane;
            break;
        }
        if (!valid) j = l;
        if ((op.mask >> j & 1u) == 0) {
          // Blamed on the lane that reads a lane not taking part.
          recordFault(std::string(opName(op.op)) + " at " + siteText(op.site) + " with mask " + maskText(op.mask) +
                          " reads lane " + std::to_string(j) + ", which is not in the mask",
                      base + l);
          abandonThread();
        }
        lane.result = threads_[static_cast<size_t>(base + j)].bits;
        break;
      }
    }
    lane.wait = Wait::kNone;
    if (base + l != current_) {
      lane.state = State::kRunnable;
      ready_.set(base + l);
    }
  }
}

std::string Executor::deadlockReport() const {
  std::ostringstream out;
  int listed = 0, waiting = 0;
  for (int t = 0; t < threadCount_; ++t) {
    const EmuThread& thread = threads_[static_cast<size_t>(t)];
    if (thread.state != State::kWaiting) continue;
    ++waiting;
    if (listed == 4) continue;
    if (listed > 0) out << "; ";
    out << where(t) << " waits at ";
    if (thread.wait == Wait::kBarrier) {
      out << "__syncthreads at " << siteText(thread.site);
    } else {
      out << opName(thread.op) << " (mask " << maskText(thread.mask) << ") at " << siteText(thread.site);
    }
    ++listed;
  }
  if (waiting > listed) out << "; " << (waiting - listed) << " more threads wait";
  if (exited_ > 0) out << "; " << exited_ << " threads have exited";
  return out.str();
}

Executor& executor() {
  static thread_local Executor ex;
  return ex;
}

Executor* currentThreadExecutor() {
  Executor* ex = tExecutor;
  return ex != nullptr && ex->inThread() ? ex : nullptr;
}

}  // namespace

// ---- public entry points ---------------------------------------------------------------------------

Schedule schedule() { return static_cast<Schedule>(settings().schedule.load()); }
uint64_t scheduleSeed() { return settings().seed.load(); }

void setSchedule(Schedule s, uint64_t seed) {
  settings().schedule = static_cast<int>(s);
  settings().seed = seed;
}

void deviceCodeFault(const char* what) {
  if (Executor* ex = currentThreadExecutor()) {
    ex->recordFault(what);
    ex->abandonThread();
  }
  deviceFault(what);
}

namespace detail {

void runKernel(const KernelLaunch& launch, void (*body)(const void*), const void* context) {
  if (faulted()) return;
  Executor& ex = executor();
  if (ex.running()) {
    deviceFault("kernel " + std::string(launch.name) + " launched while kernel code runs on the same host thread");
    return;
  }
  Executor* saved = tExecutor;
  tExecutor = &ex;
  ex.run(launch, body, context);
  tExecutor = saved;
}

bool checkKernelPointer(const char* kernel, size_t index, const void* pointer) {
  if (pointer == nullptr || isDeviceRange(pointer, 0)) return true;
  char text[32];
  std::snprintf(text, sizeof text, "%p", pointer);
  deviceFault("kernel " + std::string(kernel) + ": argument " + std::to_string(index) + " (" + text +
              ") is not device memory");
  return false;
}

void syncThreads(Site site) {
  if (Executor* ex = currentThreadExecutor()) ex->syncThreads(site);
}

uint64_t warpOp(WarpOp op, unsigned mask, uint64_t bits, int lane, int width, Site site) {
  if (Executor* ex = currentThreadExecutor()) return ex->warpOp(op, mask, bits, lane, width, site);
  return op == WarpOp::kVote ? (bits != 0 ? 1u : 0u) : bits;  // host code: a warp of one
}

}  // namespace detail
}  // namespace rc_emu
