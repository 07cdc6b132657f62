// GPUPOOL_TRACE_FILE: every allocation and free, as text lines a benchmark
// can replay (format: docs/trace.md).
//
// Cost on the allocating thread: one clock read and one record stored into
// a per-thread ring (no lock, no shared cache line). The control thread
// formats and writes the rings out; a thread whose ring is full writes it
// out itself, so no record is ever dropped.
#pragma once

#include <cstdint>
#include <string>

#include "core/pool.hpp"
#include "interpose/control/sites.hpp"

namespace gpupool::trace {

// Fed by the control room's Recorder (recorder.hpp), the pool's observer.
class Tracer final {
 public:
  // Opens this process's file for GPUPOOL_TRACE_FILE=`value` (%p: the pid;
  // without it the value itself or a sibling, per GPUPOOL_RUN_PID=run_pid:
  // sys/outputs.hpp; a regular file of this user, never a symlink, held
  // while the process lives) and writes the header. nullptr with *why set
  // when it cannot. sites: where allocation sites are declared from (may be
  // null).
  // attached: started while the process runs (gpupool_trace_start): the
  // header says so ('# attached'), since frees of blocks allocated before
  // are recorded.
  static Tracer* open(const std::string& value, long run_pid, sites::Sites* sites, bool attached,
                      std::string* why);

  // After finish(): traces again, into the file for `value` (as open()
  // with attached), with this tracer's thread buffers. False with *why set
  // when the file cannot be had; it stays finished then.
  bool restart(const std::string& value, long run_pid, std::string* why);
  // The file this process writes (or last wrote).
  std::string path() const;

  // Never throw: the pool is mid-operation.
  void allocated(const Arena& arena, const Block& block, Served how, std::uint32_t site) noexcept;
  void freed(const Arena& arena, const Block& block) noexcept;
  // Writes out the records naming the arena and forgets its id.
  void arena_destroyed(const Arena& arena);

  // Write out every thread's buffered records. Thread-safe.
  void flush();

  // At the process's exit, or when the program stops the trace
  // (gpupool_trace_stop): flush(), then "# end T_NS" (on the trace's
  // clock), so that a report of several processes stops counting what this
  // one held. Nothing for a process that never opened its file. Records
  // that come later are dropped until restart().
  void finish();

  std::uint64_t records_written() const;
  // Records lost because the file could not be written (disk full, quota,
  // file size limit). The first loss is logged.
  std::uint64_t records_dropped() const;

  // fork(): the tracer's locks, held across fork. In the child the parent's
  // buffered records are discarded (the parent writes them: fork_child);
  // then the child traces into its own file (its pid for %p, else the
  // sibling name), opened when its first records are written.
  bool fork_prepare();  // false: gave up (core/fork_wait.hpp)
  void fork_parent();
  void fork_child();
  void renew_in_child();

  struct Impl;  // opaque; public only so the .cpp's thread buffers can name it

 private:
  Tracer();
  Impl* impl_;
};

}  // namespace gpupool::trace
