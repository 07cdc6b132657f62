#include "interpose/control/recorder.hpp"

#include "core/fork_wait.hpp"
#include "observe/bytes.hpp"
#include "observe/stats_format.hpp"

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <new>
#include <vector>

#ifndef GPUPOOL_VERSION
#define GPUPOOL_VERSION "unknown"
#endif

namespace gpupool::control {

void Recorder::on_allocate(const Arena& arena, const Block& block, Served how) noexcept {
  const std::uint32_t site = sites_ ? sites_->capture(block.requested) : sites::kNoSite;
  if (tracing()) tracer_.load(std::memory_order_acquire)->allocated(arena, block, how, site);
  if (!leaks_) return;
  Shard& s = shard_of(block.handle);
  LockGuard lock(s.mu);
  try {
    s.held[{&arena, block.handle}] = {&arena, block.requested, block.size, site};
  } catch (...) {
    unrecorded_.fetch_add(
        1,
        std::memory_order_relaxed);  // out of host memory: the leak report says how many it misses
  }
}

void Recorder::on_free(const Arena& arena, const Block& block) noexcept {
  if (tracing()) tracer_.load(std::memory_order_acquire)->freed(arena, block);
  if (!leaks_) return;
  Shard& s = shard_of(block.handle);
  LockGuard lock(s.mu);
  s.held.erase({&arena, block.handle});
}

void Recorder::on_arena_destroyed(const Arena& arena) {
  // Also when stopped: records a thread pushed as the trace stopped name
  // the arena until they are dropped.
  if (trace::Tracer* t = tracer_.load(std::memory_order_acquire)) t->arena_destroyed(arena);
  if (!leaks_) return;
  // A retired arena goes only once none of its blocks is active; the
  // program's blocks of a destroyed context die with it all the same.
  for (Shard& s : shards_) {
    LockGuard lock(s.mu);
    std::erase_if(s.held, [&](const auto& kv) { return kv.first.arena == &arena; });
  }
}

std::string Recorder::leak_report(long pid) {
  if (!leaks_) return {};
  struct Group {
    std::uint64_t bytes = 0, blocks = 0;
  };
  // (site, pool group) -> totals
  std::map<std::pair<std::uint32_t, std::string>, Group> groups;
  std::uint64_t total = 0, blocks = 0;
  for (Shard& s : shards_) {
    LockGuard lock(s.mu);
    for (const auto& [key, h] : s.held) {
      Group& g = groups[{h.site, h.arena->options().group}];
      g.bytes += h.requested;
      ++g.blocks;
      total += h.requested;
      ++blocks;
    }
  }
  std::vector<std::pair<std::pair<std::uint32_t, std::string>, Group>> order(groups.begin(),
                                                                             groups.end());
  std::stable_sort(order.begin(), order.end(),
                   [](const auto& a, const auto& b) { return a.second.bytes > b.second.bytes; });
  char head[256];
  std::snprintf(head, sizeof head,
                "gpupool %s leaks: pid %ld: %" PRIu64
                " block%s (%s) still held by the program at "
                "exit, from %zu allocation site%s\n",
                GPUPOOL_VERSION, pid, blocks, blocks == 1 ? "" : "s",
                observe::bytes_text(total).c_str(), order.size(), order.size() == 1 ? "" : "s");
  std::string out = head;
  if (blocks)
    out +=
        "  (frameworks keep memory until exit on purpose: a cache or a model's weights is not "
        "a leak)\n";
  if (!sites_ && blocks)
    out +=
        "  (no call stacks recorded: GPUPOOL_SITES=all records where each block was allocated)\n";
  constexpr std::size_t kShown = 20;
  std::uint64_t rest_bytes = 0, rest_blocks = 0;
  for (std::size_t i = 0; i < order.size(); ++i) {
    const auto& [key, g] = order[i];
    if (i >= kShown) {
      rest_bytes += g.bytes;
      rest_blocks += g.blocks;
      continue;
    }
    out += "  " + observe::bytes_text(g.bytes) + " in " + std::to_string(g.blocks) + " block" +
           (g.blocks == 1 ? "" : "s") + ", " + key.second + ":\n";
    if (sites_) {
      out += key.first == sites::kNoSite ? "      (not sampled: GPUPOOL_SITES records a sample)\n"
                                         : sites_->describe(key.first, "      ");
    }
  }
  if (rest_blocks)
    out += "  and " + observe::bytes_text(rest_bytes) + " in " + std::to_string(rest_blocks) +
           " blocks from " + std::to_string(order.size() - kShown) + " more sites\n";
  if (const std::uint64_t lost = unrecorded_.load(std::memory_order_relaxed))
    out += "  (" + std::to_string(lost) +
           " allocations could not be remembered, out of host memory)\n";
  return out;
}

std::string Recorder::snapshot_json(long pid) {
  struct Live {
    std::uint64_t handle, requested, size;
    std::uint32_t site;
    std::string arena;
  };
  std::vector<Live> live;
  // Arenas by name, with what the stats call them (kind, group, device).
  std::map<std::string, std::string> arenas;
  if (leaks_)
    for (Shard& s : shards_) {
      LockGuard lock(s.mu);
      for (const auto& [key, h] : s.held) {
        // The arena lives while its blocks are here (on_arena_destroyed).
        const ArenaOptions& o = h.arena->options();
        live.push_back({key.handle, h.requested, h.size, h.site, o.name});
        if (!arenas.count(o.name))
          arenas[o.name] = "{\"kind\":\"" + stats::json_escape(o.kind) + "\",\"group\":\"" +
                           stats::json_escape(o.group) + "\",\"device\":\"" +
                           stats::json_escape(o.device) + "\"}";
      }
    }
  std::sort(live.begin(), live.end(), [](const Live& a, const Live& b) {
    return a.arena != b.arena ? a.arena < b.arena : a.handle < b.handle;
  });
  std::string out =
      "{\"version\":1,\"gpupool\":\"" GPUPOOL_VERSION "\",\"pid\":" + std::to_string(pid) +
      ",\"tracked\":" + (leaks_ ? "true" : "false") + ",\"sites\":" + (sites_ ? "true" : "false") +
      ",\"arenas\":{";
  bool first = true;
  for (const auto& [name, desc] : arenas) {
    out += (first ? "\"" : ",\"") + stats::json_escape(name) + "\":" + desc;
    first = false;
  }
  out += "},\"blocks\":[";
  std::map<std::uint32_t, bool> named;
  char num[128];
  for (std::size_t i = 0; i < live.size(); ++i) {
    const Live& b = live[i];
    std::snprintf(num, sizeof num,
                  "\"handle\":%" PRIu64 ",\"requested\":%" PRIu64 ",\"size\":%" PRIu64 ",\"site\":",
                  b.handle, b.requested, b.size);
    out += std::string(i ? "," : "") + "{\"arena\":\"" + stats::json_escape(b.arena) + "\"," + num;
    if (b.site == sites::kNoSite) {
      out += "null}";
    } else {
      out += std::to_string(b.site) + "}";
      named[b.site] = true;
    }
  }
  // Each site once, a frame per line as the leak report names them
  // (symbolised from the loaded files: this reads them).
  out += "],\"stacks\":{";
  first = true;
  for (const auto& [site, unused] : named) {
    out += (first ? "\"" : ",\"") + std::to_string(site) + "\":[";
    first = false;
    const std::string text = sites_->describe(site, "");
    std::size_t at = 0;
    for (bool first_frame = true; at < text.size(); first_frame = false) {
      std::size_t nl = text.find('\n', at);
      if (nl == std::string::npos) nl = text.size();
      out += std::string(first_frame ? "\"" : ",\"") +
             stats::json_escape(text.substr(at, nl - at)) + "\"";
      at = nl + 1;
    }
    out += "]";
  }
  return out + "}}";
}

void Recorder::fork_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (sites_ && !sites_->fork_prepare()) return;
  for (Shard& s : shards_)
    if (!fork_wait::take(s.mu)) return;
}

void Recorder::fork_parent() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  for (Shard& s : shards_) s.mu.unlock();
  if (sites_) sites_->fork_parent();
}

void Recorder::fork_child() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  for (Shard& s : shards_) {
    s.held.clear();
    s.mu.unlock();
  }
  if (sites_) sites_->fork_child();
}

}  // namespace gpupool::control
