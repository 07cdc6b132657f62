// Expandable ranges (ArenaOptions::expandable): large requests served by
// pieces of one reserved address range, physical memory mapped and unmapped
// granule by granule, as a program sees them and as the backend is asked.
// The fake backend throws (failing the test) on a granule mapped twice,
// unmapped while not mapped, or outside its range.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <thread>
#include <vector>

#include "core/binned.hpp"
#include "core/pool.hpp"
#include "core/ranges.hpp"
#include "pool_fixture.hpp"

using namespace gpupool;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;
constexpr std::size_t G = 2 * MiB;  // the fake device's granule

// One arena on a fake device that maps granules of `granule` bytes (0:
// none), splitting from 1 MiB unless ao says otherwise.
struct Fixture {
  std::shared_ptr<gpupool::testing::FakeDevice> dev;
  Pool pool;
  Arena* arena;
  explicit Fixture(ArenaOptions ao = {}, PoolOptions po = {}, std::size_t granule = G)
      : dev(device(granule)), pool(gpupool::testing::PoolFixture::with_cost_clock(po)) {
    ao.group = "dev";
    if (!ao.split_min) ao.split_min = MiB;
    ao.expandable = true;
    arena = pool.add_arena(std::make_unique<gpupool::testing::FakeBackend>(dev), ao);
  }
  static std::shared_ptr<gpupool::testing::FakeDevice> device(std::size_t granule) {
    auto d = std::make_shared<gpupool::testing::FakeDevice>();
    d->granule = granule;
    return d;
  }
  Block* alloc(std::size_t n) {
    AllocResult r = pool.allocate(arena, n);
    EXPECT_EQ(r.status, BackendStatus::ok);
    return r.block;
  }
  Stats stats() const { return arena->stats(); }
};

}  // namespace

TEST(Ranges, ARequestMapsWholeGranulesAndTheRestServesTheNext) {
  Fixture f;
  Block* a = f.alloc(3 * MiB);  // two granules mapped: 3 MiB used, 1 MiB free
  EXPECT_EQ(f.dev->reserves, 1u);
  EXPECT_EQ(f.dev->allocs, 0u);
  EXPECT_EQ(f.dev->maps, 1u);
  EXPECT_EQ(f.dev->mapped_bytes(), 2 * G);
  EXPECT_TRUE(a->split);
  EXPECT_EQ(a->size, 3 * MiB);
  Stats s = f.stats();
  EXPECT_EQ(s.managed_bytes, 2 * G);
  EXPECT_EQ(s.held_bytes, MiB);
  EXPECT_EQ(s.backend_allocs, 1u);
  AllocResult r = f.pool.allocate(f.arena, MiB);
  EXPECT_TRUE(r.hit);
  EXPECT_EQ(r.block->handle, a->handle + 3 * MiB);
  EXPECT_EQ(f.dev->maps, 1u);
  // The next request maps the granule after them: one range, no hole.
  Block* c = f.alloc(MiB);
  EXPECT_EQ(c->handle, a->handle + 2 * G);
  EXPECT_EQ(f.dev->maps, 2u);
  EXPECT_EQ(f.stats().managed_bytes, 3 * G);
  f.pool.free(a);
  f.pool.free(r.block);
  f.pool.free(c);
}

TEST(Ranges, FreedNeighboursMergeAndServeLargerSizesWithoutMapping) {
  Fixture f;
  std::vector<Block*> phase1;
  for (int i = 0; i < 4; ++i) phase1.push_back(f.alloc(2 * MiB));
  const Handle start = phase1[0]->handle;
  for (Block* b : phase1) f.pool.free(b);
  // Parked in the thread's slot, whole, for requests of their size
  // (Shard::park); held either way.
  EXPECT_EQ(f.stats().held_bytes, 8 * MiB);
  const std::uint64_t maps = f.dev->maps;
  // A size the first phase never asked for, larger than each of its pieces.
  AllocResult r = f.pool.allocate(f.arena, 7 * MiB);
  EXPECT_TRUE(r.hit);
  EXPECT_EQ(r.block->handle, start);
  EXPECT_EQ(f.dev->maps, maps);
  EXPECT_EQ(f.stats().managed_bytes, 8 * MiB);
  f.pool.free(r.block);
}

// A freed piece is parked whole in its thread's slot (Shard::park) and
// serves the next request of its size there; parked, it is held: counted,
// and given back by free_held and stop_holding like any held memory.
TEST(Ranges, ParkedPiecesServeTheirSizeAndGoBackWithHeldMemory) {
  Fixture f;
  Block* a = f.alloc(4 * MiB);
  Block* keep = f.alloc(MiB);  // between them: a's and b's pieces do not merge
  Block* b = f.alloc(5 * MiB);
  const Handle ha = a->handle;
  f.pool.free(a);
  f.pool.free(b);
  EXPECT_EQ(f.stats().held_bytes, 9 * MiB);
  // Their whole granules, [0, 4) and [6, 10): not keep's [4, 6).
  EXPECT_EQ(f.arena->releasable_bytes(), 8 * MiB);
  const std::uint64_t maps = f.dev->maps;
  AllocResult r = f.pool.allocate(f.arena, 4 * MiB);
  EXPECT_TRUE(r.hit);
  EXPECT_EQ(r.block->handle, ha);
  EXPECT_EQ(f.dev->maps, maps);
  EXPECT_EQ(f.stats().held_bytes, 5 * MiB);
  f.pool.free(r.block);
  f.pool.free_held();
  EXPECT_EQ(f.dev->mapped_bytes(), 2 * MiB);  // keep's granule
  EXPECT_EQ(f.stats().held_bytes, MiB);       // [5, 6), in keep's granule
  Block* c = f.alloc(4 * MiB);
  f.pool.free(c);  // parked again
  f.pool.stop_holding();
  EXPECT_EQ(f.dev->mapped_bytes(), 2 * MiB);
  f.pool.free(keep);
  EXPECT_EQ(f.dev->mapped_bytes(), 0u);
  EXPECT_EQ(f.stats().managed_bytes, 0u);
  EXPECT_EQ(f.stats().held_bytes, 0u);
}

