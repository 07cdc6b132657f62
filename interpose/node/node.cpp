#include "interpose/node/node.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iterator>
#include <string_view>

#include <algorithm>
#include <charconv>
#include <atomic>
#include <deque>
#include <mutex>
#include <new>
#include <vector>

#include "config/io.hpp"
#include "config/log.hpp"
#include "interpose/control/control.hpp"
#include "interpose/control/socket.hpp"
#include "interpose/node/internal.hpp"
#include "interpose/runtime.hpp"

namespace gpupool::node {
namespace {

constexpr std::uint64_t kMs = 1'000'000;
// Figures in the registry are at most this old (they rank whom to ask and
// feed cuMemGetInfo; a request itself gets exact numbers back).
constexpr std::uint64_t kPublishPeriodNs = 100 * kMs;
// Pressure counts only when the other processes' use grew by more than
// this (64 MiB, or 1/64 of a smaller device) since free memory was last
// above the threshold: a process at the edge of the GPU by itself keeps
// its pool.
std::uint64_t growth_slack(std::uint64_t total) {
  return std::min<std::uint64_t>(64ull << 20, total / 64);
}

// One pool group on a GPU this process draws on (a GPU may have two: CUDA's
// and OpenCL's). uuid, group and total never change once added; the watch
// fields are the control thread's alone.
struct Device {
  Uuid uuid{};
  std::string group;
  std::size_t total = 0;
  // The pressure watch: the other processes' use when free memory was last
  // above the threshold (UINT64_MAX: not sampled yet).
  std::uint64_t others_at_ok = UINT64_MAX;
  // The other processes' use when a release was last made for another
  // user's process (UINT64_MAX: none yet); the next is made only once they
  // use more (answer_release).
  std::uint64_t others_at_foreign = UINT64_MAX;
  std::uint64_t held = 0;  // at the last tick
  // Managed bytes at the last publication, and when they last fell (memory
  // went back to the driver: a release, a context gone). 0: never.
  std::uint64_t managed = 0, returned_at = 0;
  // Arrivals: the pids NVML listed on the GPU at the last look, sorted. The
  // first look (again after a time holding nothing) only learns who is
  // there.
  std::vector<unsigned> pids;
  bool pids_looked = false;
  // After an arrival, until then (mono ns), blocks reaching the idle age go
  // back as well: the newcomer may take its memory seconds after it came.
  std::uint64_t arrival_until = 0;
};

}  // namespace

// The room's state (Runtime::node), made with the runtime; never destroyed:
// used during exit. A forked child gets a new one. Nothing is called while
// holding mu: the pool, the driver and NVML are called with it released
// (its rank: core/lock_rank.hpp).
struct State {
  Ranked<LockRank::node_devices> mu;  // devices (the list), registry (set once)
  std::deque<Device> devices;   // stable addresses: the control thread works outside mu
  std::unique_ptr<Registry> registry;
  bool registry_tried = false;
  std::atomic<bool> publish_now{false};
  // The control thread's:
  std::uint64_t next_publish = 0, next_watch = 0;
};

State* new_state() { return new State; }

namespace {

// Every caller runs inside the runtime (a hook, its backends, its control
// thread, its exit handler).
State& state() { return *runtime_if_started()->node.load(std::memory_order_acquire); }

void open_registry(Runtime& rt, State& s) {
  if (s.registry_tried || rt.config.neighbours == config::Neighbours::off) return;
  s.registry_tried = true;
  const std::string path =
      rt.config.registry.empty() ? default_registry_path() : rt.config.registry;
  std::string why;
  s.registry = Registry::open(path, &why);
  if (!s.registry)
    log().warn("node registry not used ({}): other gpupool processes on this node cannot ask "
               "this one for its held memory, nor it them",
               why);
}

// The registry stopped being one while in use (cut, replaced, its disk
// full): said once; each later look fails the same way, at no other cost.
void registry_unusable(const std::string& why) {
  static std::atomic<bool> said{false};
  if (!why.empty() && !said.exchange(true))
    log().warn("node registry not usable any more ({}): other gpupool processes on this node "
               "cannot ask this one for its held memory, nor it them",
               why);
}

// Every live entry but this process's; an unusable registry lists nobody.
std::vector<ProcessEntry> others(Registry* reg) {
  std::string why;
  bool busy = false;
  std::vector<ProcessEntry> out = reg->processes(/*skip_self=*/true, &why, &busy);
  if (!busy) registry_unusable(why);
  return out;
}

// The devices and the registry, copied under the lock.
std::vector<Device*> devices(State& s, Registry** reg = nullptr) {
  std::lock_guard lock(s.mu);
  std::vector<Device*> out;
  for (Device& d : s.devices) out.push_back(&d);
  if (reg) *reg = s.registry.get();
  return out;
}

bool find_device(State& s, const std::string& group, Uuid* uuid, Registry** reg) {
  std::lock_guard lock(s.mu);
  for (const Device& d : s.devices)
    if (d.group == group) {
      *uuid = d.uuid;
      *reg = s.registry.get();
      return true;
    }
  return false;
}

std::uint64_t add_sat(std::uint64_t a, std::uint64_t b) { return a > UINT64_MAX - b ? UINT64_MAX : a + b; }

// Control thread: this process's figures per GPU, published when there is
// a registry; `held` feeds the watch either way.
void refresh(Runtime& rt, const std::vector<Device*>& devs, Registry* reg) {
  std::vector<DeviceUse> out;  // one per GPU: CUDA and OpenCL on one GPU are summed
  for (Device* d : devs) {
    const Stats t = rt.pool.group_totals(d->group);
    // What could be given back (GPUPOOL_SPLIT: not a partly used segment's
    // free pieces), not all that is held.
    const std::uint64_t held = rt.pool.group_releasable(d->group);
    d->held = held;
    if (t.managed_bytes < d->managed) d->returned_at = io::mono_ns();
    d->managed = t.managed_bytes;
    auto u = std::find_if(out.begin(), out.end(), [&](const DeviceUse& x) { return x.uuid == d->uuid; });
    if (u == out.end()) u = out.insert(out.end(), DeviceUse{d->uuid});
    u->returned_at = std::max(u->returned_at, d->returned_at);
    u->held = add_sat(u->held, held);
    u->active = add_sat(u->active, t.active_bytes);
    u->managed = add_sat(u->managed, t.managed_bytes);
    u->hits = add_sat(u->hits, t.hits);
    u->misses = add_sat(u->misses, t.misses);
  }
  if (!reg) return;
  std::string why;
  switch (reg->publish(out, &why)) {
    case Registry::Outcome::ok: break;
    case Registry::Outcome::full:
      log().debug("node registry: no free slot; this process is not listed");
      break;
    case Registry::Outcome::busy: log().debug("node registry: {}; next time", why); break;
    case Registry::Outcome::unusable: registry_unusable(why); break;
  }
}

// The GPU's free and total memory and what the other processes use of it,
// from NVML; false when NVML cannot say.
bool gpu_use(Runtime& rt, const Device& d, std::uint64_t* free, std::uint64_t* total,
             std::uint64_t* others) {
  if (!nvml_memory(d.uuid, free, total) || *total == 0) return false;
  const std::uint64_t used = *total - std::min(*free, *total);
  // This process's share: all it has on the GPU when NVML can say (its
  // contexts, libraries and memory outside the pool too), else the pool's.
  std::uint64_t mine = rt.pool.group_totals(d.group).managed_bytes, listed = 0;
  if (nvml_process_used(d.uuid, static_cast<long>(getpid()), &listed)) mine = std::max(mine, listed);
  *others = used - std::min(used, mine);
  return true;
}

// One GPU whose free memory is low because other processes allocate:
// release held blocks until twice the threshold is free (so a neighbour
// growing step by step is not stopped at the next step). Control thread.
void watch(Runtime& rt, Device& d) {
  const std::uint64_t threshold = rt.config.pressure_free.resolve(d.total);
  std::uint64_t free = 0, total = 0, others = 0;
  if (!gpu_use(rt, d, &free, &total, &others)) return;
  const Stats t = rt.pool.group_totals(d.group);
  if (free >= threshold || d.others_at_ok == UINT64_MAX) {
    d.others_at_ok = others;
    if (free >= threshold) return;
  }
  if (t.held_bytes == 0 || others <= add_sat(d.others_at_ok, growth_slack(total))) return;
  const std::uint64_t target = add_sat(threshold, threshold);
  const std::uint64_t want = target - std::min(free, target);
  const std::size_t released =
      rt.pool.release_group(d.group, static_cast<std::size_t>(std::max<std::uint64_t>(want, 1)));
  if (released)
    log().info("{}: {} MiB free, under GPUPOOL_PRESSURE_FREE ({} MiB) as other processes "
               "allocate: released {} MiB of held memory",
               uuid_text(d.uuid), free >> 20, threshold >> 20, released >> 20);
}

constexpr std::uint64_t kArrivalWindowNs = 5000 * kMs;

// `pid` runs gpupool: the registry lists it, or it has the library mapped
// (a child that has not published yet: DataLoader workers, MPI ranks under
// gpupool). Such processes ask for memory themselves. /proc/PID/maps is
// read in gpupool's own descriptor table; in another PID namespace the
// number names nobody here (or someone else) and the answer is no.
bool gpupool_process(unsigned pid, const std::vector<ProcessEntry>& listed) {
  for (const ProcessEntry& p : listed)
    if (p.pid == static_cast<long>(pid)) return true;
  bool found = false;
  io::in_private([&] {
    char path[48];
    std::snprintf(path, sizeof path, "/proc/%u/maps", pid);
    const int fd = ::open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return;
    static constexpr char kName[] = "libgpupool";
    constexpr std::size_t keep = sizeof kName - 2;  // a name cut by a read
    char buf[16384];
    std::size_t have = 0;
    for (;;) {
      const ssize_t n = ::read(fd, buf + have, sizeof buf - have);
      if (n <= 0) break;
      have += static_cast<std::size_t>(n);
      if (std::string_view(buf, have).find(kName) != std::string_view::npos) {
        found = true;
        break;
      }
      const std::size_t tail = std::min(have, keep);
      std::memmove(buf, buf + have - tail, tail);
      have = tail;
    }
    ::close(fd);
  });
  return found;
}

// A process that is not a gpupool process appeared on the GPU: it did not
// ask, and it may take all the memory it sees at once (JAX, vLLM, a
// training job's first step). The blocks this process has not reused for
// GPUPOOL_ARRIVAL_IDLE go back at once, the largest first, and for the next
// few seconds as more reach that age; blocks in use by a busy loop stay.
// Control thread.
void arrivals(Runtime& rt, State& s, Device& d, Registry* reg, std::uint64_t now) {
  std::vector<unsigned> pids;
  if (!nvml_processes(d.uuid, &pids)) return;
  std::vector<unsigned> fresh;
  std::set_difference(pids.begin(), pids.end(), d.pids.begin(), d.pids.end(),
                      std::back_inserter(fresh));
  const bool first = !d.pids_looked;
  d.pids = std::move(pids);
  d.pids_looked = true;
  unsigned arrived = 0;
  if (!first && !fresh.empty()) {
    const std::vector<ProcessEntry> listed = reg ? others(reg) : std::vector<ProcessEntry>{};
    for (unsigned pid : fresh)
      if (static_cast<long>(pid) != getpid() && !gpupool_process(pid, listed)) {
        arrived = pid;
        break;
      }
  }
  if (arrived) d.arrival_until = now + kArrivalWindowNs;
  if (now >= d.arrival_until) return;
  const std::uint64_t t0 = io::mono_ns();
  std::size_t blocks = 0;
  const std::size_t bytes = rt.pool.release_idle(d.group, rt.config.arrival_idle_ns, &blocks);
  if (bytes == 0) return;
  s.publish_now.store(true, std::memory_order_release);
  const double ms = double(io::mono_ns() - t0) / 1e6;
  if (arrived)
    log().info("{}: process {} arrived on the GPU: released {} MiB ({} blocks unused for "
               "GPUPOOL_ARRIVAL_IDLE or longer) in {:.1f} ms",
               uuid_text(d.uuid), arrived, bytes >> 20, blocks, ms);
  else
    log().debug("{}: after an arrival, {} MiB more ({} blocks) reached GPUPOOL_ARRIVAL_IDLE "
                "and were released",
                uuid_text(d.uuid), bytes >> 20, blocks);
}

}  // namespace

void add_device(Runtime& rt, const Uuid& uuid, const std::string& group, std::size_t total) {
  State& s = state();
  {
    std::lock_guard lock(s.mu);
    for (const Device& d : s.devices)
      if (d.group == group) return;
    Device d;
    d.uuid = uuid;
    d.group = group;
    d.total = total;
    s.devices.push_back(d);
    open_registry(rt, s);
  }
  s.publish_now.store(true, std::memory_order_release);
  control::wake();  // published at once, not at the control thread's next round
}

std::uint64_t tick(Runtime& rt, std::uint64_t now) {
  State& s = state();
  Registry* reg = nullptr;
  const std::vector<Device*> devs = devices(s, &reg);
  if (devs.empty()) return UINT64_MAX;
  if (now >= s.next_publish || s.publish_now.exchange(false, std::memory_order_acq_rel)) {
    refresh(rt, devs, reg);
    s.next_publish = now + kPublishPeriodNs;
  }
  std::uint64_t next = s.next_publish;
  const std::uint64_t interval = rt.config.pressure_interval_ns;
  bool holding = false;
  for (const Device* d : devs) holding = holding || (d->held > 0 && d->uuid != kHostMemory);
  const config::SizeSpec& pf = rt.config.pressure_free;
  const bool watching = pf.unlimited || (pf.percent ? pf.fraction > 0 : pf.bytes > 0);
  const bool arrivals_on = rt.config.arrival_idle_ns > 0;
  if (interval && holding && (watching || arrivals_on)) {
    if (now >= s.next_watch) {
      for (Device* d : devs) {
        if (d->held == 0 || d->uuid == kHostMemory) {  // NVML sees GPUs only
          d->pids_looked = false;  // who comes meanwhile is no arrival
          continue;
        }
        if (arrivals_on) arrivals(rt, s, *d, reg, now);
        if (watching) watch(rt, *d);
      }
      s.next_watch = now + interval;
      refresh(rt, devs, reg);
    }
    next = std::min(next, s.next_watch);
  }
  return next;
}

std::size_t others_held(const std::string& group) {
  State& s = state();
  Uuid uuid;
  Registry* reg = nullptr;
  if (!find_device(s, group, &uuid, &reg) || !reg) return 0;
  std::uint64_t sum = 0;
  for (const ProcessEntry& p : others(reg))
    for (const DeviceUse& u : p.devices)
      if (u.uuid == uuid) sum = add_sat(sum, u.held);
  return static_cast<std::size_t>(std::min<std::uint64_t>(sum, SIZE_MAX));
}

namespace {

// One out-of-memory's request to the neighbours on device `uuid`: what is
// asked for, until when, and what came back so far.
struct Asking {
  Uuid uuid;
  std::size_t bytes = 0;
  std::uint64_t start = 0, deadline = 0;
  std::size_t released = 0;
  bool enough() const { return released >= bytes || io::mono_ns() >= deadline; }
};

// The user's processes holding the most first (the registry says who):
// each asked in turn until enough came back or time is up (*stopped: some
// were not asked). Returns whom it asked, with what each held.
std::vector<std::pair<std::uint64_t, long>> ask_holders(Registry* reg, Asking& q, bool* stopped) {
  std::vector<std::pair<std::uint64_t, long>> holders;
  for (const ProcessEntry& p : others(reg))
    for (const DeviceUse& u : p.devices)
      if (u.uuid == q.uuid && u.held > 0) holders.push_back({u.held, p.pid});
  std::sort(holders.rbegin(), holders.rend());
  std::vector<std::pair<std::uint64_t, long>> asked;
  *stopped = false;
  for (const auto& [held, pid] : holders) {
    if ((*stopped = q.enough())) break;
    const std::uint64_t t0 = io::mono_ns();
    const std::size_t got = ask_release(pid, geteuid(), q.uuid, q.bytes - q.released, q.deadline);
    log().info("out of memory on {}: process {} (holding {} MiB) released {} MiB in {:.1f} ms",
               uuid_text(q.uuid), pid, held >> 20, got >> 20,
               double(io::mono_ns() - t0) / 1e6);
    q.released += got;
    asked.push_back({held, pid});
  }
  return asked;
}

// A holder that answers "released 0" may have released the same memory a
// moment before, by its pressure watch, between our failed allocation and
// our request (measured on an H200: the program then saw out-of-memory
// with 3 GiB just freed). Its entry shows it: what the asked holders no
// longer hold counts as released, so the caller retries.
void count_released_meanwhile(Registry* reg, const std::vector<std::pair<std::uint64_t, long>>& holders,
                              Asking& q) {
  std::uint64_t dropped = 0;
  const std::vector<ProcessEntry> now = others(reg);
  for (const auto& [held, pid] : holders) {
    std::uint64_t still = 0;
    for (const ProcessEntry& p : now)
      if (p.pid == pid)
        for (const DeviceUse& u : p.devices)
          if (u.uuid == q.uuid) still = u.held;
    dropped = add_sat(dropped, held - std::min(held, still));
  }
  if (dropped > q.released) {
    log().info("out of memory on {}: the processes asked hold {} MiB less than before "
               "(released meanwhile); retrying",
               uuid_text(q.uuid), (dropped - q.released) >> 20);
    q.released = static_cast<std::size_t>(std::min<std::uint64_t>(dropped, SIZE_MAX));
  }
}

// GPUPOOL_NEIGHBOURS=all: other users' gpupool processes, whose figures we
// cannot see: all asked at once, each releasing what it holds there (if it
// also chose all). Each listed name once: a process under a fallback name
// has it listed, and its usual name then belongs to whoever took it, whom
// the owner check refuses.
void ask_other_users(Asking& q) {
  std::vector<Target> others;
  // /proc/net/unix is opened on the files thread (config/io.hpp): this is
  // the program's allocating thread, whose table is the program's.
  std::vector<control::SocketName> listed;
  io::in_private([&] { listed = control::listed_sockets(); });
  for (control::SocketName& sock : listed)
    if (sock.uid != geteuid()) others.push_back({sock.pid, sock.uid, std::move(sock.name)});
  if (others.empty()) return;
  const std::uint64_t t0 = io::mono_ns();
  const std::size_t got = ask_release_all(others, q.uuid, q.bytes - q.released, q.deadline);
  log().info("out of memory on {}: other users' processes asked ({} control sockets "
             "listed), {} MiB released in {:.1f} ms",
             uuid_text(q.uuid), others.size(), got >> 20, double(io::mono_ns() - t0) / 1e6);
  q.released += got;
}

// Nothing released for us, maybe because it was released before we
// looked: a holder's watch (or a free_held) may give its memory back
// between our failed allocation and our reading of the registry, and then
// holds nothing to be asked for (1 round in about 700 of the ask_and_watch
// test on a loaded 2-core machine). Its entry says when it last gave
// memory back: within the last `wait`, and the caller tries once more.
bool gave_back_lately(Registry* reg, const Asking& q, std::uint64_t wait) {
  const std::uint64_t since = q.start - std::min(q.start, wait);
  for (const ProcessEntry& p : others(reg))
    for (const DeviceUse& u : p.devices)
      if (u.uuid == q.uuid && u.returned_at != 0 && u.returned_at >= since) {
        log().info("out of memory on {}: process {} gave memory back {:.1f} ms ago; retrying",
                   uuid_text(q.uuid), p.pid,
                   double(q.start - std::min(q.start, u.returned_at)) / 1e6);
        return true;
      }
  return false;
}

}  // namespace

bool ask_neighbours(const std::string& group, std::size_t bytes) {
  State& s = state();
  Asking q;
  Registry* reg = nullptr;
  if (!find_device(s, group, &q.uuid, &reg)) return false;
  Runtime* rt = runtime_if_started();
  const std::uint64_t wait = rt ? rt->config.neighbour_wait_ns : 0;
  if (wait == 0 || !rt || rt->config.neighbours == config::Neighbours::off) return false;
  q.bytes = bytes;
  q.start = io::mono_ns();
  q.deadline = q.start + wait;
  if (reg) {
    bool stopped = false;
    const auto holders = ask_holders(reg, q, &stopped);
    if (stopped) return true;
    if (q.released < bytes && !holders.empty()) count_released_meanwhile(reg, holders, q);
  }
  if (rt->config.neighbours == config::Neighbours::all && q.released < bytes &&
      io::mono_ns() < q.deadline)
    ask_other_users(q);
  if (reg && q.released == 0 && gave_back_lately(reg, q, wait)) return true;
  return q.released > 0;
}

std::string answer_release(Runtime& rt, std::string_view args, bool other_user) {
  const std::size_t sp = args.find(' ');
  Uuid uuid;
  std::uint64_t bytes = 0;
  if (sp == std::string_view::npos || !parse_uuid(args.substr(0, sp), &uuid) ||
      std::from_chars(args.data() + sp + 1, args.data() + args.size(), bytes).ec != std::errc())
    return "error bad-request expected 'release GPU-<uuid> <bytes>'\n";
  State& s = state();
  const std::vector<Device*> devs = devices(s);
  std::size_t want = static_cast<std::size_t>(std::min<std::uint64_t>(bytes, SIZE_MAX));
  // Another user's process says what it lacks and we cannot see its
  // figures, so what it asks is checked against the GPU, as the pressure
  // watch does: it gets what the GPU lacks for its request (the bytes asked,
  // at most the GPU's size, less the free memory), and only if the other
  // processes' use grew since the last release made for one of them (they
  // took that memory). Asking again and again without allocating gets
  // nothing; without NVML nothing is released for another user.
  Device* watched = nullptr;
  std::uint64_t others = 0;
  if (other_user) {
    for (Device* d : devs)
      if (d->uuid == uuid && !watched) watched = d;
    std::uint64_t free = 0, total = 0;
    if (!watched || !gpu_use(rt, *watched, &free, &total, &others) ||
        (watched->others_at_foreign != UINT64_MAX && others <= watched->others_at_foreign))
      want = 0;
    else {
      const std::uint64_t asked = std::min<std::uint64_t>(bytes, total);
      const std::uint64_t lacks = asked - std::min(free, asked);
      want = static_cast<std::size_t>(std::min<std::uint64_t>(lacks, SIZE_MAX));
    }
  }
  std::size_t released = 0;
  for (Device* d : devs)
    if (d->uuid == uuid && released < want) released += rt.pool.release_group(d->group, want - released);
  if (released && watched) watched->others_at_foreign = others;
  if (released) {
    log().info("released {} MiB of held memory on {} for another gpupool process{}",
               released >> 20, uuid_text(uuid), other_user ? " (another user's)" : "");
    // Published by this thread's next tick, not here: publishing opens the
    // registry, and the tick waits while the program has 0-2 closed.
    s.publish_now.store(true, std::memory_order_release);
  }
  return "ok\nreleased " + std::to_string(released) + "\n";
}

void at_exit() noexcept {
  State& s = state();
  std::unique_lock lock(s.mu, std::try_to_lock);
  if (lock.owns_lock() && s.registry) s.registry->leave();
}

namespace {
// fork(): no lock taken, but no NVML or dlopen call in flight
// (nvml_fork_prepare). The child starts from a new state (the parent's,
// possibly mid-change by a thread the child does not have, is left alone)
// keeping only the registry mapping, and claims its own slot; its GPUs are
// added again when it uses them, and its NVML session is its own.
[[maybe_unused]] const bool g_fork_registered = [] {
  set_fork_handlers(ForkPart::node, {nvml_fork_prepare, nvml_fork_parent,
                                     [] {
                                       nvml_fork_child();
                                       Runtime* rt = runtime_if_started();
                                       if (!rt) return;
                                       State* old = rt->node.load(std::memory_order_relaxed);
                                       auto* fresh = new (std::nothrow) State;
                                       if (!fresh) return;  // out of memory: keep the parent's
                                       fresh->registry = std::move(old->registry);
                                       fresh->registry_tried = old->registry_tried;
                                       if (fresh->registry) fresh->registry->forget_slot();
                                       rt->node.store(fresh, std::memory_order_release);
                                     },
                                     nullptr});
  return true;
}();
}  // namespace

}  // namespace gpupool::node
