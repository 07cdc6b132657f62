// The virtual memory API's physical allocations, pooled: what XLA's platform
// allocator (JAX with XLA_PYTHON_CLIENT_ALLOCATOR=platform) makes and frees
// a few dozen times a step (shared/research/xla-platform-allocator.md).
//
// A unit is one physical allocation (cuMemCreate) mapped whole, with access,
// in a reservation of its own: the shape that allocator gives every buffer
// (create, reserve, map, set access; unmap, release, free the address). The
// pool hands out a held unit's handle for a cuMemCreate of its size and
// properties, and its reservation for the same thread's next
// cuMemAddressReserve of that size; the program's map of the handle there is
// then already done, and its unmap, release and address free only take the
// unit back. Whatever else the program does with a unit's handle or address
// (map it elsewhere or at an offset, retain or export the handle, another
// size or flags) makes the unit its own: gpupool brings the driver's state to
// what the program believes it to be (undoing what it kept mapped, reserved
// or created) and lets go of it, and the call goes to the driver. So every
// answer is the driver's, for the state the program knows.
//
// Units are served only for sizes that are exactly a bin's (every multiple of
// 2 MiB up to 64 MiB, and the larger sizes with few significant bits): a
// handle larger than asked for could not be mapped whole by a program that
// takes it elsewhere. Other sizes go to the driver.
//
// The memory is no context's (it outlives the context that made it, as
// measured on the H200: tests/gpu/vmm_probe.c), but its fences are the
// context's that was current at its creation, so each context has its
// arenas; when the context ends, held units go back to the driver and the
// program's become plain driver allocations.
#pragma once

#include <cuda.h>

#include <memory>
#include <optional>

#include "core/backend.hpp"
#include "interpose/cuda/contexts.hpp"
#include "interpose/cuda/driver.hpp"
#include "interpose/cuda/pointers.hpp"

namespace gpupool {
struct Runtime;
}

namespace gpupool::cuda {
namespace vmm {

// The hooks' work: each returns what the driver answers (or would, for the
// state the program knows). create: nullopt when the pool does not serve
// the call (the hook asks the driver).
std::optional<CUresult> create(const Driver& d, CUmemGenericAllocationHandle* handle, size_t bytes,
                               const CUmemAllocationProp* prop, unsigned long long flags);
CUresult release(const Driver& d, CUmemGenericAllocationHandle handle);
CUresult address_reserve(const Driver& d, CUdeviceptr* ptr, size_t bytes, size_t alignment,
                         CUdeviceptr addr, unsigned long long flags);
CUresult address_free(const Driver& d, CUdeviceptr ptr, size_t bytes);
CUresult map(const Driver& d, CUdeviceptr ptr, size_t bytes, size_t offset,
             CUmemGenericAllocationHandle handle, unsigned long long flags);
CUresult unmap(const Driver& d, CUdeviceptr ptr, size_t bytes);
CUresult set_access(const Driver& d, CUdeviceptr ptr, size_t bytes, const CUmemAccessDesc* desc,
                    size_t count);
CUresult retain_handle(const Driver& d, CUmemGenericAllocationHandle* handle, void* addr);
CUresult export_handle(const Driver& d, void* shareable, CUmemGenericAllocationHandle handle,
                       CUmemAllocationHandleType type, unsigned long long flags);

// For pointer queries: an address inside a unit, active while the program
// has it mapped there.
PtrInfo find(CUdeviceptr p);

// Units the program released and unmapped but whose reservation it keeps
// (to map something else there later) hold memory nobody can use: on
// memory pressure they become the program's (their memory goes back to the
// driver, the reservation stays). True if there were any.
bool escape_ghosts();

// The backend of one context's units of one set of properties.
std::unique_ptr<Backend> backend(CtxState* st, const CUmemAllocationProp& prop, bool fenced);

// st's context ends: the units the
// program has leave the pool as plain driver allocations, in the state the
// program knows. Its held units go back to the driver when the pool drops
// them (retire_arena), unless this process is a forked child.
void retire_context(CtxState* st, Pool& pool) GPUPOOL_REQUIRES(st->teardown_mu);

// fork(): the unit registry's lock; in the child, the parent's units are
// forgotten without a driver call (CUDA does not cross fork()).
// The registry of units (cuda::State::vmm), made with the runtime.
struct Registry;
Registry* make_registry();

bool fork_prepare();  // false: gave up (core/fork_wait.hpp)
void fork_parent();
void fork_child();

}  // namespace vmm
}  // namespace gpupool::cuda
