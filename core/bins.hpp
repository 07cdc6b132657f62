// Size classes: PyOpenCL's/PyCUDA's binning by the leading bits of a size.
//
// A size's bin keeps its exponent (floor(log2 size)) and the `leading_bits`
// bits that follow the leading one. Every size in a bin is served by the
// bin's allocation size, the *largest* size sharing those bits, so blocks in
// a bin are interchangeable and the rounding waste is below 1/2^leading_bits.
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

  // Number of distinct bins for 64-bit sizes.
  constexpr std::size_t bin_count() const { return std::size_t{64} << lb_; }

  constexpr std::size_t bin_number(std::size_t size) const {
    const unsigned l = size ? 63u - static_cast<unsigned>(std::countl_zero(size)) : 0u;
    const std::size_t shifted = l > lb_ ? size >> (l - lb_) : size << (lb_ - l);
    const std::size_t mantissa = shifted & ((std::size_t{1} << lb_) - 1);
    return (std::size_t{l} << lb_) | mantissa;
  }

  // Largest size whose bin is `bin`.
  constexpr std::size_t alloc_size(std::size_t bin) const {
    const unsigned exponent = static_cast<unsigned>(bin >> lb_);
    const std::size_t head = (bin & ((std::size_t{1} << lb_) - 1)) | (std::size_t{1} << lb_);
    if (exponent >= lb_) {
      const unsigned shift = exponent - lb_;
      return (head << shift) | ((std::size_t{1} << shift) - 1);
    }
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
