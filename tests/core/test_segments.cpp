// Segments (ArenaOptions::split_min): large requests served by pieces of
// shared backend allocations, as a program sees them and as the backend is
// asked.
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <vector>

#include "core/pool.hpp"
#include "pool_fixture.hpp"

using namespace gpupool;
using gpupool::testing::FakeBackend;
using gpupool::testing::FakeDevice;

namespace {

constexpr std::size_t MiB = std::size_t{1} << 20;

// Splitting from 1 MiB unless ao says otherwise; arena options first, as
// most of these tests set them.
struct Fixture : gpupool::testing::PoolFixture {
  explicit Fixture(ArenaOptions ao = {}, PoolOptions po = {}) : PoolFixture(po, split(ao)) {}
  static ArenaOptions split(ArenaOptions ao) {
    if (!ao.split_min) ao.split_min = MiB;
    return ao;
  }
};

}  // namespace

TEST(Segments, ARequestTakesWholeSegmentGranulesAndTheRestServesTheNext) {
  Fixture f;
  Block* a = f.alloc(5 * MiB);  // a 6 MiB segment: 5 MiB used, 1 MiB free
  EXPECT_EQ(f.dev->allocs, 1u);
  EXPECT_EQ(f.dev->live.at(a->handle), 6 * MiB);
  EXPECT_EQ(a->size, 5 * MiB);
  EXPECT_TRUE(a->split);
  Stats s = f.arena->stats();
  EXPECT_EQ(s.managed_bytes, 6 * MiB);
  EXPECT_EQ(s.held_bytes, MiB);
  EXPECT_EQ(s.active_bytes, 5 * MiB);
  AllocResult r = f.pool.allocate(f.arena, MiB);
  EXPECT_TRUE(r.hit);
  EXPECT_EQ(r.block->handle, a->handle + 5 * MiB);
  EXPECT_EQ(f.dev->allocs, 1u);
  // A rest under split_min goes with the piece: 3 MiB + 1 (3 MiB + 512 in
  // pieces) takes a 4 MiB segment whole.
  Block* b = f.alloc(3 * MiB + 1);
  EXPECT_EQ(b->size, 4 * MiB);
  EXPECT_EQ(f.arena->stats().held_bytes, 0u);
  f.pool.free(a);
  f.pool.free(r.block);
  f.pool.free(b);
}

TEST(Segments, MemoryFreedByOnePhaseServesTheSizesOfTheNext) {
  Fixture f;
  std::vector<Block*> phase1;
  for (int i = 0; i < 4; ++i) phase1.push_back(f.alloc(8 * MiB));
  for (Block* b : phase1) f.pool.free(b);
  const std::uint64_t allocs = f.dev->allocs;
  // Sizes the first phase never asked for, in its memory.
  std::vector<Block*> phase2;
  for (int i = 0; i < 8; ++i) {  // two in each 8 MiB segment
    AllocResult r = f.pool.allocate(f.arena, 3 * MiB);
    EXPECT_TRUE(r.hit) << i;
    phase2.push_back(r.block);
  }
  EXPECT_EQ(f.dev->allocs, allocs);
  EXPECT_EQ(f.arena->stats().managed_bytes, 32 * MiB);
  // Pieces never overlap.
  std::map<Handle, std::size_t> seen;
  for (Block* b : phase2) seen[b->handle] = b->size;
  Handle end = 0;
  for (auto [h, n] : seen) {
    EXPECT_GE(h, end);
    end = h + n;
  }
  for (Block* b : phase2) f.pool.free(b);
}

TEST(Segments, FreedNeighboursMergeAndOnlyWholeSegmentsGoBack) {
  Fixture f;
  f.pool.free(f.alloc(4 * MiB));
  // The 4 MiB segment carved in three.
  Block* x = f.alloc(MiB);
  Block* y = f.alloc(MiB);
  Block* z = f.alloc(2 * MiB);
  EXPECT_EQ(y->handle, x->handle + MiB);
  EXPECT_EQ(z->handle, x->handle + 2 * MiB);
  EXPECT_EQ(f.dev->allocs, 1u);
  f.pool.free(f.alloc(2 * MiB));  // a second segment, wholly free
  // x and z free, y between them in use: free_held releases only the
  // whole segment.
  f.pool.free(x);
  f.pool.free(z);
  f.pool.free_held();
  EXPECT_EQ(f.dev->releases, 1u);
  EXPECT_EQ(f.dev->live.size(), 1u);
  Stats s = f.arena->stats();
  EXPECT_EQ(s.managed_bytes, 4 * MiB);
  EXPECT_EQ(s.held_bytes, 3 * MiB);
  EXPECT_EQ(s.held_blocks, 2u);
  // y's free merges all three: the segment is whole and goes back.
  f.pool.free(y);
  EXPECT_EQ(f.arena->stats().held_blocks, 1u);
  f.pool.free_held();
  EXPECT_TRUE(f.dev->live.empty());
  s = f.arena->stats();
  EXPECT_EQ(s.managed_bytes, 0u);
  EXPECT_EQ(s.held_bytes, 0u);
  EXPECT_EQ(s.backend_frees, 2u);
}

