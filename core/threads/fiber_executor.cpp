#include "core/threads/fiber_executor.h"

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <time.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>

#include "core/error.h"
#include "core/threads/executor.h"

#if defined(__SANITIZE_THREAD__)
#include <sanitizer/tsan_interface.h>
#define MESHRT_FIBER_TSAN 1
#endif
#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#define MESHRT_FIBER_ASAN 1
#endif

// Switching between a worker and a fiber. On x86-64 a switch saves the callee-saved registers
// and the SSE/x87 control words on the old stack and loads the new stack pointer (no system
// call); glibc's swapcontext, used elsewhere, also saves and restores the signal mask, a system
// call on every switch (two per device per launch: about a third of a small collective's cost
// per device). Fibers never change the signal mask, so there is nothing to restore.
// Not while CET shadow stacks are on: a stack switch by hand would leave the shadow stack
// behind, and the first return would fault; glibc's swapcontext switches both. A build that may
// run with them (-fcf-protection=return or full, the default of some distributions' compilers)
// keeps both switches and asks the CPU at run time (rdsspq reads 0 when shadow stacks are off,
// as they are unless the kernel, glibc and the program all opt in).
#if defined(__x86_64__)
#define MESHRT_FIBER_ASM 1
#if defined(__CET__) && (__CET__ & 2)
#define MESHRT_FIBER_UCONTEXT 1
#endif
#else
#define MESHRT_FIBER_UCONTEXT 1
#endif

#ifdef MESHRT_FIBER_ASM
extern "C" {
// Saves the running context on its stack, stores that stack pointer in *save_sp, and continues
// the context whose stack pointer is to_sp (saved by an earlier call, or made by
// make_fiber_context).
void meshrt_fiber_jump(void** save_sp, void* to_sp);
// A new fiber's first instructions: calls r13(r12) (fiber_entry(fiber)), which never returns.
void meshrt_fiber_start();
}
asm(R"(
  .pushsection .text
  .globl meshrt_fiber_jump
  .hidden meshrt_fiber_jump
  .type meshrt_fiber_jump, @function
  .p2align 4
meshrt_fiber_jump:
  .cfi_startproc
  pushq %rbp
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %rbp, 0
  pushq %rbx
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %rbx, 0
  pushq %r12
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r12, 0
  pushq %r13
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r13, 0
  pushq %r14
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r14, 0
  pushq %r15
  .cfi_adjust_cfa_offset 8
  .cfi_rel_offset %r15, 0
  subq $8, %rsp
  .cfi_adjust_cfa_offset 8
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  .cfi_adjust_cfa_offset -8
  popq %r15
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r15
  popq %r14
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r14
  popq %r13
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r13
  popq %r12
  .cfi_adjust_cfa_offset -8
  .cfi_restore %r12
  popq %rbx
  .cfi_adjust_cfa_offset -8
  .cfi_restore %rbx
  popq %rbp
  .cfi_adjust_cfa_offset -8
  .cfi_restore %rbp
  ret
  .cfi_endproc
  .size meshrt_fiber_jump, .-meshrt_fiber_jump

  .globl meshrt_fiber_start
  .hidden meshrt_fiber_start
  .type meshrt_fiber_start, @function
  .p2align 4
meshrt_fiber_start:
  .cfi_startproc
  .cfi_undefined rip
  movq %r12, %rdi
  callq *%r13
  ud2
  .cfi_endproc
  .size meshrt_fiber_start, .-meshrt_fiber_start
  .popsection
)");
#endif
#ifdef MESHRT_FIBER_UCONTEXT
#include <ucontext.h>
#endif

