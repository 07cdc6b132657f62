// The report's page: one self-contained HTML file (inline CSS, script and
// data; no network; opens from disk). Tables are HTML, readable without the
// script; the plots and flame graphs are drawn by the page's own script as
// SVG from the data (a JSON block), and it sets data-status="ok" on <body>
// when it has drawn everything. The style and script: report_script.cpp.
#include <cinttypes>
#include <cstdio>
#include <string>

#include "launcher/launcher.hpp"
#include "launcher/report_model.hpp"
#include "observe/stats_format.hpp"

namespace gpupool::launcher::report {
namespace {

using stats::json_escape;

std::string q(const std::string& s) { return "\"" + json_escape(s) + "\""; }

// Text for the page, as for a terminal (terminal_text: a control
// character shows as \xNN), with HTML's characters escaped.
std::string html_escape(const std::string& text) {
  const std::string s = terminal_text(text);
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&':
        o += "&amp;";
        break;
      case '<':
        o += "&lt;";
        break;
      case '>':
        o += "&gt;";
        break;
      case '"':
        o += "&quot;";
        break;
      default:
        o += c;
    }
  }
  return o;
}

template <class T, class F>
std::string list(const std::vector<T>& v, F&& f) {
  std::string o = "[";
  for (std::size_t k = 0; k < v.size(); ++k) {
    if (k) o += ",";
    o += f(v[k]);
  }
  return o + "]";
}

std::string flame_json(const Flame& f) {
  std::string o = "{\"names\":" + list(f.names, q) + ",\"nodes\":[";
  for (std::size_t k = 0; k < f.nodes.size(); ++k) {
    const FlameNode& n = f.nodes[k];
    o += (k ? ",[" : "[") + num(n.name) + "," + num(n.parent) + "," + num(n.bytes) + "," +
         num(n.blocks) + "]";
  }
  return o + "]}";
}

std::string rows_json(const View& v, const std::vector<SiteRow>& rows) {
  std::string o = "\"rows\":" + num(rows.size()) + ",\"sites\":[";
  for (std::size_t k = 0; k < rows.size() && k < kTopSites; ++k) {
    const SiteRow& row = rows[k];
    const SiteName& n = v.names[row.name];
    o += std::string(k ? "," : "") + "{\"label\":" + q(n.label) +
         ",\"blocks\":" + num(row.held.blocks) + ",\"bytes\":" + num(row.held.bytes);
    if (!row.group.empty()) o += ",\"group\":" + q(row.group);
    if (!row.arena.empty()) o += ",\"arena\":" + q(row.arena);
    if (!row.pids.empty()) o += ",\"pids\":" + list(row.pids, num);
    o += ",\"frames\":" + list(n.frames, q) + "}";
  }
  return o + "]";
}

