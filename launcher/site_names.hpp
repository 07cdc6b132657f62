// The allocation sites of a trace named for people (`gpupool report`):
// each site's frames, innermost first (Python's, then the native ones,
// named from the modules' files: symbols.hpp), and its label, the frame
// tables show: where the program's own code asked for the memory.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "observe/symbols.hpp"
#include "observe/trace_reader.hpp"

namespace gpupool::launcher {

// Python source of the standard library or of an installed package, not
// the program's: under .../lib/pythonX.Y/ (the standard library, and a
// virtual environment's or conda's packages), in site-packages or
// dist-packages, or frozen into the interpreter ("<frozen runpy>").
bool python_library_file(const std::string& file);

// A native module the program calls into rather than its own code: the GPU
// runtimes (libcuda, libcudart, libcublas, libnvidia-*, libOpenCL, PoCL,
// gpupool, PyTorch's libc10_cuda), the Python interpreter, and what Python
// packages install (as python_library_file).
bool gpu_runtime_module(const std::string& path);
bool library_module(const std::string& path);

struct NamedSite {
  std::string label;                // what tables show
  std::vector<std::string> frames;  // innermost first, Python first
};

// Names the sites of one trace. The label: with Python frames, the
// innermost one outside the libraries (python_library_file; all inside:
// the innermost); else the innermost native frame outside the libraries
// (library_module), else outside the GPU runtimes, else the innermost.
// Only a module file with the traced build id names anything: another one
// shows its frames as `module+offset (file changed since the trace)`.
class Namer {
 public:
  explicit Namer(const trace::TraceFile& tr) : tr_(tr) {}
  const NamedSite& site(std::uint32_t s);

 private:
  const trace::ModuleDecl* module_of(std::uint64_t pc, std::size_t modules_end) const;
  std::vector<std::string> frames(std::uint64_t pc, const trace::ModuleDecl* m);

  const trace::TraceFile& tr_;
  symbols::Files files_;
  std::map<std::string, bool> same_file_;
  std::unordered_map<std::uint32_t, NamedSite> named_;
};

}  // namespace gpupool::launcher
