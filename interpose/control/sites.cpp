#include "interpose/control/sites.hpp"

#include "core/fork_wait.hpp"
#include "sys/log.hpp"

#include <dlfcn.h>
#include <elf.h>
#include <execinfo.h>
#include <limits.h>
#include <link.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpupool::sites {
namespace {

constexpr int kMaxNative = 48;
constexpr int kMaxPython = 32;

// ---- Python, found in the process, never imported --------------------------
// CPython's C functions, looked up once with dlsym: a process without
// Python (or with one older than 3.10, which lacks PyGC_Disable) records
// native frames only.
using PyObj = void;
struct Python {
  int (*is_initialized)();
  int (*gil_check)();
  // The thread state running here (3.12+: this thread's while it holds the
  // GIL, else NULL; before: the GIL holder's), and this thread's own.
  // PyGILState_Check alone says yes for every thread once a subinterpreter
  // exists (it turns its own check off).
  PyObj* (*tstate_unchecked)();
  PyObj* (*tstate_this_thread)();
  // The collector off while frames are walked: frame objects made for the
  // walk could trigger a collection, which would run the program's __del__
  // methods inside its allocation call.
  int (*gc_disable)();
  int (*gc_enable)();
  bool has_qualname;          // 3.11+ (Py_Version exists): code objects have co_qualname
  PyObj* (*current_frame)();  // borrowed
  PyObj* (*frame_code)(PyObj*);
  PyObj* (*frame_back)(PyObj*);
  int (*frame_line)(PyObj*);
  PyObj* (*get_attr)(PyObj*, const char*);
  const char* (*utf8)(PyObj*);
  void (*incref)(PyObj*);
  void (*decref)(PyObj*);
  void (*err_fetch)(PyObj**, PyObj**, PyObj**);
  void (*err_restore)(PyObj*, PyObj*, PyObj*);
  void (*err_clear)();
};

template <typename F>
bool find(F* out, const char* name) {
  *out = reinterpret_cast<F>(dlsym(RTLD_DEFAULT, name));
  return *out != nullptr;
}

const Python* python() {
  static const Python* const py = []() -> const Python* {
    static Python p;
    const bool ok =
        find(&p.is_initialized, "Py_IsInitialized") && find(&p.gil_check, "PyGILState_Check") &&
        find(&p.current_frame, "PyEval_GetFrame") && find(&p.frame_code, "PyFrame_GetCode") &&
        find(&p.frame_back, "PyFrame_GetBack") && find(&p.frame_line, "PyFrame_GetLineNumber") &&
        find(&p.get_attr, "PyObject_GetAttrString") && find(&p.utf8, "PyUnicode_AsUTF8") &&
        find(&p.incref, "Py_IncRef") && find(&p.decref, "Py_DecRef") &&
        find(&p.err_fetch, "PyErr_Fetch") && find(&p.err_restore, "PyErr_Restore") &&
        find(&p.err_clear, "PyErr_Clear") &&
        (find(&p.tstate_unchecked, "PyThreadState_GetUnchecked") ||
         find(&p.tstate_unchecked, "_PyThreadState_UncheckedGet")) &&
        find(&p.tstate_this_thread, "PyGILState_GetThisThreadState") &&
        find(&p.gc_disable, "PyGC_Disable") && find(&p.gc_enable, "PyGC_Enable");
    p.has_qualname = dlsym(RTLD_DEFAULT, "Py_Version") != nullptr;
    return ok ? &p : nullptr;
  }();
  return py;
}

std::string py_text(const Python& py, PyObj* code, const char* name) {
  PyObj* o = py.get_attr(code, name);
  if (!o) {
    py.err_clear();
    return {};
  }
  const char* s = py.utf8(o);
  std::string out = s ? s : "";
  if (!s) py.err_clear();
  py.decref(o);
  return out;
}

// The calling thread's Python frames, innermost first, as "LINE FUNC\tFILE";
// none unless Python runs and this thread holds the GIL. An exception the
// program has set, and the collector's state, are kept as they were.
void python_frames(std::vector<std::string>* out) {
  const Python* py = python();
  if (!py || !py->is_initialized() || !py->gil_check()) return;
  PyObj* running = py->tstate_unchecked();
  if (!running || running != py->tstate_this_thread()) return;
  PyObj *type = nullptr, *value = nullptr, *tb = nullptr;
  py->err_fetch(&type, &value, &tb);
  const int gc_was_on = py->gc_disable();
  PyObj* f = py->current_frame();
  if (f) py->incref(f);
  try {
    for (int depth = 0; f && depth < kMaxPython; ++depth) {
      PyObj* code = py->frame_code(f);
      // -1: an instruction without a line; the trace wants a number.
      const int line = std::max(py->frame_line(f), 0);
      if (code) {
        std::string func = py->has_qualname ? py_text(*py, code, "co_qualname") : std::string();
        if (func.empty()) func = py_text(*py, code, "co_name");
        for (char& c : func)
          if (c == ' ' || c == '\t' || c == '\n') c = '_';
        std::string file = py_text(*py, code, "co_filename");
        for (char& c : file)
          if (c == '\n' || c == '\t') c = ' ';
        py->decref(code);
        // An empty name (compile(src, "", ...), or one UTF-8 cannot
        // encode) would leave the trace line a field short.
        out->push_back(std::to_string(line) + " " + (func.empty() ? "?" : func) + "\t" +
                       (file.empty() ? "?" : file));
      }
      PyObj* back = py->frame_back(f);
      py->decref(f);
      f = back;
    }
  } catch (...) {  // out of memory: the frames so far
  }
  if (f) py->decref(f);
  if (gc_was_on) py->gc_enable();
  py->err_restore(type, value, tb);
}

// ---- this library's own frames -----------------------------------------------
// [start, end) of libgpupool's code: the frames of gpupool's hooks, which
// every stack starts with, are left out.
struct Range {
  std::uint64_t start = 0, end = 0;
};
Range own_code() {
  static const Range r = [] {
    Range out;
    Dl_info info{};
    if (!dladdr(reinterpret_cast<void*>(&own_code), &info) || !info.dli_fbase) return out;
    struct Find {
      const void* base;
      Range* out;
    } find{info.dli_fbase, &out};
    dl_iterate_phdr(
        [](dl_phdr_info* i, size_t, void* p) {
          auto* f = static_cast<Find*>(p);
          if (reinterpret_cast<const void*>(i->dlpi_addr) != f->base) return 0;
          for (int k = 0; k < i->dlpi_phnum; ++k) {
            const ElfW(Phdr)& ph = i->dlpi_phdr[k];
            if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
            const std::uint64_t s = i->dlpi_addr + ph.p_vaddr;
            *f->out = {s, s + ph.p_memsz};
            return 1;
          }
          return 0;
        },
        &find);
    return out;
  }();
  return r;
}

std::string hex(std::uint64_t v) {
  char b[20];
  std::snprintf(b, sizeof b, "%" PRIx64, v);
  return b;
}

std::string base_name(const char* path) {
  const char* slash = path ? std::strrchr(path, '/') : nullptr;
  return slash ? slash + 1 : (path && *path ? path : "?");
}

// Per thread: how far to the next sampled allocation.
thread_local std::uint64_t tl_count = 0;
thread_local std::int64_t tl_bytes_left = -1;  // -1: not drawn yet
thread_local std::uint64_t tl_random = 0;
thread_local bool tl_inside = false;

// Uniform in [1, 2n]: byte sampling at random points, so a program whose
// allocations repeat with the sampling period is not always caught at the
// same call.
std::int64_t draw(std::uint64_t n) {
  n = std::min<std::uint64_t>(n, std::uint64_t{1} << 61);  // 2n + 1 stays a positive int64
  if (tl_random == 0) tl_random = reinterpret_cast<std::uint64_t>(&tl_random) | 1;
  tl_random ^= tl_random << 13;
  tl_random ^= tl_random >> 7;
  tl_random ^= tl_random << 17;
  return static_cast<std::int64_t>(1 + tl_random % (2 * n));
}

}  // namespace