// A view's data, as the page's script (and the tests) read it.
std::string view_json(const View& v) {
  std::string d = "{\"pid\":" + num(v.pid) + ",\"path\":" + q(v.path) +
                  ",\"cmdline\":" + q(v.cmdline) + ",\"start_unix_ns\":" + num(v.start_unix_ns) +
                  ",\"offset_ns\":" + num(v.offset_ns) + ",\"duration_ns\":" + num(v.duration_ns) +
                  ",\"allocations\":" + num(v.allocations) + ",\"frees\":" + num(v.frees) +
                  ",\"hits\":" + num(v.hits) +
                  ",\"sites_recorded\":" + (v.sites_recorded ? "true" : "false") + ",\"groups\":[";
  // A bucket's start on the time axis.
  auto t_of = [&](std::size_t b) {
    return num(static_cast<std::uint64_t>(static_cast<double>(v.span_ns) * b / v.points));
  };
  for (std::size_t gi = 0; gi < v.groups.size(); ++gi) {
    const Group& g = v.groups[gi];
    d += std::string(gi ? "," : "") + "{\"name\":" + q(g.name);
    if (g.others) d += ",\"others\":" + num(g.others);
    d += ",\"allocations\":" + num(g.allocs) + ",\"hits\":" + num(g.hits) +
         ",\"peak_active\":{\"bytes\":" + num(g.peak_active.bytes) +
         ",\"t_ns\":" + num(g.peak_active.t_ns) +
         "},\"peak_managed\":{\"bytes\":" + num(g.peak_managed.bytes) +
         ",\"t_ns\":" + num(g.peak_managed.t_ns) + "},\"end\":{\"active\":" + num(g.c.active) +
         ",\"managed\":" + num(g.c.managed()) +
         "},\"t\":" + list(g.at, [&](std::uint32_t b) { return t_of(b); }) +
         ",\"active\":" + list(g.active, num) + ",\"in_blocks\":" + list(g.in_blocks, num) +
         ",\"managed\":" + list(g.managed, num) + "}";
  }
  d += "],\"rates\":{\"t\":[";
  for (std::size_t b = 0; b < kRateBuckets; ++b)
    d += (b ? "," : "") +
         num(static_cast<std::uint64_t>(static_cast<double>(v.span_ns) * b / kRateBuckets));
  d += "],\"hits\":" + list(v.rate_hits, num) + ",\"misses\":" + list(v.rate_misses, num) +
       "},\"sizes\":[";
  // Every power of two from the smallest size asked for to the largest,
  // empty ones too: the bars stand on an even (logarithmic) scale.
  const int lg_first = v.sizes.empty() ? 0 : v.sizes.begin()->first;
  const int lg_last = v.sizes.empty() ? -1 : v.sizes.rbegin()->first;
  for (int lg = lg_first; lg <= lg_last; ++lg) {
    const auto it = v.sizes.find(lg);
    const std::uint64_t from = lg < 0 ? 0 : std::uint64_t(1) << lg;
    d += std::string(lg > lg_first ? "," : "") + "{\"from\":" + num(from) +
         ",\"count\":" + num(it == v.sizes.end() ? 0 : it->second.first) +
         ",\"bytes\":" + num(it == v.sizes.end() ? 0 : it->second.second) + "}";
  }
  d += "],\"peak\":{\"bytes\":" + num(v.peak.at.bytes) + ",\"t_ns\":" + num(v.peak.at.t_ns) + "," +
       rows_json(v, v.peak.rows) + ",\"flame\":" + flame_json(v.peak.flame) +
       "},\"end\":{\"blocks\":" + num(v.end.total.blocks) + ",\"bytes\":" + num(v.end.total.bytes) +
       "," + rows_json(v, v.end.rows) + ",\"flame\":" + flame_json(v.end.flame) + "}";
  if (!v.total_active.empty()) {
    std::string t;
    for (std::size_t b = 0; b < v.points; ++b) t += (b ? "," : "") + t_of(b);
    d += ",\"t\":[" + t + "],\"total_active\":" + list(v.total_active, num) +
         ",\"process_active\":" + list(v.process_active, [](const View::Series& s) {
           return "{\"pid\":" + num(s.pid) + ",\"v\":" + list(s.v, num) + "}";
         });
  }
  return d;  // the caller closes it
}

std::string page_head(const std::string& title) {
  return "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>" +
         html_escape(title) + "</title>\n<style>\n" + kStyle + "</style></head>\n<body>\n";
}

std::string site_cell(const SiteName& n) {
  std::string frames;
  for (const std::string& f : n.frames) frames += html_escape(f) + "\n";
  return "<td class=\"l\"><details><summary>" + html_escape(n.label) + "</summary><pre>" + frames +
         "</pre></details></td>";
}

