// Runs config::get() and the logger the way the shim does, in a fresh
// process whose environment the test chooses, then prints NAME=value for
// every variable and AT_SECURE=<0|1>. Options:
//   --threads N   N threads race to call get() and log() first, each then
//                 logs "thread I" at warn and "debug I" at debug
//   --log-first   call log() before get()
//   --quick-exit  leave by _exit(0): in a setuid process LeakSanitizer
//                 cannot run its exit check (and ignores ASAN_OPTIONS)
#include <sys/auxv.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

#include "config/config.hpp"
#include "sys/log.hpp"

int main(int argc, char** argv) {
  int threads = 0;
  bool log_first = false, quick_exit = false;
  for (int i = 1; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--threads") && i + 1 < argc) threads = std::atoi(argv[++i]);
    else if (!std::strcmp(argv[i], "--log-first")) log_first = true;
    else if (!std::strcmp(argv[i], "--quick-exit")) quick_exit = true;
  }
  if (log_first) gpupool::log().warn("first");
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([t] {
      if (t % 2) (void)gpupool::config::get();
      gpupool::log().warn("thread {}", t);
      gpupool::log().debug("debug {}", t);
    });
  for (auto& t : pool) t.join();
  const gpupool::config::Config& c = gpupool::config::get();
  for (const auto& o : gpupool::config::options())
    std::printf("%s=%s\n", o.name, gpupool::config::value_text(c, o.name).c_str());
  std::printf("AT_SECURE=%lu\n", getauxval(AT_SECURE));
  if (quick_exit) {
    std::fflush(stdout);
    _exit(0);
  }
  return 0;
}
