#include "wire/registry.hpp"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "sys/io.hpp"

namespace gpupool::wire {
namespace {

// The file's layout. Version 2: read and written with pread/pwrite under
// an open-file-description lock (version 1 was mapped and lock-free; the
// two never share a file).
constexpr char kMagic[8] = {'g', 'p', 'u', 'p', 'o', 'o', 'l', 'R'};
constexpr std::uint32_t kVersion = 2;

struct Header {
  char magic[8];
  std::uint32_t version, slots, devices, slot_bytes;
  std::uint64_t reserved[5];
};
static_assert(sizeof(Header) == 64);

struct DeviceWords {
  std::uint64_t key[2];
  std::uint64_t held, active, managed, hits, misses;
  std::uint64_t returned_at;
};
struct alignas(64) Slot {
  std::uint64_t owner;  // token of the owning process; 0: free
  std::uint64_t reserved0;
  std::uint64_t count;  // devices published
  std::uint64_t comm[2];
  std::uint64_t reserved[3];
  DeviceWords dev[kRegistryDevices];
};
constexpr std::size_t kSlotsAt = sizeof(Header);
constexpr std::size_t kFileBytes = sizeof(Header) + sizeof(Slot) * kRegistrySlots;

// After a lock held past the patience (its holder is stopped), the
// registry is left alone this long: a cuMemGetInfo or a publish meanwhile
// does not wait again.
constexpr std::uint64_t kBusyPauseNs = 1'000'000'000;

// pid in the low 22 bits (Linux's pid_max limit), start time above.
std::uint64_t make_token(long pid, std::uint64_t start) {
  return (start << 22) | (static_cast<std::uint64_t>(pid) & ((1u << 22) - 1));
}
long token_pid(std::uint64_t t) { return static_cast<long>(t & ((1u << 22) - 1)); }
std::uint64_t token_start(std::uint64_t t) { return t >> 22; }

bool header_ok(const Header& h) {
  return std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.version == kVersion &&
         h.slots == kRegistrySlots && h.devices == kRegistryDevices && h.slot_bytes == sizeof(Slot);
}

// Each pread/pwrite only while the number is still the registry's: the
// program may close it and reuse the number between two calls. A short
// transfer (0 bytes) means the file was cut.
template <class Byte, class Transfer>
bool transfer_all(const io::OwnedFd& fd, Byte* p, std::size_t n, std::size_t at, Transfer io) {
  while (n > 0) {
    if (!fd.ours()) {
      errno = EBADF;
      return false;
    }
    const ssize_t r = io(fd.get(), p, n, static_cast<off_t>(at));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r, n -= static_cast<std::size_t>(r), at += static_cast<std::size_t>(r);
  }
  return true;
}

bool read_all(const io::OwnedFd& fd, void* out, std::size_t n, std::size_t at) {
  return transfer_all(fd, static_cast<char*>(out), n, at, ::pread);
}

bool write_all(const io::OwnedFd& fd, const void* in, std::size_t n, std::size_t at) {
  return transfer_all(fd, static_cast<const char*>(in), n, at, ::pwrite);
}

// The registry file's directory, opened without following a symbolic link
// in any component of the path (io::open_parent, as every GPUPOOL_* file):
// ours (or root's), and not one where others may replace our files
// (writable by others and not sticky). A missing one is made, private,
// when `create`; when not, it is missing: invalid with *why empty. *name is
// the file's name in it.
io::OwnedFd open_directory(const std::string& path, bool create, std::string* name,
                           std::string* why) {
  const std::size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  struct stat s {};
  if (lstat(dir.c_str(), &s) != 0 && errno == ENOENT) {
    if (!create) return {};
    // Made in its own parent, itself opened without links.
    std::string dir_name;
    const io::OwnedFd parent = io::open_parent(dir, &dir_name, why);
    if (!parent.valid()) return {};
    if (mkdirat(parent.get(), dir_name.c_str(), 0700) != 0 && errno != EEXIST) {
      *why = "cannot create the directory " + dir + ": " + strerror(errno);
      return {};
    }
  }
  // Another user's link in its place took the name: said as such (the path
  // it points to is theirs to choose, not a path to use instead).
  if (lstat(dir.c_str(), &s) == 0 && S_ISLNK(s.st_mode) && s.st_uid != geteuid()) {
    *why = "the registry's directory " + dir + " is a symbolic link of uid " +
           std::to_string(s.st_uid) +
           " (another user took its name; remove it, or set "
           "GPUPOOL_REGISTRY to a file in a directory of yours)";
    return {};
  }
  io::OwnedFd d = io::open_parent(path, name, why);
  if (!d.valid()) return {};
  if (fstat(d.get(), &s) != 0) {
    *why = "cannot examine the directory " + dir + ": " + strerror(errno);
    return {};
  }
  if (s.st_uid != geteuid() && s.st_uid != 0) {
    *why = "the registry's directory " + dir + " belongs to uid " + std::to_string(s.st_uid) +
           ", not this user (another user took its name; remove it, or set GPUPOOL_REGISTRY "
           "to a file in a directory of yours)";
    return {};
  }
  if ((s.st_mode & 022) && !(s.st_mode & S_ISVTX)) {
    *why = "the registry's directory " + dir + " is writable by other users";
    return {};
  }
  return d;
}

// The registry opened and checked: a regular file of this user, 0600 (no
// group or other read or write), of the layout's size and header. Invalid
// with *why set when it is not one; invalid with *why empty when missing.
io::OwnedFd open_checked(const std::string& path, std::string* why) {
  why->clear();
  std::string name;
  const io::OwnedFd dir = open_directory(path, /*create=*/false, &name, why);
  if (!dir.valid()) return {};
  io::OwnedFd fd = io::OwnedFd::adopt(
      ::openat(dir.get(), name.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK));
  if (!fd.valid()) {
    if (errno != ENOENT) *why = "cannot open " + path + ": " + strerror(errno);
    return {};
  }
  struct stat s {};
  const char* bad = nullptr;
  Header h{};
  if (fstat(fd.get(), &s) != 0) bad = "cannot be examined";
  else if (!S_ISREG(s.st_mode)) bad = "is not a regular file";
  else if (s.st_uid != geteuid()) bad = "belongs to another user";
  else if (s.st_mode & 022) bad = "is writable by other users";
  // 0600, as made: others may not read what the user's processes hold.
  else if (s.st_mode & 044) bad = "is readable by other users (it must be 0600)";
  else if (static_cast<std::size_t>(s.st_size) != kFileBytes)
    bad = "is not a gpupool registry (wrong size)";
  else if (!read_all(fd, &h, sizeof h, 0) || !header_ok(h)) bad = "is not a gpupool registry";
  if (bad) {
    *why = path + " " + bad;
    return {};
  }
  return fd;
}

// The registry's one look, read or write: open, checked, locked (an
// open-file-description lock, so threads of one process and a forked child
// exclude each other too), and closed. The size is checked again under the
// lock: nothing here is mapped, so a file cut meanwhile makes a read short
// or a write fail, never a fault.
class Look {
 public:
  Look(const std::string& path, bool write, std::uint64_t patience_ns = kRegistryPatienceNs) {
    fd_ = open_checked(path, &why_);
    if (!fd_.valid()) {
      if (why_.empty()) why_ = path + " is gone";
      return;
    }
    struct flock l {};
    l.l_type = write ? F_WRLCK : F_RDLCK;
    l.l_whence = SEEK_SET;
    const std::uint64_t give_up = io::mono_ns() + patience_ns;
    while (fcntl(fd_.get(), F_OFD_SETLK, &l) != 0) {
      if ((errno != EAGAIN && errno != EACCES && errno != EINTR) || io::mono_ns() >= give_up) {
        busy_ = true;
        why_ = path + " is locked by a process that does not let go";
        fd_ = {};
        return;
      }
      const timespec pause{0, 100'000};
      nanosleep(&pause, nullptr);
    }
    struct stat s {};
    if (fstat(fd_.get(), &s) != 0 || static_cast<std::size_t>(s.st_size) != kFileBytes) {
      why_ = path + " is not a gpupool registry (wrong size)";
      unlock();
    }
  }
  ~Look() { unlock(); }
  Look(const Look&) = delete;
  Look& operator=(const Look&) = delete;

  bool ok() const { return fd_.valid(); }
  bool busy() const { return busy_; }
  const io::OwnedFd& owned() const { return fd_; }
  const std::string& why() const { return why_; }
  // A read or write that failed: the file changed under the lock's users.
  void failed(const std::string& path, const char* what) {
    why_ = path + ": " + what + ": " + (errno ? strerror(errno) : "the file was cut");
    unlock();
  }

 private:
  // Unlocked explicitly before the close: a child forked meanwhile has a
  // copy of the descriptor, which would otherwise keep the lock.
  void unlock() {
    if (!fd_.valid()) return;
    if (fd_.ours()) {
      struct flock l {};
      l.l_type = F_UNLCK;
      l.l_whence = SEEK_SET;
      fcntl(fd_.get(), F_OFD_SETLK, &l);
    }
    fd_ = {};
  }
  io::OwnedFd fd_;
  std::string why_;
  bool busy_ = false;
};

// A new registry under a private name, its blocks allocated (a full tmpfs
// says so here, not later as a fault) and linked into place only once whole.
// The name is random, so no other process (another PID namespace's same
// pid included) makes or removes the same one. 0: linked; -1: another
// process was first; -2: failed, *why set. The private name never outlives
// the call.
int create(const std::string& path, std::string* why) {
  std::string name;
  const io::OwnedFd dir = open_directory(path, /*create=*/true, &name, why);
  if (!dir.valid()) {
    if (why->empty()) *why = "cannot create " + path;
    return -2;
  }
  std::string tmp;
  io::OwnedFd fd;
  for (int tries = 0; tries < 8 && !fd.valid(); ++tries) {
    std::uint64_t r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof r))
      r = io::mono_ns() ^ (std::uint64_t(getpid()) << 32) ^ std::uint64_t(tries);
    char suffix[32];
    std::snprintf(suffix, sizeof suffix, ".%016llx.new", static_cast<unsigned long long>(r));
    tmp = name + suffix;
    fd = io::OwnedFd::adopt(
        ::openat(dir.get(), tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600));
    if (!fd.valid() && errno != EEXIST) break;
  }
  if (!fd.valid()) {
    *why = "cannot create a file beside " + path + ": " + strerror(errno);
    return -2;
  }
  int err = posix_fallocate(fd.get(), 0, kFileBytes);
  if (err != 0) {
    *why = "cannot allocate " + std::to_string(kFileBytes) + " bytes for " + path + ": " +
           strerror(err);
  } else {
    Header h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kVersion;
    h.slots = kRegistrySlots;
    h.devices = kRegistryDevices;
    h.slot_bytes = sizeof(Slot);
    if (!write_all(fd, &h, sizeof h, 0)) {
      err = errno;
      *why = "cannot write a new registry beside " + path + ": " + strerror(err);
    } else if (linkat(dir.get(), tmp.c_str(), dir.get(), name.c_str(), 0) != 0) {
      err = errno;
      if (err != EEXIST) *why = "cannot create " + path + ": " + strerror(err);
    }
  }
  unlinkat(dir.get(), tmp.c_str(), 0);
  return err == 0 ? 0 : err == EEXIST && why->empty() ? -1 : -2;
}

}  // namespace

