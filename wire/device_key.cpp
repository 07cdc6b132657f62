#include "wire/device_key.hpp"

#include <cstdio>

namespace gpupool::wire {
namespace {

// A derived key's first bytes. A GPU's UUID that starts so (one in 2^32)
// is shown as a derived key, and works as one.
constexpr std::uint8_t kDerived[4] = {'o', 'c', 'l', 0};
constexpr char kDerivedPrefix[] = "opencl-";

int hex_digit(char c) {
  return c >= '0' && c <= '9'   ? c - '0'
         : c >= 'a' && c <= 'f' ? c - 'a' + 10
         : c >= 'A' && c <= 'F' ? c - 'A' + 10
                                : -1;
}

// `t` as hex digits into out[0..n), all of them; false otherwise.
bool parse_hex(std::string_view t, std::uint8_t* out, std::size_t n, bool dashes) {
  std::size_t got = 0;
  for (char c : t) {
    if (dashes && c == '-') {
      if (got != 8 && got != 12 && got != 16 && got != 20) return false;
      continue;
    }
    const int v = hex_digit(c);
    if (v < 0 || got >= 2 * n) return false;
    out[got / 2] = static_cast<std::uint8_t>(out[got / 2] | (got % 2 ? v : v << 4));
    ++got;
  }
  return got == 2 * n;
}

}  // namespace

DeviceKey derived_key(std::string_view identity) {
  // Two FNV-1a 64-bit hashes of different offset bases: 96 bits kept.
  std::uint64_t a = 0xcbf29ce484222325ull, b = 0x84222325cbf29ce4ull;
  for (char c : identity) {
    a = (a ^ static_cast<std::uint8_t>(c)) * 0x100000001b3ull;
    b = (b ^ static_cast<std::uint8_t>(c)) * 0x100000001b3ull;
  }
  DeviceKey k{};
  for (int i = 0; i < 4; ++i) k[i] = kDerived[i];
  for (int i = 0; i < 8; ++i) k[4 + i] = static_cast<std::uint8_t>(a >> (56 - 8 * i));
  for (int i = 0; i < 4; ++i) k[12 + i] = static_cast<std::uint8_t>(b >> (56 - 8 * i));
  return k;
}

bool is_derived(const DeviceKey& k) {
  for (int i = 0; i < 4; ++i)
    if (k[i] != kDerived[i]) return false;
  return true;
}

std::string key_text(const DeviceKey& k) {
  if (k == kHostMemory) return "host";
  char out[64];
  int n = 0;
  if (is_derived(k)) {
    n = std::snprintf(out, sizeof out, "%s", kDerivedPrefix);
    for (int i = 4; i < 16; ++i) n += std::snprintf(out + n, sizeof out - n, "%02x", k[i]);
    return std::string(out, n);
  }
  n = std::snprintf(out, sizeof out, "GPU-");
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out[n++] = '-';
    n += std::snprintf(out + n, sizeof out - n, "%02x", k[i]);
  }
  return std::string(out, n);
}

bool parse_key(std::string_view t, DeviceKey* out) {
  if (t == "host") {
    *out = kHostMemory;
    return true;
  }
  DeviceKey k{};
  if (t.substr(0, sizeof kDerivedPrefix - 1) == kDerivedPrefix) {
    t.remove_prefix(sizeof kDerivedPrefix - 1);
    for (int i = 0; i < 4; ++i) k[i] = kDerived[i];
    if (!parse_hex(t, k.data() + 4, 12, /*dashes=*/false)) return false;
  } else {
    if (t.substr(0, 4) == "GPU-") t.remove_prefix(4);
    if (!parse_hex(t, k.data(), 16, /*dashes=*/true)) return false;
  }
  *out = k;
  return true;
}

}  // namespace gpupool::wire
