// Pool counters, in PyOpenCL's vocabulary (held/active blocks and bytes,
// managed bytes) plus what an operator needs to judge the pool.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpupool {

struct Stats {
  std::uint64_t held_blocks = 0;    // freed by the program, kept for reuse
  std::uint64_t active_blocks = 0;  // in the program's hands
  std::uint64_t held_bytes = 0;     // allocation sizes of held blocks
  std::uint64_t active_bytes = 0;   // sizes the program asked for
  std::uint64_t managed_bytes = 0;  // allocation sizes of active + held blocks

  std::uint64_t peak_held_blocks = 0;
  std::uint64_t peak_active_blocks = 0;
  std::uint64_t peak_held_bytes = 0;
  std::uint64_t peak_active_bytes = 0;
  std::uint64_t peak_managed_bytes = 0;

  std::uint64_t hits = 0;            // allocations served from held blocks
  std::uint64_t misses = 0;          // allocations that went to the backend
  std::uint64_t backend_allocs = 0;  // successful backend allocations
  std::uint64_t backend_frees = 0;   // backend releases
  std::uint64_t oom_retries = 0;     // backend allocations retried after releasing held blocks
  std::uint64_t trims = 0;           // held blocks released for the cap or for idleness
  std::uint64_t pending_frees = 0;   // frees whose block the device might still use (fenced)
  std::uint64_t fence_waits = 0;     // bulk waits because only pending blocks could serve a request

  Stats& operator+=(const Stats& o);
  bool operator==(const Stats&) const = default;
};

struct BinSnapshot {
  std::size_t alloc_size = 0;
  std::uint64_t held_blocks = 0;
  std::uint64_t held_bytes = 0;
};

struct ArenaSnapshot {
  std::string name;   // e.g. "cuda device 0 ctx 0x..." or "opencl ctx ... flags 0x1"
  std::string group;  // the memory it draws on, e.g. "cuda:0", "cuda-host", "opencl:ctx"
  std::string kind;   // "cuda", "cuda-host", "opencl"
  bool retired = false;
  Stats stats;
  std::vector<BinSnapshot> bins;  // bins holding memory, most bytes first
};

}  // namespace gpupool
