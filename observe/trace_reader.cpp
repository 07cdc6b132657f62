#include "observe/trace_reader.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>
#include <string_view>
#include <unordered_map>

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

int digit(char c, int base) {
  if (c >= '0' && c <= '9') return c - '0';
  if (base == 16 && c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (base == 16 && c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// Digits up to the next space or the end: pointer past them, or nullptr
// (none, another character, or more than 64 bits).
const char* scan(const char* p, const char* end, std::uint64_t* out, int base) {
  std::uint64_t v = 0;
  const char* start = p;
  for (; p != end && *p != ' '; ++p) {
    const int d = digit(*p, base);
    if (d < 0 || __builtin_mul_overflow(v, static_cast<std::uint64_t>(base), &v) ||
        __builtin_add_overflow(v, static_cast<std::uint64_t>(d), &v))
      return nullptr;
  }
  if (p == start) return nullptr;
  *out = v;
  return p;
}

bool number(std::string_view s, std::uint64_t* out, int base = 10) {
  return scan(s.data(), s.data() + s.size(), out, base) == s.data() + s.size();
}

// Open addressing (linear probing, deletion by moving back): the active
// blocks while records are paired, keyed by (arena, handle). A node per
// block (std::map) made pairing most of a big report's time.
class ActiveBlocks {
 public:
  // The slot of (arena, handle), or kNone.
  static constexpr std::uint32_t kNone = UINT32_MAX;
  std::uint32_t find(std::uint32_t arena, std::uint64_t handle) const {
    if (table_.empty()) return kNone;
    for (std::size_t i = home(arena, handle);; i = (i + 1) & mask_) {
      const Entry& e = table_[i];
      if (e.slot == kNone) return kNone;
      if (e.handle == handle && e.arena == arena) return e.slot;
    }
  }
  void insert(std::uint32_t arena, std::uint64_t handle, std::uint32_t slot) {
    if ((size_ + 1) * 2 > table_.size()) grow();
    std::size_t i = home(arena, handle);
    while (table_[i].slot != kNone) i = (i + 1) & mask_;
    table_[i] = {handle, arena, slot};
    ++size_;
  }
  void erase(std::uint32_t arena, std::uint64_t handle) {
    std::size_t i = home(arena, handle);
    while (!(table_[i].handle == handle && table_[i].arena == arena)) i = (i + 1) & mask_;
    // Move back each later entry of the run that may sit at i instead.
    for (std::size_t j = (i + 1) & mask_; table_[j].slot != kNone; j = (j + 1) & mask_) {
      const std::size_t h = home(table_[j].arena, table_[j].handle);
      if (((j - h) & mask_) >= ((j - i) & mask_)) {
        table_[i] = table_[j];
        i = j;
      }
    }
    table_[i].slot = kNone;
    --size_;
  }
  std::size_t size() const { return size_; }

 private:
  struct Entry {
    std::uint64_t handle = 0;
    std::uint32_t arena = 0, slot = kNone;
  };
  std::size_t home(std::uint32_t arena, std::uint64_t handle) const {
    std::uint64_t x = handle ^ (std::uint64_t(arena) << 48);
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdull;
    x ^= x >> 33;
    return static_cast<std::size_t>(x) & mask_;
  }
  void grow() {
    std::vector<Entry> old = std::move(table_);
    table_.assign(old.empty() ? 1024 : old.size() * 2, Entry{});
    mask_ = table_.size() - 1;
    size_ = 0;
    for (const Entry& e : old)
      if (e.slot != kNone) insert(e.arena, e.handle, e.slot);
  }
  std::vector<Entry> table_;
  std::size_t mask_ = 0, size_ = 0;
};

// One file's lines, in order.
class Parser {
 public:
  explicit Parser(TraceFile* tr) : tr_(*tr) {}

  // False and *error set on a line that is not valid.
  bool line(std::string_view line, std::size_t n, std::string* error) {
    n_ = n;
    error_ = error;
    if (n == 1) return header(line);
    if (line.empty()) return true;
    if ((line[0] == 'a' || line[0] == 'f') && line.size() > 1 && line[1] == ' ' &&
        record_fast(line))
      return true;
    return general(line);
  }

 private:
  bool fail(const std::string& what) {
    *error_ = tr_.path + ":" + std::to_string(n_) + ": " + what;
    return false;
  }

  bool header(std::string_view line) {
    if (line == kTraceHeader) tr_.version = 2;
    else if (line == kTraceHeaderV1) tr_.version = 1;
    else
      return fail(std::string("not a gpupool trace (the first line is not '") + kTraceHeader +
                  "' or '" + kTraceHeaderV1 + "')");
    return true;
  }

  std::uint32_t line32() const {
    return n_ > UINT32_MAX ? UINT32_MAX : static_cast<std::uint32_t>(n_);
  }

  std::uint32_t thread_index(std::uint64_t tid) {
    if (tid == last_tid_ && !tr_.threads.empty()) return last_thread_;
    auto [it, fresh] = thread_of_.try_emplace(tid, static_cast<std::uint32_t>(tr_.threads.size()));
    if (fresh) tr_.threads.push_back(tid);
    last_tid_ = tid;
    last_thread_ = it->second;
    return it->second;
  }

  bool arena_index(std::uint64_t id, std::uint32_t* out) {
    if (id < dense_arenas_.size() && dense_arenas_[id] != UINT32_MAX) {
      *out = dense_arenas_[id];
      return true;
    }
    const auto a = arena_of_.find(id);
    if (a == arena_of_.end()) return false;
    *out = a->second;
    return true;
  }

  // The records' common shape, without building fields: false sends the
  // line to the general path, which reads it again and names any error.
  bool record_fast(std::string_view line) {
    const char* p = line.data() + 2;
    const char* end = line.data() + line.size();
    Record r;
    r.alloc = line[0] == 'a';
    std::uint64_t tid = 0, arena = 0;
    if (!(p = scan(p, end, &r.t_ns, 10)) || p == end || !(p = scan(p + 1, end, &tid, 10)) ||
        p == end || !(p = scan(p + 1, end, &arena, 10)) || p == end ||
        !(p = scan(p + 1, end, &r.handle, 16)) || p == end ||
        !(p = scan(p + 1, end, &r.requested, 10)) || p == end ||
        !(p = scan(p + 1, end, &r.size, 10)))
      return false;
    if (r.alloc) {
      if (end - p < 2 || p[0] != ' ' || (p[1] != 'h' && p[1] != 'm' && p[1] != 'd')) return false;
      r.hit = p[1] == 'h';
      r.outside = p[1] == 'd';
      p += 2;
      if (p != end) {
        std::uint64_t site = 0;
        if (tr_.version < 2 || *p != ' ' || scan(p + 1, end, &site, 10) != end ||
            site >= tr_.sites.size())
          return false;
        r.site = static_cast<std::uint32_t>(site);
      }
    } else if (p != end) {
      return false;
    }
    if (!arena_index(arena, &r.arena)) return false;
    r.unpooled = unpooled_[r.arena];
    r.thread = thread_index(tid);
    r.line = line32();
    push(r);
    return true;
  }

  void push(const Record& r) {
    if (!tr_.records.empty()) {
      const Record& b = tr_.records.back();
      if (r.t_ns < b.t_ns || (r.t_ns == b.t_ns && !r.alloc && b.alloc)) tr_.in_time_order = false;
    }
    tr_.records.push_back(r);
  }

  // Every line but the header and the records' common shape; names any
  // error.
  bool general(std::string_view line) {
    if (line[0] == '#') return comment(line);
    const std::vector<std::string_view> f = fields(line);
    if (f[0] == "arena") return arena(line, f);
    // Sites (version 2): declared before the records that name them.
    if (tr_.version >= 2 && f[0] == "module") return module(line, f);
    if (tr_.version >= 2 && f[0] == "pyframe") return pyframe(line, f);
    if (tr_.version >= 2 && f[0] == "site") return site(f);
    return record(f);
  }

  // The text of line from field k on ("" where there is none).
  static std::string rest_from(std::string_view line, const std::vector<std::string_view>& f,
                               std::size_t k) {
    return k < f.size()
               ? std::string(line.substr(static_cast<std::size_t>(f[k].data() - line.data())))
               : std::string();
  }

  bool comment(std::string_view line) {
    const std::vector<std::string_view> f = fields(line);
    if (f.size() == 5 && f[1] == "pid" && f[3] == "start_unix_ns") {
      number(f[2], &tr_.pid);
      number(f[4], &tr_.start_unix_ns);
    } else if (f.size() == 3 && f[1] == "end") {
      tr_.ended = number(f[2], &tr_.end_ns);
    } else if (f.size() == 2 && f[1] == "attached") {
      tr_.attached = true;
    } else if (f.size() == 3 && f[1] == "run") {
      number(f[2], &tr_.run);
    } else if (f.size() >= 2 && f[1] == "cmdline") {
      tr_.cmdline = std::string(line.substr(std::min(line.size(), std::size_t(10))));
    }
    return true;
  }

  bool arena(std::string_view line, const std::vector<std::string_view>& f) {
    ArenaDecl a;
    if (f.size() < 4 || !number(f[1], &a.id)) return fail("expected 'arena ID KIND GROUP NAME'");
    if (arena_of_.count(a.id)) return fail("arena " + std::to_string(a.id) + " declared twice");
    a.kind = std::string(f[2]);
    a.group = std::string(f[3]);
    const std::size_t name_at =
        f.size() > 4 ? static_cast<std::size_t>(f[4].data() - line.data()) : line.size();
    a.name = std::string(line.substr(name_at));
    const auto index = static_cast<std::uint32_t>(tr_.arenas.size());
    arena_of_[a.id] = index;
    // Ids count from 0 as the library writes them: found by index.
    if (a.id < 65536) {
      if (dense_arenas_.size() <= a.id) dense_arenas_.resize(a.id + 1, UINT32_MAX);
      dense_arenas_[a.id] = index;
    }
    unpooled_.push_back(a.kind == kUnpooledArenaKind);
    tr_.arenas.push_back(std::move(a));
    return true;
  }

  bool module(std::string_view line, const std::vector<std::string_view>& f) {
    ModuleDecl m;
    if (f.size() < 7 || !number(f[1], &m.id) || m.id != tr_.modules.size() ||
        !number(f[2], &m.start, 16) || !number(f[3], &m.end, 16) || !number(f[4], &m.bias, 16) ||
        m.end < m.start)
      return fail("expected 'module ID START END BIAS BUILDID PATH' (ids in order from 0)");
    if (f[5] != "-") m.build_id = std::string(f[5]);
    m.path = rest_from(line, f, 6);
    tr_.modules.push_back(std::move(m));
    return true;
  }

  bool pyframe(std::string_view line, const std::vector<std::string_view>& f) {
    PyFrameDecl p;
    std::uint64_t ln = 0;
    if (f.size() < 5 || !number(f[1], &p.id) || p.id != tr_.pyframes.size() || !number(f[2], &ln) ||
        ln > UINT32_MAX)
      return fail("expected 'pyframe ID LINE FUNC FILE' (ids in order from 0)");
    p.line = static_cast<std::uint32_t>(ln);
    p.func = std::string(f[3]);
    p.file = rest_from(line, f, 4);
    tr_.pyframes.push_back(std::move(p));
    return true;
  }

  // A comma-separated list of numbers in `base`, or "-": each given to
  // add, which may refuse it.
  template <class Add>
  static bool number_list(std::string_view v, int base, Add&& add) {
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
  }

  bool site(const std::vector<std::string_view>& f) {
    SiteDecl st;
    const bool ok = f.size() == 4 && number(f[1], &st.id) && st.id == tr_.sites.size() &&
                    number_list(f[2], 16,
                                [&](std::uint64_t x) {
                                  st.pcs.push_back(x);
                                  return true;
                                }) &&
                    number_list(f[3], 10, [&](std::uint64_t x) {
                      if (x >= tr_.pyframes.size()) return false;
                      st.pyframes.push_back(static_cast<std::uint32_t>(x));
                      return true;
                    });
    if (!ok)
      return fail(
          "expected 'site ID PC,PC,...|- PYFRAME,...|-' (ids in order from 0, Python frames "
          "declared before)");
    st.modules_end = tr_.modules.size();
    tr_.sites.push_back(std::move(st));
    return true;
  }

  // A record the fast path did not take: read again, any error named.
  bool record(const std::vector<std::string_view>& f) {
    Record r;
    r.line = line32();
    r.alloc = f[0] == "a";
    if (!r.alloc && f[0] != "f")
      return fail(tr_.version >= 2
                      ? "expected a record ('a', 'f', 'arena', 'module', 'pyframe' or 'site')"
                      : "expected a record ('a', 'f' or 'arena')");
    std::uint64_t id = 0, tid = 0;
    // Version 2: an allocation may name its site.
    const bool with_site = r.alloc && tr_.version >= 2 && f.size() == 9;
    if (f.size() != (r.alloc ? (with_site ? 9u : 8u) : 7u) || !number(f[1], &r.t_ns) ||
        !number(f[2], &tid) || !number(f[3], &id) || !number(f[4], &r.handle, 16) ||
        !number(f[5], &r.requested) || !number(f[6], &r.size) ||
        (r.alloc && f[7] != "h" && f[7] != "m" && f[7] != "d"))
      return fail(r.alloc ? "expected 'a T TID ARENA HANDLE REQUESTED SIZE h|m|d [SITE]'"
                          : "expected 'f T TID ARENA HANDLE REQUESTED SIZE'");
    if (with_site) {
      std::uint64_t site = 0;
      if (!number(f[8], &site) || site >= tr_.sites.size())
        return fail("an allocation of site " + std::string(f[8]) + ", not declared before");
      r.site = static_cast<std::uint32_t>(site);
    }
    if (!arena_index(id, &r.arena))
      return fail("a record of arena " + std::to_string(id) + ", not declared before");
    r.hit = r.alloc && f[7] == "h";
    r.outside = r.alloc && f[7] == "d";
    r.unpooled = unpooled_[r.arena];
    r.thread = thread_index(tid);
    push(r);
    return true;
  }

  TraceFile& tr_;
  std::size_t n_ = 0;
  std::string* error_ = nullptr;
  std::unordered_map<std::uint64_t, std::uint32_t> arena_of_;  // id -> index
  std::vector<std::uint32_t> dense_arenas_;                    // the same, for small ids
  std::vector<bool> unpooled_;                                 // by index: kUnpooledArenaKind
  std::unordered_map<std::uint64_t, std::uint32_t> thread_of_;
  std::uint64_t last_tid_ = 0;
  std::uint32_t last_thread_ = 0;
};

struct Fd {
  int fd = -1;
  ~Fd() {
    if (fd >= 0) ::close(fd);
  }
};

}  // namespace

bool is_trace_file(const std::string& path) {
  // Only a regular file is opened: a device's open may do something.
  struct stat before {};
  if (::stat(path.c_str(), &before) != 0 || !S_ISREG(before.st_mode)) return false;
  Fd in;
  in.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (in.fd < 0) return false;
  struct stat st {};
  if (::fstat(in.fd, &st) != 0 || !S_ISREG(st.st_mode)) return false;
  char head[32];
  const ssize_t n = ::read(in.fd, head, sizeof head);
  const std::size_t len = std::strlen(kTraceHeader);
  return n > static_cast<ssize_t>(len) &&
         (std::memcmp(head, kTraceHeader, len) == 0 ||
          std::memcmp(head, kTraceHeaderV1, len) == 0) &&
         (head[len] == '\n' || head[len] == '\r');
}

bool trace_head(const std::string& path, std::uint64_t* pid, std::uint64_t* run) {
  *pid = *run = 0;
  if (!is_trace_file(path)) return false;
  Fd in;
  in.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (in.fd < 0) return false;
  char buf[4096];
  const ssize_t n = ::read(in.fd, buf, sizeof buf);
  if (n <= 0) return false;
  // The '#' lines at the top (a command line is at most about 1 KiB).
  std::string_view head(buf, static_cast<std::size_t>(n));
  while (!head.empty() && head.front() == '#') {
    const std::size_t nl = head.find('\n');
    if (nl == std::string_view::npos) break;
    const std::string line(head.substr(0, nl));
    head.remove_prefix(nl + 1);
    unsigned long long a = 0, b = 0;
    if (std::sscanf(line.c_str(), "# pid %llu start_unix_ns %llu", &a, &b) == 2) *pid = a;
    else if (char more = 0; std::sscanf(line.c_str(), "# run %llu%c", &a, &more) == 1) *run = a;
  }
  return true;
}

bool read_trace(const std::string& path, TraceFile* out, std::string* error, bool lenient) {
  TraceFile tr;
  tr.path = path;
  auto fail = [&](std::size_t line, const std::string& what) {
    *error = path + ":" + std::to_string(line) + ": " + what;
    return false;
  };
  // The file as a whole: a sentence naming it.
  auto fail_file = [&](const std::string& what) {
    *error = what;
    return false;
  };
  Fd in;
  in.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NOCTTY);
  if (in.fd < 0) return fail_file("cannot open " + path + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(in.fd, &st) != 0)
    return fail_file("cannot read " + path + ": " + std::strerror(errno));
  if (S_ISDIR(st.st_mode)) return fail_file(path + " is a directory");
  // Room for the records a file of this size holds (40 bytes or more
  // each): pages never written are never resident, and no copy is made as
  // it grows.
  if (S_ISREG(st.st_mode)) {
    try {
      tr.records.reserve(static_cast<std::size_t>(st.st_size) / 32 + 16);
    } catch (const std::bad_alloc&) {  // grown as it goes instead
    }
  }
  tr.in_time_order = true;  // until a record comes before the one above it
  Parser parser(&tr);
  std::string buf(std::size_t(1) << 22, '\0');
  std::size_t have = 0, n = 0;  // bytes in buf; lines done
  bool eof = false;
  while (!eof) {
    const ssize_t got = ::read(in.fd, buf.data() + have, buf.size() - have);
    if (got < 0) {
      if (errno == EINTR) continue;
      return fail_file("cannot read " + path + ": " + std::strerror(errno));
    }
    eof = got == 0;
    have += static_cast<std::size_t>(got);
    std::size_t pos = 0;
    for (;;) {
      const char* nl = static_cast<const char*>(std::memchr(buf.data() + pos, '\n', have - pos));
      if (!nl) break;
      const std::size_t eol = static_cast<std::size_t>(nl - buf.data());
      if (!parser.line(std::string_view(buf.data() + pos, eol - pos), ++n, error)) return false;
      pos = eol + 1;
    }
    if (eof && pos < have) {
      // A writer killed mid-line leaves its last line without a newline.
      if (n > 0) {
        tr.truncated_tail = true;
      } else if (!parser.line(std::string_view(buf.data() + pos, have - pos), ++n, error)) {
        return false;
      }
      pos = have;
    }
    // The line not yet complete goes to the front; a longer one than the
    // buffer makes it grow.
    std::memmove(buf.data(), buf.data() + pos, have - pos);
    have -= pos;
    if (have == buf.size()) buf.resize(buf.size() * 2);
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
  std::vector<Record>& recs = tr->records;
  // In place (no second copy of the records); the line keeps the file's
  // order among equal times. A file written by one thread is in order.
  const auto before = [frees_first](const Record& x, const Record& y) {
    if (x.t_ns != y.t_ns) return x.t_ns < y.t_ns;
    if (frees_first && x.alloc != y.alloc) return !x.alloc;
    return x.line < y.line;
  };
  if (!tr->in_time_order && !std::is_sorted(recs.begin(), recs.end(), before))
    std::sort(recs.begin(), recs.end(), before);
  tr->in_time_order = true;
  ActiveBlocks active;
  // Records kept are moved down over the ones left out; a free the reader
  // adds (for an allocation whose free was lost) goes in `added`, with the
  // index of the record it comes before, and is merged in at the end.
  std::vector<std::pair<std::size_t, Record>> added;
  std::size_t kept = 0;
  std::uint64_t slots = 0;
  tr->unpaired = 0;
  tr->freed_from_before = 0;
  for (std::size_t i = 0; i < recs.size(); ++i) {
    Record r = recs[i];
    if (r.alloc) {
      if (const std::uint32_t slot = active.find(r.arena, r.handle); slot != ActiveBlocks::kNone) {
        if (!lenient) return fail(r.line, "an allocation of a handle that is already active");
        // Its free was lost: the earlier allocation is freed here, by a free
        // the reader adds, so that every figure built on the records agrees.
        ++tr->unpaired;
        Record lost = r;
        lost.alloc = false;
        lost.hit = false;
        lost.site = kNoSite;
        lost.slot = slot;
        added.emplace_back(kept, lost);
        active.erase(r.arena, r.handle);
      }
      if (slots == UINT32_MAX) return fail(r.line, "more than 4294967294 allocations in one trace");
      r.slot = static_cast<std::uint32_t>(slots++);
      active.insert(r.arena, r.handle, r.slot);
    } else {
      const std::uint32_t slot = active.find(r.arena, r.handle);
      if (slot == ActiveBlocks::kNone && tr->attached) {
        ++tr->freed_from_before;
        continue;
      }
      if (slot == ActiveBlocks::kNone) {
        if (!lenient) return fail(r.line, "a free of a handle that is not active");
        ++tr->unpaired;
        continue;
      }
      r.slot = slot;
      active.erase(r.arena, r.handle);
    }
    recs[kept++] = r;
  }
  recs.resize(kept);
  if (!added.empty()) {
    // From the back: each record moves up by the number of added ones
    // before it.
    recs.resize(kept + added.size());
    std::size_t src = kept, dst = recs.size();
    for (std::size_t k = added.size(); k-- > 0;) {
      while (src > added[k].first) recs[--dst] = recs[--src];
      recs[--dst] = added[k].second;
    }
  }
  tr->slots = static_cast<std::uint32_t>(slots);
  tr->unfreed = active.size();
  return true;
}

}  // namespace gpupool::trace