Sites* Sites::create(const config::SiteSampling& sampling) {
  if (!sampling.on()) return nullptr;
  // backtrace() loads libgcc_s on its first call: here, on the thread that
  // starts gpupool, not inside some allocation.
  void* warm[2];
  backtrace(warm, 2);
  own_code();
  return new Sites(sampling);
}

std::uint32_t Sites::capture(std::uint64_t requested) noexcept {
  if (tl_inside) return kNoSite;
  if (sampling_.mode == config::SiteSampling::Mode::every) {
    if (++tl_count < sampling_.n) return kNoSite;
    tl_count = 0;
  } else {
    if (tl_bytes_left < 0) tl_bytes_left = draw(sampling_.n);
    tl_bytes_left -= static_cast<std::int64_t>(std::min<std::uint64_t>(requested, INT64_MAX / 2));
    if (tl_bytes_left > 0) return kNoSite;
    tl_bytes_left = draw(sampling_.n);
  }
  tl_inside = true;
  std::uint32_t id = kNoSite;
  try {
    void* raw[kMaxNative];
    const int n = backtrace(raw, kMaxNative);
    const Range self = own_code();
    auto ours = [&](int i) {
      const auto pc = reinterpret_cast<std::uint64_t>(raw[i]);
      return pc >= self.start && pc < self.end;
    };
    // The stack starts inside gpupool (this function, the pool, the hook),
    // or in a sanitizer's backtrace interceptor just above that: both left
    // out, from the first frame of the program's.
    int skip = 0;
    while (skip < n && skip < 4 && !ours(skip)) ++skip;
    if (skip == n || skip == 4) skip = 0;
    while (skip < n && ours(skip)) ++skip;
    std::uint64_t pcs[kMaxNative];
    for (int i = skip; i < n; ++i) pcs[i - skip] = reinterpret_cast<std::uint64_t>(raw[i]);
    std::vector<std::string> py;
    python_frames(&py);
    LockGuard lock(mu_);
    id = intern(pcs, n - skip, py);
    ++sampled_;
  } catch (...) {
    id = kNoSite;  // out of host memory: this allocation goes without a site
  }
  tl_inside = false;
  return id;
}

