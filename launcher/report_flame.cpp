// The flame graphs of `gpupool report`: a site's path of frames, the same
// site across builds, and the icicle of bytes by path.
#include <algorithm>
#include <cctype>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "launcher/report_model.hpp"
#include "launcher/site_names.hpp"

namespace gpupool::launcher::report {
namespace {

// A frame's line number left out ("step (train.py:42)" -> "step
// (train.py)"), and its offsets ("+0x1f") where named or all.
std::string strip(const std::string& s, bool all_offsets) {
  std::string o;
  o.reserve(s.size());
  for (std::size_t i = 0; i < s.size();) {
    if (s.compare(i, 3, "+0x") == 0) {
      std::size_t j = i + 3;
      while (j < s.size() && std::isxdigit(static_cast<unsigned char>(s[j]))) ++j;
      // A frame without a name ("libx.so+0x1020") has only its offset.
      const bool named =
          s.compare(j, 2, " (") == 0 && s.compare(j, 31, " (file changed since the trace)") != 0;
      if (j > i + 3 && (all_offsets || named)) {
        i = j;
        continue;
      }
    }
    if (s[i] == ':' && i + 1 < s.size() && std::isdigit(static_cast<unsigned char>(s[i + 1]))) {
      std::size_t j = i + 1;
      while (j < s.size() && std::isdigit(static_cast<unsigned char>(s[j]))) ++j;
      if (j == s.size() || s[j] == ')' || s[j] == '\x1f' || s[j] == ' ') {
        i = j;
        continue;
      }
    }
    o += s[i++];
  }
  return o;
}

}  // namespace

// A site's path in the flame graph, outermost first: with Python frames,
// the Python stack (the native frames around it are the interpreter's and
// the runtime's; the tables keep the whole stack), else the native one.
// A frame is its function: its calls (offsets, lines) merge.
std::vector<std::string> flame_path(const NamedSite& n) {
  std::vector<std::string> python, native;
  for (const std::string& f : n.frames)
    (f.rfind("py ", 0) == 0 ? python : native).push_back(strip(f, false));
  std::vector<std::string> path(python.empty() ? native.rbegin() : python.rbegin(),
                                python.empty() ? native.rend() : python.rend());
  if (path.empty()) path.push_back(n.label);
  return path;
}

// The same site in another build of the program: offsets and line numbers
// left out ("forward+0x1f (prog)" -> "forward (prog)", "f (a.py:42)" ->
// "f (a.py)").
std::string across_builds(const std::string& s) { return strip(s, true); }

// The icicle of the rows' bytes by stack. Nodes under 1/kFlameWidth of
// the whole are left out (narrower than a pixel), and beyond kFlameNodes
// the smallest: their bytes stay in their parents'.
Flame flame_of(const std::vector<SiteName>& site_names, const std::vector<SiteRow>& rows) {
  constexpr std::uint64_t kFlameWidth = 4000;
  constexpr std::size_t kFlameNodes = 20000;
  std::vector<FlameNode> nodes(1);  // the root, named "" (the page says "all")
  std::vector<std::string> names(1);
  std::unordered_map<std::string, std::uint32_t> name_id{{"", 0}};
  std::map<std::pair<std::uint32_t, std::uint32_t>, std::uint32_t> child;  // (parent, name) -> node
  for (const SiteRow& row : rows) {
    if (!row.held.bytes) continue;
    std::uint32_t at = 0;
    nodes[0].bytes += row.held.bytes;
    nodes[0].blocks += row.held.blocks;
    for (const std::string& frame : site_names[row.name].flame) {
      auto [nit, nfresh] = name_id.try_emplace(frame, static_cast<std::uint32_t>(names.size()));
      if (nfresh) names.push_back(frame);
      auto [cit, cfresh] =
          child.try_emplace({at, nit->second}, static_cast<std::uint32_t>(nodes.size()));
      if (cfresh) nodes.push_back({nit->second, at, 0, 0});
      at = cit->second;
      nodes[at].bytes += row.held.bytes;
      nodes[at].blocks += row.held.blocks;
    }
  }
  // Which to keep: the largest first (a parent before its children, as
  // it holds at least as much), each only if its parent is kept.
  std::vector<std::uint32_t> order(nodes.size());
  for (std::uint32_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::uint32_t a, std::uint32_t b) {
    return nodes[a].bytes > nodes[b].bytes;
  });
  std::vector<std::uint32_t> index(nodes.size(), UINT32_MAX);
  std::vector<std::uint8_t> keep(nodes.size(), 0);
  std::size_t kept = 0;
  for (std::uint32_t i : order) {
    if (kept == kFlameNodes) break;
    if (i != 0 && (!keep[nodes[i].parent] || nodes[i].bytes * kFlameWidth < nodes[0].bytes))
      continue;
    keep[i] = 1;
    ++kept;
  }
  Flame f;
  std::unordered_map<std::uint32_t, std::uint32_t> new_name;
  for (std::uint32_t i = 0; i < nodes.size(); ++i) {
    if (!keep[i]) continue;
    FlameNode n = nodes[i];
    auto [it, fresh] = new_name.try_emplace(n.name, static_cast<std::uint32_t>(f.names.size()));
    if (fresh) f.names.push_back(names[n.name]);
    n.name = it->second;
    n.parent = i ? index[n.parent] : 0;
    index[i] = static_cast<std::uint32_t>(f.nodes.size());
    f.nodes.push_back(n);
  }
  return f;
}

}  // namespace gpupool::launcher::report
