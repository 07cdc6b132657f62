#include "interpose/node/node.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <iterator>
#include <string_view>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <deque>
#include <mutex>
#include <new>
#include <vector>

#include "interpose/control/control.hpp"
#include "interpose/node/internal.hpp"
#include "interpose/runtime.hpp"
#include "sys/io.hpp"
#include "sys/log.hpp"

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

}  // namespace

namespace {

// Opening the registry creates its file, may wait for its lock and logs: a
// caller of add_device may hold its own locks, but never the devices' lock.
std::unique_ptr<wire::Registry> open_registry(Runtime& rt, [[maybe_unused]] State& s)
    GPUPOOL_EXCLUDES(s.mu) {
  const std::string path =
      rt.config.registry.empty() ? wire::default_registry_path() : rt.config.registry;
  std::string why;
  std::unique_ptr<wire::Registry> reg = wire::Registry::open(path, &why);
  if (!reg)
    log().warn(
        "node registry not used ({}): other gpupool processes on this node cannot ask "
        "this one for its held memory, nor it them",
        why);
  return reg;
}

// The registry stopped being one while in use (cut, replaced, its disk
// full): said once; each later look fails the same way, at no other cost.
void registry_unusable(const std::string& why) {
  static std::atomic<bool> said{false};
  if (!why.empty() && !said.exchange(true))
    log().warn(
        "node registry not usable any more ({}): other gpupool processes on this node "
        "cannot ask this one for its held memory, nor it them",
        why);
}

}  // namespace

// Every caller runs inside the runtime (a hook, its backends, its control
// thread, its exit handler).
State& state() { return *runtime_if_started()->node.load(std::memory_order_acquire); }

// Every live entry but this process's; an unusable registry lists nobody.
std::vector<wire::ProcessEntry> others(wire::Registry* reg) {
  std::string why;
  bool busy = false;
  std::vector<wire::ProcessEntry> out = reg->processes(/*skip_self=*/true, &why, &busy);
  if (!busy) registry_unusable(why);
  return out;
}

// The devices and the registry, copied under the lock.
std::vector<Device*> devices(State& s, wire::Registry** reg) {
  LockGuard lock(s.mu);
  std::vector<Device*> out;
  for (Device& d : s.devices) out.push_back(&d);
  if (reg) *reg = s.registry.get();
  return out;
}

bool find_device(State& s, const std::string& group, wire::DeviceKey* key, wire::Registry** reg) {
  LockGuard lock(s.mu);
  for (const Device& d : s.devices)
    if (d.group == group) {
      *key = d.key;
      *reg = s.registry.get();
      return true;
    }
  return false;
}