std::string comm_of_self() {
  char buf[32] = {};
  if (FILE* f = std::fopen("/proc/self/comm", "re")) {
    if (!std::fgets(buf, sizeof buf, f)) buf[0] = 0;
    std::fclose(f);
  }
  std::string s(buf);
  while (!s.empty() && (s.back() == '\n' || s.back() == ' ')) s.pop_back();
  return s.substr(0, 16);
}

std::string default_registry_path() {
  // The same for every process of the user, whatever its session: a job
  // started from ssh and one started by cron or after logout must find
  // each other (logind's /run/user/<uid> exists only while a session does).
  // Root's is in /run, where only root makes entries.
  struct stat s {};
  if (geteuid() == 0 && lstat("/run", &s) == 0 && S_ISDIR(s.st_mode) && s.st_uid == 0 &&
      !(s.st_mode & 022))
    return "/run/gpupool.registry";
  // A directory of the user's own, made private by its first process; one
  // another user made first is refused, naming its owner (open_directory).
  return "/dev/shm/gpupool-" + std::to_string(geteuid()) + "/registry";
}

std::uint64_t process_start(long pid) {
  char path[64], buf[1024];
  std::snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  const int fd = ::open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  const ssize_t n = ::read(fd, buf, sizeof buf - 1);
  ::close(fd);
  if (n <= 0) return 0;
  buf[n] = 0;
  // Fields after the command (which may hold spaces and parentheses):
  // state is field 3, starttime field 22.
  const char* p = std::strrchr(buf, ')');
  if (!p) return 0;
  int field = 2;
  for (; *p && field < 22; ++p)
    if (*p == ' ') ++field;
  return std::strtoull(p, nullptr, 10);
}