// Safe reuse: a parked piece the device may still use is not handed out
// without a wait.
TEST(Ranges, APendingParkedPieceIsNotHandedOutBeforeItsFence) {
  Fixture f({.pending_growth = 64 * MiB});
  f.dev->fences = true;
  Block* big = f.alloc(62 * MiB);
  Block* a = f.alloc(2 * MiB);
  const Handle ha = a->handle;
  f.pool.free(a);  // pending
  Block* b = f.alloc(2 * MiB);
  EXPECT_TRUE(b->handle != ha || f.dev->waits > 0);
  const Handle hb = b->handle;
  f.pool.free(b);                    // parked, pending: a fence of its own
  f.dev->completed = f.dev->issued;  // ready now
  const std::uint64_t maps = f.dev->maps, waits = f.dev->waits;
  Block* c = f.alloc(2 * MiB);  // the newest parked piece, at once
  EXPECT_EQ(c->handle, hb);
  EXPECT_EQ(f.dev->maps, maps);
  EXPECT_EQ(f.dev->waits, waits);
  f.pool.free(c);
  f.pool.free(big);
}

// A fifth freed piece pushes the oldest parked one into the range, where
// it merges with its free neighbours.
TEST(Ranges, AFullParkPushesItsOldestPieceIntoTheRange) {
  Fixture f;
  std::vector<Block*> p;
  for (int i = 0; i < 5; ++i) p.push_back(f.alloc(2 * MiB));
  Block* keep = f.alloc(MiB);
  const Handle first = p[0]->handle;
  f.pool.free(p[1]);  // the oldest parked
  f.pool.free(p[0]);
  f.pool.free(p[2]);
  f.pool.free(p[3]);
  f.pool.free(p[4]);                          // the fifth: p[1] goes into the range
  EXPECT_EQ(f.stats().held_bytes, 11 * MiB);  // and [11, 12), in keep's granule
  // p[1] went into the range; a 2 MiB request from another slot (no park
  // of its own) takes it there, without mapping.
  const std::uint64_t maps = f.dev->maps;
  Handle got = 0;
  std::thread other([&] {
    Block* x = f.alloc(2 * MiB);
    got = x->handle;
    f.pool.free(x);
  });
  other.join();
  EXPECT_EQ(got, first + 2 * MiB);
  EXPECT_EQ(f.dev->maps, maps);
  f.pool.free(keep);
  f.pool.free_held();
  EXPECT_EQ(f.dev->mapped_bytes(), 0u);
  EXPECT_EQ(f.stats().held_bytes, 0u);
}

// A request its slot's parks cannot serve first returns them to the
// range, which then chooses among all of the slot's ready free pieces as
// it would without parking: two parked neighbours, merged, fit a request
// exactly, and a larger free piece stays whole for a request of its size.
TEST(Ranges, ARequestTheParksCannotServeSeesTheirPiecesInTheRange) {
  Fixture f;
  Block* a = f.alloc(2 * MiB);  // [0, 2)
  Block* b = f.alloc(2 * MiB);  // [2, 4)
  Block* s1 = f.alloc(MiB);
  Block* big = f.alloc(8 * MiB);  // [5, 13)
  Block* s2 = f.alloc(MiB);
  Block* p3 = f.alloc(MiB);
  Block* s3 = f.alloc(MiB);
  Block* p4 = f.alloc(MiB);
  Block* s4 = f.alloc(MiB);
  const Handle base = a->handle;
  const Handle big_at = big->handle;
  for (Block* x : {big, a, b, p3, p4}) f.pool.free(x);  // big pushed out into the range
  const std::size_t mapped = f.dev->mapped_bytes();
  Block* four = f.alloc(4 * MiB);  // a and b, merged; without them, big's start
  EXPECT_EQ(four->handle, base);
  Block* eight = f.alloc(8 * MiB);  // big, whole: nothing mapped
  EXPECT_EQ(eight->handle, big_at);
  EXPECT_EQ(f.dev->mapped_bytes(), mapped);
  for (Block* x : {s1, s2, s3, s4, four, eight}) f.pool.free(x);
}

// A piece shared with another process and freed (dead) next to a parked
// piece: the parked piece goes into the range first, so the granule they
// share, which the other process may map, is unmapped and never handed out
// again with its old memory.
TEST(Ranges, APieceDyingBesideAParkedOneTakesItsGranuleWithIt) {
  Fixture f;
  Block* x = f.alloc(MiB);      // [0, 1) in granule [0, 2)
  Block* y = f.alloc(5 * MiB);  // [1, 6)
  Block* z = f.alloc(MiB);      // [6, 7)
  const Handle base = x->handle;
  f.pool.free(x);  // parked
  f.pool.never_reuse(y);
  f.pool.free(y);
  EXPECT_EQ(f.dev->mapped.count(base), 0u);
  EXPECT_EQ(f.dev->mapped_bytes(), 2 * MiB);  // z's granule only
  Block* w = f.alloc(MiB);
  EXPECT_TRUE(w->handle != base || f.dev->generation[base] == 2u);
  f.pool.free(w);
  f.pool.free(z);
  f.pool.free_held();
  EXPECT_EQ(f.dev->mapped_bytes(), 0u);
}

// A piece on its way to dying (dying() done, its free not yet: another
// thread) stops parking even when another free's reap has just found no
// dead piece left: a piece freed meanwhile in the dying one's granule goes
// into the range, where the dead free unmaps the granule they share, and
// the granule is never handed out again with the memory the other process
// may map.
TEST(Ranges, NothingIsParkedWhileAPieceIsOnItsWayToDying) {
  Fixture f;
  Block* d0 = f.alloc(MiB);     // [0, 1): dies first
  Block* n = f.alloc(3 * MiB);  // [1, 4): its neighbour, in use
  Block* p = f.alloc(MiB);      // [4, 5): in the granule [4, 6) with q
  Block* q = f.alloc(MiB);      // [5, 6): shared with another process
  Block* z = f.alloc(2 * MiB);  // [6, 8)
  const Handle base = d0->handle;
  f.pool.never_reuse(d0);
  f.pool.free(d0);  // dead: its granule [0, 2) is n's too
  f.pool.never_reuse(q);
  f.arena->ranges()->dying();  // q's free has begun (Pool::free_piece)
  f.pool.free(n);              // reaps d0: no dead piece left
  f.pool.free(p);              // must not be parked
  const std::atomic<bool> keep{true};
  bool over_cap = false;
  f.arena->ranges()->free(q->handle, 0, 0, /*reusable=*/false, keep, &over_cap);
  delete q;
  EXPECT_EQ(f.dev->mapped.count(base + 4 * MiB), 0u);  // q's granule unmapped
  Block* w = f.alloc(MiB);
  EXPECT_TRUE(w->handle < base + 4 * MiB || w->handle >= base + 6 * MiB ||
              f.dev->generation[base + 4 * MiB] == 2u);
  for (Block* x : {w, z}) f.pool.free(x);
}

