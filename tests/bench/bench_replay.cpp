// Replays a recorded workload through the pool core with a simulated
// backend: pool policy (bins, holding, caps, idle release, splitting)
// judged on real programs' allocations, on any machine, without a GPU.
//
//   bench_replay TRACE... [GPUPOOL_NAME=VALUE...] [--rounds N] [--leading-bits B]
//                [--max-pooled BYTES] [--device-memory BYTES] [--release-after NS]
//                [--max-held BYTES|Fx] [--borrow] [--split BYTES] [--sync-gap NS]
//                [--pending-growth BYTES] [--granule BYTES] [--alloc-cost NS]
//                [--wait-cost NS] [--map-cost NS] [--device-lag NS [--poll]] [--json]
//
// With no option it replays what a user gets: the library's defaults, read
// from config/'s one options table (config::Config), on a device of
// --device-memory bytes (80 GiB). GPUPOOL_NAME=VALUE arguments set options
// as the environment would, through the same parser and checks; the
// --flags are shorthands for some of them (--split 1M is GPUPOOL_SPLIT=1MiB).
//
// TRACE: a GPUPOOL_TRACE_FILE (docs/trace.md) or an RMM memory event log
// (CSV, "Thread,Time,Action,Pointer,Size,Stream"; RMM's
// logging_resource_adaptor / RMM_LOG_FILE), told apart by the first line.
// Events are replayed in time order (frees first at equal times), one
// thread. For each trace it prints: time per pool operation (median of the
// rounds), hit rate, peak active bytes (what the program asked for), peak
// managed bytes (what the simulated driver gave: allocations and mapped
// granules), their ratio, and driver calls; for a gpupool trace also the
// hits and misses the program saw.
// Also the binned floor: the least peak managed of any pool that serves a
// request only with a block of its own bin and keeps the blocks it
// allocated (each bin needs as many blocks as it ever had active at once);
// a pool can go under it only by releasing held blocks (--max-held: a cap
// on held bytes, in bytes or as a multiple F of the trace's peak active,
// which costs driver calls) or by splitting blocks (GPUPOOL_SPLIT, and
// GPUPOOL_SEGMENTS=expandable: pieces of one reserved range per arena
// mapped in granules of --granule bytes, 2 MiB by default, each granule
// mapped costing --map-cost, 14 us: cuMemCreate and cuMemMap a granule,
// cuMemSetAccess a growth of 14 granules, as measured on the H200 by
// tests/gpu/vmm_probe.c).
// Safe reuse (GPUPOOL_REUSE=safe, the default; fenced too) is replayed on
// CUDA arenas: a freed block waits for the program's next context
// synchronization, taken to be each pause of --sync-gap NS or more between
// events, or for the pool's own wait. Without --sync-gap the program never
// synchronizes the context (PyTorch synchronizes streams only), so only the
// pool's waits make blocks ready. OpenCL arenas reuse at once under safe
// reuse (one in-order queue, as the library does). What the growth rule
// weighs is --alloc-cost per driver allocation (40 us) against --wait-cost
// per wait of the pool's (1 us: an idle H100's).
// --device-lag NS: the device runs NS behind the program (a training loop
// queues work ahead of it), so a wait also stalls the program until the
// device reaches what it waits for: a fence freed at t is reached at
// t + NS, on the replay's cost clock, which the stall then delays. A
// wait for one fence (an expandable range's piece: the shim waits for a
// mark) makes ready what the device reached by its end, a whole wait
// everything; as in the shim, nothing becomes ready without a wait. The
// report adds the time the pool's waits stalled the program. A crude
// device (its lag the same after a wait drained it), for comparing
// policies' waits, not for predicting a step time. With --poll as well,
// the pool knows at each look what the device has reached, as a query of
// the shim's marks would tell it (the shim does not query; this shows
// what it would gain).
// A malformed trace gets one error naming the file and line, exit 1; a bad
// option, exit 2.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "config/config.hpp"
#include "core/pool.hpp"
#include "observe/trace_reader.hpp"

using namespace gpupool;

