// Allocation benchmarks on a real GPU, driver API only. scripts/gpu/harness.sh
// runs the same binary twice: without the shim (--label raw) and under
// LD_PRELOAD=libgpupool.so (--label gpupool), and compares.
//
// One JSON object per line on stdout:
//   {"bench":"device_pair","label":"raw","size":1024,"threads":1,"ns":123.4,...}
// benches:
//   device_pair   cuMemAlloc + cuMemFree, warm (one pair done first)
//   pinned_pair   cuMemHostAlloc(flags 0) + cuMemFreeHost, warm
//   device_split  the same pair, alloc and free timed separately ("alloc_ns",
//                 "free_ns"), for choosing GPUPOOL_MAX_POOLED
//   async_pair    cuMemAllocAsync + cuMemFreeAsync on one stream, the
//                 device's default memory pool with its release threshold
//                 raised to the maximum (so it keeps its memory: the best case
//                 for it); policy "batch": one cuStreamSynchronize per timed
//                 batch of pairs; policy "each": one after every pair
//   memset        cuMemsetD8 of the whole size + cuCtxSynchronize: the cost of
//                 touching the memory once, to put the pair cost in proportion
// Sizes: 256 B to 256 MiB by powers of 4 (all benches), then 1, 4 and 16 GiB
// (device pair, split and memset only) for choosing GPUPOOL_MAX_POOLED.
//   device_pair with "threads" N: N threads each doing pairs on the shared
//                 context; "ns" is wall time per pair per thread and
//                 "pairs_per_s" the aggregate rate
//   scaling       (--scaling ROUNDS, alone) per round, one thread's batch and
//                 N threads' batch back to back: warm pairs at 64 KiB and
//                 4 MiB, and workloads sharing nothing ("host", "ctx"); "scaling"
//                 is N x one thread's time over N threads' (bench_scaling)
// "ns" is the median over repeats of (batch time / pairs in batch).
//
// Plain timing loops rather than Google Benchmark, which the GPU machine may
// not have.

#include <cuda.h>

#include <algorithm>
#include <atomic>
#include <barrier>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <dlfcn.h>

