// A backend for core tests: a device of fixed capacity shared by the arenas
// of one group, call counters, injectable errors, and fences driven by the
// test ("the device finished everything issued so far").
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <utility>
#include <vector>

#include "core/backend.hpp"

namespace gpupool::testing {

struct FakeDevice {
  std::size_t capacity = SIZE_MAX;
  std::size_t used = 0;
  std::uint64_t next_handle = 0x1000;
  std::map<Handle, std::size_t> live;  // handle -> bytes
  std::uint64_t allocs = 0, alloc_failures = 0, releases = 0, drops = 0;
  std::vector<Handle> release_log;  // handles released, in order
  int inject_error = 0;             // next allocate fails with this non-OOM error
  std::mutex mu;                    // for multi-threaded tests

  // Fences: fence() hands out increasing numbers; the device has finished
  // everything up to `completed`. whole_waits: a wait for one fence waits
  // for everything issued (a context synchronization, where no mark
  // follows the fence), as wait_all() does. stuck: waits return and the
  // device finishes nothing (a context with a sticky error).
  bool fences = false, whole_waits = false, stuck = false;
  std::uint64_t issued = 0, completed = 0, waits = 0;
  // When not 0: the device finishes everything issued while the pool asks
  // about a pending fence for the complete_on_ask'th time (its work ends
  // between two looks of the pool's).
  std::uint64_t complete_on_ask = 0, pending_asks = 0;

  // What a successful allocation and a wait take on the test's cost clock.
  std::uint64_t alloc_cost = 0, wait_cost = 0;

  // Another process holding memory on this device: Backend::relieve asks
  // it for bytes; it returns what it released (and lowers `used`).
  std::function<std::size_t(std::size_t)> neighbour;
  std::uint64_t relieve_calls = 0;
  std::size_t used_when_relieved = 0;  // `used` when relieve was last called

  // Called after each release, outside the device's lock: what the program
  // does meanwhile (frees another block while a release is under way).
  std::function<void()> after_release;

  // Ranges (Backend::granule): 0 cannot map. Mapped bytes count in `used`
  // against `capacity`, as allocations do.
  std::size_t granule = 0;
  std::map<Handle, std::size_t> ranges;  // reserved: base -> bytes
  std::set<Handle> mapped;               // granules mapped, by address
  // Each granule's mappings so far: memory mapped again is new memory.
  std::map<Handle, std::uint64_t> generation;
  std::uint64_t reserves = 0, maps = 0, unmaps = 0, unreserves = 0;
  std::uint64_t unmap_waits = 0;  // unmaps that waited for the device first
  bool fail_reserve = false;
  std::uint64_t map_cost = 0;
  // Bytes mapped in ranges now.
  std::size_t mapped_bytes() const { return mapped.size() * granule; }
};

// The pool's cost clock in core tests (PoolOptions::cost_clock): it moves
// only when a fake backend call takes time, so growth is deterministic.
inline std::atomic<std::uint64_t> g_cost_ns{0};
inline std::uint64_t fake_cost_clock() { return g_cost_ns.load(); }

class FakeBackend : public Backend {
 public:
  explicit FakeBackend(std::shared_ptr<FakeDevice> dev) : dev_(std::move(dev)) {}

