// GPUPOOL_STATS_AT_EXIT in a process where nothing was intercepted: instead
// of no dump at all (the runtime starts at the first GPU call, and with it
// the exit dump), one line saying so and why, where that can be told. Only
// in the process `gpupool run` started (GPUPOOL_RUN_PID): the other
// processes of a shell script, say, stay silent.
#include <dirent.h>
#include <errno.h>
#include <link.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "interpose/control/control.hpp"
#include "interpose/control/internal.hpp"
#include "interpose/runtime.hpp"
#include "sys/io.hpp"
#include "sys/process_config.hpp"

#ifndef GPUPOOL_VERSION
#define GPUPOOL_VERSION "unknown"
#endif

namespace gpupool::control {
namespace {

// Which of the libraries gpupool intercepts the process has loaded.
struct Loaded {
  bool cuda = false;    // the driver, libcuda.so.1
  bool cudart = false;  // the CUDA runtime, which loads the driver at its first call
  bool opencl = false;  // an ICD loader, libOpenCL.so.1
};

int note_library(dl_phdr_info* info, size_t, void* arg) {
  const char* path = info->dlpi_name;
  if (!path || !*path) return 0;
  const char* slash = strrchr(path, '/');
  const char* base = slash ? slash + 1 : path;
  auto* l = static_cast<Loaded*>(arg);
  if (!strncmp(base, "libcuda.so", 10)) l->cuda = true;
  else if (!strncmp(base, "libcudart.so", 12)) l->cudart = true;
  else if (!strncmp(base, "libOpenCL.so", 12)) l->opencl = true;
  return 0;
}

// Where the OpenCL loaders look for platforms: ocl-icd's OCL_ICD_VENDORS
// (a directory or one .icd file), the Khronos loader's OCL_ICD_FILENAMES,
// else /etc/OpenCL/vendors. Empty when a platform file is there, else the
// place looked at.
std::string missing_icd() {
  const char* files = getenv("OCL_ICD_FILENAMES");
  if (files && *files) return {};
  const char* dir = getenv("OCL_ICD_VENDORS");
  if (!dir || !*dir) dir = "/etc/OpenCL/vendors";
  struct stat st {};
  if (stat(dir, &st) == 0 && S_ISREG(st.st_mode)) return {};
  if (DIR* d = opendir(dir)) {
    bool found = false;
    while (const dirent* e = readdir(d)) {
      const std::size_t n = strlen(e->d_name);
      if (n > 4 && !strcmp(e->d_name + n - 4, ".icd")) found = true;
    }
    closedir(d);
    if (found) return {};
  }
  return dir;
}

std::string nothing_intercepted(const config::Config& cfg) {
  if (cfg.disable) return "GPUPOOL_DISABLE=1: every call went straight to the driver";
  Loaded l;
  dl_iterate_phdr(note_library, &l);
  std::string why;
  if (l.cuda) why = "libcuda.so.1 was loaded, but no CUDA context or allocation reached gpupool";
  else if (l.cudart)
    why =
        "the CUDA runtime (libcudart) was loaded but never loaded the driver (libcuda.so.1): "
        "no CUDA call was made, or no NVIDIA driver was found";
  else why = "no CUDA driver (libcuda.so.1) was loaded";
  if (!l.opencl) {
    why += "; no OpenCL loader (libOpenCL.so.1) was loaded";
  } else if (const std::string where = missing_icd(); !where.empty()) {
    why += "; libOpenCL.so.1 was loaded, but no OpenCL platform is installed (no .icd file in " +
           where + ")";
  } else {
    why += "; libOpenCL.so.1 was loaded, but no OpenCL context or buffer reached gpupool";
  }
  return why;
}

// The exit dump of a process whose runtime never started. A destructor of
// the library: it runs after the program's exit handlers (a GPU call in one
// of those started the runtime, whose own exit dump then counts).
__attribute__((destructor)) void idle_exit_dump() {
  if (runtime_if_started()) return;
  // Cheap for every other process: no parse unless it is the one.
  const char* run = getenv("GPUPOOL_RUN_PID");
  if (!run || std::atol(run) != static_cast<long>(getpid())) return;
  try {
    const config::Config& cfg = config::get_unlogged();
    if (!cfg.stats_at_exit || cfg.run_pid != static_cast<long>(getpid())) return;
    std::string text;
    const std::string why = nothing_intercepted(cfg);
    if (cfg.stats_format == config::StatsFormat::json) {
      // A dump as the schema has it, with nothing in it but the reason.
      stats::Report r;
      r.version = GPUPOOL_VERSION;
      r.pid = static_cast<long>(getpid());
      timespec ts;
      clock_gettime(CLOCK_REALTIME, &ts);
      r.time = static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
      r.reason = "exit";
      r.holding = cfg.hold;
      for (const config::ActionInfo& a : config::kActionInfo)
        r.signals.push_back({a.name, cfg.*a.signal, false});
      r.warnings.push_back("nothing intercepted: " + why);
      text = stats::to_json(r) + "\n";
    } else {
      text = "gpupool " GPUPOOL_VERSION " stats: pid " + std::to_string(getpid()) + " (" +
             program_invocation_short_name + "), exit: nothing intercepted: " + why + "\n";
    }
    if (cfg.stats_file.empty()) {
      io::write_stderr(text);
      return;
    }
    std::string unused;
    io::OwnedFd fd = io::open_output(io::expand_path(cfg.stats_file, static_cast<long>(getpid())),
                                     /*append=*/true, &unused);
    if (fd.valid()) io::write_bounded(fd.get(), text);
  } catch (...) {
    // Out of host memory at exit: the line is not worth the program's exit.
  }
}

}  // namespace
}  // namespace gpupool::control