// A view's tables, and the places its plots and flame graphs go (id: the
// view's suffix for the script).
std::string view_html(const View& v, const std::string& id, bool several) {
  std::string h;
  h += "<h3>Peaks</h3>\n<table><tr><th class=\"l\">pool group</th><th>peak active</th><th>at</th>"
       "<th>peak managed</th><th>at</th><th>allocations</th><th>hits</th><th>active at "
       "end</th></tr>\n";
  for (const Group& g : v.groups)
    h += "<tr><td class=\"l\">" + html_escape(g.name) + "</td><td>" +
         bytes_text(g.peak_active.bytes) + "</td><td>" + seconds_text(g.peak_active.t_ns) +
         "</td><td>" + bytes_text(g.peak_managed.bytes) + "</td><td>" +
         seconds_text(g.peak_managed.t_ns) + "</td><td>" + num(g.allocs) + "</td><td>" +
         num(g.hits) + "</td><td>" + bytes_text(g.c.active) + "</td></tr>\n";
  h += "</table>\n<p class=\"note\">active: bytes the program asked for and holds; managed: the "
       "blocks those sit in plus the blocks held for reuse. The trace records no releases, so "
       "after one (a cap, an idle release, out-of-memory) held and managed are upper bounds. "
       "Plots show each bucket's maximum; the figures in tables are exact.";
  if (several)
    h += " Pool groups are named by each process (cuda:N is its device N, which "
         "CUDA_VISIBLE_DEVICES may "
         "make another GPU in another process): a group here adds up the processes' groups of that "
         "name.";
  if (!v.groups.empty() && v.groups.back().others)
    h += " " + html_escape(v.groups.back().name) + ": the groups past the " + num(kTopGroups) +
         " with the largest peaks, as one (their figures together).";
  h += "</p>\n";
  h += "<h3>Memory over time</h3>\n<div id=\"memory-" + id + "\"></div>\n";
  h += "<h3>Hits and misses over time</h3>\n<div id=\"rates-" + id + "\"></div>\n";
  h += "<h3>Sizes asked for</h3>\n<div id=\"sizes-" + id + "\"></div>\n";
  auto site_table = [&](const std::string& title, const Moment& m, const std::string& part) {
    const bool at_end = part == "end";
    std::string o = "<h3>" + title + "</h3>\n";
    if (!v.sites_recorded && !m.rows.empty())
      o += "<p class=\"note\">No call stacks in this trace: record them with GPUPOOL_SITES=all "
           "(or a sampling rate).</p>\n";
    o += "<p>" + bytes_text(m.total.bytes) + " in total.</p>\n";
    if (m.total.bytes) o += "<div id=\"flame-" + part + "-" + id + "\"></div>\n";
    if (m.rows.empty()) return o + "<p>Nothing.</p>\n";
    o += "<table><tr><th>bytes</th><th>blocks</th>" +
         std::string(at_end ? several ? "<th class=\"l\">pool group</th>"
                                      : "<th class=\"l\">pool group, arena</th>"
                            : "") +
         (several ? "<th class=\"l\">processes</th>" : "") +
         "<th class=\"l\">allocation site</th></tr>\n";
    for (std::size_t k = 0; k < m.rows.size() && k < kTopSites; ++k) {
      const SiteRow& row = m.rows[k];
      o += "<tr><td>" + bytes_text(row.held.bytes) + "</td><td>" + num(row.held.blocks) + "</td>";
      if (at_end)
        o += "<td class=\"l\">" + html_escape(row.group) +
             (row.arena.empty() ? ""
                                : " <span class=\"note\">" + html_escape(row.arena) + "</span>") +
             "</td>";
      if (several) o += "<td class=\"l\">" + pids_list(row.pids, ", ") + "</td>";
      o += site_cell(v.names[row.name]) + "</tr>\n";
    }
    o += "</table>\n";
    if (m.rows.size() > kTopSites) {
      const Held rest = rest_of(m);
      o += "<p class=\"note\">" + num(m.rows.size() - kTopSites) + " more rows hold " +
           bytes_text(rest.bytes) + " in " + num(rest.blocks) + " blocks.</p>\n";
    }
    return o;
  };
  h += site_table(
      "Allocation sites holding the most at the peak (" + seconds_text(v.peak.at.t_ns) + ")",
      v.peak, "peak");
  h += site_table(
      several ? "Still held at each process's end" : "Still held at the end of the trace", v.end,
      "end");
  return h;
}

std::string script_data(const std::string& d) {
  // Inside <script>: no "</" may end it early. (The JSON has no control
  // characters: json_escape writes them as \u00XX.)
  std::string safe;
  safe.reserve(d.size());
  for (char c : d) {
    if (c == '<') safe += "\\u003c";
    else safe += c;
  }
  return "<script type=\"application/json\" id=\"data\">" + safe + "</script>\n";
}

}  // namespace

std::string process_title(const View& v) {
  std::string cmd = v.cmdline;
  if (cmd.size() > 100) cmd = cmd.substr(0, 97) + "...";
  return (cmd.empty() ? "pid " + num(v.pid) : cmd + " (pid " + num(v.pid) + ")") +
         (v.unclosed ? ", " + unclosed_text(v) : "");
}

std::string unclosed_text(const View& v) {
  return v.unclosed ? "ended without closing its trace: os._exit or a kill" : "";
}

std::string json(const Report& r) {
  std::string d = view_json(r.all) + ",\"version\":1,\"files\":" + list(r.files, q);
  if (!r.processes.empty()) {
    d += ",\"processes\":[";
    for (std::size_t k = 0; k < r.processes.size(); ++k)
      d += (k ? "," : "") + view_json(r.processes[k]) + "}";
    d += "]";
  }
  return d + "}";
}

