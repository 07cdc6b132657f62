// The process's configuration: the environment parsed once
// (config/environment.cpp), its diagnostics logged once (log.cpp).
#include "sys/process_config.hpp"

#include <sys/auxv.h>

#include "core/no_destructor.hpp"
#include "sys/log.hpp"

extern char** environ;

namespace gpupool::config {

namespace detail {
struct Parsed {
  Config config;
  std::vector<Diagnostic> diagnostics;
};

// Parsed once; no logging here (log() builds its logger from this, then
// emits the diagnostics).
const Parsed& parsed() {
  static const NoDestructor<Parsed> p([] {  // hooks may run during exit
    Parsed r;
    r.config = load(environ, getauxval(AT_SECURE) != 0, &r.diagnostics);
    return r;
  }());
  return *p;
}

const Config& parsed_config() { return parsed().config; }
const std::vector<Diagnostic>& parsed_diagnostics() { return parsed().diagnostics; }
}  // namespace detail

const Config& get_unlogged() { return detail::parsed_config(); }

const Config& get() {
  const Config& c = detail::parsed_config();
  // Makes sure the diagnostics have been logged (once, by log()).
  (void)gpupool::log();
  return c;
}

}  // namespace gpupool::config
