#include "observe/symbols.hpp"

#include "sys/io.hpp"

#include <cxxabi.h>
#include <dlfcn.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

#if GPUPOOL_HAVE_LIBDW
#include <dwarf.h>
#include <elfutils/libdw.h>
#include <libelf.h>
#endif

namespace gpupool::symbols {
namespace {

// The file mapped, or nothing. Private: `writable` lets libelf change its
// copy of the pages (it rewrites section headers where it decompresses
// sections); the file itself is never written.
struct Mapping {
  const unsigned char* p = nullptr;
  std::size_t n = 0;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  explicit Mapping(const std::string& path, bool writable = false) {
    // Opened on gpupool's files thread (sys/io.hpp); the mapping is the
    // process's. Never waits: a FIFO at that path (anything but a regular
    // file is left alone below) would hold the files thread, and fork(),
    // forever. Moved above 2 where there is no private table.
    io::in_private([&] {
      const int fd =
          io::above_stdio(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
      if (fd < 0) return;
      struct stat st {};
      if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        void* m = mmap(nullptr, static_cast<std::size_t>(st.st_size),
                       writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_PRIVATE, fd, 0);
        if (m != MAP_FAILED) {
          p = static_cast<const unsigned char*>(m);
          n = static_cast<std::size_t>(st.st_size);
        }
      }
      ::close(fd);
    });
  }
  ~Mapping() {
    if (p) munmap(const_cast<unsigned char*>(p), n);
  }
  bool has(std::uint64_t off, std::uint64_t len) const { return off <= n && len <= n - off; }
};

// One source-level frame of an address.
struct SourceFrame {
  std::string function;  // demangled; empty when the debug information names none
  std::string file;
  int line = 0;          // 0: none
  bool inlined = false;  // a call inlined into the next frame
};

// "/a/b/../c/./d" as "/a/c/d": a source file named relative to its
// unit's directory, joined, reads as a path (symbolic links not followed).
std::string lexically_normal(const std::string& path) {
  std::vector<std::string> parts;
  std::size_t at = 0;
  while (at <= path.size()) {
    std::size_t slash = path.find('/', at);
    if (slash == std::string::npos) slash = path.size();
    const std::string part = path.substr(at, slash - at);
    if (part == "..") {
      if (!parts.empty()) parts.pop_back();
    } else if (!part.empty() && part != ".") {
      parts.push_back(part);
    }
    at = slash + 1;
  }
  std::string out;
  for (const std::string& p : parts) out += "/" + p;
  return out.empty() ? "/" : out;
}

std::string demangled(const char* name) {
  int status = -1;
  char* d = abi::__cxa_demangle(name, nullptr, nullptr, &status);
  std::string out = status == 0 && d ? d : name;
  std::free(d);
  return out;
}

#if GPUPOOL_HAVE_LIBDW
// elfutils' entry points, from libdw.so.1 (and libelf.so.1, which it
// links), loaded on first use; nullptr where it is not installed. Loaded on
// the calling thread, not the files thread (io.hpp): a program that exits
// from a library's constructor holds the loader's lock, which the files
// thread would wait for forever; the loader's own descriptor is closed
// before dlopen returns.
struct Libdw {
  decltype(&::elf_version) elf_version;
  decltype(&::elf_memory) elf_memory;
  decltype(&::elf_end) elf_end;
  decltype(&::dwarf_begin_elf) begin_elf;
  decltype(&::dwarf_end) end;
  decltype(&::dwarf_addrdie) addrdie;
  decltype(&::dwarf_nextcu) nextcu;
  decltype(&::dwarf_offdie) offdie;
  decltype(&::dwarf_haspc) haspc;
  decltype(&::dwarf_getsrc_die) getsrc_die;
  decltype(&::dwarf_linesrc) linesrc;
  decltype(&::dwarf_lineno) lineno;
  decltype(&::dwarf_getsrcfiles) getsrcfiles;
  decltype(&::dwarf_filesrc) filesrc;
  decltype(&::dwarf_getscopes) getscopes;
  decltype(&::dwarf_tag) tag;
  decltype(&::dwarf_diename) diename;
  decltype(&::dwarf_attr_integrate) attr_integrate;
  decltype(&::dwarf_formstring) formstring;
  decltype(&::dwarf_formudata) formudata;
};

template <typename F>
bool find(void* lib, F* out, const char* name) {
  *out = reinterpret_cast<F>(dlsym(lib, name));
  return *out != nullptr;
}

const Libdw* libdw() {
  static const Libdw* const dw = []() -> const Libdw* {
    // Never closed: the debug information it read is kept with the files.
    void* lib = dlopen("libdw.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib) return nullptr;
    static Libdw d;
    const bool ok =
        find(lib, &d.elf_version, "elf_version") && find(lib, &d.elf_memory, "elf_memory") &&
        find(lib, &d.elf_end, "elf_end") && find(lib, &d.begin_elf, "dwarf_begin_elf") &&
        find(lib, &d.end, "dwarf_end") && find(lib, &d.addrdie, "dwarf_addrdie") &&
        find(lib, &d.nextcu, "dwarf_nextcu") && find(lib, &d.offdie, "dwarf_offdie") &&
        find(lib, &d.haspc, "dwarf_haspc") && find(lib, &d.getsrc_die, "dwarf_getsrc_die") &&
        find(lib, &d.linesrc, "dwarf_linesrc") && find(lib, &d.lineno, "dwarf_lineno") &&
        find(lib, &d.getsrcfiles, "dwarf_getsrcfiles") && find(lib, &d.filesrc, "dwarf_filesrc") &&
        find(lib, &d.getscopes, "dwarf_getscopes") && find(lib, &d.tag, "dwarf_tag") &&
        find(lib, &d.diename, "dwarf_diename") &&
        find(lib, &d.attr_integrate, "dwarf_attr_integrate") &&
        find(lib, &d.formstring, "dwarf_formstring") && find(lib, &d.formudata, "dwarf_formudata");
    if (!ok || d.elf_version(EV_CURRENT) == EV_NONE) return nullptr;
    return &d;
  }();
  return dw;
}

// A file's DWARF, read by libdw from the mapped file. Every call that may
// open a file (libdw opens a dwz supplementary file on first need) runs on
// gpupool's files thread (io::in_private).
class Lines {
 public:
  // nullptr when the mapped file has no DWARF.
  static std::unique_ptr<Lines> read(const Libdw& dw, std::unique_ptr<Mapping> m) {
    if (!m->p) return nullptr;
    std::unique_ptr<Lines> l(new Lines(dw, std::move(m)));
    io::in_private([&] {
      l->elf_ = dw.elf_memory(reinterpret_cast<char*>(const_cast<unsigned char*>(l->map_->p)),
                              l->map_->n);
      if (l->elf_) l->dwarf_ = dw.begin_elf(l->elf_, DWARF_C_READ, nullptr);
    });
    return l->dwarf_ ? std::move(l) : nullptr;
  }
  ~Lines() {
    io::in_private([&] {
      if (dwarf_) dw_.end(dwarf_);
      if (elf_) dw_.elf_end(elf_);
    });
  }

  // The frames at `addr` (an address inside a call instruction), innermost
  // first; empty when no line covers it.
  std::vector<SourceFrame> at(std::uint64_t addr) {
    std::vector<SourceFrame> out;
    io::in_private([&] { frames(addr, &out); });
    return out;
  }

 private:
  Lines(const Libdw& dw, std::unique_ptr<Mapping> m) : dw_(dw), map_(std::move(m)) {}

  // The unit whose code covers addr: from .debug_aranges, else (compilers
  // that do not write it, such as clang by default) by asking each unit.
  bool unit_of(std::uint64_t addr, Dwarf_Die* cu) {
    if (dw_.addrdie(dwarf_, addr, cu)) return true;
    if (!units_listed_) {
      units_listed_ = true;
      Dwarf_Off off = 0, next;
      std::size_t header;
      while (dw_.nextcu(dwarf_, off, &next, &header, nullptr, nullptr, nullptr) == 0) {
        units_.push_back(off + header);
        off = next;
      }
    }
    for (Dwarf_Off u : units_)
      if (dw_.offdie(dwarf_, u, cu) && dw_.haspc(cu, addr) > 0) return true;
    return false;
  }

  // A file of the line table as an absolute path without "." or "..": one
  // named relative to the unit's directory (a build that hides its
  // directories from ccache, or DWARF 5's relative include directories)
  // joined to it; clang's "BUILD/../src/x.c" (a build directory beside the
  // sources) said as "src/x.c" is, as GCC's tables say it.
  std::string source_path(const char* file, Dwarf_Die* cu) {
    if (!file) return "?";
    if (file[0] == '/') return lexically_normal(file);
    Dwarf_Attribute a;
    const char* dir = dw_.attr_integrate(cu, DW_AT_comp_dir, &a) ? dw_.formstring(&a) : nullptr;
    if (!dir || dir[0] != '/') return file;
    return lexically_normal(std::string(dir) + "/" + file);
  }

  std::string name_of(Dwarf_Die* die) {
    Dwarf_Attribute a;
    const char* linkage = nullptr;
    if (dw_.attr_integrate(die, DW_AT_linkage_name, &a) ||
        dw_.attr_integrate(die, DW_AT_MIPS_linkage_name, &a))
      linkage = dw_.formstring(&a);
    if (linkage) return demangled(linkage);
    const char* name = dw_.diename(die);
    return name ? name : "";
  }

  void frames(std::uint64_t addr, std::vector<SourceFrame>* out) {
    Dwarf_Die cu;
    if (!unit_of(addr, &cu)) return;
    Dwarf_Line* line = dw_.getsrc_die(&cu, addr);
    if (!line) return;
    int lineno = 0;
    if (dw_.lineno(line, &lineno) != 0) lineno = 0;
    SourceFrame here{{}, source_path(dw_.linesrc(line, nullptr, nullptr), &cu), lineno, false};
    // The scopes around addr, innermost first: each inlined call's
    // function sits at the current line and was called from its
    // DW_AT_call_file:DW_AT_call_line, up to the function itself.
    Dwarf_Die* scopes = nullptr;
    const int n = dw_.getscopes(&cu, addr, &scopes);
    Dwarf_Files* files = nullptr;
    std::size_t nfiles = 0;
    for (int i = 0; i < n; ++i) {
      const int tag = dw_.tag(&scopes[i]);
      if (tag != DW_TAG_subprogram && tag != DW_TAG_inlined_subroutine) continue;
      here.function = name_of(&scopes[i]);
      here.inlined = tag == DW_TAG_inlined_subroutine;
      out->push_back(here);
      if (!here.inlined) break;
      Dwarf_Attribute a;
      Dwarf_Word call_file = 0, call_line = 0;
      if (!files && dw_.getsrcfiles(&cu, &files, &nfiles) != 0) files = nullptr;
      const char* f = nullptr;
      if (files && dw_.attr_integrate(&scopes[i], DW_AT_call_file, &a) &&
          dw_.formudata(&a, &call_file) == 0 && call_file < nfiles)
        f = dw_.filesrc(files, call_file, nullptr, nullptr);
      if (!dw_.attr_integrate(&scopes[i], DW_AT_call_line, &a) ||
          dw_.formudata(&a, &call_line) != 0)
        call_line = 0;
      here = {{}, source_path(f, &cu), static_cast<int>(call_line), false};
    }
    std::free(scopes);
    // No function around it (or no scopes read): the line alone.
    if (out->empty() || out->back().inlined) out->push_back(here);
  }

  const Libdw& dw_;
  std::unique_ptr<Mapping> map_;  // what elf_ reads
  Elf* elf_ = nullptr;
  Dwarf* dwarf_ = nullptr;
  bool units_listed_ = false;
  std::vector<Dwarf_Off> units_;
};
#else
class Lines {
 public:
  std::vector<SourceFrame> at(std::uint64_t) { return {}; }
};
#endif

}  // namespace

struct Files::File {
  struct Sym {
    std::uint64_t start, size;
    std::string name;  // mangled; demangled when asked for
  };
  std::vector<Sym> syms;  // by start
  std::string build_id;
  bool lines_read = false;
  std::unique_ptr<Lines> lines;  // null without libdw or debug information
  std::unordered_map<std::uint64_t, std::vector<std::string>> described;  // by return address
};

Files::Files() = default;
Files::~Files() = default;

void load_line_reader() {
#if GPUPOOL_HAVE_LIBDW
  libdw();
#endif
}

namespace {

void read_elf(const Mapping& m, Files::File* out) {
  if (!m.p || !m.has(0, sizeof(Elf64_Ehdr))) return;
  const auto* eh = reinterpret_cast<const Elf64_Ehdr*>(m.p);
  if (std::memcmp(eh->e_ident, ELFMAG, SELFMAG) != 0 || eh->e_ident[EI_CLASS] != ELFCLASS64) return;
  if (eh->e_shentsize != sizeof(Elf64_Shdr) ||
      !m.has(eh->e_shoff, std::uint64_t(eh->e_shnum) * sizeof(Elf64_Shdr)))
    return;
  const auto* sh = reinterpret_cast<const Elf64_Shdr*>(m.p + eh->e_shoff);
  // Symbols: the full table when the file has one, else the exported ones.
  for (unsigned want : {SHT_SYMTAB, SHT_DYNSYM}) {
    for (unsigned i = 0; i < eh->e_shnum && out->syms.empty(); ++i) {
      if (sh[i].sh_type != want || sh[i].sh_entsize != sizeof(Elf64_Sym) ||
          sh[i].sh_link >= eh->e_shnum)
        continue;
      const Elf64_Shdr& strs = sh[sh[i].sh_link];
      if (!m.has(sh[i].sh_offset, sh[i].sh_size) || !m.has(strs.sh_offset, strs.sh_size)) continue;
      const auto* sym = reinterpret_cast<const Elf64_Sym*>(m.p + sh[i].sh_offset);
      const char* names = reinterpret_cast<const char*>(m.p + strs.sh_offset);
      for (std::size_t k = 0; k < sh[i].sh_size / sizeof(Elf64_Sym); ++k) {
        if (ELF64_ST_TYPE(sym[k].st_info) != STT_FUNC || sym[k].st_shndx == SHN_UNDEF ||
            sym[k].st_name >= strs.sh_size)
          continue;
        const char* name = names + sym[k].st_name;
        const std::size_t len = strnlen(name, strs.sh_size - sym[k].st_name);
        out->syms.push_back({sym[k].st_value, sym[k].st_size, std::string(name, len)});
      }
    }
    if (!out->syms.empty()) break;
  }
  std::sort(out->syms.begin(), out->syms.end(),
            [](const auto& a, const auto& b) { return a.start < b.start; });
  // The build id note.
  for (unsigned i = 0; i < eh->e_shnum && out->build_id.empty(); ++i) {
    if (sh[i].sh_type != SHT_NOTE || !m.has(sh[i].sh_offset, sh[i].sh_size)) continue;
    const unsigned char* p = m.p + sh[i].sh_offset;
    const unsigned char* end = p + sh[i].sh_size;
    while (p + sizeof(Elf64_Nhdr) <= end) {
      const auto* nh = reinterpret_cast<const Elf64_Nhdr*>(p);
      const unsigned char* name = p + sizeof(Elf64_Nhdr);
      const unsigned char* desc = name + ((nh->n_namesz + 3) & ~3u);
      if (desc + nh->n_descsz > end) break;
      if (nh->n_type == NT_GNU_BUILD_ID && nh->n_namesz == 4 && !std::memcmp(name, "GNU", 4)) {
        for (unsigned b = 0; b < nh->n_descsz; ++b) {
          char x[3];
          std::snprintf(x, sizeof x, "%02x", desc[b]);
          out->build_id += x;
        }
        break;
      }
      p = desc + ((nh->n_descsz + 3) & ~3u);
    }
  }
}

}  // namespace

Files::File& Files::load(const std::string& path) {
  std::unique_ptr<File>& f = files_[path];
  if (!f) {
    f = std::make_unique<File>();
    read_elf(Mapping(path), f.get());
  }
  return *f;
}

Function Files::function_at(const std::string& path, std::uint64_t vaddr) {
  const File& f = load(path);
  if (f.syms.empty()) return {};
  auto it = std::upper_bound(f.syms.begin(), f.syms.end(), vaddr,
                             [](std::uint64_t v, const File::Sym& s) { return v < s.start; });
  // The closest symbol starting at or below vaddr that covers it (aliases
  // share a start; a size of 0 is taken as covering up to the next one).
  while (it != f.syms.begin()) {
    --it;
    if (vaddr < it->start + std::max<std::uint64_t>(it->size, 1) ||
        (it->size == 0 && std::next(it) != f.syms.end() && vaddr < std::next(it)->start)) {
      return {demangled(it->name.c_str()), vaddr - it->start};
    }
    if (it->size != 0 && vaddr >= it->start + it->size) break;
  }
  return {};
}

std::string Files::build_id(const std::string& path) { return load(path).build_id; }

const std::vector<std::string>& Files::describe(const std::string& path,
                                                std::uint64_t return_vaddr) {
  File& f = load(path);
  auto [it, fresh] = f.described.try_emplace(return_vaddr);
  std::vector<std::string>& out = it->second;
  if (!fresh) return out;
#if GPUPOOL_HAVE_LIBDW
  if (!f.lines_read) {
    f.lines_read = true;
    if (const Libdw* dw = libdw()) {
      f.lines = Lines::read(*dw, std::make_unique<Mapping>(path, true));
      // Debug information kept apart, named by the build id.
      if (!f.lines && f.build_id.size() > 2)
        f.lines = Lines::read(
            *dw, std::make_unique<Mapping>("/usr/lib/debug/.build-id/" + f.build_id.substr(0, 2) +
                                               "/" + f.build_id.substr(2) + ".debug",
                                           true));
    }
  }
#endif
  char hex[32];
  const std::string module = path.substr(path.rfind('/') + 1);
  // A return address: the call is the byte before it.
  const std::uint64_t call = return_vaddr - 1;
  const std::vector<SourceFrame> frames = f.lines ? f.lines->at(call) : std::vector<SourceFrame>{};
  if (!frames.empty()) {
    std::string outer;  // the function itself, where the debug information names none
    for (const SourceFrame& s : frames) {
      std::string name = s.function;
      if (name.empty() && !s.inlined) {
        if (outer.empty()) outer = function_at(path, call).name;
        name = outer;
      }
      out.push_back((name.empty() ? "?" : name) + " (" + s.file +
                    (s.line > 0 ? ":" + std::to_string(s.line) : std::string()) + ")" +
                    (s.inlined ? " [inlined]" : ""));
    }
    return out;
  }
  const Function fn = function_at(path, call);
  if (fn.name.empty()) {
    std::snprintf(hex, sizeof hex, "+0x%" PRIx64, return_vaddr);
    out.push_back(module + hex);
  } else {
    std::snprintf(hex, sizeof hex, "+0x%" PRIx64, fn.offset + 1);
    out.push_back(fn.name + hex + " (" + module + ")");
  }
  return out;
}

}  // namespace gpupool::symbols
