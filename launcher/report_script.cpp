// The report page's fixed parts: its style sheet and its script, which
// draws the plots and flame graphs from the page's data (report_page.cpp
// writes both into every page).
#include "launcher/report_model.hpp"

namespace gpupool::launcher::report {

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
               kind: "line", x: V.t, xEnd: V.duration_ns,
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

}  // namespace gpupool::launcher::report
