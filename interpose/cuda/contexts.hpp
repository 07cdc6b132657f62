// gpupool's CUDA contexts: one record per context (its arenas and its fence
// epoch), found from the current context, retired when the driver destroys
// the context (or in a forked child).
//
// A record belongs to one context's life, not to its handle: the driver
// hands a dead context's handle to the next context it makes, and a primary
// context comes back after a reset or its last release with the same handle
// and none of its memory. The driver's context id (cuCtxGetId) is never
// reused, so a record is the one for its id. A context may die where gpupool
// does not see it (inside another library, through an export gpupool does
// not hook): its record is recognised as dead before gpupool hands out or
// frees anything of it, and dropped without driver calls on its memory.
#pragma once

#include <cuda.h>

#include <sched.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/hot_tls.hpp"
#include "core/pool.hpp"
#include "interpose/cuda/driver.hpp"
#include "interpose/cuda/state.hpp"

namespace gpupool {
struct Runtime;
}

namespace gpupool::cuda {

// One CUDA context as the pool sees it. Never freed: threads may hold a
// pointer to one (thread-local cache) after it was retired.
struct CtxState {
  State* state = nullptr;  // the registry it is in
  CUcontext ctx = nullptr;
  // The driver's id of the context (cuCtxGetId), unique for the process's
  // life; 0 with a driver that has no ids (before CUDA 12.0), whose records
  // then end only through the hooks.
  unsigned long long id = 0;
  // 1, 2, ...: the context's name in gpupool's stats (no address: the same
  // program's stats read alike from run to run).
  unsigned ordinal = 0;
  CUdevice dev = 0;
  std::string device;  // its UUID as nvidia-smi prints it, else "cuda:<dev>"
  std::size_t device_total = 0;
  bool primary = false;  // the device's primary context (seen through cuDevicePrimaryCtxRetain)

  // Fences. A block freed while epoch_next == E is safe to reuse once a
  // synchronization of the whole context that *started* after the free has
  // finished, or a mark recorded after it has completed: each takes
  // s = epoch_next++ (s >= E) and sets epoch_done >= s when it succeeds.
  std::atomic<std::uint64_t> epoch_next{1};
  std::atomic<std::uint64_t> epoch_done{0};
  // One fence synchronization at a time (synchronize_context, wait_fence):
  // threads that need one while another runs wait for it, and those it does
  // not cover (their fences came after it started) run the next one, once,
  // together. The driver runs them one at a time anyway (about one a
  // microsecond on the H200, whatever the number of threads).
  Ranked<LockRank::cuda_sync> sync_mu;
  std::condition_variable_any sync_cv;
  // Written under sync_mu; read without it by a waiter's spin.
  std::atomic<bool> syncing{false};
  // Marks: context events (cuCtxRecordEvent, drivers of CUDA 12.5 on),
  // recorded at frees at most every kMarkGapNs (at every free while
  // ordering on the device, order_fence), oldest first. A mark
  // captures the work of every stream of the context queued before it, and
  // nothing queued after: waiting for the first mark after a free waits for
  // the block's old work only, where a synchronization of the context also
  // waits for all the program queued since (on the H200, 1.95 ms against
  // 21.97 ms with 20 ms of newer work queued: docs/memory.md). Made at the
  // first mark, gone with the context (the driver destroys its events);
  // marks_off once the driver has no such call or refused one.
  struct Marks {
    static constexpr unsigned kMax = 16;
    CUevent events[kMax] = {};  // each made at its slot's first use, in the context
    std::uint64_t epochs[kMax] = {};
    unsigned first = 0;  // the oldest mark's slot
    unsigned count = 0;
  };
  std::unique_ptr<Marks> marks GPUPOOL_GUARDED_BY(sync_mu);
  bool marks_off GPUPOOL_GUARDED_BY(sync_mu) = false;
  std::atomic<std::uint64_t> last_mark_ns{0};
  // Ordering on the device (order_fence): the context's non-blocking
  // streams, which a wait on the legacy stream does not order, and the
  // newest mark's epoch every stream has been made to wait for.
  std::vector<CUstream> nonblocking GPUPOOL_GUARDED_BY(sync_mu);
  // GPUPOOL_REUSE=ordered where the driver has what it takes, set when the
  // record is made; marks_failed once the driver refused a mark (no
  // ordering here from then on: marks_off, read without sync_mu).
  bool ordered = false;
  std::atomic<bool> marks_failed{false};
  std::atomic<std::uint64_t> epoch_ordered{0};

  // Held shared while a backend call may touch this context's memory,
  // exclusively while the context is torn down, so the pool never frees a
  // block the driver has already freed (its address may be reused).
  Ranked<LockRank::cuda_teardown, std::shared_mutex> teardown_mu;
  std::atomic<bool> retired{false};

  // The driver's row pitch by (width in bytes, element size), learnt once
  // each (pitch_for).
  struct Pitch {
    std::size_t width;
    unsigned element;
    std::size_t pitch;
  };
  Ranked<LockRank::cuda_pitch> pitch_mu;
  std::vector<Pitch> pitches GPUPOOL_GUARDED_BY(pitch_mu);

