/* Pooled buffers keep OpenCL's semantics: reuse (counted at the driver),
   data integrity, COPY_HOST_PTR contents, info queries, errors, bounds,
   sub-buffers, destructor callbacks, properties. */
#include <unistd.h>

#include "cltest.h"

static cl_context ctx;
static cl_command_queue q;
static int pool;

static cl_mem mk(cl_mem_flags flags, size_t size, void* host) {
  cl_int err = 1;
  cl_mem m = clCreateBuffer(ctx, flags, size, host, &err);
  REQUIRE(m && err == CL_SUCCESS, "clCreateBuffer(%zu): %d", size, err);
  return m;
}

static void fill_pattern(unsigned char* p, size_t n, unsigned seed) {
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(i * 31u + seed * 7u + (i >> 8));
}

/* Many create/release cycles of a few sizes, each used and checked: the
   driver sees a handful of creates under gpupool, all of them without. */
static void test_reuse(void) {
  const size_t sizes[] = {1000, 4096, 100000};
  unsigned char src[100000], dst[100000];
  long c0 = cltest_count("create"), m0 = cltest_count("migrate");
  int calls = 0;
  for (int it = 0; it < 50; it++) {
    cl_mem a[3], b[3];
    for (int k = 0; k < 3; k++) {
      a[k] = mk(CL_MEM_READ_WRITE, sizes[k], NULL);
      b[k] = mk(CL_MEM_READ_WRITE, sizes[k], NULL);
      calls += 2;
      fill_pattern(src, sizes[k], it * 3 + k);
      CHECK_ERR(clEnqueueWriteBuffer(q, a[k], CL_TRUE, 0, sizes[k], src, 0, NULL, NULL),
                CL_SUCCESS);
      CHECK_ERR(clEnqueueCopyBuffer(q, a[k], b[k], 0, 0, sizes[k], 0, NULL, NULL), CL_SUCCESS);
      memset(dst, 0, sizes[k]);
      CHECK_ERR(clEnqueueReadBuffer(q, b[k], CL_TRUE, 0, sizes[k], dst, 0, NULL, NULL), CL_SUCCESS);
      CHECK(!memcmp(src, dst, sizes[k]), "data mismatch it %d size %zu", it, sizes[k]);
    }
    for (int k = 0; k < 3; k++) {
      CHECK_ERR(clReleaseMemObject(a[k]), CL_SUCCESS);
      CHECK_ERR(clReleaseMemObject(b[k]), CL_SUCCESS);
    }
    /* An observed clFinish tells gpupool the queue is done with them. */
    CHECK_ERR(clFinish(q), CL_SUCCESS);
  }
  long made = cltest_count("create") - c0;
  fprintf(stderr, "reuse: %d clCreateBuffer calls, %ld reached the driver\n", calls, made);
  if (made >= 0) {
    if (pool) CHECK(made <= 6, "expected at most 6 driver creates, got %ld", made);
    else CHECK(made == calls, "expected %d driver creates, got %ld", calls, made);
  }
  if (pool) CHECK(cltest_stat("hits") >= calls - 6, "hits %ld", cltest_stat("hits"));
  /* The availability probe: one migrate per fresh driver buffer, so that
     out-of-memory shows at create; none with GPUPOOL_PROBE=0. */
  long migrates = cltest_count("migrate") - m0;
  const char* probe = getenv("GPUPOOL_PROBE");
  if (made >= 0 && pool) {
    if (probe && !strcmp(probe, "0"))
      CHECK(migrates == 0, "%ld probes with GPUPOOL_PROBE=0", migrates);
    else CHECK(migrates == made, "%ld probes for %ld fresh buffers", migrates, made);
  }
  if (made >= 0 && !pool) CHECK(migrates == 0, "%ld migrates without gpupool", migrates);
  printf("R reuse ok\n");
}