namespace {

struct Event {
  std::uint64_t t_ns = 0;
  std::uint64_t slot = 0;       // the allocation this event is about (index into slots)
  std::uint32_t arena = 0;      // index into Trace::arenas
  std::uint64_t requested = 0;  // allocations only
  bool alloc = false;
};

struct Trace {
  std::string path, format;
  std::vector<std::string> arenas;  // group per arena
  std::vector<std::string> kinds;   // kind per arena (cuda, opencl, ...)
  std::vector<Event> events;
  std::uint64_t slots = 0;
  std::uint64_t recorded_hits = 0, recorded_misses = 0;  // gpupool traces: what the program saw
  // gpupool traces: the sizes of the blocks the program's misses allocated,
  // summed: its peak managed bytes when nothing was released (a trace does
  // not record releases), else an upper bound.
  std::uint64_t recorded_managed = 0;
  std::uint64_t unfreed = 0;      // allocations never freed
  std::uint64_t peak_active = 0;  // requested bytes at once, at most
};

[[noreturn]] void fail(const std::string& path, std::size_t line, const std::string& what) {
  std::fprintf(stderr, "bench_replay: %s:%zu: %s\n", path.c_str(), line, what.c_str());
  std::exit(1);
}

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  std::size_t start = 0;
  for (;;) {
    const std::size_t at = s.find(sep, start);
    out.push_back(
        s.substr(start, at == std::string_view::npos ? std::string_view::npos : at - start));
    if (at == std::string_view::npos) return out;
    start = at + 1;
  }
}

bool number(std::string_view s, std::uint64_t* out, int base = 10) {
  if (s.empty() || s.size() > 24) return false;
  std::string t(s);
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(t.c_str(), &end, base);
  if (errno || end != t.c_str() + t.size() || t[0] == '-' || t[0] == '+' || t[0] == ' ')
    return false;
  *out = v;
  return true;
}

// RMM's time: "HH:MM:SS.micro" (or "HH:MM:SS:micro", older RMM), or seconds
// with a fraction.
bool rmm_time(std::string_view s, std::uint64_t* ns) {
  const std::vector<std::string_view> hms = split(s, ':');
  auto seconds = [](std::string_view v, std::uint64_t* out) {
    const std::size_t dot = v.find('.');
    std::uint64_t whole = 0, frac = 0;
    if (!number(v.substr(0, dot), &whole)) return false;
    if (dot != std::string_view::npos) {
      std::string_view f = v.substr(dot + 1);
      if (f.empty() || f.size() > 9 || !number(f, &frac)) return false;
      for (std::size_t k = f.size(); k < 9; ++k) frac *= 10;
    }
    *out = whole * 1'000'000'000ull + frac;
    return true;
  };
  if (hms.size() == 1) return seconds(s, ns);
  std::uint64_t h = 0, m = 0, sec = 0, micro = 0;
  if (hms.size() == 3 && number(hms[0], &h) && number(hms[1], &m) && seconds(hms[2], &sec)) {
    *ns = (h * 3600 + m * 60) * 1'000'000'000ull + sec;
    return true;
  }
  if (hms.size() == 4 && number(hms[0], &h) && number(hms[1], &m) && number(hms[2], &sec) &&
      number(hms[3], &micro)) {
    *ns = ((h * 3600 + m * 60 + sec) * 1'000'000ull + micro) * 1000;
    return true;
  }
  return false;
}

// A paired trace::TraceFile (observe/trace_reader.cpp, which also
// pairs the RMM log's records) as the replay's events.
Trace to_replay(const trace::TraceFile& f, const char* format) {
  Trace tr;
  tr.path = f.path;
  tr.format = format;
  for (const trace::ArenaDecl& a : f.arenas) {
    tr.arenas.push_back(a.group);
    tr.kinds.push_back(a.kind);
  }
  tr.slots = f.slots;
  tr.unfreed = f.unfreed;
  for (const trace::Record& r : f.records) {
    Event e;
    e.t_ns = r.t_ns;
    e.slot = r.slot;
    e.arena = r.arena;
    e.requested = r.requested;
    e.alloc = r.alloc;
    tr.events.push_back(e);
    if (r.alloc) (r.hit ? tr.recorded_hits : tr.recorded_misses)++;
    if (r.alloc && !r.hit) tr.recorded_managed += r.size;
  }
  std::vector<std::uint64_t> asked(tr.slots, 0);
  std::uint64_t active = 0;
  for (const Event& e : tr.events) {
    if (e.alloc) {
      asked[e.slot] = e.requested;
      active += e.requested;
      tr.peak_active = std::max(tr.peak_active, active);
    } else {
      active -= asked[e.slot];
    }
  }
  return tr;
}

// The gpupool format: its one reader.
Trace read_gpupool(const std::string& path) {
  trace::TraceFile f;
  std::string error;
  if (!trace::read_trace(path, &f, &error)) {
    std::fprintf(stderr, "bench_replay: %s\n", error.c_str());
    std::exit(1);
  }
  return to_replay(f, "gpupool");
}

