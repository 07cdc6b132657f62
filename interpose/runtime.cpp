#include "interpose/runtime.hpp"

#include <time.h>

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <mutex>
#include <utility>

#include "core/fork_wait.hpp"
#include "interpose/hook_scope.hpp"
#include "sys/io.hpp"
#include "sys/log.hpp"

namespace gpupool {

std::atomic<Runtime*> detail::g_runtime{nullptr};
std::atomic<bool> detail::g_renew_control{false};

namespace {

using detail::g_renew_control;
using detail::g_runtime;

std::atomic<bool> g_exiting{false};

void pool_fork_prepare() {
  if (Runtime* r = g_runtime.load()) (void)r->pool.fork_prepare();
}
void pool_fork_parent() {
  if (Runtime* r = g_runtime.load()) r->pool.fork_parent();
}
void pool_fork_child() {
  if (Runtime* r = g_runtime.load()) r->pool.fork_child();
}

// Each part's handlers, in Part order; `reverse`: in reverse order.
template <typename F>
void each_part(F&& f, bool reverse = false) {
  constexpr std::size_t n = std::size(kParts);
  for (std::size_t i = 0; i < n; ++i) f(*kParts[reverse ? n - 1 - i : i].handlers);
}

// A fork() made without gpupool: gpupool takes none of its locks for it,
// and the child, which may hold copies of locks taken anywhere, is left
// inert: gpupool does nothing more in it (its calls go to the driver alone,
// no exit work). POSIX allows a child forked from a signal handler
// async-signal-safe calls only, an exec or an _exit, which is what crash
// handlers do. That is such a fork:
//   - from a signal handler that interrupted this thread inside gpupool:
//     it may hold any of gpupool's locks;
//   - one whose prepare gave up waiting for a lock (core/fork_wait.hpp):
//     another thread holds it and does not let go, one a signal handler
//     interrupted inside gpupool, most likely, whose handler forks too.
GPUPOOL_HOT_TLS bool t_fork_without_gpupool = false;
std::atomic<std::uint64_t> g_forks_without{0};  // forks_without_gpupool()
// fork() through gpupool's own export (fork_now): it counts a fork without
// gpupool once it knows there is a child; glibc runs the parent's handlers
// when fork fails too.
GPUPOOL_HOT_TLS bool t_in_fork_now = false;
GPUPOOL_HOT_TLS bool t_forked_without = false;
std::atomic<bool> g_inert{false};

// The parts' handlers take and release locks; only the child's renewal
// allocates, and a failure there costs the child its pooling of what
// failed, not its life (pthread_atfork handlers must not throw: a prepare
// that fails gives up as one that waited too long).
void fork_prepare() {
  if (inside_hook()) {
    t_fork_without_gpupool = true;
    return;
  }
  // From here to the parent's or the child's handler this thread holds
  // every lock of a rank at once (core/lock_rank.hpp).
  lock_rank::entering_fork();
  fork_wait::begin();
  try {
    each_part([](const PartHandlers& p) {
      if (p.fork.prepare && !fork_wait::gave_up()) p.fork.prepare();
    });
  } catch (...) {
    fork_wait::give_up();
  }
  if (fork_wait::end()) {  // gave up: everything it took let go
    lock_rank::leaving_fork();
    t_fork_without_gpupool = true;
  }
}

void fork_parent() {
  if (std::exchange(t_fork_without_gpupool, false)) {
    if (t_in_fork_now) t_forked_without = true;
    else g_forks_without.fetch_add(1, std::memory_order_relaxed);
    return;
  }
  each_part(
      [](const PartHandlers& p) {
        if (p.fork.parent) p.fork.parent();
      },
      /*reverse=*/true);
  lock_rank::leaving_fork();
}

void fork_child() {
  fork_wait::forget_holders_in_child();
  t_in_fork_now = t_forked_without = false;
  if (std::exchange(t_fork_without_gpupool, false)) {
    g_inert.store(true, std::memory_order_relaxed);
    g_exiting.store(true, std::memory_order_relaxed);  // runtime() is nullptr from now on
    g_runtime.store(nullptr, std::memory_order_relaxed);
    return;
  }
  each_part(
      [](const PartHandlers& p) {
        if (p.fork.child) p.fork.child();
      },
      /*reverse=*/true);
  lock_rank::leaving_fork();
  each_part([](const PartHandlers& p) {
    try {
      if (p.fork.renew) p.fork.renew();
    } catch (...) {
      internal_failure("fork() (the child's start)");
    }
  });
  g_renew_control.store(true, std::memory_order_release);
}

// The fork() after gpupool's in the symbol order (libc's, or another
// preloaded library's), found as the library loads: never looked up inside
// fork, which a signal handler may call.
using ForkFn = pid_t (*)();
ForkFn g_next_fork = nullptr;
[[gnu::constructor]] void find_next_fork() {
  g_next_fork = reinterpret_cast<ForkFn>(dlsym(RTLD_NEXT, "fork"));
}

pid_t fork_now() noexcept {
  ForkFn next = g_next_fork;
  if (!next) {
    errno = ENOSYS;
    return -1;
  }
  // A thread inside gpupool that forks (from a signal handler: nothing
  // inside forks) may hold any of gpupool's locks, and does not let go
  // before its handler returns. It says so first: another thread's
  // prepare waiting for one of its locks gives up (core/fork_wait.hpp).
  const bool holder = inside_hook();
  if (holder) fork_wait::holder_forking_begin();
  t_in_fork_now = true;
  const pid_t pid = next();
  if (pid != 0) {  // the child forgot the counts (fork_child) and has no flags
    t_in_fork_now = false;
    if (std::exchange(t_forked_without, false) && pid > 0)
      g_forks_without.fetch_add(1, std::memory_order_relaxed);
    if (holder) fork_wait::holder_forking_end();
  }
  return pid;
}

// The _exit() after gpupool's in the symbol order (libc's, or another
// preloaded library's), found when the runtime starts: never looked up
// inside _exit, which a signal handler or a forked child may call.
using ExitFn = void (*)(int);
std::atomic<ExitFn> g_next_exit{nullptr};

[[noreturn]] void quick_exit_now(int status) noexcept {
  each_part(
      [](const PartHandlers& p) {
        if (p.quick_exit) p.quick_exit();
      },
      /*reverse=*/true);
  if (ExitFn next = g_next_exit.load(std::memory_order_relaxed)) next(status);
  for (;;) syscall(SYS_exit_group, status);  // what glibc's _exit does
}

PoolOptions pool_options(const config::Config& c) {
  PoolOptions o;
  o.leading_bits = c.leading_bits;
  o.borrow_larger = c.borrow;
  o.hold = c.hold;
  o.release_after_ns = c.release_after_ns;
  return o;
}

Runtime* create() {
  const config::Config& cfg = config::get_unlogged();
  if (cfg.disable) {
    (void)config::get();  // its diagnostics logged
    return nullptr;
  }
  // From here on, gpupool's descriptors are created in a table of their own,
  // the log file's included: the logger is built (config::get) after this,
  // or its file, opened before by a line logged first, is moved there.
  // Where no table can be made it is said here, in the program's call: the
  // first file work may come from inside the logger, which must not log.
  io::enable_private_files();
  log_file_to_private_table();
  (void)config::get();
  if (const int e = io::start_private_files())
    log().debug(
        "no private descriptor table for gpupool's files (unshare: {}); they are "
        "opened among the program's and moved above 2",
        strerror(e));
  // The time zone, read once by the first local time: here, inside the
  // program's own call, not later on one of gpupool's threads.
  tzset();
  // Never destroyed: hooks may still run from other threads or atexit
  // handlers while the process exits.
  auto* rt = new Runtime{cfg, Pool(pool_options(cfg))};
  each_part([rt](const PartHandlers& p) {
    if (p.make) p.make(*rt);
  });
  // The one shutdown flag: from now on no call into drivers that may be
  // torn down, and the control thread stops; then the parts' exits (the
  // exit dump).
  std::atexit([] {
    if (g_inert.load(std::memory_order_relaxed)) return;
    g_exiting.store(true, std::memory_order_release);
    each_part(
        [](const PartHandlers& p) {
          if (p.exit) p.exit();
        },
        /*reverse=*/true);
  });
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  g_next_exit.store(reinterpret_cast<ExitFn>(dlsym(RTLD_NEXT, "_exit")), std::memory_order_relaxed);
  log().debug("runtime started: leading_bits={} hold={}", cfg.leading_bits, cfg.hold);
  return rt;
}

}  // namespace

// The runtime's own parts: the pool's, the logger's and the files
// thread's locks, taken for fork() (created with the runtime: nothing to
// do before it exists).
constinit const PartHandlers kPoolPart{
    .fork = {pool_fork_prepare, pool_fork_parent, pool_fork_child, nullptr}};
constinit const PartHandlers kLogPart{
    .fork = {log_fork_prepare, log_fork_release, log_fork_release, nullptr}};
constinit const PartHandlers kFilesPart{
    .fork = {io::private_fork_prepare, io::private_fork_parent, io::private_fork_child, nullptr}};

void housekeeping(Runtime& rt) {
  each_part([&rt](const PartHandlers& p) {
    if (p.housekeeping && !exiting()) p.housekeeping(rt);
  });
}

Runtime* detail::runtime_slow() {
  Runtime* rt = g_runtime.load(std::memory_order_acquire);
  if (rt) {
    if (g_renew_control.load(std::memory_order_relaxed) &&
        g_renew_control.exchange(false, std::memory_order_acq_rel))
      each_part([rt](const PartHandlers& p) {
        if (p.restart) p.restart(*rt);
      });
    return rt;
  }
  if (g_exiting.load(std::memory_order_relaxed)) return nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    Runtime* created = create();
    // Published before the control starts: its fork handlers use it.
    g_runtime.store(created, std::memory_order_release);
    if (created)
      each_part([created](const PartHandlers& p) {
        if (p.start) p.start(*created);
      });
  });
  return g_runtime.load(std::memory_order_acquire);
}

