// Prints the markdown table docs/configuration.md carries, between its
// markers:
//   build/tests/config/gpupool_options_table
#include <cstdio>

#include "config/config.hpp"

int main() {
  std::printf("<!-- options-table:begin -->\n%s<!-- options-table:end -->\n",
              gpupool::config::options_markdown().c_str());
  return 0;
}
