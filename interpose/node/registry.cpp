#include "interpose/node/registry.hpp"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>

namespace gpupool::node {
namespace {

// The file's layout. Every word is read and written through atomic_ref:
// other processes change them at any time.
constexpr char kMagic[8] = {'g', 'p', 'u', 'p', 'o', 'o', 'l', 'R'};
constexpr std::uint32_t kVersion = 1;

struct Header {
  char magic[8];
  std::uint32_t version, slots, devices, slot_bytes;
  std::uint64_t reserved[5];
};
static_assert(sizeof(Header) == 64);

struct DeviceWords {
  std::uint64_t uuid[2];
  std::uint64_t held, active, managed, hits, misses;
  std::uint64_t returned_at;  // was reserved (always 0) before it was used: same version
};
struct alignas(64) Slot {
  std::uint64_t owner;  // token of the owning process; 0: free
  std::uint64_t seq;    // odd while the owner writes
  std::uint64_t count;  // devices published
  std::uint64_t comm[2];
  std::uint64_t reserved[3];
  DeviceWords dev[kRegistryDevices];
};
constexpr std::size_t kFileBytes = sizeof(Header) + sizeof(Slot) * kRegistrySlots;

// The figures sit under a sequence counter (odd while written). Without
// fences (ThreadSanitizer does not model them): the writer's stores are
// releases, so none moves before the odd count nor after the even one; the
// reader's loads are acquires, so the second look at the count comes after
// every figure.
using Ref = std::atomic_ref<std::uint64_t>;
std::uint64_t ld(std::uint64_t& w, std::memory_order o = std::memory_order_acquire) {
  return Ref(w).load(o);
}
void st(std::uint64_t& w, std::uint64_t v, std::memory_order o = std::memory_order_release) {
  Ref(w).store(v, o);
}

// pid in the low 22 bits (Linux's pid_max limit), start time above.
std::uint64_t make_token(long pid, std::uint64_t start) {
  return (start << 22) | (static_cast<std::uint64_t>(pid) & ((1u << 22) - 1));
}
long token_pid(std::uint64_t t) { return static_cast<long>(t & ((1u << 22) - 1)); }
std::uint64_t token_start(std::uint64_t t) { return t >> 22; }

Slot* slots(void* map) {
  return reinterpret_cast<Slot*>(static_cast<char*>(map) + sizeof(Header));
}

bool header_ok(const Header& h) {
  return std::memcmp(h.magic, kMagic, sizeof kMagic) == 0 && h.version == kVersion &&
         h.slots == kRegistrySlots && h.devices == kRegistryDevices && h.slot_bytes == sizeof(Slot);
}

void* map_fd(int fd) {
  void* p = mmap(nullptr, kFileBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  return p == MAP_FAILED ? nullptr : p;
}

// A new registry under a private name, linked into place only once whole, so
// nobody ever maps a half-written one. -1 when another process was first.
int create(const std::string& path, std::string* why) {
  const std::string tmp = path + "." + std::to_string(getpid()) + ".new";
  unlink(tmp.c_str());
  const int fd = ::open(tmp.c_str(), O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) {
    *why = "cannot create " + tmp + ": " + strerror(errno);
    return -2;
  }
  bool ok = ftruncate(fd, kFileBytes) == 0;
  if (void* p = ok ? map_fd(fd) : nullptr) {
    Header h{};
    std::memcpy(h.magic, kMagic, sizeof kMagic);
    h.version = kVersion;
    h.slots = kRegistrySlots;
    h.devices = kRegistryDevices;
    h.slot_bytes = sizeof(Slot);
    std::memcpy(p, &h, sizeof h);
    munmap(p, kFileBytes);
  } else {
    ok = false;
  }
  const bool linked = ok && link(tmp.c_str(), path.c_str()) == 0;
  const int link_errno = errno;
  unlink(tmp.c_str());
  if (linked) return fd;
  ::close(fd);
  if (ok && link_errno == EEXIST) return -1;
  *why = "cannot create " + path + ": " + strerror(ok ? link_errno : errno);
  return -2;
}

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

}  // namespace

std::string uuid_text(const Uuid& u) {
  if (u == kHostMemory) return "host";
  char out[64];
  int n = std::snprintf(out, sizeof out, "GPU-");
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[n++] = '-';
    n += std::snprintf(out + n, sizeof out - n, "%02x", u[i]);
  }
  return std::string(out, n);
}

bool parse_uuid(std::string_view t, Uuid* out) {
  if (t == "host") {
    *out = kHostMemory;
    return true;
  }
  if (t.substr(0, 4) == "GPU-") t.remove_prefix(4);
  Uuid u{};
  int got = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '-') {
      if (got != 8 && got != 12 && got != 16 && got != 20) return false;
      continue;
    }
    int v = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
                                         : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
    if (v < 0 || got >= 32) return false;
    u[got / 2] = static_cast<std::uint8_t>(u[got / 2] | (got % 2 ? v : v << 4));
    ++got;
  }
  if (got != 32) return false;
  *out = u;
  return true;
}