  BackendResult allocate(std::size_t bytes, std::uint64_t) override {
    FakeDevice& d = *dev_;
    std::lock_guard lock(d.mu);
    if (d.inject_error) {
      int e = d.inject_error;
      d.inject_error = 0;
      ++d.alloc_failures;
      return {BackendStatus::error, 0, e};
    }
    if (bytes > d.capacity || d.used > d.capacity - bytes) {
      ++d.alloc_failures;
      return {BackendStatus::out_of_memory, 0, 2};
    }
    d.used += bytes;
    ++d.allocs;
    g_cost_ns += d.alloc_cost;
    Handle h = d.next_handle;
    // Addresses as a device's: an allocation's bytes are its own (pieces
    // of segments are handle + offset).
    d.next_handle += (bytes + 0xfff) / 0x1000 * 0x1000 + 0x1000;
    d.live[h] = bytes;
    return {BackendStatus::ok, h, 0, record_of(h)};
  }
  // Each allocation's record (BackendResult::data), which must come back
  // with its release or drop.
  static void* record_of(Handle h) { return reinterpret_cast<void*>(h ^ 0x5ec0'0000'0000'0000ull); }
  void release(Handle h, std::size_t bytes, void* data) override {
    FakeDevice& d = *dev_;
    std::unique_lock lock(d.mu);
    auto it = d.live.find(h);
    if (it == d.live.end()) throw std::logic_error("release of a handle not live");
    if (it->second != bytes) throw std::logic_error("release with the wrong size");
    if (data != record_of(h)) throw std::logic_error("release without the allocation's record");
    d.used -= bytes;
    d.live.erase(it);
    ++d.releases;
    d.release_log.push_back(h);
    lock.unlock();
    if (d.after_release) d.after_release();
  }
  // The device freed it already (a context torn down): only the record goes.
  void drop(Handle h, std::size_t, void* data) override {
    FakeDevice& d = *dev_;
    std::lock_guard lock(d.mu);
    if (data != record_of(h)) throw std::logic_error("drop without the allocation's record");
    ++d.drops;
  }
  std::uint64_t fence() override { return dev_->fences ? ++dev_->issued : 0; }
  bool passed(std::uint64_t f) override {
    if (f > dev_->completed && dev_->complete_on_ask &&
        ++dev_->pending_asks == dev_->complete_on_ask)
      dev_->completed = dev_->issued;
    return f <= dev_->completed;
  }
  bool relieve(std::size_t bytes) override {
    FakeDevice& d = *dev_;
    std::function<std::size_t(std::size_t)> n;
    {
      std::lock_guard lock(d.mu);
      ++d.relieve_calls;
      d.used_when_relieved = d.used;
      n = d.neighbour;
    }
    return n && n(bytes) > 0;
  }
  void wait_all() override {
    ++dev_->waits;
    if (dev_->stuck) return;
    dev_->completed = dev_->issued;
    g_cost_ns += dev_->wait_cost;
  }
  // The device's work up to `f` only is waited for (a mark's).
  void wait_for(std::uint64_t f) override {
    ++dev_->waits;
    if (dev_->stuck) return;
    dev_->completed = std::max(dev_->completed, dev_->whole_waits ? dev_->issued : f);
    g_cost_ns += dev_->wait_cost;
  }

  // Ranges: every granule mapped once, inside a reserved range, unmapped
  // only while mapped; a misuse throws, failing the test.
  std::size_t granule() override { return dev_->granule; }
  BackendResult reserve(std::size_t bytes) override {
    FakeDevice& d = *dev_;
    std::lock_guard lock(d.mu);
    if (d.fail_reserve || d.granule == 0) return {BackendStatus::out_of_memory, 0, 2};
    if (bytes % d.granule) throw std::logic_error("reserve of a part of a granule");
    // Apart from allocations' addresses, aligned to the granule.
    const Handle from = d.next_handle + (Handle{1} << 44);
    const Handle h = (from + d.granule - 1) / d.granule * d.granule;
    d.next_handle += bytes + d.granule;
    d.ranges[h] = bytes;
    ++d.reserves;
    return {BackendStatus::ok, h, 0, record_of(h)};
  }
  BackendResult map(Handle at, std::size_t bytes, void* range) override {
    FakeDevice& d = *dev_;
    std::lock_guard lock(d.mu);
    check_range(at, bytes, range);
    if (bytes > d.capacity || d.used > d.capacity - bytes) {
      ++d.alloc_failures;
      return {BackendStatus::out_of_memory, 0, 2};
    }
    for (Handle g = at; g < at + bytes; g += d.granule) {
      if (!d.mapped.insert(g).second) throw std::logic_error("map of a mapped granule");
      ++d.generation[g];
    }
    d.used += bytes;
    ++d.maps;
    g_cost_ns += d.map_cost;
    return {BackendStatus::ok, at, 0, range};
  }
  void unmap(Handle at, std::size_t bytes, void* range, std::uint64_t fence) override {
    FakeDevice& d = *dev_;
    std::lock_guard lock(d.mu);
    check_range(at, bytes, range);
    for (Handle g = at; g < at + bytes; g += d.granule)
      if (!d.mapped.erase(g)) throw std::logic_error("unmap of a granule not mapped");
    if (fence > d.completed) {  // the device may still use it: wait first
      ++d.unmap_waits;
      d.completed = std::max(d.completed, fence);
    }
    d.used -= bytes;
    ++d.unmaps;
  }
  void unreserve(Handle base, std::size_t bytes, void* range, bool drop) override {
    FakeDevice& d = *dev_;
    std::lock_guard lock(d.mu);
    auto it = d.ranges.find(base);
    if (it == d.ranges.end() || it->second != bytes || range != record_of(base))
      throw std::logic_error("unreserve of no reserved range");
    // What is still mapped goes with it (a dropped range's context freed it).
    for (auto g = d.mapped.lower_bound(base); g != d.mapped.end() && *g < base + bytes;) {
      g = d.mapped.erase(g);
      d.used -= d.granule;
    }
    d.ranges.erase(it);
    if (!drop) ++d.unreserves;
  }

 private:
  void check_range(Handle at, std::size_t bytes, void* range) {
    FakeDevice& d = *dev_;
    if (bytes == 0 || at % d.granule || bytes % d.granule)
      throw std::logic_error("map or unmap of a part of a granule");
    auto it = d.ranges.upper_bound(at);
    if (it == d.ranges.begin()) throw std::logic_error("map or unmap outside any range");
    --it;
    if (at + bytes > it->first + it->second || range != record_of(it->first))
      throw std::logic_error("map or unmap outside its range");
  }

  std::shared_ptr<FakeDevice> dev_;
};

// A FakeBackend that runs on_drop (once) at its next drop, before dropping:
// a test stops another thread's retire there, mid-emptying.
struct DroppingBackend : FakeBackend {
  using FakeBackend::FakeBackend;
  std::function<void()> on_drop;
  void drop(Handle h, std::size_t bytes, void* data) override {
    if (auto f = std::exchange(on_drop, nullptr)) f();
    FakeBackend::drop(h, bytes, data);
  }
};

}  // namespace gpupool::testing
