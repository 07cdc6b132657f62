#include "interpose/control/symbols.hpp"

#include "config/io.hpp"

#include <cxxabi.h>
#include <elf.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace gpupool::symbols {

struct Files::File {
  struct Sym {
    std::uint64_t start, size;
    std::string name;  // mangled; demangled when asked for
  };
  std::vector<Sym> syms;  // by start
  std::string build_id;
};

Files::Files() = default;
Files::~Files() = default;

namespace {

// The file mapped read-only, or nothing.
struct Mapping {
  const unsigned char* p = nullptr;
  std::size_t n = 0;
  Mapping(const std::string& path) {
    // Opened on gpupool's files thread (config/io.hpp); the mapping is the
    // process's. Never waits: a FIFO at that path (anything but a regular
    // file is left alone below) would hold the files thread, and fork(),
    // forever. Moved above 2 where there is no private table.
    io::in_private([&] {
      const int fd = io::above_stdio(::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY));
      if (fd < 0) return;
      struct stat st{};
      if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
        void* m = mmap(nullptr, static_cast<std::size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0);
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
      if (sh[i].sh_type != want || sh[i].sh_entsize != sizeof(Elf64_Sym) || sh[i].sh_link >= eh->e_shnum)
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
  auto it = std::upper_bound(f.syms.begin(), f.syms.end(), vaddr,
                             [](std::uint64_t v, const File::Sym& s) { return v < s.start; });
  // The closest symbol starting at or below vaddr that covers it (aliases
  // share a start; a size of 0 is taken as covering up to the next one).
  while (it != f.syms.begin()) {
    --it;
    if (vaddr < it->start + std::max<std::uint64_t>(it->size, 1) ||
        (it->size == 0 && std::next(it) != f.syms.end() && vaddr < std::next(it)->start)) {
      int status = -1;
      char* d = abi::__cxa_demangle(it->name.c_str(), nullptr, nullptr, &status);
      Function out{status == 0 && d ? d : it->name, vaddr - it->start};
      std::free(d);
      return out;
    }
    if (it->size != 0 && vaddr >= it->start + it->size) break;
  }
  return {};
}

std::string Files::build_id(const std::string& path) { return load(path).build_id; }

}  // namespace gpupool::symbols