namespace meshrt::core {

namespace {
using Clock = std::chrono::steady_clock;
constexpr size_t kStackSize = size_t{8} << 20;  // like a thread's; committed lazily
constexpr std::chrono::microseconds kIdleSpin{100};

// Whether switches use meshrt_fiber_jump (decided once per process).
bool asm_switch() {
#if defined(MESHRT_FIBER_ASM) && defined(MESHRT_FIBER_UCONTEXT)
  static const bool on = [] {
    uint64_t ssp = 0;
    // rdsspq %rax, as bytes for assemblers without CET mnemonics; a no-op, leaving 0, on CPUs
    // without CET and while shadow stacks are off.
    asm volatile(".byte 0xf3, 0x48, 0x0f, 0x1e, 0xc8" : "+a"(ssp));
    return ssp == 0;
  }();
  return on;
#elif defined(MESHRT_FIBER_ASM)
  return true;
#else
  return false;
#endif
}

// Where a switched-out worker or fiber continues.
struct Context {
#ifdef MESHRT_FIBER_ASM
  void* sp = nullptr;
#endif
#ifdef MESHRT_FIBER_UCONTEXT
  ucontext_t uc{};
#endif
};

inline void jump(Context& from, Context& to) {
#ifdef MESHRT_FIBER_ASM
  if (asm_switch()) {
    meshrt_fiber_jump(&from.sp, to.sp);
    return;
  }
#endif
#ifdef MESHRT_FIBER_UCONTEXT
  swapcontext(&from.uc, &to.uc);
#endif
}
}  // namespace

struct FiberPool::Fiber {
  Worker* worker = nullptr;
  Context ctx;
  void* map = nullptr;  // guard page + stack, in FiberPool::stacks_
  void* stack_lo = nullptr;
  std::deque<std::function<void()>> queue;  // guarded by worker->mu
  std::atomic<int> queued{0};               // queue.size(), readable without the lock
  bool listed = false;  // guarded by worker->mu: in the worker's `incoming` or `active` list
  // Worker-thread-only state: whether a task is in progress, and while the fiber is switched
  // out inside cooperative_wait, what it waits for.
  bool busy = false;
  const std::atomic<uint32_t>* word = nullptr;
  uint32_t value = 0;
  Clock::time_point deadline{};
#ifdef MESHRT_FIBER_TSAN
  void* tsan = nullptr;
#endif
  void run();
};

struct FiberPool::Worker {
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  std::atomic<int> queued{0};  // tasks queued on this worker's fibers
  bool stop = false;           // guarded by mu
  // Whether a thread is running this worker's fibers: its own thread, or a caller driving it
  // while it waits for a launch (FiberPool::drive). Taken and released with acquire/release.
  std::atomic<bool> owned{false};
  std::atomic<int> busy{0};  // fibers in the middle of a task (some may be switched out)
  std::vector<Fiber*> fibers;
  // Only fibers with work are visited: submit() lists a fiber in `incoming` (under mu), a pass
  // moves those into `active` (the owner's), and a fiber leaves `active` once it has no task in
  // progress or queued. A pass costs the busy devices, not all of the worker's devices.
  std::vector<Fiber*> incoming;  // guarded by mu
  std::atomic<bool> has_incoming{false};
  std::vector<Fiber*> active;  // the owning thread's
  Context ctx;
  Fiber* current = nullptr;
  // The running thread's: its stack (AddressSanitizer) and fiber handle (ThreadSanitizer).
  void* stack_lo = nullptr;
  size_t stack_size = 0;
#ifdef MESHRT_FIBER_TSAN
  void* tsan = nullptr;
#endif
  void loop();
  // One pass over the fibers, running each runnable one until it waits or idles.
  enum class Pass { ran, waiting, idle };  // waiting: busy fibers, none runnable
  Pass pass();
  bool try_own();
  void disown();
  bool has_work() const {
    return queued.load(std::memory_order_relaxed) > 0 || busy.load(std::memory_order_relaxed) > 0;
  }
};

namespace {

thread_local FiberPool::Worker* t_worker = nullptr;
thread_local void* t_task_slot = nullptr;
std::atomic<bool> g_fibers_in_use{false};

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

// The switches, with the annotations ThreadSanitizer and AddressSanitizer need to follow them.
static void switch_to_fiber(FiberPool::Worker* w, FiberPool::Fiber* f) {
  w->current = f;
  t_task_slot = nullptr;  // a resumed fiber restores its own (switch_to_worker)
#ifdef MESHRT_FIBER_TSAN
  __tsan_switch_to_fiber(f->tsan, 0);
#endif
#ifdef MESHRT_FIBER_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f->stack_lo, kStackSize);
#endif
  jump(w->ctx, f->ctx);
#ifdef MESHRT_FIBER_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  w->current = nullptr;
  t_task_slot = nullptr;
}

// The running thread's task slot. A fiber may resume on another thread than the one it left
// (a caller driving its worker, then the worker's own thread): thread-local addresses must be
// taken afresh after a switch, never kept from before it: this accessor is opaque to the
// optimiser (noipa), which would otherwise treat it as a constant and reuse the old address.
[[gnu::noipa]] static void*& current_task_slot() { return t_task_slot; }

static void switch_to_worker(FiberPool::Fiber* f) {
  FiberPool::Worker* w = f->worker;
  void* const slot = current_task_slot();  // this fiber's, back when it resumes
#ifdef MESHRT_FIBER_TSAN
  __tsan_switch_to_fiber(w->tsan, 0);
#endif
#ifdef MESHRT_FIBER_ASAN
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, w->stack_lo, w->stack_size);
#endif
  jump(f->ctx, w->ctx);
#ifdef MESHRT_FIBER_ASAN
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#endif
  current_task_slot() = slot;
}

static void fiber_entry_at(FiberPool::Fiber* f) {
#ifdef MESHRT_FIBER_ASAN
  __sanitizer_finish_switch_fiber(nullptr, nullptr, nullptr);
#endif
  f->run();
}

#ifdef MESHRT_FIBER_UCONTEXT
static void fiber_entry(unsigned hi, unsigned lo) {
  fiber_entry_at(reinterpret_cast<FiberPool::Fiber*>((static_cast<uintptr_t>(hi) << 32) | lo));
}
#endif

// A device's fiber: runs its tasks in order, forever; with none queued it returns to the worker.
void FiberPool::Fiber::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::lock_guard<std::mutex> lock(worker->mu);
      if (!queue.empty()) {
        task = std::move(queue.front());
        queue.pop_front();
        queued.fetch_sub(1, std::memory_order_relaxed);
        worker->queued.fetch_sub(1, std::memory_order_relaxed);
      }
    }
    if (!task) {
      if (busy) worker->busy.fetch_sub(1, std::memory_order_relaxed);
      busy = false;
      switch_to_worker(this);
      continue;
    }
    if (!busy) worker->busy.fetch_add(1, std::memory_order_relaxed);
    busy = true;
    task();
    task = nullptr;  // release captures on this fiber, before it idles
  }
}