std::string default_registry_path() { return "/dev/shm/gpupool." + std::to_string(geteuid()); }

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

std::unique_ptr<Registry> Registry::open(const std::string& path, std::string* why,
                                         bool create_missing) {
  int fd = -1;
  why->clear();
  for (int attempt = 0; attempt < 3 && fd < 0; ++attempt) {
    fd = ::open(path.c_str(), O_RDWR | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0 && errno == ENOENT && !create_missing) return nullptr;
    if (fd < 0 && errno == ENOENT) {
      fd = create(path, why);
      if (fd == -2) return nullptr;
      continue;
    }
    if (fd < 0) {
      *why = "cannot open " + path + ": " + strerror(errno);
      return nullptr;
    }
  }
  if (fd < 0) {
    *why = "cannot open " + path;
    return nullptr;
  }
  struct stat s {};
  const char* bad = nullptr;
  if (fstat(fd, &s) != 0) bad = "cannot be examined";
  else if (!S_ISREG(s.st_mode)) bad = "is not a regular file";
  else if (s.st_uid != geteuid()) bad = "belongs to another user";
  else if (s.st_mode & 022) bad = "is writable by other users";
  else if (static_cast<std::size_t>(s.st_size) != kFileBytes) bad = "is not a gpupool registry (wrong size)";
  void* p = bad ? nullptr : map_fd(fd);
  ::close(fd);  // the mapping stays: no descriptor for the program to close under us
  if (!bad && !p) bad = "cannot be mapped";
  if (!bad && !header_ok(*static_cast<const Header*>(p))) bad = "is not a gpupool registry";
  if (bad) {
    if (p) munmap(p, kFileBytes);
    *why = path + " " + bad;
    return nullptr;
  }
  std::unique_ptr<Registry> r(new Registry);
  r->map_ = p;
  r->size_ = kFileBytes;
  r->path_ = path;
  return r;
}

Registry::~Registry() {
  if (map_) munmap(map_, size_);
}

