#include "observe/text_width.hpp"

#include <algorithm>

namespace gpupool::observe {
namespace {

bool starts_char(char c) { return (static_cast<unsigned char>(c) & 0xc0) != 0x80; }

// The first `n` characters of `s`, in bytes.
std::size_t prefix_bytes(std::string_view s, std::size_t n) {
  std::size_t i = 0;
  for (std::size_t seen = 0; i < s.size(); ++i)
    if (starts_char(s[i]) && seen++ == n) break;
  return i;
}

}  // namespace

std::size_t text_columns(std::string_view s) {
  std::size_t n = 0;
  for (char c : s) n += starts_char(c);
  return n;
}

std::string shorten_middle(std::string_view s, std::size_t width) {
  const std::size_t have = text_columns(s);
  if (have <= width) return std::string(s);
  if (width <= 3) return std::string(s.substr(0, prefix_bytes(s, width)));
  const std::size_t head = (width - 3) / 2, tail = width - 3 - head;
  return std::string(s.substr(0, prefix_bytes(s, head))) + "..." +
         std::string(s.substr(prefix_bytes(s, have - tail)));
}

std::vector<std::string> wrap_text(std::string_view text, std::size_t width) {
  std::vector<std::string> lines;
  std::string line;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find(' ', at);
    if (end == std::string_view::npos) end = text.size();
    const std::string word = shorten_middle(text.substr(at, end - at), width);
    at = end + 1;
    if (word.empty()) continue;
    if (!line.empty() && text_columns(line) + 1 + text_columns(word) > width) {
      lines.push_back(std::move(line));
      line.clear();
    }
    line += (line.empty() ? "" : " ") + word;
  }
  if (!line.empty() || lines.empty()) lines.push_back(std::move(line));
  return lines;
}

std::string fit_lines(std::string_view text, std::size_t width) {
  std::string out;
  std::size_t at = 0;
  while (at < text.size()) {
    std::size_t end = text.find('\n', at);
    const bool newline = end != std::string_view::npos;
    if (!newline) end = text.size();
    std::string_view line = text.substr(at, end - at);
    at = end + 1;
    // Broken at the last space that fits (a line's own spacing, a table's
    // columns, kept), else where it reaches the width; what follows goes on
    // lines 4 further in than the line.
    const std::size_t indent = std::min(line.find_first_not_of(' '), width / 2);
    std::size_t room = width;
    while (text_columns(line) > room) {
      const std::size_t fits = prefix_bytes(line, room);
      std::size_t cut = line.rfind(' ', fits);
      const std::size_t lead = room == width ? indent : 0;
      if (cut == std::string_view::npos || cut <= lead) cut = fits;
      out.append(line.substr(0, cut));
      out += '\n';
      out.append(indent + 4, ' ');
      line.remove_prefix(cut);
      while (!line.empty() && line.front() == ' ') line.remove_prefix(1);
      room = width - indent - 4;
    }
    out.append(line);
    if (newline) out += '\n';
  }
  return out;
}

}  // namespace gpupool::observe
