#include "interpose/control/trace_reader.hpp"

#include <sys/stat.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <string_view>

namespace gpupool::trace {
namespace {

std::vector<std::string_view> fields(std::string_view s) {
  std::vector<std::string_view> out;
  std::size_t i = 0;
  while (i < s.size()) {
    const std::size_t j = s.find(' ', i);
    out.push_back(s.substr(i, j == std::string_view::npos ? std::string_view::npos : j - i));
    if (j == std::string_view::npos) break;
    i = j + 1;
  }
  return out;
}

bool number(std::string_view s, std::uint64_t* out, int base = 10) {
  if (s.empty() || s.size() > 20) return false;
  for (char c : s)
    if (!(std::isdigit(static_cast<unsigned char>(c)) ||
          (base == 16 && std::isxdigit(static_cast<unsigned char>(c)))))
      return false;
  const std::string t(s);
  errno = 0;
  char* end = nullptr;
  const unsigned long long v = std::strtoull(t.c_str(), &end, base);
  if (errno || end != t.c_str() + t.size()) return false;
  *out = v;
  return true;
}

}  // namespace

bool read_trace(const std::string& path, TraceFile* out, std::string* error, bool lenient) {
  TraceFile tr;
  tr.path = path;
  auto fail = [&](std::size_t line, const std::string& what) {
    *error = path + ":" + std::to_string(line) + ": " + what;
    return false;
  };
  struct stat st{};
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) return fail(0, "is a directory");
  std::ifstream in(path, std::ios::binary);
  if (!in) return fail(0, std::string("cannot open: ") + std::strerror(errno));
  std::string all;
  try {  // the stream library reports a read error (EISDIR, EIO) by throwing
    all.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  } catch (const std::exception& e) {
    return fail(0, std::string("cannot read: ") + e.what());
  }
  if (in.bad()) return fail(0, "cannot read");
  std::map<std::uint64_t, std::uint32_t> arena_of;
  std::size_t pos = 0, n = 0;
  while (pos < all.size()) {
    std::size_t eol = all.find('\n', pos);
    ++n;
    if (eol == std::string::npos) {
      // A writer killed mid-line leaves its last line without a newline.
      if (n > 1) {
        tr.truncated_tail = true;
        break;
      }
      eol = all.size();
    }
    const std::string_view line(all.data() + pos, eol - pos);
    pos = eol + 1;
    if (n == 1) {
      if (line == kTraceHeader) tr.version = 2;
      else if (line == kTraceHeaderV1) tr.version = 1;
      else
        return fail(1, std::string("not a gpupool trace (the first line is not '") + kTraceHeader +
                           "' or '" + kTraceHeaderV1 + "')");
      continue;
    }
    if (line.empty()) continue;
    if (line[0] == '#') {
      const std::vector<std::string_view> f = fields(line);
      if (f.size() == 5 && f[1] == "pid" && f[3] == "start_unix_ns") {
        number(f[2], &tr.pid);
        number(f[4], &tr.start_unix_ns);
      }
      continue;
    }
    const std::vector<std::string_view> f = fields(line);
    if (f[0] == "arena") {
      ArenaDecl a;
      if (f.size() < 4 || !number(f[1], &a.id)) return fail(n, "expected 'arena ID KIND GROUP NAME'");
      if (arena_of.count(a.id)) return fail(n, "arena " + std::to_string(a.id) + " declared twice");
      a.kind = std::string(f[2]);
      a.group = std::string(f[3]);
      const std::size_t name_at = f.size() > 4 ? static_cast<std::size_t>(f[4].data() - line.data()) : line.size();
      a.name = std::string(line.substr(name_at));
      arena_of[a.id] = static_cast<std::uint32_t>(tr.arenas.size());
      tr.arenas.push_back(std::move(a));
      continue;
    }
    // Sites (version 2): declared before the records that name them.
    auto rest_from = [&](std::size_t k) {
      return k < f.size() ? std::string(line.substr(static_cast<std::size_t>(f[k].data() - line.data())))
                          : std::string();
    };
    if (tr.version >= 2 && f[0] == "module") {
      ModuleDecl m;
      if (f.size() < 7 || !number(f[1], &m.id) || m.id != tr.modules.size() ||
          !number(f[2], &m.start, 16) || !number(f[3], &m.end, 16) || !number(f[4], &m.bias, 16) ||
          m.end < m.start)
        return fail(n, "expected 'module ID START END BIAS BUILDID PATH' (ids in order from 0)");
      if (f[5] != "-") m.build_id = std::string(f[5]);
      m.path = rest_from(6);
      tr.modules.push_back(std::move(m));
      continue;
    }
    if (tr.version >= 2 && f[0] == "pyframe") {
      PyFrameDecl p;
      std::uint64_t ln = 0;
      if (f.size() < 5 || !number(f[1], &p.id) || p.id != tr.pyframes.size() || !number(f[2], &ln) ||
          ln > UINT32_MAX)
        return fail(n, "expected 'pyframe ID LINE FUNC FILE' (ids in order from 0)");
      p.line = static_cast<std::uint32_t>(ln);
      p.func = std::string(f[3]);
      p.file = rest_from(4);
      tr.pyframes.push_back(std::move(p));
      continue;
    }
    if (tr.version >= 2 && f[0] == "site") {
      SiteDecl st;
      bool ok = f.size() == 4 && number(f[1], &st.id) && st.id == tr.sites.size();
      auto list = [&](std::string_view v, int base, auto&& add) {
        if (v == "-") return true;
        std::size_t i = 0;
        while (i <= v.size()) {
          std::size_t j = v.find(',', i);
          if (j == std::string_view::npos) j = v.size();
          std::uint64_t x = 0;
          if (!number(v.substr(i, j - i), &x, base) || !add(x)) return false;
          i = j + 1;
        }
        return true;
      };
      ok = ok && list(f[2], 16, [&](std::uint64_t x) { st.pcs.push_back(x); return true; }) &&
           list(f[3], 10, [&](std::uint64_t x) {
             if (x >= tr.pyframes.size()) return false;
             st.pyframes.push_back(static_cast<std::uint32_t>(x));
             return true;
           });
      if (!ok)
        return fail(n, "expected 'site ID PC,PC,...|- PYFRAME,...|-' (ids in order from 0, "
                       "Python frames declared before)");
      st.modules_end = tr.modules.size();
      tr.sites.push_back(std::move(st));
      continue;
    }
    Record r;
    r.line = n;
    r.alloc = f[0] == "a";
    if (!r.alloc && f[0] != "f")
      return fail(n, tr.version >= 2 ? "expected a record ('a', 'f', 'arena', 'module', 'pyframe' or 'site')"
                                      : "expected a record ('a', 'f' or 'arena')");
    std::uint64_t id = 0;
    // Version 2: an allocation may name its site.
    const bool with_site = r.alloc && tr.version >= 2 && f.size() == 9;
    if (f.size() != (r.alloc ? (with_site ? 9u : 8u) : 7u) || !number(f[1], &r.t_ns) || !number(f[2], &r.tid) ||
        !number(f[3], &id) || !number(f[4], &r.handle, 16) || !number(f[5], &r.requested) ||
        !number(f[6], &r.size) || (r.alloc && f[7] != "h" && f[7] != "m"))
      return fail(n, r.alloc ? "expected 'a T TID ARENA HANDLE REQUESTED SIZE h|m [SITE]'"
                             : "expected 'f T TID ARENA HANDLE REQUESTED SIZE'");
    if (with_site) {
      std::uint64_t site = 0;
      if (!number(f[8], &site) || site >= tr.sites.size())
        return fail(n, "an allocation of site " + std::string(f[8]) + ", not declared before");
      r.site = static_cast<std::uint32_t>(site);
    }
    const auto a = arena_of.find(id);
    if (a == arena_of.end()) return fail(n, "a record of arena " + std::to_string(id) + ", not declared before");
    r.arena = a->second;
    r.hit = r.alloc && f[7] == "h";
    tr.records.push_back(r);
  }
  if (n == 0) return fail(1, "empty file, not a gpupool trace");
  if (!pair_records(&tr, lenient, /*frees_first=*/true, error)) return false;
  *out = std::move(tr);
  return true;
}

