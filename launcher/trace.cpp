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
// output appears under its name only when complete (written beside it as
// it goes, then renamed): a bad trace leaves no partial file. Only a regular
// file of the user's that is not read-only is replaced; anything else is
// refused (write_whole).
#include <stdio.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "launcher/launcher.hpp"
#include "launcher/trace_tools.hpp"
#include "observe/stats_format.hpp"
#include "observe/trace_reader.hpp"
#include "sys/outputs.hpp"

namespace gpupool::launcher {
namespace {

const char kTraceHelp[] =
    "Usage: gpupool trace convert TRACE... --to FORMAT -o OUTPUT\n"
    "\n"
    "Convert GPUPOOL_TRACE_FILE traces (docs/trace.md) for other tools. TRACE: a\n"
    "file (with the files NAME.PID.EXT the program's other processes wrote beside\n"
    "it), or a directory of traces; several may be given.\n"
    "\n"
    "Formats:\n"
    "  perfetto  Chrome/Perfetto trace-event JSON: counter tracks of active,\n"
    "            in-block and held bytes per pool group, a process per trace\n"
    "            (open in ui.perfetto.dev or chrome://tracing)\n"
    "  rmm       RMM's memory event log, CSV: Thread,Time,Action,Pointer,Size,Stream\n"
    "            (RMM's REPLAY_BENCHMARK, gpupool's bench_replay); one log per\n"
    "            process: with several, OUTPUT.PID.EXT for each\n"
    "\n"
    "OUTPUT '-' writes to standard output; an existing regular file of yours is\n"
    "replaced (its mode kept), a character device (/dev/null) written; a read-only\n"
    "file, another user's, a symbolic link, a block device or a FIFO refused. A\n"
    "trace that is not valid gets one error naming its file and line, and no\n"
    "output.\n";

// The process's name in Perfetto: its command line where the trace has it.
std::string process_name(const trace::TraceFile& tr) {
  std::string name = tr.cmdline.empty() ? "gpupool" : tr.cmdline;
  if (name.size() > 120) name = name.substr(0, 117) + "...";
  return name + " (" + std::to_string(tr.pid) + ")";
}

// Each trace a process of its own, on one clock: microseconds since the
// earliest trace started.
bool perfetto(const std::vector<trace::TraceFile>& traces, Output* out) {
  std::uint64_t t0 = UINT64_MAX;
  for (const trace::TraceFile& tr : traces) t0 = std::min(t0, tr.start_unix_ns);
  std::uint64_t pid0 = traces.size() == 1 ? traces[0].pid : 0;
  std::string o = "{\"displayTimeUnit\":\"ns\",\"otherData\":{\"source\":\"gpupool trace\"" +
                  (traces.size() == 1 ? ",\"pid\":" + std::to_string(pid0) : std::string()) +
                  "},\"traceEvents\":[\n";
  bool first = true;
  char buf[96];
  for (const trace::TraceFile& tr : traces) {
    const std::uint64_t offset = tr.start_unix_ns - t0;
    const std::string pid = std::to_string(tr.pid);
    o += std::string(first ? "" : ",\n") +
         "{\"ph\":\"M\",\"name\":\"process_name\",\"pid\":" + pid + ",\"args\":{\"name\":" + "\"" +
         stats::json_escape(process_name(tr)) + "\"}}";
    first = false;
    // The counters' names, quoted once per group.
    std::vector<std::string> names(tr.arenas.size());
    std::map<std::string, Counters> groups;
    std::vector<Counters*> counters(tr.arenas.size());
    for (std::size_t a = 0; a < tr.arenas.size(); ++a) {
      names[a] = ",\n{\"ph\":\"C\",\"name\":\"" +
                 stats::json_escape("memory " + tr.arenas[a].group) + "\",\"pid\":" + pid +
                 ",\"ts\":";
      counters[a] = &groups[tr.arenas[a].group];
    }
    SlotSizes slots(tr);
    for (const trace::Record& r : tr.records) {
      Counters& c = *counters[r.arena];
      slots.apply(r, &c);
      const std::uint64_t t = r.t_ns + offset;
      // ts in microseconds (the format's unit), to the nanosecond.
      const int n = std::snprintf(
          buf, sizeof buf, "%" PRIu64 ".%03" PRIu64 ",\"args\":{\"active\":", t / 1000, t % 1000);
      o += names[r.arena];
      o.append(buf, static_cast<std::size_t>(n));
      o += std::to_string(c.active);
      o += ",\"in_blocks\":";
      o += std::to_string(c.in_blocks);
      o += ",\"held\":";
      o += std::to_string(c.held);
      o += "}}";
      if (o.size() > (1u << 20)) {
        if (!out->put(o)) return false;
        o.clear();
      }
    }
  }
  o += "\n]}\n";
  return out->put(o);
}

bool rmm(const trace::TraceFile& tr, Output* out) {
  std::string o = "Thread,Time,Action,Pointer,Size,Stream\n";
  std::vector<std::uint64_t> requested(tr.slots);
  char line[160];
  // gmtime per record was most of the time: the seconds' text is kept.
  std::uint64_t text_secs = UINT64_MAX;
  char hms[16] = "";
  for (const trace::Record& r : tr.records) {
    if (r.alloc) requested[r.slot] = r.requested;
    // RMM writes the wall clock, HH:MM:SS.micro (UTC here).
    const std::uint64_t ns = tr.start_unix_ns + r.t_ns;
    if (ns / 1'000'000'000u != text_secs) {
      text_secs = ns / 1'000'000'000u;
      const time_t secs = static_cast<time_t>(text_secs);
      struct tm tm;
      gmtime_r(&secs, &tm);
      std::snprintf(hms, sizeof hms, "%02d:%02d:%02d", tm.tm_hour, tm.tm_min, tm.tm_sec);
    }
    const int n = std::snprintf(
        line, sizeof line, "%" PRIu64 ",%s.%06" PRIu64 ",%s,0x%" PRIx64 ",%" PRIu64 ",0x0\n",
        tr.threads[r.thread], hms, (ns % 1'000'000'000u) / 1000, r.alloc ? "allocate" : "free",
        r.handle, r.alloc ? r.requested : requested[r.slot]);
    o.append(line, static_cast<std::size_t>(n));
    if (o.size() > (1u << 20)) {
      if (!out->put(o)) return false;
      o.clear();
    }
  }
  return out->put(o);
}

// Writes the traces in format `to` (read and checked) to `output`.
int convert(const std::vector<trace::TraceFile>& traces, const std::string& to,
            const std::string& output) {
  auto failed = [](const std::string& why) {
    say("trace convert", why);
    return kFailed;
  };
  std::string why;
  if (to == "perfetto" || traces.size() == 1) {
    Output out;
    if (!out.open(output, &why)) return failed(why);
    if (to == "perfetto" ? !perfetto(traces, &out) : !rmm(traces[0], &out)) {
      out.commit(&why);  // says why the write failed
      return failed(why);
    }
    return out.commit(&why) ? kOk : failed(why);
  }
  // RMM's log is one process's (its pointers are that process's): a log
  // per process, OUTPUT.PID.EXT. All are opened before any is written.
  if (output == "-")
    return failed(std::to_string(traces.size()) +
                  " processes: an RMM log is one process's; name an OUTPUT file (each process's "
                  "log is OUTPUT.PID.EXT)");
  std::vector<std::string> names;
  for (const trace::TraceFile& tr : traces) {
    names.push_back(io::sibling_path(output, static_cast<long>(tr.pid)));
    if (std::count(names.begin(), names.end(), names.back()) > 1)
      return failed("two traces of pid " + std::to_string(tr.pid) + " (" + tr.path +
                    "): convert them one at a time");
  }
  std::vector<std::unique_ptr<Output>> outs;
  for (const std::string& name : names) {
    outs.push_back(std::make_unique<Output>());
    if (!outs.back()->open(name, &why)) return failed(why);
  }
  for (std::size_t k = 0; k < traces.size(); ++k) {
    if (!rmm(traces[k], outs[k].get())) {
      outs[k]->commit(&why);  // says why the write failed
      return failed(why);
    }
  }
  std::string list;
  for (std::size_t k = 0; k < traces.size(); ++k) {
    if (!outs[k]->commit(&why)) return failed(why);
    list += (k ? ", " : "") + names[k];
  }
  say("trace convert", "wrote " + list);
  return kOk;
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
  std::vector<std::string> inputs;
  std::string to, output;
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
    } else {
      inputs.push_back(a);
    }
  }
  if (inputs.empty()) return usage_error("trace convert: which TRACE?", "trace");
  if (to != "perfetto" && to != "rmm")
    return usage_error("trace convert: --to must be perfetto or rmm" +
                           (to.empty() ? std::string() : " (not '" + to + "')"),
                       "trace");
  if (output.empty())
    return usage_error("trace convert: -o OUTPUT is needed ('-': stdout)", "trace");
  std::vector<trace::TraceFile> traces;
  if (!read_traces_for("trace convert", inputs, &traces)) return kFailed;
  try {
    return convert(traces, to, output);
  } catch (const std::bad_alloc&) {
    say("trace convert", "out of memory; nothing written");
    return kFailed;
  }
}

}  // namespace gpupool::launcher
