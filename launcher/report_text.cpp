// `gpupool report --text`: the report for terminals and CI logs (the
// summary, the peaks, the sites at the peak and what is still held at the
// end, with their stacks: the leak list), and `--diff BASE`'s comparison
// of two runs, as text.
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <unordered_map>

#include "launcher/report_model.hpp"
#include "observe/text_width.hpp"

namespace gpupool::launcher::report {
namespace {

using observe::kTextColumns;
using observe::shorten_middle;

constexpr std::size_t kStackFrames = 8;    // frames a leak row shows
constexpr std::size_t kRowIndent = 29;     // a site row's label, and its stack, start here
constexpr std::size_t kTextProcesses = 8;  // shown each on its own

std::string pad_left(const std::string& s, std::size_t w) {
  // Width in characters (µ is two bytes).
  std::size_t chars = 0;
  for (unsigned char c : s) chars += (c & 0xc0) != 0x80;
  return chars >= w ? s : std::string(w - chars, ' ') + s;
}

std::string pad_right(const std::string& s, std::size_t w) {
  return s.size() >= w ? s : s + std::string(w - s.size(), ' ');
}

std::string blocks_text(std::uint64_t n) { return num(n) + (n == 1 ? " block" : " blocks"); }

std::string signed_bytes(std::int64_t d) {
  if (d == 0) return "0 B";
  return (d > 0 ? "+" : "-") + bytes_text(static_cast<std::uint64_t>(d > 0 ? d : -d));
}

// Columns padded to their widest cell; right-aligned but the first.
std::string table(const std::vector<std::vector<std::string>>& cells) {
  std::vector<std::size_t> w;
  auto width = [](const std::string& s) {
    std::size_t chars = 0;
    for (unsigned char c : s) chars += (c & 0xc0) != 0x80;
    return chars;
  };
  for (const auto& row : cells)
    for (std::size_t c = 0; c < row.size(); ++c) {
      if (w.size() <= c) w.push_back(0);
      w[c] = std::max(w[c], width(row[c]));
    }
  // Too wide for kTextColumns (a long first cell: a pool group named by a
  // GPU's UUID): each row's first cell on a line of its own, above the rest.
  std::size_t total = 0;
  for (std::size_t c = 0; c < w.size(); ++c) total += 2 + w[c];
  const bool apart = total > kTextColumns && !w.empty();
  if (apart) w[0] = 0;
  std::string o;
  for (const auto& row : cells) {
    std::string line;
    if (apart && !row.empty()) o += "  " + row[0] + "\n";
    for (std::size_t c = 0; c < row.size(); ++c)
      line += "  " + (c       ? pad_left(row[c], w[c])
                      : apart ? std::string()
                              : row[c] + std::string(w[c] - width(row[c]), ' '));
    while (!line.empty() && line.back() == ' ') line.pop_back();
    o += line + "\n";
  }
  return o;
}

std::string peaks(const View& v) {
  std::vector<std::vector<std::string>> cells = {{"pool group", "peak active", "at", "peak managed",
                                                  "at", "allocations", "hits", "active at end"}};
  for (const Group& g : v.groups)
    cells.push_back({g.name, bytes_text(g.peak_active.bytes), seconds_text(g.peak_active.t_ns),
                     bytes_text(g.peak_managed.bytes), seconds_text(g.peak_managed.t_ns),
                     num(g.allocs), num(g.hits), bytes_text(g.c.active)});
  std::string o = "Peaks:\n" + table(cells);
  if (!v.groups.empty() && v.groups.back().others)
    o += "  (" + v.groups.back().name + ": the groups past the " + num(kTopGroups) +
         " with the largest peaks, as one.)\n";
  return o;
}

// The rows of a moment: the kTopSites largest, then the rest summed up;
// with the stacks (the leak list) when `stacks`.
std::string rows(const View& v, const Moment& m, bool at_end, bool several, bool stacks) {
  std::string o;
  for (std::size_t k = 0; k < m.rows.size() && k < kTopSites; ++k) {
    const SiteRow& row = m.rows[k];
    const SiteName& n = v.names[row.name];
    const std::size_t room = kTextColumns - kRowIndent;
    const std::string label = shorten_middle(n.label, room);
    o += "  " + pad_left(bytes_text(row.held.bytes), 10) + "  " +
         pad_left(blocks_text(row.held.blocks), 11) + "  " + label;
    std::string where;
    if (at_end) where = row.group + (row.arena.empty() ? "" : " " + row.arena);
    if (several)
      where += (where.empty() ? "" : ", ") + std::string(row.pids.size() == 1 ? "pid " : "pids ") +
               pids_list(row.pids, ",");
    // Beside the label when there is room, else on a line of its own.
    if (!where.empty() && observe::text_columns(label + where) + 4 <= room)
      o += "  [" + where + "]";
    else if (!where.empty())
      o += "\n" + std::string(kRowIndent, ' ') + "[" + shorten_middle(where, room - 2) + "]";
    o += "\n";
    if (stacks) {
      for (std::size_t f = 0; f < n.frames.size() && f < kStackFrames; ++f)
        o += std::string(kRowIndent, ' ') + shorten_middle(n.frames[f], room) + "\n";
      if (n.frames.size() > kStackFrames)
        o += std::string(kRowIndent, ' ') + "... " + num(n.frames.size() - kStackFrames) +
             " more frames\n";
    }
  }
  if (m.rows.size() > kTopSites) {
    const Held rest = rest_of(m);
    o += "  " + num(m.rows.size() - kTopSites) + " more rows hold " + bytes_text(rest.bytes) +
         " in " + num(rest.blocks) + " blocks.\n";
  }
  return o;
}

std::string view_text(const View& v, bool several) {
  std::string o = summary_text(v) + "\n\n" + peaks(v) + "\n";
  if (!v.sites_recorded && (!v.peak.rows.empty() || !v.end.rows.empty()))
    o += "No call stacks in this trace: record them with GPUPOOL_SITES=all (or a sampling "
         "rate).\n\n";
  o += "At the peak of active memory (" + bytes_text(v.peak.at.bytes) + " at " +
       seconds_text(v.peak.at.t_ns) + "), by allocation site:\n";
  o += v.peak.rows.empty() ? "  nothing\n" : rows(v, v.peak, false, several, false);
  // Together, each process's end: what it never freed.
  o += std::string(several ? "\nStill held at each process's end (" : "\nStill held at the end (") +
       bytes_text(v.end.total.bytes) + " in " + blocks_text(v.end.total.blocks) +
       "), by allocation site, largest first:\n";
  o += v.end.rows.empty() ? "  nothing\n" : rows(v, v.end, true, several, true);
  return o;
}

}  // namespace

// A time since the trace started, in the unit that suits it (as the
// page's script writes them).
std::string seconds_text(std::uint64_t ns) {
  char buf[32];
  const double v = static_cast<double>(ns);
  if (ns == 0) return "0 s";
  if (ns < 1'000) return std::to_string(ns) + " ns";
  if (ns < 1'000'000) std::snprintf(buf, sizeof buf, "%.*f µs", ns < 10'000 ? 1 : 0, v / 1e3);
  else if (ns < 1'000'000'000)
    std::snprintf(buf, sizeof buf, "%.*f ms", ns < 10'000'000 ? 2 : 1, v / 1e6);
  else std::snprintf(buf, sizeof buf, "%.*f s", ns < 10'000'000'000 ? 2 : 1, v / 1e9);
  return buf;
}

std::string pids_list(const std::vector<std::uint64_t>& pids, const char* separator) {
  std::string o;
  for (std::size_t k = 0; k < pids.size() && k < 8; ++k) o += (k ? separator : "") + num(pids[k]);
  if (pids.size() > 8) o += " and " + num(pids.size() - 8) + " more";
  return o;
}

Held rest_of(const Moment& m) {
  Held rest;
  for (std::size_t k = kTopSites; k < m.rows.size(); ++k) {
    rest.blocks += m.rows[k].held.blocks;
    rest.bytes += m.rows[k].held.bytes;
  }
  return rest;
}

// Allocations gpupool did not serve count apart: stream-ordered ones,
// which the driver's memory pools serve (whether one reused memory is not
// known: docs/trace.md), and a forked child's OpenCL buffers, which the
// implementation makes alone.
std::string summary_text(const View& v) {
  const std::uint64_t pooled = v.allocations - v.outside - v.unpooled;
  std::string apart;
  if (v.outside) apart = num(v.outside) + " stream-ordered, served by the driver's memory pools";
  if (v.unpooled)
    apart += (apart.empty() ? "" : "; ") + num(v.unpooled) +
             " made by the OpenCL implementation alone, in a forked child";
  std::string s = num(v.allocations) + " allocations, " + num(v.frees) + " frees over " +
                  seconds_text(v.duration_ns) + "; ";
  if (!apart.empty() && !pooled) return s + apart + ".";
  s += (pooled ? num(v.hits * 100 / pooled) : std::string("0")) + "% served from held blocks";
  if (!apart.empty()) s += " (of " + num(pooled) + " gpupool served; " + apart + ")";
  return s + ".";
}

std::string text(const Report& r) {
  std::string o;
  if (r.processes.empty()) {
    o = "gpupool report: " + process_title(r.all) + "\n" + r.all.path + ": " +
        view_text(r.all, false);
    o += "\nFrameworks keep memory until exit on purpose: a cache or a model's weights still held "
         "at the end\nis not a leak.\n";
    return o;
  }
  o = "gpupool report: " + num(r.processes.size()) + " processes\n\n";
  for (const View& p : r.processes)
    o += "  pid " + pad_right(num(p.pid), 8) + " started +" +
         pad_right(seconds_text(p.offset_ns), 9) + " peak " +
         pad_left(bytes_text(p.peak.at.bytes), 10) + ", at the end " +
         pad_left(bytes_text(p.end.total.bytes), 10) + "\n      " +
         (p.cmdline.empty() ? "" : p.cmdline + "  ") + "(" + p.path + ")" +
         (p.unclosed ? "  " + unclosed_text(p) : "") + "\n";
  o += "\n== All processes (times from the first trace's start)\n" + view_text(r.all, true);
  if (r.processes.size() > kTextProcesses)
    o += "\n(Each process on its own is left out with more than " + num(kTextProcesses) +
         " processes: `gpupool report --text FILE` shows one.)\n";
  else
    for (const View& p : r.processes)
      o += "\n== " + process_title(p) + "\n" + p.path + ": " + view_text(p, false);
  o += "\nFrameworks keep memory until exit on purpose: a cache or a model's weights still held at "
       "the end\nis not a leak.\n";
  return o;
}

std::vector<SiteChange> changes(const View& base, const Moment& at_base, const View& now,
                                const Moment& at_now) {
  std::vector<SiteChange> out;
  std::unordered_map<std::string, std::size_t> index;
  auto add = [&](const View& v, const Moment& m, bool is_now) {
    for (const SiteRow& row : m.rows) {
      auto [it, fresh] = index.try_emplace(v.names[row.name].across_builds, out.size());
      if (fresh) out.emplace_back();
      SiteChange& c = out[it->second];
      Held& h = is_now ? c.now : c.base;
      (is_now ? c.name_now : c.name_base) = row.name;
      h.blocks += row.held.blocks;
      h.bytes += row.held.bytes;
    }
  };
  add(base, at_base, false);
  add(now, at_now, true);
  out.erase(
      std::remove_if(out.begin(), out.end(), [](const SiteChange& c) { return c.change() == 0; }),
      out.end());
  std::stable_sort(out.begin(), out.end(), [](const SiteChange& a, const SiteChange& b) {
    const std::int64_t x = std::llabs(a.change()), y = std::llabs(b.change());
    return x != y ? x > y : a.change() > b.change();
  });
  return out;
}

namespace {

// The two runs' totals, with the change.
std::string diff_totals(const View& b, const View& n) {
  std::string o = "                         before         after        change\n";
  auto line = [&](const std::string& what, std::uint64_t x, std::uint64_t y, bool bytes) {
    const std::int64_t d = static_cast<std::int64_t>(y - x);
    std::string change = bytes ? signed_bytes(d) : (d > 0 ? "+" : "") + std::to_string(d);
    if (x && d) {
      char pct[32];
      std::snprintf(pct, sizeof pct, " (%+.0f%%)",
                    100.0 * static_cast<double>(d) / static_cast<double>(x));
      change += pct;
    }
    o += "  " + pad_right(what, 20) + pad_left(bytes ? bytes_text(x) : num(x), 11) + "  " +
         pad_left(bytes ? bytes_text(y) : num(y), 12) + "  " + pad_left(change, 12) + "\n";
  };
  line("peak active", b.peak.at.bytes, n.peak.at.bytes, true);
  line("held at the end", b.end.total.bytes, n.end.total.bytes, true);
  line("blocks at the end", b.end.total.blocks, n.end.total.blocks, false);
  line("allocations", b.allocations, n.allocations, false);
  line("hits", b.hits, n.hits, false);
  o += "  " + pad_right("duration", 20) + pad_left(seconds_text(b.duration_ns), 11) + "  " +
       pad_left(seconds_text(n.duration_ns), 12) + "\n";
  return o;
}

// Pool groups by name, in either run: their peaks before and after.
std::string diff_groups(const View& b, const View& n) {
  std::string o = "\nPeaks by pool group (before -> after):\n";
  std::vector<std::string> names;
  for (const View* v : {&b, &n})
    for (const Group& g : v->groups)
      if (std::find(names.begin(), names.end(), g.name) == names.end()) names.push_back(g.name);
  for (const std::string& name : names) {
    auto find = [&](const View& v) -> const Group* {
      for (const Group& g : v.groups)
        if (g.name == name) return &g;
      return nullptr;
    };
    const Group* x = find(b);
    const Group* y = find(n);
    auto val = [](const Group* g, bool managed) {
      return g ? bytes_text(managed ? g->peak_managed.bytes : g->peak_active.bytes)
               : std::string("-");
    };
    o += "  " + name + ": active " + val(x, false) + " -> " + val(y, false) + ", managed " +
         val(x, true) + " -> " + val(y, true) + "\n";
  }
  return o;
}

// A moment's sites (mb in b, mn in n), largest change first.
std::string diff_sites(const std::string& title, const View& b, const Moment& mb, const View& n,
                       const Moment& mn) {
  const std::vector<SiteChange> c = changes(b, mb, n, mn);
  std::string o = "\n" + title + ", by allocation site, largest change first:\n";
  if (c.empty()) o += "  no change\n";
  std::int64_t rest = 0;
  for (std::size_t k = 0; k < c.size(); ++k) {
    if (k >= kTopSites) {
      rest += c[k].change();
      continue;
    }
    const std::string& label =
        c[k].name_now != UINT32_MAX ? n.names[c[k].name_now].label : b.names[c[k].name_base].label;
    o += "  " + pad_left(signed_bytes(c[k].change()), 11) + "  " +
         pad_left(bytes_text(c[k].base.bytes), 10) + " -> " +
         pad_right(bytes_text(c[k].now.bytes), 10) + "  " +
         shorten_middle(label, kTextColumns - 41 - 8) +
         (c[k].name_now == UINT32_MAX    ? "  (gone)"
          : c[k].name_base == UINT32_MAX ? "  (new)"
                                         : "") +
         "\n";
  }
  if (c.size() > kTopSites)
    o += "  " + num(c.size() - kTopSites) + " more sites changed by " + signed_bytes(rest) +
         " in all.\n";
  return o;
}

}  // namespace

std::string runs_title(const Report& r) {
  return r.processes.empty()
             ? r.all.path
             : num(r.processes.size()) + " processes (" + r.files.front() + ", ...)";
}

std::string diff_text(const Report& base, const Report& now) {
  const View& b = base.all;
  const View& n = now.all;
  std::string o = "gpupool report --diff: from " + runs_title(base) +
                  "\n                        to " + runs_title(now) + "\n\n";
  o += diff_totals(b, n);
  o += diff_groups(b, n);
  o += diff_sites("At the peak of active memory (" + bytes_text(b.peak.at.bytes) + " -> " +
                      bytes_text(n.peak.at.bytes) + ")",
                  b, b.peak, n, n.peak);
  o += diff_sites("Still held at the end (" + bytes_text(b.end.total.bytes) + " -> " +
                      bytes_text(n.end.total.bytes) + ")",
                  b, b.end, n, n.end);
  o += "\nSites are matched by their frames without offsets and line numbers, so that a rebuilt "
       "program's "
       "match.\n";
  return o;
}

}  // namespace gpupool::launcher::report
