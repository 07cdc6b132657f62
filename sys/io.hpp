// How gpupool touches descriptors and files inside a program it knows
// nothing about.
//
// - Descriptor numbers belong to the program. It may close any of them,
//   gpupool's included (daemons, closefrom(3), shells), and get the same
//   numbers back for its own files. So gpupool remembers what each of its
//   descriptors refers to (device and inode) and checks it before every read,
//   write, poll or close; a number that no longer refers to gpupool's file is
//   left alone. Nothing gpupool keeps open sits on 0, 1 or 2, which a program
//   that closed them expects to get back from its next open().
// - Files named by GPUPOOL_* variables are never followed through a symbolic
//   link, in any component of their path (openat2's RESOLVE_NO_SYMLINKS, or
//   a walk with O_NOFOLLOW), never another user's, never anything but a
//   regular file, and opening them never blocks (a FIFO nobody reads).
// - Writes to what gpupool does not own (stderr, a client socket) are bounded
//   in time: a reader that stopped reading must not hang the program, its
//   exit included.
// - In the preloaded library, every descriptor gpupool creates is created
//   on its files thread (in_private), whose descriptor table is its own: a
//   new descriptor takes the lowest free number of that table, never one of
//   the program's (a program that just closed 0 gets 0 from its next open,
//   whatever gpupool opens meanwhile). Such a descriptor is used, and
//   closed, only on a thread of that table.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>

namespace gpupool::io {

// What a descriptor refers to. {0, 0} for a descriptor that is not open.
struct FileId {
  dev_t dev = 0;
  ino_t ino = 0;
  bool operator==(const FileId&) const = default;
  bool valid() const { return dev != 0 || ino != 0; }
};

// The identity of fd's open file. Async-signal-safe.
FileId id_of(int fd);

// A descriptor gpupool opened, with the identity of its file.
class OwnedFd {
 public:
  OwnedFd() = default;
  OwnedFd(OwnedFd&& o) noexcept : fd_(o.fd_), id_(o.id_) { o.fd_ = -1; }
  OwnedFd& operator=(OwnedFd&& o) noexcept;
  OwnedFd(const OwnedFd&) = delete;
  OwnedFd& operator=(const OwnedFd&) = delete;
  ~OwnedFd() { close(); }

  // Takes a descriptor gpupool just opened (-1 gives an empty OwnedFd):
  // moved to a number above 2, close-on-exec, identity recorded.
  static OwnedFd adopt(int fd);

  int get() const { return fd_; }
  FileId id() const { return id_; }
  bool valid() const { return fd_ >= 0; }
  // The number still refers to the file gpupool opened. Async-signal-safe.
  bool ours() const { return fd_ >= 0 && id_of(fd_) == id_; }
  // Closes the descriptor if it is still ours; forgets it either way.
  void close();
  // Forgets it without closing (the program closed or replaced it).
  void forget() { fd_ = -1; }