std::uint64_t add_sat(std::uint64_t a, std::uint64_t b) {
  return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

// The GPU's free and total memory and what the other processes use of it,
// from NVML; false when NVML cannot say.
bool gpu_use(Runtime& rt, const Device& d, std::uint64_t* free, std::uint64_t* total,
             std::uint64_t* others) {
  NvmlSession& nvml = rt.node.load(std::memory_order_acquire)->nvml;
  if (!wire::is_gpu(d.key) || !nvml_memory(nvml, d.key, free, total) || *total == 0) return false;
  const std::uint64_t used = *total - std::min(*free, *total);
  // This process's share: all it has on the GPU when NVML can say (its
  // contexts, libraries and memory outside the pool too), else the pool's.
  std::uint64_t mine = rt.pool.group_totals(d.group).managed_bytes, listed = 0;
  if (nvml_process_used(nvml, d.key, static_cast<long>(getpid()), &listed))
    mine = std::max(mine, listed);
  *others = used - std::min(used, mine);
  return true;
}

namespace {

// Control thread: this process's figures per GPU, published when there is
// a registry; `held` feeds the watch either way.
void refresh(Runtime& rt, const std::vector<Device*>& devs, wire::Registry* reg) {
  std::vector<wire::DeviceUse> out;  // one per GPU: CUDA and OpenCL on one GPU are summed
  for (Device* d : devs) {
    const Stats t = rt.pool.group_totals(d->group);
    // What could be given back (GPUPOOL_SPLIT: not a partly used segment's
    // free pieces), not all that is held.
    const std::uint64_t held = rt.pool.group_releasable(d->group);
    d->held = held;
    if (t.managed_bytes < d->managed) d->returned_at = io::mono_ns();
    d->managed = t.managed_bytes;
    auto u = std::find_if(out.begin(), out.end(),
                          [&](const wire::DeviceUse& x) { return x.key == d->key; });
    if (u == out.end()) u = out.insert(out.end(), wire::DeviceUse{d->key});
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
    case wire::Registry::Outcome::ok:
      break;
    case wire::Registry::Outcome::full:
      log().debug("node registry: no free slot; this process is not listed");
      break;
    case wire::Registry::Outcome::busy:
      log().debug("node registry: {}; next time", why);
      break;
    case wire::Registry::Outcome::unusable:
      registry_unusable(why);
      break;
  }
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
    log().info(
        "{}: {} MiB free, under GPUPOOL_PRESSURE_FREE ({} MiB) as other processes "
        "allocate: released {} MiB of held memory",
        wire::key_text(d.key), free >> 20, threshold >> 20, released >> 20);
}

constexpr std::uint64_t kArrivalWindowNs = 5000 * kMs;

// `pid` runs gpupool: the registry lists it, or it has the library mapped
// (a child that has not published yet: DataLoader workers, MPI ranks under
// gpupool). Such processes ask for memory themselves. /proc/PID/maps is
// read in gpupool's own descriptor table; in another PID namespace the
// number names nobody here (or someone else) and the answer is no.
bool gpupool_process(unsigned pid, const std::vector<wire::ProcessEntry>& listed) {
  for (const wire::ProcessEntry& p : listed)
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
void arrivals(Runtime& rt, State& s, Device& d, wire::Registry* reg, std::uint64_t now) {
  std::vector<unsigned> pids;
  if (!nvml_processes(s.nvml, d.key, &pids)) return;
  std::vector<unsigned> fresh;
  std::set_difference(pids.begin(), pids.end(), d.pids.begin(), d.pids.end(),
                      std::back_inserter(fresh));
  const bool first = !d.pids_looked;
  d.pids = std::move(pids);
  d.pids_looked = true;
  unsigned arrived = 0;
  if (!first && !fresh.empty()) {
    const std::vector<wire::ProcessEntry> listed =
        reg ? others(reg) : std::vector<wire::ProcessEntry>{};
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
    log().info(
        "{}: process {} arrived on the GPU: released {} MiB ({} blocks unused for "
        "GPUPOOL_ARRIVAL_IDLE or longer) in {:.1f} ms",
        wire::key_text(d.key), arrived, bytes >> 20, blocks, ms);
  else
    log().debug(
        "{}: after an arrival, {} MiB more ({} blocks) reached GPUPOOL_ARRIVAL_IDLE "
        "and were released",
        wire::key_text(d.key), bytes >> 20, blocks);
}

}  // namespace

void add_device(Runtime& rt, const wire::DeviceKey& key, const std::string& group,
                std::size_t total) {
  State& s = state();
  bool open = false;  // this call opens the registry (the first device's)
  {
    LockGuard lock(s.mu);
    for (const Device& d : s.devices)
      if (d.group == group) return;
    Device d;
    d.key = key;
    d.group = group;
    d.total = total;
    s.devices.push_back(d);
    open = !s.registry_tried && rt.config.neighbours != config::Neighbours::off;
    if (open) s.registry_tried = true;
  }
  if (open) {
    std::unique_ptr<wire::Registry> reg = open_registry(rt, s);
    LockGuard lock(s.mu);
    s.registry = std::move(reg);
  }
  s.publish_now.store(true, std::memory_order_release);
  control::wake();  // published at once, not at the control thread's next round
}

std::uint64_t tick(Runtime& rt, std::uint64_t now) {
  State& s = state();
  wire::Registry* reg = nullptr;
  const std::vector<Device*> devs = devices(s, &reg);
  if (devs.empty()) return UINT64_MAX;
  if (now >= s.next_publish || s.publish_now.exchange(false, std::memory_order_acq_rel)) {
    refresh(rt, devs, reg);
    s.next_publish = now + kPublishPeriodNs;
  }
  std::uint64_t next = s.next_publish;
  const std::uint64_t interval = rt.config.pressure_interval_ns;
  bool holding = false;
  for (const Device* d : devs) holding = holding || (d->held > 0 && wire::is_gpu(d->key));
  const config::SizeSpec& pf = rt.config.pressure_free;
  const bool watching = pf.unlimited || (pf.percent ? pf.fraction > 0 : pf.bytes > 0);
  const bool arrivals_on = rt.config.arrival_idle_ns > 0;
  if (interval && holding && (watching || arrivals_on)) {
    if (now >= s.next_watch) {
      for (Device* d : devs) {
        if (d->held == 0 || !wire::is_gpu(d->key)) {  // NVML knows GPUs by UUID only
          d->pids_looked = false;                     // who comes meanwhile is no arrival
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

namespace {

// Once the runtime is published: the control thread's work here.
void start(Runtime& rt) { control::set_node_work(rt, {tick, answer_release}); }

// Exit: the registry slot is given back.
void at_exit() noexcept {
  State& s = state();
  if (!s.mu.try_lock()) return;
  if (s.registry) s.registry->leave();
  s.mu.unlock();
}

// fork(): no lock taken, but no NVML or dlopen call in flight
// (nvml_fork_prepare). A fork while the runtime is being made (its
// handlers are registered before it is published) finds no state: no
// control thread is there yet to call NVML.
State* state_if_made() {
  Runtime* rt = runtime_if_started();
  return rt ? rt->node.load(std::memory_order_acquire) : nullptr;
}
void fork_prepare() noexcept {
  if (State* s = state_if_made()) nvml_fork_prepare(s->nvml);
}
void fork_parent() noexcept {
  if (State* s = state_if_made()) nvml_fork_parent(s->nvml);
}

// The child starts from a new state (the parent's, possibly mid-change by
// a thread the child does not have, is left alone) keeping only the
// registry mapping, and claims its own slot; its GPUs are added again when
// it uses them, and its NVML session is its own. The child's one thread
// reads the parent's state without its lock: a thread the child does not
// have may have held it.
void fork_child() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  Runtime* rt = runtime_if_started();
  if (!rt) return;
  State* old = rt->node.load(std::memory_order_relaxed);
  auto* fresh = new (std::nothrow) State;
  nvml_fork_child(old->nvml, fresh ? &fresh->nvml : nullptr);
  if (!fresh) return;  // out of memory: keep the parent's
  fresh->registry = std::move(old->registry);
  fresh->registry_tried = old->registry_tried;
  if (fresh->registry) fresh->registry->forget_slot();
  rt->node.store(fresh, std::memory_order_release);
}

}  // namespace

// The room's part (runtime.hpp: Part::node). Its state is made with the
// runtime; when it starts, it gives the control thread its work (before
// control, the next part that starts, starts the thread).
constinit const PartHandlers kPart{
    .make = [](Runtime& rt) { rt.node.store(new State, std::memory_order_relaxed); },
    .start = start,
    .exit = at_exit,
    .fork = {fork_prepare, fork_parent, fork_child, nullptr}};

}  // namespace gpupool::node
