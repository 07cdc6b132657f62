#include "wire/uuid.hpp"

#include <cstdio>

namespace gpupool::wire {

std::string uuid_text(const Uuid& u) {
  if (u == kHostMemory) return "host";
  char out[64];
  int n = std::snprintf(out, sizeof out, "GPU-");
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[n++] = '-';
    n += std::snprintf(out + n, sizeof out - n, "%02x", u[i]);
  }
  return std::string(out, n);
}

bool parse_uuid(std::string_view t, Uuid* out) {
  if (t == "host") {
    *out = kHostMemory;
    return true;
  }
  if (t.substr(0, 4) == "GPU-") t.remove_prefix(4);
  Uuid u{};
  int got = 0;
  for (std::size_t i = 0; i < t.size(); ++i) {
    const char c = t[i];
    if (c == '-') {
      if (got != 8 && got != 12 && got != 16 && got != 20) return false;
      continue;
    }
    int v = c >= '0' && c <= '9'   ? c - '0'
            : c >= 'a' && c <= 'f' ? c - 'a' + 10
            : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                   : -1;
    if (v < 0 || got >= 32) return false;
    u[got / 2] = static_cast<std::uint8_t>(u[got / 2] | (got % 2 ? v : v << 4));
    ++got;
  }
  if (got != 32) return false;
  *out = u;
  return true;
}

}  // namespace gpupool::wire