void Sites::add_module_of(std::uint64_t pc) {
  struct Find {
    std::uint64_t pc;
    Sites* self;
  } find{pc, this};
  dl_iterate_phdr(
      [](dl_phdr_info* i, size_t, void* p) {
        auto* f = static_cast<Find*>(p);
        bool mine = false;
        for (int k = 0; k < i->dlpi_phnum && !mine; ++k) {
          const ElfW(Phdr)& ph = i->dlpi_phdr[k];
          const std::uint64_t s = i->dlpi_addr + ph.p_vaddr;
          mine =
              ph.p_type == PT_LOAD && (ph.p_flags & PF_X) && f->pc >= s && f->pc < s + ph.p_memsz;
        }
        if (!mine) return 0;
        // The build id, from the object's notes as loaded.
        std::string build_id;
        for (int k = 0; k < i->dlpi_phnum && build_id.empty(); ++k) {
          const ElfW(Phdr)& ph = i->dlpi_phdr[k];
          if (ph.p_type != PT_NOTE) continue;
          const char* p = reinterpret_cast<const char*>(i->dlpi_addr + ph.p_vaddr);
          const char* end = p + ph.p_memsz;
          while (p + sizeof(ElfW(Nhdr)) <= end) {
            const auto* nh = reinterpret_cast<const ElfW(Nhdr)*>(p);
            const char* name = p + sizeof(ElfW(Nhdr));
            const char* desc = name + ((nh->n_namesz + 3) & ~3u);
            if (desc + nh->n_descsz > end) break;
            if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 &&
                !std::memcmp(name, "GNU", 4)) {
              for (unsigned b = 0; b < nh->n_descsz; ++b) {
                char x[3];
                std::snprintf(x, sizeof x, "%02x", static_cast<unsigned char>(desc[b]));
                build_id += x;
              }
              break;
            }
            p = desc + ((nh->n_descsz + 3) & ~3u);
          }
        }
        std::string path = i->dlpi_name ? i->dlpi_name : "";
        if (path.empty()) {  // the main program
          char exe[PATH_MAX];
          const ssize_t m = readlink("/proc/self/exe", exe, sizeof exe - 1);
          if (m > 0) path.assign(exe, static_cast<std::size_t>(m));
        }
        if (path.empty()) path = "?";
        for (char& c : path)
          if (c == '\n') c = ' ';
        Sites& s = *f->self;
        for (int k = 0; k < i->dlpi_phnum; ++k) {
          const ElfW(Phdr)& ph = i->dlpi_phdr[k];
          if (ph.p_type != PT_LOAD || !(ph.p_flags & PF_X)) continue;
          const std::uint64_t start = i->dlpi_addr + ph.p_vaddr, end = start + ph.p_memsz;
          s.decls_.push_back("module " + std::to_string(s.modules_.size()) + " " + hex(start) +
                             " " + hex(end) + " " + hex(i->dlpi_addr) + " " +
                             (build_id.empty() ? "-" : build_id) + " " + path + "\n");
          s.modules_.push_back({start, end, i->dlpi_addr, path, build_id});
        }
        return 1;
      },
      &find);
}

