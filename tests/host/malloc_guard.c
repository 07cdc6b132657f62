/* Preloaded first into host_program's fork.signal check (not in sanitizer
 * builds, whose runtime owns malloc): every allocation of the process goes
 * through here to glibc's, so a signal handler can ask whether it
 * interrupted malloc on its own thread (malloc_guard_depth).
 *
 * glibc's fork() takes malloc's locks. In a process with more than one
 * thread, a handler that interrupted malloc holding one hangs in fork(), with
 * or without gpupool: PoCL's program hung so in 8 of 8 runs without gpupool
 * (gdb: the main thread in __malloc_fork_lock_parent, interrupted inside
 * PoCL's calloc). The check is of what gpupool adds, so such a handler does
 * not fork (docs/guarantees.md). */
#define _GNU_SOURCE
#include <errno.h>
#include <stddef.h>
#include <stdint.h>

extern void* __libc_malloc(size_t);
extern void* __libc_calloc(size_t, size_t);
extern void* __libc_realloc(void*, size_t);
extern void __libc_free(void*);
extern void* __libc_memalign(size_t, size_t);
extern void* __libc_valloc(size_t);
extern void* __libc_pvalloc(size_t);

/* initial-exec: read from a signal handler without __tls_get_addr. */
static __thread volatile int t_depth __attribute__((tls_model("initial-exec")));

int malloc_guard_depth(void) { return t_depth; }

#define GUARDED(type, call) \
  do {                      \
    ++t_depth;              \
    type r_ = call;         \
    --t_depth;              \
    return r_;              \
  } while (0)

void* malloc(size_t n) { GUARDED(void*, __libc_malloc(n)); }
void* calloc(size_t n, size_t size) { GUARDED(void*, __libc_calloc(n, size)); }
void* realloc(void* p, size_t n) { GUARDED(void*, __libc_realloc(p, n)); }
void* memalign(size_t align, size_t n) { GUARDED(void*, __libc_memalign(align, n)); }
void* aligned_alloc(size_t align, size_t n) { GUARDED(void*, __libc_memalign(align, n)); }
void* valloc(size_t n) { GUARDED(void*, __libc_valloc(n)); }
void* pvalloc(size_t n) { GUARDED(void*, __libc_pvalloc(n)); }

void* reallocarray(void* p, size_t n, size_t size) {
  size_t bytes;
  if (__builtin_mul_overflow(n, size, &bytes)) {
    errno = ENOMEM;
    return NULL;
  }
  GUARDED(void*, __libc_realloc(p, bytes));
}

int posix_memalign(void** out, size_t align, size_t n) {
  if (align < sizeof(void*) || (align & (align - 1)) != 0) return EINVAL;
  void* p;
  ++t_depth;
  p = __libc_memalign(align, n);
  --t_depth;
  if (!p && n) return ENOMEM;
  *out = p;
  return 0;
}

void free(void* p) {
  ++t_depth;
  __libc_free(p);
  --t_depth;
}