// Parking never makes the range map more: before a growth, every slot's
// parked pieces go back into the range, where they merge.
TEST(Ranges, AGrowthFirstTakesBackThePiecesParkedInEverySlot) {
  Fixture f({}, {.shards = 4});
  Block* keep = f.alloc(MiB);
  Handle first = 0;
  std::thread other([&] {
    Block* x = f.alloc(3 * MiB);
    Block* y = f.alloc(4 * MiB);
    first = x->handle;
    f.pool.free(x);
    f.pool.free(y);  // both parked in that thread's slot
  });
  other.join();
  const std::uint64_t maps = f.dev->maps;
  Block* z = f.alloc(7 * MiB);  // neither parked piece alone: both, merged
  EXPECT_EQ(z->handle, first);
  EXPECT_EQ(f.dev->maps, maps);
  EXPECT_EQ(f.stats().managed_bytes, 8 * MiB);
  f.pool.free(z);
  f.pool.free(keep);
}

TEST(Ranges, GrowthJoinsAFreePieceToTheGranulesAfterIt) {
  Fixture f;
  Block* a = f.alloc(3 * MiB);  // [0, 4) mapped, [3, 4) free
  Block* b = f.alloc(5 * MiB);  // [3, 8): 1 MiB free joined to 4 new MiB
  EXPECT_EQ(b->handle, a->handle + 3 * MiB);
  EXPECT_EQ(f.dev->mapped_bytes(), 8 * MiB);
  EXPECT_EQ(f.stats().held_bytes, 0u);
  f.pool.free(a);
  f.pool.free(b);
}

// A large request (a workspace) is cut from the end of the highest free
// piece that fits, so the smaller requests between workspaces stay below
// it, and the hole a workspace leaves at the top stays whole: a larger
// workspace later maps only what the hole lacks.
TEST(Ranges, LargeRequestsAreCutFromTheTopSoTheirHoleStaysWhole) {
  Fixture f;
  Block* p = f.alloc(16 * MiB);
  Block* w = f.alloc(128 * MiB);  // [16, 144) mapped
  const Handle base = p->handle;
  f.pool.free(w);
  Block* s = f.alloc(16 * MiB);  // [16, 32): the start of the hole
  EXPECT_EQ(s->handle, base + 16 * MiB);
  Block* w2 = f.alloc(96 * MiB);  // [48, 144): the hole's end
  EXPECT_EQ(w2->handle, base + 48 * MiB);
  Block* t = f.alloc(16 * MiB);  // [32, 48): below the workspace
  EXPECT_EQ(t->handle, base + 32 * MiB);
  f.pool.free(w2);
  // The hole [48, 144) and 16 new MiB after it; with the workspace cut from
  // the hole's start, `t` would sit at its end and 112 MiB be mapped anew.
  Block* w3 = f.alloc(112 * MiB);
  EXPECT_EQ(w3->handle, base + 48 * MiB);
  EXPECT_EQ(f.dev->mapped_bytes(), 160 * MiB);
  EXPECT_EQ(f.stats().managed_bytes, 160 * MiB);
  for (Block* b : {p, s, t, w3}) f.pool.free(b);
}

// A request of 64 MiB or more but under half the largest the range was
// asked for (an activation beside a framework's workspace) is cut from the
// start of its best fit, as smaller ones are: the workspace's hole keeps
// its top, and the workspace, back, maps only what the hole lacks.
TEST(Ranges, LargeRequestsUnderHalfTheLargestAreCutFromTheStart) {
  Fixture f;
  Block* w = f.alloc(512 * MiB);  // [0, 512)
  const Handle base = w->handle;
  f.pool.free(w);
  Block* a = f.alloc(100 * MiB);  // under 256 MiB: [0, 100)
  EXPECT_EQ(a->handle, base);
  // [100, 512) and 100 new MiB; with `a` cut from the hole's end, 512 MiB
  // mapped anew.
  Block* w2 = f.alloc(512 * MiB);
  EXPECT_EQ(w2->handle, base + 100 * MiB);
  EXPECT_EQ(f.dev->mapped_bytes(), 612 * MiB);
  EXPECT_EQ(f.stats().managed_bytes, 612 * MiB);
  f.pool.free(a);
  f.pool.free(w2);
}

// The largest request counts only while recent: after one huge request
// early (a checkpoint loaded) and kTopWindow large ones since, a workspace
// is again cut from the top of the range.
TEST(Ranges, AnEarlyHugeRequestStopsCountingOnceOthersFollow) {
  Fixture f;
  Block* huge = f.alloc(1024 * MiB);  // [0, 1024)
  const Handle base = huge->handle;
  f.pool.free(huge);
  Block* w = f.alloc(128 * MiB);  // under half of 1 GiB: from the start
  EXPECT_EQ(w->handle, base);
  f.pool.free(w);
  // Sizes the parks cannot serve (each larger than the last): every one
  // asks the range.
  for (std::size_t i = 0; i < 64; ++i) f.pool.free(f.alloc((64 + i) * MiB));
  Block* w2 = f.alloc(128 * MiB);  // the largest lately: from the top
  EXPECT_EQ(w2->handle, base + 896 * MiB);
  EXPECT_EQ(f.dev->mapped_bytes(), 1024 * MiB);
  f.pool.free(w2);
}

