#include "interpose/cuda/ipc.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <charconv>
#include <cstring>
#include <map>

#include "core/lock_rank.hpp"
#include "interpose/cuda/state.hpp"
#include "interpose/runtime.hpp"
#include "sys/io.hpp"
#include "sys/log.hpp"
#include "wire/socket.hpp"

namespace gpupool::cuda::ipc {
namespace {

// The handle: bytes the driver ignores (measured on the H200, docs/memory.md)
// carry ours; every other byte is zero.
constexpr char kMagic[8] = {'g', 'p', 'p', 'o', 'o', 'l', 'I', '1'};
constexpr std::size_t kPidAt = 8, kNumberAt = 12, kTokenAt = 40;
// How long an open waits for each of the exporter's answers.
constexpr std::uint64_t kOpenTimeoutNs = 10'000'000'000ull;

struct Export {
  std::uint32_t number = 0;
  std::uint64_t token = 0;
  CUdeviceptr piece = 0;
  std::size_t size = 0;     // the program's bytes
  CUdeviceptr first = 0;    // its first granule
  std::size_t granule = 0;  // the mapping's size
  std::size_t granules = 0;
  CUcontext ctx = nullptr;  // the exporter's current context, pushed for the driver's calls
  // The piece's hand-out (the pointer maps' buffer id): an export whose
  // piece went another way than cuMemFree (its context's end, say) is
  // stale once the address is handed out again, or not at all.
  std::uint64_t buffer_id = 0;
};
struct Exports {
  Ranked<LockRank::cuda_ipc> mu;
  std::map<CUdeviceptr, Export> by_piece GPUPOOL_GUARDED_BY(mu);
  std::uint32_t next GPUPOOL_GUARDED_BY(mu) = 1;
  std::atomic<bool> any{false};  // frees of programs that never exported skip the lock
};

struct Import {
  CUdeviceptr base = 0;  // the reservation
  std::size_t bytes = 0;
  std::size_t size = 0;  // the piece's, from the address open() answered
  std::uint64_t buffer_id = 0;
  long pid = 0;
  std::uint32_t number = 0;
  std::uint64_t token = 0;  // (a pid is reused; export numbers start at 1 in every process)
};
struct Imports {
  Ranked<LockRank::cuda_ipc> mu;
  std::map<CUdeviceptr, Import> by_ptr GPUPOOL_GUARDED_BY(mu);  // the address open() answered
  std::atomic<bool> any{false};  // pointer queries of programs that never opened one skip the lock
};

std::size_t round_up(std::size_t n, std::size_t to) { return (n + to - 1) / to * to; }

template <class T>
void put(CUipcMemHandle* h, std::size_t at, T v) {
  std::memcpy(h->reserved + at, &v, sizeof v);
}
template <class T>
T get(const CUipcMemHandle& h, std::size_t at) {
  T v;
  std::memcpy(&v, h.reserved + at, sizeof v);
  return v;
}

void fill(CUipcMemHandle* h, const Export& e) {
  std::memset(h, 0, sizeof *h);
  std::memcpy(h->reserved, kMagic, sizeof kMagic);
  put(h, kPidAt, static_cast<std::uint32_t>(getpid()));
  put(h, kNumberAt, e.number);
  put(h, kTokenAt, e.token);
}

std::uint64_t random_token() {
  std::uint64_t t = 0;
  if (getrandom(&t, sizeof t, GRND_NONBLOCK) != static_cast<ssize_t>(sizeof t))
    t = io::mono_ns() * 0x9e3779b97f4a7c15ull ^ static_cast<std::uint64_t>(getpid());
  return t | 1;  // never 0
}

// A granule's descriptor, exported from its mapping (the program's table).
int export_granule(const Driver& d, CUdeviceptr at) {
  CUmemGenericAllocationHandle h = 0;
  if (d.mem_retain_handle(&h, reinterpret_cast<void*>(at)) != CUDA_SUCCESS) return -1;
  int fd = -1;
  if (d.mem_export(&fd, h, CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR, 0) != CUDA_SUCCESS) fd = -1;
  d.mem_release(h);
  // Until the socket's thread has copied it, it is in the program's table:
  // a child exec'ed meanwhile must not keep the granule alive.
  if (fd >= 0) fcntl(fd, F_SETFD, FD_CLOEXEC);
  return fd;
}

bool exportable(const Driver& d, CUdeviceptr at) {
  if (!d.mem_get_properties) return false;
  CUmemGenericAllocationHandle h = 0;
  if (d.mem_retain_handle(&h, reinterpret_cast<void*>(at)) != CUDA_SUCCESS) return false;
  CUmemAllocationProp prop{};
  const bool ok = d.mem_get_properties(&prop, h) == CUDA_SUCCESS &&
                  (prop.requestedHandleTypes & CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
  d.mem_release(h);
  return ok;
}

// The parts of an answer's header line.
bool parse_numbers(std::string_view s, std::uint64_t* out, std::size_t n) {
  for (std::size_t k = 0; k < n; ++k) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out[k]);
    if (ec != std::errc()) return false;
    s.remove_prefix(static_cast<std::size_t>(end - s.data()));
  }
  return true;
}

// One request to the exporter: its answer and the descriptors that came
// with it (the program's table: the driver imports them on this thread).
bool ask(long pid, const std::string& request, std::uint64_t deadline, std::string* answer,
         std::vector<int>* fds) {
  const io::OwnedFd fd =
      wire::reach(wire::socket_candidates(geteuid(), pid), pid, geteuid(), deadline).fd;
  if (!fd.valid()) return false;
  if (!wire::send_all(fd.get(), wire::request_line(request, deadline), deadline)) return false;
  for (;;) {
    char buf[512];
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kBatch)];
    iovec iov{buf, sizeof buf};
    msghdr msg{};
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    const ssize_t n = ::recvmsg(fd.get(), &msg, MSG_CMSG_CLOEXEC);
    if (n > 0 || (n == 0 && msg.msg_controllen)) {
      for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c; c = CMSG_NXTHDR(&msg, c))
        if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS) {
          const std::size_t k = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
          for (std::size_t j = 0; j < k; ++j) {
            int got = -1;
            std::memcpy(&got, CMSG_DATA(c) + j * sizeof(int), sizeof got);
            fds->push_back(got);
          }
        }
      answer->append(buf, static_cast<std::size_t>(n));
      if (answer->size() > 4096) return false;
      if (n > 0) continue;
    }
    if (n == 0) return true;
    if (errno == EINTR) continue;
    if (errno != EAGAIN || !wire::wait_for(fd.get(), POLLIN, deadline)) return false;
  }
}

