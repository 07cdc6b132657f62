// How gpupool gets into OpenCL programs besides its exports (hooks.cpp): the
// ICD layer entry points, the resolution of the real functions (next()), and
// the OPENCL_LAYERS answer that brings the layer into a preloaded process.
#include <dlfcn.h>
#include <sys/auxv.h>

#include <CL/cl_layer.h>

#include <atomic>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>

#include <strings.h>
#include <unistd.h>

#include "config/config.hpp"
#include "interpose/opencl/api.hpp"
#include "interpose/runtime.hpp"
#include "sys/log.hpp"

namespace gpupool::ocl {
namespace {

Api g_loader;
std::once_flag g_loader_once;

Api g_target;                             // the layer's next dispatch, as an Api
std::atomic<const Api*> g_next{nullptr};  // &g_target once the layer is initialised
std::atomic<bool> g_deinit{false};

// The loader's own exports: next() until a loader initialises the layer.
void resolve_loader() {
  void* h = RTLD_NEXT;
  // A Python extension loads the loader RTLD_LOCAL: RTLD_NEXT does not see
  // it, and every entry would be null. Open it by name.
  if (!dlsym(RTLD_NEXT, "clGetPlatformIDs")) {
    h = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!h) h = dlopen("libOpenCL.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      log().error("OpenCL: no libOpenCL.so.1 found; OpenCL calls will fail");
      return;
    }
  }
#define GPUPOOL_CL_RESOLVE(name) \
  g_loader.name = reinterpret_cast<decltype(g_loader.name)>(dlsym(h, #name));
  GPUPOOL_CL_HOOKED(GPUPOOL_CL_RESOLVE)
  GPUPOOL_CL_USED(GPUPOOL_CL_RESOLVE)
#undef GPUPOOL_CL_RESOLVE
  Dl_info info;
  if (g_loader.clCreateBuffer && dladdr(reinterpret_cast<void*>(g_loader.clCreateBuffer), &info) &&
      info.dli_fname)
    log().debug("OpenCL: real functions from {}", info.dli_fname);
}

// next() runs several times per pooled call, and with a loader that does not
// initialise layers (the CUDA toolkit's) every time through here: once
// resolved, one acquire load (std::call_once would cost a pthread_once call
// and two TLS writes each time).
std::atomic<bool> g_loader_ready{false};

const Api& loader() {
  if (!g_loader_ready.load(std::memory_order_acquire)) {
    std::call_once(g_loader_once, resolve_loader);
    g_loader_ready.store(true, std::memory_order_release);
  }
  return g_loader;
}

// The pid of the process in which OpenCL first reached gpupool; 0 before.
// Kept across fork(), new at exec.
std::atomic<pid_t> g_first_use{0};

void note_use() {
  pid_t none = 0;
  g_first_use.compare_exchange_strong(none, getpid(), std::memory_order_relaxed);
}

}  // namespace

const Api& next() {
  if (g_first_use.load(std::memory_order_relaxed) == 0) [[unlikely]]
    note_use();
  const Api* p = g_next.load(std::memory_order_acquire);
  return p ? *p : loader();
}

bool implementation_inherited() {
  const pid_t first = g_first_use.load(std::memory_order_relaxed);
  return first != 0 && first != getpid();
}

}  // namespace gpupool::ocl

using namespace gpupool::ocl;

// ---------------------------------------------------------------------------
// ICD layer entry points (cl_loader_layers). ocl-icd 2.3.x calls
// clGetLayerInfo + clInitLayer; the newest Khronos loader only
// clInitLayerWithProperties (+ clDeinitLayer).

namespace {

using cl_layer_props = cl_ulong;  // cl_layer_properties in newer headers

cl_int init_layer(cl_uint num_entries, const cl_icd_dispatch* target, cl_uint* num_entries_ret,
                  const cl_icd_dispatch** layer_dispatch_ret) {
  if (!target || !num_entries_ret || !layer_dispatch_ret) return CL_INVALID_VALUE;
  // The loader initialises its implementations with its layers: OpenCL is
  // in use in this process, whether or not any call reaches a hook here.
  note_use();
  static gpupool::Ranked<gpupool::LockRank::opencl_layer> mu;
  static int inits = 0;
  gpupool::LockGuard lock(mu);
  constexpr cl_uint mine = sizeof(cl_icd_dispatch) / sizeof(void*);
  const cl_uint use = num_entries < mine ? num_entries : mine;
  // One per loader, never freed: the loader keeps the pointer for the life
  // of the process (kept reachable here, too, for leak checkers).
  static cl_icd_dispatch tables[4];
  if (inits >= 4) return CL_INVALID_OPERATION;  // four loaders in one process: not supported
  cl_icd_dispatch* table = &tables[inits];
  std::memcpy(static_cast<void*>(table), target, use * sizeof(void*));
  // Without a configuration (out of memory reading it), a pass-through table.
  const gpupool::config::Config* cfg = nullptr;
  try {
    cfg = &gpupool::config::get();
  } catch (...) {
    gpupool::internal_failure("clInitLayer");
  }
  // A second loader in the process (a bundled one) gets a plain pass-through
  // table: one set of hooks, one next table.
  if (inits++ == 0 && cfg && !cfg->disable && cfg->opencl) {
#define GPUPOOL_CL_FROM_TARGET(name)                         \
  if (offsetof(cl_icd_dispatch, name) / sizeof(void*) < use) \
    g_target.name = reinterpret_cast<decltype(g_target.name)>(target->name);
    GPUPOOL_CL_HOOKED(GPUPOOL_CL_FROM_TARGET)
    GPUPOOL_CL_USED(GPUPOOL_CL_FROM_TARGET)
#undef GPUPOOL_CL_FROM_TARGET
#define GPUPOOL_CL_INSTALL(name)                                             \
  if (offsetof(cl_icd_dispatch, name) / sizeof(void*) < use && target->name) \
    table->name = reinterpret_cast<decltype(table->name)>(&gpupool_hook_##name);
    GPUPOOL_CL_HOOKED(GPUPOOL_CL_INSTALL)
#undef GPUPOOL_CL_INSTALL
    g_next.store(&g_target, std::memory_order_release);
    try {
      gpupool::log().debug("OpenCL: initialised as an ICD layer ({} entries)", use);
    } catch (...) {
    }
  }
  *num_entries_ret = use;
  *layer_dispatch_ret = table;
  return CL_SUCCESS;
}

}  // namespace

GPUPOOL_EXPORT cl_int CL_API_CALL clGetLayerInfo(cl_layer_info param_name, size_t param_value_size,
                                                 void* param_value, size_t* param_value_size_ret) {
  const void* src = nullptr;
  size_t n = 0;
  static const cl_layer_api_version version = CL_LAYER_API_VERSION_100;
  static const char name[] = "gpupool";
  switch (param_name) {
    case CL_LAYER_API_VERSION:
      src = &version, n = sizeof version;
      break;
    case CL_LAYER_NAME:
      src = name, n = sizeof name;
      break;
    default:
      return CL_INVALID_VALUE;
  }
  if (param_value) {
    if (param_value_size < n) return CL_INVALID_VALUE;
    std::memcpy(param_value, src, n);
  }
  if (param_value_size_ret) *param_value_size_ret = n;
  return CL_SUCCESS;
}

GPUPOOL_EXPORT cl_int CL_API_CALL clInitLayer(cl_uint num_entries,
                                              const cl_icd_dispatch* target_dispatch,
                                              cl_uint* num_entries_ret,
                                              const cl_icd_dispatch** layer_dispatch_ret) {
  return init_layer(num_entries, target_dispatch, num_entries_ret, layer_dispatch_ret);
}

GPUPOOL_EXPORT cl_int CL_API_CALL clInitLayerWithProperties(
    cl_uint num_entries, const cl_icd_dispatch* target_dispatch, cl_uint* num_entries_ret,
    const cl_icd_dispatch** layer_dispatch_ret, const cl_layer_props* /*properties*/) {
  return init_layer(num_entries, target_dispatch, num_entries_ret, layer_dispatch_ret);
}

// The loader is shutting down: from now on the hooks make no OpenCL call of
// their own (cl_gone(), contexts.hpp).
GPUPOOL_EXPORT cl_int CL_API_CALL clDeinitLayer(void) {
  g_deinit.store(true, std::memory_order_release);
  return CL_SUCCESS;
}

namespace gpupool::ocl {
bool loader_gone() { return g_deinit.load(std::memory_order_acquire); }
}  // namespace gpupool::ocl

// ---------------------------------------------------------------------------
// Plain LD_PRELOAD also activates the layer path: the OpenCL loader reads
// OPENCL_LAYERS (ocl-icd lazily, at the first OpenCL call) and finds this
// library there, so programs that dlopen libOpenCL or load it RTLD_LOCAL are
// pooled too. The variable is never set: gpupool answers the loader's
// getenv("OPENCL_LAYERS") with this library added, and the environment
// stays the program's own. So a child the program starts without gpupool
// in LD_PRELOAD runs without gpupool, and the program never sees a variable
// it did not set. Only when preloaded (a layer-loaded copy is in the list
// already), never in secure-execution processes, and not when
// GPUPOOL_DISABLE / GPUPOOL_OPENCL / GPUPOOL_OPENCL_LAYER say no.

namespace {

// The configuration's reading of a boolean variable (unset or unreadable:
// false, as the variable's own default would say here).
bool env_is(const char* v, bool value) {
  bool parsed = false;
  return v && gpupool::config::parse_bool(v, &parsed) && parsed == value;
}

bool list_has(const char* list, const std::string& item) {
  std::string s(list);
  std::size_t pos = 0;
  while (pos <= s.size()) {
    std::size_t end = s.find(':', pos);
    if (end == std::string::npos) end = s.size();
    if (s.compare(pos, end - pos, item) == 0) return true;
    pos = end + 1;
  }
  return false;
}

// The C library's getenv, without calling it (it is the one we replace).
char* environ_value(const char* name) {
  if (!name || !environ) return nullptr;
  const std::size_t n = std::strlen(name);
  if (n == 0 || std::strchr(name, '=')) return nullptr;
  for (char** e = environ; *e; ++e)
    if (!std::strncmp(*e, name, n) && (*e)[n] == '=') return *e + n + 1;
  return nullptr;
}

// getenv's own argument is declared nonnull; a NULL from a program is
// still answered with NULL (environ_value), never dereferenced.
bool is_layers_variable(const char* name) {
  return name && name[0] == 'O' && !std::strcmp(name, "OPENCL_LAYERS");
}

// Whether the loader should see this library in OPENCL_LAYERS (decided at
// load), and its path (found at the loader's first question, not at load:
// every process pays for what runs at load).
bool g_offer_layer = false;
std::atomic<const char*> g_layer_self{nullptr};

const char* layer_self() {
  if (const char* s = g_layer_self.load(std::memory_order_acquire)) return s;
  Dl_info info;
  if (!dladdr(reinterpret_cast<void*>(&layer_self), &info) || !info.dli_fname) return nullptr;
  char* real = realpath(info.dli_fname, nullptr);
  if (!real) return nullptr;
  const char* expected = nullptr;
  if (!g_layer_self.compare_exchange_strong(expected, real)) {
    std::free(real);
    return expected;
  }
  return real;  // kept for the life of the process
}

// The answer for one value of OPENCL_LAYERS in the environment (compared
// by address; a new one after setenv() gets a new answer). Never freed:
// the caller keeps the pointer.
struct LayersAnswer {
  const char* environment_value;
  const char* answer;
};
std::atomic<const LayersAnswer*> g_layers_answer{nullptr};

const char* layers_answer(const char* cur) {
  const LayersAnswer* a = g_layers_answer.load(std::memory_order_acquire);
  if (a && a->environment_value == cur) return a->answer;
  const char* self = layer_self();
  if (!self) return cur;
  std::string v = self;
  if (cur && *cur) {
    if (list_has(cur, self)) return cur;
    v = std::string(cur) + ":" + self;
  }
  auto* fresh = new LayersAnswer{cur, strdup(v.c_str())};
  g_layers_answer.store(fresh, std::memory_order_release);
  return fresh->answer;
}

__attribute__((constructor)) void offer_opencl_layer() {
  if (getauxval(AT_SECURE)) return;
  const char* preload = environ_value("LD_PRELOAD");
  if (!preload || !std::strstr(preload, "gpupool")) return;
  if (env_is(environ_value("GPUPOOL_DISABLE"), true) ||
      env_is(environ_value("GPUPOOL_OPENCL"), false) ||
      env_is(environ_value("GPUPOOL_OPENCL_LAYER"), false))
    return;
  g_offer_layer = true;
}

}  // namespace

GPUPOOL_EXPORT char* getenv(const char* name) {
  char* v = environ_value(name);
  if (g_offer_layer && is_layers_variable(name)) {
    try {
      return const_cast<char*>(layers_answer(v));
    } catch (...) {
      gpupool::internal_failure("getenv(\"OPENCL_LAYERS\")");  // the environment's own value
    }
  }
  return v;
}

GPUPOOL_EXPORT char* secure_getenv(const char* name) {
  if (getauxval(AT_SECURE)) return nullptr;
  return getenv(name);
}