bool process_alive(long pid, std::uint64_t start) {
  if (pid <= 0) return false;
  if (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) return false;
  const std::uint64_t s = process_start(pid);
  return s == 0 || start == 0 ? true : s == start;  // unknown start time: trust kill()
}

// Each look opens, locks, reads or writes and closes the file: on gpupool's
// files thread (sys/io.hpp), never among the program's descriptors.
std::unique_ptr<Registry> Registry::open(const std::string& path, std::string* why,
                                         bool create_missing) {
  std::unique_ptr<Registry> r;
  io::in_private([&] { r = open_here(path, why, create_missing); });
  return r;
}

std::unique_ptr<Registry> Registry::open_here(const std::string& path, std::string* why,
                                              bool create_missing) {
  why->clear();
  for (int attempt = 0; attempt < 3; ++attempt) {
    if (open_checked(path, why).valid()) {
      std::unique_ptr<Registry> r(new Registry);
      r->path_ = path;
      return r;
    }
    if (!why->empty() || !create_missing) return nullptr;
    if (create(path, why) == -2) return nullptr;
  }
  *why = "cannot open " + path;
  return nullptr;
}

Registry::~Registry() = default;

Registry::Outcome Registry::publish(const std::vector<DeviceUse>& devices, std::string* why) {
  Outcome o = Outcome::unusable;
  io::in_private([&] { o = publish_here(devices, why); });
  return o;
}

