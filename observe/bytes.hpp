// Byte counts for people, in binary units (1 KiB = 1024 bytes): the one
// formatter of the stats dump, the leak report, `gpupool ps` and `gpupool
// report` (whose page's script draws its axes the way one_decimal writes).
#pragma once

#include <cstdint>
#include <string>

namespace gpupool::observe {

enum class Digits {
  one_decimal,        // 1536 -> "1.5 KiB", 100 MiB -> "100.0 MiB"
  three_significant,  // 1536 -> "1.50 KiB", 100 MiB -> "100 MiB" (the stats dump)
};

// Below 1024: "512 B" in either style; at most EiB.
std::string bytes_text(std::uint64_t bytes, Digits digits = Digits::one_decimal);

}  // namespace gpupool::observe
