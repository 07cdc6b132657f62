// The pointer map in-process, with the pool over a backend that records its
// allocations in it as the CUDA backends do (interpose/cuda/memory.cpp):
// what a program's frees and queries find after hand-outs, frees and
// context teardowns, including the races a teardown has with other
// contexts' allocations, replayed in order.
#include <gtest/gtest.h>

#include <memory>

#include "interpose/cuda/pointers.hpp"

namespace gpupool::cuda {
namespace {

// Context records are only compared by the map: any distinct addresses do.
CtxState* const kCtxA = reinterpret_cast<CtxState*>(0xa000);
CtxState* const kCtxB = reinterpret_cast<CtxState*>(0xb000);
constexpr std::size_t kMiB = std::size_t{1} << 20;

// A driver handing out consecutive addresses, recording each allocation in
// the map (its entry is the block's record) and erasing it when the pool
// releases or drops the block.
struct RecordingBackend : Backend {
  PtrMap& map;
  CtxState* st;
  Handle next = 0x7f0000000000;
  RecordingBackend(PtrMap& m, CtxState* s) : map(m), st(s) {}
  BackendResult allocate(std::size_t bytes, std::uint64_t) override {
    const Handle h = next;
    next += (bytes + kMiB - 1) / kMiB * kMiB + kMiB;
    return {BackendStatus::ok, h, 0, map.insert(h, bytes, st)};
  }
  void release(Handle, std::size_t, void* data) override {
    map.erase(static_cast<PtrMap::Entry*>(data));
  }
  void drop(Handle, std::size_t, void* data) override {
    map.erase(static_cast<PtrMap::Entry*>(data));
  }
};

struct MapFixture {
  PtrMap map;
  Pool pool{{.shards = 1}};
  Arena* arena;
  explicit MapFixture(std::size_t split_min = 0) {
    ArenaOptions o;
    o.name = "ctx A";
    o.group = "cuda:0";
    o.kind = "cuda";
    o.split_min = split_min;
    arena = pool.add_arena(std::make_unique<RecordingBackend>(map, kCtxA), o);
  }
  // cuMemAlloc's hit path: the pool's block, then the map.
  Block* alloc(std::size_t n) {
    Block* b = pool.allocate(arena, n).block;
    map.activate(b);
    return b;
  }
  // cuMemFree's: the map, then the pool. Returns whether the pointer was
  // ours; a double free is ours with no block.
  bool free(Handle h, bool* double_free = nullptr) {
    bool known = false;
    Block* b = map.deactivate(h, &known);
    if (double_free) *double_free = known && !b;
    if (b) pool.free(b);
    return known;
  }
};

TEST(PointerMap, AHandedOutBlockIsFoundActiveWithANewBufferIdEachTime) {
  MapFixture f;
  Block* b = f.alloc(1000);
  const Handle h = b->handle;
  PtrInfo first = f.map.find(h + 999);
  EXPECT_TRUE(first.found && first.active);
  EXPECT_EQ(first.base, h);
  EXPECT_EQ(first.requested, 1000u);
  EXPECT_TRUE(f.free(h));
  PtrInfo held = f.map.find(h);
  EXPECT_TRUE(held.found);
  EXPECT_FALSE(held.active) << "held by the pool: free for the program";
  bool twice = false;
  EXPECT_TRUE(f.free(h, &twice));
  EXPECT_TRUE(twice) << "a second free is a double free";
  Block* again = f.alloc(1020);  // the same bin (1024 bytes)
  ASSERT_EQ(again->handle, h) << "the held block is handed out again";
  PtrInfo second = f.map.find(h);
  EXPECT_TRUE(second.active);
  EXPECT_EQ(second.requested, 1020u);
  EXPECT_NE(second.buffer_id, first.buffer_id) << "a new allocation to the program";
}

TEST(PointerMap, TeardownTakesTheContextsEntriesOutOfTheMaps) {
  MapFixture f;
  Block* active = f.alloc(4096);
  const Handle owned = active->handle;
  const Handle held = f.alloc(8192)->handle;
  f.free(held);
  f.pool.retire_arena(f.arena);  // the driver destroyed the context
  f.map.erase_context(kCtxA, f.pool);
  EXPECT_FALSE(f.map.find(owned).found);
  EXPECT_FALSE(f.map.find(held).found);
  bool known = true;
  EXPECT_EQ(f.map.deactivate(owned, &known), nullptr);
  EXPECT_FALSE(known) << "a later free of it is the driver's to answer";
  EXPECT_EQ(f.pool.arena_count(), 0u) << "its block was forgotten, so the arena went";
}

// Another context's allocation takes an address whose old entry is still
// the record of a block on its way to the program (a teardown racing it):
// the new entry answers for the address, and the old one, once its block
// goes, is deleted without touching the new.
TEST(PointerMap, AnAddressTakenByANewerAllocationBelongsToIt) {
  MapFixture f;
  Block* old_block = f.pool.allocate(f.arena, 4096).block;  // not yet activated
  const Handle h = old_block->handle;
  PtrMap::Entry* newer = f.map.insert(h, 2 * kMiB, kCtxB);
  f.map.activate(old_block);  // the racing hand-out writes its own record
  f.pool.forget(old_block);   // its context's teardown: the block and its record go
  PtrInfo i = f.map.find(h + kMiB);
  EXPECT_TRUE(i.found);
  EXPECT_EQ(i.size, 2 * kMiB) << "the newer allocation's entry";
  EXPECT_FALSE(i.active);
  f.map.erase(newer);
  EXPECT_FALSE(f.map.find(h).found);
}

// GPUPOOL_SPLIT: the program holds two pieces of one segment when its
// context is destroyed, and before gpupool's teardown runs the driver
// hands the second piece's range to another context's allocation (another
// thread allocating meanwhile), which takes that piece's entry. Nothing of
// the dead segment may stay: a later free at its base would get gpupool's
// double-free error instead of the driver's answer.
TEST(PointerMap, TeardownLeavesNothingOfASegmentWhosePieceLostItsEntry) {
  MapFixture f(kMiB);
  Block* p0 = f.alloc(kMiB);
  Block* p1 = f.alloc(kMiB);
  ASSERT_TRUE(p0->split && p1->split);
  const Handle base = p0->handle, inner = p1->handle;
  ASSERT_EQ(inner, base + kMiB) << "both pieces of one segment";
  PtrMap::Entry* other = f.map.insert(inner, kMiB, kCtxB);
  f.pool.retire_arena(f.arena);
  f.map.erase_context(kCtxA, f.pool);
  EXPECT_FALSE(f.map.find(base).found);
  f.map.erase(other);  // the other context frees its allocation
  EXPECT_FALSE(f.map.find(inner + 100).found);
  bool known = true;
  EXPECT_EQ(f.map.deactivate(base, &known), nullptr);
  EXPECT_FALSE(known);
}

// The pointer maps' locks rank before the pool's (core/lock_rank.hpp): a
// map is used around pool calls, never under a pool lock. Debug builds
// (CI's sanitizer builds) stop a program that takes them the other way
// round, as a fork's prepare would if it took the pool's first.
TEST(PointerMapDeathTest, ALookupUnderThePoolsLocksStopsTheProgram) {
#ifndef GPUPOOL_LOCK_RANKS
  GTEST_SKIP() << "lock ranks are checked in Debug builds";
#else
  MapFixture f;
  const Handle h = f.alloc(4096)->handle;
  EXPECT_DEATH(
      {
        f.pool.fork_prepare();
        (void)f.map.find(h);
      },
      "lock order violated: taking 'cuda pointer ranges' \\(rank [0-9]+\\) while holding 'arena "
      "(shard|segments)'");
#endif
}

}  // namespace
}  // namespace gpupool::cuda