Registry::Outcome Registry::publish_here(const std::vector<DeviceUse>& devices, std::string* why) {
  const long pid = getpid();
  if (slot_ >= 0 && token_pid_ != pid) slot_ = -1;  // a forked child
  if (paused(why)) return Outcome::busy;
  // Removed under us (logout with logind's RemoveIPC empties /dev/shm of
  // the user's files; a cleaner): made again, so that processes outliving
  // a session keep finding each other.
  struct stat st {};
  if (lstat(path_.c_str(), &st) != 0 && errno == ENOENT) {
    std::string ignored;
    create(path_, &ignored);
  }
  Look look(path_, /*write=*/true);
  if (!look.ok()) {
    *why = look.why();
    if (!look.busy()) return Outcome::unusable;
    pause();
    return Outcome::busy;
  }
  std::uint64_t owner = 0;
  // Taken over by another process (it judged us dead): claim a new one.
  if (slot_ >= 0) {
    if (!read_all(look.owned(), &owner, sizeof owner, kSlotsAt + sizeof(Slot) * slot_)) {
      look.failed(path_, "cannot be read");
      *why = look.why();
      return Outcome::unusable;
    }
    if (owner != token_) slot_ = -1;
  }
  if (slot_ < 0) {
    token_ = make_token(pid, process_start(pid));
    token_pid_ = pid;
    std::vector<Slot> all(kRegistrySlots);
    if (!read_all(look.owned(), all.data(), sizeof(Slot) * kRegistrySlots, kSlotsAt)) {
      look.failed(path_, "cannot be read");
      *why = look.why();
      return Outcome::unusable;
    }
    // A free slot, else one whose owner is gone.
    for (int pass = 0; pass < 2 && slot_ < 0; ++pass)
      for (unsigned i = 0; i < kRegistrySlots && slot_ < 0; ++i) {
        const std::uint64_t o = all[i].owner;
        if (pass == 0 ? o == 0 : (o != 0 && !process_alive(token_pid(o), token_start(o))))
          slot_ = static_cast<int>(i);
      }
    if (slot_ < 0) return Outcome::full;
    comm_ = comm_of_self();  // once per claim: each publish opens only the registry
  }
  Slot s{};
  s.owner = token_;
  std::memcpy(s.comm, comm_.data(), std::min(comm_.size(), sizeof s.comm));
  const std::size_t n = std::min<std::size_t>(devices.size(), kRegistryDevices);
  for (std::size_t i = 0; i < n; ++i) {
    const DeviceUse& d = devices[i];
    DeviceWords& w = s.dev[i];
    std::memcpy(w.key, d.key.data(), sizeof w.key);
    w.held = d.held;
    w.active = d.active;
    w.managed = d.managed;
    w.hits = d.hits;
    w.misses = d.misses;
    w.returned_at = d.returned_at;
  }
  s.count = n;
  if (!write_all(look.owned(), &s, sizeof s, kSlotsAt + sizeof(Slot) * slot_)) {
    look.failed(path_, "cannot be written");
    *why = look.why();
    slot_ = -1;
    return Outcome::unusable;
  }
  return Outcome::ok;
}