void close_all(std::vector<int>& fds) {
  for (int f : fds) ::close(f);
  fds.clear();
}

// The exporter's granules mapped into a reservation of this process, with
// read-write access for `dev`; the piece's address, or 0.
CUdeviceptr import(const Driver& d, long pid, std::uint32_t number, std::uint64_t token,
                   CUdevice dev, Import* out) {
  std::uint64_t granules = 0, offset = 0, size = 0, granule = 0;
  CUdeviceptr base = 0;
  std::size_t mapped = 0;
  std::vector<int> fds;
  auto undo = [&] {
    close_all(fds);
    if (mapped) d.mem_unmap(base, mapped * granule);
    if (base) d.mem_address_free(base, granules * granule);
    return CUdeviceptr{0};
  };
  do {
    std::string answer;
    const std::string req = "ipc " + std::to_string(number) + " " + std::to_string(token) + " " +
                            std::to_string(mapped) + " " + std::to_string(kBatch);
    // Each batch its own time: the exporter exports 64 granules in about
    // 36 ms on the H200, so a piece of any size opens.
    const std::uint64_t deadline = io::mono_ns() + kOpenTimeoutNs;
    if (!ask(pid, req, deadline, &answer, &fds) || answer.rfind("ok\n", 0) != 0) {
      log().debug("cuIpcOpenMemHandle: process {} answered '{}'", pid, answer.substr(0, 120));
      return undo();
    }
    std::uint64_t head[4];
    if (!parse_numbers(std::string_view(answer).substr(3), head, 4) || head[3] == 0 ||
        head[0] == 0 || (base && (head[0] != granules || head[3] != granule)) || fds.empty() ||
        mapped + fds.size() > head[0])
      return undo();
    if (!base) {
      granules = head[0], offset = head[1], size = head[2], granule = head[3];
      if (d.mem_address_reserve(&base, granules * granule, granule, 0, 0) != CUDA_SUCCESS) {
        base = 0;
        return undo();
      }
    }
    for (int f : fds) {
      CUmemGenericAllocationHandle h = 0;
      const CUresult r = d.mem_import(&h, reinterpret_cast<void*>(static_cast<std::intptr_t>(f)),
                                      CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR);
      if (r != CUDA_SUCCESS) return undo();
      const CUresult m = d.mem_map(base + mapped * granule, granule, 0, h, 0);
      d.mem_release(h);  // the mapping keeps the memory
      if (m != CUDA_SUCCESS) return undo();
      ++mapped;
    }
    close_all(fds);
  } while (mapped < granules);
  CUmemAccessDesc access{};
  access.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  access.location.id = dev;
  access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  if (d.mem_set_access(base, granules * granule, &access, 1) != CUDA_SUCCESS) return undo();
  out->size = size;
  out->base = base;
  out->bytes = granules * granule;
  out->pid = pid;
  out->number = number;
  out->token = token;
  return base + offset;
}

}  // namespace

