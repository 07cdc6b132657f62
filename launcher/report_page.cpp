// The report's page: one self-contained HTML file (inline CSS, script and
// data; no network; opens from disk). Tables are HTML, readable without the
// script; the plots and flame graphs are drawn by the page's own script as
// SVG from the data (a JSON block), and it sets data-status="ok" on <body>
// when it has drawn everything.
#include <cinttypes>
#include <cstdio>
#include <string>

#include "launcher/report_model.hpp"
#include "observe/stats_format.hpp"

namespace gpupool::launcher::report {
namespace {

using stats::json_escape;

std::string q(const std::string& s) { return "\"" + json_escape(s) + "\""; }

std::string html_escape(const std::string& s) {
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

std::string num(std::uint64_t v) { return std::to_string(v); }

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
  std::string t;
  for (std::size_t b = 0; b < v.points; ++b)
    t += (b ? "," : "") +
         num(static_cast<std::uint64_t>(static_cast<double>(v.span_ns) * b / v.points));
  for (std::size_t gi = 0; gi < v.groups.size(); ++gi) {
    const Group& g = v.groups[gi];
    d += std::string(gi ? "," : "") + "{\"name\":" + q(g.name) +
         ",\"allocations\":" + num(g.allocs) + ",\"hits\":" + num(g.hits) +
         ",\"peak_active\":{\"bytes\":" + num(g.peak_active.bytes) +
         ",\"t_ns\":" + num(g.peak_active.t_ns) +
         "},\"peak_managed\":{\"bytes\":" + num(g.peak_managed.bytes) +
         ",\"t_ns\":" + num(g.peak_managed.t_ns) + "},\"end\":{\"active\":" + num(g.c.active) +
         ",\"managed\":" + num(g.c.managed()) + "},\"t\":[" + t +
         "],\"active\":" + list(g.b_active, num) + ",\"in_blocks\":" + list(g.b_in_blocks, num) +
         ",\"managed\":" + list(g.b_managed, num) + "}";
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
  if (!v.total_active.empty())
    d += ",\"total_active\":" + list(v.total_active, num) +
         ",\"process_active\":" + list(v.process_active, [](const View::Series& s) {
           return "{\"pid\":" + num(s.pid) + ",\"v\":" + list(s.v, num) + "}";
         });
  return d;  // the caller closes it
}

const char kStyle[] =
    "body{font:14px/1.4 system-ui,sans-serif;margin:24px auto;max-width:1200px;color:#222}\n"
    "h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}\n"
    "h3{font-size:15px;margin-top:22px}\n"
    "table{border-collapse:collapse;margin:8px 0}"
    "td,th{padding:3px 10px;text-align:right;border-bottom:1px solid #eee}\n"
    "td{white-space:nowrap}td.l,th.l{text-align:left;white-space:normal}.note{color:#666;font-size:"
    "12px}\n"
    "svg.plot,svg.flame{display:block;margin:8px 0;background:#fafafa;border:1px solid #e4e4e4}\n"
    "svg.flame rect{stroke:#fff;stroke-width:0.5;cursor:pointer}"
    "svg.flame text{pointer-events:none;font-size:11px}\n"
    "details{margin:2px 0}summary{cursor:pointer}"
    "pre{margin:4px 0 8px 18px;font-size:12px;white-space:pre-wrap}\n"
    "details.process>summary{font-size:17px;font-weight:bold;margin-top:28px;border-bottom:1px "
    "solid #ddd}\n"
    ".up{color:#b00}.down{color:#070}\n"
    "#status.error{color:#b00;font-weight:bold}\n";

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

std::string pids_text(const std::vector<std::uint64_t>& pids) {
  std::string o;
  for (std::size_t k = 0; k < pids.size() && k < 8; ++k) o += (k ? ", " : "") + num(pids[k]);
  if (pids.size() > 8) o += " and " + num(pids.size() - 8) + " more";
  return o;
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
    Held rest;
    for (std::size_t k = 0; k < m.rows.size(); ++k) {
      const SiteRow& row = m.rows[k];
      if (k >= kTopSites) {
        rest.blocks += row.held.blocks;
        rest.bytes += row.held.bytes;
        continue;
      }
      o += "<tr><td>" + bytes_text(row.held.bytes) + "</td><td>" + num(row.held.blocks) + "</td>";
      if (at_end)
        o += "<td class=\"l\">" + html_escape(row.group) +
             (row.arena.empty() ? ""
                                : " <span class=\"note\">" + html_escape(row.arena) + "</span>") +
             "</td>";
      if (several) o += "<td class=\"l\">" + pids_text(row.pids) + "</td>";
      o += site_cell(v.names[row.name]) + "</tr>\n";
    }
    o += "</table>\n";
    if (m.rows.size() > kTopSites)
      o += "<p class=\"note\">" + num(m.rows.size() - kTopSites) + " more rows hold " +
           bytes_text(rest.bytes) + " in " + num(rest.blocks) + " blocks.</p>\n";
    return o;
  };
  h += site_table(
      "Allocation sites holding the most at the peak (" + seconds_text(v.peak.at.t_ns) + ")",
      v.peak, "peak");
  h += site_table("Still held at the end of the trace", v.end, "end");
  return h;
}

std::string summary(const View& v) {
  return num(v.allocations) + " allocations, " + num(v.frees) + " frees over " +
         seconds_text(v.duration_ns) + "; " +
         (v.allocations ? num(v.hits * 100 / v.allocations) : std::string("0")) +
         "% served from held blocks.";
}

std::string script_data(const std::string& d) {
  // Inside <script>: no "</" may end it early.
  std::string safe;
  safe.reserve(d.size());
  for (char c : d) {
    if (c == '<') safe += "\\u003c";
    else safe += c;
  }
  return "<script type=\"application/json\" id=\"data\">" + safe + "</script>\n";
}

const char kScript[] = R"JS(<script>
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
  if (ns < 1e3) return Math.round(ns) + " ns";
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
var PALETTE = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
               "#bcbd22", "#17becf"];
function hash(s) {
  var h = 0;
  for (var i = 0; i < s.length; i++) h = (h * 31 + s.charCodeAt(i)) | 0;
  return Math.abs(h);
}
// An icicle: the root (everything) on top, each frame's callees below it,
// widths in proportion to the bytes held under them. F: {names, nodes:
// [[name, parent, bytes, blocks]...]}, each node after its parent. Click a
// frame to zoom into it, the top bar to zoom out; hovering shows the whole
// name and its bytes.
function flame(parent, F, title) {
  var nodes = F.nodes, kids = nodes.map(function () { return []; }), depth = [0], maxDepth = 0;
  for (var i = 1; i < nodes.length; i++) {
    kids[nodes[i][1]].push(i);
    depth[i] = depth[nodes[i][1]] + 1;
    if (depth[i] > maxDepth) maxDepth = depth[i];
  }
  kids.forEach(function (k) { k.sort(function (a, b) { return nodes[b][2] - nodes[a][2]; }); });
  var W = 1100, RH = 18, T = 24, H = T + (maxDepth + 1) * RH + 4;
  var svg = el("svg", {"class": "flame", width: W, height: H, viewBox: "0 0 " + W + " " + H}, parent);
  function name(i) { return i === 0 ? "all" : F.names[nodes[i][0]]; }
  function color(i) {
    if (i === 0) return "#c8c8c8";
    var n = name(i), h = hash(n);
    if (n.indexOf("py ") === 0) return "hsl(" + (190 + h % 40) + ",55%," + (62 + h % 12) + "%)";
    return "hsl(" + (10 + h % 40) + ",80%," + (58 + h % 12) + "%)";
  }
  function draw(root) {
    while (svg.firstChild) svg.removeChild(svg.firstChild);
    text(svg, 4, 16, title + (root ? " (zoomed in: click the top bar to zoom out)" : " (click a frame to zoom in)"),
         {"font-size": 13, "font-weight": "bold"});
    // The zoomed frame's callers, full width above it.
    var chain = [];
    for (var a = root; a !== 0; a = nodes[a][1]) chain.unshift(nodes[a][1]);
    function box(i, x, w, row) {
      var g = el("g", {"data-node": i}, svg);
      var r = el("rect", {x: x, y: T + row * RH, width: Math.max(w, 0.5), height: RH - 1, fill: color(i)}, g);
      el("title", {}, r).textContent = name(i) + "\n" + bytes(nodes[i][2]) + " (" +
        (100 * nodes[i][2] / nodes[0][2]).toFixed(1) + "% of all), " + nodes[i][3] + " blocks";
      var fit = Math.floor((w - 6) / 6.2);
      if (fit >= 3) {
        var s = name(i);
        text(g, x + 3, T + row * RH + 13, s.length > fit ? s.slice(0, fit - 1) + "…" : s);
      }
      r.addEventListener("click", function () { draw(i === root && i !== 0 ? nodes[i][1] : i); });
    }
    chain.forEach(function (a, row) { box(a, 0, W, row); });
    (function lay(i, x, w, row) {
      box(i, x, w, row);
      var cx = x;
      kids[i].forEach(function (c) {
        var cw = w * nodes[c][2] / nodes[i][2];
        if (cw >= 0.5) lay(c, cx, cw, row + 1);
        cx += cw;
      });
    })(root, 0, W, chain.length);
    svg.setAttribute("data-root", root);
  }
  draw(0);
  return svg;
}
function drawView(V, id) {
  var mem = document.getElementById("memory-" + id);
  if (V.total_active) {
    var series = [{name: "all", v: V.total_active, color: "#333"}];
    V.process_active.forEach(function (p, k) {
      series.push({name: "pid " + p.pid, v: p.v, color: PALETTE[k % PALETTE.length]});
    });
    plot(mem, {title: "active bytes, all processes" + (V.process_active.length < D.processes.length ?
                 " and the " + V.process_active.length + " that held the most" : " and each"),
               kind: "line", x: V.groups[0].t, xEnd: V.duration_ns,
               fmtX: secs, fmtY: bytes, yunit: 1024,
               xlabel: "time since the first trace started (each point: its interval's maximum)",
               ylabel: "bytes", series: series});
  }
  var since = V.total_active ? "time since the first trace started" : "time since the trace started";
  V.groups.forEach(function (g) {
    plot(mem, {title: g.name + " (peak active " + bytes(g.peak_active.bytes) + ", peak managed " +
                      bytes(g.peak_managed.bytes) + ")",
               kind: "line", x: g.t, xEnd: V.duration_ns, fmtX: secs, fmtY: bytes, yunit: 1024,
               xlabel: since + " (each point: its interval's maximum)",
               ylabel: "bytes",
               series: [{name: "managed", v: g.managed, color: "#d62728"},
                        {name: "in blocks", v: g.in_blocks, color: "#ff7f0e"},
                        {name: "active", v: g.active, color: "#1f77b4"}]});
  });
  var bucket = V.duration_ns / V.rates.t.length;
  plot(document.getElementById("rates-" + id), {
    title: "allocations per " + secs(bucket), kind: "bar", fmtY: count, yunit: 1,
    labels: V.rates.t.map(function (t) { return secs(t); }),
    xlabel: since, ylabel: "allocations",
    series: [{name: "hits", v: V.rates.hits, color: "#2ca02c"},
             {name: "misses", v: V.rates.misses, color: "#d62728"}]});
  var sz = document.getElementById("sizes-" + id);
  var labels = V.sizes.map(function (s) { return s.from ? bytes(s.from) : "0 B"; });
  var xlabel = "size asked for (each bar: from this size to twice it)";
  plot(sz, {title: "allocations by size asked for", kind: "bar", labels: labels, fmtY: count, yunit: 1,
            xlabel: xlabel, ylabel: "allocations",
            series: [{name: "count", v: V.sizes.map(function (s) { return s.count; }), color: "#9467bd"}]});
  plot(sz, {title: "bytes asked for, by size", kind: "bar", labels: labels, fmtY: bytes, yunit: 1024,
            xlabel: xlabel, ylabel: "bytes",
            series: [{name: "bytes", v: V.sizes.map(function (s) { return s.bytes; }), color: "#8c564b"}]});
  [["peak", "bytes held at the peak, by call stack"], ["end", "bytes still held at the end, by call stack"]]
    .forEach(function (p) {
      var box = document.getElementById("flame-" + p[0] + "-" + id);
      if (box) flame(box, V[p[0]].flame, p[1]);
    });
}
var D;
try {
  D = JSON.parse(document.getElementById("data").textContent);
  main();
  if (!document.body.dataset.status) document.body.dataset.status = "ok";
} catch (e) {
  fail(e && e.message ? e.message : String(e));
}
</script>
)JS";

