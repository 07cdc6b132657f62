// Allocation sites (GPUPOOL_SITES): the call stack of an allocation, native
// and, where the allocating thread runs Python and holds the GIL, Python's.
//
// Kept compact on the allocating thread: return addresses as they are
// (glibc's backtrace(), which unwinds through .eh_frame, so libraries built
// without frame pointers unwind too), Python frames as (function, file,
// line). Identical stacks share one site id. Nothing is symbolised here:
// a site's native frames are addresses inside loaded objects (modules), and
// the trace names each module's file, load bias and build id, so `gpupool
// report` symbolises afterwards from the files. Only the exit leak report
// names frames in-process (symbols.hpp; exit is not the hot path).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "config/config.hpp"
#include "core/lock_rank.hpp"
#include "observe/symbols.hpp"

namespace gpupool::sites {

inline constexpr std::uint32_t kNoSite = UINT32_MAX;

struct Site {
  std::vector<std::uint64_t> pcs;       // return addresses, innermost first
  std::vector<std::uint32_t> pyframes;  // ids into Sites' Python frames, innermost first
  // Modules declared before this site: a pc is in the last of them that
  // covers it (a library unloaded and another loaded at its addresses).
  std::size_t modules_end = 0;
};

class Sites {
 public:
  // nullptr when sampling is off. Never destroyed (allocations go on during
  // exit).
  static Sites* create(const config::SiteSampling& sampling);

  // The site of the allocation the calling thread is making, or kNoSite when
  // this one is not sampled. Called outside every pool lock.
  std::uint32_t capture(std::uint64_t requested) noexcept;

  // Lines declaring modules, Python frames and sites (docs/trace.md, version
  // 2), in the order they appeared: a site's modules and frames come before
  // it. Lines [from, end) are appended to out; returns end.
  std::size_t declarations(std::size_t from, std::string* out);

  // One site as text for people, a frame per line, each line prefixed with
  // `indent`: named from the modules' files (symbols.hpp: file:line where
  // they have debug information, else function+offset, else
  // module+offset). Reads files: for the exit report, not the hot path.
  std::string describe(std::uint32_t site, const char* indent);

  std::uint64_t sampled() const;

  // fork(): the table's lock.
  bool fork_prepare();  // false: gave up (core/fork_wait.hpp)
  void fork_parent();
  void fork_child();

 private:
  explicit Sites(const config::SiteSampling& s) : sampling_(s) {}
  struct Module {
    std::uint64_t start, end, bias;
    std::string path;
    std::string build_id;  // hex; empty: none
  };
  std::uint32_t intern(const std::uint64_t* pcs, int npcs,
                       const std::vector<std::string>& pyframes);
  void add_module_of(std::uint64_t pc);
  void note_unloads();

  const config::SiteSampling sampling_;
  mutable Ranked<LockRank::sites> mu_;  // everything below
  std::vector<Module> modules_;
  // Shared objects unloaded so far (glibc's count) when last looked; the
  // modules before modules_from_ were declared before the latest unload and
  // may no longer be what their addresses hold.
  unsigned long long unloads_seen_ = 0;
  std::size_t modules_from_ = 0;
  std::unique_ptr<symbols::Files> symbols_;                     // describe()'s, made on first use
  std::unordered_map<std::string, std::uint32_t> pyframe_ids_;  // "line func\tfile"
  std::vector<std::string> pyframe_text_;                       // by id, "file:line func"
  std::unordered_map<std::string, std::uint32_t> site_ids_;     // pcs and frame ids, as bytes
  std::vector<Site> sites_;
  std::vector<std::string> decls_;
  std::uint64_t sampled_ = 0;
  std::uint64_t over_limit_ = 0;  // sampled allocations of new stacks past kMaxSites
};

// Distinct stacks kept (about 1.5 KB each): a program whose stacks never
// repeat (generated code, JIT addresses) stops adding sites there, with one
// warning, rather than growing without bound.
inline constexpr std::size_t kMaxSites = 16384;

}  // namespace gpupool::sites
