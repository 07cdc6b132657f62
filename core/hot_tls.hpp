// Thread-local variables read on every allocation and free.
//
// libgpupool.so is position-independent, so a plain thread_local there is
// reached through __tls_get_addr (a call, and a lookup of the module's TLS
// block) on every access: two calls per CUDA allocate+free pair, 26 of its
// ~850 instructions on the stand-in driver. The initial-exec model reads
// them at a fixed offset from the thread pointer instead. It needs the
// library's TLS in the static TLS block, which it is when preloaded
// (LD_PRELOAD, `gpupool run`); a dlopen() of it (ctypes.CDLL, for the C
// API) still fits in glibc's surplus for such blocks: all of gpupool's
// thread-locals take 216 bytes.
#pragma once

#define GPUPOOL_HOT_TLS thread_local __attribute__((tls_model("initial-exec")))
