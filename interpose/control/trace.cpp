#include "interpose/control/trace.hpp"
#include "core/fork_wait.hpp"
#include "interpose/runtime.hpp"

#include <fcntl.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <vector>

#include "sys/io.hpp"
#include "sys/log.hpp"
#include "sys/outputs.hpp"

namespace gpupool::trace {
namespace {

struct Record {
  std::uint64_t t;
  const Arena* arena;
  std::uint64_t handle;
  std::uint64_t requested;
  std::uint64_t size;
  std::uint32_t tid;
  std::uint32_t site;  // allocations: sites::kNoSite when not sampled
  char op;             // 'a' or 'f'
  char hit;            // 'h', 'm', 'd' (docs/trace.md), or 0 for frees
};

constexpr std::size_t kRing = 1024;

// Single producer (the owning thread), consumers serialized by drain_mu.
struct ThreadBuf {
  std::atomic<std::uint64_t> head{0};
  std::atomic<std::uint64_t> tail{0};
  Ranked<LockRank::trace_buffer> drain_mu;
  std::atomic<bool> in_use{true};
  ThreadBuf* next = nullptr;
  Record recs[kRing];
};

char* put_dec(char* p, std::uint64_t v) {
  char tmp[20];
  int n = 0;
  do {
    tmp[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v);
  while (n) *p++ = tmp[--n];
  return p;
}

char* put_hex(char* p, std::uint64_t v) {
  static const char digits[] = "0123456789abcdef";
  char tmp[16];
  int n = 0;
  do {
    tmp[n++] = digits[v & 15];
    v >>= 4;
  } while (v);
  while (n) *p++ = tmp[--n];
  return p;
}

std::string no_space(std::string s) {
  for (char& c : s)
    if (c == ' ' || c == '\t' || c == '\n') c = '_';
  return s.empty() ? "-" : s;
}

// "# cmdline WORDS\n": the program's command line (reports name the
// process by it), its words shell-quoted where needed, control characters
// as '?', cut at 1 KiB. Readers before it skip '#' lines.
std::string command_line_comment() {
  char raw[1024];
  ssize_t n = -1;
  const int fd = ::open("/proc/self/cmdline", O_RDONLY | O_CLOEXEC);
  if (fd >= 0) {
    n = ::read(fd, raw, sizeof raw);
    ::close(fd);
  }
  if (n <= 0) return "";
  std::string line = "# cmdline";
  const bool cut = n == static_cast<ssize_t>(sizeof raw);
  for (ssize_t i = 0; i < n;) {
    std::string word;
    for (; i < n && raw[i]; ++i)
      word += (static_cast<unsigned char>(raw[i]) < 0x20 || raw[i] == 0x7f) ? '?' : raw[i];
    ++i;
    const bool plain = !word.empty() && word.find_first_not_of(
                                            "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                            "0123456789_./:=,+@%-") == std::string::npos;
    if (plain) {
      line += " " + word;
      continue;
    }
    line += " '";
    for (char c : word) line += c == '\'' ? std::string("'\\''") : std::string(1, c);
    line += "'";
  }
  return line + (cut ? " ...\n" : "\n");
}

}  // namespace

struct Tracer::Impl {
  std::string value;                              // GPUPOOL_TRACE_FILE as set
  long run_pid = 0;                               // GPUPOOL_RUN_PID
  std::string path;                               // the file this process writes (sys/outputs.hpp)
  std::string passed_over;                        // the name another live process held, if any
  io::OwnedFd file GPUPOOL_GUARDED_BY(write_mu);  // held (sys/outputs.hpp)
  bool disabled = false;                          // a forked child until renew_in_child
  bool attached = false;                          // started while the process ran ('# attached')
  bool ended GPUPOOL_GUARDED_BY(write_mu) = false;  // "# end" written
  // The process whose file this is (renew_in_child, restart); read unlocked
  // by finish() at _exit.
  std::atomic<pid_t> pid{getpid()};
  // A forked child's file is opened with its first records: a child that
  // never allocates (a fork to exec another program) leaves no file.
  bool open_pending = false;
  // CLOCK_MONOTONIC at the trace's start: records' times count from it.
  // Read unlocked by the allocating threads; a restart sets it anew.
  std::atomic<std::uint64_t> t0{0};
  // Now on the trace's clock: 0 for a time read before a restart set t0.
  std::uint64_t since_t0() const {
    const std::uint64_t now = io::mono_ns(), start = t0.load(std::memory_order_relaxed);
    return now > start ? now - start : 0;
  }
  std::atomic<ThreadBuf*> bufs{nullptr};
  pthread_key_t key{};
  Ranked<LockRank::trace_file> write_mu;  // the file, the arena ids and the declarations written
  std::vector<const Arena*> arena_ids GPUPOOL_GUARDED_BY(write_mu);
  sites::Sites* sites = nullptr;
  // Of sites->declarations(), in this file.
  std::size_t declarations_written GPUPOOL_GUARDED_BY(write_mu) = 0;
  std::atomic<std::uint64_t> written{0};
  std::atomic<std::uint64_t> dropped{0};

  // fresh: this process's file is chosen (output_names) and started with
  // the header; else `path` is opened again to append.
  bool open_file(bool fresh, bool forked_child, std::string* why) GPUPOOL_REQUIRES(write_mu);
  // On the files thread.
  bool open_file_here(bool fresh, bool forked_child, std::string* why) GPUPOOL_REQUIRES(write_mu);
  // False when the records were dropped.
  bool write_out(const std::string& out, std::uint64_t records) GPUPOOL_REQUIRES(write_mu);
  // Where the name came from, for what is logged.
  const char* setting() const { return attached ? "gpupool_trace_start" : "GPUPOOL_TRACE_FILE"; }
  // Logged out of the files thread (which must not log).
  // The program `gpupool run` started finds its name taken only when
  // another run has it (two started at once): said as a warning. A forked
  // child, or a second program under a hand-set name, takes a sibling as
  // usual.
  void say_passed_over() const {
    if (passed_over.empty()) return;
    if (run_pid == static_cast<long>(getpid()))
      log().warn(
          "{}: {} is written by another run's process; this run's trace is "
          "{} (its '# run' line keeps it apart)",
          setting(), passed_over, path);
    else
      log().info("{}: {} is written by another live process; this one writes {}", setting(),
                 passed_over, path);
  }
  ThreadBuf* mine();
  void push(Record r);
  void drain(ThreadBuf* b);
  std::size_t arena_id(const Arena* a, std::string& out) GPUPOOL_REQUIRES(write_mu);
};

namespace {
struct TraceSlot {
  Tracer::Impl* owner = nullptr;
  ThreadBuf* buf = nullptr;
  std::uint32_t tid = 0;
};
thread_local TraceSlot tl_slot;

void release_buf(void* p) {
  // The thread is gone: its buffer (and any records still in it, which the
  // next flush writes) can serve a new thread.
  static_cast<ThreadBuf*>(p)->in_use.store(false, std::memory_order_release);
}
}  // namespace

ThreadBuf* Tracer::Impl::mine() {
  if (tl_slot.owner == this) return tl_slot.buf;
  ThreadBuf* b = nullptr;
  for (ThreadBuf* x = bufs.load(std::memory_order_acquire); x; x = x->next) {
    bool expected = false;
    if (!x->in_use.load(std::memory_order_relaxed) &&
        x->in_use.compare_exchange_strong(expected, true, std::memory_order_acquire)) {
      b = x;
      break;
    }
  }
  if (!b) {
    b = new ThreadBuf;
    ThreadBuf* old = bufs.load(std::memory_order_relaxed);
    do b->next = old;
    while (
        !bufs.compare_exchange_weak(old, b, std::memory_order_release, std::memory_order_relaxed));
  }
  pthread_setspecific(key, b);
  tl_slot.owner = this;
  tl_slot.buf = b;
  tl_slot.tid = static_cast<std::uint32_t>(syscall(SYS_gettid));
  return b;
}

void Tracer::Impl::push(Record r) {
  ThreadBuf* b = mine();
  r.tid = tl_slot.tid;
  const std::uint64_t h = b->head.load(std::memory_order_relaxed);
  if (h - b->tail.load(std::memory_order_acquire) == kRing) drain(b);
  b->recs[h % kRing] = r;
  b->head.store(h + 1, std::memory_order_release);
}

std::size_t Tracer::Impl::arena_id(const Arena* a, std::string& out) {
  for (std::size_t i = 0; i < arena_ids.size(); ++i)
    if (arena_ids[i] == a) return i;
  // Ids are never reused: a replay keys its state by them.
  arena_ids.push_back(a);
  const ArenaOptions& o = a->options();
  out += "arena " + std::to_string(arena_ids.size() - 1) + " " + no_space(o.kind) + " " +
         no_space(o.group) + " " + o.name + "\n";
  return arena_ids.size() - 1;
}

void Tracer::Impl::drain(ThreadBuf* b) {
  LockGuard drain_lock(b->drain_mu);
  const std::uint64_t t = b->tail.load(std::memory_order_relaxed);
  const std::uint64_t h = b->head.load(std::memory_order_acquire);
  if (t == h) return;
  LockGuard write_lock(write_mu);
  // Finished (the program stopped the trace): what a thread pushed as it
  // stopped is not the file's.
  if (ended) {
    b->tail.store(h, std::memory_order_release);
    return;
  }
  std::string out;
  out.reserve((h - t) * 48);
  // Every site these records name was declared before they were pushed.
  // What a dropped batch declared is declared again with the next one:
  // later records may name it, and a reader refuses an undeclared name.
  const std::size_t declared_before = declarations_written, arenas_before = arena_ids.size();
  if (sites) declarations_written = sites->declarations(declarations_written, &out);
  char line[160];
  for (std::uint64_t i = t; i != h; ++i) {
    const Record& r = b->recs[i % kRing];
    const std::size_t id = arena_id(r.arena, out);
    // Hand-rolled: snprintf made formatting most of the trace's cost.
    char* p = line;
    *p++ = r.op;
    *p++ = ' ';
    p = put_dec(p, r.t);
    *p++ = ' ';
    p = put_dec(p, r.tid);
    *p++ = ' ';
    p = put_dec(p, id);
    *p++ = ' ';
    p = put_hex(p, r.handle);
    *p++ = ' ';
    p = put_dec(p, r.requested);
    *p++ = ' ';
    p = put_dec(p, r.size);
    if (r.op == 'a') {
      *p++ = ' ';
      *p++ = r.hit;
      if (r.site != sites::kNoSite) {
        *p++ = ' ';
        p = put_dec(p, r.site);
      }
    }
    *p++ = '\n';
    out.append(line, static_cast<std::size_t>(p - line));
  }
  // Slots are free for the producer only once copied out.
  b->tail.store(h, std::memory_order_release);
  if (!write_out(out, h - t)) {
    declarations_written = declared_before;
    arena_ids.resize(arenas_before);
  }
}

bool Tracer::Impl::write_out(const std::string& out, std::uint64_t records) {
  if (disabled) return false;
  std::string why;
  bool ok = false, opened = false;
  // The file is the files thread's (sys/io.hpp): so is every use of it.
  // It runs there while this thread holds write_mu, which the analysis,
  // thread by thread, cannot see.
  io::in_private([&]() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
    if (open_pending) {
      open_pending = false;
      if (!open_file_here(/*fresh=*/true, /*forked_child=*/true, &why)) {
        disabled = true;
        file.forget();
        return;
      }
      opened = true;
    }
    // Closed (or its number reused) under us: the records go on at the end
    // of the same file.
    if (!file.ours() && !open_file_here(/*fresh=*/false, false, &why)) {
      file.forget();
    } else if (io::write_bounded(file.get(), out)) {
      ok = true;
    } else {
      why = std::string("cannot write the trace file: ") + strerror(errno);
    }
  });
  if (opened) say_passed_over();
  if (ok) {
    written.fetch_add(records, std::memory_order_relaxed);
    return true;
  }
  if (dropped.fetch_add(records, std::memory_order_relaxed) == 0)
    log().warn(
        "GPUPOOL_TRACE_FILE: {}; trace records are being dropped (counted in the stats "
        "warnings)",
        why);
  return false;
}

bool Tracer::Impl::open_file(bool fresh, bool forked_child, std::string* why) {
  bool ok = false;
  // On the files thread, while this one holds write_mu (as in write_out).
  io::in_private(
      [&]() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { ok = open_file_here(fresh, forked_child, why); });
  return ok;
}

bool Tracer::Impl::open_file_here(bool fresh, bool forked_child, std::string* why) {
  file.forget();
  io::Hold held = io::Hold::failed;
  if (!fresh) {
    file = io::hold_output(path, /*append=*/true, &held, why);
    return held == io::Hold::held;
  }
  passed_over.clear();
  for (const std::string& name :
       io::output_names(value, static_cast<long>(getpid()), run_pid, forked_child)) {
    file = io::hold_output(name, /*append=*/false, &held, why);
    if (held == io::Hold::failed) return false;
    if (held == io::Hold::held) {
      path = name;
      break;
    }
    passed_over = name;
  }
  if (held != io::Hold::held) return false;  // *why: the last name is another process's
  // The start in Unix time: t0's, the clock records count from.
  timespec now;
  clock_gettime(CLOCK_REALTIME, &now);
  const std::uint64_t start =
      std::uint64_t(now.tv_sec) * 1000000000u + std::uint64_t(now.tv_nsec) - since_t0();
  char header[256];
  snprintf(
      header, sizeof header,
      "# gpupool trace 2\n# pid %ld start_unix_ns %" PRIu64
      "\n"
      "# a t_ns tid arena handle requested size h|m|d [site] / f t_ns tid arena handle requested "
      "size\n",
      static_cast<long>(getpid()), start);
  io::write_bounded(file.get(), header, std::strlen(header));
  if (attached) io::write_bounded(file.get(), std::string("# attached\n"));
  io::write_bounded(file.get(), command_line_comment());
  // Which `gpupool run` this process belongs to: readers keep apart the
  // traces of two runs beside one name (docs/trace.md).
  if (run_pid > 0) io::write_bounded(file.get(), "# run " + std::to_string(run_pid) + "\n");
  return true;
}

Tracer::Tracer() : impl_(new Impl) {
  impl_->t0 = io::mono_ns();
  pthread_key_create(&impl_->key, release_buf);
}

Tracer* Tracer::open(const std::string& value, long run_pid, sites::Sites* sites, bool attached,
                     std::string* why) {
  auto* t = new Tracer;  // never destroyed: threads may trace during exit
  t->impl_->value = value;
  t->impl_->run_pid = run_pid;
  t->impl_->sites = sites;
  t->impl_->attached = attached;
  bool opened;
  {
    LockGuard lock(t->impl_->write_mu);  // no other thread has it yet
    opened = t->impl_->open_file(/*fresh=*/true, /*forked_child=*/false, why);
  }
  if (!opened) {
    pthread_key_delete(t->impl_->key);
    delete t->impl_;
    delete t;
    return nullptr;
  }
  t->impl_->say_passed_over();
  return t;
}

// Never throws into the pool: a record that cannot be kept (out of host
// memory for a thread's buffer) is dropped and counted.
void Tracer::allocated(const Arena& arena, const Block& block, Served how,
                       std::uint32_t site) noexcept {
  const char letter = how == Served::hit ? 'h' : how == Served::miss ? 'm' : 'd';
  try {
    impl_->push(Record{impl_->since_t0(), &arena, block.handle, block.requested, block.size, 0,
                       site, 'a', letter});
  } catch (...) {
    impl_->dropped.fetch_add(1, std::memory_order_relaxed);
  }
}

void Tracer::freed(const Arena& arena, const Block& block) noexcept {
  try {
    impl_->push(Record{impl_->since_t0(), &arena, block.handle, block.requested, block.size, 0,
                       sites::kNoSite, 'f', 0});
  } catch (...) {
    impl_->dropped.fetch_add(1, std::memory_order_relaxed);
  }
}

void Tracer::flush() {
  for (ThreadBuf* b = impl_->bufs.load(std::memory_order_acquire); b; b = b->next) impl_->drain(b);
}

void Tracer::finish() {
  // A vfork() child runs in its parent's memory: the parent's records and
  // file are not its to write.
  if (getpid() != impl_->pid) return;
  flush();
  LockGuard lock(impl_->write_mu);
  if (impl_->disabled || impl_->ended) return;
  impl_->ended = true;              // from now on records are dropped (drain)
  if (impl_->open_pending) return;  // a forked child's file, never opened: nothing to end
  char line[40] = "# end ";
  char* p = put_dec(line + 6, impl_->since_t0());
  *p++ = '\n';
  (void)impl_->write_out(std::string(line, p), 0);
}

bool Tracer::restart(const std::string& value, long run_pid, std::string* why) {
  Impl& t = *impl_;
  flush();  // finished: drops what came since
  LockGuard lock(t.write_mu);
  // The last file is let go (its lock too: another process may take its
  // name now); its descriptor is the files thread's.
  io::in_private([&]() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { t.file.close(); });
  t.value = value;
  t.run_pid = run_pid;
  t.attached = true;
  t.t0 = io::mono_ns();
  t.arena_ids.clear();
  t.declarations_written = 0;
  t.open_pending = false;
  t.disabled = false;
  t.pid = getpid();
  if (!t.open_file(/*fresh=*/true, /*forked_child=*/false, why)) {
    t.file.forget();
    return false;  // still ended
  }
  t.ended = false;
  t.say_passed_over();
  return true;
}

std::string Tracer::path() const {
  LockGuard lock(impl_->write_mu);
  return impl_->path;
}

void Tracer::arena_destroyed(const Arena& arena) {
  // Buffered records name the arena by pointer: write them out while it
  // exists. A new arena at the same address then gets a new id.
  flush();
  LockGuard lock(impl_->write_mu);
  for (const Arena*& a : impl_->arena_ids)
    if (a == &arena) a = nullptr;
}

std::uint64_t Tracer::records_written() const {
  return impl_->written.load(std::memory_order_relaxed);
}

std::uint64_t Tracer::records_dropped() const {
  return impl_->dropped.load(std::memory_order_relaxed);
}

bool Tracer::fork_prepare() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  for (ThreadBuf* b = impl_->bufs.load(std::memory_order_acquire); b; b = b->next)
    if (!fork_wait::take(b->drain_mu)) return false;
  return fork_wait::take(impl_->write_mu);
}

void Tracer::fork_parent() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  impl_->write_mu.unlock();
  for (ThreadBuf* b = impl_->bufs.load(std::memory_order_acquire); b; b = b->next)
    b->drain_mu.unlock();
}

