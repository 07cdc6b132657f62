#include "launcher/trace_tools.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <csignal>

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

namespace {

// A device or FIFO the user named: written into (never replaced). A FIFO
// nobody reads is an error at once, not a wait.
bool write_into(const std::string& path, const std::string& data, std::string* why) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  if (fd < 0) {
    *why = errno == ENXIO ? path + " is a FIFO with no reader (or a socket): nothing written"
                          : "cannot open " + path + ": " + std::strerror(errno);
    return false;
  }
  const int flags = ::fcntl(fd, F_GETFL);
  if (flags >= 0) ::fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);  // a slow reader is waited for
  std::signal(SIGPIPE, SIG_IGN);  // a reader that leaves gives EPIPE, not our death
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      *why = "writing " + path + ": " + std::strerror(n < 0 ? errno : EIO);
      ::close(fd);
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  if (::close(fd) != 0 && errno != EINTR) {
    *why = "writing " + path + ": " + std::strerror(errno);
    return false;
  }
  return true;
}

}  // namespace

bool write_whole(const std::string& path, const std::string& data, std::string* why) {
  if (path == "-") {
    if (std::fwrite(data.data(), 1, data.size(), stdout) != data.size() || std::fflush(stdout)) {
      *why = std::string("writing standard output: ") + std::strerror(errno);
      return false;
    }
    return true;
  }
  // What the name is now: a regular file of this user is replaced whole
  // (written beside it, then renamed); anything else is not replaced.
  struct stat st{};
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISLNK(st.st_mode)) {
      *why = path + " is a symbolic link: not followed (name the file it points to)";
      return false;
    }
    if (S_ISDIR(st.st_mode)) {
      *why = path + " is a directory";
      return false;
    }
    if (!S_ISREG(st.st_mode)) return write_into(path, data, why);
    if (st.st_uid != ::geteuid()) {
      *why = path + " belongs to another user: not replaced";
      return false;
    }
  } else if (errno != ENOENT) {
    *why = "cannot look at " + path + ": " + std::strerror(errno);
    return false;
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
