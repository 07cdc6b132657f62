#include "interpose/node/node.hpp"

#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <mutex>
#include <vector>

#include "config/log.hpp"
#include "interpose/control/control.hpp"
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

struct Device {
  Uuid uuid{};
  std::string group;
  std::size_t total = 0;
  // The pressure watch: the other processes' use when free memory was last
  // above the threshold (UINT64_MAX: not sampled yet).
  std::uint64_t others_at_ok = UINT64_MAX;
  std::uint64_t held = 0;  // at the last tick
};

struct State {
  std::mutex mu;  // devices, registry use
  std::vector<Device> devices;
  std::unique_ptr<Registry> registry;
  bool registry_tried = false;
  std::uint64_t next_publish = 0, next_watch = 0;
};
State& state() {
  static State* s = new State;  // never destroyed: used during exit
  return *s;
}

void open_registry(Runtime& rt, State& s) {
  if (s.registry_tried || !rt.config.neighbours) return;
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

Device* device_of(State& s, const std::string& group) {
  for (Device& d : s.devices)
    if (d.group == group) return &d;
  return nullptr;
}

std::vector<DeviceUse> figures(Runtime& rt, State& s) {
  std::vector<DeviceUse> out;
  for (Device& d : s.devices) {
    const Stats t = rt.pool.group_totals(d.group);
    d.held = t.held_bytes;
    out.push_back({d.uuid, t.held_bytes, t.active_bytes, t.managed_bytes, t.hits, t.misses});
  }
  return out;
}

void publish_locked(Runtime& rt, State& s) {
  if (s.registry && !s.registry->publish(figures(rt, s)))
    log().debug("node registry: no free slot; this process is not listed");
}

// One GPU whose free memory is low because other processes allocate:
// release held blocks until twice the threshold is free (so a neighbour
// growing step by step is not stopped at the next step).
void watch(Runtime& rt, Device& d) {
  const std::size_t threshold = rt.config.pressure_free.resolve(d.total);
  std::uint64_t free = 0, total = 0;
  if (!nvml_memory(d.uuid, &free, &total) || total == 0) return;
  const Stats t = rt.pool.group_totals(d.group);
  const std::uint64_t used = total - std::min(free, total);
  const std::uint64_t others = used - std::min<std::uint64_t>(used, t.managed_bytes);
  if (free >= threshold || d.others_at_ok == UINT64_MAX) {
    d.others_at_ok = others;
    if (free >= threshold) return;
  }
  if (t.held_bytes == 0 || others <= d.others_at_ok + growth_slack(total)) return;
  const std::size_t want = 2 * threshold - std::min<std::size_t>(free, 2 * threshold);
  const std::size_t released = rt.pool.release_group(d.group, std::max<std::size_t>(want, 1));
  if (released)
    log().info("{}: {} MiB free, under GPUPOOL_PRESSURE_FREE ({} MiB) as other processes "
               "allocate: released {} MiB of held memory",
               uuid_text(d.uuid), free >> 20, threshold >> 20, released >> 20);
}

}  // namespace

void add_device(Runtime& rt, const Uuid& uuid, const std::string& group, std::size_t total) {
  State& s = state();
  std::lock_guard lock(s.mu);
  if (device_of(s, group)) return;
  Device d;
  d.uuid = uuid;
  d.group = group;
  d.total = total;
  s.devices.push_back(d);
  open_registry(rt, s);
  s.next_publish = 0;
  control::wake();  // published at once, not at the control thread's next round
}

std::uint64_t tick(Runtime& rt, std::uint64_t now) {
  State& s = state();
  std::unique_lock lock(s.mu, std::try_to_lock);  // never wait: a request is being answered
  if (!lock.owns_lock()) return now + kMs;
  if (s.devices.empty()) return UINT64_MAX;
  if (now >= s.next_publish) {
    publish_locked(rt, s);
    s.next_publish = now + kPublishPeriodNs;
  }
  std::uint64_t next = s.registry ? s.next_publish : UINT64_MAX;
  const std::uint64_t interval = rt.config.pressure_interval_ns;
  bool holding = false;
  for (const Device& d : s.devices) holding = holding || d.held > 0;
  const config::SizeSpec& pf = rt.config.pressure_free;
  const bool watching = pf.unlimited || (pf.percent ? pf.fraction > 0 : pf.bytes > 0);
  if (interval && holding && watching) {
    if (now >= s.next_watch) {
      for (Device& d : s.devices)
        if (d.held > 0) watch(rt, d);
      s.next_watch = now + interval;
      publish_locked(rt, s);
    }
    next = std::min(next, s.next_watch);
  }
  return next;
}

