// Legacy IPC (cuIpcGetMemHandle / cuIpcOpenMemHandle) for pieces of an
// expandable range (GPUPOOL_SEGMENTS=expandable), which are virtual memory
// the driver's legacy IPC cannot share (docs/memory.md: "IPC of range
// pieces").
//
// Exporter: cuIpcGetMemHandle on a piece makes gpupool's own handle (its
// pid, an export number and a random token in the bytes the driver
// ignores; the rest zero, so that a process without gpupool gets the
// driver's error for it, never other memory) and the piece is never handed
// out again (Pool::never_reuse; core/ranges.hpp: dead). Its granules were
// created exportable as POSIX file descriptors.
//
// Importer: cuIpcOpenMemHandle on such a handle asks the exporter's control
// socket (same user) for the piece's granules, a batch at a time, as file
// descriptors (SCM_RIGHTS); imports, maps them into a reservation of its
// own, grants its device access and answers the piece's address.
// cuIpcCloseMemHandle unmaps it. As the driver does: an interior pointer
// exports its piece (opened at its start), and opening one handle twice
// gives one pointer, which the first close unmaps.
#pragma once

#include <cuda.h>

#include <string>
#include <string_view>
#include <vector>

#include "interpose/cuda/driver.hpp"
#include "interpose/cuda/pointers.hpp"

namespace gpupool::cuda::ipc {

// The exports and imports (cuda::State::ipc), made with the runtime.
struct Registry;
Registry* make_registry();

// Granules per answer (SCM_RIGHTS carries at most 253 descriptors).
inline constexpr std::size_t kBatch = 64;

// The handle for the range piece `i` (found at dptr), or the error to
// return (CUDA_ERROR_NOT_SUPPORTED when its granules cannot be exported:
// the caller says why once).
CUresult export_piece(const Driver& d, const PtrInfo& i, CUipcMemHandle* handle);
// The program frees a piece it exported: no process may open it from now.
void forget_export(CUdeviceptr piece);

// gpupool's handle (from any process). A process with gpupool switched
// off leaves it to the driver, which refuses it.
bool ours(const CUipcMemHandle& handle);
// `driver_open`: the export the program called (cuIpcOpenMemHandle or
// _v2), whose answer for the handle itself is the error where gpupool
// cannot open it.
CUresult open(const Driver& d, PFN_ipc_open driver_open, CUdeviceptr* dptr,
              const CUipcMemHandle& handle, unsigned flags);
// True when dptr was opened by open(); *r is the close's result.
bool close(const Driver& d, CUdeviceptr dptr, CUresult* r);
// The opened piece around p, for the pointer queries: answered for the
// piece, as the driver answers for an opened cuMemAlloc block (its own
// answer would be one granule's mapping).
PtrInfo find(CUdeviceptr p);

// The control thread's answer to "ipc <args>" (wire/socket.hpp), with the
// descriptors to send, which are the program's: the control socket's
// thread copies them into its own table and then has them closed.
std::string answer(std::string_view args, std::vector<int>* fds);

}  // namespace gpupool::cuda::ipc
