// The options table itself, and docs/configuration.md's copy of it.
#include <fstream>
#include <set>
#include <sstream>

#include <gtest/gtest-spi.h>
#include <unistd.h>

#include "core/pool.hpp"
#include "tests/config/test_util.hpp"

namespace gpupool::config::test {
namespace {

TEST(Table, EveryVariableOnceWithDocs) {
  // The variables gpupool promises; more may be added.
  const std::set<std::string> required = {"GPUPOOL_DISABLE",
                                          "GPUPOOL_CUDA",
                                          "GPUPOOL_CUDA_HOST",
                                          "GPUPOOL_OPENCL",
                                          "GPUPOOL_OPENCL_LAYER",
                                          "GPUPOOL_HOLD",
                                          "GPUPOOL_LEADING_BITS",
                                          "GPUPOOL_MAX_HELD",
                                          "GPUPOOL_MAX_POOLED",
                                          "GPUPOOL_RELEASE_AFTER",
                                          "GPUPOOL_REUSE",
                                          "GPUPOOL_PROBE",
                                          "GPUPOOL_LOG",
                                          "GPUPOOL_LOG_FILE",
                                          "GPUPOOL_STATS_FILE",
                                          "GPUPOOL_STATS_AT_EXIT",
                                          "GPUPOOL_STATS_INTERVAL",
                                          "GPUPOOL_STATS_FORMAT",
                                          "GPUPOOL_PROMETHEUS_FILE",
                                          "GPUPOOL_TRACE_FILE",
                                          "GPUPOOL_SIGNAL_STATS",
                                          "GPUPOOL_SIGNAL_FREE_HELD",
                                          "GPUPOOL_SIGNAL_STOP_HOLDING"};
  std::set<std::string> seen;
  for (const OptionInfo& o : options()) {
    const std::string name = o.name, doc = o.doc, type = o.type;
    EXPECT_TRUE(seen.insert(name).second) << "twice: " << name;
    EXPECT_EQ(name.rfind("GPUPOOL_", 0), 0u) << name;
    EXPECT_GT(doc.size(), 10u) << name;
    EXPECT_EQ(doc.back(), '.') << name;
    // Cells of a markdown table.
    EXPECT_EQ(doc.find('|'), std::string::npos) << name;
    EXPECT_EQ(type.find('|'), std::string::npos) << name;
    EXPECT_EQ(std::string(o.default_value).find('|'), std::string::npos) << name;
  }
  for (const std::string& r : required) EXPECT_TRUE(seen.count(r)) << "missing: " << r;
  EXPECT_EQ(value_text(parse(nullptr, nullptr), "GPUPOOL_NOPE"), "");
}

// A Config made in code (tests, a tool) holds what a process with no
// GPUPOOL_* variable runs with: the table's defaults, every one.
TEST(Table, ConfigStartsAtTheTablesDefaults) {
  const Config made;
  const Config parsed = parse(nullptr, nullptr);
  for (const OptionInfo& o : options()) {
    EXPECT_EQ(value_text(made, o.name), value_text(parsed, o.name)) << o.name;
    if (*o.default_value) {
      EXPECT_EQ(value_text(made, o.name), good(o.name, o.default_value)) << o.name;
    }
  }
}

TEST(Table, Markdown) {
  const std::string md = options_markdown();
  std::istringstream in(md);
  std::string line;
  std::getline(in, line);
  EXPECT_EQ(line, "| Variable | Type | Default | Description |");
  std::getline(in, line);
  EXPECT_EQ(line, "|---|---|---|---|");
  std::size_t rows = 0;
  while (std::getline(in, line)) ++rows;
  EXPECT_EQ(rows, options().size());
  EXPECT_NE(md.find("| `GPUPOOL_LEADING_BITS` | integer 1..8 | `4` | "), std::string::npos);
  EXPECT_NE(md.find("| `GPUPOOL_LOG_FILE` | path |  | "), std::string::npos);
}

// Cells of one markdown table row, trimmed, "\|" unescaped, one pair of
// enclosing backticks removed.
std::vector<std::string> cells(const std::string& row) {
  std::vector<std::string> out;
  std::string cur;
  for (std::size_t i = 0; i < row.size(); ++i) {
    if (row[i] == '\\' && i + 1 < row.size() && row[i + 1] == '|') {
      cur += '|';
      ++i;
      continue;
    }
    if (row[i] == '|') {
      out.push_back(cur);
      cur.clear();
      continue;
    }
    cur += row[i];
  }
  out.push_back(cur);
  // Leading and trailing pipes leave empty first/last pieces.
  if (!out.empty() && out.front().find_first_not_of(" \t") == std::string::npos)
    out.erase(out.begin());
  if (!out.empty() && out.back().find_first_not_of(" \t\r") == std::string::npos) out.pop_back();
  for (std::string& c : out) {
    const std::size_t b = c.find_first_not_of(" \t"), e = c.find_last_not_of(" \t\r");
    c = b == std::string::npos ? "" : c.substr(b, e - b + 1);
    if (c.size() >= 2 && c.front() == '`' && c.back() == '`') c = c.substr(1, c.size() - 2);
  }
  return out;
}

// The table rows between <!-- NAME:begin --> and <!-- NAME:end --> in
// `path`, and *found set; a fatal failure unless there is exactly one such
// block (*found is how the caller learns of it: HasFatalFailure() does not
// see a failure that EXPECT_FATAL_FAILURE intercepts).
void marked_rows(const std::string& path, const std::string& name, const std::string& fix,
                 std::vector<std::string>* rows, bool* found) {
  *found = false;
  std::ifstream f(path);
  ASSERT_TRUE(f) << "cannot read " << path;
  const std::string begin = "<!-- " + name + ":begin -->", end = "<!-- " + name + ":end -->";
  bool inside = false;
  int began = 0, ended = 0;
  for (std::string line; std::getline(f, line);) {
    if (line.find(begin) != std::string::npos) {
      inside = true;
      ++began;
      continue;
    }
    if (line.find(end) != std::string::npos) {
      inside = false;
      ++ended;
      continue;
    }
    if (inside && line.find('|') != std::string::npos) rows->push_back(line);
  }
  ASSERT_TRUE(began == 1 && ended == 1)
      << path << ": " << began << " begin and " << ended << " end markers; it needs one " << begin
      << " ... " << end << " block: " << fix;
  *found = true;
}

// Adds a failure for every way the table between the markers in `path`
// differs from options().
void check_table(const std::string& path) {
  std::vector<std::string> rows;
  bool found = false;
  marked_rows(path, "options-table",
              "paste the output of tests/config/gpupool_options_table into it", &rows, &found);
  if (!found) return;
  ASSERT_GE(rows.size(), 2u) << "no table between the markers";
  EXPECT_EQ(cells(rows[0]),
            (std::vector<std::string>{"Variable", "Type", "Default", "Description"}));
  rows.erase(rows.begin(), rows.begin() + 2);  // header and |---| line
  const auto& opts = options();
  for (std::size_t i = 0; i < std::max(rows.size(), opts.size()); ++i) {
    if (i >= rows.size()) {
      ADD_FAILURE() << path << " lacks " << opts[i].name;
      continue;
    }
    if (i >= opts.size()) {
      ADD_FAILURE() << path << " has an extra row: " << rows[i];
      continue;
    }
    const std::vector<std::string> c = cells(rows[i]);
    if (c.size() != 4) {
      ADD_FAILURE() << "not 4 cells: " << rows[i];
      continue;
    }
    const OptionInfo& o = opts[i];
    EXPECT_EQ(c[0], o.name) << "row " << i + 1 << " (the table's order is options.def's)";
    EXPECT_EQ(c[1], o.type) << o.name;
    EXPECT_EQ(c[2], o.default_value) << o.name;
    EXPECT_EQ(c[3], o.doc) << o.name;
  }
}

// Adds a failure for every row of README's short table (the variables most
// people touch) that names no variable of options() or not its default.
void check_common(const std::string& path) {
  std::vector<std::string> rows;
  bool found = false;
  marked_rows(path, "options-common", "a table of | Variable | Default | What for |", &rows,
              &found);
  if (!found) return;
  ASSERT_GE(rows.size(), 3u) << "no rows between the markers";
  EXPECT_EQ(cells(rows[0]), (std::vector<std::string>{"Variable", "Default", "What for"}));
  rows.erase(rows.begin(), rows.begin() + 2);  // header and |---| line
  for (const std::string& row : rows) {
    const std::vector<std::string> c = cells(row);
    if (c.size() != 3) {
      ADD_FAILURE() << "not 3 cells: " << row;
      continue;
    }
    const OptionInfo* o = nullptr;
    for (const OptionInfo& x : options())
      if (c[0] == x.name) o = &x;
    if (!o) {
      ADD_FAILURE() << path << " names " << c[0] << ", which is no gpupool variable";
      continue;
    }
    EXPECT_EQ(c[1], o->default_value) << path << ": the default of " << o->name;
  }
}

// The constants the texts quote come from the code, not from memory.
TEST(Table, TextsQuoteTheCodesConstants) {
  const std::string blocks = "up to " + std::to_string(kMaxPendingBlocks) + " blocks";
  bool found = false;
  for (const OptionInfo& o : options())
    if (std::string(o.name) == "GPUPOOL_PENDING_GROWTH")
      found = std::string(o.doc).find(blocks) != std::string::npos;
  EXPECT_TRUE(found) << "GPUPOOL_PENDING_GROWTH's doc should say '" << blocks << "'";
  const std::string page = std::string(GPUPOOL_SOURCE_DIR) + "/docs/measurements.md";
  std::ifstream f(page);
  ASSERT_TRUE(f) << "cannot read " << page;
  std::stringstream text;
  text << f.rdbuf();
  const std::string at_most = "At most " + std::to_string(kMaxPendingBlocks) + " blocks of a size";
  EXPECT_NE(text.str().find(at_most), std::string::npos)
      << page << " should say '" << at_most << "'";
}

TEST(Table, ConfigurationPageMatchesOptions) {
  check_table(std::string(GPUPOOL_SOURCE_DIR) + "/docs/configuration.md");
}

// The check passes on the generated table (padded as a formatter would pad
// it) and fails on every kind of drift.
TEST(Table, TableCheckCatchesDrift) {
  char tmpl[] = "/tmp/gpupool-options-table-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string path = tmpl;
  const std::string table = options_markdown();
  auto write = [&](const std::string& body) {
    std::ofstream(path) << "# gpupool\n\ntext | with a pipe\n<!-- options-table:begin -->\n"
                        << body << "<!-- options-table:end -->\n| after | table |\n";
  };
  auto replace = [&](std::string s, const std::string& from, const std::string& to) {
    const std::size_t at = s.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return at == std::string::npos ? s : s.replace(at, from.size(), to);
  };
  write(table);
  check_table(path);
  write(replace(replace(table, "| `GPUPOOL_HOLD` |", "|  `GPUPOOL_HOLD`    |"), "| bool |",
                "|bool|"));
  check_table(path);

  const std::string first = std::string("| `") + options()[0].name + "`";
  const std::string last_row = table.substr(table.rfind("| `"));
  const std::vector<std::string> drifted = {
      replace(table, "`4`", "`5`"),                              // default
      replace(table, "Log level: off", "Log level: none"),       // doc
      replace(table, "| integer 1..8 |", "| int |"),             // type
      replace(table, "GPUPOOL_MAX_HELD`", "GPUPOOL_MAX_HOLD`"),  // name
      replace(table, last_row, ""),                              // missing row
      table + "| `GPUPOOL_EXTRA` | bool | `0` | Extra. |\n",     // extra row
      replace(table, "| Default |", "| Initial |"),              // header
      replace(table, first, first + " | x"),                     // cells
  };
  for (const std::string& body : drifted) {
    write(body);
    EXPECT_NONFATAL_FAILURE(check_table(path), "");
  }
  std::ofstream(path) << "# no markers\n" << table;
  static std::string fatal_path;  // EXPECT_FATAL_FAILURE takes no locals
  fatal_path = path;
  EXPECT_FATAL_FAILURE(check_table(fatal_path), "options-table:begin");
  unlink(path.c_str());
}

TEST(Table, ReadmeNamesVariablesWithTheirDefaults) {
  check_common(std::string(GPUPOOL_SOURCE_DIR) + "/README.md");
}

TEST(Table, ReadmeCheckCatchesDrift) {
  char tmpl[] = "/tmp/gpupool-readme-XXXXXX";
  const int fd = mkstemp(tmpl);
  ASSERT_GE(fd, 0);
  close(fd);
  const std::string path = tmpl;
  auto write = [&](const std::string& rows) {
    std::ofstream(path)
        << "# gpupool\n\n<!-- options-common:begin -->\n| Variable | Default | What for |\n"
        << "|---|---|---|\n"
        << rows << "<!-- options-common:end -->\n";
  };
  write("| `GPUPOOL_LEADING_BITS` | `4` | bits |\n| `GPUPOOL_TRACE_FILE` |  | a trace |\n");
  check_common(path);
  for (const std::string& rows :
       {std::string("| `GPUPOOL_LEADING_BITS` | `5` | bits |\n"),  // default
        std::string("| `GPUPOOL_LEADING_BIT` | `4` | bits |\n"),   // name
        std::string("| `GPUPOOL_TRACE_FILE` | `trace` | a trace |\n"),
        std::string("| `GPUPOOL_LOG` | `warn` |\n")}) {  // cells
    write(rows);
    EXPECT_NONFATAL_FAILURE(check_common(path), "");
  }
  std::ofstream(path) << "# no markers\n| `GPUPOOL_LOG` | `warn` | log |\n";
  static std::string fatal_path;  // EXPECT_FATAL_FAILURE takes no locals
  fatal_path = path;
  EXPECT_FATAL_FAILURE(check_common(fatal_path), "options-common:begin");
  unlink(path.c_str());
}

}  // namespace
}  // namespace gpupool::config::test