  // Null once retired: the pool destroys retired arenas.
  std::atomic<Arena*> device_arena{nullptr};
  // Pinned arenas by normalised flags (flags | DEVICEMAP, 0..7).
  std::atomic<Arena*> host_arenas[8] = {};
  // Virtual memory units (vmm.hpp), an arena per set of allocation
  // properties: the first kVmmProps sets the program uses (XLA uses one).
  static constexpr std::size_t kVmmProps = 4;
  CUmemAllocationProp vmm_props[kVmmProps] = {};  // written before its arena is published
  std::atomic<Arena*> vmm_arenas[kVmmProps] = {};
};

// Take s = epoch_next++ before a full-context synchronization and pass it
// here when the synchronization succeeded.
void epoch_completed(CtxState* st, std::uint64_t s);

// Synchronize st's context (pushing it if it is not current) and complete
// its epoch, unless a synchronization that started later than every fence
// up to `need` (every fence taken so far, without it) did so meanwhile.
// Used when the pool needs a pending block.
void synchronize_context(CtxState* st, std::uint64_t need);
void synchronize_context(CtxState* st);

// Marks are recorded at most this often: a free (of device memory whose
// waits ask for one fence: an expandable range's, memory.cpp) records one
// when the last is older (about 0.35 us each on the H200: under 1% of the time of a
// training loop that frees continuously), and a mark covers the frees
// since the one before, capturing at most this much more of the work
// queued after them.
inline constexpr std::uint64_t kMarkGapNs = 50'000;

// A block of st's is freed: its fence (to stamp it with), a mark recorded
// after it when the last one is old enough. Never blocks.
std::uint64_t fence_at_free(CtxState* st);

// Until `fence` has passed: a wait for the oldest mark that covers it, or
// without one, a synchronization of the context.
void wait_fence(CtxState* st, std::uint64_t fence);

// Instead of a host wait for `fence`: every stream of st's context made to
// wait, on the device, for the oldest mark that covers the fence (a mark
// recorded at a free: the driver's cuMemFree returned only once the work
// before it was done, so no earlier work can wait for later work). The
// legacy stream's wait orders the blocking streams (per-thread ones
// included); each non-blocking stream gets its own. True when done; false
// where it cannot be (no such mark, a capture under way, peer access or
// green-context streams in the process, st's context not current), and the
// caller waits on the host. Only under GPUPOOL_REUSE=ordered: cuMemFree
// blocks only the thread that frees, while ordering holds back every
// thread's later work, and work before the free may wait for another
// thread's (a receive for a send another thread queues): a hang where the
// host's wait makes none (docs/memory.md).
bool order_fence(CtxState* st, std::uint64_t fence);
// Whether st's context orders on the device (GPUPOOL_REUSE=ordered, not
// ended by end_device_order).
bool device_ordering(const CtxState* st);
// A stream was made in st's context with these flags: a non-blocking one is
// remembered and made to wait for what the streams were ordered after.
void stream_made(CtxState* st, CUstream s, unsigned flags);
// cuStreamCreate's hooks, after the driver made `s` in the current context:
// stream_made where ordering is on; where the stream cannot be remembered,
// ordering ends. Nothing in other modes.
void stream_noted(const Driver& d, CUstream s, unsigned flags) noexcept;
// Before the driver destroys a stream: no order_fence waits on it after
// (stream_kept when the driver refused, with no lock held).
bool stream_going(CUstream s);  // whether a set held it
void stream_kept(CUresult r);
// Peer access or a green-context stream: streams the sets above do not
// hold may touch device memory; no ordering on the device from now on.
void end_device_order(const char* why);
// Before memory is reached other than by the program's streams (another
// process's, through IPC): the old work of every piece handed out on the
// device's order, waited for on the host.
void wait_device_ordered();

// A backend whose blocks' fences are its context's epochs (above): the
// device and pinned arenas' (memory.cpp) and the virtual memory units'
// (vmm.cpp). fenced: freed blocks wait for the context's work; marks:
// frees record marks, for the one-fence waits of an expandable range's
// pieces and for ordering on the device (otherwise the bins' waits are for
// all their pending blocks).
class ContextFenced : public Backend {
 public:
  ContextFenced(CtxState* st, bool fenced, bool marks) : st_(st), fenced_(fenced), marks_(marks) {}

  std::uint64_t fence() override {
    if (!fenced_) return 0;
    return marks_ ? fence_at_free(st_) : st_->epoch_next.load(std::memory_order_seq_cst);
  }
  bool passed(std::uint64_t f) override {
    return f == 0 || st_->epoch_done.load(std::memory_order_acquire) >= f;
  }
  void wait_all() override { synchronize_context(st_); }
  void wait_for(std::uint64_t f) override { wait_fence(st_, f); }
  // Device memory whose frees record marks: the device can be made to wait.
  bool order_after(std::uint64_t f) override { return marks_ && order_fence(st_, f); }
  bool orders() override { return marks_ && device_ordering(st_); }
  bool reusable(std::uint64_t f) override {
    return passed(f) || (marks_ && st_->epoch_ordered.load(std::memory_order_acquire) >= f);
  }

