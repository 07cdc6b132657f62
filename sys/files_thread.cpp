// The files thread: a thread whose descriptor table is gpupool's own
// (sys/io.hpp, "The files thread"), the work it runs, and its fork
// handling.
#include "sys/io.hpp"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <new>

#include "core/fork_wait.hpp"
#include "core/lock_rank.hpp"
#include "core/no_destructor.hpp"

namespace gpupool::io {
namespace {

struct Job {
  Work fn;
  Job* next = nullptr;  // the queue, through the callers' stacks
  bool done = false;
  std::exception_ptr failed;  // rethrown to the caller
};

// Never destroyed: jobs come until the process is gone (exit dumps, logs).
struct Files {
  Ranked<LockRank::files_queue> mu;
  std::condition_variable_any cv;  // a job queued or done, the gate opened, a start
  Job* head = nullptr;             // the queue, oldest first
  Job* tail = nullptr;
  pid_t pid = 0;  // the process whose files thread runs (0: none yet)
  bool starting = false;
  bool inline_only = false;  // no private table here: work runs where asked
  // fork() is waiting: no new work starts. Closed and opened under mu,
  // except by a fork's prepare that gave up (private_fork_prepare).
  std::atomic<bool> gate{false};
  int busy = 0;           // private threads inside a job or PrivateWork
  int unshare_errno = 0;  // why inline_only
};

using FilesLock = UniqueLock<Ranked<LockRank::files_queue>>;

// Waits on f.cv (lk on f.mu) until `ready`. While the gate is closed, a
// turn lasts 10 ms at most: a prepare that gave up opens it without the
// lock, and its wake-up may come between a check and the wait.
template <class Pred>
void wait_gated(Files& f, FilesLock& lk, Pred ready) {
  while (!ready()) {
    if (f.gate.load(std::memory_order_relaxed)) f.cv.wait_for(lk, std::chrono::milliseconds(10));
    else f.cv.wait(lk);
  }
}

std::atomic<bool> g_enabled{false};
// Made at first use, not by a static initializer: a hook may start gpupool
// from another library's constructor, before this library's initializers.
Files& files() {
  static NoDestructor<Files> f;
  return *f;
}
thread_local bool t_private = false;

// The calling thread's table made its own, emptied. 0-2 become /dev/null
// there, so that the private numbers start at 3 (as gpupool's always did)
// and a stray use of 0-2 on this thread reaches nothing of the program's.
#if defined(__SANITIZE_THREAD__)
constexpr bool kThreadSanitizer = true;
#elif defined(__has_feature)
#if __has_feature(thread_sanitizer)
constexpr bool kThreadSanitizer = true;
#else
constexpr bool kThreadSanitizer = false;
#endif
#else
constexpr bool kThreadSanitizer = false;
#endif

bool make_private_table() {
  if (unshare(CLONE_FILES) != 0) return false;
  // Under ThreadSanitizer its reports from this thread go to the program's
  // stderr (2 is kept); elsewhere 2 is emptied with the rest.
  const unsigned first = kThreadSanitizer ? 3u : 0u;
#ifdef SYS_close_range
  if (syscall(SYS_close_range, first, ~0u, 0u) != 0)
#endif
  {
    // No close_range (Linux before 5.9): every number the limit allows.
    const long max = std::min<long>(sysconf(_SC_OPEN_MAX), 1 << 20);
    for (int fd = static_cast<int>(first); fd < max; ++fd) ::close(fd);
  }
  const int last_null = kThreadSanitizer ? 1 : 2;
  for (int fd = 0; fd <= last_null; ++fd) {
    if (fd < static_cast<int>(first)) ::close(fd);
    if (::open("/dev/null", O_RDWR | O_CLOEXEC) != fd) break;
  }
  if (kThreadSanitizer) {
    // ThreadSanitizer models one descriptor table per process: a number
    // open here and the same number in the program's table look like one
    // descriptor used by two threads without order (a false race on every
    // reuse). Numbers below kTsanFloor stay taken here, so the private
    // ones never meet the program's in the tests.
    constexpr int kTsanFloor = 256;
    const int null = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    for (int fd = null + 1; null >= 0 && fd < kTsanFloor; ++fd)
      if (fcntl(null, F_DUPFD_CLOEXEC, fd) != fd) break;
  }
  return true;
}

// Lets go of the queue's lock (`lk`, on f.mu) around the job.
void run_job(Files& f, FilesLock& lk, Job* job) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  ++f.busy;
  lk.unlock();
  try {
    job->fn();
  } catch (...) {
    job->failed = std::current_exception();
  }
  lk.lock();
  --f.busy;
  job->done = true;
  f.cv.notify_all();
}

void* files_main(void*) {
  Files& f = files();
#ifdef __GLIBC__
  // Named by itself: naming another thread opens /proc/self/task/TID/comm.
  pthread_setname_np(pthread_self(), "gpupool-files");
#endif
  const bool ok = make_private_table();
  const int e = errno;
  UniqueLock lk(f.mu);
  f.unshare_errno = e;
  f.starting = false;
  f.inline_only = !ok;
  f.cv.notify_all();
  if (!ok) return nullptr;  // inline from now on in this process
  t_private = true;
  for (;;) {
    wait_gated(f, lk, [&] { return !f.gate.load(std::memory_order_relaxed) && f.head; });
    Job* job = f.head;
    f.head = job->next;
    if (!f.head) f.tail = nullptr;
    run_job(f, lk, job);
  }
}

// Starts the files thread if this process has none. Called with f.mu held;
// false: work runs inline.
bool ensure_started(Files& f, FilesLock& lk) {
  const pid_t self = getpid();
  if (f.pid == self && !f.starting) return !f.inline_only;
  if (f.pid != self) {
    f.pid = self;
    f.starting = true;
    f.inline_only = false;
    if (start_detached(files_main, nullptr) != 0) {
      f.starting = false;
      f.pid = 0;  // tried again next time
      return false;
    }
  }
  f.cv.wait(lk, [&] { return !f.starting; });
  return !f.inline_only;
}

struct Spawned {
  Job* job;  // waited for by its caller, counted busy; or
  void (*raw)(void*);
  void* arg;
  bool private_table = true;  // false: made where none could be
};

void* spawned_main(void* p) {
  Spawned s = *static_cast<Spawned*>(p);
  delete static_cast<Spawned*>(p);
  t_private = s.private_table;
  if (s.job) {
    Files& f = files();
    UniqueLock lk(f.mu);
    --f.busy;  // counted by its creator until run_job counts it
    run_job(f, lk, s.job);
  } else {
    s.raw(s.arg);
  }
  return nullptr;
}

// A new thread of the private table; called on a private thread (it shares
// the creator's table).
bool spawn(Spawned* s) {
  // Signals blocked as on the files thread (the creator may be a program
  // thread where no private table could be made).
  const int err = start_detached(spawned_main, s);
  if (err != 0) delete s;
  return err == 0;
}

}  // namespace

