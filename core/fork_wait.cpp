#include "core/fork_wait.hpp"

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

namespace gpupool::fork_wait {

namespace {

struct Step {
  Undo undo;
  void* arg;
};

// The forking thread's prepare. Its journal is made at its first fork and
// kept (capacity included) for its next, never destroyed: a fork may come
// while the thread or the process exits.
struct Prepare {
  std::vector<Step>* steps = nullptr;
  std::uint64_t deadline_ns = UINT64_MAX;  // outside a begin and end: no bound
  bool gave_up = false;
};
constinit thread_local Prepare t_prepare;

std::atomic<unsigned> g_holders_forking{0};
// The last prepare gave up past its bound, and none has completed since.
std::atomic<bool> g_stuck{false};

std::uint64_t now_ns() {
  return static_cast<std::uint64_t>(std::chrono::duration_cast<std::chrono::nanoseconds>(
                                        std::chrono::steady_clock::now().time_since_epoch())
                                        .count());
}

}  // namespace

void begin(std::uint64_t bound_ns) {
  if (t_prepare.steps) t_prepare.steps->clear();
  t_prepare.gave_up = false;
  if (g_stuck.load(std::memory_order_relaxed)) bound_ns = std::min(bound_ns, kBoundAfterGiveUpNs);
  const std::uint64_t now = now_ns();
  t_prepare.deadline_ns = bound_ns > UINT64_MAX - now ? UINT64_MAX : now + bound_ns;
}

bool end() {
  const bool gave = t_prepare.gave_up;
  if (!gave) g_stuck.store(false, std::memory_order_relaxed);
  if (std::vector<Step>* s = t_prepare.steps) {
    if (gave)
      for (auto i = s->rbegin(); i != s->rend(); ++i) i->undo(i->arg);
    s->clear();
  }
  t_prepare.gave_up = false;
  t_prepare.deadline_ns = UINT64_MAX;
  return gave;
}

bool gave_up() { return t_prepare.gave_up; }

void give_up() { t_prepare.gave_up = true; }

bool keep_waiting(unsigned turn) {
  if (t_prepare.gave_up) return false;
  if (g_holders_forking.load(std::memory_order_acquire) != 0) {
    t_prepare.gave_up = true;
    return false;
  }
  if (now_ns() >= t_prepare.deadline_ns) {
    t_prepare.gave_up = true;
    g_stuck.store(true, std::memory_order_relaxed);
    return false;
  }
  if (turn < 64) return true;  // a holder about to let go: spin
  if (turn < 128) {
    std::this_thread::yield();
    return true;
  }
  // A long hold (a driver call, a dump): no more than a millisecond late.
  std::this_thread::sleep_for(std::chrono::microseconds(turn < 138 ? 1 << (turn - 128) : 1000));
  return true;
}

void journal(Undo undo, void* arg) noexcept {
  try {
    if (!t_prepare.steps) t_prepare.steps = new std::vector<Step>;
    t_prepare.steps->push_back({undo, arg});
  } catch (...) {
    undo(arg);
    t_prepare.gave_up = true;
  }
}

void holder_forking_begin() { g_holders_forking.fetch_add(1, std::memory_order_acq_rel); }
void holder_forking_end() { g_holders_forking.fetch_sub(1, std::memory_order_acq_rel); }
void forget_holders_in_child() { g_holders_forking.store(0, std::memory_order_relaxed); }

}  // namespace gpupool::fork_wait