 protected:
  CtxState* const st_;

 private:
  const bool fenced_, marks_;
};

// ---- the solo rule ----------------------------------------------------------
// PyCUDA's DeviceMemoryPool hands a freed block out again at once: all the
// program's device work is in the order of the legacy default stream, so
// what it does with the block next runs after what it did before the free.
// Safe reuse does the same while that order provably holds (as for an
// OpenCL context with a single in-order queue): the process has one
// context, has created no stream, asked for no per-thread default stream
// and enabled no peer access, and one thread allocates and frees device
// memory (per-thread default streams of different threads run side by
// side; one thread's is ordered with the legacy stream). Pinned blocks
// never: the host writes them at once. At the first sign of another order
// the rule ends for the whole process: every context is synchronized
// before the call that ended it returns, so that the old work of blocks
// freed under the rule (they carry no fence) is done before any other order
// can reach them. That covers a free racing the end: the free saw the rule
// hold, so its block's old work was submitted before the end's
// (sequentially consistent) store, and the synchronization that follows
// the store waits for all work submitted before it.
namespace detail {
extern std::atomic<bool> g_solo;
extern std::atomic<const void*> g_solo_thread;
extern GPUPOOL_HOT_TLS char t_solo_self;  // its address names the thread
}  // namespace detail

// The rule ends (idempotent; a second caller returns once the first one's
// wait is done). `why` goes to the debug log.
void end_solo(const char* why);

// A device block is freed on this thread (DeviceBackend::fence): true if
// the rule holds, so the block needs no fence. On any thread but the one
// that allocates, the rule ends first. The hit path: two relaxed loads.
inline bool solo_free() {
  if (!detail::g_solo.load(std::memory_order_relaxed)) return false;
  if (detail::g_solo_thread.load(std::memory_order_relaxed) == &detail::t_solo_self) return true;
  end_solo("a second thread frees device memory");
  return false;
}

// The program asked for a driver entry point (cuGetProcAddress, dlsym): a
// per-thread default stream one (the flag, or a _ptsz/_ptds name) ends the
// rule, which cannot see which threads' streams such entry points use.
void solo_note_symbol(const char* name, unsigned long long flags);

// The state of the current context, created on first use (create = true).
// nullptr when there is no usable current context (the caller then passes
// the call to the driver, which returns its own error). The hit path: one
// driver call (cuCtxGetId of the current context) and a thread-local
// compare. A record left by a dead context with the same handle is retired
// first.
CtxState* current_state(const Driver& d, Runtime& rt, bool create);

// True unless the driver says st's context is gone (its handle names no
// context, or another one). Without context ids: true.
bool context_alive(const Driver& d, const CtxState* st);

// Retire the records of every context that died unseen (context_alive),
// with no driver call on their memory.
void retire_dead_contexts(const Driver& d, Runtime& rt);

// The row pitch the driver gives cuMemAllocPitch_v2 for rows of `width`
// bytes and `element`-byte accesses in st's context (current), learnt from
// one real call of one row the first time (the pitch depends on the row,
// not on the height). Otherwise the driver's answer to that call.
CUresult pitch_for(const Driver& d, CtxState* st, std::size_t width, unsigned element,
                   std::size_t* pitch);

// The pinned arena of `st` for these (valid) flags, created on first use.
Arena* host_arena(CtxState* st, Runtime& rt, unsigned flags);

// The virtual memory arena of `st` for these properties, created on first
// use; nullptr when st has arenas for kVmmProps other sets.
Arena* vmm_arena(CtxState* st, Runtime& rt, const CUmemAllocationProp& prop);

// The primary context of `dev` as we know it (nullptr: none with pooled
// memory). Called by the primary-context hooks.
CtxState* primary_state(const Driver& d, Runtime& rt, CUdevice dev);
void note_primary(CUcontext ctx, CUdevice dev) noexcept;
// The record of the live context `ctx` names now, or nullptr (a record of an
// earlier context with that handle is retired first).
CtxState* find_state(const Driver& d, Runtime& rt, CUcontext ctx);

// Drop every block of st from the pool and the pointer maps without freeing
// anything (the driver did), st's teardown lock held exclusively.
// keep_stats: its counters stay in the totals (not in a forked child, where
// they are the parent's).
void retire_locked(CtxState* st, Runtime& rt, bool keep_stats = true)
    GPUPOOL_REQUIRES(st->teardown_mu);

// The pool group of the device memory of `dev` ("cuda:<ordinal>").
std::string device_group(CUdevice dev);

// Held bytes of the arenas of `dev` (its contexts' and its memory pools')
// that could be given back (Arena::releasable_bytes; cuMemGetInfo counts
// them as free).
std::size_t held_device_bytes(CUdevice dev);

}  // namespace gpupool::cuda