static void test_copy_host_ptr(void) {
  unsigned char src[3000], dst[3000];
  for (int it = 0; it < 4; it++) {
    fill_pattern(src, sizeof src, 100 + it);
    cl_mem m = mk(CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, sizeof src, src);
    /* host_ptr may be reused as soon as create returns */
    memset(src, 0xEE, sizeof src);
    fill_pattern(src, sizeof src, 100 + it);
    memset(dst, 0, sizeof dst);
    CHECK_ERR(clEnqueueReadBuffer(q, m, CL_TRUE, 0, sizeof dst, dst, 0, NULL, NULL), CL_SUCCESS);
    CHECK(!memcmp(src, dst, sizeof src), "COPY_HOST_PTR contents, round %d", it);
    cl_mem_flags f = 0;
    CHECK_ERR(clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof f, &f, NULL), CL_SUCCESS);
    printf("R copy_host_ptr flags %#llx\n", (unsigned long long)f);
    void* hp = (void*)1;
    CHECK_ERR(clGetMemObjectInfo(m, CL_MEM_HOST_PTR, sizeof hp, &hp, NULL), CL_SUCCESS);
    printf("R copy_host_ptr host_ptr null %d\n", hp == NULL);
    clReleaseMemObject(m);
    clFinish(q);
  }
  /* Same flags with ALLOC_HOST_PTR, and a zero-filled source. */
  memset(src, 0, sizeof src);
  cl_mem m = mk(CL_MEM_READ_WRITE | CL_MEM_ALLOC_HOST_PTR | CL_MEM_COPY_HOST_PTR, sizeof src, src);
  memset(dst, 1, sizeof dst);
  clEnqueueReadBuffer(q, m, CL_TRUE, 0, sizeof dst, dst, 0, NULL, NULL);
  CHECK(!memcmp(src, dst, sizeof src), "ALLOC|COPY contents");
  clReleaseMemObject(m);
}

static void test_info(void) {
  cl_mem m = mk(CL_MEM_WRITE_ONLY, 1000, NULL);
  size_t size = 0, ret = 0;
  CHECK_ERR(clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof size, &size, &ret), CL_SUCCESS);
  CHECK(size == 1000 && ret == sizeof(size_t), "CL_MEM_SIZE %zu ret %zu", size, ret);
  printf("R info size %zu\n", size);
  cl_mem_flags f = 0;
  clGetMemObjectInfo(m, CL_MEM_FLAGS, sizeof f, &f, NULL);
  CHECK(f == CL_MEM_WRITE_ONLY, "CL_MEM_FLAGS %#llx", (unsigned long long)f);
  cl_uint rc = 0;
  clGetMemObjectInfo(m, CL_MEM_REFERENCE_COUNT, sizeof rc, &rc, NULL);
  printf("R info refcount %u\n", rc);
  CHECK(rc == 1, "refcount %u", rc);
  CHECK_ERR(clRetainMemObject(m), CL_SUCCESS);
  clGetMemObjectInfo(m, CL_MEM_REFERENCE_COUNT, sizeof rc, &rc, NULL);
  CHECK(rc == 2, "refcount after retain %u", rc);
  printf("R info refcount after retain %u\n", rc);
  CHECK_ERR(clReleaseMemObject(m), CL_SUCCESS);
  clGetMemObjectInfo(m, CL_MEM_REFERENCE_COUNT, sizeof rc, &rc, NULL);
  CHECK(rc == 1, "refcount after release %u", rc);
  /* Still usable after the release of the extra reference. */
  unsigned char buf[1000] = {0};
  CHECK_ERR(clEnqueueWriteBuffer(q, m, CL_TRUE, 0, 1000, buf, 0, NULL, NULL), CL_SUCCESS);
  cl_context c = NULL;
  clGetMemObjectInfo(m, CL_MEM_CONTEXT, sizeof c, &c, NULL);
  CHECK(c == ctx, "CL_MEM_CONTEXT");
  cl_mem_object_type t = 0;
  clGetMemObjectInfo(m, CL_MEM_TYPE, sizeof t, &t, NULL);
  printf("R info type %#x\n", t);
  /* Too small a destination: the implementation's error. */
  char small[2];
  CHECK_ERR(clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof small, small, NULL), CL_INVALID_VALUE);
  size_t psz = 99;
  CHECK_ERR(clGetMemObjectInfo(m, CL_MEM_PROPERTIES, 0, NULL, &psz), CL_SUCCESS);
  printf("R info properties size %zu\n", psz);
  CHECK_ERR(clReleaseMemObject(m), CL_SUCCESS);
}

