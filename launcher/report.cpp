// gpupool report TRACE... -o report.html | --text: where programs' memory
// went. One self-contained page (no network, opens from disk) or text for
// terminals and CI logs: memory over time per pool group, hits and misses
// over time, the sizes asked for, the peaks, and, with allocation sites
// (GPUPOOL_SITES), which call stacks held the most at the peak and what was
// still held at the end, as tables and flame graphs. Several traces (the
// processes of one program: a file and its siblings, a directory) are
// shown each on its own and all together; --diff compares two runs.
//
// This file is the command; report_analysis.cpp computes the figures
// (report_model.hpp), report_page.cpp and report_text.cpp write them.
#include <cstdio>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "launcher/launcher.hpp"
#include "launcher/report_model.hpp"
#include "launcher/site_names.hpp"
#include "launcher/trace_tools.hpp"

namespace gpupool::launcher {
namespace {

const char kReportHelp[] =
    "Usage: gpupool report TRACE... -o OUTPUT.html\n"
    "       gpupool report --text TRACE... [-o OUTPUT]\n"
    "       gpupool report --diff BASE TRACE... [--text] [-o OUTPUT]\n"
    "\n"
    "Where the memory of a program traced with GPUPOOL_TRACE_FILE went\n"
    "(docs/trace.md, \"Report\"): memory over time per pool group, hits and misses\n"
    "over time, the sizes asked for, the peaks, and with allocation sites\n"
    "(GPUPOOL_SITES) the call stacks holding the most memory at the peak and at\n"
    "the end, as tables and flame graphs.\n"
    "\n"
    "TRACE: a trace file, with the files NAME.PID.EXT the program's other\n"
    "processes wrote beside it, or a directory of traces; several may be given.\n"
    "Several processes are shown each on its own and all together.\n"
    "\n"
    "Options:\n"
    "  -o, --output F  where to write ('-': standard output). An existing regular\n"
    "                  file of yours is replaced (its mode kept); a read-only file,\n"
    "                  another user's, a symbolic link, a device or a FIFO refused\n"
    "  --text          text instead of the page: the summary, the peak and what is\n"
    "                  still held at the end by site (the leak list); standard\n"
    "                  output unless -o\n"
    "  --diff BASE     what changed from the run traced in BASE (a trace or a\n"
    "                  directory, as TRACE) to TRACE: peaks, and the sites at the\n"
    "                  peak and at the end, by how much they grew\n"
    "\n"
    "A trace that is not valid gets one error naming its file and line, and no\n"
    "output.\n";

}  // namespace

const char* report_help() { return kReportHelp; }

int cmd_report(int argc, char** argv) {
  if (argc == 0) {
    std::fputs(kReportHelp, stderr);
    return kUsage;
  }
  std::vector<std::string> inputs;
  std::string output, base;
  bool text = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (is_help(a)) {
      std::fputs(kReportHelp, stdout);
      return kOk;
    }
    if (a == "-o" || a == "--output") {
      if (i + 1 >= argc) return usage_error("report: -o needs a file", "report");
      output = argv[++i];
    } else if (a.rfind("--output=", 0) == 0) {
      output = a.substr(9);
    } else if (a == "--text") {
      text = true;
    } else if (a == "--diff" || a == "-d") {
      if (i + 1 >= argc) return usage_error("report: --diff needs the BASE trace", "report");
      base = argv[++i];
    } else if (a.rfind("--diff=", 0) == 0) {
      base = a.substr(7);
    } else if (!a.empty() && a[0] == '-' && a != "-") {
      return usage_error("report: unknown option '" + a + "'", "report");
    } else {
      inputs.push_back(a);
    }
  }
  if (inputs.empty())
    return usage_error(
        base.empty() ? "report: which TRACE?" : "report: --diff BASE: compared with which TRACE?",
        "report");
  if (output.empty() && !text)
    return usage_error("report: -o OUTPUT.html is needed ('-': stdout), or --text", "report");
  if (output.empty()) output = "-";
  // The output is opened first: a name it refuses costs no reading.
  std::string why;
  Output out;
  if (!out.open(output, &why)) {
    say("report", why);
    return kFailed;
  }
  std::vector<trace::TraceFile> base_traces, traces;
  if (!base.empty() && !read_traces_for("report", {base}, &base_traces)) return kFailed;
  if (!read_traces_for("report", inputs, &traces)) return kFailed;
  try {
    std::vector<std::unique_ptr<Namer>> namers;
    const report::Report now = report::analyse(traces, &namers);
    if (base.empty()) {
      out.put(text ? terminal_text(report::text(now)) : report::page(now));
    } else {
      const report::Report before = report::analyse(base_traces, &namers);
      out.put(text ? terminal_text(report::diff_text(before, now))
                   : report::diff_page(before, now));
    }
  } catch (const std::bad_alloc&) {
    say("report", "out of memory; nothing written");
    return kFailed;
  }
  if (!out.commit(&why)) {
    say("report", why);
    return kFailed;
  }
  return kOk;
}

}  // namespace gpupool::launcher
