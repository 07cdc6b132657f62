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

namespace gpupool::trace {

class Tracer final : public PoolObserver {
 public:
  // Opens `path` (a regular file of this user, never a symlink) and writes
  // the header. nullptr with *why set when it cannot.
  static Tracer* open(const std::string& path, std::string* why);

  void on_allocate(const Arena& arena, const Block& block, bool hit) override;
  void on_free(const Arena& arena, const Block& block) override;

  // Write out every thread's buffered records. Thread-safe.
  void flush();

  std::uint64_t records_written() const;

  struct Impl;  // opaque; public only so the .cpp's thread slots can name it

 private:
  explicit Tracer(int fd);
  Impl* impl_;
};

}  // namespace gpupool::trace
