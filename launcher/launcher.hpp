// The launcher's shared pieces: exit codes, usage errors, and the commands
// each file implements (main.cpp dispatches).
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "observe/text_width.hpp"
#include "wire/registry.hpp"

namespace gpupool::launcher {

using observe::kTextColumns;
using observe::shorten_middle;
using observe::text_columns;
using observe::wrap_text;

// Exit codes of the PID commands (documented in --help and docs/c-api.md),
// and report's CI gates (its help, docs/trace.md); each code means one thing
// whichever command returns it.
enum Exit : int {
  kOk = 0,
  kFailed = 1,      // the process answered with an error, or an I/O error
  kUsage = 2,       // bad command line
  kNoProcess = 3,   // no such process
  kNotGpupool = 4,  // the process does not have libgpupool loaded
  kIdle = 5,        // loaded, but no GPU call yet: control not started
  kDenied = 6,      // another user's process
  kTimeout = 7,     // no answer in time (stopped or busy process)
  kLeaked = 8,      // report --fail-on-leak: memory still held at the end
  kPeakGrew = 9,    // report --fail-if-peak-grows: the peak grew past the limit
};

inline constexpr const char* kProg = "gpupool";

int usage_error(const std::string& msg, const char* cmd = nullptr);

// `s` made safe for a terminal: control characters (but newline and tab),
// DEL, C1 controls and bytes that are not UTF-8 written out as \xNN, so
// that a string from a trace, a file name or another process cannot drive
// the terminal (an ESC sequence, a BEL). What the launcher prints goes
// through it: say(), usage_error(), text outputs.
std::string terminal_text(std::string_view s);
// `s` as a JSON string, quotes included (what --json writes).
std::string json_string(std::string_view s);
// "gpupool: CMD: what" on standard error (terminal_text).
void say(const char* cmd, const std::string& what);
inline bool is_help(const std::string& a) { return a == "-h" || a == "--help"; }

// run.cpp: gpupool run
int cmd_run(int argc, char** argv);
std::string run_help();
// talk.cpp: gpupool stats | free-held | stop-holding PID
int cmd_pid(const std::string& cmd, int argc, char** argv);
const char* pid_help(const std::string& cmd);  // nullptr: not a PID command
// node.cpp: gpupool ps, and the registry free-held --all reads
int cmd_ps(int argc, char** argv);
const char* ps_help();
std::string registry_path();
// trace.cpp: gpupool trace convert
int cmd_trace(int argc, char** argv);
const char* trace_help();
bool registry_processes(std::vector<wire::ProcessEntry>* out);
// report.cpp: gpupool report
int cmd_report(int argc, char** argv);
const char* report_help();

}  // namespace gpupool::launcher