static void test_errors(void) {
  cl_int err = 0;
  cl_ulong max = cltest_device_ulong(CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  cl_mem m = clCreateBuffer(ctx, 0, 0, NULL, &err);
  CHECK(!m, "size 0 created");
  CHECK_ERR(err, CL_INVALID_BUFFER_SIZE);
  printf("R error size0 %d\n", err);
  CHECK(!clCreateBuffer(ctx, 0, 0, NULL, NULL), "size 0 with NULL errcode_ret");
  m = clCreateBuffer(ctx, 0, (size_t)max + 1, NULL, &err);
  SPEC_CHECK(!m, "max+1 created");
  SPEC_CHECK_ERR(err, CL_INVALID_BUFFER_SIZE);
  printf("R error max+1 %d\n", err);
  if (m) clReleaseMemObject(m);
  /* Exactly the maximum is legal: rounding must not push it over. */
  m = clCreateBuffer(ctx, 0, (size_t)max, NULL, &err);
  CHECK(m && err == CL_SUCCESS, "max: %d", err);
  printf("R error max %d\n", err);
  if (m) {
    size_t s = 0;
    clGetMemObjectInfo(m, CL_MEM_SIZE, sizeof s, &s, NULL);
    CHECK(s == max, "max size %zu", s);
    clReleaseMemObject(m);
  }
  /* Just under the maximum: its bin's size would exceed it. */
  m = clCreateBuffer(ctx, 0, (size_t)max - 4096, NULL, &err);
  CHECK(m && err == CL_SUCCESS, "max-4096: %d", err);
  if (m) clReleaseMemObject(m);
  clFinish(q);
  {
    int (*fh)(void) = (int (*)(void))dlsym(RTLD_DEFAULT, "gpupool_free_held");
    if (fh) fh(); /* do not keep a GiB held for the rest of the tests */
  }
  char host[16];
  m = clCreateBuffer(NULL, 0, 16, NULL, &err);
  printf("R error null context %d\n", err);
  CHECK_ERR(err, CL_INVALID_CONTEXT);
  m = clCreateBuffer(ctx, 0, 16, host, &err);
  printf("R error host_ptr without flag %d\n", err);
  CHECK_ERR(err, CL_INVALID_HOST_PTR);
  m = clCreateBuffer(ctx, CL_MEM_COPY_HOST_PTR, 16, NULL, &err);
  printf("R error copy without host_ptr %d\n", err);
  CHECK_ERR(err, CL_INVALID_HOST_PTR);
  m = clCreateBuffer(ctx, CL_MEM_READ_ONLY | CL_MEM_WRITE_ONLY, 16, NULL, &err);
  printf("R error ro|wo %d\n", err);
  CHECK_ERR(err, CL_INVALID_VALUE);
  m = clCreateBuffer(ctx, CL_MEM_HOST_NO_ACCESS | CL_MEM_HOST_READ_ONLY, 16, NULL, &err);
  printf("R error host no|ro %d\n", err);
  CHECK(m == NULL && err == CL_INVALID_VALUE, "host no|ro: %d", err);
  /* A released pooled buffer is gone for the program. */
  m = mk(0, 64, NULL);
  clReleaseMemObject(m);
  clFinish(q);
}

/* Out-of-bounds accesses fail as they would on a buffer of the requested
   size, although the pooled block is larger. */
static void test_bounds(void) {
  cl_mem m = mk(CL_MEM_READ_WRITE, 1000, NULL);
  cl_mem o = mk(CL_MEM_READ_WRITE, 1000, NULL);
  unsigned char buf[2000] = {0};
  cl_int err;
  printf("R bounds read %d\n", clEnqueueReadBuffer(q, m, CL_TRUE, 0, 1001, buf, 0, NULL, NULL));
  printf("R bounds read off %d\n", clEnqueueReadBuffer(q, m, CL_TRUE, 999, 2, buf, 0, NULL, NULL));
  printf("R bounds read ok %d\n", clEnqueueReadBuffer(q, m, CL_TRUE, 999, 1, buf, 0, NULL, NULL));
  printf("R bounds write %d\n", clEnqueueWriteBuffer(q, m, CL_TRUE, 1, 1000, buf, 0, NULL, NULL));
  printf("R bounds copy %d\n", clEnqueueCopyBuffer(q, m, o, 0, 500, 600, 0, NULL, NULL));
  char pat = 1;
  printf("R bounds fill %d\n", clEnqueueFillBuffer(q, m, &pat, 1, 0, 1001, 0, NULL, NULL));
  void* p = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ, 0, 1024, 0, NULL, NULL, &err);
  printf("R bounds map %d %d\n", p != NULL, err);
  CHECK(!p && err == CL_INVALID_VALUE, "map past the end: %d", err);
  p = clEnqueueMapBuffer(q, m, CL_TRUE, CL_MAP_READ, 0, 1000, 0, NULL, NULL, &err);
  CHECK(p && err == CL_SUCCESS, "map: %d", err);
  if (p) clEnqueueUnmapMemObject(q, m, p, 0, NULL, NULL);
  CHECK_ERR(clEnqueueReadBuffer(q, m, CL_TRUE, 0, 1001, buf, 0, NULL, NULL), CL_INVALID_VALUE);
  CHECK_ERR(clEnqueueCopyBuffer(q, m, o, 0, 0, 1000, 0, NULL, NULL), CL_SUCCESS);
  clFinish(q);
  clReleaseMemObject(m);
  clReleaseMemObject(o);
}

