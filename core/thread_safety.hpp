// Clang's thread-safety analysis (-Wthread-safety): which lock guards what,
// and which functions expect a lock held, said in the code so that the
// compiler checks it (CI's clang build, build-clang/, makes its warnings
// errors). Ranked (lock_rank.hpp) is the capability; LockGuard, UniqueLock
// and SharedLock are the scoped takes it understands (the standard library's
// guards are not annotated in libstdc++, so the analysis cannot see them).
// Other compilers see empty macros and plain guards.
#pragma once

#if defined(__clang__)
#define GPUPOOL_TSA(x) __attribute__((x))
#else
#define GPUPOOL_TSA(x)
#endif

// A type that is a lock.
#define GPUPOOL_CAPABILITY(name) GPUPOOL_TSA(capability(name))
// A type whose object holds a lock for its lifetime (a guard).
#define GPUPOOL_SCOPED_CAPABILITY GPUPOOL_TSA(scoped_lockable)
// A member read or written only with the lock held.
#define GPUPOOL_GUARDED_BY(x) GPUPOOL_TSA(guarded_by(x))
// A pointer member whose pointee is read or written only with the lock held.
#define GPUPOOL_PT_GUARDED_BY(x) GPUPOOL_TSA(pt_guarded_by(x))
// A function its callers call with the lock held (exclusively, or at least
// shared).
#define GPUPOOL_REQUIRES(...) GPUPOOL_TSA(requires_capability(__VA_ARGS__))
#define GPUPOOL_REQUIRES_SHARED(...) GPUPOOL_TSA(requires_shared_capability(__VA_ARGS__))
// A function that takes or lets go of the lock.
#define GPUPOOL_ACQUIRE(...) GPUPOOL_TSA(acquire_capability(__VA_ARGS__))
#define GPUPOOL_ACQUIRE_SHARED(...) GPUPOOL_TSA(acquire_shared_capability(__VA_ARGS__))
#define GPUPOOL_RELEASE(...) GPUPOOL_TSA(release_capability(__VA_ARGS__))
#define GPUPOOL_RELEASE_SHARED(...) GPUPOOL_TSA(release_shared_capability(__VA_ARGS__))
#define GPUPOOL_RELEASE_GENERIC(...) GPUPOOL_TSA(release_generic_capability(__VA_ARGS__))
#define GPUPOOL_TRY_ACQUIRE(...) GPUPOOL_TSA(try_acquire_capability(__VA_ARGS__))
// A function its callers must not call with the lock held (it takes it).
#define GPUPOOL_EXCLUDES(...) GPUPOOL_TSA(locks_excluded(__VA_ARGS__))
// A function that checks (or knows) the lock is held, for code the analysis
// cannot follow (a lock taken in one function and let go in another).
#define GPUPOOL_ASSERT_CAPABILITY(x) GPUPOOL_TSA(assert_capability(x))
// A function the analysis does not look at. Mostly fork handlers
// (interpose/runtime.hpp, Part): prepare takes every lock of a part, in
// loops, and the parent or child handler lets go of them, which the
// analysis, function by function, cannot follow.
#define GPUPOOL_NO_THREAD_SAFETY_ANALYSIS GPUPOOL_TSA(no_thread_safety_analysis)
// The lock a function returns.
#define GPUPOOL_RETURN_CAPABILITY(x) GPUPOOL_TSA(lock_returned(x))
