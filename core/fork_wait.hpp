// fork()'s prepare handlers take every lock of gpupool's (interpose/
// runtime.hpp), waiting for the threads that hold them. A holder may never
// let go before the fork ends: a thread a signal handler interrupted inside
// gpupool, whose handler forks too (crash handlers do), and then waits for
// this fork to end (a C library that forks one thread at a time) or, with
// signals that keep coming, hardly ever returns to where it holds the lock
// (host.*.fork.signal under AddressSanitizer: each fork outlasted the
// 500 us between two signals). Every wait of a prepare is therefore one
// that gives up:
//   - at once, when a thread that may hold a lock forks (holder_forking:
//     the preloaded library's fork() says so for a thread inside gpupool,
//     which forks only from a signal handler);
//   - otherwise past a bound (a handler that blocks some other way, or a
//     library whose fork() is not the program's), far longer than any hold
//     of a lock gpupool makes while the program runs.
// A prepare that gave up lets go of everything it did, newest first (the
// journal: each lock taken, each flag set), and the fork goes ahead without
// gpupool: the child is left inert (runtime.cpp). Only waits give up: a
// prepare whose locks are all free completes whoever is queued behind it.
//
// The state of a prepare is its thread's: the C library may run several
// threads' prepare handlers at once (glibc lets go of its fork lock around
// each handler); gpupool's parts after the first are serialized by its
// first lock, the control round's.
#pragma once

#include <atomic>
#include <cstdint>

#include "core/thread_safety.hpp"

namespace gpupool::fork_wait {

// How long a prepare waits, all its waits together, at most.
inline constexpr std::uint64_t kBoundNs = 10'000'000'000;
// After a prepare gave up past its bound, how long the next ones wait at
// most, until one completes: none (a busy lock gives up at once). A holder
// stuck on what the forking thread's handler interrupted (gpupool's control
// thread waiting, through its files thread, on a driver lock that thread
// holds) costs one bound, not one per fork of a handler that forks again and
// again; and any wait longer than the program's signal period (500 us in
// the reviewer's program) would keep that thread in its handlers, never
// back where it lets the driver's lock go (10 ms waits hung 3 runs of 4).
inline constexpr std::uint64_t kBoundAfterGiveUpNs = 0;

// A prepare begins: its waits give up past `bound_ns` from now. Without
// begin and end, waits have no bound (the pool's own tests).
void begin(std::uint64_t bound_ns = kBoundNs);
// The prepare ends. true: it gave up, and everything in the journal was
// undone (newest first); false: the parent's and child's handlers let go of
// what it took, as usual. The journal is empty either way.
bool end();
// Whether the prepare in progress gave up: every later wait gives up at once.
bool gave_up();
// The prepare gives up without waiting (it failed: out of host memory).
void give_up();

// One more turn of a prepare's wait (`turn` counts from 0): spins, yields,
// then sleeps up to a millisecond a turn. false: give up now.
bool keep_waiting(unsigned turn);

// What to undo if the prepare gives up after this point. Where the journal
// cannot grow (out of host memory), it is undone at once and the prepare
// gives up.
using Undo = void (*)(void* arg);
void journal(Undo undo, void* arg) noexcept;
// A lock the prepare holds, let go if it gives up.
template <class L>
void journal_lock(L& lock) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  journal(
      +[](void* l) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS { static_cast<L*>(l)->unlock(); }, &lock);
}

// Takes a Ranked lock (core/lock_rank.hpp) for a prepare: false when the
// wait gave up (nothing taken). Taken, it is journaled; the parent's and the
// child's handlers let go of it as before.
template <class L>
bool take(L& lock) GPUPOOL_TRY_ACQUIRE(true, lock) GPUPOOL_NO_THREAD_SAFETY_ANALYSIS {
  if (!lock.lock_or_give_up()) return false;
  journal_lock(lock);
  return !gave_up();
}

// A thread that may hold any of gpupool's locks waits to fork: a prepare in
// progress gives up its waits. Counted from before its fork() to after it.
void holder_forking_begin();
void holder_forking_end();
// In a child: the counts were its parent's threads'.
void forget_holders_in_child();

}  // namespace gpupool::fork_wait