std::string page(const Report& r) {
  const View& all = r.all;
  const bool several = !r.processes.empty();
  const std::string title = several ? "gpupool report: " + num(r.processes.size()) + " processes"
                                    : "gpupool report: " + process_title(all);
  std::string h = page_head(title);
  h += "<h1>" + html_escape(title) + "</h1>\n<p>";
  if (!several) {
    h += html_escape(all.path) + ": " + summary_text(all);
  } else {
    std::string files;
    for (const std::string& f : r.files) files += (files.empty() ? "" : ", ") + html_escape(f);
    h += "All together: " + summary_text(all) + " <span class=\"note\">(" + files + ")</span>";
  }
  h += " <span id=\"status\"></span></p>\n";
  if (several) {
    h += "<h2>Processes</h2>\n<table><tr><th>pid</th><th class=\"l\">command "
         "line</th><th>started</th>"
         "<th>allocations</th><th>peak active</th><th>active at end</th><th "
         "class=\"l\">trace</th></tr>\n";
    for (const View& p : r.processes)
      h += "<tr><td>" + num(p.pid) + "</td><td class=\"l\">" +
           html_escape(p.cmdline.empty() ? "(not in the trace)" : p.cmdline) + "</td><td>+" +
           seconds_text(p.offset_ns) + "</td><td>" + num(p.allocations) + "</td><td>" +
           bytes_text(p.peak.at.bytes) + "</td><td>" + bytes_text(p.end.total.bytes) +
           "</td><td class=\"l\">" + html_escape(p.path) +
           (p.unclosed ? " <span class=\"note\">(" + unclosed_text(p) + ")</span>" : "") +
           "</td></tr>\n";
    h += "</table>\n<p class=\"note\">started: after the first trace started; times in \"All "
         "processes\" count "
         "from then, each process's own from its trace's start.</p>\n<h2>All processes</h2>\n";
  }
  h += view_html(all, "all", several);
  if (!several)
    h += "<p class=\"note\">Frameworks keep memory until exit on purpose: a cache or a model's "
         "weights still held at the end is not a leak.</p>\n";
  for (std::size_t k = 0; k < r.processes.size(); ++k) {
    const View& p = r.processes[k];
    h += std::string("<details class=\"process\"") + (r.processes.size() <= 4 ? " open" : "") +
         "><summary>" + html_escape(process_title(p)) + "</summary>\n<p>" + html_escape(p.path) +
         ": " + summary_text(p) + "</p>\n" + view_html(p, "p" + num(k), false) + "</details>\n";
  }
  if (several)
    h += "<p class=\"note\">Frameworks keep memory until exit on purpose: a cache or a model's "
         "weights still held at the end is not a leak.</p>\n";
  h += script_data(json(r));
  h += kReportMain;
  h += kScript;
  h += "</body></html>\n";
  return h;
}