// The room's IPC state (cuda::State::ipc).
struct Registry {
  Exports exports;
  Imports imports;
};

Registry* make_registry() { return new Registry; }

namespace {
// The runtime's, made by the first call that needs it (an importer's first
// gpupool call may be its open). A process with gpupool switched off
// (GPUPOOL_DISABLE=1) exports nothing and leaves every open to the driver.
Registry* registry() {
  Runtime* rt = runtime();
  return rt && rt->cuda ? rt->cuda->ipc : nullptr;
}
}  // namespace

CUresult export_piece(const Driver& d, const PtrInfo& i, CUipcMemHandle* handle) {
  if (!handle) return CUDA_ERROR_INVALID_VALUE;
  if (!d.mem_get_address_range || !d.mem_retain_handle || !d.mem_export || !d.mem_release)
    return CUDA_ERROR_NOT_SUPPORTED;
  Registry* reg = registry();
  if (!reg) return CUDA_ERROR_NOT_SUPPORTED;
  Exports& x = reg->exports;
  {
    LockGuard lock(x.mu);
    if (auto it = x.by_piece.find(i.base); it != x.by_piece.end()) {
      if (it->second.buffer_id == i.buffer_id) {
        fill(handle, it->second);
        return CUDA_SUCCESS;
      }
      x.by_piece.erase(it);  // an earlier piece at this address: stale
    }
  }
  // The granule: the driver's mapping around the piece's start.
  CUdeviceptr first = 0;
  std::size_t granule = 0;
  if (d.mem_get_address_range(&first, &granule, i.base) != CUDA_SUCCESS || granule == 0)
    return CUDA_ERROR_NOT_SUPPORTED;
  // Exportable only if made so (the device supports POSIX descriptors).
  // Asked, not tried: an export costs about 0.56 ms a granule on the H200.
  if (!exportable(d, first)) return CUDA_ERROR_NOT_SUPPORTED;
  Export e;
  e.token = random_token();
  e.piece = i.base;
  e.size = i.requested;
  e.first = first;
  e.granule = granule;
  e.granules = round_up(i.base + i.requested - first, granule) / granule;
  e.buffer_id = i.buffer_id;
  if (d.ctx_get_current) d.ctx_get_current(&e.ctx);
  if (Runtime* rt = runtime_if_started()) rt->ipc_answer.store(answer, std::memory_order_release);
  LockGuard lock(x.mu);
  e.number = x.next++;
  auto [it, fresh] = x.by_piece.emplace(i.base, e);
  if (!fresh && it->second.buffer_id != e.buffer_id) it->second = e;  // stale
  fill(handle, it->second);  // (or another thread's export of it meanwhile)
  x.any.store(true, std::memory_order_release);
  return CUDA_SUCCESS;
}

void forget_export(CUdeviceptr piece) {
  Registry* reg = registry();
  if (!reg || !reg->exports.any.load(std::memory_order_acquire)) return;
  Exports& x = reg->exports;
  LockGuard lock(x.mu);
  x.by_piece.erase(piece);
}

std::string answer(std::string_view args, std::vector<int>* fds) {
  std::uint64_t a[4];
  if (!parse_numbers(args, a, 4) || a[3] == 0)
    return "error bad-request ipc <number> <token> <first> <count>\n";
  const Driver* d = driver();
  Registry* reg = registry();
  if (!reg) return "error bad-request no such export\n";
  Exports& x = reg->exports;
  LockGuard lock(x.mu);
  const Export* e = nullptr;
  for (const auto& [piece, one] : x.by_piece)
    if (one.number == a[0] && one.token == a[1]) e = &one;
  // Freed by the program (or never ours), or gone with its context: as
  // the driver, nothing to open.
  if (e) {
    // Asked by another process over the control socket, which the runtime
    // opened: it exists.
    const Runtime* rt = runtime_if_started();
    const PtrInfo now = rt ? device_map(*rt).find(e->piece) : PtrInfo{};
    if (!now.found || !now.active || now.base != e->piece || now.buffer_id != e->buffer_id) {
      x.by_piece.erase(e->piece);
      e = nullptr;
    }
  }
  if (!e || !d) return "error bad-request no such export\n";
  if (a[2] >= e->granules) return "error bad-request past the export's granules\n";
  const std::size_t count = std::min<std::size_t>({a[3], kBatch, e->granules - a[2]});
  const bool pushed = e->ctx && d->ctx_push && d->ctx_push(e->ctx) == CUDA_SUCCESS;
  for (std::size_t k = 0; k < count; ++k) {
    const int fd = export_granule(*d, e->first + (a[2] + k) * e->granule);
    if (fd < 0) {
      close_all(*fds);
      break;
    }
    fds->push_back(fd);
  }
  if (pushed) {
    CUcontext popped = nullptr;
    d->ctx_pop(&popped);
  }
  if (fds->empty()) return "error internal the driver did not export the granules\n";
  return "ok\n" + std::to_string(e->granules) + " " + std::to_string(e->piece - e->first) + " " +
         std::to_string(e->size) + " " + std::to_string(e->granule) + "\n";
}