// The report's main(): its views.
const char kReportMain[] = R"JS(<script>
function main() {
  drawView(D, "all");
  (D.processes || []).forEach(function (P, k) { drawView(P, "p" + k); });
}
</script>
)JS";

// --diff's main(): the icicles of what grew.
const char kDiffMain[] = R"JS(<script>
function main() {
  [["peak", "growth at the peak, by call stack"], ["end", "growth of what is held at the end, by call stack"]]
    .forEach(function (p) {
      var box = document.getElementById("flame-" + p[0]);
      if (box) flame(box, D[p[0]], p[1]);
    });
}
</script>
)JS";

}  // namespace

std::string process_title(const View& v) {
  std::string cmd = v.cmdline;
  if (cmd.size() > 100) cmd = cmd.substr(0, 97) + "...";
  return cmd.empty() ? "pid " + num(v.pid) : cmd + " (pid " + num(v.pid) + ")";
}

std::string page(const Report& r) {
  const View& all = r.all;
  const bool several = !r.processes.empty();
  const std::string title = several ? "gpupool report: " + num(r.processes.size()) + " processes"
                                    : "gpupool report: " + process_title(all);
  std::string h = page_head(title);
  h += "<h1>" + html_escape(title) + "</h1>\n<p>";
  if (!several) {
    h += html_escape(all.path) + ": " + summary(all);
  } else {
    std::string files;
    for (const std::string& f : r.files) files += (files.empty() ? "" : ", ") + html_escape(f);
    h += "All together: " + summary(all) + " <span class=\"note\">(" + files + ")</span>";
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
           "</td><td class=\"l\">" + html_escape(p.path) + "</td></tr>\n";
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
         ": " + summary(p) + "</p>\n" + view_html(p, "p" + num(k), false) + "</details>\n";
  }
  if (several)
    h += "<p class=\"note\">Frameworks keep memory until exit on purpose: a cache or a model's "
         "weights still held at the end is not a leak.</p>\n";
  std::string d = view_json(all) + ",\"files\":" + list(r.files, q);
  if (several) {
    d += ",\"processes\":[";
    for (std::size_t k = 0; k < r.processes.size(); ++k)
      d += (k ? "," : "") + view_json(r.processes[k]) + "}";
    d += "]";
  }
  h += script_data(d + "}");
  h += kReportMain;
  h += kScript;
  h += "</body></html>\n";
  return h;
}