 private:
  int fd_ = -1;
  FileId id_;
};

// `fd` moved to a number above 2 (the original closed); -1 on failure.
int above_stdio(int fd);

// "%p" -> pid, "%%" -> "%".
std::string expand_path(const std::string& pattern, long pid);

// The directory of `path`, opened (O_PATH, above 2) without following a
// symbolic link in any of its components: openat2's RESOLVE_NO_SYMLINKS
// where the kernel has it (5.6), else one component at a time with
// O_NOFOLLOW. *name is the last component, to be opened relative to it.
// Empty with *why set when refused (a link: *why names the path without it).
OwnedFd open_parent(const std::string& path, std::string* name, std::string* why);

// Opens `path` for writing: never through a symbolic link in any
// component, only a regular file owned by this user, without blocking.
// append: O_APPEND; otherwise truncated once the checks passed. Empty with
// *why set when refused.
OwnedFd open_output(const std::string& path, bool append, std::string* why);

// How long one write of gpupool's may wait for a reader.
inline constexpr std::uint64_t kWriteTimeoutNs = 1'000'000'000;

// Writes all of data to fd, waiting at most timeout_ns for a reader: a pipe
// or terminal nobody reads, or a peer that stopped reading, costs at most
// that. Never raises SIGPIPE, never changes the flags of the program's file.
// Once a write to some file timed out, later writes to it wait no more until
// one succeeds. False if not everything was written.
bool write_bounded(int fd, const void* data, std::size_t n,
                   std::uint64_t timeout_ns = kWriteTimeoutNs);
inline bool write_bounded(int fd, const std::string& s,
                          std::uint64_t timeout_ns = kWriteTimeoutNs) {
  return write_bounded(fd, s.data(), s.size(), timeout_ns);
}

// Writes all of data to fd, a regular file (its writes never wait for a
// reader): short writes and EINTR retried, no time bound. False on error.
bool write_plain(int fd, const char* data, std::size_t n);

// Writes to the program's stderr as write_bounded does, from any thread:
// a private thread reaches it through /proc (its own 0-2 are /dev/null).
bool write_stderr(const void* data, std::size_t n, std::uint64_t timeout_ns = kWriteTimeoutNs);
inline bool write_stderr(const std::string& s, std::uint64_t timeout_ns = kWriteTimeoutNs) {
  return write_stderr(s.data(), s.size(), timeout_ns);
}

// Replaces `path` atomically (a temporary file beside it, then rename), so
// a reader never sees half a file. Only a regular file of this user is ever
// replaced; where nothing is, nothing that appears meanwhile is replaced.
bool replace_file(const std::string& path, const std::string& data, std::string* why);

// ---- The files thread (files_thread.cpp) ----------------------------------
//
// A thread that unshares its descriptor table at its start (unshare
// CLONE_FILES) and closes every descriptor of the copy, so that it holds no
// reference to the program's files (a copied pipe end would keep the
// program's reader from seeing EOF). It runs NVML (node/nvml.cpp), whose
// device files then stay in this table, but never a GPU driver: the
// driver's descriptors are in the program's table. Where no private table can
// be made (a seccomp filter), in_private runs the work where it is called,
// as before (numbers moved above 2 at once); the library's start says so in
// the debug log (start_private_files).

// Turns the files thread on for this process (the preloaded library does,
// at start); until then, and in other programs, in_private runs inline.
void enable_private_files();

// Starts the files thread now if this process has none. 0 when gpupool's
// files get a table of their own (or the thread could not be started yet:
// tried again at the next in_private); else unshare's errno, and
// in_private runs work where it is called. Logs nothing, and neither does
// in_private: the logger's sink calls in_private with its lock held, so a
// line logged from there would wait for itself. The caller says it.
int start_private_files();

// A callable by reference, without allocating (host memory may be out).
class Work {
 public:
  template <class F, class = std::enable_if_t<!std::is_same_v<std::decay_t<F>, Work>>>
  Work(F& f) : obj_(&f), call_([](void* o) { (*static_cast<F*>(o))(); }) {}
  void operator()() const { call_(obj_); }

 private:
  void* obj_;
  void (*call_)(void*);
};

// Runs fn on the files thread and waits for it; inline on a thread of the
// private table. fn must not log (the log may be waiting for this thread).
// Every descriptor fn creates, uses and closes is the private table's. An
// exception fn throws comes out here.
void in_private_work(Work fn);
template <class F>
void in_private(F&& fn) {
  in_private_work(Work(fn));
}

// Runs fn on a new thread of the private table and waits for it: work that
// may wait long (asking another process) without holding up the files
// thread.
void in_private_own_thread_work(Work fn);
template <class F>
void in_private_own_thread(F&& fn) {
  in_private_own_thread_work(Work(fn));
}

// Starts fn on a new detached thread of the private table (a server loop);
// where none could be made, on an ordinary thread. False if it could not
// be started.
bool start_private_thread(void (*fn)(void*), void* arg);

// A detached thread of gpupool's, started with every signal blocked (the
// program's signals land on its own threads). pthread_create's result.
int start_detached(void* (*fn)(void*), void* arg);

// The calling thread works in the private table.
bool on_private_thread();

// CLOCK_MONOTONIC in nanoseconds: gpupool's clock for deadlines and ages.
std::uint64_t mono_ns();

// Brackets a private thread's work between waits, so that fork() does not
// cut it off: fork waits until no private thread is inside one.
class PrivateWork {
 public:
  PrivateWork();
  ~PrivateWork();
  PrivateWork(const PrivateWork&) = delete;
  PrivateWork& operator=(const PrivateWork&) = delete;
};

// fork(): prepare waits until the private threads are between jobs and
// holds them there; the child has none (they start again on demand).
void private_fork_prepare();
void private_fork_parent();
void private_fork_child();

}  // namespace gpupool::io
