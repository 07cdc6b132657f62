/* A program that loads an extension with a private copy of the ICD loader,
   the way Python loads PyOpenCL's wheel (measured on the H100: such buffers
   went unpooled while preloaded exports forwarded to the system loader).
   Under gpupool its buffers must be pooled.
     cl_private_loader EXTENSION.so */
#include <dlfcn.h>

#include "cltest.h"

int main(int argc, char** argv) {
  REQUIRE(argc == 2, "usage: cl_private_loader EXTENSION.so");
  void* ext = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
  REQUIRE(ext, "dlopen %s: %s", argv[1], dlerror());
  cl_int (*churn)(int, size_t) = (cl_int(*)(int, size_t))dlsym(ext, "private_ext_churn");
  REQUIRE(churn, "private_ext_churn not found");
  const int rounds = 20;
  const cl_int err = churn(rounds, 4096);
  if (err == -1001) { /* CL_PLATFORM_NOT_FOUND_KHR */
    fprintf(stderr, "SKIP: no OpenCL platform\n");
    return 77;
  }
  printf("R private loader churn %d\n", err);
  CHECK_ERR(err, CL_SUCCESS);
  if (cltest_pooling()) {
    CHECK(cltest_stat("hits") >= rounds - 1, "hits %ld of %d buffers", cltest_stat("hits"), rounds);
    CHECK(cltest_stat("misses") == 1, "misses %ld", cltest_stat("misses"));
  }
  return cltest_finish("private_loader");
}