std::size_t others_held(const std::string& group) {
  State& s = state();
  Uuid uuid;
  Registry* reg;
  {
    std::lock_guard lock(s.mu);
    const Device* d = device_of(s, group);
    if (!d || !s.registry) return 0;
    uuid = d->uuid;
    reg = s.registry.get();  // never reset once open
  }
  std::size_t sum = 0;
  for (const ProcessEntry& p : reg->processes(/*skip_self=*/true))
    for (const DeviceUse& u : p.devices)
      if (u.uuid == uuid) sum += u.held;
  return sum;
}

std::size_t ask_neighbours(const std::string& group, std::size_t bytes) {
  State& s = state();
  Uuid uuid;
  Registry* reg;
  std::uint64_t wait;
  {
    std::lock_guard lock(s.mu);
    const Device* d = device_of(s, group);
    if (!d || !s.registry) return 0;
    uuid = d->uuid;
    reg = s.registry.get();
    Runtime* rt = runtime_if_started();
    wait = rt ? rt->config.neighbour_wait_ns : 0;
  }
  if (wait == 0) return 0;
  // The holders of the most first.
  std::vector<std::pair<std::uint64_t, long>> holders;
  for (const ProcessEntry& p : reg->processes(/*skip_self=*/true))
    for (const DeviceUse& u : p.devices)
      if (u.uuid == uuid && u.held > 0) holders.push_back({u.held, p.pid});
  std::sort(holders.rbegin(), holders.rend());
  const std::uint64_t deadline = mono_ns() + wait;
  std::size_t released = 0;
  for (const auto& [held, pid] : holders) {
    if (released >= bytes || mono_ns() >= deadline) break;
    const std::uint64_t t0 = mono_ns();
    const std::size_t got = ask_release(pid, uuid, bytes - released, deadline);
    log().info("out of memory on {}: process {} (holding {} MiB) released {} MiB in {:.1f} ms",
               uuid_text(uuid), pid, held >> 20, got >> 20, double(mono_ns() - t0) / 1e6);
    released += got;
  }
  return released;
}

std::string answer_release(Runtime& rt, std::string_view args) {
  const std::size_t sp = args.find(' ');
  Uuid uuid;
  std::uint64_t bytes = 0;
  if (sp == std::string_view::npos || !parse_uuid(args.substr(0, sp), &uuid) ||
      std::from_chars(args.data() + sp + 1, args.data() + args.size(), bytes).ec != std::errc())
    return "error bad-request expected 'release GPU-<uuid> <bytes>'\n";
  State& s = state();
  std::lock_guard lock(s.mu);
  std::size_t released = 0;
  for (Device& d : s.devices)
    if (d.uuid == uuid && released < bytes) released += rt.pool.release_group(d.group, bytes - released);
  if (released) {
    log().info("released {} MiB of held memory on {} for another gpupool process",
               released >> 20, uuid_text(uuid));
    publish_locked(rt, s);
  }
  return "ok\nreleased " + std::to_string(released) + "\n";
}

void at_exit() noexcept {
  State& s = state();
  std::unique_lock lock(s.mu, std::try_to_lock);
  if (lock.owns_lock() && s.registry) s.registry->leave();
}

namespace {
// fork(): this room's lock, then NVML's (the order they nest in); the
// child's slot and NVML session are its own, not its parent's.
[[maybe_unused]] const bool g_fork_registered = [] {
  set_fork_handlers(ForkPart::node,
                    {[] {
                       state().mu.lock();
                       nvml_fork_prepare();
                     },
                     [] {
                       nvml_fork_parent();
                       state().mu.unlock();
                     },
                     [] {
                       nvml_fork_child();
                       State& s = state();
                       new (&s.mu) std::mutex;
                       if (s.registry) s.registry->forget_slot();
                       for (Device& d : s.devices) d.others_at_ok = UINT64_MAX;
                       s.next_publish = 0;
                     },
                     nullptr});
  return true;
}();
}  // namespace

}  // namespace gpupool::node
