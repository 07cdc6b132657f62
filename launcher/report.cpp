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
#include <cmath>
#include <cstdio>
#include <cstdlib>
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
    "       gpupool report --text TRACE... [-o OUTPUT] [--fail-on-leak]\n"
    "       gpupool report --json TRACE... [-o OUTPUT] [--fail-on-leak]\n"
    "       gpupool report --diff BASE TRACE... [--text | --json] [-o OUTPUT]\n"
    "                      [--fail-on-leak] [--fail-if-peak-grows PERCENT]\n"
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
    "                  file of yours is replaced (its mode kept), a character device\n"
    "                  (/dev/null) written; a read-only file, another user's, a\n"
    "                  symbolic link, a block device or a FIFO refused\n"
    "  --text          text instead of the page: the summary, the peak and what is\n"
    "                  still held at the end by site (the leak list); standard\n"
    "                  output unless -o\n"
    "  --json          the page's figures as one JSON document (docs/trace.md,\n"
    "                  \"JSON\"); standard output unless -o\n"
    "  --diff BASE     what changed from the run traced in BASE (a trace or a\n"
    "                  directory, as TRACE) to TRACE: peaks, and the sites at the\n"
    "                  peak and at the end, by how much they grew\n"
    "\n"
    "Gates for CI, checked after the report is written, each with one line on\n"
    "standard error when it fails:\n"
    "  --fail-on-leak  exit 8 when memory is still held at the end of TRACE (its\n"
    "                  processes' blocks never freed)\n"
    "  --fail-if-peak-grows PERCENT\n"
    "                  with --diff: exit 9 when TRACE's peak of active memory is\n"
    "                  more than PERCENT (a number, 0 or more) above BASE's\n"
    "Both failing: 8. Otherwise 0 on success, 1 an unreadable trace or output,\n"
    "2 usage error.\n"
    "\n"
    "A trace that is not valid gets one error naming its file and line, and no\n"
    "output.\n";

// --fail-if-peak-grows's PERCENT: a finite number, 0 or more.
bool parse_percent(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (*end != '\0' || !std::isfinite(v) || v < 0) return false;
  *out = v;
  return true;
}

}  // namespace

const char* report_help() { return kReportHelp; }

int cmd_report(int argc, char** argv) {
  if (argc == 0) {
    std::fputs(kReportHelp, stderr);
    return kUsage;
  }
  std::vector<std::string> inputs;
  std::string output, base;
  bool text = false, json = false, fail_on_leak = false, gate_peak = false;
  double peak_percent = 0;
  auto set_percent = [&](const std::string& v) {
    gate_peak = parse_percent(v, &peak_percent);
    return gate_peak ? kOk
                     : usage_error("report: --fail-if-peak-grows: '" + v +
                                       "' is not a percentage (a number, 0 or more)",
                                   "report");
  };
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
    } else if (a == "--json") {
      json = true;
    } else if (a == "--diff" || a == "-d") {
      if (i + 1 >= argc) return usage_error("report: --diff needs the BASE trace", "report");
      base = argv[++i];
    } else if (a.rfind("--diff=", 0) == 0) {
      base = a.substr(7);
    } else if (a == "--fail-on-leak") {
      fail_on_leak = true;
    } else if (a == "--fail-if-peak-grows") {
      if (i + 1 >= argc)
        return usage_error("report: --fail-if-peak-grows needs a PERCENT", "report");
      if (const int rc = set_percent(argv[++i]); rc != kOk) return rc;
    } else if (a.rfind("--fail-if-peak-grows=", 0) == 0) {
      if (const int rc = set_percent(a.substr(21)); rc != kOk) return rc;
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
  if (gate_peak && base.empty())
    return usage_error("report: --fail-if-peak-grows compares with --diff BASE: which BASE?",
                       "report");
  if (text && json) return usage_error("report: --text or --json, not both", "report");
  if (output.empty() && !text && !json)
    return usage_error("report: -o OUTPUT.html is needed ('-': stdout), or --text or --json",
                       "report");
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
  report::Held leaked;
  report::Peak peak_before, peak_now;
  try {
    std::vector<std::unique_ptr<Namer>> namers;
    const report::Report now = report::analyse(traces, &namers);
    leaked = now.all.end.total;  // together: each process's blocks never freed
    peak_now = now.all.peak.at;
    if (base.empty()) {
      out.put(text   ? observe::fit_lines(terminal_text(report::text(now)))
              : json ? report::json(now) + "\n"
                     : report::page(now));
    } else {
      const report::Report before = report::analyse(base_traces, &namers);
      peak_before = before.all.peak.at;
      out.put(text   ? observe::fit_lines(terminal_text(report::diff_text(before, now)))
              : json ? report::diff_json(before, now) + "\n"
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
  // The gates, after the report is written: CI keeps the report that failed.
  int rc = kOk;
  if (gate_peak && peak_now.bytes > peak_before.bytes) {
    // Growth from nothing is growth past any PERCENT.
    const double grew = peak_before.bytes
                            ? 100.0 * static_cast<double>(peak_now.bytes - peak_before.bytes) /
                                  static_cast<double>(peak_before.bytes)
                            : HUGE_VAL;
    if (grew > peak_percent) {
      char pct[64] = "";
      if (peak_before.bytes)
        std::snprintf(pct, sizeof pct, " (%+.1f%%), more than %g%%", grew, peak_percent);
      say("report", "the peak of active memory grew from " + report::bytes_text(peak_before.bytes) +
                        " to " + report::bytes_text(peak_now.bytes) + pct +
                        " (--fail-if-peak-grows)");
      rc = kPeakGrew;
    }
  }
  if (fail_on_leak && leaked.bytes + leaked.blocks > 0) {
    say("report", report::bytes_text(leaked.bytes) + " in " + std::to_string(leaked.blocks) +
                      (leaked.blocks == 1 ? " block" : " blocks") +
                      " still held at the end, never freed (--fail-on-leak)");
    rc = kLeaked;
  }
  return rc;
}

}  // namespace gpupool::launcher