TEST(Segments, SmallerRequestsStayInBins) {
  Fixture f;
  Block* a = f.alloc(MiB - 1);
  EXPECT_FALSE(a->split);
  EXPECT_EQ(f.dev->live.at(a->handle), MiB);  // its bin's size, not a segment
  f.pool.free(a);
}

TEST(Segments, StopHoldingReleasesASegmentOnceWhole) {
  Fixture f;
  Block* a = f.alloc(MiB);
  Block* b = f.alloc(MiB);
  f.pool.stop_holding();
  f.pool.free(a);
  EXPECT_EQ(f.dev->releases, 0u);  // b still uses the segment
  f.pool.free(b);
  EXPECT_EQ(f.dev->releases, 1u);
  EXPECT_TRUE(f.dev->live.empty());
  EXPECT_EQ(f.arena->stats().held_bytes, 0u);
}

TEST(Segments, OutOfMemoryReleasesWholeFreeSegmentsAndRetries) {
  Fixture f;
  f.dev->capacity = 8 * MiB;
  Block* a = f.alloc(4 * MiB);
  Block* b = f.alloc(4 * MiB);
  f.pool.free(a);
  f.pool.free(b);
  // 6 MiB fits neither free 4 MiB segment: they go back one at a time
  // until it fits.
  Block* c = f.alloc(6 * MiB);
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(f.dev->releases, 2u);
  EXPECT_EQ(f.arena->stats().oom_retries, 2u);
  f.pool.free(c);
}

TEST(Segments, PendingPiecesAreNotReusedUntilTheirFencePasses) {
  Fixture f;
  f.dev->fences = true;
  f.dev->wait_cost = 300;
  Block* a = f.alloc(4 * MiB);
  const Handle h = a->handle;
  f.pool.free(a);  // pending; no growth budget: the request waits
  AllocResult r = f.pool.allocate(f.arena, 2 * MiB);
  EXPECT_TRUE(r.hit);
  EXPECT_EQ(r.block->handle, h);
  EXPECT_EQ(f.dev->waits, 1u);
  EXPECT_EQ(f.arena->stats().fence_waits, 1u);
  EXPECT_EQ(f.arena->stats().fence_wait_ns, 300u);
  f.pool.free(r.block);
}

// Splitting is for taking less memory: pending pieces are waited for, never
// grown past, whatever the growth budget of the binned sizes.
TEST(Segments, PendingPiecesAreWaitedForNotGrownPast) {
  Fixture f({.pending_growth = 64 * MiB});
  f.dev->fences = true;
  f.pool.free(f.alloc(4 * MiB));
  Block* b = f.alloc(4 * MiB);
  EXPECT_EQ(f.dev->waits, 1u);
  EXPECT_EQ(f.dev->allocs, 1u);
  f.pool.free(b);
}

// A ready piece much larger than the best fit is not cut up while the best
// fit waits for the device.
TEST(Segments, ThePendingBestFitIsWaitedForRatherThanALargeReadyPieceCut) {
  Fixture f;
  f.dev->fences = true;
  Block* big = f.alloc(16 * MiB);
  Block* small = f.alloc(2 * MiB);
  const Handle hbig = big->handle, hsmall = small->handle;
  f.pool.free(big);
  f.dev->completed = f.dev->issued;  // the 16 MiB piece ready
  f.pool.free(small);                // the 2 MiB one pending
  AllocResult r = f.pool.allocate(f.arena, 2 * MiB);
  EXPECT_EQ(r.block->handle, hsmall);
  EXPECT_EQ(f.dev->waits, 1u);
  // A ready best fit is taken at once.
  f.pool.free(r.block);
  AllocResult q = f.pool.allocate(f.arena, 15 * MiB);
  EXPECT_EQ(q.block->handle, hbig);
  EXPECT_EQ(f.dev->waits, 1u);
  f.pool.free(q.block);
}

