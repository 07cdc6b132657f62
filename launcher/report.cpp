// gpupool report TRACE -o report.html: one self-contained page (no network,
// opens from disk) that shows where a program's memory went: memory over
// time per pool group, hits and misses over time, the sizes asked for, the
// peaks, and, with allocation sites (GPUPOOL_SITES), which call stacks held
// the most at the peak and what was still held at the end.
//
// Exact figures (peaks, tables) are computed from every record; the plotted
// series are downsampled to at most kPoints points each, keeping each
// bucket's maximum so that no peak disappears. The page draws them with its
// own inline script as SVG.
//
// Sites are named here, from the modules' files (site_names.hpp).
#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "interpose/control/stats_format.hpp"
#include "launcher/launcher.hpp"
#include "launcher/site_names.hpp"
#include "launcher/trace_tools.hpp"

namespace gpupool::launcher {
namespace {

const char kReportHelp[] =
    "Usage: gpupool report TRACE -o OUTPUT.html\n"
    "\n"
    "Write one self-contained HTML page about a GPUPOOL_TRACE_FILE (docs/trace.md,\n"
    "\"Report\"): memory over time per pool group, hits and misses over time, the\n"
    "sizes asked for, the peaks, and with allocation sites (GPUPOOL_SITES) the\n"
    "call stacks holding the most memory at the peak and at the end. Opens from\n"
    "disk, no network. OUTPUT: '-' is standard output; an existing regular file\n"
    "of yours is replaced, a device or FIFO written into, a symbolic link or\n"
    "another user's file refused. A trace that is not valid gets one error\n"
    "naming its file and line, and no output.\n";

constexpr std::size_t kPoints = 2000;      // per plotted series
constexpr std::size_t kRateBuckets = 200;  // hits and misses over time
constexpr std::size_t kTopSites = 20;

using stats::json_escape;

std::string q(const std::string& s) { return "\"" + json_escape(s) + "\""; }

std::string html_escape(const std::string& s) {
  std::string o;
  for (char c : s) {
    switch (c) {
      case '&': o += "&amp;"; break;
      case '<': o += "&lt;"; break;
      case '>': o += "&gt;"; break;
      case '"': o += "&quot;"; break;
      default: o += c;
    }
  }
  return o;
}

std::string bytes_text(std::uint64_t b) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(b);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, u ? "%.1f %s" : "%.0f %s", v, unit[u]);
  return buf;
}