bool exiting() { return g_exiting.load(std::memory_order_acquire); }

namespace {
std::atomic<std::uint64_t> g_internal_failures{0};
}  // namespace

void internal_failure(const char* where) noexcept {
  if (g_internal_failures.fetch_add(1, std::memory_order_relaxed) != 0) return;
  try {
    log().error(
        "{}: gpupool failed inside (out of host memory?); the call went to the driver "
        "alone (said once; later failures are counted in the stats warnings)",
        where);
  } catch (...) {
  }
}

std::uint64_t internal_failures() noexcept {
  return g_internal_failures.load(std::memory_order_relaxed);
}

std::uint64_t forks_without_gpupool() noexcept {
  return g_forks_without.load(std::memory_order_relaxed);
}

}  // namespace gpupool

// A process that ends without its exit handlers (os._exit, multiprocessing's
// children, a C program's _exit) still leaves whole files
// (the parts' quick_exit: control's writes the trace's last records).
// (_exit as unistd.h declares it, without noexcept: clang refuses a
// redeclaration that adds one; _Exit is declared noexcept, __THROW.)
GPUPOOL_EXPORT void _exit(int status) { gpupool::quick_exit_now(status); }
GPUPOOL_EXPORT void _Exit(int status) noexcept { gpupool::quick_exit_now(status); }
GPUPOOL_EXPORT pid_t fork() noexcept { return gpupool::fork_now(); }