// A smaller request takes the free piece the range grows from only when
// no other fits, so that the next large one grows from it whole.
TEST(Ranges, SmallerRequestsLeaveThePieceTheRangeGrowsFrom) {
  Fixture f;
  Block* p = f.alloc(16 * MiB);
  Block* hole = f.alloc(48 * MiB);  // [16, 64)
  Block* q = f.alloc(16 * MiB);
  Block* last = f.alloc(24 * MiB);  // [80, 104): 104 MiB mapped
  const Handle base = p->handle;
  f.pool.free(hole);
  f.pool.free(last);
  Block* s = f.alloc(16 * MiB);  // the hole, not the smaller best fit at the end
  EXPECT_EQ(s->handle, base + 16 * MiB);
  // [80, 104) and 40 new MiB; had `s` taken [80, 96), 56 new MiB.
  Block* w = f.alloc(64 * MiB);
  EXPECT_EQ(w->handle, base + 80 * MiB);
  EXPECT_EQ(f.dev->mapped_bytes(), 144 * MiB);
  EXPECT_EQ(f.stats().managed_bytes, 144 * MiB);
  for (Block* b : {p, q, s, w}) f.pool.free(b);
}

// Held memory goes back granule by granule, whatever is still in use
// around it; the partial granules stay with their neighbours.
TEST(Ranges, FreeHeldUnmapsTheWholeFreeGranulesBetweenPiecesInUse) {
  Fixture f;
  Block* x = f.alloc(MiB);      // [0, 1)
  Block* y = f.alloc(7 * MiB);  // [1, 8)
  Block* z = f.alloc(MiB);      // [8, 9), granule [8, 10) mapped, [9, 10) free
  const Handle hy = y->handle;
  EXPECT_EQ(f.dev->mapped_bytes(), 10 * MiB);
  f.pool.free(y);
  EXPECT_EQ(f.arena->releasable_bytes(), 6 * MiB);  // granules [2, 8): not x's
  f.pool.free_held();
  EXPECT_EQ(f.dev->unmaps, 1u);
  EXPECT_EQ(f.dev->mapped_bytes(), 4 * MiB);
  Stats s = f.stats();
  EXPECT_EQ(s.managed_bytes, 4 * MiB);
  EXPECT_EQ(s.held_bytes, 2 * MiB);  // [1, 2) and [9, 10), in x's and z's granules
  EXPECT_EQ(s.backend_frees, 1u);
  // 7 MiB again: the hole is mapped again (the fake would throw on a
  // granule mapped twice).
  Block* w = f.alloc(7 * MiB);
  EXPECT_EQ(w->handle, hy);
  EXPECT_EQ(f.dev->mapped_bytes(), 10 * MiB);
  f.pool.free(x);
  f.pool.free(w);
  f.pool.free(z);
  f.pool.free_held();
  EXPECT_EQ(f.dev->mapped_bytes(), 0u);
  EXPECT_EQ(f.stats().managed_bytes, 0u);
  EXPECT_EQ(f.stats().held_bytes, 0u);
}

TEST(Ranges, StopHoldingUnmapsAtFree) {
  Fixture f;
  Block* a = f.alloc(4 * MiB);
  Block* b = f.alloc(4 * MiB);
  f.pool.stop_holding();
  f.pool.free(a);
  EXPECT_EQ(f.dev->mapped_bytes(), 4 * MiB);
  f.pool.free(b);
  EXPECT_EQ(f.dev->mapped_bytes(), 0u);
  EXPECT_EQ(f.stats().managed_bytes, 0u);
}

TEST(Ranges, OutOfMemoryUnmapsFreeGranulesAndRetries) {
  Fixture f;
  f.dev->capacity = 6 * MiB;
  Block* a = f.alloc(2 * MiB);
  Block* b = f.alloc(2 * MiB);
  Block* c = f.alloc(2 * MiB);
  const Handle ha = a->handle;
  f.pool.free(a);
  f.pool.free(c);  // free: [0, 2) and [4, 6); all 6 MiB mapped
  // 4 MiB fits no free piece: mapping [6, 8) to join [4, 6) fails, so the
  // first of the largest free granules, [0, 2), is unmapped and the growth
  // tried again.
  Block* d = f.alloc(4 * MiB);
  ASSERT_NE(d, nullptr);
  EXPECT_EQ(d->handle, ha + 4 * MiB);
  EXPECT_EQ(f.stats().oom_retries, 1u);
  EXPECT_EQ(f.dev->unmaps, 1u);
  EXPECT_FALSE(f.dev->mapped.count(ha));
  EXPECT_EQ(f.dev->used, 6 * MiB);
  EXPECT_EQ(f.stats().managed_bytes, f.dev->mapped_bytes());
  f.pool.free(b);
  f.pool.free(d);
}

TEST(Ranges, CapUnmapsTheOldestFreeGranules) {
  static std::uint64_t t = 0;
  Fixture f({.max_held = 5 * MiB}, {.clock = [] { return ++t; }});
  Block* a = f.alloc(4 * MiB);
  Block* keep = f.alloc(MiB);  // between them: a's and b's pieces do not merge
  Block* b = f.alloc(4 * MiB);
  f.pool.free(a);
  EXPECT_EQ(f.dev->unmaps, 0u);
  f.pool.free(b);  // held over the cap: a's granules (the oldest) go
  EXPECT_EQ(f.dev->unmaps, 1u);
  EXPECT_EQ(f.stats().trims, 1u);
  EXPECT_LE(f.stats().held_bytes, 5 * MiB);
  f.pool.free(keep);
}

TEST(Ranges, IdleGranulesAreUnmappedAfterTheirTime) {
  static std::uint64_t t = 0;
  Fixture f({}, {.release_after_ns = 100, .clock = [] { return t; }});
  t = 1000;
  Block* a = f.alloc(4 * MiB);
  Block* keep = f.alloc(MiB);
  f.pool.free(a);
  EXPECT_EQ(f.pool.trim_idle(1099), 0u);
  EXPECT_EQ(f.pool.trim_idle(1100), 1u);
  EXPECT_EQ(f.dev->mapped_bytes(), 2 * MiB);  // keep's granule
  EXPECT_EQ(f.stats().trims, 1u);
  f.pool.free(keep);
}

