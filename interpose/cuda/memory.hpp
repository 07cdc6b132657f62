// The memory a CUDA context gives the pool: device blocks (cuMemAlloc) and
// pinned host blocks (cuMemHostAlloc; one arena per normalised flag set,
// each allocation's own flags passed as Pool::allocate's hint). Both are
// fenced by the context's work and recorded in the pointer maps.
#pragma once

#include <memory>

#include <cuda.h>

#include "core/backend.hpp"

namespace gpupool {
struct Runtime;
}

namespace gpupool::cuda {

struct CtxState;
struct Driver;
struct PeerAccess;  // the contexts given peer access (cuda::State::peers)
PeerAccess* make_peer_access();

// fenced: GPUPOOL_REUSE=safe (a freed block waits for the context's work).
// fenced: freed blocks wait for the device; solo: unless the solo rule
// (contexts.hpp) says the program's next use of them is ordered after it;
// marks: frees record marks (contexts.hpp), for an expandable range's waits.
std::unique_ptr<Backend> device_backend(CtxState* st, bool fenced, bool solo, bool marks);
// flags: the arena's normalised flags (DEVICEMAP set), what the pointer
// maps report for its blocks.
std::unique_ptr<Backend> host_backend(CtxState* st, bool fenced, unsigned flags);

// The program enabled peer access to `peer`'s memory from a context of
// `dev` (cuCtxEnablePeerAccess): the granules of peer's expandable range,
// mapped now and later, are made accessible to `dev` too, as its
// cuMemAlloc blocks are by the driver.
void grant_peer_access(const Driver& d, Runtime& rt, CUcontext peer, CUdevice dev);

}  // namespace gpupool::cuda