static void test_sub_buffers(void) {
  cl_uint align_bits = 0;
  clGetDeviceInfo(cltest_device, CL_DEVICE_MEM_BASE_ADDR_ALIGN, sizeof align_bits, &align_bits,
                  NULL);
  size_t align = align_bits / 8 ? align_bits / 8 : 128;
  size_t size = 4 * align;
  cl_int err;
  cl_mem parent = mk(CL_MEM_READ_WRITE, size, NULL);
  cl_buffer_region bad = {0, size + 1};
  cl_mem s = clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &bad, &err);
  SPEC_CHECK(!s, "out-of-range sub-buffer created");
  SPEC_RESULT("sub out of range %d\n", err);
  SPEC_CHECK_ERR(err, CL_INVALID_VALUE);
  if (s) clReleaseMemObject(s);
  cl_buffer_region bad2 = {3 * align, align + 1};
  s = clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &bad2, &err);
  SPEC_RESULT("sub tail out of range %d\n", err);
  SPEC_CHECK_ERR(err, CL_INVALID_VALUE);
  if (s) clReleaseMemObject(s);
  cl_buffer_region reg = {align, 2 * align};
  s = clCreateSubBuffer(parent, 0, CL_BUFFER_CREATE_TYPE_REGION, &reg, &err);
  REQUIRE(s, "sub-buffer: %d", err);
  cl_mem assoc = NULL;
  clGetMemObjectInfo(s, CL_MEM_ASSOCIATED_MEMOBJECT, sizeof assoc, &assoc, NULL);
  CHECK(assoc == parent, "associated memobject");
  size_t off = 0, ssize = 0;
  clGetMemObjectInfo(s, CL_MEM_OFFSET, sizeof off, &off, NULL);
  clGetMemObjectInfo(s, CL_MEM_SIZE, sizeof ssize, &ssize, NULL);
  CHECK(off == align && ssize == 2 * align, "offset %zu size %zu", off, ssize);
  printf("R sub offset %zu size %zu\n", off / align, ssize / align);
  cl_uint rc = 0;
  clGetMemObjectInfo(s, CL_MEM_REFERENCE_COUNT, sizeof rc, &rc, NULL);
  CHECK(rc == 1, "sub refcount %u", rc);
  cl_mem_flags f = 0;
  clGetMemObjectInfo(s, CL_MEM_FLAGS, sizeof f, &f, NULL);
  printf("R sub flags %#llx\n", (unsigned long long)f);
  /* Data written through the sub-buffer shows in the parent. */
  unsigned char* data = malloc(size);
  unsigned char* back = malloc(size);
  fill_pattern(data, 2 * align, 9);
  CHECK_ERR(clEnqueueWriteBuffer(q, s, CL_TRUE, 0, 2 * align, data, 0, NULL, NULL), CL_SUCCESS);
  CHECK_ERR(clEnqueueReadBuffer(q, parent, CL_TRUE, align, 2 * align, back, 0, NULL, NULL),
            CL_SUCCESS);
  CHECK(!memcmp(data, back, 2 * align), "sub-buffer data in parent");

  /* The sub-buffer keeps its parent: after the parent's release a new buffer
     of the same size must not be the parent's block. */
  CHECK_ERR(clReleaseMemObject(parent), CL_SUCCESS);
  clFinish(q);
  cl_mem other = mk(CL_MEM_READ_WRITE, size, NULL);
  CHECK(other != parent, "parent handed out while its sub-buffer lives");
  fill_pattern(data, size, 77);
  clEnqueueWriteBuffer(q, other, CL_TRUE, 0, size, data, 0, NULL, NULL);
  fill_pattern(data, 2 * align, 9);
  memset(back, 0, size);
  CHECK_ERR(clEnqueueReadBuffer(q, s, CL_TRUE, 0, 2 * align, back, 0, NULL, NULL), CL_SUCCESS);
  CHECK(!memcmp(data, back, 2 * align), "sub-buffer data after parent release");
  CHECK_ERR(clReleaseMemObject(s), CL_SUCCESS);
  clFinish(q);
  /* Now the parent's block is free again: under gpupool it is reused. */
  long c0 = cltest_count("create");
  cl_mem again = mk(CL_MEM_READ_WRITE, size, NULL);
  if (pool) {
    CHECK(again == parent, "parent's block not reused after its sub-buffer died");
    if (c0 >= 0) CHECK(cltest_count("create") == c0, "driver create for a held size");
  }
  clReleaseMemObject(again);
  clReleaseMemObject(other);
  free(data);
  free(back);
}

