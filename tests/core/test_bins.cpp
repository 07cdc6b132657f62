#include <gtest/gtest.h>

#include <cstdint>

#include "core/bins.hpp"

using gpupool::BinScheme;

// PyOpenCL 2022.3.1's MemoryPool (measured) serves these requests with the
// sizes in the comments; gpupool keeps its bins (exponent and leading bits)
// but serves a bin with its smallest size, so these get exactly what they
// ask for or the next size with leading_bits + 1 significant bits.
TEST(Bins, PyOpenCLsBinsRoundedUpNotToTheirTop) {
  BinScheme b(4);
  auto r = [&](std::size_t s) { return b.alloc_size(b.bin_number(s)); };
  EXPECT_EQ(b.bin_number(0), 0u);
  EXPECT_EQ(r(0), 1u);                     // PyOpenCL: 1
  EXPECT_EQ(r(1), 1u);                     // 1
  EXPECT_EQ(r(15), 15u);                   // 15
  EXPECT_EQ(r(16), 16u);                   // 16
  EXPECT_EQ(r(1000), 1024u);               // 1023
  EXPECT_EQ(r(4096), 4096u);               // 4351
  EXPECT_EQ(r(1u << 30), 1u << 30);        // 1140850687 (1088 MiB)
  EXPECT_EQ(r((1u << 30) - 1), 1u << 30);  // 2^30 - 1
  EXPECT_EQ(BinScheme(2).alloc_size(BinScheme(2).bin_number(1u << 24)), 1u << 24);  // 20971519
  // Same bins as PyOpenCL: sizes PyOpenCL puts together are together here.
  EXPECT_EQ(b.bin_number(4096), b.bin_number(4096));
  EXPECT_NE(b.bin_number(4096), b.bin_number(4097));
}

// Every size with at most leading_bits + 1 significant bits, every power of
// two among them, is served exactly.
TEST(Bins, RepresentableSizesAreExact) {
  for (unsigned lb : {1u, 2u, 4u, 8u}) {
    BinScheme b(lb);
    for (unsigned shift = 0; shift < 64 - lb; ++shift)
      for (std::size_t head = std::size_t{1} << lb; head < (std::size_t{2} << lb); ++head) {
        const std::size_t s = head << shift;
        ASSERT_EQ(b.alloc_size(b.bin_number(s)), s) << "lb=" << lb << " size=" << s;
      }
    for (unsigned e = 0; e < 64; ++e)
      ASSERT_EQ(b.rounded(std::size_t{1} << e), std::size_t{1} << e) << "lb=" << lb;
  }
}

TEST(Bins, EveryBinBoundaryForSeveralBitCounts) {
  for (unsigned lb : {1u, 2u, 3u, 4u, 6u, 8u}) {
    BinScheme b(lb);
    std::size_t prev_top = 0;
    std::size_t prev_bin = 0;
    bool first = true;
    // Walk the bins in size order: a bin holds the sizes above the previous
    // bin's block size up to its own, its block size maps to it, and the
    // waste stays under 1/2^lb.
    for (std::size_t size = 1; size != 0;) {
      const std::size_t bin = b.bin_number(size);
      const std::size_t top = b.alloc_size(bin);
      ASSERT_EQ(b.bin_number(top), bin) << "lb=" << lb << " size=" << size;
      ASSERT_GE(top, size);
      if (!first) {
        ASSERT_GT(bin, prev_bin);
        ASSERT_EQ(size, prev_top + 1);
      }
      if (size >= (std::size_t{1} << lb)) {
        // Rounding waste below 1/2^lb of the request, for the smallest request of the bin.
        if (top != SIZE_MAX) {
          ASSERT_LT(static_cast<long double>(top - size),
                    static_cast<long double>(size) / (std::size_t{1} << lb))
              << "lb=" << lb << " size=" << size;
        }
      } else {
        ASSERT_EQ(top, size) << "small sizes get exact bins";
      }
      ASSERT_LT(bin, b.bin_count());
      first = false;
      prev_bin = bin;
      prev_top = top;
      size = top + 1;  // wraps to 0 after SIZE_MAX
    }
    EXPECT_EQ(prev_top, SIZE_MAX) << "the last bin ends at SIZE_MAX";
  }
}

TEST(Bins, SizeMax) {
  BinScheme b(4);
  EXPECT_EQ(b.alloc_size(b.bin_number(SIZE_MAX)), SIZE_MAX);
  EXPECT_EQ(b.rounded(SIZE_MAX), SIZE_MAX);
  EXPECT_EQ(b.rounded(SIZE_MAX - 1), SIZE_MAX);
}

TEST(Bins, ClampNeverRoundsPastTheMaximum) {
  BinScheme b(4);
  const std::size_t max = std::size_t{1} << 30;  // PoCL's CL_DEVICE_MAX_MEM_ALLOC_SIZE
  EXPECT_EQ(b.rounded(max, max), max) << "a request of exactly the maximum stays legal";
  EXPECT_EQ(b.rounded(max - 1, max), max) << "2^30-1 rounds up to the maximum, still legal";
  // Every request in the clamped bin gets the same size, so its blocks stay interchangeable.
  const std::size_t odd_max = 1000000;
  const std::size_t bin = b.bin_number(odd_max);
  for (std::size_t s = b.alloc_size(bin - 1) + 1; s <= odd_max; s += 97)
    EXPECT_EQ(b.rounded(s, odd_max), odd_max);
  EXPECT_EQ(b.rounded(4097, odd_max), 4352u) << "bins below the clamp are unaffected";
}
