// Buffers the implementation serves alone, in a process that inherited it
// (a forked child: api.hpp, implementation_inherited). No device work is
// added there, so nothing is pooled (contexts.cpp, close_inherited); the
// program's buffers are still noted, so that its stats, its trace and the
// leak report see what it made and kept: one arena of kind
// "opencl-unpooled" per context, whose allocations are all the
// implementation's (Served::outside). Sub-buffers and SVM are not noted.
#pragma once

#include <cstddef>

#include "interpose/opencl/contexts.hpp"

namespace gpupool::ocl {

// A buffer the implementation made for the program in `ctx`, a closed
// context: its allocation noted. Never throws.
void note_unpooled(Runtime& rt, Ctx& ctx, cl_mem m, std::size_t size) noexcept;
// After the implementation's successful retain of `m`. Only a load unless
// this process noted a buffer.
void unpooled_retained(cl_mem m) noexcept;
// The implementation's release of `m`, a buffer gpupool does not pool: the
// program's last release of a noted one is its free, noted before the
// implementation may give its handle to another buffer.
cl_int release_unpooled(cl_mem m);

// The program released its last reference to `ctx` (hooks.cpp): its
// arena is retired once none of its buffers is noted.
void unpooled_context_finished(Runtime& rt, Ctx& ctx);

// fork(): the lock (contexts.cpp's prepare and release). In the child the
// noted buffers are its parent's: forgotten, and their arenas retired
// (renew, before the contexts' records drop theirs).
bool unpooled_fork_lock(State& st);
void unpooled_fork_unlock(State& st);
void unpooled_fork_renew(Runtime& rt);

}  // namespace gpupool::ocl