namespace {
// The calling thread's stack bounds, for AddressSanitizer's fiber switches.
std::pair<void*, size_t> thread_stack() {
  thread_local std::pair<void*, size_t> stack{nullptr, 0};
  if (stack.first == nullptr) {
    pthread_attr_t attr;
    if (pthread_getattr_np(pthread_self(), &attr) == 0) {
      pthread_attr_getstack(&attr, &stack.first, &stack.second);
      pthread_attr_destroy(&attr);
    }
  }
  return stack;
}
}  // namespace

bool FiberPool::Worker::try_own() {
  bool expected = false;
  if (!owned.compare_exchange_strong(expected, true, std::memory_order_acquire)) return false;
  std::tie(stack_lo, stack_size) = thread_stack();
#ifdef MESHRT_FIBER_TSAN
  tsan = __tsan_get_current_fiber();
#endif
  t_worker = this;
  return true;
}

void FiberPool::Worker::disown() {
  t_worker = nullptr;
  owned.store(false, std::memory_order_release);
}

FiberPool::Worker::Pass FiberPool::Worker::pass() {
  if (has_incoming.load(std::memory_order_acquire)) {
    std::lock_guard<std::mutex> lock(mu);
    active.insert(active.end(), incoming.begin(), incoming.end());
    incoming.clear();
    has_incoming.store(false, std::memory_order_relaxed);
  }
  bool ran = false, waiting = false;
  Clock::time_point now{};
  bool have_now = false;
  for (size_t i = 0; i < active.size();) {
    Fiber* f = active[i];
    bool runnable;
    if (f->busy) {
      runnable = f->word == nullptr || f->word->load(std::memory_order_acquire) != f->value;
      if (!runnable) {
        if (!have_now) {
          now = Clock::now();
          have_now = true;
        }
        runnable = now >= f->deadline;
      }
    } else {
      runnable = f->queued.load(std::memory_order_acquire) > 0;
    }
    if (runnable) {
      ran = true;
      switch_to_fiber(this, f);
    }
    if (f->busy) {
      waiting = waiting || !runnable;
      ++i;
      continue;
    }
    // Idle: it leaves the list unless a task arrived meanwhile (checked under submit's lock).
    std::lock_guard<std::mutex> lock(mu);
    if (f->queued.load(std::memory_order_relaxed) > 0) {
      ++i;
      continue;
    }
    f->listed = false;
    active[i] = active.back();
    active.pop_back();
  }
  return ran ? Pass::ran : waiting || !active.empty() ? Pass::waiting : Pass::idle;
}

namespace {
// Backing off while every fiber of a worker waits for a peer on another thread, gently at first.
void back_off(uint64_t& idle_passes) {
  ++idle_passes;
  if (idle_passes < 64) {
    cpu_relax();
  } else if (idle_passes < 4096) {
    sched_yield();
  } else {
    timespec ts{0, 20000};
    nanosleep(&ts, nullptr);
  }
}
}  // namespace

