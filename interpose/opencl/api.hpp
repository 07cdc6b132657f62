// OpenCL interposition: the table of real entry points and the hooks.
//
// gpupool reaches OpenCL programs two ways, and each call through one only:
//  - as an ICD layer (OPENCL_LAYERS; clInitLayer*): the loader hands us the
//    next dispatch table and routes every call of every loading pattern
//    (linked, dlopen+dlsym, Python's RTLD_LOCAL extensions) through our table;
//  - as preloaded exports (clCreateBuffer...): a call that bound to one never
//    passed through a loader, so it runs the hook itself.
// Either way the hooks call the "next" table: the dispatch of the loader that
// initialised the layer, or, before any did, the loader's exports found by
// name. (Forwarding exports to a loader found by name missed the pool when
// the program's loader was a private copy, as in PyOpenCL's wheels.)
#pragma once

#include <CL/cl.h>

#include <type_traits>

namespace gpupool::ocl {

// Functions gpupool intercepts (X) and only calls (Y).
#define GPUPOOL_CL_HOOKED(X)            \
  X(clGetPlatformIDs)                   \
  X(clGetDeviceIDs)                     \
  X(clCreateContext)                    \
  X(clCreateContextFromType)            \
  X(clRetainContext)                    \
  X(clReleaseContext)                   \
  X(clCreateCommandQueue)               \
  X(clCreateCommandQueueWithProperties) \
  X(clRetainCommandQueue)               \
  X(clReleaseCommandQueue)              \
  X(clFinish)                           \
  X(clCreateBuffer)                     \
  X(clCreateBufferWithProperties)       \
  X(clRetainMemObject)                  \
  X(clReleaseMemObject)                 \
  X(clGetMemObjectInfo)                 \
  X(clCreateSubBuffer)                  \
  X(clSetMemObjectDestructorCallback)   \
  X(clEnqueueReadBuffer)                \
  X(clEnqueueWriteBuffer)               \
  X(clEnqueueCopyBuffer)                \
  X(clEnqueueFillBuffer)                \
  X(clEnqueueMapBuffer)                 \
  X(clSVMAlloc)                         \
  X(clSVMFree)                          \
  X(clEnqueueSVMFree)

#define GPUPOOL_CL_USED(Y)        \
  Y(clGetContextInfo)             \
  Y(clGetDeviceInfo)              \
  Y(clGetPlatformInfo)            \
  Y(clFlush)                      \
  Y(clEnqueueMarkerWithWaitList)  \
  Y(clEnqueueBarrierWithWaitList) \
  Y(clSetEventCallback)           \
  Y(clEnqueueMigrateMemObjects)   \
  Y(clGetEventInfo)               \
  Y(clGetCommandQueueInfo)        \
  Y(clWaitForEvents)              \
  Y(clReleaseEvent)

struct Api {
#define GPUPOOL_CL_FIELD(name) decltype(&::name) name = nullptr;
  GPUPOOL_CL_HOOKED(GPUPOOL_CL_FIELD)
  GPUPOOL_CL_USED(GPUPOOL_CL_FIELD)
#undef GPUPOOL_CL_FIELD
};

// The table the hooks call (never null once a hook runs; entries may be null
// when the implementation lacks them). The first call marks the process as
// the one where OpenCL was first used (implementation_inherited).
const Api& next();

// Whether this process inherited an initialised OpenCL implementation: OpenCL
// first reached gpupool in another process (the loader initialising the
// layer, or any call gpupool passed on: next()), which then forked this one
// without exec. The implementation's device threads (PoCL's) stay in that
// process, so device work here may wait forever: gpupool adds none
// (contexts.cpp closes every context here). A child whose ancestors made no
// OpenCL call is a fresh OpenCL process: false. One getpid() a call.
bool implementation_inherited();

}  // namespace gpupool::ocl

// The hooks (hooks.cpp), with the API's signatures: gpupool_hook_<name>,
// exported as <name>.
extern "C" {
#define GPUPOOL_CL_DECLARE(name)                                                 \
  __attribute__((visibility("hidden"))) std::remove_pointer_t<decltype(&::name)> \
      gpupool_hook_##name;
GPUPOOL_CL_HOOKED(GPUPOOL_CL_DECLARE)
#undef GPUPOOL_CL_DECLARE
}