TEST(Segments, IdleWholeSegmentsAreReleasedAfterTheirTime) {
  static std::uint64_t t = 0;
  Fixture f({}, {.release_after_ns = 100, .clock = [] { return t; }});
  t = 1000;
  Block* a = f.alloc(2 * MiB);
  Block* b = f.alloc(2 * MiB);
  f.pool.free(a);
  t = 1050;
  f.pool.free(b);
  EXPECT_EQ(f.pool.trim_idle(1099), 0u);
  EXPECT_EQ(f.pool.trim_idle(1100), 1u);
  EXPECT_EQ(f.pool.trim_idle(1150), 1u);
  EXPECT_EQ(f.arena->stats().trims, 2u);
  EXPECT_TRUE(f.dev->live.empty());
}

TEST(Segments, CapReleasesWholeFreeSegments) {
  static std::uint64_t t = 0;
  Fixture f({.max_held = 5 * MiB}, {.clock = [] { return ++t; }});
  Block* a = f.alloc(4 * MiB);
  Block* b = f.alloc(4 * MiB);
  const Handle ha = a->handle;
  f.pool.free(a);
  f.pool.free(b);  // 8 MiB held > 5: the oldest segment (a's) goes
  EXPECT_FALSE(f.dev->live.count(ha));
  EXPECT_EQ(f.dev->live.size(), 1u);
  EXPECT_EQ(f.arena->stats().trims, 1u);
}

TEST(Segments, RetiredArenaDropsSegmentsOnceTheirPiecesAreForgotten) {
  Fixture f;
  Block* a = f.alloc(MiB);
  Block* b = f.alloc(MiB);
  f.pool.free(a);
  f.pool.retire_arena(f.arena);  // the driver freed the memory
  f.pool.free(b);                // forgotten: no release
  EXPECT_EQ(f.dev->releases, 0u);
  EXPECT_EQ(f.pool.arena_count(), 0u);
  EXPECT_EQ(f.pool.totals().managed_bytes, 0u);
}

// Random programs: every active piece lies in a live backend allocation and
// overlaps no other; what the backend holds is what the stats say; and once
// everything is freed, free_held gives all of it back.
TEST(Segments, RandomProgramsKeepPiecesDisjointAndAccountsExact) {
  for (unsigned seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 rng(seed);
    Fixture f({.pending_growth = (seed % 3) * 8 * MiB});
    f.dev->fences = seed % 2;
    f.dev->capacity = 96 * MiB;
    std::vector<Block*> live;
    std::map<Handle, Block*> by_address;
    for (int step = 0; step < 400; ++step) {
      const unsigned op = rng() % 10;
      if (op < 5) {
        const std::size_t n = MiB + rng() % (9 * MiB);
        AllocResult r = f.pool.allocate(f.arena, n);
        if (!r.block) {
          ASSERT_EQ(r.status, BackendStatus::out_of_memory);
          continue;
        }
        ASSERT_GE(r.block->size, n);
        live.push_back(r.block);
        by_address[r.block->handle] = r.block;
      } else if (op < 9 && !live.empty()) {
        const std::size_t k = rng() % live.size();
        by_address.erase(live[k]->handle);
        f.pool.free(live[k]);
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      } else if (op == 9) {
        if (rng() % 4 == 0) f.pool.free_held();
        f.dev->completed = f.dev->issued;
      }
      // Disjoint, and inside the backend's allocations.
      Handle end = 0;
      std::size_t active = 0;
      for (auto [h, b] : by_address) {
        ASSERT_GE(h, end) << "seed " << seed << " step " << step;
        end = h + b->size;
        auto seg = f.dev->live.upper_bound(h);
        ASSERT_NE(seg, f.dev->live.begin());
        --seg;
        ASSERT_LE(end, seg->first + seg->second) << "seed " << seed;
        active += b->size;
      }
      std::size_t device = 0;
      for (auto [h, n] : f.dev->live) device += n;
      const Stats s = f.arena->stats();
      ASSERT_EQ(s.managed_bytes, device) << "seed " << seed << " step " << step;
      ASSERT_EQ(s.held_bytes + active, device) << "seed " << seed << " step " << step;
      ASSERT_EQ(s.active_blocks, live.size());
    }
    for (Block* b : live) f.pool.free(b);
    f.pool.free_held();
    ASSERT_TRUE(f.dev->live.empty()) << "seed " << seed;
    const Stats s = f.arena->stats();
    ASSERT_EQ(s.held_bytes, 0u);
    ASSERT_EQ(s.held_blocks, 0u);
    ASSERT_EQ(s.backend_allocs, s.backend_frees);
  }
}