void FiberPool::Worker::loop() {
  mark_executor_thread();
  for (;;) {
    // Sleep until a task arrives and no caller drives this worker; then own it.
    {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return stop || (!owned.load(std::memory_order_acquire) && has_work()); });
      if (stop && queued.load(std::memory_order_relaxed) == 0) return;
    }
    if (!try_own()) continue;  // a caller took it in between
    uint64_t idle_passes = 0;
    for (;;) {
      const Pass p = pass();
      if (p == Pass::ran) {
        idle_passes = 0;
        continue;
      }
      if (p == Pass::waiting) {
        back_off(idle_passes);
        continue;
      }
      break;  // no device has work
    }
    disown();
    // Launches often come back to back and a futex wake-up costs more than a short body: yield a
    // while before sleeping (not owning the worker, so a waiting caller may drive it instead).
    const auto until = Clock::now() + kIdleSpin;
    while (!has_work() && Clock::now() < until) sched_yield();
  }
}

bool FiberPool::claim(int device) {
  Worker* w = fibers_[static_cast<size_t>(device)]->worker;
  return t_worker == nullptr && w->try_own();  // not on a worker, and its thread does not run it
}

bool FiberPool::drive(int device, const std::atomic<uint32_t>& done) {
  Worker* w = fibers_[static_cast<size_t>(device)]->worker;
  if (t_worker != w && !claim(device)) return false;
  const bool was_executor = on_executor();
  mark_executor_thread(true);      // bodies run here: nested launches must see an executor
  void* const slot = t_task_slot;  // the caller's own (fiber switches reset it)
  uint64_t idle_passes = 0;
  while (done.load(std::memory_order_acquire) == 0) {
    if (w->pass() == Worker::Pass::ran)
      idle_passes = 0;
    else
      back_off(idle_passes);
  }
  mark_executor_thread(was_executor);
  t_task_slot = slot;
  w->disown();
  // Work left (a task queued meanwhile, a device of another launch mid-task): the worker's
  // thread takes over. Checked under the lock submit() queues under, so none is missed.
  std::lock_guard<std::mutex> lock(w->mu);
  if (w->has_work()) w->cv.notify_one();
  return true;
}

#ifdef MESHRT_FIBER_ASM
// A new fiber's stack as meshrt_fiber_jump leaves a switched-out one: from the saved stack
// pointer up, the control words (this thread's), r15, r14, r13 (the entry function), r12 (its
// argument), rbx, rbp, and the return address, meshrt_fiber_start, which then runs with a 16-byte
// aligned stack as a call site needs.
static void make_asm_context(FiberPool::Fiber* f) {
  uint32_t mxcsr = 0;
  uint16_t fpu_cw = 0;
  asm volatile("stmxcsr %0" : "=m"(mxcsr));
  asm volatile("fnstcw %0" : "=m"(fpu_cw));
  auto top = reinterpret_cast<uintptr_t>(f->stack_lo) + kStackSize;
  top &= ~uintptr_t{15};
  auto* sp = reinterpret_cast<uint64_t*>(top) - 10;  // 80 bytes: sp stays 16-byte aligned
  sp[0] = mxcsr | (static_cast<uint64_t>(fpu_cw) << 32);
  sp[1] = 0;                                                // r15
  sp[2] = 0;                                                // r14
  sp[3] = reinterpret_cast<uint64_t>(&fiber_entry_at);      // r13
  sp[4] = reinterpret_cast<uint64_t>(f);                    // r12
  sp[5] = 0;                                                // rbx
  sp[6] = 0;                                                // rbp
  sp[7] = reinterpret_cast<uint64_t>(&meshrt_fiber_start);  // return address
  sp[8] = sp[9] = 0;
  f->ctx.sp = sp;
}
#endif
#ifdef MESHRT_FIBER_UCONTEXT
// getcontext returns twice like setjmp; kept out of the constructor's loop (-Wclobbered).
[[gnu::noinline]] static void make_ucontext(FiberPool::Fiber* f) {
  getcontext(&f->ctx.uc);
  f->ctx.uc.uc_stack.ss_sp = f->stack_lo;
  f->ctx.uc.uc_stack.ss_size = kStackSize;
  f->ctx.uc.uc_link = nullptr;
  const auto p = reinterpret_cast<uintptr_t>(f);
  makecontext(&f->ctx.uc, reinterpret_cast<void (*)()>(fiber_entry), 2,
              static_cast<unsigned>(p >> 32), static_cast<unsigned>(p & 0xffffffffu));
}
#endif

