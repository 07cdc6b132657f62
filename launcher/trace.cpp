// gpupool trace convert: a GPUPOOL_TRACE_FILE to the formats other tools
// read (docs/trace.md, "Converting").
//
//   perfetto  Chrome/Perfetto trace-event JSON: a counter track per pool
//             group (active bytes, bytes in blocks, held bytes) and per
//             process totals, which ui.perfetto.dev and chrome://tracing draw
//   rmm       RMM's memory event log (Thread,Time,Action,Pointer,Size,Stream),
//             which RMM's replay benchmark and gpupool's bench_replay read
//
// The whole input is read and checked before anything is written, and the
// output appears under its name only when complete (written beside it,
// then renamed): a bad trace leaves no partial file. Only a regular file of
// the user's is replaced; a device or FIFO is written into, a symbolic link
// or another user's file refused (write_whole).
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "interpose/control/stats_format.hpp"
#include "interpose/control/trace_reader.hpp"
#include "launcher/launcher.hpp"
#include "launcher/trace_tools.hpp"

namespace gpupool::launcher {
namespace {

const char kTraceHelp[] =
    "Usage: gpupool trace convert TRACE --to FORMAT -o OUTPUT\n"
    "\n"
    "Convert a GPUPOOL_TRACE_FILE (docs/trace.md) for other tools.\n"
    "\n"
    "Formats:\n"
    "  perfetto  Chrome/Perfetto trace-event JSON: counter tracks of active,\n"
    "            in-block and held bytes per pool group (open in ui.perfetto.dev\n"
    "            or chrome://tracing)\n"
    "  rmm       RMM's memory event log, CSV: Thread,Time,Action,Pointer,Size,Stream\n"
    "            (RMM's REPLAY_BENCHMARK, gpupool's bench_replay)\n"
    "\n"
    "OUTPUT '-' writes to standard output; an existing regular file of yours is\n"
    "replaced, a device or FIFO written into, a symbolic link or another user's\n"
    "file refused. A trace that is not valid gets one error naming its file and\n"
    "line, and no output.\n";

std::string perfetto(const trace::TraceFile& tr) {
  std::string o = "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":\"gpupool trace\",\"pid\":" +
                  std::to_string(tr.pid) + "},\"traceEvents\":[\n";
  const std::uint64_t pid = tr.pid;
  o += "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + std::to_string(pid) +
       ",\"args\":{\"name\":\"gpupool " + std::to_string(pid) + "\"}}";
  std::map<std::string, Counters> groups;
  SlotSizes slots(tr);
  char buf[64];
  for (const trace::Record& r : tr.records) {
    const std::string& g = tr.arenas[r.arena].group;
    Counters& c = groups[g];
    slots.apply(r, &c);
    // ts in microseconds (the format's unit), to the nanosecond.
    std::snprintf(buf, sizeof buf, "%" PRIu64 ".%03" PRIu64, r.t_ns / 1000, r.t_ns % 1000);
    o += ",\n{\"ph\":\"C\",\"name\":\"" + stats::json_escape("memory " + g) + "\",\"pid\":" +
         std::to_string(pid) + ",\"ts\":" + buf + ",\"args\":{\"active\":" +
         std::to_string(c.active) + ",\"in_blocks\":" + std::to_string(c.in_blocks) +
         ",\"held\":" + std::to_string(c.held) + "}}";
  }
  o += "\n]}\n";
  return o;
}

std::string rmm(const trace::TraceFile& tr) {
  std::string o = "Thread,Time,Action,Pointer,Size,Stream\n";
  std::vector<std::uint64_t> requested(tr.slots);
  char line[160];
  for (const trace::Record& r : tr.records) {
    if (r.alloc) requested[r.slot] = r.requested;
    // RMM writes the wall clock, HH:MM:SS.micro (UTC here).
    const std::uint64_t ns = tr.start_unix_ns + r.t_ns;
    const time_t secs = static_cast<time_t>(ns / 1'000'000'000u);
    struct tm tm;
    gmtime_r(&secs, &tm);
    std::snprintf(line, sizeof line, "%" PRIu64 ",%02d:%02d:%02d.%06" PRIu64 ",%s,0x%" PRIx64
                  ",%" PRIu64 ",0x0\n",
                  tr.threads[r.thread], tm.tm_hour, tm.tm_min, tm.tm_sec, (ns % 1'000'000'000u) / 1000,
                  r.alloc ? "allocate" : "free", r.handle,
                  r.alloc ? r.requested : requested[r.slot]);
    o += line;
  }
  return o;
}

}  // namespace

const char* trace_help() { return kTraceHelp; }

int cmd_trace(int argc, char** argv) {
  if (argc == 0 || is_help(argv[0])) {
    std::fputs(kTraceHelp, argc == 0 ? stderr : stdout);
    return argc == 0 ? kUsage : kOk;
  }
  if (std::string(argv[0]) != "convert")
    return usage_error(std::string("trace: unknown subcommand '") + argv[0] + "'", "trace");
  std::string input, to, output;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (is_help(a)) {
      std::fputs(kTraceHelp, stdout);
      return kOk;
    }
    auto value = [&](std::string* dst) {
      if (i + 1 >= argc) return false;
      *dst = argv[++i];
      return true;
    };
    if (a == "--to" || a == "-t") {
      if (!value(&to)) return usage_error("trace convert: --to needs a format", "trace");
    } else if (a.rfind("--to=", 0) == 0) {
      to = a.substr(5);
    } else if (a == "-o" || a == "--output") {
      if (!value(&output)) return usage_error("trace convert: -o needs a file", "trace");
    } else if (a.rfind("--output=", 0) == 0) {
      output = a.substr(9);
    } else if (!a.empty() && a[0] == '-' && a != "-") {
      return usage_error("trace convert: unknown option '" + a + "'", "trace");
    } else if (input.empty()) {
      input = a;
    } else {
      return usage_error("trace convert: one TRACE at a time ('" + a + "')", "trace");
    }
  }
  if (input.empty()) return usage_error("trace convert: which TRACE?", "trace");
  if (to != "perfetto" && to != "rmm")
    return usage_error("trace convert: --to must be perfetto or rmm" +
                           (to.empty() ? std::string() : " (not '" + to + "')"),
                       "trace");
  if (output.empty()) return usage_error("trace convert: -o OUTPUT is needed ('-': stdout)", "trace");
  trace::TraceFile tr;
  if (!read_trace_for("trace convert", input, &tr)) return kFailed;
  std::string why;
  if (!write_whole(output, to == "perfetto" ? perfetto(tr) : rmm(tr), &why)) {
    std::fprintf(stderr, "%s: trace convert: %s\n", kProg, why.c_str());
    return kFailed;
  }
  return kOk;
}

}  // namespace gpupool::launcher
