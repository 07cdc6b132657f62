// The table of options.def as the parser uses it: one Option per row.
// Internal to config/.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "config/config.hpp"

namespace gpupool::config {

struct Option {
  OptionInfo info;
  const char* accepted;  // what a diagnostic says the variable accepts
  // Parses `text` into its Config member: true, or false with *reason set
  // and the member unchanged.
  bool (*apply)(Config&, std::string_view text, std::string* reason);
  std::string (*show)(const Config&);
};

// options.def's rows, in its order.
const std::vector<Option>& table();
// The row of variable `name`, or nullptr.
const Option* find(std::string_view name);
// Config{}, made once.
const Config& defaults();

}  // namespace gpupool::config