// A library unloaded (dlclose) since the last look: its addresses may hold
// another one now. The stacks and modules known so far are kept for the
// sites already declared, but new stacks are interned and their modules
// looked up and declared anew. One call to the loader, which stops at the
// first object (the counts are in every object's record).
void Sites::note_unloads() {
  unsigned long long subs = 0;
  dl_iterate_phdr(
      [](dl_phdr_info* i, size_t size, void* p) {
        if (size >= offsetof(dl_phdr_info, dlpi_subs) + sizeof i->dlpi_subs)
          *static_cast<unsigned long long*>(p) = i->dlpi_subs;
        return 1;
      },
      &subs);
  if (subs == unloads_seen_) return;
  unloads_seen_ = subs;
  modules_from_ = modules_.size();
  site_ids_.clear();
}

std::uint32_t Sites::intern(const std::uint64_t* pcs, int npcs,
                            const std::vector<std::string>& pyframes) {
  note_unloads();
  // At the limit, only stacks already known get their site.
  const bool full = sites_.size() >= kMaxSites;
  auto over = [&] {
    if (over_limit_++ == 0)
      log().warn(
          "GPUPOOL_SITES: {} distinct call stacks recorded; allocations from new ones "
          "are left without a site",
          kMaxSites);
    return kNoSite;
  };
  std::vector<std::uint32_t> frame_ids;
  for (const std::string& f : pyframes) {
    if (full) {
      const auto known = pyframe_ids_.find(f);
      if (known == pyframe_ids_.end()) return over();
      frame_ids.push_back(known->second);
      continue;
    }
    auto [it, fresh] =
        pyframe_ids_.try_emplace(f, static_cast<std::uint32_t>(pyframe_text_.size()));
    if (fresh) {
      // f is "LINE FUNC\tFILE".
      const std::size_t tab = f.find('\t');
      const std::string line_func = f.substr(0, tab), file = f.substr(tab + 1);
      decls_.push_back("pyframe " + std::to_string(it->second) + " " + line_func + " " + file +
                       "\n");
      const std::size_t sp = line_func.find(' ');
      pyframe_text_.push_back(line_func.substr(sp + 1) + " (" + file + ":" +
                              line_func.substr(0, sp) + ")");
    }
    frame_ids.push_back(it->second);
  }
  std::string key(reinterpret_cast<const char*>(pcs), sizeof(std::uint64_t) * npcs);
  key.append(reinterpret_cast<const char*>(frame_ids.data()),
             sizeof(std::uint32_t) * frame_ids.size());
  key.push_back(static_cast<char>(frame_ids.size()));
  if (full) {
    const auto known = site_ids_.find(key);
    return known != site_ids_.end() ? known->second : over();
  }
  auto [it, fresh] =
      site_ids_.try_emplace(std::move(key), static_cast<std::uint32_t>(sites_.size()));
  if (!fresh) return it->second;
  for (int i = 0; i < npcs; ++i) {
    bool known = false;
    for (std::size_t k = modules_from_; k < modules_.size() && !known; ++k)
      known = pcs[i] >= modules_[k].start && pcs[i] < modules_[k].end;
    if (!known) add_module_of(pcs[i]);
  }
  Site s;
  s.pcs.assign(pcs, pcs + npcs);
  s.pyframes = frame_ids;
  s.modules_end = modules_.size();
  std::string line = "site " + std::to_string(it->second) + " ";
  for (int i = 0; i < npcs; ++i) line += (i ? "," : "") + hex(pcs[i]);
  if (npcs == 0) line += "-";
  line += " ";
  for (std::size_t i = 0; i < frame_ids.size(); ++i)
    line += (i ? "," : "") + std::to_string(frame_ids[i]);
  if (frame_ids.empty()) line += "-";
  decls_.push_back(line + "\n");
  sites_.push_back(std::move(s));
  return it->second;
}

