// Pool counters, in PyOpenCL's vocabulary (held/active blocks and bytes,
// managed bytes) plus what an operator needs to judge the pool.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

namespace gpupool {

// Every counter, in the order dumps list them: X(name, kind, meaning),
// kind `bytes` (a byte count), `count` (a gauge) or `counter` (only grows:
// a Prometheus counter). The struct, its sum and every rendering
// (observe/stats_format.cpp) come from this one list.
#define GPUPOOL_STATS_FIELDS(X)                                                                 \
  X(held_blocks, count, "freed by the program, kept for reuse")                                 \
  X(active_blocks, count, "in the program's hands")                                             \
  X(held_bytes, bytes, "allocation sizes of held blocks")                                       \
  X(active_bytes, bytes, "sizes the program asked for")                                         \
  X(managed_bytes, bytes, "allocation sizes of active + held blocks")                           \
  X(peak_held_blocks, count, "highest held_blocks")                                             \
  X(peak_active_blocks, count, "highest active_blocks")                                         \
  X(peak_held_bytes, bytes, "highest held_bytes")                                               \
  X(peak_active_bytes, bytes, "highest active_bytes")                                           \
  X(peak_managed_bytes, bytes, "highest managed_bytes")                                         \
  X(hits, counter, "allocations served from held blocks")                                       \
  X(misses, counter, "allocations that went to the backend")                                    \
  X(backend_allocs, counter, "successful backend allocations")                                  \
  X(backend_frees, counter, "backend releases")                                                 \
  X(oom_retries, counter, "backend allocations retried after releasing held blocks")            \
  X(trims, counter,                                                                             \
    "held blocks released for the cap, for idleness, or for a process that arrived on the GPU") \
  X(pending_frees, counter, "frees whose block the device might still use (fenced)")            \
  X(fence_waits, counter, "bulk waits because only pending blocks could serve a request")       \
  X(fence_wait_ns, counter, "ns spent in those waits, summed over the threads that waited")     \
  X(stock_growths, counter, "range pieces a thread took instead of waiting (its stock)")

struct Stats {
#define GPUPOOL_STATS_MEMBER(name, kind, meaning) std::uint64_t name = 0;
  GPUPOOL_STATS_FIELDS(GPUPOOL_STATS_MEMBER)
#undef GPUPOOL_STATS_MEMBER

  Stats& operator+=(const Stats& o) {
#define GPUPOOL_STATS_ADD(name, kind, meaning) name += o.name;
    GPUPOOL_STATS_FIELDS(GPUPOOL_STATS_ADD)
#undef GPUPOOL_STATS_ADD
    return *this;
  }
  bool operator==(const Stats&) const = default;

  // A block (or a free piece of a segment) of `bytes` starts or stops
  // being held.
  void add_held(std::uint64_t bytes) {
    ++held_blocks;
    held_bytes += bytes;
    peak_held_blocks = std::max(peak_held_blocks, held_blocks);
    peak_held_bytes = std::max(peak_held_bytes, held_bytes);
  }
  void remove_held(std::uint64_t bytes) {
    --held_blocks;
    held_bytes -= bytes;
  }
  // Every peak down to its current value (Pool::reset_peaks).
  void reset_peaks() {
    peak_held_blocks = held_blocks;
    peak_active_blocks = active_blocks;
    peak_held_bytes = held_bytes;
    peak_active_bytes = active_bytes;
    peak_managed_bytes = managed_bytes;
  }
};

struct BinSnapshot {
  std::size_t alloc_size = 0;
  std::uint64_t held_blocks = 0;
  std::uint64_t held_bytes = 0;
};

struct ArenaSnapshot {
  std::string name;    // e.g. "cuda dev 0 ctx 1" or "opencl ctx 1 dev ... flags 0x1"
  std::string group;   // the memory it draws on, e.g. "cuda:0", "cuda-host", "opencl:ctx"
  std::string kind;    // "cuda", "cuda-host", "opencl"
  std::string device;  // ArenaOptions::device (the destroyed arenas' rows too)
  bool retired = false;
  Stats stats;
  std::vector<BinSnapshot> bins;  // bins holding memory, most bytes first
};

}  // namespace gpupool