bool ours(const CUipcMemHandle& handle) {
  return std::memcmp(handle.reserved, kMagic, sizeof kMagic) == 0;
}

CUresult open(const Driver& d, PFN_ipc_open driver_open, CUdeviceptr* dptr,
              const CUipcMemHandle& handle, unsigned flags) {
  const long pid = get<std::uint32_t>(handle, kPidAt);
  const auto number = get<std::uint32_t>(handle, kNumberAt);
  const auto token = get<std::uint64_t>(handle, kTokenAt);
  // Whatever the driver says of the handle itself: its error, exactly.
  auto drivers_answer = [&] { return driver_open(dptr, handle, flags); };
  if (!dptr || pid == getpid() || !d.mem_import || !d.mem_address_reserve || !d.mem_map ||
      !d.mem_set_access || !d.ctx_get_device)
    return drivers_answer();
  Registry* reg = registry();
  if (!reg) return drivers_answer();
  CUdevice dev = 0;
  if (const CUresult r = d.ctx_get_device(&dev); r != CUDA_SUCCESS) return r;
  Imports& m = reg->imports;
  // Opened already (by this thread before, or another meanwhile): its
  // address, or 0.
  auto opened = [&]() GPUPOOL_REQUIRES(m.mu) {
    for (const auto& [ptr, one] : m.by_ptr)
      if (one.pid == pid && one.number == number && one.token == token) return ptr;
    return CUdeviceptr{0};
  };
  {
    LockGuard lock(m.mu);
    if (const CUdeviceptr ptr = opened()) {
      *dptr = ptr;
      return CUDA_SUCCESS;
    }
  }
  Import im;
  const CUdeviceptr p = import(d, pid, number, token, dev, &im);
  if (!p) return drivers_answer();
  LockGuard lock(m.mu);
  if (const CUdeviceptr ptr = opened()) {
    d.mem_unmap(im.base, im.bytes);
    d.mem_address_free(im.base, im.bytes);
    *dptr = ptr;
    return CUDA_SUCCESS;
  }
  im.buffer_id = pooled_buffer_id(next_serial(), 0);
  m.by_ptr.emplace(p, im);
  m.any.store(true, std::memory_order_release);
  *dptr = p;
  return CUDA_SUCCESS;
}

PtrInfo find(CUdeviceptr p) {
  PtrInfo i;
  Registry* reg = registry();
  if (!reg || !reg->imports.any.load(std::memory_order_acquire)) return i;
  Imports& m = reg->imports;
  LockGuard lock(m.mu);
  auto it = m.by_ptr.upper_bound(p);
  if (it == m.by_ptr.begin()) return i;
  --it;
  // The reservation around the piece: its other bytes are the exporter's
  // other pieces', unallocated here.
  const Import& im = it->second;
  if (p < im.base || p >= im.base + im.bytes) return i;
  i.found = i.active = true;
  i.base = it->first;
  i.size = i.requested = im.size;
  i.buffer_id = im.buffer_id;
  return i;
}

bool close(const Driver& d, CUdeviceptr dptr, CUresult* r) {
  Registry* reg = registry();
  if (!reg) return false;
  Imports& m = reg->imports;
  Import im;
  {
    LockGuard lock(m.mu);
    auto it = m.by_ptr.find(dptr);
    if (it == m.by_ptr.end()) return false;
    im = it->second;
    m.by_ptr.erase(it);
  }
  *r = d.mem_unmap(im.base, im.bytes);
  d.mem_address_free(im.base, im.bytes);
  return true;
}

}  // namespace gpupool::cuda::ipc
