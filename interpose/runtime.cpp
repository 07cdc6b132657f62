#include "interpose/runtime.hpp"

#include <cstdlib>
#include <mutex>

#include "config/log.hpp"
#include "interpose/control.hpp"

namespace gpupool {
namespace {

std::atomic<bool> g_exiting{false};
std::atomic<Runtime*> g_runtime{nullptr};

PoolOptions pool_options(const config::Config& c) {
  PoolOptions o;
  o.leading_bits = c.leading_bits;
  o.hold = c.hold;
  o.release_after_ns = c.release_after_ns;
  return o;
}

Runtime* create() {
  const config::Config& cfg = config::get();
  if (cfg.disable) return nullptr;
  // Never destroyed: hooks may still run from other threads or atexit
  // handlers while the process exits.
  auto* rt = new Runtime{cfg, Pool(pool_options(cfg))};
  std::atexit([] { g_exiting.store(true, std::memory_order_release); });
  pthread_atfork([] { if (auto* r = g_runtime.load()) r->pool.fork_prepare(); },
                 [] { if (auto* r = g_runtime.load()) r->pool.fork_parent(); },
                 [] { if (auto* r = g_runtime.load()) r->pool.fork_child(); });
  log().debug("runtime started: leading_bits={} hold={}", cfg.leading_bits, cfg.hold);
  return rt;
}

}  // namespace

Runtime* runtime() {
  Runtime* rt = g_runtime.load(std::memory_order_acquire);
  if (rt || g_exiting.load(std::memory_order_relaxed)) return rt;
  static std::once_flag once;
  std::call_once(once, [] {
    Runtime* created = create();
    g_runtime.store(created, std::memory_order_release);
    if (created) control::start(*created);
  });
  return g_runtime.load(std::memory_order_acquire);
}

bool exiting() { return g_exiting.load(std::memory_order_acquire); }

}  // namespace gpupool