// A growth looks at the free pieces twice: for one that fits, then for
// those beside the unmapped pieces it could map. A piece whose fence
// passes in between (other threads' waits end at any time) fits alone at
// the second look: it is handed out, and nothing is mapped for it (the
// driver refuses a mapping of no bytes, and mapping the rest beside it
// would take memory for nothing). Each run lets the device finish at a
// different look of the pool's.
TEST(Ranges, APieceThatBecomesReadyDuringAGrowthIsHandedOutWithoutMapping) {
  for (std::uint64_t ask = 1; ask <= 12; ++ask) {
    SCOPED_TRACE(ask);
    Fixture f({.pending_growth = 1024 * MiB});
    f.dev->fences = true;
    Block* big = f.alloc(128 * MiB);  // in use: the share lets 8 MiB wait
    Handle a = 0;
    std::thread other([&] {  // parked in its own slot, pending
      Block* x = f.alloc(4 * MiB);
      a = x->handle;
      f.pool.free(x);
    });
    other.join();
    const std::size_t mapped = f.dev->mapped_bytes();
    f.dev->complete_on_ask = ask;
    Block* b = f.alloc(4 * MiB);
    ASSERT_NE(b, nullptr);
    EXPECT_LE(f.dev->mapped_bytes(), mapped + 4 * MiB);
    if (f.dev->mapped_bytes() == mapped) {
      EXPECT_EQ(b->handle, a);
    }
    f.pool.free(b);
    f.pool.free(big);
  }
}

// Idle release takes back only parked pieces old enough to go: its
// periodic look does not empty the parks of pieces freed a moment ago.
TEST(Ranges, IdleReleaseLeavesYoungParkedPiecesParked) {
  static std::uint64_t t = 0;
  Fixture f({}, {.release_after_ns = 100, .clock = [] { return t; }});
  t = 1000;
  Block* a = f.alloc(2 * MiB);
  Block* b = f.alloc(2 * MiB);
  Block* keep = f.alloc(MiB);
  f.pool.free(a);
  t = 1050;
  f.pool.free(b);
  EXPECT_EQ(f.pool.trim_idle(1099), 0u);
  EXPECT_EQ(f.stats().held_blocks, 3u);   // a and b parked, keep's granule's rest
  EXPECT_EQ(f.pool.trim_idle(1100), 1u);  // a only
  EXPECT_EQ(f.stats().held_blocks, 2u);
  EXPECT_EQ(f.dev->mapped_bytes(), 4 * MiB);
  EXPECT_EQ(f.pool.trim_idle(1150), 1u);
  EXPECT_EQ(f.dev->mapped_bytes(), 2 * MiB);  // keep's granule
  f.pool.free(keep);
}

TEST(Ranges, RetiredArenaDropsItsGranulesAndRange) {
  Fixture f;
  Block* a = f.alloc(4 * MiB);
  Block* b = f.alloc(4 * MiB);
  f.pool.free(a);
  f.pool.retire_arena(f.arena);  // the driver freed the memory
  f.pool.free(b);                // forgotten: nothing unmapped, the range dropped
  EXPECT_EQ(f.dev->unmaps, 0u);
  EXPECT_EQ(f.dev->unreserves, 0u);
  EXPECT_TRUE(f.dev->ranges.empty());
  EXPECT_EQ(f.pool.arena_count(), 0u);
  EXPECT_EQ(f.pool.totals().managed_bytes, 0u);
}

TEST(Ranges, WithoutGranulesTheArenaSplitsDriverAllocations) {
  Fixture f({}, {}, /*granule=*/0);
  Block* a = f.alloc(4 * MiB);
  EXPECT_EQ(f.dev->allocs, 1u);
  EXPECT_EQ(f.dev->reserves, 0u);
  EXPECT_EQ(f.arena->ranges(), nullptr);
  EXPECT_NE(f.arena->segments(), nullptr);
  f.pool.free(a);
}

TEST(Ranges, WithoutARangeRequestsTakeBlocksOfTheirBins) {
  Fixture f;
  f.dev->fail_reserve = true;
  Block* a = f.alloc(3 * MiB);
  EXPECT_FALSE(a->split);
  EXPECT_EQ(f.dev->allocs, 1u);
  Block* b = f.alloc(3 * MiB);  // no second try at reserving
  EXPECT_EQ(f.dev->allocs, 2u);
  f.pool.free(a);
  f.pool.free(b);
}

// Safe reuse: a pending best fit is waited for, rather than a larger ready
// piece cut.
TEST(Ranges, APendingBestFitIsWaitedFor) {
  Fixture f({.pending_growth = 64 * MiB});
  f.dev->fences = true;
  f.dev->wait_cost = 700;
  Block* small = f.alloc(2 * MiB);
  Block* sep = f.alloc(2 * MiB);  // so that the two do not merge
  Block* big = f.alloc(16 * MiB);
  const Handle hsmall = small->handle;
  f.pool.free(big);
  f.dev->completed = f.dev->issued;  // big ready
  f.pool.free(small);                // small pending
  Block* s = f.alloc(2 * MiB);
  EXPECT_EQ(s->handle, hsmall);
  EXPECT_EQ(f.dev->waits, 1u);
  EXPECT_EQ(f.stats().fence_waits, 1u);
  EXPECT_EQ(f.stats().fence_wait_ns, 700u) << "the time the program spent waiting";
  // A ready best fit is taken at once.
  f.pool.free(s);
  f.dev->completed = f.dev->issued;
  Block* t = f.alloc(2 * MiB);
  EXPECT_EQ(t->handle, hsmall);
  EXPECT_EQ(f.dev->waits, 1u);
  f.pool.free(t);
  f.pool.free(sep);
}
// Safe reuse: when only pending pieces would serve, new granules are mapped
// while the pending pieces hold at most a sixteenth of what is mapped (and
// pending_growth); past that the pool waits.
TEST(Ranges, OnlyPendingPiecesWouldServeMapsMoreWithinTheBound) {
  Fixture f({.pending_growth = 64 * MiB});
  f.dev->fences = true;
  Block* big = f.alloc(62 * MiB);  // 64 MiB mapped with the next
  Block* a = f.alloc(2 * MiB);
  const Handle ha = a->handle;
  f.pool.free(a);  // 2 MiB pending: 2 + 2 <= 66 / 16
  Block* b = f.alloc(2 * MiB);
  EXPECT_EQ(f.dev->waits, 0u);
  EXPECT_NE(b->handle, ha);
  EXPECT_EQ(f.dev->mapped_bytes(), 66 * MiB);
  Block* c = f.alloc(4 * MiB);
  f.pool.free(c);  // 6 MiB pending: 6 + 2 > 70 / 16
  Block* d = f.alloc(2 * MiB);
  EXPECT_EQ(f.dev->waits, 1u);
  EXPECT_EQ(d->handle, ha);
  EXPECT_EQ(f.dev->mapped_bytes(), 70 * MiB);
  f.pool.free(d);
  f.pool.free(b);
  f.pool.free(big);
}

