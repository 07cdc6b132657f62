/* Shared helpers for the OpenCL test programs. The programs are unmodified
   OpenCL clients: they run with or without gpupool (LD_PRELOAD) and decide
   what to expect from whether gpupool is active in the process. Results that
   must not depend on gpupool go to stdout as "R ..." lines (compare.sh diffs
   them between a plain run and a run under the shim); diagnostics and the
   PASS/FAIL verdict go to stderr. Exit status: 0 pass, 1 fail, 77 skip. */
#ifndef CLTEST_H
#define CLTEST_H

#define CL_TARGET_OPENCL_VERSION 300
#define CL_USE_DEPRECATED_OPENCL_1_2_APIS
#include <CL/cl.h>
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int cltest_failures;

#define CHECK(cond, ...)                                              \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
      cltest_failures++;                                              \
    }                                                                 \
  } while (0)

#define CHECK_ERR(e, want) CHECK((e) == (want), "error %d, expected %d", (int)(e), (int)(want))

/* Fatal: nothing sensible can follow. */
#define REQUIRE(cond, ...)                                            \
  do {                                                                \
    if (!(cond)) {                                                    \
      fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond); \
      fprintf(stderr, __VA_ARGS__);                                   \
      fprintf(stderr, "\n");                                          \
      exit(1);                                                        \
    }                                                                 \
  } while (0)

static cl_platform_id cltest_platform;
static cl_device_id cltest_device;

/* The first platform with a device, or the one whose name contains
   $CLTEST_PLATFORM. Exits 77 (skip) when there is none. */
static inline void cltest_pick_device(void) {
  cl_platform_id ps[16];
  cl_uint np = 0;
  if (clGetPlatformIDs(16, ps, &np) != CL_SUCCESS || np == 0) {
    fprintf(stderr, "SKIP: no OpenCL platform\n");
    exit(77);
  }
  const char* want = getenv("CLTEST_PLATFORM");
  for (cl_uint i = 0; i < np && i < 16; i++) {
    char name[256] = "";
    clGetPlatformInfo(ps[i], CL_PLATFORM_NAME, sizeof name, name, NULL);
    if (want && *want && !strstr(name, want)) continue;
    cl_device_id d;
    cl_uint nd = 0;
    if (clGetDeviceIDs(ps[i], CL_DEVICE_TYPE_ALL, 1, &d, &nd) == CL_SUCCESS && nd) {
      cltest_platform = ps[i];
      cltest_device = d;
      return;
    }
  }
  fprintf(stderr, "SKIP: no OpenCL device\n");
  exit(77);
}

static inline cl_context cltest_context(void) {
  cl_int err;
  cl_context c = clCreateContext(NULL, 1, &cltest_device, NULL, NULL, &err);
  REQUIRE(c, "clCreateContext: %d", err);
  return c;
}

static inline cl_command_queue cltest_queue(cl_context c) {
  cl_int err;
  cl_command_queue q = clCreateCommandQueue(c, cltest_device, 0, &err);
  REQUIRE(q, "clCreateCommandQueue: %d", err);
  return q;
}

static inline cl_ulong cltest_device_ulong(cl_device_info what) {
  cl_ulong v = 0;
  clGetDeviceInfo(cltest_device, what, sizeof v, &v, NULL);
  return v;
}

/* Spec rules that some implementations do not follow (measured on NVIDIA's
   OpenCL, driver 580: buffers over CL_DEVICE_MAX_MEM_ALLOC_SIZE and
   sub-buffers past their parent's end are created). SPEC_CHECK enforces them
   on PoCL, which follows them; elsewhere the "R" lines beside them, which
   compare.sh holds equal with and without gpupool, are what counts. */
static inline int cltest_spec_platform(void) {
  char name[256] = "";
  clGetPlatformInfo(cltest_platform, CL_PLATFORM_NAME, sizeof name, name, NULL);
  return strstr(name, "Portable Computing Language") != NULL;
}
#define SPEC_CHECK(cond, ...)                             \
  do {                                                    \
    if (cltest_spec_platform()) CHECK(cond, __VA_ARGS__); \
  } while (0)
#define SPEC_CHECK_ERR(e, want) \
  SPEC_CHECK((e) == (want), "error %d, expected %d", (int)(e), (int)(want))
/* The result of such a rule: an "R" line where the platform follows the
   spec, an "N" line (not compared) elsewhere, where gpupool still answers as
   the spec says: it knows the size the program asked for, which the driver,
   holding a larger pooled buffer, does not. */
#define SPEC_RESULT(...)                                 \
  do {                                                   \
    fputs(cltest_spec_platform() ? "R " : "N ", stdout); \
    printf(__VA_ARGS__);                                 \
  } while (0)
/* Is gpupool pooling OpenCL buffers in this process? */
static inline int cltest_pooling(void) {
  int (*active)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gpupool_active");
  if (!active || !active()) return 0;
  const char* v = getenv("GPUPOOL_OPENCL");
  return !(v && (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off")));
}

/* Counters of the test ICD layer (count_layer.c), placed between gpupool and
   the driver: what the implementation was really asked for. -1 when the
   layer is not loaded; when $COUNT_LAYER names it, it must be. */
static inline long cltest_count(const char* what) {
  static long (*get)(const char*);
  static int looked;
  if (!looked) {
    looked = 1;
    const char* path = getenv("COUNT_LAYER");
    if (path && *path) {
      void* h = dlopen(path, RTLD_NOW | RTLD_NOLOAD);
      REQUIRE(h, "COUNT_LAYER=%s is not loaded (is it in OPENCL_LAYERS?)", path);
      get = (long (*)(const char*))dlsym(h, "count_layer_get");
    }
  }
  return get ? get(what) : -1;
}

static inline long cltest_stat(const char* key) {
  /* A total from gpupool's JSON stats ("key": N, first occurrence). */
  size_t (*json)(char*, size_t) =
      (size_t(*)(char*, size_t))dlsym(RTLD_DEFAULT, "gpupool_stats_json");
  if (!json) return -1;
  static char buf[1 << 16];
  json(buf, sizeof buf);
  char pat[64];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char* p = strstr(buf, pat);
  return p ? strtol(p + strlen(pat), NULL, 10) : -1;
}

static inline int cltest_finish(const char* name) {
  if (cltest_failures) {
    fprintf(stderr, "FAIL %s: %d check(s) failed\n", name, cltest_failures);
    return 1;
  }
  fprintf(stderr, "PASS %s (gpupool %s)\n", name, cltest_pooling() ? "pooling" : "not pooling");
  return 0;
}

#endif