Trace read_rmm(const std::string& path, std::ifstream& in) {
  trace::TraceFile f;
  f.path = path;
  f.arenas.push_back({0, "rmm", "rmm", "rmm"});
  std::string line;
  std::size_t n = 1;
  while (std::getline(in, line)) {
    ++n;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.empty()) continue;
    const std::vector<std::string_view> fs = split(line, ',');
    if (fs.size() != 6) fail(path, n, "expected 6 fields: Thread,Time,Action,Pointer,Size,Stream");
    trace::Record r;
    r.line = n;
    if (!rmm_time(fs[1], &r.t_ns)) fail(path, n, "Time is not HH:MM:SS.micro nor seconds");
    if (fs[2] == "allocate failure") continue;  // nothing was allocated
    r.alloc = fs[2] == "allocate";
    if (!r.alloc && fs[2] != "free" && fs[2] != "deallocate")
      fail(path, n, "Action is not allocate, allocate failure, free or deallocate");
    std::string_view p = fs[3];
    if (p.substr(0, 2) == "0x" || p.substr(0, 2) == "0X") p.remove_prefix(2);
    if (!number(p, &r.handle, 16)) fail(path, n, "Pointer is not a hexadecimal address");
    if (!number(fs[4], &r.requested)) fail(path, n, "Size is not a byte count");
    r.size = r.requested;
    f.records.push_back(r);
  }
  // One logger writes an RMM log in order: at equal times (it keeps
  // microseconds) its order stands.
  std::string error;
  if (!trace::pair_records(&f, /*lenient=*/false, /*frees_first=*/false, &error)) {
    std::fprintf(stderr, "bench_replay: %s\n", error.c_str());
    std::exit(1);
  }
  return to_replay(f, "rmm");
}

Trace read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail(path, 0, std::string("cannot open: ") + std::strerror(errno));
  std::string first;
  std::getline(in, first);
  if (!first.empty() && first.back() == '\r') first.pop_back();
  if (first == trace::kTraceHeader || first == trace::kTraceHeaderV1) return read_gpupool(path);
  if (first.rfind("Thread,Time,Action,Pointer,Size,Stream", 0) == 0) return read_rmm(path, in);
  fail(path, 1,
       "not a gpupool trace ('# gpupool trace 2' or 1) nor an RMM log "
       "('Thread,Time,Action,Pointer,Size,Stream')");
}

// The driver, simulated: distinct handles, and the bytes it has given out.
// With --sync-gap, safe reuse too: a freed block is pending until the
// program synchronizes, taken to be wherever the trace pauses that long
// (a loop's loss.item(), say), or until the pool waits.
struct SimDriver {
  std::uint64_t next = 1 << 20, bytes = 0, peak = 0, allocs = 0, frees = 0;
  // Ranges: granule bytes (the backend's property), map and unmap calls,
  // the granules they mapped and unmapped, unmaps that waited for the device.
  std::uint64_t granule = 2 << 20, maps = 0, unmaps = 0, mapped = 0, unmapped = 0;
  std::uint64_t unmap_waits = 0, map_cost_ns = 0;
  std::uint64_t issued = 0, completed = 0, waits = 0;
  // --device-lag: the lag, the cost clock at each fence (issued_at[f - 1])
  // and the time waits stalled the program.
  std::uint64_t lag_ns = 0, stalled_ns = 0;
  std::vector<std::uint64_t> issued_at;
  bool poll = false;  // --poll
  // What an allocation and a wait take on the pool's cost clock (the growth
  // rule weighs one against the other).
  std::uint64_t alloc_cost_ns = 0, wait_cost_ns = 0;
};

// The replay's cost clock: trace time plus every simulated cost so far (a
// call's cost delays all the program does after it, so that the gaps
// between the pool's calls are the program's own, as the trace has them).
std::uint64_t g_spent = 0, g_cost_now = 0;
std::uint64_t cost_clock() { return g_cost_now; }
void spend(std::uint64_t ns) {
  g_spent += ns;
  g_cost_now += ns;
}

