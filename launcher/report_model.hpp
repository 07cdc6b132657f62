// What `gpupool report` computes from traces (report_analysis.cpp), and the two ways
// it is written: the HTML page (report_page.cpp) and text for terminals
// and CI logs, with the difference between two runs (report_text.cpp).
//
// A View is one process's trace, or several processes' together on one
// clock (the earliest trace's start); every figure in it is exact except
// the plotted series, downsampled to kPoints points, each its interval's
// maximum. The kTopGroups pool groups with the largest peaks are shown each
// on its own, the others summed up as one.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "launcher/trace_tools.hpp"
#include "observe/bytes.hpp"

namespace gpupool::launcher {
struct NamedSite;
class Namer;
}  // namespace gpupool::launcher

namespace gpupool::launcher::report {

inline constexpr std::size_t kPoints = 2000;      // per plotted series
inline constexpr std::size_t kRateBuckets = 200;  // hits and misses over time
inline constexpr std::size_t kTopSites = 20;      // rows a table shows
inline constexpr std::size_t kTopGroups = 10;     // pool groups shown each on its own

struct Peak {
  std::uint64_t bytes = 0, t_ns = 0;
};

struct Held {
  std::uint64_t blocks = 0, bytes = 0;
};

// A pool group's figures, or the other groups' (past the kTopGroups that
// held the most) together: exact for them as one group.
struct Group {
  std::string name;
  std::size_t others = 0;  // the groups summed up here; 0: one group
  Counters c;              // at the end
  Peak peak_active, peak_managed;
  std::uint64_t allocs = 0, hits = 0;
  // The plotted series, only where the level moves (a group's points grow
  // with its records, not with the plot's width): from bucket at[j] on,
  // that bucket's maximum, then the level it ends at until the next.
  std::vector<std::uint32_t> at;
  std::vector<std::uint64_t> active, in_blocks, managed;
};

// An allocation site as tables show it.
struct SiteName {
  std::string label;
  std::vector<std::string> frames;  // innermost first, Python first
  std::vector<std::string> flame;   // the flame graph's path, outermost first
  std::string key;                  // label and frames: what rows merge on
  std::string across_builds;        // key without offsets and line numbers (diff)
};

// A row of a sites table: what one site held, in one arena (the end, one
// process), one pool group (the end, several processes) or in all.
struct SiteRow {
  std::uint32_t name = 0;  // index into View::names
  std::string group, arena;
  std::vector<std::uint64_t> pids;  // several processes: those that held it
  Held held;
};

// An icicle's node: bytes (and blocks) held below it; nodes in pre-order,
// each after its parent; name indexes Flame::names.
struct FlameNode {
  std::uint32_t name = 0, parent = 0;
  std::uint64_t bytes = 0, blocks = 0;
};
struct Flame {
  std::vector<std::string> names;
  std::vector<FlameNode> nodes;  // nodes[0]: the root (everything)
};

// The moment of the peak of active bytes (all groups together), or the end.
struct Moment {
  Peak at;
  Held total;
  std::vector<SiteRow> rows;  // largest first
  Flame flame;
};

struct View {
  // One process: its trace. Several: pid 0, and `processes` are theirs.
  std::uint64_t pid = 0;
  std::string cmdline, path;
  std::uint64_t start_unix_ns = 0, offset_ns = 0;  // offset: from the earliest trace's start
  std::uint64_t duration_ns = 0, allocations = 0, frees = 0, hits = 0;
  std::uint64_t outside = 0;   // allocations a driver's memory pool served ('d')
  std::uint64_t unpooled = 0;  // allocations an implementation served alone ('d', unpooled)
  bool sites_recorded = false;
  // One process whose trace has no end record: it ended without closing it
  // (a kill, or an exit that went around libc's _exit).
  bool unclosed = false;
  std::uint64_t span_ns = 1;  // of the plots' time axis
  std::size_t points = 0;     // per plotted series
  std::vector<Group> groups;
  std::vector<std::uint64_t> rate_hits, rate_misses;
  std::map<int, std::pair<std::uint64_t, std::uint64_t>> sizes;  // log2 -> count, bytes (-1: zero)
  std::vector<SiteName> names;
  Moment peak, end;
  // Several processes: all processes' active bytes over time, and the
  // kProcessLines processes with the largest peaks', in the order they
  // started (bucket maxima).
  std::vector<std::uint64_t> total_active;
  struct Series {
    std::uint64_t pid = 0, peak = 0;
    std::vector<std::uint64_t> v;
  };
  std::vector<Series> process_active;
};

inline constexpr std::size_t kProcessLines = 10;

struct Report {
  std::vector<std::string> files;
  View all;                     // everything together (with one process, that process)
  std::vector<View> processes;  // each process (empty with one)
};

// The figures of a set of traces: each process's, and all together
// (report_analysis.cpp). namers: one per trace, named on the way.
Report analyse(const std::vector<trace::TraceFile>& traces,
               std::vector<std::unique_ptr<Namer>>* namers);

// The flame graphs (report_flame.cpp). A site's path, outermost first.
std::vector<std::string> flame_path(const NamedSite& n);
// A site's key with offsets and line numbers left out, to match it in
// another build of the program.
std::string across_builds(const std::string& key);
// The icicle of rows' bytes by their sites' flame paths.
Flame flame_of(const std::vector<SiteName>& names, const std::vector<SiteRow>& rows);

// A site's bytes at one moment in two runs, matched across builds
// (SiteName::across_builds). name_now / name_base: View::names indexes,
// UINT32_MAX where the site is not in that run.
struct SiteChange {
  std::uint32_t name_now = UINT32_MAX, name_base = UINT32_MAX;
  Held base, now;
  std::int64_t change() const { return static_cast<std::int64_t>(now.bytes - base.bytes); }
};
// Largest change first (growth before shrinking at equal size); unchanged
// sites left out.
std::vector<SiteChange> changes(const View& base, const Moment& at_base, const View& now,
                                const Moment& at_now);

// The page's style sheet and script (report_script.cpp); kReportMain and
// kDiffMain start the script on a report's or a diff's data.
extern const char kStyle[];
extern const char kScript[];
extern const char kReportMain[];
extern const char kDiffMain[];

// The page, its data as one JSON document (report --json, docs/trace.md)
// and the text (report_page.cpp, report_text.cpp).
std::string page(const Report& r);
std::string json(const Report& r);
std::string diff_json(const Report& base, const Report& now);
std::string text(const Report& r);
std::string diff_text(const Report& base, const Report& now);
std::string diff_page(const Report& base, const Report& now);

// Shared by both.
inline std::string num(std::uint64_t v) { return std::to_string(v); }
using observe::bytes_text;  // one decimal: "1.5 KiB"
std::string seconds_text(std::uint64_t ns);
// The first eight pids of a row, "42<separator>43 and 5 more".
std::string pids_list(const std::vector<std::uint64_t>& pids, const char* separator);
// What the rows past the kTopSites largest hold together.
Held rest_of(const Moment& m);
// "14 allocations, 10 frees over 317 µs; 35% served from held blocks."
std::string summary_text(const View& v);
// A run as the diff names it: its trace, or "3 processes (first, ...)".
std::string runs_title(const Report& r);
// "python3 train.py (pid 42)", or "pid 42" where the trace has no command line.
std::string process_title(const View& v);
// What a process whose trace has no end is said to be ("" for the others).
std::string unclosed_text(const View& v);

}  // namespace gpupool::launcher::report
