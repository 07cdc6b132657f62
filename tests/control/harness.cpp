// The control machinery driven in-process, with real signals, real files and
// the real control thread, over a backend that checks ownership: a block
// handed to two owners, released twice or lost is caught.
//
//   control_harness storm THREADS SECONDS   signal storm while allocating
//   control_harness exit-race ITERATIONS    exit() while dumps and allocs run
//   control_harness chain                   chaining and replaced handlers
//   control_harness symlink PATH            a refused stats file
//   control_harness workload OPS            allocate/free then exit (trace)
//   control_harness serve                   hold memory, wait on stdin (socket)
//   control_harness exec-chain N            exec itself N times amid Prometheus writes
//
// Configuration comes from GPUPOOL_* variables set by the caller. Exit 0 on
// success; failures are printed.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "interpose/control/control.hpp"
#include "interpose/runtime.hpp"

// The harness links the runtime and the control and node rooms, not the CUDA
// and OpenCL rooms: their parts of the runtime's table do nothing here.
namespace gpupool {
namespace cuda {
constinit const PartHandlers kPart{};
}
namespace ocl {
constinit const PartHandlers kPart{};
}
}  // namespace gpupool

extern "C" {
std::size_t gpupool_stats_json(char* buf, std::size_t len);
int gpupool_dump_stats(void);
int gpupool_free_held(void);
}

