#include "observe/bytes.hpp"

#include <cinttypes>
#include <cstdio>

namespace gpupool::observe {

std::string bytes_text(std::uint64_t bytes, Digits digits) {
  static const char* const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  char buf[32];
  if (bytes < 1024) {
    std::snprintf(buf, sizeof buf, "%" PRIu64 " B", bytes);
    return buf;
  }
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 6) {
    v /= 1024;
    ++u;
  }
  const bool three = digits == Digits::three_significant;
  std::snprintf(buf, sizeof buf,
                !three    ? "%.1f %s"
                : v < 10  ? "%.2f %s"
                : v < 100 ? "%.1f %s"
                          : "%.0f %s",
                v, units[u]);
  return buf;
}

}  // namespace gpupool::observe
