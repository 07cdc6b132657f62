// How the value of each kind of GPUPOOL_* variable (options.def's `kind`
// column) is read and written, and the text helpers the readers share.
// Internal to config/.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "config/config.hpp"

namespace gpupool::config::values {

// Blanks (isspace) cut from both ends.
std::string_view trim(std::string_view s);
std::string lower(std::string_view s);
std::string upper(std::string_view s);
bool is_digit(char c);
// Leading decimal digits of `s` into *out; false on overflow. *used = digits read.
bool take_u64(std::string_view s, std::uint64_t* out, std::size_t* used);

// A kind is a struct with
//   T         the Config member's type
//   type      the Type cell of docs/configuration.md's table
//   accepted  what a diagnostic says the variable accepts
//   parse(text, out, reason)  true and *out set, or false and *reason set to
//             a phrase that follows the quoted value ("is not a size")
//   show(v)   v as text its variable accepts (`gpupool env`)
#define GPUPOOL_KIND(Kind, Type, type_text, accepted_text)                 \
  struct Kind {                                                            \
    using T = Type;                                                        \
    static constexpr const char* type = type_text;                         \
    static constexpr const char* accepted = accepted_text;                 \
    static bool parse(std::string_view text, T* out, std::string* reason); \
    static std::string show(const T& v);                                   \
  };

GPUPOOL_KIND(Bool, bool, "bool", "1/0, true/false, yes/no, on/off")
GPUPOOL_KIND(Bits, unsigned, "integer 1..8", "an integer from 1 to 8")
GPUPOOL_KIND(Size, SizeSpec, "size",
             "bytes with optional K/M/G/T[i][B] suffix, binary (1K = 1024), or unlimited")
GPUPOOL_KIND(SizeOrPercent, SizeSpec, "size or %",
             "bytes with optional K/M/G/T[i][B] suffix, binary (1K = 1024), or N% of the "
             "device's memory, or unlimited")
// GPUPOOL_SITES: a plain number counts allocations, a number with a unit is
// bytes, so "64MiB" and "64" cannot be mistaken for each other.
GPUPOOL_KIND(Sampling, SiteSampling, "sampling",
             "off, all, N (one allocation in N) or a size with a unit (one allocation per that "
             "many bytes asked for, e.g. 64MiB)")
// GPUPOOL_SPLIT: off, on (1 MiB: PyTorch's line between its small and large
// blocks), or the smallest request split, with a unit so that "1" reads as
// on and not as one byte. Bytes, 0 = off.
GPUPOOL_KIND(Split, std::uint64_t, "off, on or size",
             "off, on (1MiB) or a size with a unit of at least 4KiB (e.g. 4MiB)")
GPUPOOL_KIND(SegmentsKind, Segments, "driver or expandable", "driver or expandable")
// Nanoseconds, 0 = off.
GPUPOOL_KIND(Duration, std::uint64_t, "duration",
             "a number with unit ns, us, ms, s, m or h (no unit: seconds), or off")
GPUPOOL_KIND(ReuseKind, Reuse, "safe, ordered, fenced or immediate",
             "safe, ordered, fenced or immediate")
GPUPOOL_KIND(NeighbourScope, Neighbours, "off, user or all", "off (or 0), user (or 1), all")
GPUPOOL_KIND(Level, LogLevel, "log level", "off, error, warn, info, debug or trace")
// Taken as is (file names may hold spaces); empty means unset.
GPUPOOL_KIND(Path, std::string, "path", "a file name")
GPUPOOL_KIND(Format, StatsFormat, "text or json", "text or json")
// A process id, 0 = none.
GPUPOOL_KIND(Pid, long, "process id", "a process id, or none")
// A signal number, 0 = none.
GPUPOOL_KIND(Signal, int, "signal",
             "USR1, USR2, a real-time signal (RTMIN+n, RTMAX-n, or its number), or none")

#undef GPUPOOL_KIND

// Size and SizeOrPercent's reader.
bool size_from(std::string_view text, bool allow_percent, SizeSpec* out, std::string* reason);

}  // namespace gpupool::config::values