static int order[8], norder;
static cl_mem cb_mem;
static void CL_CALLBACK dtor(cl_mem m, void* ud) {
  if (m != cb_mem) order[norder++] = -1;
  order[norder++] = (int)(long)ud;
  /* A destructor callback may call OpenCL (not on its own object). */
  if ((long)ud == 1) {
    cl_int err;
    cl_mem t = clCreateBuffer(ctx, 0, 128, NULL, &err);
    if (t) clReleaseMemObject(t);
    else order[norder++] = -2;
  }
}

static void test_destructor_callbacks(void) {
  cb_mem = mk(0, 5000, NULL);
  CHECK_ERR(clSetMemObjectDestructorCallback(cb_mem, NULL, NULL), CL_INVALID_VALUE);
  for (long i = 1; i <= 3; i++)
    CHECK_ERR(clSetMemObjectDestructorCallback(cb_mem, dtor, (void*)i), CL_SUCCESS);
  clRetainMemObject(cb_mem);
  clReleaseMemObject(cb_mem);
  CHECK(norder == 0, "callbacks fired before the last release");
  clReleaseMemObject(cb_mem);
  clFinish(q);
  /* NVIDIA fires destructor callbacks from its own thread, some time after
     the last release (measured: none yet right after clFinish). */
  for (int i = 0; i < 200 && __atomic_load_n(&norder, __ATOMIC_ACQUIRE) < 3; i++) usleep(10000);
  printf("R destructor order");
  for (int i = 0; i < norder; i++) printf(" %d", order[i]);
  printf("\n");
  CHECK(norder == 3 && order[0] == 3 && order[1] == 2 && order[2] == 1, "order");
}

static void test_properties(void) {
  cl_int err;
  cl_mem_properties props[] = {0};
  for (int it = 0; it < 3; it++) {
    cl_mem m = clCreateBufferWithProperties(ctx, props, CL_MEM_READ_WRITE, 2000, NULL, &err);
    REQUIRE(m, "clCreateBufferWithProperties: %d", err);
    size_t n = 99;
    clGetMemObjectInfo(m, CL_MEM_PROPERTIES, 0, NULL, &n);
    printf("R props size %zu\n", n);
    cl_mem m2 = clCreateBufferWithProperties(ctx, NULL, CL_MEM_READ_WRITE, 2000, NULL, &err);
    REQUIRE(m2, "clCreateBufferWithProperties NULL: %d", err);
    clGetMemObjectInfo(m2, CL_MEM_PROPERTIES, 0, NULL, &n);
    printf("R props null size %zu\n", n);
    unsigned char d[2000], b[2000];
    fill_pattern(d, 2000, it);
    clEnqueueWriteBuffer(q, m, CL_TRUE, 0, 2000, d, 0, NULL, NULL);
    clEnqueueCopyBuffer(q, m, m2, 0, 0, 2000, 0, NULL, NULL);
    clEnqueueReadBuffer(q, m2, CL_TRUE, 0, 2000, b, 0, NULL, NULL);
    CHECK(!memcmp(d, b, 2000), "props data");
    clReleaseMemObject(m);
    clReleaseMemObject(m2);
    clFinish(q);
  }
  cl_mem m = clCreateBufferWithProperties(ctx, props, 0, 0, NULL, &err);
  CHECK(!m, "props size 0");
  printf("R props size0 %d\n", err);
}

int main(void) {
  cltest_pick_device();
  pool = cltest_pooling();
  ctx = cltest_context();
  q = cltest_queue(ctx);
  test_reuse();
  test_copy_host_ptr();
  test_info();
  test_errors();
  test_bounds();
  test_sub_buffers();
  test_destructor_callbacks();
  test_properties();
  clReleaseCommandQueue(q);
  clReleaseContext(ctx);
  return cltest_finish("buffers");
}