TEST(Ranges, WithoutAGrowthBudgetPendingPiecesAreWaitedFor) {
  Fixture f;
  f.dev->fences = true;
  Block* big = f.alloc(62 * MiB);
  Block* a = f.alloc(2 * MiB);
  const Handle ha = a->handle;
  f.pool.free(a);
  Block* b = f.alloc(2 * MiB);
  EXPECT_EQ(f.dev->waits, 1u);
  EXPECT_EQ(b->handle, ha);
  f.pool.free(b);
  f.pool.free(big);
}

// The stock (Shard's header). A loop that frees a piece and at once asks
// for its size again waits for the device at every pair: the pieces it
// frees all wait, and the range has nothing else. Once its waits come back
// to back, its slot takes new pieces rather than wait, up to a stock of
// kParkSlots parked, and waits for the oldest only when the stock is
// full; a wait that synchronizes the device readies all of them.
constexpr int kPairs = 320;
constexpr std::size_t kLoop = 4 * MiB;

TEST(Ranges, BackToBackWaitsForOneSizeGrowAStockThatOneWaitReadies) {
  Fixture f({.pending_growth = 64 * MiB}, {.shards = 2});  // 32 MiB a slot
  f.dev->fences = true;
  f.dev->whole_waits = true;
  f.dev->wait_cost = 1'000;
  for (int i = 0; i < kPairs; ++i) f.pool.free(f.alloc(kLoop));
  // 32 waits in a row, then one for every 8 pairs; every pair without it.
  EXPECT_LE(f.dev->waits, 32u + kPairs / 8 + 2);
  EXPECT_GE(f.dev->waits, 32u + kPairs / 9);
  EXPECT_EQ(f.stats().fence_waits, f.dev->waits);
  EXPECT_EQ(f.dev->mapped_bytes(), 8 * kLoop);  // all parked once the last is freed
  EXPECT_EQ(f.stats().held_bytes, 8 * kLoop);
  EXPECT_EQ(f.stats().stock_growths, 7u);
  f.pool.free_held();
  EXPECT_EQ(f.dev->mapped_bytes(), 0u);
}

// A stock is a queue: its pieces were freed one after another and the
// device finishes them in that order, so each request takes the oldest
// ready one, and the loop goes round its pieces in turn (a scan from the
// newest passed the pending ones at every pair: 87 against 114 ns a pair
// in bench_pool's model).
TEST(Ranges, AStockHandsOutItsPiecesInTurn) {
  Fixture f({.pending_growth = 64 * MiB}, {.shards = 2});  // 8 pieces a slot
  f.dev->fences = true;
  f.dev->whole_waits = true;
  f.dev->wait_cost = 1'000;
  std::vector<Handle> got;
  for (int i = 0; i < kPairs; ++i) {
    Block* b = f.alloc(kLoop);
    got.push_back(b->handle);
    f.pool.free(b);
  }
  ASSERT_EQ(f.stats().stock_growths, 7u);
  for (int i = kPairs - 64; i < kPairs; ++i)
    EXPECT_EQ(got[i], got[i - 8]) << "pair " << i << " did not take the oldest piece";
}

TEST(Ranges, WaitsWithTheProgramsOwnWorkBetweenThemGrowNoStock) {
  Fixture f({.pending_growth = 64 * MiB}, {.shards = 2});
  f.dev->fences = true;
  f.dev->whole_waits = true;
  f.dev->wait_cost = 1'000;
  for (int i = 0; i < kPairs; ++i) {
    f.pool.free(f.alloc(kLoop));
    gpupool::testing::g_cost_ns += 20'000;  // a kernel launched, say
  }
  EXPECT_EQ(f.dev->waits, std::uint64_t(kPairs) - 1);
  EXPECT_EQ(f.dev->mapped_bytes(), kLoop);
  EXPECT_EQ(f.stats().stock_growths, 0u);
}

TEST(Ranges, AStockHoldsAtMostItsSlotsShareOfPendingGrowth) {
  Fixture f({.pending_growth = 16 * MiB}, {.shards = 2});  // 8 MiB a slot
  f.dev->fences = true;
  f.dev->whole_waits = true;
  for (int i = 0; i < kPairs; ++i) f.pool.free(f.alloc(kLoop));
  EXPECT_EQ(f.dev->mapped_bytes(), 2 * kLoop);
  EXPECT_LE(f.dev->waits, 32u + kPairs / 2 + 2);
  // Several pieces of the size in use at once, then freed: the stock
  // still maps at most the share beyond what the program uses.
  std::size_t most_mapped = 0;
  for (int round = 0; round < 50; ++round) {
    std::vector<Block*> in_use;
    for (int i = 0; i < 7; ++i) in_use.push_back(f.alloc(kLoop));
    most_mapped = std::max(most_mapped, f.dev->mapped_bytes());
    for (Block* b : in_use) f.pool.free(b);
  }
  EXPECT_LE(most_mapped, 7 * kLoop + 8 * MiB);
}

// A slot without a share of the growth budget that holds a piece never
// stocks: its pieces go back to the range, where other threads' requests
// wait for them rather than map more.
TEST(Ranges, WithoutAGrowthBudgetNoSlotStocks) {
  Fixture f({.pending_growth = 0}, {.shards = 2});
  f.dev->fences = true;
  f.dev->whole_waits = true;
  for (int i = 0; i < kPairs; ++i) f.pool.free(f.alloc(kLoop));
  EXPECT_EQ(f.dev->waits, std::uint64_t(kPairs) - 1);
  EXPECT_EQ(f.dev->mapped_bytes(), kLoop);
  const std::uint64_t waits = f.dev->waits;
  Block* b = nullptr;
  std::thread other([&] { b = f.alloc(kLoop); });
  other.join();
  EXPECT_EQ(f.dev->mapped_bytes(), kLoop);
  EXPECT_EQ(f.dev->waits, waits + 1);
  f.pool.free(b);
}