namespace {

using Clock = std::chrono::steady_clock;

double since_ns(Clock::time_point t0) {
  return std::chrono::duration<double, std::nano>(Clock::now() - t0).count();
}

#define REQUIRE(call)                                                                        \
  do {                                                                                       \
    CUresult rc_ = (call);                                                                   \
    if (rc_ != CUDA_SUCCESS) {                                                               \
      std::fprintf(stderr, "bench_alloc: %s -> %d at line %d\n", #call, int(rc_), __LINE__); \
      std::exit(1);                                                                          \
    }                                                                                        \
  } while (0)

std::string g_label = "raw";
double g_budget_ms = 150;     // per measurement, after calibration
double g_warm_ms = 200;       // per measurement, before calibration: at least this,
double g_warm_max_ms = 3000;  // then until steady, at most this
CUcontext g_ctx;
CUdevice g_dev;

struct Result {
  double warm_ms = 0;  // how long the warm-up ran
  double ns = 0;       // median ns per pair
  int reps = 0;
  long iters = 0;  // pairs per timed batch
  double cold_ns = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Under gpupool (its C API, docs/c-api.md): the driver allocations it has
// made so far; -1 without gpupool.
long gpupool_backend_allocs() {
  using StatsJson = std::size_t (*)(char*, std::size_t);
  static const auto stats = reinterpret_cast<StatsJson>(dlsym(RTLD_DEFAULT, "gpupool_stats_json"));
  if (!stats) return -1;
  std::string json(stats(nullptr, 0) + 1, '\0');
  stats(json.data(), json.size());
  const std::string key = "\"backend_allocs\":";
  const std::size_t at = json.find(key);  // the first is the totals'
  return at == std::string::npos ? -1 : std::atol(json.c_str() + at + key.size());
}

// Times batch(k) (which does k pairs): one cold call, a warm-up, then
// calibrates k so a batch takes >= 1 ms, then repeats within the time budget
// (3..25 repeats). Warm means the loop's steady state: under the safe
// default gpupool grows a size only as its waits pay for it, so a size's
// blocks grow for as long as the waits are cheap against an allocation:
// up to 256 blocks, a few hundred ms of pairs on an idle H100. Timed before
// that, the figure is a half-grown pool's (1 MiB at 24 of 64 blocks: 492 ns
// against 232 ns once grown; 256 B at 256 blocks after a fixed 200 ms:
// 391 ns, other sizes of the same run 120-267 ns; 16 MiB at 497 ns when
// the warm-up stopped on timings alone). So the warm-up runs batches of
// about a millisecond for at least g_warm_ms, then under gpupool until it
// made no driver allocation for 100 ms, without it until the best of the
// last 16 batches is no better than 0.97x the best before them; at most
// g_warm_max_ms. A slow calibration batch is also timed twice before k
// stops growing, for the same reason.
Result measure(const std::function<void(long)>& batch) {
  Result r;
  auto t = Clock::now();
  batch(1);
  r.cold_ns = since_ns(t);
  const auto warm = Clock::now();
  std::vector<double> seen;  // ns per pair of each millisecond batch
  long allocs = gpupool_backend_allocs();
  auto allocs_at = Clock::now();
  for (long w = 1;;) {
    t = Clock::now();
    batch(w);
    const double took = since_ns(t);
    if (took < 1e6) {
      w *= 2;
    } else {
      seen.push_back(took / w);
    }
    const double elapsed = since_ns(warm);
    if (elapsed >= g_warm_max_ms * 1e6) break;
    if (elapsed < g_warm_ms * 1e6 || seen.size() < 32) continue;
    if (allocs >= 0) {
      if (since_ns(allocs_at) < 1e8) continue;
      const long now = gpupool_backend_allocs();
      if (now == allocs) break;
      allocs = now;
      allocs_at = Clock::now();
      continue;
    }
    const auto split = seen.end() - 16;
    if (*std::min_element(split, seen.end()) >= 0.97 * *std::min_element(seen.begin(), split))
      break;
  }
  r.warm_ms = since_ns(warm) / 1e6;
  long k = 1;
  double one = 0;
  for (;;) {
    t = Clock::now();
    batch(k);
    one = since_ns(t);
    if (k >= (1L << 22)) break;
    if (one >= 1e6) {
      t = Clock::now();
      batch(k);
      one = since_ns(t);
      if (one >= 1e6) break;
    }
    k = one < 1e4 ? k * 16 : k * 2;
  }
  std::vector<double> per;
  per.push_back(one / k);
  auto start = Clock::now();
  while (per.size() < 25 && (per.size() < 3 || since_ns(start) < g_budget_ms * 1e6)) {
    t = Clock::now();
    batch(k);
    per.push_back(since_ns(t) / k);
  }
  r.ns = median(per);
  r.reps = int(per.size());
  r.iters = k;
  return r;
}

// Timed results are kept until every pass ran, and the best of the passes
// is printed: on the shared GPU machine one measurement now and then took
// 2-3x its neighbours' time (16 MiB at 497 ns between 213 and 252 ns), and
// passes apart in time do not meet the same disturbance. Raw, gpupool and
// cuMemAllocAsync are treated alike.
struct Kept {
  std::string bench, extra;
  std::size_t size;
  Result r;
  int passes;
};
std::vector<Kept> g_kept;

void emit(const char* bench, std::size_t size, const Result& r, const std::string& extra = "") {
  for (Kept& k : g_kept)
    if (k.bench == bench && k.size == size && k.extra == extra) {
      if (r.ns < k.r.ns) k.r = r;
      ++k.passes;
      return;
    }
  g_kept.push_back({bench, extra, size, r, 1});
}

void print_kept() {
  for (const Kept& k : g_kept)
    std::printf(
        "{\"bench\":\"%s\",\"label\":\"%s\",\"size\":%zu,\"threads\":1,\"ns\":%.1f,"
        "\"cold_ns\":%.1f,\"warm_ms\":%.0f,\"reps\":%d,\"iters\":%ld,\"passes\":%d%s}\n",
        k.bench.c_str(), g_label.c_str(), k.size, k.r.ns, k.r.cold_ns, k.r.warm_ms, k.r.reps,
        k.r.iters, k.passes, k.extra.c_str());
  std::fflush(stdout);
  g_kept.clear();
}

void bench_device_pair(std::size_t size) {
  Result r = measure([&](long k) {
    for (long i = 0; i < k; ++i) {
      CUdeviceptr p = 0;
      REQUIRE(cuMemAlloc(&p, size));
      REQUIRE(cuMemFree(p));
    }
  });
  emit("device_pair", size, r);
}

void bench_pinned_pair(std::size_t size) {
  Result r = measure([&](long k) {
    for (long i = 0; i < k; ++i) {
      void* p = nullptr;
      REQUIRE(cuMemHostAlloc(&p, size, 0));
      REQUIRE(cuMemFreeHost(p));
    }
  });
  emit("pinned_pair", size, r);
}

void bench_device_split(std::size_t size) {
  // Per-call timestamps cost ~20-40 ns, negligible against the driver's calls
  // (this is for the raw costs), not against a pool hit.
  std::vector<double> a, f;
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, size));
  REQUIRE(cuMemFree(p));
  auto start = Clock::now();
  while (a.size() < 2000 && (a.size() < 5 || since_ns(start) < g_budget_ms * 1e6)) {
    auto t0 = Clock::now();
    REQUIRE(cuMemAlloc(&p, size));
    auto t1 = Clock::now();
    REQUIRE(cuMemFree(p));
    auto t2 = Clock::now();
    a.push_back(std::chrono::duration<double, std::nano>(t1 - t0).count());
    f.push_back(std::chrono::duration<double, std::nano>(t2 - t1).count());
  }
  std::printf(
      "{\"bench\":\"device_split\",\"label\":\"%s\",\"size\":%zu,\"threads\":1,"
      "\"alloc_ns\":%.1f,\"free_ns\":%.1f,\"reps\":%zu}\n",
      g_label.c_str(), size, median(a), median(f), a.size());
  std::fflush(stdout);
}

void bench_async(std::size_t size, bool sync_each) {
  CUstream s = nullptr;
  REQUIRE(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  Result r = measure([&](long k) {
    for (long i = 0; i < k; ++i) {
      CUdeviceptr p = 0;
      REQUIRE(cuMemAllocAsync(&p, size, s));
      REQUIRE(cuMemFreeAsync(p, s));
      if (sync_each) REQUIRE(cuStreamSynchronize(s));
    }
    if (!sync_each) REQUIRE(cuStreamSynchronize(s));
  });
  emit("async_pair", size, r, sync_each ? ",\"policy\":\"each\"" : ",\"policy\":\"batch\"");
  REQUIRE(cuStreamDestroy(s));
}

void bench_memset(std::size_t size) {
  CUdeviceptr p = 0;
  REQUIRE(cuMemAlloc(&p, size));
  Result r = measure([&](long k) {
    for (long i = 0; i < k; ++i) REQUIRE(cuMemsetD8Async(p, 0x5a, size, nullptr));
    REQUIRE(cuCtxSynchronize());
  });
  emit("memset", size, r);
  REQUIRE(cuMemFree(p));
}

// N threads doing warm device pairs at once.
void bench_threads(std::size_t size, int n) {
  // Calibrate pairs per thread from one thread so a batch takes ~5 ms there.
  long k = 1;
  for (;;) {
    auto t = Clock::now();
    for (long i = 0; i < k; ++i) {
      CUdeviceptr p = 0;
      REQUIRE(cuMemAlloc(&p, size));
      REQUIRE(cuMemFree(p));
    }
    if (since_ns(t) >= 5e6 || k >= (1L << 22)) break;
    k *= 2;
  }
  const int reps = 5;
  std::vector<double> walls;
  std::barrier sync(n + 1);
  std::atomic<bool> failed{false};
  std::vector<std::thread> ts;
  for (int id = 0; id < n; ++id) {
    ts.emplace_back([&] {
      if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) failed = true;
      CUdeviceptr w = 0;  // warm this thread's shard
      if (cuMemAlloc(&w, size) || cuMemFree(w)) failed = true;
      for (int r = 0; r < reps; ++r) {
        sync.arrive_and_wait();  // start
        for (long i = 0; i < k && !failed; ++i) {
          CUdeviceptr p = 0;
          if (cuMemAlloc(&p, size) || cuMemFree(p)) failed = true;
        }
        sync.arrive_and_wait();  // done
      }
    });
  }
  for (int r = 0; r < reps; ++r) {
    sync.arrive_and_wait();
    auto t = Clock::now();
    sync.arrive_and_wait();
    walls.push_back(since_ns(t));
  }
  for (auto& t : ts) t.join();
  if (failed) {
    std::fprintf(stderr, "bench_alloc: threads=%d size=%zu: a call failed\n", n, size);
    return;
  }
  double wall = median(walls);
  std::printf(
      "{\"bench\":\"device_pair\",\"label\":\"%s\",\"size\":%zu,\"threads\":%d,\"ns\":%.1f,"
      "\"pairs_per_s\":%.0f,\"reps\":%d,\"iters\":%ld}\n",
      g_label.c_str(), size, n, wall / k, double(k) * n / (wall / 1e9), reps, k);
  std::fflush(stdout);
}

// Thread scaling measured so that the host's own noise cancels: in each
// round one thread's batch and N threads' batch run back to back (order
// alternating), and the round's scaling is their rates' ratio. Beside the
// warm pairs, the same workers run workloads that share nothing ("host":
// arithmetic on a thread-local table; "ctx": the same and cuCtxGetCurrent,
// the driver call the shim makes on every allocation): how far this host
// lets N threads scale at all (hyperthreads, other tenants), in the same
// rounds.
// Rates between separate runs on these hosts differ by up to 2-3x at 16
// threads, so a ratio of two separately taken medians says little.
class Workers {
 public:
  explicit Workers(int n) {
    for (int id = 0; id < n; ++id) ts_.emplace_back([this, id] { loop(id); });
  }
  ~Workers() {
    stop_ = true;
    gen_.fetch_add(1);
    gen_.notify_all();
    for (auto& t : ts_) t.join();
  }
  // Runs work(id, k) on threads 0..active-1 at once; wall ns until all are done.
  double run(int active, std::function<void(int, long)> work, long k) {
    work_ = std::move(work);
    k_ = k;
    active_ = active;
    left_.store(int(ts_.size()));
    auto t = Clock::now();
    gen_.fetch_add(1);
    gen_.notify_all();
    for (int l = left_.load(); l != 0; l = left_.load()) left_.wait(l);
    return since_ns(t);
  }
  bool failed() const { return failed_; }
  void fail() { failed_ = true; }