namespace {

std::atomic<int> g_failures{0};

#define CHECK(cond)                                                          \
  do {                                                                       \
    if (!(cond)) {                                                           \
      std::fprintf(stderr, "FAILED %s:%d: %s\n", __FILE__, __LINE__, #cond); \
      g_failures.fetch_add(1);                                               \
    }                                                                        \
  } while (0)

constexpr std::size_t kMaxIds = 1 << 16;

// Handles are recycled ids; each id has an owner flag the test flips.
class CheckingBackend : public gpupool::Backend {
 public:
  gpupool::BackendResult allocate(std::size_t bytes, std::uint64_t) override {
    std::lock_guard lock(mu_);
    std::size_t id;
    if (!free_.empty()) {
      id = free_.back();
      free_.pop_back();
    } else {
      id = next_++;
      if (id >= kMaxIds) return {gpupool::BackendStatus::out_of_memory, 0, 2};
    }
    live_[id] = true;
    live_bytes_ += bytes;
    return {gpupool::BackendStatus::ok, id + 1, 0};
  }
  void release(gpupool::Handle h, std::size_t bytes, void*) override {
    std::lock_guard lock(mu_);
    const std::size_t id = h - 1;
    if (id >= kMaxIds || !live_[id]) {
      std::fprintf(stderr, "FAILED: release of a handle not live: %zu\n", id);
      g_failures.fetch_add(1);
      return;
    }
    live_[id] = false;
    live_bytes_ -= bytes;
    free_.push_back(id);
  }
  std::uint64_t live_bytes() {
    std::lock_guard lock(mu_);
    return live_bytes_;
  }

 private:
  std::mutex mu_;
  std::vector<bool> live_ = std::vector<bool>(kMaxIds);
  std::vector<std::size_t> free_;
  std::size_t next_ = 0;
  std::uint64_t live_bytes_ = 0;
};

std::atomic<int> g_owner[kMaxIds];
CheckingBackend* g_backend = nullptr;
gpupool::Arena* g_arena = nullptr;

gpupool::Runtime& start_runtime() {
  gpupool::Runtime* rt = gpupool::runtime();
  if (!rt) {
    std::fprintf(stderr, "FAILED: gpupool runtime did not start\n");
    std::exit(1);
  }
  auto backend = std::make_unique<CheckingBackend>();
  g_backend = backend.get();
  gpupool::ArenaOptions o;
  o.name = "checking backend 0";
  o.group = "checking:0";
  o.kind = "checking";
  g_arena = rt->pool.add_arena(std::move(backend), o);
  return *rt;
}

gpupool::Block* take(gpupool::Runtime& rt, std::size_t size) {
  gpupool::AllocResult r = rt.pool.allocate(g_arena, size);
  if (!r.block) {
    std::fprintf(stderr, "FAILED: allocation of %zu failed\n", size);
    g_failures.fetch_add(1);
    return nullptr;
  }
  if (g_owner[r.block->handle - 1].exchange(1) != 0) {
    std::fprintf(stderr, "FAILED: block %zu handed out twice\n", std::size_t(r.block->handle));
    g_failures.fetch_add(1);
  }
  return r.block;
}

void give(gpupool::Runtime& rt, gpupool::Block* b) {
  if (g_owner[b->handle - 1].exchange(0) != 1) {
    std::fprintf(stderr, "FAILED: block %zu freed but not owned\n", std::size_t(b->handle));
    g_failures.fetch_add(1);
  }
  rt.pool.free(b);
}

// Allocates and frees until `stop`, then frees everything it holds.
std::uint64_t churn(gpupool::Runtime& rt, unsigned seed, const std::atomic<bool>& stop,
                    std::uint64_t max_ops = UINT64_MAX) {
  std::mt19937 rng(seed);
  static const std::size_t sizes[] = {256, 1000, 4096, 65536, 100000, 1 << 20};
  std::vector<gpupool::Block*> mine;
  std::uint64_t ops = 0;
  while (!stop.load(std::memory_order_relaxed) && ops < max_ops) {
    if (mine.size() < 16 && (mine.empty() || rng() % 2)) {
      if (auto* b = take(rt, sizes[rng() % 6] - rng() % 7)) mine.push_back(b);
      ++ops;
    } else {
      const std::size_t i = rng() % mine.size();
      give(rt, mine[i]);
      mine[i] = mine.back();
      mine.pop_back();
    }
  }
  for (auto* b : mine) give(rt, b);
  return ops;
}

std::string json_now() {
  std::vector<char> buf(1 << 16);
  std::size_t n = gpupool_stats_json(buf.data(), buf.size());
  if (n >= buf.size()) {
    buf.resize(n + 1);
    gpupool_stats_json(buf.data(), buf.size());
  }
  return buf.data();
}

std::size_t count_lines(const std::string& path) {
  std::ifstream f(path);
  std::size_t n = 0;
  std::string line;
  while (std::getline(f, line)) ++n;
  return n;
}

std::string stats_path() {
  const char* p = getenv("GPUPOOL_STATS_FILE");
  if (!p) return {};
  std::string s(p);
  const auto at = s.find("%p");
  if (at != std::string::npos) s.replace(at, 2, std::to_string(getpid()));
  return s;
}

// Waits (generously) for `cond`; only a hang ends it unsuccessfully.
template <class F>
bool wait_for(F cond, int seconds = 60) {
  for (int i = 0; i < seconds * 100; ++i) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return cond();
}

std::atomic<unsigned> g_program_usr1{0};
void program_handler(int) { g_program_usr1.fetch_add(1); }

int storm(unsigned threads, double seconds) {
  // The program's own handler, installed before gpupool starts: chained.
  signal(SIGUSR1, program_handler);
  gpupool::Runtime& rt = start_runtime();
  const std::string file = stats_path();
  CHECK(!file.empty());

  std::atomic<bool> stop{false};
  std::atomic<std::uint64_t> allocs{0};
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < threads; ++t)
    workers.emplace_back([&, t] { allocs += churn(rt, 1234 + t, stop); });

  // Hundreds of process-directed signals a second: any thread, including
  // one inside an allocation, takes them.
  std::uint64_t sent = 0;
  const auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
  while (std::chrono::steady_clock::now() < end) {
    // Bursts: the allocating threads may keep this one off the CPU a while.
    for (int i = 0; i < 4; ++i, ++sent) kill(getpid(), (sent % 2) ? SIGUSR2 : SIGUSR1);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  stop = true;
  for (auto& w : workers) w.join();
  std::printf(
      "storm: %u threads, %llu allocations, %llu signals (%.0f/s), %u reached the "
      "program's handler\n",
      threads, (unsigned long long)allocs.load(), (unsigned long long)sent,
      static_cast<double>(sent) / seconds, g_program_usr1.load());
  CHECK(g_program_usr1.load() > 0);

  // Consistency once quiet: nothing active, held bytes are exactly what the
  // backend still has. The control thread may still be inside a free_held
  // taken before the workers stopped (the pool's count drops before the
  // backend's), so wait for it to settle; a lasting mismatch still fails.
  gpupool::Stats t = rt.pool.totals();
  CHECK(t.active_blocks == 0);
  CHECK(t.active_bytes == 0);
  CHECK(t.hits + t.misses == allocs.load());
  CHECK(wait_for([&] {
    t = rt.pool.totals();
    const std::uint64_t live = g_backend->live_bytes();
    return t.held_bytes == live && t.managed_bytes == live;
  }));

  // Signals of the storm may still be waiting for the control thread (a
  // free_held among them would empty the pool below): one more dump, whose
  // wake-up takes every request sent before it, releases first.
  const std::size_t drained = count_lines(file);
  kill(getpid(), SIGUSR1);
  CHECK(wait_for([&] { return count_lines(file) > drained; }));

  // After the storm, one more request of each kind still gets through.
  std::vector<gpupool::Block*> keep;
  for (int i = 0; i < 8; ++i) keep.push_back(take(rt, 4096));
  for (auto* b : keep) give(rt, b);
  CHECK(rt.pool.totals().held_blocks > 0);
  kill(getpid(), SIGUSR2);
  CHECK(wait_for([&] { return rt.pool.totals().held_blocks == 0; }));
  const std::size_t before = count_lines(file);
  kill(getpid(), SIGUSR1);
  CHECK(wait_for([&] { return count_lines(file) > before; }));
  t = rt.pool.totals();
  CHECK(t.held_bytes == 0 && g_backend->live_bytes() == 0);
  std::printf("storm: %zu dumps written\n", count_lines(file));
  return g_failures.load() ? 1 : 0;
}

// exit() while allocator threads and a signal storm run, with a dump at exit.
int exit_race_child(unsigned seed) {
  gpupool::Runtime& rt = start_runtime();
  static std::atomic<bool> never{false};
  for (unsigned t = 0; t < 3; ++t)
    std::thread([&rt, seed, t] { churn(rt, seed * 7 + t, never); }).detach();
  std::thread([] {
    for (;;) {
      kill(getpid(), SIGUSR1);
      std::this_thread::sleep_for(std::chrono::microseconds(300));
    }
  }).detach();
  std::this_thread::sleep_for(std::chrono::milliseconds(5 + seed % 40));
  std::exit(0);
}

int exit_race(int iterations) {
  const std::string pattern = getenv("GPUPOOL_STATS_FILE") ? getenv("GPUPOOL_STATS_FILE") : "";
  for (int i = 0; i < iterations; ++i) {
    const pid_t pid = fork();
    if (pid == 0) exit_race_child(static_cast<unsigned>(i));
    int status = 0;
    waitpid(pid, &status, 0);
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      std::fprintf(stderr, "FAILED: iteration %d: child status %#x\n", i, status);
      return 1;
    }
    std::string file = pattern;
    const auto at = file.find("%p");
    if (at != std::string::npos) file.replace(at, 2, std::to_string(pid));
    std::ifstream f(file);
    std::string line, last;
    std::size_t lines = 0;
    while (std::getline(f, line)) {
      ++lines;
      last = line;
      // Every dump is whole: no interleaving or truncation.
      if (line.rfind("{\"version\":", 0) != 0 || line.back() != '}') {
        std::fprintf(stderr, "FAILED: iteration %d: torn dump line: %s\n", i, line.c_str());
        return 1;
      }
    }
    if (last.find("\"reason\":\"exit\"") == std::string::npos) {
      std::fprintf(stderr, "FAILED: iteration %d: last of %zu dumps is not the exit dump\n", i,
                   lines);
      return 1;
    }
    std::remove(file.c_str());
  }
  std::printf("exit-race: %d iterations clean\n", iterations);
  return 0;
}

void other_handler(int) {}

int chain() {
  signal(SIGUSR1, program_handler);
  start_runtime();
  const std::string file = stats_path();
  // raise() delivers to this thread before returning: the program's handler
  // has run by then; the dump follows on the control thread.
  raise(SIGUSR1);
  CHECK(g_program_usr1.load() == 1);
  CHECK(wait_for([&] { return count_lines(file) >= 1; }));
  CHECK(json_now().find("\"signal\":\"SIGUSR1\",\"installed\":true") != std::string::npos);
  // The program now replaces gpupool's handler: the next report says so.
  signal(SIGUSR1, other_handler);
  const std::string j = json_now();
  CHECK(j.find("\"signal\":\"SIGUSR1\",\"installed\":false") != std::string::npos);
  CHECK(j.find("replaced gpupool's SIGUSR1 handler") != std::string::npos);
  return g_failures.load() ? 1 : 0;
}

// A program that swaps gpupool's SIGUSR1 handler out and back in, again and
// again: each swap is worth the same one warning, counted, so a long-lived
// program's dumps (and gpupool's memory) stay the same size.
int handler_swaps(int swaps) {
  start_runtime();
  struct sigaction ours {};
  sigaction(SIGUSR1, nullptr, &ours);
  std::size_t first_size = 0;
  for (int i = 1; i <= swaps; ++i) {
    signal(SIGUSR1, other_handler);
    const std::string j = json_now();  // sees the program's handler
    if (i == 1) first_size = j.size();
    sigaction(SIGUSR1, &ours, nullptr);
    json_now();  // sees gpupool's again
  }
  signal(SIGUSR1, other_handler);
  const std::string j = json_now();
  std::size_t copies = 0;
  for (auto at = j.find("replaced gpupool's SIGUSR1"); at != std::string::npos;
       at = j.find("replaced gpupool's SIGUSR1", at + 1))
    ++copies;
  if (copies != 1)
    std::fprintf(stderr, "FAILED: %zu copies of the warning in: %s\n", copies, j.c_str());
  CHECK(copies == 1);
  const std::string times = "(" + std::to_string(swaps + 1) + " times)";
  if (j.find(times) == std::string::npos)
    std::fprintf(stderr, "FAILED: no %s in: %s\n", times.c_str(), j.c_str());
  CHECK(j.find(times) != std::string::npos);
  // Only the count's digits may have grown.
  CHECK(j.size() <= first_size + 16);
  return g_failures.load() ? 1 : 0;
}

int symlink_refused() {
  start_runtime();
  // The stats file is a planted symlink: the dump must fail and the target
  // stay untouched.
  CHECK(gpupool_dump_stats() == -1);
  return g_failures.load() ? 1 : 0;
}

int workload(std::uint64_t ops) {
  gpupool::Runtime& rt = start_runtime();
  std::atomic<bool> stop{false};
  std::vector<std::thread> workers;
  for (unsigned t = 0; t < 3; ++t) workers.emplace_back([&, t] { churn(rt, 99 + t, stop, ops); });
  for (auto& w : workers) w.join();
  gpupool_free_held();
  // One more allocation after free_held, then exit with it still active.
  take(rt, 12345);
  return g_failures.load() ? 1 : 0;
}

// Periodic work of the control thread: blocks held past
// GPUPOOL_RELEASE_AFTER are released, GPUPOOL_STATS_INTERVAL dumps come.
int periodic() {
  gpupool::Runtime& rt = start_runtime();
  std::vector<gpupool::Block*> keep;
  for (int i = 0; i < 5; ++i) keep.push_back(take(rt, 5000));
  for (auto* b : keep) give(rt, b);
  CHECK(rt.pool.totals().held_blocks == 5);
  // The control thread takes the blocks out of their bins first, then
  // counts and releases them one at a time: the whole end state is waited
  // for (held_blocks reached 0 before trims reached 5 under ASan in CI).
  CHECK(wait_for([&] {
    const gpupool::Stats t = rt.pool.totals();
    return t.held_blocks == 0 && t.trims == 5 && g_backend->live_bytes() == 0;
  }));
  CHECK(rt.pool.totals().trims == 5);
  const std::string file = stats_path();
  const std::size_t now = count_lines(file);
  CHECK(wait_for([&] { return count_lines(file) >= now + 2; }));
  // The Prometheus file as it is while the process runs (it goes at exit).
  if (const char* prom = std::getenv("GPUPOOL_PROMETHEUS_FILE")) {
    std::ifstream f(prom);
    std::printf("prometheus file:\n%s", std::string(std::istreambuf_iterator<char>(f), {}).c_str());
  }
  return g_failures.load() ? 1 : 0;
}

int serve() {
  gpupool::Runtime& rt = start_runtime();
  std::vector<gpupool::Block*> keep;
  for (int i = 0; i < 10; ++i) keep.push_back(take(rt, 10000 * (i + 1)));
  for (int i = 0; i < 7; ++i) give(rt, keep[i]);  // 7 held, 3 active
  std::printf("ready %d\n", static_cast<int>(getpid()));
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  return 0;
}

// Execs itself `left` more times, each image at a random moment while the
// control thread writes the Prometheus file (GPUPOOL_STATS_INTERVAL short):
// an exec amid a write ends the writer between creating its temporary
// file and renaming it.
int exec_chain(int left) {
  gpupool::Runtime& rt = start_runtime();
  give(rt, take(rt, 5000));
  std::mt19937 rng(static_cast<unsigned>(getpid() * 7919 + left));
  std::this_thread::sleep_for(std::chrono::microseconds(1000 + rng() % 5000));
  if (left > 0) {
    const std::string next = std::to_string(left - 1);
    execl("/proc/self/exe", "control_harness", "exec-chain", next.c_str(), nullptr);
    std::fprintf(stderr, "FAILED: exec: %s\n", std::strerror(errno));
    return 1;
  }
  return g_failures.load() ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  if (mode == "storm" && argc == 4) return storm(std::atoi(argv[2]), std::atof(argv[3]));
  if (mode == "exit-race" && argc == 3) return exit_race(std::atoi(argv[2]));
  if (mode == "chain") return chain();
  if (mode == "handler-swaps" && argc == 3) return handler_swaps(std::atoi(argv[2]));
  if (mode == "symlink") return symlink_refused();
  if (mode == "workload" && argc == 3) return workload(std::strtoull(argv[2], nullptr, 10));
  if (mode == "serve") return serve();
  if (mode == "periodic") return periodic();
  if (mode == "exec-chain" && argc == 3) return exec_chain(std::atoi(argv[2]));
  std::fprintf(stderr,
               "usage: control_harness storm THREADS SECONDS | exit-race N | chain | "
               "symlink | workload OPS | serve\n");
  return 2;
}
