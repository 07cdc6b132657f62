// Size classes by the leading bits of a size, as PyOpenCL's and PyCUDA's
// pools have them, with one difference.
//
// A bin is named by a size's exponent (floor(log2 size)) and the
// `leading_bits` bits that follow the leading one. PyOpenCL serves a bin with
// its *largest* size, so even a power of two is rounded up (4096 -> 4351,
// 1 GiB -> 1088 MiB). Here a bin's allocation size is its *smallest* size,
// the one whose bits below the leading ones are zero, and a request rounds up
// to the next such size: every size with at most leading_bits + 1 significant
// bits (every power of two among them) is served exactly, and the rounding
// waste stays below 1/2^leading_bits.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>

namespace gpupool {

class BinScheme {
 public:
  static constexpr unsigned kMaxLeadingBits = 8;

  constexpr explicit BinScheme(unsigned leading_bits = 4) : lb_(leading_bits) {}

  constexpr unsigned leading_bits() const { return lb_; }

  // Number of distinct bins for 64-bit sizes: one per (exponent, leading
  // bits), and the last for sizes above the largest such size (SIZE_MAX).
  constexpr std::size_t bin_count() const { return (std::size_t{64} << lb_) + 1; }

  constexpr std::size_t bin_number(std::size_t size) const {
    const unsigned l = size ? 63u - static_cast<unsigned>(std::countl_zero(size)) : 0u;
    if (l > lb_) {
      // Round up to the next size with nothing below the leading bits.
      const unsigned shift = l - lb_;
      std::size_t head = size >> shift;
      if (size & ((std::size_t{1} << shift) - 1)) ++head;
      if (head >> (lb_ + 1)) {  // carried into the next exponent
        if (l == 63) return bin_count() - 1;
        return std::size_t{l + 1} << lb_;
      }
      return (std::size_t{l} << lb_) | (head & ((std::size_t{1} << lb_) - 1));
    }
    const std::size_t shifted = size << (lb_ - l);
    return (std::size_t{l} << lb_) | (shifted & ((std::size_t{1} << lb_) - 1));
  }

  // The size a block of `bin` has: the smallest size of the bin.
  constexpr std::size_t alloc_size(std::size_t bin) const {
    if (bin == bin_count() - 1) return SIZE_MAX;
    const unsigned exponent = static_cast<unsigned>(bin >> lb_);
    const std::size_t head = (bin & ((std::size_t{1} << lb_) - 1)) | (std::size_t{1} << lb_);
    if (exponent >= lb_) return head << (exponent - lb_);
    return head >> (lb_ - exponent);
  }

  // What the pool asks the backend for when the program asks for `size`,
  // never more than `max` (a request of exactly the device maximum stays
  // legal). Every size of a clamped bin maps to `max`, so its blocks stay
  // interchangeable. Requests above `max` are not pooled.
  constexpr std::size_t rounded(std::size_t size, std::size_t max = SIZE_MAX) const {
    const std::size_t r = alloc_size(bin_number(size));
    return r < max ? r : max;
  }

 private:
  unsigned lb_;
};

}  // namespace gpupool