class SimBackend final : public Backend {
 public:
  SimBackend(SimDriver* d, bool fenced) : d_(d), fenced_(fenced) {}
  BackendResult allocate(std::size_t bytes, std::uint64_t) override {
    ++d_->allocs;
    spend(d_->alloc_cost_ns);
    d_->bytes += bytes;
    d_->peak = std::max(d_->peak, d_->bytes);
    const Handle h = d_->next;
    d_->next += (bytes + 4095) / 4096 * 4096 + 4096;
    return {BackendStatus::ok, h, 0};
  }
  void release(Handle, std::size_t bytes, void*) override {
    ++d_->frees;
    d_->bytes -= bytes;
  }
  std::uint64_t fence() override {
    if (!fenced_) return 0;
    if (d_->lag_ns) d_->issued_at.push_back(g_cost_now);
    return ++d_->issued;
  }
  bool passed(std::uint64_t f) override {
    // --poll: also what the device has reached, though nobody waited.
    if (d_->poll && f != 0 && f <= d_->issued && d_->issued_at[f - 1] + d_->lag_ns <= g_cost_now)
      return true;
    return f <= d_->completed;
  }
  void wait_all() override {
    ++d_->waits;
    stall_until(d_->issued);
    d_->completed = d_->issued;
    spend(d_->wait_cost_ns);
  }
  void wait_for(std::uint64_t f) override {
    if (!d_->lag_ns) return wait_all();
    ++d_->waits;
    stall_until(f);
    // What the device has reached by now.
    while (d_->completed < d_->issued && d_->issued_at[d_->completed] + d_->lag_ns <= g_cost_now)
      ++d_->completed;
    d_->completed = std::max(d_->completed, f);
    spend(d_->wait_cost_ns);
  }
  std::size_t granule() override { return d_->granule; }
  BackendResult reserve(std::size_t bytes) override {
    const Handle h = (d_->next + d_->granule - 1) / d_->granule * d_->granule;
    d_->next = h + bytes + d_->granule;
    return {BackendStatus::ok, h, 0};
  }
  BackendResult map(Handle at, std::size_t bytes, void*) override {
    ++d_->maps;
    d_->mapped += bytes / d_->granule;
    spend(d_->map_cost_ns * (bytes / d_->granule));
    d_->bytes += bytes;
    d_->peak = std::max(d_->peak, d_->bytes);
    return {BackendStatus::ok, at, 0};
  }
  void unmap(Handle, std::size_t bytes, void*, std::uint64_t fence) override {
    if (!passed(fence)) {  // the device may still use it: a wait first
      ++d_->unmap_waits;
      wait_all();
    }
    ++d_->unmaps;
    d_->unmapped += bytes / d_->granule;
    d_->bytes -= bytes;
  }
  void unreserve(Handle, std::size_t bytes, void*, bool) override {
    (void)bytes;  // what is still mapped went with the pool's end: not counted
  }

 private:
  // --device-lag: the program waits until the device reaches fence f.
  void stall_until(std::uint64_t f) {
    if (!d_->lag_ns || f <= d_->completed || f == 0) return;
    const std::uint64_t reached = d_->issued_at[f - 1] + d_->lag_ns;
    if (reached <= g_cost_now) return;
    d_->stalled_ns += reached - g_cost_now;
    spend(reached - g_cost_now);
  }

  SimDriver* d_;
  bool fenced_;
};

struct Options {
  unsigned rounds = 5;
  std::uint64_t device_memory = 80ull << 30;
  // The library's options, its defaults unless set (GPUPOOL_NAME=VALUE or
  // a --flag): sizes given as a % resolve against device_memory.
  config::Config cfg;
  double max_held_of_active = 0;  // > 0: the cap is this times the trace's peak active
  bool json = false;
  std::uint64_t sync_gap_ns =
      0;  // safe reuse: the program synchronizes at gaps this long; 0: never
  // An H100's: a cuMemAlloc ~40 us, a context synchronize on an idle
  // device 0.6-2.7 us (docs/memory.md); with them the default replay
  // manages what the H100 runs did.
  std::uint64_t alloc_cost_ns = 40'000, wait_cost_ns = 1'000;
  std::uint64_t granule = 2 << 20, map_cost_ns = 14'000;
  std::uint64_t device_lag_ns = 0;  // 0: waits cost only wait_cost_ns
  bool poll = false;
};

// The pool's clock in a replay is the trace's own.
std::uint64_t g_trace_now = 0;
std::uint64_t trace_clock() { return g_trace_now; }

// The arenas' options that depend on the command line (replay_once), as
// the shim resolves them for a device of device_memory bytes.
std::uint64_t max_pooled_of(const Options& o) { return o.cfg.max_pooled.resolve(o.device_memory); }
std::uint64_t max_held_of(const Trace& tr, const Options& o) {  // 0: no cap
  if (o.max_held_of_active > 0)
    return static_cast<std::uint64_t>(o.max_held_of_active * double(tr.peak_active));
  const std::size_t cap = o.cfg.max_held.resolve(o.device_memory);
  return cap == SIZE_MAX ? 0 : cap;
}
// Reuse that waits on the host for the device (ordered reuse waits on the
// device, which the replay has at once: an immediate reuse).
bool safe_reuse(const Options& o) {
  return o.cfg.reuse == config::Reuse::safe || o.cfg.reuse == config::Reuse::fenced;
}
// Whether an arena's freed blocks wait for fences (the shim's choice:
// safe reuse on one in-order OpenCL queue reuses at once).
bool fenced(const Trace& tr, std::size_t arena, const Options& o) {
  if (o.cfg.reuse == config::Reuse::fenced) return true;
  return safe_reuse(o) && tr.kinds[arena].rfind("opencl", 0) != 0;
}

