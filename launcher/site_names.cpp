#include "launcher/site_names.hpp"

#include <algorithm>
#include <cctype>
#include <cinttypes>
#include <cstdio>

namespace gpupool::launcher {
namespace {

std::string base_name(const std::string& path) { return path.substr(path.rfind('/') + 1); }

// .../lib/pythonX.Y/ or .../lib64/pythonX.Y/ (and pypy's lib/pypyX.Y/).
bool in_python_lib_dir(const std::string& path) {
  for (const char* dir : {"/lib/python", "/lib64/python", "/lib/pypy", "/lib64/pypy"}) {
    for (std::size_t at = path.find(dir); at != std::string::npos; at = path.find(dir, at + 1)) {
      const std::size_t v = at + std::char_traits<char>::length(dir);
      if (v < path.size() && std::isdigit(static_cast<unsigned char>(path[v]))) return true;
    }
  }
  return false;
}

bool installed_package(const std::string& path) {
  return path.find("/site-packages/") != std::string::npos ||
         path.find("/dist-packages/") != std::string::npos || in_python_lib_dir(path);
}

}  // namespace

bool python_library_file(const std::string& file) {
  return file.rfind("<frozen ", 0) == 0 || installed_package(file);
}

bool gpu_runtime_module(const std::string& path) {
  const std::string base = base_name(path);
  for (const char* lib : {"libcuda.", "libcudart", "libOpenCL", "libpocl", "libnvidia-",
                          "libgpupool", "libcublas", "libc10_cuda"})
    if (base.rfind(lib, 0) == 0) return true;
  return false;
}

bool library_module(const std::string& path) {
  if (gpu_runtime_module(path) || installed_package(path)) return true;
  // The interpreter: libpython3.X.so, or the python3.X executable itself.
  const std::string base = base_name(path);
  if (base.rfind("libpython", 0) == 0) return true;
  return base.rfind("python", 0) == 0 && std::all_of(base.begin() + 6, base.end(), [](char c) {
           return c == '.' || std::isdigit(static_cast<unsigned char>(c));
         });
}

const NamedSite& Namer::site(std::uint32_t s) {
  auto it = named_.find(s);
  if (it != named_.end()) return it->second;
  NamedSite n;
  if (s == trace::kNoSite) {
    n.label = "(no call stack recorded)";
    return named_.emplace(s, n).first->second;
  }
  const trace::SiteDecl& d = tr_.sites[s];
  std::string own_python;
  for (std::uint32_t f : d.pyframes) {
    const trace::PyFrameDecl& p = tr_.pyframes[f];
    n.frames.push_back("py " + p.func + " (" + p.file + ":" + std::to_string(p.line) + ")");
    if (own_python.empty() && !python_library_file(p.file)) own_python = n.frames.back();
  }
  std::string own, outside_runtimes;
  for (std::uint64_t pc : d.pcs) {
    const trace::ModuleDecl* m = module_of(pc, d.modules_end);
    std::vector<std::string> named = frames(pc, m);
    if (m && own.empty() && !library_module(m->path)) own = named.front();
    if (m && outside_runtimes.empty() && !gpu_runtime_module(m->path))
      outside_runtimes = named.front();
    for (std::string& f : named) n.frames.push_back(std::move(f));
  }
  if (!own_python.empty()) n.label = own_python;
  else if (!d.pyframes.empty()) n.label = n.frames.front();
  else if (!own.empty()) n.label = own;
  else if (!outside_runtimes.empty()) n.label = outside_runtimes;
  else if (!n.frames.empty()) n.label = n.frames.front();
  else n.label = "(empty stack)";
  return named_.emplace(s, std::move(n)).first->second;
}

// The last module declared before the site that covers pc: a library
// unloaded and another loaded at its addresses is declared again.
const trace::ModuleDecl* Namer::module_of(std::uint64_t pc, std::size_t modules_end) const {
  for (std::size_t k = std::min(modules_end, tr_.modules.size()); k-- > 0;)
    if (pc >= tr_.modules[k].start && pc < tr_.modules[k].end) return &tr_.modules[k];
  return nullptr;
}

std::vector<std::string> Namer::frames(std::uint64_t pc, const trace::ModuleDecl* m) {
  char hex[32];
  if (!m) {
    std::snprintf(hex, sizeof hex, "0x%" PRIx64, pc);
    return {hex};
  }
  // Only a file that is the one traced names anything.
  if (!m->build_id.empty()) {
    auto [it, fresh] = same_file_.try_emplace(m->path, false);
    if (fresh) it->second = files_.build_id(m->path) == m->build_id;
    if (!it->second) {
      std::snprintf(hex, sizeof hex, "+0x%" PRIx64, pc - m->bias);
      return {base_name(m->path) + hex + " (file changed since the trace)"};
    }
  }
  return files_.describe(m->path, pc - m->bias);
}

}  // namespace gpupool::launcher
