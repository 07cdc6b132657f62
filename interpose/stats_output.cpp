#include "interpose/stats_output.hpp"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

namespace gpupool::stats {

std::string expand_path(const std::string& pattern, long pid) {
  std::string out;
  for (std::size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '%' && i + 1 < pattern.size()) {
      if (pattern[i + 1] == 'p') {
        out += std::to_string(pid);
        ++i;
        continue;
      }
      if (pattern[i + 1] == '%') {
        out += '%';
        ++i;
        continue;
      }
    }
    out += pattern[i];
  }
  return out;
}

int open_output(const std::string& path, bool append, std::string* why) {
  // O_NONBLOCK: opening a FIFO for writing would otherwise block the control
  // thread until a reader appears; non-regular files are refused anyway.
  int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  if (append) flags |= O_APPEND;
  int fd = ::open(path.c_str(), flags, 0644);
  if (fd < 0) {
    int e = errno;
    if (e == ELOOP)
      *why = "refusing " + path + ": it is a symbolic link (stats and trace files are never followed)";
    else
      *why = "cannot open " + path + ": " + strerror(e);
    return -1;
  }
  struct stat st{};
  if (fstat(fd, &st) != 0) {
    *why = "cannot stat " + path + ": " + strerror(errno);
    ::close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    *why = "refusing " + path + ": not a regular file";
    ::close(fd);
    return -1;
  }
  if (st.st_uid != geteuid()) {
    *why = "refusing " + path + ": owned by uid " + std::to_string(st.st_uid) +
           ", not by this user (uid " + std::to_string(geteuid()) + ")";
    ::close(fd);
    return -1;
  }
  // Truncate only now that the file is known to be ours.
  if (!append && ftruncate(fd, 0) != 0) {
    *why = "cannot truncate " + path + ": " + strerror(errno);
    ::close(fd);
    return -1;
  }
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  return fd;
}

bool write_all(int fd, const std::string& data, bool socket) {
  const char* p = data.data();
  std::size_t left = data.size();
  while (left > 0) {
    ssize_t n = socket ? ::send(fd, p, left, MSG_NOSIGNAL) : ::write(fd, p, left);
    if (n < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += n;
    left -= static_cast<std::size_t>(n);
  }
  return true;
}

bool append_dump(const std::string& path, const std::string& data, std::string* why) {
  if (path.empty()) {
    if (!write_all(STDERR_FILENO, data)) {
      *why = std::string("cannot write stats to stderr: ") + strerror(errno);
      return false;
    }
    return true;
  }
  int fd = open_output(path, true, why);
  if (fd < 0) return false;
  // One write per dump: with O_APPEND, dumps of several processes sharing a
  // file do not interleave.
  bool ok = write_all(fd, data);
  if (!ok) *why = "cannot write " + path + ": " + strerror(errno);
  ::close(fd);
  return ok;
}

bool replace_file(const std::string& path, const std::string& data, std::string* why) {
  std::string tmpl = path + ".XXXXXX";
  int fd = mkostemp(tmpl.data(), O_CLOEXEC);
  if (fd < 0) {
    *why = "cannot create a temporary file next to " + path + ": " + strerror(errno);
    return false;
  }
  fchmod(fd, 0644);
  bool ok = write_all(fd, data);
  if (!ok) *why = "cannot write " + tmpl + ": " + strerror(errno);
  if (::close(fd) != 0 && ok) {
    ok = false;
    *why = "cannot write " + tmpl + ": " + strerror(errno);
  }
  // rename() replaces a symlink at `path` itself, never what it points to.
  if (ok && ::rename(tmpl.c_str(), path.c_str()) != 0) {
    ok = false;
    *why = "cannot rename " + tmpl + " to " + path + ": " + strerror(errno);
  }
  if (!ok) ::unlink(tmpl.c_str());
  return ok;
}

}  // namespace gpupool::stats