// The pool's pooled size for a request, as replay_once's arenas have it (0:
// not pooled, allocated exactly and released at free).
std::uint64_t pooled_size(const BinScheme& bins, const Options& o, std::uint64_t size) {
  if (size > max_pooled_of(o) || size > o.device_memory) return 0;
  return bins.rounded(size, o.device_memory);
}

// The binned floor (the header): per arena and bin, the most blocks active
// at once so far, times the bin's size, summed, plus the unpooled requests
// active; its peak over the trace.
std::uint64_t binned_floor(const Trace& tr, const Options& o) {
  const BinScheme bins(o.cfg.leading_bits);
  struct Count {
    std::uint64_t now = 0, most = 0;
  };
  std::vector<std::vector<Count>> per_arena(tr.arenas.size());
  std::vector<std::uint64_t> asked(tr.slots, 0);  // what each live allocation asked for
  std::uint64_t kept = 0, unpooled = 0, peak = 0;
  for (const Event& e : tr.events) {
    std::vector<Count>& counts = per_arena[e.arena];
    if (e.alloc) asked[e.slot] = e.requested ? e.requested : 1;
    const std::uint64_t n = asked[e.slot], size = pooled_size(bins, o, n);
    const std::size_t bin = bins.bin_number(n);
    if (size != 0 && counts.size() <= bin) counts.resize(bin + 1);
    if (!e.alloc) {
      if (size == 0) unpooled -= n;
      else --counts[bin].now;
      continue;
    }
    if (size == 0) {
      unpooled += n;
    } else if (++counts[bin].now > counts[bin].most) {
      counts[bin].most = counts[bin].now;
      kept += size;
    }
    peak = std::max(peak, kept + unpooled);
  }
  return peak;
}

struct Result {
  double ns_per_op = 0;
  Stats totals;
  SimDriver driver;  // the simulated driver, teardown included
  SimDriver during;  // its counts when the trace's last event was replayed
};

Result replay_once(const Trace& tr, const Options& o) {
  PoolOptions po;
  po.leading_bits = o.cfg.leading_bits;
  po.shards = 1;
  po.hold = o.cfg.hold;
  po.release_after_ns = o.cfg.release_after_ns;
  po.borrow_larger = o.cfg.borrow;
  po.clock = trace_clock;
  po.cost_clock = cost_clock;
  g_spent = g_cost_now = 0;
  Result r;
  // The driver's properties before any arena asks for them.
  r.driver.alloc_cost_ns = o.alloc_cost_ns;
  r.driver.wait_cost_ns = o.wait_cost_ns;
  r.driver.granule = o.granule;
  r.driver.map_cost_ns = o.map_cost_ns;
  r.driver.lag_ns = o.device_lag_ns;
  r.driver.poll = o.poll;
  Pool pool(po);
  std::vector<Arena*> arenas;
  for (std::size_t i = 0; i < tr.arenas.size(); ++i) {
    ArenaOptions ao;
    ao.name = "replay " + std::to_string(i);
    ao.group = tr.arenas[i];
    ao.kind = "replay";
    ao.max_pooled = max_pooled_of(o);
    ao.max_block = o.device_memory;
    if (const std::uint64_t cap = max_held_of(tr, o)) ao.max_held = cap;
    ao.split_min = config::split_min(o.cfg);
    ao.expandable = o.cfg.segments == config::Segments::expandable;
    ao.pending_growth = o.cfg.pending_growth.resolve(o.device_memory);
    arenas.push_back(
        pool.add_arena(std::make_unique<SimBackend>(&r.driver, fenced(tr, i, o)), std::move(ao)));
  }
  std::vector<Block*> slots(tr.slots, nullptr);
  std::uint64_t next_trim = 0, last_t = 0;
  const auto t0 = std::chrono::steady_clock::now();
  for (const Event& e : tr.events) {
    g_trace_now = e.t_ns;
    g_cost_now = e.t_ns + g_spent;
    if (o.sync_gap_ns && e.t_ns - last_t >= o.sync_gap_ns) r.driver.completed = r.driver.issued;
    last_t = e.t_ns;
    if (o.cfg.release_after_ns && e.t_ns >= next_trim) {  // the control thread's round
      pool.trim_idle(e.t_ns);
      next_trim = e.t_ns + std::max<std::uint64_t>(o.cfg.release_after_ns / 4, 1);
    }
    if (e.alloc) {
      Block* b = pool.allocate(arenas[e.arena], e.requested ? e.requested : 1).block;
      if (!b) {
        std::fprintf(stderr, "bench_replay: %s: the simulated driver failed\n", tr.path.c_str());
        std::exit(1);
      }
      slots[e.slot] = b;
    } else {
      pool.free(slots[e.slot]);
      slots[e.slot] = nullptr;
    }
  }
  const auto took = std::chrono::steady_clock::now() - t0;
  r.ns_per_op = tr.events.empty()
                    ? 0
                    : double(std::chrono::duration_cast<std::chrono::nanoseconds>(took).count()) /
                          double(tr.events.size());
  r.totals = pool.totals();
  r.during = r.driver;
  for (Block* b : slots)
    if (b) pool.free(b);
  return r;
}

