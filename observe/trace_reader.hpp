// Reading a GPUPOOL_TRACE_FILE (docs/trace.md) back: the one parser of the
// format, for `gpupool trace convert` and the replay benchmark. Checks
// every line and every free against the allocations before it (in time
// order); a problem is one message naming the file and line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpupool::trace {

struct ArenaDecl {
  std::uint64_t id = 0;
  std::string kind, group, name;
};

// An executable segment [start, end) of a loaded object; an address pc in it
// is pc - bias in the file (build_id: hex, empty when unknown).
struct ModuleDecl {
  std::uint64_t id = 0, start = 0, end = 0, bias = 0;
  std::string build_id, path;
};

// A Python code location.
struct PyFrameDecl {
  std::uint64_t id = 0;
  std::uint32_t line = 0;
  std::string func, file;
};

// An allocation site: return addresses, innermost first, and indexes into
// TraceFile::pyframes, innermost first.
struct SiteDecl {
  std::uint64_t id = 0;
  std::vector<std::uint64_t> pcs;
  std::vector<std::uint32_t> pyframes;
  // Modules declared before the site: a pc is in the last of them that
  // covers it (docs/trace.md).
  std::size_t modules_end = 0;
};

inline constexpr std::uint32_t kNoSite = UINT32_MAX;

// 56 bytes: a report of five million records keeps them all.
struct Record {
  std::uint64_t t_ns = 0;  // since the trace started
  std::uint64_t handle = 0;
  std::uint64_t requested = 0, size = 0;
  std::uint32_t slot = 0;        // the allocation a record is about (0, 1, ... in order)
  std::uint32_t arena = 0;       // index into TraceFile::arenas
  std::uint32_t site = kNoSite;  // allocations: index into TraceFile::sites
  std::uint32_t thread = 0;      // index into TraceFile::threads
  // The line in the file (saturated at UINT32_MAX): errors name it, and it
  // keeps the file's order among records of equal times.
  std::uint32_t line = 0;
  bool alloc = false;
  bool hit = false;  // allocations
  // Allocations served outside gpupool's pool ('d', neither hit nor miss:
  // docs/trace.md).
  bool outside = false;
  // A record of an arena of kind kUnpooledArenaKind: the implementation
  // alone serves its allocations and takes back its frees (nothing held).
  bool unpooled = false;
};

struct TraceFile {
  std::string path;
  std::uint64_t pid = 0, start_unix_ns = 0;
  // The traced program's command line, as the header's '# cmdline' line
  // gives it (shell-quoted words; empty in traces written before it).
  std::string cmdline;
  // The `gpupool run` the process belongs to (its pid, GPUPOOL_RUN_PID), as
  // the header's '# run' line gives it; 0 without one (not under gpupool
  // run, or written before the line existed).
  std::uint64_t run = 0;
  // The process's exit, as its '# end T_NS' line gives it (on the records'
  // clock): ended is false for a trace without one (the process was killed
  // or exec'd, or the trace was written before the line existed).
  bool ended = false;
  std::uint64_t end_ns = 0;
  std::vector<std::uint64_t> threads;  // Linux thread ids, as records name them
  int version = 0;                     // 1 or 2 (2 adds sites)
  std::vector<ArenaDecl> arenas;
  std::vector<ModuleDecl> modules;
  std::vector<PyFrameDecl> pyframes;
  std::vector<SiteDecl> sites;
  std::vector<Record> records;  // sorted: time order, frees first at equal times
  // Whether records are known to be in time order (pair_records sorts
  // them otherwise).
  bool in_time_order = false;
  std::uint32_t slots = 0;      // allocations
  std::uint64_t unfreed = 0;    // allocations never freed
  bool truncated_tail = false;  // the last line had no newline (the writer was killed): left out
  // Lenient reads: records that do not pair (a free of a handle not active,
  // an allocation of one still active), as a killed program's trace has
  // when its last buffered records were lost. Left out (a free), or the
  // earlier allocation freed by a free record the reader adds, at the time
  // of the allocation that reuses its handle.
  std::uint64_t unpaired = 0;
  // A trace started while the process ran ('# attached': gpupool_trace_start,
  // docs/c-api.md): frees of blocks allocated before it began are in it.
  // They are left out, counted here, in strict reads too.
  bool attached = false;
  std::uint64_t freed_from_before = 0;
};

// True and *out filled, or false and *error = "PATH:LINE: what", or for the
// file as a whole a sentence naming it ("cannot open PATH: No such file or
// directory"). Strict: a record that does not pair is an error;
// lenient: it is counted (unpaired). Reads the file in pieces: memory goes
// to the records, not to the file's text.
bool read_trace(const std::string& path, TraceFile* out, std::string* error, bool lenient = false);

// Whether the file at path starts as a gpupool trace does (either version).
bool is_trace_file(const std::string& path);

// What a trace's header says of its process: its pid and its run (as
// TraceFile has them; 0 when not said). False when it is not a trace.
bool trace_head(const std::string& path, std::uint64_t* pid, std::uint64_t* run);

// Puts tr.records (each with its line, increasing in the file's order) in
// time order and pairs each free with its allocation (slot, slots,
// unfreed, unpaired), as read_trace does. frees_first: at equal times frees
// come first (this format, written per thread); otherwise the records'
// order stands (a log written in order).
bool pair_records(TraceFile* tr, bool lenient, bool frees_first, std::string* error);

// The first line of a trace file this version writes; version 1 (no sites)
// is read too.
inline constexpr const char* kTraceHeader = "# gpupool trace 2";
inline constexpr const char* kTraceHeaderV1 = "# gpupool trace 1";
// What both begin with.
inline constexpr const char* kTraceHeaderPrefix = "# gpupool trace ";
// The kind of arena whose allocations ('d') an implementation made alone,
// unpooled, and whose frees went back to it: a forked child's OpenCL
// buffers (interpose/opencl/unpooled.hpp). Other 'd' allocations are a
// driver's memory pool's, which keeps what is freed.
inline constexpr const char* kUnpooledArenaKind = "opencl-unpooled";

}  // namespace gpupool::trace