// A time since the trace started, in the unit that suits it (as the
// page's script writes them).
std::string seconds_text(std::uint64_t ns) {
  char buf[32];
  const double v = static_cast<double>(ns);
  if (ns == 0) return "0 s";
  if (ns < 1'000'000) std::snprintf(buf, sizeof buf, "%.*f µs", ns < 10'000 ? 1 : 0, v / 1e3);
  else if (ns < 1'000'000'000) std::snprintf(buf, sizeof buf, "%.*f ms", ns < 10'000'000 ? 2 : 1, v / 1e6);
  else std::snprintf(buf, sizeof buf, "%.*f s", ns < 10'000'000'000 ? 2 : 1, v / 1e9);
  return buf;
}

// ---- the figures -------------------------------------------------------------

struct Peak {
  std::uint64_t bytes = 0, t_ns = 0;
};

struct Group {
  std::string name;
  Counters c;
  Peak peak_active, peak_managed;
  std::uint64_t allocs = 0, hits = 0;
  // Each plotted bucket's maximum: buckets [0, filled) are started, each at
  // the value it inherits from before its first record, so a bucket this
  // group has no record in shows the level the group stayed at.
  std::vector<std::uint64_t> b_active, b_in_blocks, b_managed;
  std::size_t filled = 0;
  void fill_buckets_to(std::size_t end) {
    for (; filled < end; ++filled) {
      b_active[filled] = c.active;
      b_in_blocks[filled] = c.in_blocks;
      b_managed[filled] = c.managed();
    }
  }
};

struct Held {
  std::uint64_t blocks = 0, bytes = 0;
};

// A row of a sites table: what one site held, in one arena (the blocks
// still held at the end: without sites those rows are the arenas) or in
// all of them (arena: none).
struct SiteRow {
  std::uint32_t site = trace::kNoSite;
  const trace::ArenaDecl* arena = nullptr;
  Held held;
};

// Largest first; ties in the order given.
std::vector<SiteRow> largest_first(std::vector<SiteRow> rows) {
  std::stable_sort(rows.begin(), rows.end(),
                   [](const SiteRow& a, const SiteRow& b) { return a.held.bytes > b.held.bytes; });
  return rows;
}

std::string render(const trace::TraceFile& tr, const std::string& path) {
  const std::uint64_t t_end = tr.records.empty() ? 0 : tr.records.back().t_ns;
  const std::uint64_t span = std::max<std::uint64_t>(t_end, 1);
  const std::size_t points = std::min<std::size_t>(kPoints, std::max<std::size_t>(tr.records.size(), 1));
  auto bucket = [&](std::uint64_t t, std::size_t n) {
    return std::min<std::size_t>(n - 1, static_cast<std::size_t>((static_cast<double>(t) / span) * n));
  };

  std::map<std::string, std::size_t> group_index;
  std::vector<Group> groups;
  std::vector<std::size_t> group_of_arena(tr.arenas.size());
  for (std::size_t a = 0; a < tr.arenas.size(); ++a) {
    auto [it, fresh] = group_index.try_emplace(tr.arenas[a].group, groups.size());
    if (fresh) {
      Group g;
      g.name = tr.arenas[a].group;
      g.b_active.assign(points, 0);
      g.b_in_blocks.assign(points, 0);
      g.b_managed.assign(points, 0);
      groups.push_back(std::move(g));
    }
    group_of_arena[a] = it->second;
  }

  // Pass 1: counters, peaks, bucket maxima, rates, sizes; the moment of the
  // peak of all groups' active bytes together.
  SlotSizes slots(tr);
  std::vector<std::uint64_t> hits(kRateBuckets), misses(kRateBuckets);
  std::map<int, std::pair<std::uint64_t, std::uint64_t>> sizes;  // log2 -> count, bytes
  std::uint64_t total_active = 0, allocs = 0, frees = 0, hit_count = 0;
  Peak total_peak;
  std::size_t peak_index = 0;
  for (std::size_t i = 0; i < tr.records.size(); ++i) {
    const trace::Record& r = tr.records[i];
    Group& g = groups[group_of_arena[r.arena]];
    const std::size_t b = bucket(r.t_ns, points);
    g.fill_buckets_to(b + 1);
    const std::uint64_t before = g.c.active;
    slots.apply(r, &g.c);
    total_active = total_active + g.c.active - before;
    if (r.alloc) {
      ++allocs;
      ++g.allocs;
      (r.hit ? hits : misses)[bucket(r.t_ns, kRateBuckets)]++;
      if (r.hit) {
        ++hit_count;
        ++g.hits;
      }
      int lg = 0;
      while (lg < 63 && (std::uint64_t(2) << lg) <= r.requested) ++lg;
      auto& s = sizes[r.requested ? lg : -1];
      ++s.first;
      s.second += r.requested;
    } else {
      ++frees;
    }
    if (g.c.active > g.peak_active.bytes) g.peak_active = {g.c.active, r.t_ns};
    if (g.c.managed() > g.peak_managed.bytes) g.peak_managed = {g.c.managed(), r.t_ns};
    if (total_active > total_peak.bytes) {
      total_peak = {total_active, r.t_ns};
      peak_index = i;
    }
    g.b_active[b] = std::max(g.b_active[b], g.c.active);
    g.b_in_blocks[b] = std::max(g.b_in_blocks[b], g.c.in_blocks);
    g.b_managed[b] = std::max(g.b_managed[b], g.c.managed());
  }
  for (Group& g : groups) g.fill_buckets_to(points);

  // Pass 2: the blocks active at the peak and at the end, by site.
  std::vector<std::uint32_t> site_of(tr.slots, trace::kNoSite);
  std::vector<std::uint8_t> live(tr.slots, 0);
  std::vector<std::uint32_t> arena_of_slot(tr.slots, 0);
  std::map<std::uint32_t, Held> at_peak;
  for (std::size_t i = 0; i < tr.records.size(); ++i) {
    const trace::Record& r = tr.records[i];
    if (r.alloc) {
      site_of[r.slot] = r.site;
      live[r.slot] = 1;
      arena_of_slot[r.slot] = r.arena;
    } else {
      live[r.slot] = 0;
    }
    if (i == peak_index && total_peak.bytes > 0)
      for (std::uint64_t s = 0; s < tr.slots; ++s)
        if (live[s]) {
          Held& h = at_peak[site_of[s]];
          ++h.blocks;
          h.bytes += slots.requested[s];
        }
  }
  std::map<std::pair<std::uint32_t, std::uint32_t>, Held> at_end;  // (site, arena)
  std::uint64_t end_blocks = 0, end_bytes = 0;
  for (std::uint64_t s = 0; s < tr.slots; ++s)
    if (live[s]) {
      Held& h = at_end[{site_of[s], arena_of_slot[s]}];
      ++h.blocks;
      h.bytes += slots.requested[s];
      ++end_blocks;
      end_bytes += slots.requested[s];
    }

  std::vector<SiteRow> peak_rows, end_rows;
  for (const auto& [site, held] : at_peak) peak_rows.push_back({site, nullptr, held});
  for (const auto& [key, held] : at_end) end_rows.push_back({key.first, &tr.arenas[key.second], held});
  peak_rows = largest_first(std::move(peak_rows));
  end_rows = largest_first(std::move(end_rows));

  Namer namer(tr);
  auto rows_json = [&](const std::vector<SiteRow>& rows) {
    std::string o = "\"rows\":" + std::to_string(rows.size()) + ",\"sites\":[";
    for (std::size_t k = 0; k < rows.size() && k < kTopSites; ++k) {
      const SiteRow& row = rows[k];
      const NamedSite& n = namer.site(row.site);
      o += std::string(k ? "," : "") + "{\"label\":" + q(n.label) + ",\"blocks\":" +
           std::to_string(row.held.blocks) + ",\"bytes\":" + std::to_string(row.held.bytes);
      if (row.arena) o += ",\"group\":" + q(row.arena->group) + ",\"arena\":" + q(row.arena->name);
      o += ",\"frames\":[";
      for (std::size_t f = 0; f < n.frames.size(); ++f) o += (f ? "," : "") + q(n.frames[f]);
      o += "]}";
    }
    return o + "]";
  };

  // ---- the data the page draws, as JSON ----
  std::string d = "{\"pid\":" + std::to_string(tr.pid) + ",\"path\":" + q(path) +
                  ",\"start_unix_ns\":" + std::to_string(tr.start_unix_ns) +
                  ",\"duration_ns\":" + std::to_string(t_end) +
                  ",\"allocations\":" + std::to_string(allocs) + ",\"frees\":" + std::to_string(frees) +
                  ",\"hits\":" + std::to_string(hit_count) +
                  ",\"sites_recorded\":" + (tr.sites.empty() ? "false" : "true") + ",\"groups\":[";
  for (std::size_t gi = 0; gi < groups.size(); ++gi) {
    const Group& g = groups[gi];
    std::string t, a, ib, m;
    for (std::size_t b = 0; b < points; ++b) {
      const std::string sep = b ? "," : "";
      t += sep + std::to_string(static_cast<std::uint64_t>(static_cast<double>(span) * b / points));
      a += sep + std::to_string(g.b_active[b]);
      ib += sep + std::to_string(g.b_in_blocks[b]);
      m += sep + std::to_string(g.b_managed[b]);
    }
    d += std::string(gi ? "," : "") + "{\"name\":" + q(g.name) + ",\"allocations\":" +
         std::to_string(g.allocs) + ",\"hits\":" + std::to_string(g.hits) +
         ",\"peak_active\":{\"bytes\":" + std::to_string(g.peak_active.bytes) + ",\"t_ns\":" +
         std::to_string(g.peak_active.t_ns) + "},\"peak_managed\":{\"bytes\":" +
         std::to_string(g.peak_managed.bytes) + ",\"t_ns\":" + std::to_string(g.peak_managed.t_ns) +
         "},\"end\":{\"active\":" + std::to_string(g.c.active) + ",\"managed\":" +
         std::to_string(g.c.managed()) + "},\"t\":[" + t + "],\"active\":[" + a +
         "],\"in_blocks\":[" + ib + "],\"managed\":[" + m + "]}";
  }
  d += "],\"rates\":{\"t\":[";
  for (std::size_t b = 0; b < kRateBuckets; ++b)
    d += (b ? "," : "") + std::to_string(static_cast<std::uint64_t>(static_cast<double>(span) * b / kRateBuckets));
  d += "],\"hits\":[";
  for (std::size_t b = 0; b < kRateBuckets; ++b) d += (b ? "," : "") + std::to_string(hits[b]);
  d += "],\"misses\":[";
  for (std::size_t b = 0; b < kRateBuckets; ++b) d += (b ? "," : "") + std::to_string(misses[b]);
  d += "]},\"sizes\":[";
  // Every power of two from the smallest size asked for to the largest,
  // empty ones too: the bars stand on an even (logarithmic) scale.
  const int lg_first = sizes.empty() ? 0 : sizes.begin()->first;
  const int lg_last = sizes.empty() ? -1 : sizes.rbegin()->first;
  for (int lg = lg_first; lg <= lg_last; ++lg) {
    const auto it = sizes.find(lg);
    const std::uint64_t from = lg < 0 ? 0 : std::uint64_t(1) << lg;
    d += std::string(lg > lg_first ? "," : "") + "{\"from\":" + std::to_string(from) +
         ",\"count\":" + std::to_string(it == sizes.end() ? 0 : it->second.first) +
         ",\"bytes\":" + std::to_string(it == sizes.end() ? 0 : it->second.second) + "}";
  }
  d += "],\"peak\":{\"bytes\":" + std::to_string(total_peak.bytes) + ",\"t_ns\":" +
       std::to_string(total_peak.t_ns) + "," + rows_json(peak_rows) + "},\"end\":{\"blocks\":" +
       std::to_string(end_blocks) + ",\"bytes\":" + std::to_string(end_bytes) + "," +
       rows_json(end_rows) + "}}";
  // Inside <script>: no "</" may end it early.
  std::string safe;
  for (char c : d) safe += c == '<' ? std::string("\\u003c") : std::string(1, c);

  // ---- the page: tables in HTML (readable without the script), plots drawn
  // by the script from the data.
  std::string h;
  h += "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n<title>gpupool report: pid " +
       std::to_string(tr.pid) + "</title>\n<style>\n"
       "body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1200px;color:#222}\n"
       "h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}\n"
       "table{border-collapse:collapse;margin:8px 0}td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #eee}\n"
       "td{white-space:nowrap}td.l,th.l{text-align:left;white-space:normal}.note{color:#666;font-size:12px}\n"
       "svg.plot{display:block;margin:8px 0;background:#fafafa;border:1px solid #e4e4e4}\n"
       "details{margin:2px 0}summary{cursor:pointer}pre{margin:4px 0 8px 18px;font-size:12px;white-space:pre-wrap}\n"
       "#status.error{color:#b00;font-weight:bold}\n"
       "</style></head>\n<body>\n";
  h += "<h1>gpupool report: pid " + std::to_string(tr.pid) + "</h1>\n<p>" + html_escape(path) + ": " +
       std::to_string(allocs) + " allocations, " + std::to_string(frees) + " frees over " +
       seconds_text(t_end) + "; " +
       (allocs ? std::to_string(hit_count * 100 / allocs) : std::string("0")) +
       "% served from held blocks. <span id=\"status\"></span></p>\n";
  h += "<h2>Peaks</h2>\n<table><tr><th class=\"l\">pool group</th><th>peak active</th><th>at</th>"
       "<th>peak managed</th><th>at</th><th>allocations</th><th>hits</th><th>active at end</th></tr>\n";
  for (const Group& g : groups)
    h += "<tr><td class=\"l\">" + html_escape(g.name) + "</td><td>" + bytes_text(g.peak_active.bytes) +
         "</td><td>" + seconds_text(g.peak_active.t_ns) + "</td><td>" + bytes_text(g.peak_managed.bytes) +
         "</td><td>" + seconds_text(g.peak_managed.t_ns) + "</td><td>" + std::to_string(g.allocs) +
         "</td><td>" + std::to_string(g.hits) + "</td><td>" + bytes_text(g.c.active) + "</td></tr>\n";
  h += "</table>\n<p class=\"note\">active: bytes the program asked for and holds; managed: the "
       "blocks those sit in plus the blocks held for reuse. The trace records no releases, so "
       "after one (a cap, an idle release, out-of-memory) held and managed are upper bounds. "
       "Plots show each bucket's maximum; the figures in tables are exact.</p>\n";
  h += "<h2>Memory over time</h2>\n<div id=\"memory\"></div>\n";
  h += "<h2>Hits and misses over time</h2>\n<div id=\"rates\"></div>\n";
  h += "<h2>Sizes asked for</h2>\n<div id=\"sizes\"></div>\n";
  auto site_table = [&](const std::string& title, const std::vector<SiteRow>& rows, bool with_arena,
                        std::uint64_t total) {
    std::string o = "<h2>" + title + "</h2>\n";
    if (tr.sites.empty() && !rows.empty())
      o += "<p class=\"note\">No call stacks in this trace: record them with GPUPOOL_SITES=all "
           "(or a sampling rate).</p>\n";
    o += "<p>" + bytes_text(total) + " in total.</p>\n<table><tr><th>bytes</th><th>blocks</th>" +
         std::string(with_arena ? "<th class=\"l\">pool group, arena</th>" : "") +
         "<th class=\"l\">allocation site</th></tr>\n";
    Held rest;
    for (std::size_t k = 0; k < rows.size(); ++k) {
      const SiteRow& row = rows[k];
      if (k >= kTopSites) {
        rest.blocks += row.held.blocks;
        rest.bytes += row.held.bytes;
        continue;
      }
      const NamedSite& n = namer.site(row.site);
      std::string frames;
      for (const std::string& f : n.frames) frames += html_escape(f) + "\n";
      o += "<tr><td>" + bytes_text(row.held.bytes) + "</td><td>" + std::to_string(row.held.blocks) +
           "</td>" +
           (with_arena ? "<td class=\"l\">" + html_escape(row.arena->group) +
                             " <span class=\"note\">" + html_escape(row.arena->name) + "</span></td>"
                       : "") +
           "<td class=\"l\"><details><summary>" + html_escape(n.label) + "</summary><pre>" +
           frames + "</pre></details></td></tr>\n";
    }
    o += "</table>\n";
    if (rows.size() > kTopSites)
      o += "<p class=\"note\">" + std::to_string(rows.size() - kTopSites) + " more rows hold " +
           bytes_text(rest.bytes) + " in " + std::to_string(rest.blocks) + " blocks.</p>\n";
    return o;
  };
  h += site_table("Allocation sites holding the most at the peak (" + seconds_text(total_peak.t_ns) + ")",
                  peak_rows, false, total_peak.bytes);
  h += site_table("Still held at the end of the trace", end_rows, true, end_bytes);
  h += "<p class=\"note\">Frameworks keep memory until exit on purpose: a cache or a model's "
       "weights still held at the end is not a leak.</p>\n";
  h += "<script type=\"application/json\" id=\"data\">" + safe + "</script>\n";
  h += R"JS(<script>
"use strict";
function fail(msg) {
  document.body.dataset.status = "error: " + msg;
  var s = document.getElementById("status");
  s.className = "error";
  s.textContent = "The page's script failed: " + msg;
}
window.onerror = function (msg) { fail(String(msg)); };
var SVG = "http://www.w3.org/2000/svg";
function el(name, attrs, parent) {
  var e = document.createElementNS(SVG, name);
  for (var k in attrs) e.setAttribute(k, attrs[k]);
  if (parent) parent.appendChild(e);
  return e;
}
function text(parent, x, y, s, attrs) {
  var a = {x: x, y: y, "font-size": 11};
  for (var k in attrs) a[k] = attrs[k];
  el("text", a, parent).textContent = s;
}
function bytes(b) {
  var u = ["B", "KiB", "MiB", "GiB", "TiB"], i = 0;
  while (b >= 1024 && i < 4) { b /= 1024; i++; }
  return (i ? b.toFixed(1) : b.toFixed(0)) + " " + u[i];
}
function secs(ns) {
  if (ns === 0) return "0 s";
  if (ns < 1e6) return (ns / 1e3).toFixed(ns < 1e4 ? 1 : 0) + " µs";
  if (ns < 1e9) return (ns / 1e6).toFixed(ns < 1e7 ? 2 : 1) + " ms";
  return (ns / 1e9).toFixed(ns < 1e10 ? 2 : 1) + " s";
}
function count(v) { return Math.round(v).toString(); }
// A round step for about four grid lines up to ymax: for bytes (unit 1024)
// a power of two, for counts 1, 2 or 5 times a power of ten.
function gridStep(ymax, unit) {
  var raw = Math.max(ymax / 4, 1);
  if (unit === 1024) return Math.pow(2, Math.ceil(Math.log2(raw)));
  var p = Math.pow(10, Math.floor(Math.log10(raw))), m = raw / p;
  return (m <= 1 ? 1 : m <= 2 ? 2 : m <= 5 ? 5 : 10) * p;
}
// One plot, as an SVG of class "plot". o: title; series [{name, v, color}];
// kind "line" (v[j] the level from o.x[j] to the next x, the last to
// o.xEnd; x formatted by o.fmtX) or "bar" (one slot per value, labelled
// o.labels[j]); fmtY, and yunit (1024 for bytes, 1 for counts); xlabel and
// ylabel, the axes' captions. Hovering shows the values under the pointer.
function plot(parent, o) {
  var W = 1100, H = 270, L = 84, R = 16, T = 34, B = 50;
  var svg = el("svg", {"class": "plot", width: W, height: H, viewBox: "0 0 " + W + " " + H}, parent);
  text(svg, L, 16, o.title, {"font-size": 13, "font-weight": "bold"});
  var bar = o.kind === "bar", n = o.series[0].v.length, top = 0;
  o.series.forEach(function (s) { s.v.forEach(function (v) { if (v > top) top = v; }); });
  var step = gridStep(top, o.yunit), ymax = Math.max(1, Math.ceil(top / step)) * step;
  var xmax = bar ? n : Math.max(1, o.xEnd);
  var sx = function (v) { return L + (W - L - R) * v / xmax; };
  var sy = function (v) { return H - B - (H - T - B) * v / ymax; };
  for (var yv = 0; yv <= ymax; yv += step) {
    el("line", {x1: L, x2: W - R, y1: sy(yv), y2: sy(yv), stroke: "#e2e2e2"}, svg);
    text(svg, L - 6, sy(yv) + 4, o.fmtY(yv), {"text-anchor": "end"});
  }
  if (bar) {
    var every = Math.ceil(n / 12);
    for (var j = 0; j < n; j += every)
      text(svg, sx(j + 0.5), H - B + 16, o.labels[j], {"text-anchor": "middle"});
  } else {
    for (var k = 0; k <= 4; k++)
      text(svg, sx(xmax * k / 4), H - B + 16, o.fmtX(xmax * k / 4),
           {"text-anchor": k === 0 ? "start" : k === 4 ? "end" : "middle"});
  }
  text(svg, L + (W - L - R) / 2, H - 8, o.xlabel, {"text-anchor": "middle", fill: "#555"});
  text(svg, 0, 0, o.ylabel, {"text-anchor": "middle", fill: "#555",
                             transform: "translate(14," + (T + (H - T - B) / 2) + ") rotate(-90)"});
  // The legend, right-aligned above the plot area.
  var lx = W - R;
  o.series.slice().reverse().forEach(function (s) {
    lx -= 30 + 7.5 * s.name.length;
    el("rect", {x: lx, y: 20, width: 10, height: 10, fill: s.color}, svg);
    text(svg, lx + 14, 29, s.name, {"font-size": 12});
  });
  var slot = (W - L - R) / n;
  o.series.forEach(function (s, k) {
    if (bar) {
      var w = slot / o.series.length;
      s.v.forEach(function (v, j) {
        if (v > 0)
          el("rect", {x: sx(j) + k * w, y: sy(v), width: Math.max(0.8, w * 0.9), height: sy(0) - sy(v),
                      fill: s.color}, svg);
      });
    } else if (n) {
      // Steps: memory keeps its level until the next record.
      var d = "M" + sx(o.x[0]).toFixed(1) + "," + sy(s.v[0]).toFixed(1);
      s.v.forEach(function (v, j) {
        if (j) d += "V" + sy(v).toFixed(1);
        d += "H" + sx(j + 1 < n ? o.x[j + 1] : xmax).toFixed(1);
      });
      el("path", {d: d, fill: "none", stroke: s.color, "stroke-width": 1.5}, svg);
    }
  });
  // Hover: a rule at the slot under the pointer and its values.
  var rule = el("line", {y1: T, y2: H - B, stroke: "#888", visibility: "hidden"}, svg);
  var readout = el("text", {x: L + 8, y: T + 12, "font-size": 12, visibility: "hidden"}, svg);
  el("rect", {x: L, y: T, width: W - L - R, height: H - T - B, fill: "transparent"}, svg)
    .addEventListener("mousemove", function (ev) {
      var box = svg.getBoundingClientRect();
      var px = (ev.clientX - box.left) * W / box.width;
      var j;
      if (bar) {
        j = Math.min(n - 1, Math.max(0, Math.floor((px - L) / slot)));
      } else {
        var xv = (px - L) / (W - L - R) * xmax;
        for (j = 0; j + 1 < n && o.x[j + 1] <= xv; j++) {}
      }
      if (j < 0) return;
      var at = bar ? sx(j + 0.5) : sx(o.x[j]);
      rule.setAttribute("x1", at);
      rule.setAttribute("x2", at);
      readout.textContent = (bar ? o.labels[j] : o.fmtX(o.x[j])) + ": " +
        o.series.map(function (s) { return s.name + " " + o.fmtY(s.v[j]); }).join(", ");
      rule.setAttribute("visibility", "visible");
      readout.setAttribute("visibility", "visible");
    });
  svg.addEventListener("mouseleave", function () {
    rule.setAttribute("visibility", "hidden");
    readout.setAttribute("visibility", "hidden");
  });
  return svg;
}
try {
  var D = JSON.parse(document.getElementById("data").textContent);
  var mem = document.getElementById("memory");
  D.groups.forEach(function (g) {
    plot(mem, {title: g.name + " (peak active " + bytes(g.peak_active.bytes) + ", peak managed " +
                      bytes(g.peak_managed.bytes) + ")",
               kind: "line", x: g.t, xEnd: D.duration_ns, fmtX: secs, fmtY: bytes, yunit: 1024,
               xlabel: "time since the trace started (each point: its interval's maximum)",
               ylabel: "bytes",
               series: [{name: "managed", v: g.managed, color: "#d62728"},
                        {name: "in blocks", v: g.in_blocks, color: "#ff7f0e"},
                        {name: "active", v: g.active, color: "#1f77b4"}]});
  });
  var bucket = D.duration_ns / D.rates.t.length;
  plot(document.getElementById("rates"), {
    title: "allocations per " + secs(bucket), kind: "bar", fmtY: count, yunit: 1,
    labels: D.rates.t.map(function (t) { return secs(t); }),
    xlabel: "time since the trace started", ylabel: "allocations",
    series: [{name: "hits", v: D.rates.hits, color: "#2ca02c"},
             {name: "misses", v: D.rates.misses, color: "#d62728"}]});
  var sz = document.getElementById("sizes");
  var labels = D.sizes.map(function (s) { return s.from ? bytes(s.from) : "0 B"; });
  var xlabel = "size asked for (each bar: from this size to twice it)";
  plot(sz, {title: "allocations by size asked for", kind: "bar", labels: labels, fmtY: count, yunit: 1,
            xlabel: xlabel, ylabel: "allocations",
            series: [{name: "count", v: D.sizes.map(function (s) { return s.count; }), color: "#9467bd"}]});
  plot(sz, {title: "bytes asked for, by size", kind: "bar", labels: labels, fmtY: bytes, yunit: 1024,
            xlabel: xlabel, ylabel: "bytes",
            series: [{name: "bytes", v: D.sizes.map(function (s) { return s.bytes; }), color: "#8c564b"}]});
  if (!document.body.dataset.status) document.body.dataset.status = "ok";
} catch (e) {
  fail(e && e.message ? e.message : String(e));
}
</script>
</body></html>
)JS";
  return h;
}

}  // namespace

const char* report_help() { return kReportHelp; }

int cmd_report(int argc, char** argv) {
  if (argc == 0) {
    std::fputs(kReportHelp, stderr);
    return kUsage;
  }
  std::string input, output;
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
    } else if (!a.empty() && a[0] == '-' && a != "-") {
      return usage_error("report: unknown option '" + a + "'", "report");
    } else if (input.empty()) {
      input = a;
    } else {
      return usage_error("report: one TRACE at a time ('" + a + "')", "report");
    }
  }
  if (input.empty()) return usage_error("report: which TRACE?", "report");
  if (output.empty()) return usage_error("report: -o OUTPUT.html is needed ('-': stdout)", "report");
  trace::TraceFile tr;
  if (!read_trace_for("report", input, &tr)) return kFailed;
  std::string why;
  if (!write_whole(output, render(tr, input), &why)) {
    std::fprintf(stderr, "%s: report: %s\n", kProg, why.c_str());
    return kFailed;
  }
  return kOk;
}

}  // namespace gpupool::launcher
