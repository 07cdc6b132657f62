#include "launcher/trace_tools.hpp"

#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "launcher/launcher.hpp"

namespace gpupool::launcher {

bool read_trace_for(const char* cmd, const std::string& path, trace::TraceFile* tr) {
  std::string error;
  if (!trace::read_trace(path, tr, &error, /*lenient=*/true)) {
    std::fprintf(stderr, "%s: %s: %s\n", kProg, cmd, error.c_str());
    return false;
  }
  if (tr->truncated_tail)
    std::fprintf(stderr, "%s: %s: %s: the last line is incomplete (the program was "
                         "killed while writing it); read without it\n",
                 kProg, cmd, path.c_str());
  if (tr->unpaired)
    std::fprintf(stderr, "%s: %s: %s: %" PRIu64 " records do not pair with the others "
                         "(records lost when the program was killed?); read without them\n",
                 kProg, cmd, path.c_str(), tr->unpaired);
  return true;
}

bool write_whole(const std::string& path, const std::string& data, std::string* why) {
  if (path == "-") {
    if (std::fwrite(data.data(), 1, data.size(), stdout) != data.size() || std::fflush(stdout)) {
      *why = std::string("writing standard output: ") + std::strerror(errno);
      return false;
    }
    return true;
  }
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  FILE* f = std::fopen(tmp.c_str(), "wbx");
  if (!f) {
    *why = "cannot create " + tmp + ": " + std::strerror(errno);
    return false;
  }
  const bool ok = std::fwrite(data.data(), 1, data.size(), f) == data.size();
  const int err = errno;
  if (std::fclose(f) != 0 || !ok) {
    *why = "writing " + tmp + ": " + std::strerror(ok ? errno : err);
    std::remove(tmp.c_str());
    return false;
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    *why = "cannot rename to " + path + ": " + std::strerror(errno);
    std::remove(tmp.c_str());
    return false;
  }
  return true;
}

}  // namespace gpupool::launcher