std::size_t Sites::declarations(std::size_t from, std::string* out) {
  LockGuard lock(mu_);
  for (std::size_t i = from; i < decls_.size(); ++i) *out += decls_[i];
  return decls_.size();
}

std::string Sites::describe(std::uint32_t site, const char* indent) {
  // The loader's lock is taken outside ours: a library's constructor may
  // allocate, and wait for ours inside the loader.
  symbols::load_line_reader();
  LockGuard lock(mu_);
  if (site >= sites_.size()) return std::string(indent) + "(no site recorded)\n";
  if (!symbols_) symbols_ = std::make_unique<symbols::Files>();
  const Site& s = sites_[site];
  std::string out;
  for (std::uint32_t f : s.pyframes) out += std::string(indent) + "py  " + pyframe_text_[f] + "\n";
  // Under Python the interpreter's own frames say little: fewer shown.
  const std::size_t shown = s.pyframes.empty() ? 16 : 6;
  for (std::size_t k = 0; k < s.pcs.size() && k < shown; ++k) {
    const std::uint64_t pc = s.pcs[k];
    const Module* m = nullptr;
    for (std::size_t j = s.modules_end; j-- > 0 && !m;)
      if (pc >= modules_[j].start && pc < modules_[j].end) m = &modules_[j];
    if (!m) {
      out += std::string(indent) + "0x" + hex(pc) + "\n";
      continue;
    }
    // Only the file that was loaded names anything (it may have been
    // replaced on disk since).
    if (!m->build_id.empty() && symbols_->build_id(m->path) != m->build_id) {
      out += std::string(indent) + base_name(m->path.c_str()) + "+0x" + hex(pc - m->bias) +
             " (file changed since it was loaded)\n";
      continue;
    }
    for (const std::string& frame : symbols_->describe(m->path, pc - m->bias))
      out += std::string(indent) + frame + "\n";
  }
  if (s.pcs.size() > shown)
    out += std::string(indent) + "(" + std::to_string(s.pcs.size() - shown) + " more frames)\n";
  if (s.pcs.empty() && s.pyframes.empty()) out += std::string(indent) + "(empty stack)\n";
  return out;
}

std::uint64_t Sites::sampled() const {
  LockGuard lock(mu_);
  return sampled_;
}

bool Sites::fork_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { return fork_wait::take(mu_); }
void Sites::fork_parent() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { mu_.unlock(); }
void Sites::fork_child() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { mu_.unlock(); }

}  // namespace gpupool::sites
