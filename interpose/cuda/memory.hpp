// The memory a CUDA context gives the pool: device blocks (cuMemAlloc) and
// pinned host blocks (cuMemHostAlloc; one arena per normalised flag set,
// each allocation's own flags passed as Pool::allocate's hint). Both are
// fenced by the context's work and recorded in the pointer maps.
#pragma once

#include <memory>

#include "core/backend.hpp"

namespace gpupool::cuda {

struct CtxState;

// fenced: GPUPOOL_REUSE=safe (a freed block waits for the context's work).
// fenced: freed blocks wait for the device; solo: unless the solo rule
// (contexts.hpp) says the program's next use of them is ordered after it.
std::unique_ptr<Backend> device_backend(CtxState* st, bool fenced, bool solo);
// flags: the arena's normalised flags (DEVICEMAP set), what the pointer
// maps report for its blocks.
std::unique_ptr<Backend> host_backend(CtxState* st, bool fenced, unsigned flags);

}  // namespace gpupool::cuda