bool pair_records(TraceFile* tr, bool lenient, bool frees_first, std::string* error) {
  auto fail = [&](std::size_t line, const std::string& what) {
    *error = tr->path + ":" + std::to_string(line) + ": " + what;
    return false;
  };
  std::stable_sort(tr->records.begin(), tr->records.end(), [&](const Record& x, const Record& y) {
    if (x.t_ns != y.t_ns) return x.t_ns < y.t_ns;
    return frees_first && !x.alloc && y.alloc;
  });
  std::map<std::pair<std::uint32_t, std::uint64_t>, std::uint64_t> active;  // (arena, handle) -> slot
  std::vector<Record> kept;
  kept.reserve(tr->records.size());
  tr->slots = tr->unpaired = 0;
  for (Record& r : tr->records) {
    const auto key = std::make_pair(r.arena, r.handle);
    if (r.alloc) {
      if (const auto it = active.find(key); it != active.end()) {
        if (!lenient) return fail(r.line, "an allocation of a handle that is already active");
        // Its free was lost: the earlier allocation is freed here, by a free
        // the reader adds, so that every figure built on the records agrees.
        ++tr->unpaired;
        Record lost = r;
        lost.alloc = false;
        lost.hit = false;
        lost.site = kNoSite;
        lost.slot = it->second;
        kept.push_back(lost);
      }
      r.slot = tr->slots++;
      active[key] = r.slot;
    } else {
      const auto it = active.find(key);
      if (it == active.end()) {
        if (!lenient) return fail(r.line, "a free of a handle that is not active");
        ++tr->unpaired;
        continue;
      }
      r.slot = it->second;
      active.erase(it);
    }
    kept.push_back(r);
  }
  tr->records = std::move(kept);
  tr->unfreed = active.size();
  return true;
}

}  // namespace gpupool::trace