void report(const Trace& tr, const Options& o) {
  std::vector<double> times;
  Result last;
  for (unsigned i = 0; i < std::max(1u, o.rounds); ++i) {
    last = replay_once(tr, o);
    times.push_back(last.ns_per_op);
  }
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2];
  const Stats& s = last.totals;
  const std::uint64_t allocs = s.hits + s.misses;
  const double hit_rate = allocs ? double(s.hits) / double(allocs) : 0;
  const double ratio = tr.peak_active ? double(last.during.peak) / double(tr.peak_active) : 0;
  const std::uint64_t floor = binned_floor(tr, o);
  const double floor_ratio = tr.peak_active ? double(floor) / double(tr.peak_active) : 0;
  const std::uint64_t max_held = max_held_of(tr, o);
  if (o.json) {
    std::printf(
        "{\"trace\":\"%s\",\"format\":\"%s\",\"events\":%zu,\"allocations\":%llu,\"unfreed\":%llu,"
        "\"ns_per_op\":%.1f,\"ns_per_op_min\":%.1f,\"ns_per_op_max\":%.1f,\"rounds\":%zu,"
        "\"hits\":%llu,\"misses\":%llu,\"hit_rate\":%.4f,\"peak_active_bytes\":%llu,"
        "\"peak_managed_bytes\":%llu,\"managed_over_active\":%.4f,\"driver_allocs\":%llu,"
        "\"driver_frees\":%llu,\"recorded_hits\":%llu,\"recorded_misses\":%llu,"
        "\"recorded_managed_bytes\":%llu,\"binned_floor_bytes\":%llu,\"floor_over_active\":%.4f,"
        "\"max_held_bytes\":%llu,\"fence_waits\":%llu,\"fence_wait_ns\":%llu,\"maps\":%llu,"
        "\"unmaps\":%llu,"
        "\"granules_mapped\":%llu,\"granules_unmapped\":%llu,\"unmap_waits\":%llu,"
        "\"device_lag_ns\":%llu,\"poll\":%s,\"stalled_ns\":%llu,"
        "\"segments\":\"%s\",\"granule\":%llu,"
        "\"leading_bits\":%u,\"release_after_ns\":%llu,\"borrow\":%s,\"split_min\":%llu}\n",
        tr.path.c_str(), tr.format.c_str(), tr.events.size(), (unsigned long long)allocs,
        (unsigned long long)tr.unfreed, median, times.front(), times.back(), times.size(),
        (unsigned long long)s.hits, (unsigned long long)s.misses, hit_rate,
        (unsigned long long)tr.peak_active, (unsigned long long)last.during.peak, ratio,
        (unsigned long long)last.during.allocs, (unsigned long long)last.during.frees,
        (unsigned long long)tr.recorded_hits, (unsigned long long)tr.recorded_misses,
        (unsigned long long)tr.recorded_managed, (unsigned long long)floor, floor_ratio,
        (unsigned long long)max_held, (unsigned long long)s.fence_waits,
        (unsigned long long)s.fence_wait_ns, (unsigned long long)last.during.maps,
        (unsigned long long)last.during.unmaps, (unsigned long long)last.during.mapped,
        (unsigned long long)last.during.unmapped, (unsigned long long)last.during.unmap_waits,
        (unsigned long long)o.device_lag_ns, o.poll ? "true" : "false",
        (unsigned long long)last.during.stalled_ns,
        o.cfg.segments == config::Segments::expandable ? "expandable" : "driver",
        (unsigned long long)o.granule, o.cfg.leading_bits,
        (unsigned long long)o.cfg.release_after_ns, o.cfg.borrow ? "true" : "false",
        (unsigned long long)config::split_min(o.cfg));
    return;
  }
  std::printf("%s (%s trace): %zu events, %llu allocations, %llu never freed\n", tr.path.c_str(),
              tr.format.c_str(), tr.events.size(), (unsigned long long)allocs,
              (unsigned long long)tr.unfreed);
  std::printf("  time per pool operation  %.1f ns (median of %zu rounds, %.1f-%.1f)\n", median,
              times.size(), times.front(), times.back());
  std::printf("  hits / misses            %llu / %llu (hit rate %.2f%%)\n",
              (unsigned long long)s.hits, (unsigned long long)s.misses, 100 * hit_rate);
  if (tr.format == "gpupool")
    std::printf(
        "  the program saw          %llu / %llu, %llu bytes allocated by misses (%.3fx "
        "peak active)\n",
        (unsigned long long)tr.recorded_hits, (unsigned long long)tr.recorded_misses,
        (unsigned long long)tr.recorded_managed,
        tr.peak_active ? double(tr.recorded_managed) / double(tr.peak_active) : 0.0);
  std::printf("  peak active / managed    %llu / %llu bytes (managed %.3fx active)\n",
              (unsigned long long)tr.peak_active, (unsigned long long)last.during.peak, ratio);
  std::printf(
      "  binned floor             %llu bytes (%.3fx active: no binned pool that keeps its "
      "blocks manages less)\n",
      (unsigned long long)floor, floor_ratio);
  if (max_held) std::printf("  held bytes capped at     %llu\n", (unsigned long long)max_held);
  if (safe_reuse(o)) {
    if (o.sync_gap_ns)
      std::printf(
          "  pool's waits             %llu (safe reuse, synchronized at pauses of %llu ns)\n",
          (unsigned long long)s.fence_waits, (unsigned long long)o.sync_gap_ns);
    else
      std::printf(
          "  pool's waits             %llu (safe reuse, no synchronization of the "
          "program's)\n",
          (unsigned long long)s.fence_waits);
    if (o.device_lag_ns)
      std::printf("  stalled in waits         %.3f ms (the device %llu ns behind the program%s)\n",
                  double(last.during.stalled_ns) / 1e6, (unsigned long long)o.device_lag_ns,
                  o.poll ? ", polled" : "");
  }
  std::printf("  driver calls             %llu allocations, %llu releases\n",
              (unsigned long long)last.during.allocs, (unsigned long long)last.during.frees);
  if (last.during.maps || o.cfg.segments == config::Segments::expandable)
    std::printf(
        "  granules of %llu bytes   %llu mapped in %llu calls, %llu unmapped in %llu calls "
        "(%llu of them waited for the device)\n",
        (unsigned long long)o.granule, (unsigned long long)last.during.mapped,
        (unsigned long long)last.during.maps, (unsigned long long)last.during.unmapped,
        (unsigned long long)last.during.unmaps, (unsigned long long)last.during.unmap_waits);
}