 private:
  void loop(int id) {
    if (cuCtxSetCurrent(g_ctx) != CUDA_SUCCESS) failed_ = true;
    unsigned seen = 0;
    for (;;) {
      gen_.wait(seen);
      seen = gen_.load();
      if (stop_) return;
      if (id < active_) work_(id, k_);
      if (left_.fetch_sub(1) == 1) left_.notify_all();
    }
  }
  std::vector<std::thread> ts_;
  std::function<void(int, long)> work_;
  long k_ = 0;
  int active_ = 0;
  std::atomic<unsigned> gen_{0};
  std::atomic<int> left_{0};
  std::atomic<bool> stop_{false}, failed_{false};
};

// False when a driver call failed (nothing measured after it is printed).
bool bench_scaling(int threads, int rounds) {
  Workers w(threads);
  struct Load {
    const char* name;
    std::size_t size;  // 0: host or ctx (no allocation)
    long k = 1;
  };
  // host: arithmetic on a thread-local table; ctx: the same with
  // cuCtxGetCurrent (the one driver call of the shim's hit path).
  std::vector<Load> loads = {
      {"pair", std::size_t(64) << 10}, {"pair", std::size_t(4) << 20}, {"host", 0}, {"ctx", 0}};
  auto work_of = [&](const Load& l) -> std::function<void(int, long)> {
    if (l.size == 0) {
      const bool ctx = l.name[0] == 'c';
      return [&w, ctx](int, long k) {
        std::uint64_t table[64] = {}, x = 88172645463325252ull;
        for (long i = 0; i < k; ++i) {
          CUcontext c = nullptr;
          if (ctx && cuCtxGetCurrent(&c) != CUDA_SUCCESS) w.fail();
          for (int j = 0; j < 8; ++j) {
            x ^= x << 13, x ^= x >> 7, x ^= x << 17;
            table[x & 63] += x;
          }
        }
        if (table[0] == 1) w.fail();  // keeps the table
      };
    }
    const std::size_t size = l.size;
    return [&w, size](int, long k) {
      for (long i = 0; i < k; ++i) {
        CUdeviceptr p = 0;
        if (cuMemAlloc(&p, size) || cuMemFree(p)) w.fail();
      }
    };
  };
  // Calibrate: one thread's batch ~10 ms. Then warm every thread for ~300 ms
  // of batches (the safe default grows its bins while its waits pay for it).
  for (Load& l : loads) {
    while (!w.failed() && l.k < (1L << 24) && w.run(1, work_of(l), l.k) < 1e7) l.k *= 2;
    for (auto t = Clock::now(); !w.failed() && since_ns(t) < 3e8;)
      w.run(threads, work_of(l), l.k / 4 + 1);
  }
  for (int r = 0; r < rounds && !w.failed(); ++r) {
    for (const Load& l : loads) {
      double one = 0, many = 0;
      if (r % 2 == 0) {
        one = w.run(1, work_of(l), l.k);
        many = w.run(threads, work_of(l), l.k);
      } else {
        many = w.run(threads, work_of(l), l.k);
        one = w.run(1, work_of(l), l.k);
      }
      if (w.failed()) break;
      std::printf(
          "{\"bench\":\"scaling\",\"label\":\"%s\",\"workload\":\"%s\",\"size\":%zu,"
          "\"threads\":%d,\"round\":%d,\"one_ns\":%.1f,\"many_ns\":%.1f,\"scaling\":%.3f}\n",
          g_label.c_str(), l.name, l.size, threads, r, one / l.k, many / l.k, threads * one / many);
    }
    std::fflush(stdout);
  }
  if (w.failed()) std::fprintf(stderr, "bench_alloc: scaling: a call failed\n");
  return !w.failed();
}

}  // namespace

