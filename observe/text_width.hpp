// Text for terminals and CI logs within kTextColumns: the stats dump's
// table, `gpupool report --text`, `env`, `ps` and the help (--json has what
// a text leaves out or shortens).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace gpupool::observe {

inline constexpr std::size_t kTextColumns = 100;

// Columns `s` (UTF-8) takes on a terminal: one per character.
std::size_t text_columns(std::string_view s);
// `s` in at most `width` columns: its start and its end, "..." in the
// middle (a name's start says what it is, its end which one: a file and
// line, a device, flags).
std::string shorten_middle(std::string_view s, std::size_t width);
// `text` wrapped at spaces into lines of at most `width` columns; a word
// longer than that is shortened (shorten_middle).
std::vector<std::string> wrap_text(std::string_view text, std::size_t width);
// Every line of `text` within `width` columns: a longer one broken at its
// last space that fits (its own spacing kept), its continuation lines
// indented 4 more than it.
std::string fit_lines(std::string_view text, std::size_t width = kTextColumns);

}  // namespace gpupool::observe