// A wait that readies nothing (the device's synchronizations fail: a
// sticky error) is made once for a full stock; the range's path then
// serves the request with new granules.
TEST(Ranges, AWaitThatReadiesNothingLeavesAFullStockToTheRange) {
  Fixture f({.pending_growth = 64 * MiB}, {.shards = 2});
  f.dev->fences = true;
  for (int i = 0; i < kPairs; ++i) f.pool.free(f.alloc(kLoop));
  EXPECT_EQ(f.dev->mapped_bytes(), 8 * kLoop);
  f.dev->stuck = true;
  const std::uint64_t waits = f.dev->waits;
  AllocResult r = f.pool.allocate(f.arena, kLoop);
  ASSERT_EQ(r.status, BackendStatus::ok);
  EXPECT_LE(f.dev->waits, waits + 3);
  EXPECT_EQ(f.dev->mapped_bytes(), 9 * kLoop);
  f.dev->stuck = false;
  f.pool.free(r.block);
}

// A stock is held memory as any parked piece: every release policy takes it.
namespace {
// 320 back-to-back pairs of kLoop on `f`: a stock of 8 pieces, all parked.
void grow_stock(Fixture& f) {
  f.dev->fences = true;
  f.dev->whole_waits = true;
  for (int i = 0; i < kPairs; ++i) f.pool.free(f.alloc(kLoop));
  ASSERT_EQ(f.stats().stock_growths, 7u);
}
unsigned parked_pieces(Fixture& f) {
  unsigned n = 0;
  for (unsigned i = 0; i < 2; ++i) {
    core_detail::Shard& s = f.arena->binned().shard(i);
    LockGuard lock(s.mu);
    n += s.parked_n;
  }
  return n;
}
}  // namespace

TEST(Ranges, StopHoldingTakesAStock) {
  Fixture f({.pending_growth = 64 * MiB}, {.shards = 2});
  grow_stock(f);
  f.pool.stop_holding();
  EXPECT_EQ(f.dev->mapped_bytes(), 0u);
  EXPECT_EQ(f.stats().held_bytes, 0u);
}

TEST(Ranges, OutOfMemoryTakesAStock) {
  Fixture f({.pending_growth = 64 * MiB}, {.shards = 2});
  grow_stock(f);
  f.dev->capacity = 9 * kLoop;
  AllocResult r = f.pool.allocate(f.arena, 6 * kLoop);  // the stock's memory, or none
  ASSERT_EQ(r.status, BackendStatus::ok);
  EXPECT_GE(f.stats().oom_retries, 1u);
  EXPECT_LE(f.dev->mapped_bytes(), 9 * kLoop);
  f.pool.free(r.block);
}

TEST(Ranges, IdleReleaseTakesAStock) {
  static std::uint64_t t = 0;
  Fixture f({.pending_growth = 64 * MiB},
            {.release_after_ns = 100, .shards = 2, .clock = [] { return t; }});
  t = 1000;
  grow_stock(f);
  EXPECT_EQ(f.pool.trim_idle(1099), 0u);
  EXPECT_GT(f.pool.trim_idle(1100), 0u);
  EXPECT_EQ(f.dev->mapped_bytes(), 0u);
  EXPECT_EQ(parked_pieces(f), 0u);
}

TEST(Ranges, APieceOnItsWayToDyingTakesAStockIntoTheRange) {
  Fixture f({.pending_growth = 64 * MiB}, {.shards = 2});
  Block* shared = f.alloc(kLoop);
  grow_stock(f);
  EXPECT_EQ(parked_pieces(f), 8u);  // the newest pending
  f.pool.never_reuse(shared);       // exported (cuIpcGetMemHandle)
  f.pool.free(shared);
  EXPECT_EQ(parked_pieces(f), 0u);
  EXPECT_LE(f.dev->mapped_bytes(), 8 * kLoop);  // the shared piece's granules gone
}

// With waits for one fence only (marks), a full stock's wait is for its
// oldest piece: the work queued after that piece's free is not waited for.
TEST(Ranges, AFullStocksWaitIsForItsOldestPiece) {
  Fixture f({.pending_growth = 64 * MiB}, {.shards = 2});
  f.dev->fences = true;
  for (int i = 0; i < kPairs; ++i) f.pool.free(f.alloc(kLoop));
  EXPECT_EQ(f.dev->mapped_bytes(), 8 * kLoop);
  const std::uint64_t waits = f.dev->waits;
  Block* b = f.alloc(kLoop);
  EXPECT_EQ(f.dev->waits, waits + 1);
  EXPECT_EQ(f.dev->completed, f.dev->issued - 7);  // seven parked pieces still wait
  f.pool.free(b);
}

// Granules the device may still use are unmapped only once it is done.
TEST(Ranges, UnmappingPendingGranulesWaitsForTheirFence) {
  Fixture f;
  f.dev->fences = true;
  Block* a = f.alloc(4 * MiB);
  f.pool.free(a);
  f.pool.free_held();
  EXPECT_EQ(f.dev->unmaps, 1u);
  EXPECT_EQ(f.dev->unmap_waits, 1u);
  // Ready ones need no wait.
  Block* b = f.alloc(4 * MiB);
  f.pool.free(b);
  f.dev->completed = f.dev->issued;
  f.pool.free_held();
  EXPECT_EQ(f.dev->unmaps, 2u);
  EXPECT_EQ(f.dev->unmap_waits, 1u);
}