int main(int argc, char** argv) {
  bool async = false, quick = false, threads_only = false;
  int scaling_rounds = 0, scaling_threads = 16;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--label") && i + 1 < argc) g_label = argv[++i];
    else if (!std::strcmp(argv[i], "--async")) async = true;  // also time cuMemAllocAsync
    else if (!std::strcmp(argv[i], "--threads-only")) threads_only = true;  // only bench_threads
    else if (!std::strcmp(argv[i], "--quick")) quick = true;                // smaller budget
    else if (!std::strcmp(argv[i], "--scaling") && i + 1 < argc)
      scaling_rounds = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--threads") && i + 1 < argc)
      scaling_threads = std::atoi(argv[++i]);
    else {
      std::fprintf(stderr,
                   "usage: %s [--label NAME] [--async] [--quick] [--threads-only] "
                   "[--scaling ROUNDS [--threads N]]\n",
                   argv[0]);
      return 2;
    }
  }
  if (scaling_threads < 1) {
    std::fprintf(stderr, "bench_alloc: --threads needs at least 1\n");
    return 2;
  }
  if (quick) g_budget_ms = 40, g_warm_ms = 50, g_warm_max_ms = 200;
  REQUIRE(cuInit(0));
  REQUIRE(cuDeviceGet(&g_dev, 0));
  REQUIRE(cuDevicePrimaryCtxRetain(&g_ctx, g_dev));
  REQUIRE(cuCtxSetCurrent(g_ctx));
  if (async) {
    CUmemoryPool pool = nullptr;
    REQUIRE(cuDeviceGetDefaultMemPool(&pool, g_dev));
    cuuint64_t keep = UINT64_MAX;
    REQUIRE(cuMemPoolSetAttribute(pool, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &keep));
  }

  if (scaling_rounds > 0) return bench_scaling(scaling_threads, scaling_rounds) ? 0 : 1;

  std::vector<std::size_t> sizes;
  for (std::size_t s = 256; s <= (std::size_t(256) << 20); s *= 4) sizes.push_back(s);
  if (threads_only) sizes.clear();

  for (int pass = 0; pass < 2; ++pass) {
    for (std::size_t s : sizes) {
      bench_device_pair(s);
      bench_pinned_pair(s);
      if (pass == 0) bench_device_split(s);
      if (async) {
        bench_async(s, false);
        bench_async(s, true);
        if (pass == 0) bench_memset(s);
      }
    }
  }
  print_kept();
  // The largest blocks: what the driver charges for them, against one pass
  // over them (docs/measurements.md, "What it costs": why GPUPOOL_MAX_POOLED
  // is 25%).
  for (std::size_t s : {std::size_t(1) << 30, std::size_t(4) << 30, std::size_t(16) << 30}) {
    if (threads_only) break;
    bench_device_pair(s);
    bench_device_split(s);
    if (async) bench_memset(s);
  }
  print_kept();
  for (std::size_t s : {std::size_t(64) << 10, std::size_t(4) << 20})
    for (int n : {1, 2, 4, 8, 16}) bench_threads(s, n);
  return 0;
}
