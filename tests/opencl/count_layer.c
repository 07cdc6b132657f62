/* A minimal ICD layer for the tests: placed after gpupool in OPENCL_LAYERS
   (OPENCL_LAYERS=libcount_layer.so:libgpupool.so; the first listed sits
   closest to the driver), it counts what really reaches the OpenCL
   implementation, so tests can assert what the pool saved. Test programs read
   the counters through count_layer_get() (dlopen RTLD_NOLOAD + dlsym). */
#define CL_TARGET_OPENCL_VERSION 300
#include <CL/cl_layer.h>
#include <stdatomic.h>
#include <string.h>

static const struct _cl_icd_dispatch* next;
static struct _cl_icd_dispatch table;

static atomic_long n_create, n_release, n_retain, n_sub, n_migrate, n_svm_alloc, n_svm_free;

static cl_mem CL_API_CALL create_buffer(cl_context c, cl_mem_flags f, size_t s, void* h,
                                        cl_int* e) {
  cl_mem m = next->clCreateBuffer(c, f, s, h, e);
  if (m) atomic_fetch_add(&n_create, 1);
  return m;
}
static cl_mem CL_API_CALL create_buffer_props(cl_context c, const cl_mem_properties* p,
                                              cl_mem_flags f, size_t s, void* h, cl_int* e) {
  cl_mem m = next->clCreateBufferWithProperties(c, p, f, s, h, e);
  if (m) atomic_fetch_add(&n_create, 1);
  return m;
}
static cl_int CL_API_CALL release_mem(cl_mem m) {
  atomic_fetch_add(&n_release, 1);
  return next->clReleaseMemObject(m);
}
static cl_int CL_API_CALL retain_mem(cl_mem m) {
  atomic_fetch_add(&n_retain, 1);
  return next->clRetainMemObject(m);
}
static cl_mem CL_API_CALL create_sub(cl_mem b, cl_mem_flags f, cl_buffer_create_type t,
                                     const void* i, cl_int* e) {
  cl_mem m = next->clCreateSubBuffer(b, f, t, i, e);
  if (m) atomic_fetch_add(&n_sub, 1);
  return m;
}
static cl_int CL_API_CALL migrate(cl_command_queue q, cl_uint n, const cl_mem* m,
                                  cl_mem_migration_flags f, cl_uint nw, const cl_event* w,
                                  cl_event* ev) {
  atomic_fetch_add(&n_migrate, 1);
  return next->clEnqueueMigrateMemObjects(q, n, m, f, nw, w, ev);
}

static void* CL_API_CALL svm_alloc(cl_context c, cl_svm_mem_flags f, size_t s, cl_uint a) {
  void* p = next->clSVMAlloc(c, f, s, a);
  if (p) atomic_fetch_add(&n_svm_alloc, 1);
  return p;
}
static void CL_API_CALL svm_free(cl_context c, void* p) {
  if (p) atomic_fetch_add(&n_svm_free, 1);
  next->clSVMFree(c, p);
}

__attribute__((visibility("default"))) long count_layer_get(const char* what) {
  if (!strcmp(what, "create")) return atomic_load(&n_create);
  if (!strcmp(what, "release")) return atomic_load(&n_release);
  if (!strcmp(what, "retain")) return atomic_load(&n_retain);
  if (!strcmp(what, "sub")) return atomic_load(&n_sub);
  if (!strcmp(what, "migrate")) return atomic_load(&n_migrate);
  if (!strcmp(what, "svm_alloc")) return atomic_load(&n_svm_alloc);
  if (!strcmp(what, "svm_free")) return atomic_load(&n_svm_free);
  return -1;
}

CL_API_ENTRY cl_int CL_API_CALL clGetLayerInfo(cl_layer_info name, size_t size, void* value,
                                               size_t* size_ret) {
  if (name != CL_LAYER_API_VERSION) return CL_INVALID_VALUE;
  if (size_ret) *size_ret = sizeof(cl_layer_api_version);
  if (value) {
    if (size < sizeof(cl_layer_api_version)) return CL_INVALID_VALUE;
    *(cl_layer_api_version*)value = CL_LAYER_API_VERSION_100;
  }
  return CL_SUCCESS;
}

CL_API_ENTRY cl_int CL_API_CALL clInitLayer(cl_uint num_entries,
                                            const struct _cl_icd_dispatch* target,
                                            cl_uint* num_entries_ret,
                                            const struct _cl_icd_dispatch** layer_dispatch_ret) {
  const cl_uint mine = sizeof(table) / sizeof(void*);
  const cl_uint n = num_entries < mine ? num_entries : mine;
  next = target;
  memcpy(&table, target, n * sizeof(void*));
  table.clCreateBuffer = create_buffer;
  if (n >
      (cl_uint)(offsetof(struct _cl_icd_dispatch, clCreateBufferWithProperties) / sizeof(void*)))
    table.clCreateBufferWithProperties = create_buffer_props;
  table.clReleaseMemObject = release_mem;
  table.clRetainMemObject = retain_mem;
  table.clCreateSubBuffer = create_sub;
  table.clEnqueueMigrateMemObjects = migrate;
  if (n > (cl_uint)(offsetof(struct _cl_icd_dispatch, clSVMFree) / sizeof(void*))) {
    table.clSVMAlloc = svm_alloc;
    table.clSVMFree = svm_free;
  }
  *num_entries_ret = n;
  *layer_dispatch_ret = &table;
  return CL_SUCCESS;
}