bool Registry::publish(const std::vector<DeviceUse>& devices) {
  const long pid = getpid();
  if (slot_ >= 0 && token_pid_ != pid) slot_ = -1;  // a forked child
  Slot* all = slots(map_);
  // Taken over by another process (it judged us dead): claim a new one.
  if (slot_ >= 0 && ld(all[slot_].owner) != token_) slot_ = -1;
  if (slot_ < 0) {
    token_ = make_token(pid, process_start(pid));
    token_pid_ = pid;
    // A free slot, else one whose owner is gone.
    for (int pass = 0; pass < 2 && slot_ < 0; ++pass)
      for (unsigned i = 0; i < kRegistrySlots && slot_ < 0; ++i) {
        std::uint64_t o = ld(all[i].owner);
        if (pass == 0 ? o != 0 : (o == 0 || process_alive(token_pid(o), token_start(o))))
          continue;
        if (Ref(all[i].owner).compare_exchange_strong(o, token_, std::memory_order_acq_rel))
          slot_ = static_cast<int>(i);
      }
    if (slot_ < 0) return false;
    // The previous owner's figures go (it may have died mid-write: the
    // count may be odd) before ours are written.
    Slot& s = all[slot_];
    const std::uint64_t q = ld(s.seq) | 1;
    st(s.seq, q);
    st(s.count, 0);
    const std::string c = comm_of_self();
    std::uint64_t words[2] = {};
    std::memcpy(words, c.data(), std::min(c.size(), sizeof words));
    st(s.comm[0], words[0]);
    st(s.comm[1], words[1]);
    st(s.seq, q + 1);
  }
  Slot& s = all[slot_];
  const std::uint64_t q = ld(s.seq);
  st(s.seq, q + 1);
  const std::size_t n = std::min<std::size_t>(devices.size(), kRegistryDevices);
  for (std::size_t i = 0; i < n; ++i) {
    const DeviceUse& d = devices[i];
    std::uint64_t u[2];
    std::memcpy(u, d.uuid.data(), sizeof u);
    DeviceWords& w = s.dev[i];
    st(w.uuid[0], u[0]);
    st(w.uuid[1], u[1]);
    st(w.held, d.held);
    st(w.active, d.active);
    st(w.managed, d.managed);
    st(w.hits, d.hits);
    st(w.misses, d.misses);
    st(w.returned_at, d.returned_at);
  }
  st(s.count, n);
  st(s.seq, q + 2, std::memory_order_release);
  return true;
}

void Registry::leave() {
  if (slot_ < 0 || token_pid_ != getpid()) return;
  std::uint64_t t = token_;
  Ref(slots(map_)[slot_].owner).compare_exchange_strong(t, 0, std::memory_order_acq_rel);
  slot_ = -1;
}

std::vector<ProcessEntry> Registry::processes(bool skip_self) const {
  std::vector<ProcessEntry> out;
  Slot* all = slots(map_);
  const long self = getpid();
  for (unsigned i = 0; i < kRegistrySlots; ++i) {
    Slot& s = all[i];
    const std::uint64_t owner = ld(s.owner, std::memory_order_acquire);
    const long pid = token_pid(owner);
    if (owner == 0 || (skip_self && pid == self)) continue;
    ProcessEntry e;
    bool consistent = false;
    // A torn read (the owner was writing) is tried again a few times.
    for (int attempt = 0; attempt < 8 && !consistent; ++attempt) {
      const std::uint64_t q1 = ld(s.seq, std::memory_order_acquire);
      if (q1 & 1) {
        sched_yield();
        continue;
      }
      e.devices.clear();
      const std::uint64_t n = ld(s.count);
      for (std::uint64_t k = 0; k < n && k < kRegistryDevices; ++k) {
        DeviceWords& w = s.dev[k];
        DeviceUse d;
        std::uint64_t u[2] = {ld(w.uuid[0]), ld(w.uuid[1])};
        std::memcpy(d.uuid.data(), u, sizeof u);
        d.held = ld(w.held);
        d.active = ld(w.active);
        d.managed = ld(w.managed);
        d.hits = ld(w.hits);
        d.misses = ld(w.misses);
        d.returned_at = ld(w.returned_at);
        e.devices.push_back(d);
      }
      std::uint64_t c[2] = {ld(s.comm[0]), ld(s.comm[1])};
      char name[17] = {};
      std::memcpy(name, c, 16);
      e.command.clear();
      for (char ch : std::string_view(name, strnlen(name, 16)))
        e.command += (ch >= 0x20 && ch < 0x7f) ? ch : '?';
      consistent = ld(s.seq) == q1 && ld(s.owner) == owner;
    }
    if (!consistent || !process_alive(pid, token_start(owner))) continue;
    e.pid = pid;
    out.push_back(std::move(e));
  }
  return out;
}

}  // namespace gpupool::node