namespace {

// A change's cell: "+1.0 MiB" marked up, "-..." down.
std::string change_cell(std::int64_t d) {
  if (d == 0) return std::string("<td>0</td>");
  const std::string t = (d > 0 ? "+" : "-") + bytes_text(static_cast<std::uint64_t>(d > 0 ? d : -d));
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
  *h += "<table><tr><th>change</th><th>before</th><th>after</th><th class=\"l\">allocation "
        "site</th></tr>\n";
  for (std::size_t k = 0; k < c.size() && k < kTopSites; ++k) {
    const SiteName& name =
        c[k].name_now != UINT32_MAX ? n.names[c[k].name_now] : b.names[c[k].name_base];
    *h += "<tr>" + change_cell(c[k].change()) + "<td>" + bytes_text(c[k].base.bytes) +
          "</td><td>" + bytes_text(c[k].now.bytes) + "</td>" + site_cell(name) + "</tr>\n";
  }
  *h += "</table>\n";
  if (c.empty()) *h += "<p>No change.</p>\n";
  if (c.size() > kTopSites)
    *h += "<p class=\"note\">" + num(c.size() - kTopSites) + " more sites changed.</p>\n";
}

}  // namespace

std::string diff_page(const Report& base, const Report& now) {
  const View& b = base.all;
  const View& n = now.all;
  std::string h = page_head("gpupool report: difference");
  h += "<h1>gpupool report: what changed</h1>\n<p>From " + html_escape(runs_title(base)) +
       " to " + html_escape(runs_title(now)) + ". <span id=\"status\"></span></p>\n";
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
