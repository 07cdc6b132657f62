// The out-of-memory conversation with the other gpupool processes on the
// node: asking them for their held memory (ask_neighbours, over ask.cpp's
// requests) and answering their requests (answer_release).
#include <unistd.h>

#include <algorithm>
#include <charconv>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "interpose/node/internal.hpp"
#include "interpose/node/node.hpp"
#include "interpose/runtime.hpp"
#include "sys/io.hpp"
#include "sys/log.hpp"
#include "wire/socket.hpp"

namespace gpupool::node {

std::size_t others_held(const std::string& group) {
  State& s = state();
  wire::DeviceKey key;
  wire::Registry* reg = nullptr;
  if (!find_device(s, group, &key, &reg) || !reg) return 0;
  std::uint64_t sum = 0;
  for (const wire::ProcessEntry& p : others(reg))
    for (const wire::DeviceUse& u : p.devices)
      if (u.key == key) sum = add_sat(sum, u.held);
  return static_cast<std::size_t>(std::min<std::uint64_t>(sum, SIZE_MAX));
}

namespace {

// One out-of-memory's request to the neighbours on device `key`: what is
// asked for, until when, and what came back so far.
struct Asking {
  wire::DeviceKey key;
  std::size_t bytes = 0;
  std::uint64_t start = 0, deadline = 0;
  std::size_t released = 0;
  bool enough() const { return released >= bytes || io::mono_ns() >= deadline; }
};

// The user's processes holding the most first (the registry says who):
// each asked in turn until enough came back or time is up (*stopped: some
// were not asked). Returns whom it asked, with what each held.
std::vector<std::pair<std::uint64_t, long>> ask_holders(wire::Registry* reg, Asking& q,
                                                        bool* stopped) {
  std::vector<std::pair<std::uint64_t, long>> holders;
  for (const wire::ProcessEntry& p : others(reg))
    for (const wire::DeviceUse& u : p.devices)
      if (u.key == q.key && u.held > 0) holders.push_back({u.held, p.pid});
  std::sort(holders.rbegin(), holders.rend());
  std::vector<std::pair<std::uint64_t, long>> asked;
  *stopped = false;
  for (const auto& [held, pid] : holders) {
    if ((*stopped = q.enough())) break;
    const std::uint64_t t0 = io::mono_ns();
    const std::size_t got = ask_release(pid, geteuid(), q.key, q.bytes - q.released, q.deadline);
    log().info("out of memory on {}: process {} (holding {} MiB) released {} MiB in {:.1f} ms",
               wire::key_text(q.key), pid, held >> 20, got >> 20, double(io::mono_ns() - t0) / 1e6);
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
void count_released_meanwhile(wire::Registry* reg,
                              const std::vector<std::pair<std::uint64_t, long>>& holders,
                              Asking& q) {
  std::uint64_t dropped = 0;
  const std::vector<wire::ProcessEntry> now = others(reg);
  for (const auto& [held, pid] : holders) {
    std::uint64_t still = 0;
    for (const wire::ProcessEntry& p : now)
      if (p.pid == pid)
        for (const wire::DeviceUse& u : p.devices)
          if (u.key == q.key) still = u.held;
    dropped = add_sat(dropped, held - std::min(held, still));
  }
  if (dropped > q.released) {
    log().info(
        "out of memory on {}: the processes asked hold {} MiB less than before "
        "(released meanwhile); retrying",
        wire::key_text(q.key), (dropped - q.released) >> 20);
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
  // /proc/net/unix is opened on the files thread (sys/io.hpp): this is
  // the program's allocating thread, whose table is the program's.
  std::vector<wire::SocketName> listed;
  io::in_private([&] { listed = wire::listed_sockets(); });
  for (wire::SocketName& sock : listed)
    if (sock.uid != geteuid()) others.push_back({sock.pid, sock.uid, std::move(sock.name)});
  if (others.empty()) return;
  const std::uint64_t t0 = io::mono_ns();
  const std::size_t got = ask_release_all(others, q.key, q.bytes - q.released, q.deadline);
  log().info(
      "out of memory on {}: other users' processes asked ({} control sockets "
      "listed), {} MiB released in {:.1f} ms",
      wire::key_text(q.key), others.size(), got >> 20, double(io::mono_ns() - t0) / 1e6);
  q.released += got;
}

// Nothing released for us, maybe because it was released before we
// looked: a holder's watch (or a free_held) may give its memory back
// between our failed allocation and our reading of the registry, and then
// holds nothing to be asked for (1 round in about 700 of the ask_and_watch
// test on a loaded 2-core machine). Its entry says when it last gave
// memory back: within the last `wait`, and the caller tries once more.
bool gave_back_lately(wire::Registry* reg, const Asking& q, std::uint64_t wait) {
  const std::uint64_t since = q.start - std::min(q.start, wait);
  for (const wire::ProcessEntry& p : others(reg))
    for (const wire::DeviceUse& u : p.devices)
      if (u.key == q.key && u.returned_at != 0 && u.returned_at >= since) {
        log().info("out of memory on {}: process {} gave memory back {:.1f} ms ago; retrying",
                   wire::key_text(q.key), p.pid,
                   double(q.start - std::min(q.start, u.returned_at)) / 1e6);
        return true;
      }
  return false;
}

}  // namespace

bool ask_neighbours(const std::string& group, std::size_t bytes) {
  State& s = state();
  Asking q;
  wire::Registry* reg = nullptr;
  if (!find_device(s, group, &q.key, &reg)) return false;
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
  wire::DeviceKey key;
  std::uint64_t bytes = 0;
  if (sp == std::string_view::npos || !wire::parse_key(args.substr(0, sp), &key) ||
      std::from_chars(args.data() + sp + 1, args.data() + args.size(), bytes).ec != std::errc())
    return "error bad-request expected 'release <device> <bytes>'\n";
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
      if (d->key == key && !watched) watched = d;
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
    if (d->key == key && released < want)
      released += rt.pool.release_group(d->group, want - released);
  if (released && watched) watched->others_at_foreign = others;
  if (released) {
    log().info("released {} MiB of held memory on {} for another gpupool process{}", released >> 20,
               wire::key_text(key), other_user ? " (another user's)" : "");
    // Published by this thread's next tick, not here: publishing opens the
    // registry, and the tick waits while the program has 0-2 closed.
    s.publish_now.store(true, std::memory_order_release);
  }
  return "ok\nreleased " + std::to_string(released) + "\n";
}

}  // namespace gpupool::node