void Registry::leave() {
  io::in_private([&] { leave_here(); });
}

void Registry::leave_here() {
  if (slot_ < 0 || token_pid_ != getpid()) return;
  Look look(path_, /*write=*/true);
  const std::size_t at = kSlotsAt + sizeof(Slot) * slot_;
  std::uint64_t owner = 0;
  if (look.ok() && read_all(look.owned(), &owner, sizeof owner, at) && owner == token_) {
    owner = 0;
    write_all(look.owned(), &owner, sizeof owner, at);
  }
  slot_ = -1;
}

bool Registry::paused(std::string* why) const {
  if (io::mono_ns() >= busy_until_.load(std::memory_order_relaxed)) return false;
  *why = path_ + " was locked by a process that does not let go; left alone for a second";
  return true;
}

void Registry::pause() const {
  busy_until_.store(io::mono_ns() + kBusyPauseNs, std::memory_order_relaxed);
}

std::vector<ProcessEntry> Registry::processes(bool skip_self, std::string* why, bool* busy,
                                              std::uint64_t patience_ns) const {
  std::vector<ProcessEntry> out;
  io::in_private([&] { out = processes_here(skip_self, why, busy, patience_ns); });
  return out;
}

std::vector<ProcessEntry> Registry::processes_here(bool skip_self, std::string* why, bool* busy,
                                                   std::uint64_t patience_ns) const {
  std::vector<ProcessEntry> out;
  std::vector<Slot> all(kRegistrySlots);
  std::string said;
  if (busy) *busy = false;
  if (paused(&said)) {
    if (why) *why = said;
    if (busy) *busy = true;
    return out;
  }
  {
    Look look(path_, /*write=*/false, patience_ns);
    if (!look.ok() ||
        !read_all(look.owned(), all.data(), sizeof(Slot) * kRegistrySlots, kSlotsAt)) {
      if (look.ok()) look.failed(path_, "cannot be read");
      if (look.busy()) pause();
      if (why) *why = look.why();
      if (busy) *busy = look.busy();
      return out;
    }
  }
  const long self = getpid();
  for (const Slot& s : all) {
    const long pid = token_pid(s.owner);
    if (s.owner == 0 || (skip_self && pid == self)) continue;
    ProcessEntry e;
    for (std::uint64_t k = 0; k < s.count && k < kRegistryDevices; ++k) {
      const DeviceWords& w = s.dev[k];
      DeviceUse d;
      std::memcpy(d.key.data(), w.key, sizeof w.key);
      d.held = w.held;
      d.active = w.active;
      d.managed = w.managed;
      d.hits = w.hits;
      d.misses = w.misses;
      d.returned_at = w.returned_at;
      e.devices.push_back(d);
    }
    char name[17] = {};
    std::memcpy(name, s.comm, 16);
    for (char ch : std::string_view(name, strnlen(name, 16)))
      e.command += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
    if (!process_alive(pid, token_start(s.owner))) continue;
    e.pid = pid;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace gpupool::wire
