// What `gpupool trace convert` and `gpupool report` share: reading a trace
// the way both say it (the warnings for a killed program's trace), the
// memory counters the records move, and writing an output whole or not at
// all.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "observe/trace_reader.hpp"

namespace gpupool::launcher {

// Reads `path` leniently; problems are printed as "gpupool CMD: ..." on
// stderr. False on an error (nothing should be written then).
bool read_trace_for(const char* cmd, const std::string& path, trace::TraceFile* tr);

// The trace files that command-line inputs name: a directory's traces (its
// other files left out, and said in *notes), a file and its siblings, the
// files NAME.PID.EXT other processes of the program wrote beside NAME.EXT
// (docs/trace.md; a missing NAME.EXT with siblings is left out). Each file
// once. False and *error (naming the directory) when a directory cannot be
// read or holds no trace.
bool trace_files(const std::vector<std::string>& inputs, std::vector<std::string>* files,
                 std::vector<std::string>* notes, std::string* error);

// The traces of trace_files(inputs), read as read_trace_for does; which
// files were read is said when they are not just the one input named.
bool read_traces_for(const char* cmd, const std::vector<std::string>& inputs,
                     std::vector<trace::TraceFile>* out);

// One pool group's memory as the records go: what the program holds
// (requested bytes), the blocks those sit in, and the blocks held for reuse.
// Held counts blocks freed and not yet reused; the trace records no
// releases, so after one (a cap, an idle release, out-of-memory) it is an
// upper bound.
struct Counters {
  std::uint64_t active = 0, in_blocks = 0, held = 0;
  std::uint64_t managed() const { return in_blocks + held; }
};

// What record r does to counters c; a free takes back what its allocation
// (requested, size) gave.
inline void apply_record(Counters& c, const trace::Record& r, std::uint64_t requested,
                         std::uint64_t size) {
  if (r.alloc) {
    c.active += r.requested;
    c.in_blocks += r.size;
    // A driver's memory pool ('d') is taken to reuse what it keeps first,
    // as a hit does; an unpooled allocation keeps nothing, nor its free.
    if (r.hit || (r.outside && !r.unpooled)) c.held -= std::min(c.held, r.size);
  } else {
    c.active -= std::min(c.active, requested);
    c.in_blocks -= std::min(c.in_blocks, size);
    if (!r.unpooled) c.held += size;
  }
}

// Per allocation slot, what its free takes back.
struct SlotSizes {
  std::vector<std::uint64_t> requested, size;
  explicit SlotSizes(const trace::TraceFile& tr) : requested(tr.slots), size(tr.slots) {}
  // Applies record r to c.
  void apply(const trace::Record& r, Counters* c) {
    if (r.alloc) {
      requested[r.slot] = r.requested;
      size[r.slot] = r.size;
    }
    apply_record(*c, r, requested[r.slot], size[r.slot]);
  }
};

// An output written in pieces, with write_whole's promise: opened before
// the work (a refused name costs nothing), and under its name only once
// committed; destroyed uncommitted, it leaves nothing behind.
class Output {
 public:
  Output() = default;
  Output(const Output&) = delete;
  Output& operator=(const Output&) = delete;
  ~Output();
  bool open(const std::string& path, std::string* why);
  // Buffered; false once a write failed (commit says why).
  bool put(std::string_view data);
  bool commit(std::string* why);

 private:
  static constexpr std::size_t kFlushAt = std::size_t(1) << 20;
  bool flush();
  std::string path_, tmp_, buf_, error_;
  int fd_ = -1;  // the temporary beside path_, or what is written into
  bool failed_ = false;
};

// Writes `data` to `path`. '-' is standard output. A new name, or a regular
// file of this user that is not read-only, gets it whole or not at all (a
// temporary beside it, then rename; a replaced file's mode is kept); a
// character device is written as a stream; anything else (a read-only
// file, another user's, a symbolic link, a directory, a block device, a
// FIFO) is refused with a message saying what it is.
bool write_whole(const std::string& path, const std::string& data, std::string* why);

}  // namespace gpupool::launcher
