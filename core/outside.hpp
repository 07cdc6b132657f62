// The cache over memory a backend keeps outside the pool (HeldOutside, a
// driver's memory pool): one item, all it holds, so that every release
// policy (out of memory, the cap, idleness, another process's request,
// free_held) gives it back the way it gives back held blocks.
#pragma once

#include <atomic>
#include <vector>

#include "core/backend.hpp"
#include "core/cache.hpp"

namespace gpupool::core_detail {

class OutsideCache final : public Cache {
 public:
  // `retired`: the arena's flag; a retired arena's memory is its driver's
  // (nothing is given back, and a context teardown's emptying ends).
  OutsideCache(HeldOutside& held, const std::atomic<bool>& retired)
      : held_(held), retired_(retired) {}

  void offer(Victims order, Offer& best) override {
    if (retired()) return;
    const std::size_t bytes = held_.held();
    const std::uint64_t t = held_.last_use_ns();
    if (bytes == 0 || !best.beaten_by(order, bytes, t)) return;
    best.cache = this;
    best.size = bytes;
    best.freed_at_ns = t;
  }
  Held take_offered(const Offer&) override { return take(); }
  Held take_any() override { return take(); }
  void take_freed_by(std::uint64_t freed_by_ns, std::vector<Held>& out) override {
    if (retired() || held_.last_use_ns() > freed_by_ns || held_.held() == 0) return;
    make_room(out, 1);
    if (const Held h = take(); h.size) out.push_back(h);
  }
  std::size_t releasable_bytes() const override { return retired() ? 0 : held_.held(); }
  // A retired arena's too: its figures are the backend's to give (a
  // driver's pool that is gone gives none; a count of what was made stays).
  void add_counters(Stats& s) const override { held_.add_counters(s); }
  void reset_peaks() override {
    if (!retired()) held_.reset_peaks();
  }

 private:
  bool retired() const { return retired_.load(std::memory_order_acquire); }
  Held take() {
    if (retired() || held_.held() == 0) return {};
    Held h;
    h.size = held_.give_back();
    h.outside = true;
    return h;
  }

  HeldOutside& held_;
  const std::atomic<bool>& retired_;
};

}  // namespace gpupool::core_detail