namespace {

// A change's cell: "+1.0 MiB" marked up, "-..." down.
std::string change_cell(std::int64_t d) {
  if (d == 0) return std::string("<td>0</td>");
  const std::string t =
      (d > 0 ? "+" : "-") + bytes_text(static_cast<std::uint64_t>(d > 0 ? d : -d));
  return "<td class=\"" + std::string(d > 0 ? "up" : "down") + "\">" + t + "</td>";
}

// The two runs' totals and the peaks of the pool groups both have.
std::string diff_totals_table(const View& b, const View& n) {
  auto row = [&](const std::string& what, std::uint64_t x, std::uint64_t y, bool bytes) {
    const std::int64_t d = static_cast<std::int64_t>(y - x);
    return "<tr><td class=\"l\">" + what + "</td><td>" + (bytes ? bytes_text(x) : num(x)) +
           "</td><td>" + (bytes ? bytes_text(y) : num(y)) + "</td>" +
           (bytes ? change_cell(d)
                  : "<td>" + std::string(d > 0 ? "+" : "") + std::to_string(d) + "</td>") +
           "</tr>\n";
  };
  std::string h = "<table><tr><th></th><th>before</th><th>after</th><th>change</th></tr>\n";
  h += row("peak active", b.peak.at.bytes, n.peak.at.bytes, true);
  h += row("held at the end", b.end.total.bytes, n.end.total.bytes, true);
  h += row("blocks at the end", b.end.total.blocks, n.end.total.blocks, false);
  h += row("allocations", b.allocations, n.allocations, false);
  h += row("hits", b.hits, n.hits, false);
  for (const Group& g : n.groups)
    for (const Group& x : b.groups)
      if (x.name == g.name) {
        h += row("peak active, " + html_escape(g.name), x.peak_active.bytes, g.peak_active.bytes,
                 true);
        h += row("peak managed, " + html_escape(g.name), x.peak_managed.bytes, g.peak_managed.bytes,
                 true);
      }
  h += "</table>\n";
  return h;
}

// A moment's sites (mb in b, mn in n) by change: the table into *h, and
// the flame graph of what grew (in the new run's stacks) as `part` into
// the page's data.
void diff_sites_section(const std::string& title, const std::string& part, const View& b,
                        const Moment& mb, const View& n, const Moment& mn, std::string* h,
                        std::string* data) {
  const std::vector<SiteChange> c = changes(b, mb, n, mn);
  std::vector<SiteRow> grown;
  for (const SiteChange& x : c)
    if (x.change() > 0) {
      SiteRow r;
      r.name = x.name_now;
      r.held = {x.now.blocks > x.base.blocks ? x.now.blocks - x.base.blocks : 0,
                static_cast<std::uint64_t>(x.change())};
      grown.push_back(r);
    }
  const Flame f = flame_of(n.names, grown);
  *data += std::string(data->size() > 1 ? "," : "") + "\"" + part + "\":" + flame_json(f);
  *h += "<h2>" + title + "</h2>\n";
  if (!f.nodes.empty() && f.nodes[0].bytes) *h += "<div id=\"flame-" + part + "\"></div>\n";
  *h +=
      "<table><tr><th>change</th><th>before</th><th>after</th><th class=\"l\">allocation "
      "site</th></tr>\n";
  for (std::size_t k = 0; k < c.size() && k < kTopSites; ++k) {
    const SiteName& name =
        c[k].name_now != UINT32_MAX ? n.names[c[k].name_now] : b.names[c[k].name_base];
    *h += "<tr>" + change_cell(c[k].change()) + "<td>" + bytes_text(c[k].base.bytes) + "</td><td>" +
          bytes_text(c[k].now.bytes) + "</td>" + site_cell(name) + "</tr>\n";
  }
  *h += "</table>\n";
  if (c.empty()) *h += "<p>No change.</p>\n";
  if (c.size() > kTopSites)
    *h += "<p class=\"note\">" + num(c.size() - kTopSites) + " more sites changed.</p>\n";
}

// A moment's sites by change, as --diff --json lists them.
std::string changes_json(const View& b, const Moment& mb, const View& n, const Moment& mn) {
  return list(changes(b, mb, n, mn), [&](const SiteChange& c) {
    const SiteName& name = c.name_now != UINT32_MAX ? n.names[c.name_now] : b.names[c.name_base];
    return "{\"label\":" + q(name.label) + ",\"change\":" + std::to_string(c.change()) +
           ",\"before\":{\"bytes\":" + num(c.base.bytes) + ",\"blocks\":" + num(c.base.blocks) +
           "},\"after\":{\"bytes\":" + num(c.now.bytes) + ",\"blocks\":" + num(c.now.blocks) +
           "},\"frames\":" + list(name.frames, q) + "}";
  });
}

}  // namespace

std::string diff_json(const Report& base, const Report& now) {
  const View& b = base.all;
  const View& n = now.all;
  return "{\"version\":1,\"base\":" + json(base) + ",\"now\":" + json(now) +
         ",\"peak\":" + changes_json(b, b.peak, n, n.peak) +
         ",\"end\":" + changes_json(b, b.end, n, n.end) + "}";
}

std::string diff_page(const Report& base, const Report& now) {
  const View& b = base.all;
  const View& n = now.all;
  std::string h = page_head("gpupool report: difference");
  h += "<h1>gpupool report: what changed</h1>\n<p>From " + html_escape(runs_title(base)) + " to " +
       html_escape(runs_title(now)) + ". <span id=\"status\"></span></p>\n";
  h += diff_totals_table(b, n);
  std::string data = "{";
  diff_sites_section("At the peak of active memory, by allocation site", "peak", b, b.peak, n,
                     n.peak, &h, &data);
  diff_sites_section("Still held at the end, by allocation site", "end", b, b.end, n, n.end, &h,
                     &data);
  h += "<p class=\"note\">Sites are matched by their frames without offsets and line numbers, so "
       "that a "
       "rebuilt program's match. The flame graphs show what grew, in the later run's stacks.</p>\n";
  h += script_data(data + "}");
  h += kDiffMain;
  h += kScript;
  h += "</body></html>\n";
  return h;
}

}  // namespace gpupool::launcher::report
