// A backend for core tests: a device of fixed capacity shared by the arenas
// of one group, call counters, injectable errors, and fences driven by the
// test ("the device finished everything issued so far").
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <memory>
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
  int inject_error = 0;  // next allocate fails with this non-OOM error
  std::mutex mu;         // for multi-threaded tests

  // Fences: fence() hands out increasing numbers; the device has finished
  // everything up to `completed`.
  bool fences = false;
  std::uint64_t issued = 0, completed = 0, waits = 0;

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
  bool passed(std::uint64_t f) override { return f <= dev_->completed; }
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
    dev_->completed = dev_->issued;
    g_cost_ns += dev_->wait_cost;
  }

 private:
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
