#include "sys/io.hpp"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

// openat2 (Linux 5.6): where the headers lack it, the component walk alone.
#if __has_include(<linux/openat2.h>)
#include <linux/openat2.h>
#endif

#include <algorithm>
#include <atomic>

namespace gpupool::io {

std::uint64_t mono_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return std::uint64_t(ts.tv_sec) * 1000000000u + std::uint64_t(ts.tv_nsec);
}

namespace {

// The file the last timed-out write went to: later writes to it do not
// wait again until one gets through. A hint only, so two relaxed atomics.
std::atomic<std::uint64_t> g_stuck_dev{0}, g_stuck_ino{0};

bool is_stuck(const FileId& id) {
  return g_stuck_ino.load(std::memory_order_relaxed) == std::uint64_t(id.ino) &&
         g_stuck_dev.load(std::memory_order_relaxed) == std::uint64_t(id.dev);
}

void note_outcome(const FileId& id, bool ok) {
  if (ok) {
    if (is_stuck(id)) g_stuck_ino.store(0, std::memory_order_relaxed);
  } else {
    g_stuck_dev.store(std::uint64_t(id.dev), std::memory_order_relaxed);
    g_stuck_ino.store(std::uint64_t(id.ino), std::memory_order_relaxed);
  }
}

// Blocks SIGPIPE on this thread while it writes to a pipe or socket whose
// reader may be gone, and takes back a SIGPIPE the write raised, so the
// program (whose default action for it is to die) never sees one of ours.
class NoSigpipe {
 public:
  NoSigpipe() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
  }
  ~NoSigpipe() {
    if (epipe && !was_pending_) {
      const timespec zero{0, 0};
      while (sigtimedwait(&pipe_, nullptr, &zero) < 0 && errno == EINTR) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }
  bool epipe = false;

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// Writes with the descriptor in non-blocking behaviour (its own flag, or
// MSG_DONTWAIT), waiting in poll() for room until the deadline.
bool pump(int fd, const char* p, std::size_t n, bool socket, std::uint64_t deadline,
          NoSigpipe& guard) {
  while (n > 0) {
    const ssize_t w = socket ? ::send(fd, p, n, MSG_DONTWAIT | MSG_NOSIGNAL) : ::write(fd, p, n);
    if (w > 0) {
      p += w;
      n -= static_cast<std::size_t>(w);
      continue;
    }
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EPIPE) guard.epipe = true;
    if (w == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) return false;
    const std::uint64_t now = mono_ns();
    if (now >= deadline) return false;
    pollfd pfd{fd, POLLOUT, 0};
    const int ms =
        static_cast<int>(std::min<std::uint64_t>((deadline - now) / 1'000'000 + 1, 60'000));
    if (::poll(&pfd, 1, ms) < 0 && errno != EINTR) return false;
  }
  return true;
}

// A blocking descriptor gpupool may not make non-blocking (the flag is
// shared with the program): wait for room, then write at most what a pipe
// takes without blocking.
bool pump_blocking(int fd, const char* p, std::size_t n, std::uint64_t deadline, NoSigpipe& guard) {
  while (n > 0) {
    const std::uint64_t now = mono_ns();
    pollfd pfd{fd, POLLOUT, 0};
    const int ms =
        now >= deadline
            ? 0
            : static_cast<int>(std::min<std::uint64_t>((deadline - now) / 1'000'000 + 1, 60'000));
    const int r = ::poll(&pfd, 1, ms);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0 || (pfd.revents & (POLLERR | POLLNVAL))) return false;
    const ssize_t w = ::write(fd, p, std::min<std::size_t>(n, PIPE_BUF));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && errno == EPIPE) guard.epipe = true;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

// fstat() of the file a write goes to, by itself and never inlined:
// ThreadSanitizer models a descriptor as memory, and reports the program's
// open() or close() of 2 against gpupool's look at its current stderr; that
// is the case gpupool is written for (the number is checked, not trusted),
// and tests/tsan.supp suppresses this function, not its callers.
[[gnu::noinline]] bool stat_of_write_target(int fd, struct stat* st) { return fstat(fd, st) == 0; }

}  // namespace

bool write_plain(int fd, const char* p, std::size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<std::size_t>(w);
  }
  return true;
}

OwnedFd open_parent(const std::string& path, std::string* name, std::string* why) {
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "." : path.substr(0, slash + 1);
  *name = slash == std::string::npos ? path : path.substr(slash + 1);
  if (name->empty() || *name == "." || *name == "..") {
    *why = "refusing " + path + ": not a file name";
    return {};
  }
#if defined(SYS_openat2) && defined(RESOLVE_NO_SYMLINKS)
  open_how how{};
  how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
  how.resolve = RESOLVE_NO_SYMLINKS;
  int fd = static_cast<int>(syscall(SYS_openat2, AT_FDCWD, dir.c_str(), &how, sizeof how));
#else
  int fd = -1;
  errno = ENOSYS;
#endif
  if (fd < 0 && (errno == ENOSYS || errno == EPERM)) {  // no openat2 (or a seccomp filter)
    fd = ::open(dir[0] == '/' ? "/" : ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
    std::size_t at = 0;
    while (fd >= 0 && at < dir.size()) {
      const std::size_t end = std::min(dir.find('/', at), dir.size());
      const std::string part = dir.substr(at, end - at);
      at = end + 1;
      if (part.empty() || part == ".") continue;
      const int next = ::openat(fd, part.c_str(), O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
      int e = errno;
      // O_PATH|O_NOFOLLOW would open a link itself; O_DIRECTORY refuses it
      // as ENOTDIR, which is said as the link it is.
      struct stat st {};
      if (next < 0 && e == ENOTDIR && fstatat(fd, part.c_str(), &st, AT_SYMLINK_NOFOLLOW) == 0 &&
          S_ISLNK(st.st_mode))
        e = ELOOP;
      ::close(fd);
      errno = e;
      fd = next;
    }
  }
  OwnedFd owned = OwnedFd::adopt(fd);
  if (!owned.valid()) {
    const int e = errno;
    if (e == ELOOP || e == EXDEV) {
      // What to do instead: the same file named without the link (resolved
      // here only for the message, nothing is opened through it).
      char real[PATH_MAX];
      *why = "refusing " + path +
             ": its directory is reached through a symbolic link "
             "(gpupool never follows one in the path of its files)";
      if (realpath(dir.c_str(), real))
        *why += "; name it without the link: " + std::string(real) +
                (std::string(real) == "/" ? "" : "/") + *name;
    } else *why = "cannot open " + path + ": " + strerror(e);
  }
  return owned;
}

FileId id_of(int fd) {
  struct stat st;
  if (fd < 0 || fstat(fd, &st) != 0) return {};
  return {st.st_dev, st.st_ino};
}

int above_stdio(int fd) {
  if (fd < 0 || fd > STDERR_FILENO) return fd;
  const int moved = fcntl(fd, F_DUPFD_CLOEXEC, STDERR_FILENO + 1);
  const int e = errno;
  ::close(fd);
  errno = e;
  return moved;
}

OwnedFd& OwnedFd::operator=(OwnedFd&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    id_ = o.id_;
    o.fd_ = -1;
  }
  return *this;
}

OwnedFd OwnedFd::adopt(int fd) {
  OwnedFd o;
  fd = above_stdio(fd);
  if (fd < 0) return o;
  const int flags = fcntl(fd, F_GETFD);
  if (flags >= 0 && !(flags & FD_CLOEXEC)) fcntl(fd, F_SETFD, flags | FD_CLOEXEC);
  o.id_ = id_of(fd);
  if (!o.id_.valid()) {
    ::close(fd);
    return o;
  }
  o.fd_ = fd;
  return o;
}

void OwnedFd::close() {
  if (fd_ >= 0 && ours()) ::close(fd_);
  fd_ = -1;
}

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

OwnedFd open_output(const std::string& path, bool append, std::string* why) {
  // O_NONBLOCK: opening a FIFO for writing would otherwise wait for a
  // reader; non-regular files are refused below anyway.
  int flags = O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
  if (append) flags |= O_APPEND;
  std::string name;
  const OwnedFd dir = open_parent(path, &name, why);
  if (!dir.valid()) return {};
  OwnedFd fd = OwnedFd::adopt(::openat(dir.get(), name.c_str(), flags, 0644));
  if (!fd.valid()) {
    const int e = errno;
    if (e == ELOOP)
      *why = "refusing " + path + ": it is a symbolic link (gpupool's files are never followed)";
    else if (e == ENXIO) *why = "refusing " + path + ": not a regular file";
    else *why = "cannot open " + path + ": " + strerror(e);
    return {};
  }
  struct stat st {};
  if (fstat(fd.get(), &st) != 0) {
    *why = "cannot stat " + path + ": " + strerror(errno);
    return {};
  }
  if (!S_ISREG(st.st_mode)) {
    *why = "refusing " + path + ": not a regular file";
    return {};
  }
  if (st.st_uid != geteuid()) {
    *why = "refusing " + path + ": owned by uid " + std::to_string(st.st_uid) +
           ", not by this user (uid " + std::to_string(geteuid()) + ")";
    return {};
  }
  // Truncate only now that the file is known to be ours.
  if (!append && ftruncate(fd.get(), 0) != 0) {
    *why = "cannot truncate " + path + ": " + strerror(errno);
    return {};
  }
  return fd;
}

bool write_bounded(int fd, const void* data, std::size_t n, std::uint64_t timeout_ns) {
  const char* p = static_cast<const char*>(data);
  struct stat st;
  if (!stat_of_write_target(fd, &st)) return false;
  // Regular files and block devices never wait for a reader.
  if (S_ISREG(st.st_mode) || S_ISBLK(st.st_mode)) return write_plain(fd, p, n);
  const FileId id{st.st_dev, st.st_ino};
  if (is_stuck(id)) timeout_ns = 0;
  const std::uint64_t deadline = mono_ns() + timeout_ns;
  NoSigpipe guard;
  bool ok = false;
  if (S_ISSOCK(st.st_mode)) {
    ok = pump(fd, p, n, /*socket=*/true, deadline, guard);
  } else if (S_ISFIFO(st.st_mode)) {
    // An open file description of our own for the same pipe, so that it
    // can be non-blocking without changing the program's. Opened on the
    // files thread, through this thread's table in /proc: a descriptor
    // opened here would take the lowest free number of the program's.
    // Without a private table it runs here all the same: moved above 2 at
    // once (a program that closed 0 gets 0 back from its next open).
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/task/%ld/fd/%d", static_cast<long>(syscall(SYS_gettid)),
             fd);
    int state = 0;  // 1: written (ok says how), 2: no reader, 0: not reopened
    in_private([&] {
      const int own = above_stdio(::open(proc, O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
      if (own < 0) {
        if (errno == ENXIO) state = 2;
        return;
      }
      if (id_of(own) == id) {
        NoSigpipe here;  // on this thread, which writes
        ok = pump(own, p, n, /*socket=*/false, deadline, here);
        state = 1;
      }
      ::close(own);
    });
    if (state == 1) {
    } else if (state == 2) {
      ok = false;  // no reader: the write would only raise SIGPIPE
    } else if (fcntl(fd, F_GETFL) & O_NONBLOCK) {
      ok = pump(fd, p, n, /*socket=*/false, deadline, guard);
    } else {
      ok = pump_blocking(fd, p, n, deadline, guard);
    }
  } else if (fcntl(fd, F_GETFL) & O_NONBLOCK) {
    ok = pump(fd, p, n, /*socket=*/false, deadline, guard);
  } else {
    // A terminal or other device: reopening it could have side effects.
    ok = pump_blocking(fd, p, n, deadline, guard);
  }
  note_outcome(id, ok);
  return ok;
}

bool write_stderr(const void* data, std::size_t n, std::uint64_t timeout_ns) {
  if (!on_private_thread()) return write_bounded(STDERR_FILENO, data, n, timeout_ns);
  // The program's table as its first thread has it (a tty reopened without
  // becoming the controlling one; a socket cannot be reopened: dropped).
  // A file is appended to: a description of our own has its own offset.
  struct stat st {};
  const int append = stat("/proc/self/fd/2", &st) == 0 && S_ISREG(st.st_mode) ? O_APPEND : 0;
  const int own = ::open("/proc/self/fd/2", O_WRONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY | append);
  if (own < 0) return false;
  const bool ok = write_bounded(own, data, n, timeout_ns);
  ::close(own);
  return ok;
}

bool replace_file(const std::string& path, const std::string& data, std::string* why) {
  // Every name below is looked up in the directory opened without links.
  std::string name;
  const OwnedFd dir = open_parent(path, &name, why);
  if (!dir.valid()) return false;
  const int d = dir.get();
  for (int attempt = 0; attempt < 2; ++attempt) {
    struct stat st {};
    bool exists = true;
    if (fstatat(d, name.c_str(), &st, AT_SYMLINK_NOFOLLOW) != 0) {
      if (errno != ENOENT) {
        *why = "cannot check " + path + ": " + strerror(errno);
        return false;
      }
      exists = false;
    } else if (!S_ISREG(st.st_mode)) {
      *why = "refusing to replace " + path + ": not a regular file";
      return false;
    } else if (st.st_uid != geteuid()) {
      *why = "refusing to replace " + path + ": owned by uid " + std::to_string(st.st_uid) +
             ", not by this user (uid " + std::to_string(geteuid()) + ")";
      return false;
    }
    // A temporary name of our own beside it (mkostemp's, in the directory).
    std::string tmp;
    OwnedFd fd;
    for (int tries = 0; tries < 16 && !fd.valid(); ++tries) {
      char suffix[16];
      timespec ts;
      clock_gettime(CLOCK_MONOTONIC, &ts);
      snprintf(
          suffix, sizeof suffix, ".%06lx",
          static_cast<unsigned long>((ts.tv_nsec ^ (getpid() << 8) ^ tries * 7919) & 0xffffff));
      tmp = name + suffix;
      fd = OwnedFd::adopt(
          ::openat(d, tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
      if (!fd.valid() && errno != EEXIST) break;
    }
    if (!fd.valid()) {
      *why = "cannot create a temporary file next to " + path + ": " + strerror(errno);
      return false;
    }
    fchmod(fd.get(), 0644);
    bool ok = write_plain(fd.get(), data.data(), data.size());
    if (!ok) *why = "cannot write " + tmp + ": " + strerror(errno);
    const int fdnum = fd.get();
    fd.forget();
    if (::close(fdnum) != 0 && ok) {
      ok = false;
      *why = "cannot write " + tmp + ": " + strerror(errno);
    }
    if (ok && exists) {
      // Ours and regular a moment ago; renameat() replaces the name itself,
      // never what a symbolic link put there since would point to.
      if (::renameat(d, tmp.c_str(), d, name.c_str()) != 0) {
        ok = false;
        *why = "cannot rename " + tmp + " to " + path + ": " + strerror(errno);
      }
    } else if (ok) {
      // Nothing was there: never replace what appeared meanwhile.
      int r = renameat2(d, tmp.c_str(), d, name.c_str(), RENAME_NOREPLACE);
      if (r != 0 && (errno == EINVAL || errno == ENOSYS))
        r = ::linkat(d, tmp.c_str(), d, name.c_str(), 0);
      if (r != 0) {
        const int e = errno;
        ::unlinkat(d, tmp.c_str(), 0);
        if (e == EEXIST) continue;  // look again at what is there now
        *why = "cannot create " + path + ": " + strerror(e);
        return false;
      }
    }
    ::unlinkat(d, tmp.c_str(), 0);
    return ok;
  }
  *why = "refusing to replace " + path + ": it keeps changing";
  return false;
}

}  // namespace gpupool::io