static void make_fiber_context(FiberPool::Fiber* f) {
#ifdef MESHRT_FIBER_ASM
  if (asm_switch()) {
    make_asm_context(f);
    return;
  }
#endif
#ifdef MESHRT_FIBER_UCONTEXT
  make_ucontext(f);
#endif
}

FiberPool::FiberPool(int devices, int workers) {
  g_fibers_in_use.store(true, std::memory_order_relaxed);
  if (workers < 1) workers = 1;
  for (int i = 0; i < workers; ++i) workers_.push_back(std::make_unique<Worker>());
  // Every stack in one mapping, each worker's side by side: a worker switches among its own
  // devices' stacks, and neighbouring stacks share page-table lines (a page-directory line maps
  // two 8 MiB stacks), so a worker's walk to the top of its next stack misses half as often as
  // with stacks of alternate workers interleaved.
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const size_t per_worker = static_cast<size_t>((devices + workers - 1) / workers);
  stacks_bytes_ = (kStackSize + page) * per_worker * static_cast<size_t>(workers);
  if (devices > 0) {
    stacks_ = mmap(nullptr, stacks_bytes_, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (stacks_ == MAP_FAILED) {
      stacks_ = nullptr;
      throw Error("[cpu] cannot map the fiber stacks of " + std::to_string(devices) + " devices: " +
                  std::strerror(errno) + "; use fewer devices or MESHRT_CPU_EXECUTOR=threads");
    }
  }
  for (int d = 0; d < devices; ++d) {
    auto f = std::make_unique<Fiber>();
    f->worker = workers_[static_cast<size_t>(d % workers)].get();
    const size_t at =
        static_cast<size_t>(d % workers) * per_worker + static_cast<size_t>(d / workers);
    f->map = static_cast<char*>(stacks_) + at * (kStackSize + page);
    mprotect(f->map, page, PROT_NONE);  // guard page: an overflow faults instead of corrupting
    f->stack_lo = static_cast<char*>(f->map) + page;
    make_fiber_context(f.get());
#ifdef MESHRT_FIBER_TSAN
    f->tsan = __tsan_create_fiber(0);
#endif
    f->worker->fibers.push_back(f.get());
    fibers_.push_back(std::move(f));
  }
  for (auto& w : workers_) {
    Worker* wp = w.get();
    w->thread = std::thread([wp] { wp->loop(); });
  }
}

FiberPool::~FiberPool() {
  for (auto& w : workers_) {
    {
      std::lock_guard<std::mutex> lock(w->mu);
      w->stop = true;
    }
    w->cv.notify_all();
    if (w->thread.joinable()) w->thread.join();
  }
#ifdef MESHRT_FIBER_TSAN
  for (auto& f : fibers_) __tsan_destroy_fiber(f->tsan);
#endif
  if (stacks_ != nullptr) munmap(stacks_, stacks_bytes_);
}

void FiberPool::submit(int device, std::function<void()> task) {
  Fiber* f = fibers_[static_cast<size_t>(device)].get();
  Worker* w = f->worker;
  {
    std::lock_guard<std::mutex> lock(w->mu);
    f->queue.push_back(std::move(task));
    f->queued.fetch_add(1, std::memory_order_release);
    w->queued.fetch_add(1, std::memory_order_release);
    if (!f->listed) {
      f->listed = true;
      w->incoming.push_back(f);
      w->has_incoming.store(true, std::memory_order_release);
    }
  }
  // A thread running the worker sees the task on its next pass; drive() hands leftovers back.
  if (!w->owned.load(std::memory_order_acquire)) w->cv.notify_one();
}

bool fiber_executors_in_use() { return g_fibers_in_use.load(std::memory_order_relaxed); }

void*& task_local_slot() { return t_task_slot; }

bool on_fiber() { return t_worker != nullptr && t_worker->current != nullptr; }

std::chrono::nanoseconds cooperative_wait_budget(std::chrono::nanoseconds budget) {
  if (!on_fiber()) return budget;
  // `active` is the owning thread's, and the caller runs on it.
  const auto busy = static_cast<int64_t>(t_worker->active.size());
  return std::max<std::chrono::nanoseconds>(budget, busy * kCooperativeWaitPerFiber);
}

bool cooperative_wait(const std::atomic<uint32_t>& word, uint32_t value,
                      std::chrono::steady_clock::time_point deadline) {
  FiberPool::Worker* w = t_worker;
  if (w == nullptr || w->current == nullptr) return false;
  FiberPool::Fiber* f = w->current;
  f->word = &word;
  f->value = value;
  f->deadline = deadline;
  switch_to_worker(f);
  f->word = nullptr;
  return true;
}

}  // namespace meshrt::core