void enable_private_files() { g_enabled.store(true, std::memory_order_release); }

bool on_private_thread() { return t_private; }

int start_private_files() {
  if (t_private || !g_enabled.load(std::memory_order_acquire)) return 0;
  Files& f = files();
  UniqueLock lk(f.mu);
  return ensure_started(f, lk) || !f.inline_only ? 0 : f.unshare_errno;
}

// Nothing here logs (io.hpp: start_private_files): the first call may come
// from the logger's sink, which holds its lock meanwhile.
void in_private_work(Work fn) {
  if (t_private || !g_enabled.load(std::memory_order_acquire)) {
    fn();
    return;
  }
  Files& f = files();
  UniqueLock lk(f.mu);
  if (!ensure_started(f, lk)) {
    lk.unlock();
    fn();
    return;
  }
  Job job{fn};
  (f.tail ? f.tail->next : f.head) = &job;
  f.tail = &job;
  f.cv.notify_all();
  f.cv.wait(lk, [&] { return job.done; });
  if (job.failed) std::rethrow_exception(job.failed);
}

void in_private_own_thread_work(Work fn) {
  if (t_private || !g_enabled.load(std::memory_order_acquire)) {
    fn();
    return;
  }
  Job job{fn};
  bool started = false;
  in_private([&] {
    {
      // Counted busy from here, so that fork() waits for it too.
      LockGuard lk(files().mu);
      ++files().busy;
    }
    started = t_private && spawn(new Spawned{&job, nullptr, nullptr});
    if (!started) {
      LockGuard lk(files().mu);
      --files().busy;
    }
  });
  if (!started) {
    in_private_work(fn);  // on the files thread, or inline without a table
    return;
  }
  Files& f = files();
  UniqueLock lk(f.mu);
  f.cv.wait(lk, [&] { return job.done; });
  if (job.failed) std::rethrow_exception(job.failed);
}

int start_detached(void* (*fn)(void*), void* arg) {
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  pthread_attr_t attr;
  pthread_attr_init(&attr);
  pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
  pthread_t tid;
  const int err = pthread_create(&tid, &attr, fn, arg);
  pthread_attr_destroy(&attr);
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  return err;
}

bool start_private_thread(void (*fn)(void*), void* arg) {
  if (!g_enabled.load(std::memory_order_acquire)) return false;
  bool started = false;
  // Without a private table, a thread of the program's, as before.
  in_private([&] { started = spawn(new Spawned{nullptr, fn, arg, t_private}); });
  return started;
}

PrivateWork::PrivateWork() {
  Files& f = files();
  UniqueLock lk(f.mu);
  wait_gated(f, lk, [&] { return !f.gate.load(std::memory_order_relaxed); });
  ++f.busy;
}

PrivateWork::~PrivateWork() {
  Files& f = files();
  LockGuard lk(f.mu);
  --f.busy;
  f.cv.notify_all();
}

// The queue's lock, once no private thread is busy (the gate closed
// meanwhile: no new work starts). Its waits give up as every prepare's
// (core/fork_wait.hpp); the gate is then opened again.
void private_fork_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  Files& f = files();
  for (unsigned turn = 0;; ++turn) {
    if (!f.mu.lock_or_give_up()) return;
    if (!f.gate.exchange(true, std::memory_order_relaxed))
      fork_wait::journal(
          [](void* p) {
            Files& files = *static_cast<Files*>(p);
            files.gate.store(false, std::memory_order_relaxed);
            files.cv.notify_all();
          },
          &f);
    if (f.busy == 0) break;
    f.mu.unlock();
    if (!fork_wait::keep_waiting(turn)) return;
  }
  fork_wait::journal_lock(f.mu);  // held until parent or child
}

void private_fork_parent() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  Files& f = files();
  f.gate.store(false, std::memory_order_relaxed);
  f.cv.notify_all();
  f.mu.unlock();
}

void private_fork_child() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  // No private thread here: the parent's jobs are the parent's.
  Files& f = files();
  f.mu.remake_held_in_child();
  new (&f.cv) std::condition_variable_any;
  f.head = f.tail = nullptr;
  f.pid = 0;
  f.starting = false;
  f.inline_only = false;
  f.gate.store(false, std::memory_order_relaxed);
  f.busy = 0;
}

}  // namespace gpupool::io