bool size_arg(const char* s, std::uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s, &end, 10);
  if (errno || end == s || s[0] == '-') return false;
  std::uint64_t mult = 1;
  if (*end == 'K' || *end == 'k') mult = 1ull << 10, ++end;
  else if (*end == 'M') mult = 1ull << 20, ++end;
  else if (*end == 'G') mult = 1ull << 30, ++end;
  if (*end) return false;
  *out = v * mult;
  return true;
}

config::SizeSpec bytes_spec(std::uint64_t bytes) {
  config::SizeSpec s;
  s.unlimited = false;
  s.bytes = bytes;
  return s;
}

// --max-held: BYTES (K/M/G), or Fx, F times the trace's peak active.
bool held_arg(const char* s, Options* o) {
  const std::size_t n = std::strlen(s);
  if (n >= 2 && s[n - 1] == 'x') {
    char* end = nullptr;
    errno = 0;
    const double f = std::strtod(s, &end);
    if (errno || end != s + n - 1 || !(f > 0) || f > 1e6) return false;
    o->max_held_of_active = f;
    return true;
  }
  std::uint64_t bytes = 0;
  if (!size_arg(s, &bytes) || bytes == 0) return false;
  o->cfg.max_held = bytes_spec(bytes);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  std::vector<std::string> paths;
  std::vector<std::string> settings;  // GPUPOOL_NAME=VALUE, in order
  auto usage = [](const std::string& bad) {
    std::fprintf(stderr,
                 "usage: bench_replay TRACE... [GPUPOOL_NAME=VALUE...] [--rounds N] "
                 "[--leading-bits 1-8] [--max-pooled BYTES] [--device-memory BYTES] "
                 "[--release-after NS] [--max-held BYTES|Fx] [--borrow] [--split BYTES] "
                 "[--sync-gap NS] [--pending-growth BYTES] [--granule BYTES] [--alloc-cost NS] "
                 "[--wait-cost NS] [--map-cost NS] [--device-lag NS [--poll]] [--json]\n"
                 "bench_replay: bad argument '%s'\n",
                 bad.c_str());
    std::exit(2);
  };
  // The --flags, after every GPUPOOL_NAME=VALUE whatever the order.
  std::vector<std::pair<std::string, std::string>> flags;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a.rfind("GPUPOOL_", 0) == 0 && a.find('=') != std::string::npos) {
      settings.push_back(a);
    } else if (a == "--json" || a == "--borrow" || a == "--poll") {
      flags.emplace_back(a, "");
    } else if (a.rfind("--", 0) == 0) {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_replay: %s needs a value\n", a.c_str());
        return 2;
      }
      flags.emplace_back(a, argv[++i]);
    } else if (!a.empty() && a[0] != '-') {
      paths.push_back(a);
    } else {
      usage(a);
    }
  }
  // The library's parser and checks: a value it would warn about is an error here.
  std::vector<const char*> env;
  for (const std::string& s : settings) env.push_back(s.c_str());
  env.push_back(nullptr);
  std::vector<config::Diagnostic> diagnostics;
  o.cfg = config::parse(env.data(), &diagnostics);
  for (const config::Diagnostic& d : diagnostics)
    std::fprintf(stderr, "bench_replay: %s\n", d.message.c_str());
  if (!diagnostics.empty()) return 2;
  for (const auto& [a, value] : flags) {
    std::uint64_t v = 0;
    const char* val = value.c_str();
    if (a == "--json") o.json = true;
    else if (a == "--borrow") o.cfg.borrow = true;
    else if (a == "--poll") o.poll = true;
    else if (a == "--rounds" && size_arg(val, &v) && v > 0) o.rounds = unsigned(v);
    else if (a == "--leading-bits" && size_arg(val, &v) && v >= 1 && v <= 8)
      o.cfg.leading_bits = unsigned(v);
    else if (a == "--max-pooled" && size_arg(val, &v)) o.cfg.max_pooled = bytes_spec(v);
    else if (a == "--device-memory" && size_arg(val, &v) && v > 0) o.device_memory = v;
    else if (a == "--release-after" && size_arg(val, &v)) o.cfg.release_after_ns = v;
    else if (a == "--max-held" && held_arg(val, &o)) {
    } else if (a == "--split" && size_arg(val, &v) && v > 0) o.cfg.split = v;
    else if (a == "--sync-gap" && size_arg(val, &v) && v > 0) {
      o.sync_gap_ns = v;
      if (o.cfg.reuse == config::Reuse::immediate) o.cfg.reuse = config::Reuse::safe;
    } else if (a == "--pending-growth" && size_arg(val, &v)) o.cfg.pending_growth = bytes_spec(v);
    else if (a == "--alloc-cost" && size_arg(val, &v)) o.alloc_cost_ns = v;
    else if (a == "--wait-cost" && size_arg(val, &v)) o.wait_cost_ns = v;
    else if (a == "--map-cost" && size_arg(val, &v)) o.map_cost_ns = v;
    else if (a == "--device-lag" && size_arg(val, &v) && v > 0) o.device_lag_ns = v;
    else if (a == "--granule" && size_arg(val, &v) && v >= 4096 && v % 4096 == 0) o.granule = v;
    else usage(a + (value.empty() ? "" : " " + value));
  }
  if (o.poll && !o.device_lag_ns) {
    std::fprintf(stderr, "bench_replay: --poll needs --device-lag\n");
    return 2;
  }
  // A device that lags makes waits stall; the program's own synchronizations
  // (--sync-gap) would stall as well, which the trace's times already hold.
  if (o.device_lag_ns && (o.sync_gap_ns || !safe_reuse(o))) {
    std::fprintf(stderr,
                 "bench_replay: --device-lag needs safe or fenced reuse, without --sync-gap\n");
    return 2;
  }
  if (paths.empty()) {
    std::fprintf(stderr, "usage: bench_replay TRACE... [options]\n");
    return 2;
  }
  std::vector<Trace> traces;
  for (const std::string& p : paths) traces.push_back(read_trace(p));  // all checked first
  for (const Trace& t : traces) report(t, o);
  return 0;
}