// A piece that is its whole segment and must never be reused (another
// process maps it) goes back to the backend at its free, holding or not.
TEST(Segments, APieceNeverToBeReusedIsReleasedAtItsFree) {
  Fixture f;
  Block* a = f.alloc(4 * MiB);
  ASSERT_EQ(f.dev->live.at(a->handle), a->size);  // its segment, whole
  f.pool.never_reuse(a);
  f.pool.free(a);
  EXPECT_EQ(f.dev->releases, 1u);
  EXPECT_TRUE(f.dev->live.empty());
  EXPECT_EQ(f.arena->stats().held_bytes, 0u);
}

// Safe reuse: a freed piece the device may still use does not take a ready
// neighbour's bytes with it (the ready one serves at once), and ready
// neighbours freed apart are merged when a request needs them together.
TEST(Segments, APendingPieceDoesNotHoldBackItsReadyNeighbour) {
  Fixture f;
  f.dev->fences = true;
  f.pool.free(f.alloc(4 * MiB));
  f.dev->completed = f.dev->issued;
  Block* x = f.alloc(2 * MiB);
  Block* y = f.alloc(2 * MiB);
  const Handle hx = x->handle;
  ASSERT_EQ(f.dev->allocs, 1u);
  f.pool.free(x);
  f.dev->completed = f.dev->issued;  // x ready
  f.pool.free(y);                    // y pending
  AllocResult r = f.pool.allocate(f.arena, 2 * MiB);
  EXPECT_TRUE(r.hit);
  EXPECT_EQ(r.block->handle, hx);
  EXPECT_EQ(f.dev->waits, 0u);
  f.pool.free(r.block);
  // Freed apart (one ready, one pending), both ready now: merged for a
  // request that needs the two.
  f.dev->completed = f.dev->issued;
  Block* x2 = f.alloc(2 * MiB);
  f.pool.free(x2);
  f.dev->completed = f.dev->issued;
  r = f.pool.allocate(f.arena, 4 * MiB);
  EXPECT_TRUE(r.hit);
  EXPECT_EQ(r.block->handle, hx);
  EXPECT_EQ(f.dev->allocs, 1u);
  EXPECT_EQ(f.dev->waits, 0u);
  f.pool.free(r.block);
}

// A segment larger than the whole cap goes back at its free rather than
// push every other held block out (as a binned block larger than the cap).
TEST(Segments, ASegmentLargerThanTheCapIsReleasedNotHeld) {
  Fixture f({.max_held = 5 * MiB});
  Block* small = f.alloc(512 << 10);  // binned
  Block* big = f.alloc(8 * MiB);
  f.pool.free(small);
  f.pool.free(big);
  EXPECT_EQ(f.dev->live.size(), 1u);  // the binned block, held
  EXPECT_EQ(f.arena->stats().held_bytes, 512u << 10);
  EXPECT_EQ(f.arena->stats().trims, 0u);
}

// What could be given back: held blocks and wholly free segments, not the
// free pieces of a segment still partly in use.
TEST(Segments, ReleasableBytesLeaveOutPartlyUsedSegments) {
  Fixture f;
  f.pool.free(f.alloc(4 * MiB));
  Block* x = f.alloc(MiB);               // carved from the 4 MiB segment: 3 MiB free in it
  f.pool.free(f.alloc(2 * MiB - 4096));  // a second segment... served by the 3 MiB rest
  Block* s = f.alloc(512 << 10);
  f.pool.free(s);  // a binned block, held
  EXPECT_EQ(f.arena->stats().held_bytes, 3 * MiB + (512u << 10));
  EXPECT_EQ(f.arena->releasable_bytes(), 512u << 10);
  f.pool.free(x);
  EXPECT_EQ(f.arena->releasable_bytes(), 4 * MiB + (512u << 10));
}