void Tracer::fork_child() GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  Impl& t = *impl_;
  // Every thread but this one is gone: their buffers are free, and every
  // buffered record is the parent's to write.
  for (ThreadBuf* b = t.bufs.load(std::memory_order_acquire); b; b = b->next) {
    b->tail.store(b->head.load(std::memory_order_relaxed), std::memory_order_relaxed);
    b->in_use.store(false, std::memory_order_relaxed);
  }
  tl_slot = {};
  // Nothing is written until renew_in_child gives the child a file of its
  // own: the descriptor is still the parent's file.
  t.disabled = true;
  fork_parent();
}

void Tracer::renew_in_child() {
  Impl& t = *impl_;
  LockGuard lock(t.write_mu);  // free: the child's one thread, every lock let go
  // The parent's file stays the parent's: where it was opened among the
  // program's descriptors (no private table), the child's copy is closed,
  // so that it does not hold the file (sys/outputs.hpp).
  t.file.close();
  // A file of its own, opened with its first records; its times count from
  // the child's start. What was recorded since the fork (the child's start
  // drops its parent's blocks, which are not its own) is left out.
  t.t0 = io::mono_ns();
  t.arena_ids.clear();
  t.declarations_written = 0;
  for (ThreadBuf* b = t.bufs.load(std::memory_order_acquire); b; b = b->next)
    b->tail.store(b->head.load(std::memory_order_relaxed), std::memory_order_relaxed);
  t.open_pending = true;
  t.ended = false;
  t.pid = getpid();
  t.disabled = false;
}

}  // namespace gpupool::trace