// A piece the program shared with another process (cuIpcGetMemHandle:
// Pool::never_reuse) is never handed out again once freed: the granules
// only it covers are unmapped at its free, the ones it shares with pieces
// in use once those are freed too; its address space then serves with new
// memory.
TEST(Ranges, ASharedPieceIsNeverReusedAndGoesOnceNothingInUseSharesItsGranules) {
  Fixture f;
  Block* x = f.alloc(MiB);      // [0, 1) in granule [0, 2)
  Block* y = f.alloc(5 * MiB);  // [1, 6)
  Block* z = f.alloc(MiB);      // [6, 7), granule [6, 8) mapped
  const Handle base = x->handle, hy = y->handle;
  EXPECT_EQ(f.dev->mapped_bytes(), 8 * MiB);
  f.pool.never_reuse(y);
  f.pool.free(y);
  // [2, 6) only y covered: unmapped; [1, 2) shares x's granule.
  EXPECT_EQ(f.dev->mapped_bytes(), 4 * MiB);
  EXPECT_EQ(f.dev->mapped.count(base), 1u);
  EXPECT_EQ(f.dev->mapped.count(base + 2 * MiB), 0u);
  Stats s = f.stats();
  EXPECT_EQ(s.managed_bytes, 4 * MiB);
  EXPECT_EQ(s.held_bytes, MiB);  // [7, 8): the dead [1, 2) is not held
  EXPECT_EQ(s.backend_frees, 1u);
  // y's bytes in x's granule are not handed out: 1 MiB comes from [7, 8).
  AllocResult r = f.pool.allocate(f.arena, MiB);
  EXPECT_EQ(r.block->handle, base + 7 * MiB);
  f.pool.free_held();  // nothing free is a whole granule; the dead part stays
  EXPECT_EQ(f.dev->mapped.count(base), 1u);
  // x freed: nothing in use shares [0, 2) any more.
  f.pool.free(x);
  EXPECT_EQ(f.dev->mapped.count(base), 0u);
  EXPECT_EQ(f.dev->mapped_bytes(), 2 * MiB);
  EXPECT_EQ(f.stats().managed_bytes, 2 * MiB);
  EXPECT_EQ(f.stats().held_bytes, 0u);
  // The address space serves again, with memory mapped anew.
  Block* w = f.alloc(6 * MiB);
  EXPECT_EQ(w->handle, base);
  EXPECT_LE(w->handle, hy);
  EXPECT_EQ(f.dev->generation[base], 2u);
  EXPECT_EQ(f.dev->generation[base + 2 * MiB], 2u);
  f.pool.free(w);
  f.pool.free(z);
  f.pool.free(r.block);
  f.pool.free_held();
  EXPECT_EQ(f.dev->mapped_bytes(), 0u);
  EXPECT_EQ(f.stats().managed_bytes, 0u);
}

// Random programs: every active piece lies in the range and overlaps no
// other, every byte of it mapped; what is mapped is what the stats say is
// managed, and held is mapped less active; once everything is freed,
// free_held unmaps all of it.
TEST(Ranges, RandomProgramsKeepPiecesDisjointMappedAndAccountsExact) {
  for (unsigned seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 rng(seed);
    Fixture f({.pending_growth = (seed % 3) * 8 * MiB}, {}, (seed % 2 ? 1 : 3) * G);
    f.dev->fences = seed % 2;
    f.dev->capacity = (seed % 5 == 0) ? 64 * MiB : SIZE_MAX;
    std::vector<Block*> live;
    // Pieces shared with another process and freed: the granules they
    // touched, and each one's mapping then. Their bytes may serve again
    // only from a granule mapped anew.
    struct Shared {
      Handle at;
      std::size_t size;
      std::map<Handle, std::uint64_t> generation;
    };
    std::vector<Shared> shared;
    const std::size_t g = f.dev->granule;
    for (int step = 0; step < 300; ++step) {
      if (!live.empty() && rng() % 3 == 0) {
        std::size_t i = rng() % live.size();
        Block* b = live[i];
        if (b->split && rng() % 4 == 0) {
          f.pool.never_reuse(b);
          Shared sh{b->handle, b->size, {}};
          for (Handle p = b->handle / g * g; p < b->handle + b->size; p += g)
            sh.generation[p] = f.dev->generation[p];
          shared.push_back(sh);
        }
        f.pool.free(b);
        live.erase(live.begin() + std::ptrdiff_t(i));
      } else {
        // One in eight large enough to be cut from a piece's end.
        const std::size_t n =
            rng() % 8 == 0 ? 64 * MiB + rng() % (16 * MiB) : MiB + rng() % (9 * MiB);
        AllocResult r = f.pool.allocate(f.arena, n);
        if (r.status == BackendStatus::out_of_memory) continue;
        ASSERT_EQ(r.status, BackendStatus::ok) << seed;
        live.push_back(r.block);
        const Handle h = r.block->handle;
        for (const Shared& sh : shared) {
          const Handle from = std::max(h, sh.at), to = std::min(h + n, sh.at + sh.size);
          for (Handle p = from / g * g; from < to && p < to; p += g)
            ASSERT_NE(f.dev->generation[p], sh.generation.at(p)) << seed << " step " << step;
        }
      }
      if (rng() % 16 == 0) f.dev->completed = f.dev->issued;
      if (rng() % 64 == 0) f.pool.free_held();
      std::map<Handle, std::size_t> pieces;
      std::size_t active = 0;
      for (Block* b : live)
        if (b->split) pieces[b->handle] = b->size, active += b->size;
      Handle end = 0;
      for (auto [h, n] : pieces) {
        ASSERT_GE(h, end) << seed;
        end = h + n;
        for (Handle p = h / g * g; p < h + n; p += g) ASSERT_TRUE(f.dev->mapped.count(p)) << seed;
      }
      const Stats s = f.stats();
      std::size_t binned = 0;
      for (Block* b : live)
        if (!b->split) binned += b->size;
      ASSERT_EQ(s.managed_bytes, f.dev->mapped_bytes() + binned) << seed;
      // Mapped and neither held nor in use: exactly the shared pieces'
      // bytes whose granules still have the mapping they had then.
      std::size_t dead = 0;
      for (const Shared& sh : shared)
        for (const auto& [p, gen] : sh.generation)
          if (f.dev->mapped.count(p) && f.dev->generation[p] == gen)
            dead += std::min(p + g, sh.at + sh.size) - std::max(p, sh.at);
      ASSERT_EQ(s.held_bytes + active + dead, f.dev->mapped_bytes()) << seed << " step " << step;
    }
    for (Block* b : live) f.pool.free(b);
    f.pool.free_held();
    EXPECT_EQ(f.dev->mapped_bytes(), 0u) << seed;
    EXPECT_EQ(f.stats().managed_bytes, 0u) << seed;
    EXPECT_EQ(f.stats().held_bytes, 0u) << seed;
  }
}
