// Every variable's accepted forms and every refused form.
#include <cstdint>

#include "tests/config/test_util.hpp"

namespace gpupool::config::test {
namespace {

const char* const kBools[] = {"GPUPOOL_DISABLE", "GPUPOOL_CUDA",         "GPUPOOL_CUDA_HOST",
                              "GPUPOOL_OPENCL",  "GPUPOOL_OPENCL_LAYER", "GPUPOOL_HOLD",
                              "GPUPOOL_PROBE",   "GPUPOOL_STATS_AT_EXIT"};

TEST(Values, Defaults) {
  std::vector<Diagnostic> d;
  const Config c = parse(nullptr, &d);
  EXPECT_TRUE(d.empty());
  EXPECT_FALSE(c.disable);
  EXPECT_TRUE(c.cuda && c.cuda_host && c.opencl && c.opencl_layer && c.hold && c.probe);
  EXPECT_EQ(c.leading_bits, 4u);
  EXPECT_TRUE(c.max_held.unlimited);
  EXPECT_EQ(c.max_held.resolve(1000), SIZE_MAX);
  EXPECT_FALSE(c.max_pooled.unlimited);
  EXPECT_TRUE(c.max_pooled.percent);
  EXPECT_EQ(c.max_pooled.resolve(std::size_t{80} << 30), std::size_t{20} << 30);
  EXPECT_EQ(c.release_after_ns, 60'000'000'000u);
  EXPECT_EQ(c.reuse, Reuse::safe);
  EXPECT_TRUE(c.pending_growth.percent);
  EXPECT_EQ(c.pending_growth.resolve(std::size_t{100} << 30), std::size_t{2} << 30);
  EXPECT_EQ(c.log_level, LogLevel::warn);
  EXPECT_EQ(c.log_file, "");
  EXPECT_EQ(c.stats_file, "");
  EXPECT_FALSE(c.stats_at_exit);
  EXPECT_EQ(c.stats_interval_ns, 0u);
  EXPECT_EQ(c.stats_format, StatsFormat::text);
  EXPECT_EQ(c.signal_stats, SIGUSR1);
  EXPECT_EQ(c.signal_free_held, SIGUSR2);
  EXPECT_EQ(c.signal_stop_holding, 0);
  // An empty environment and one without GPUPOOL_* read the same.
  const Parsed p = parse_env({"PATH=/bin", "HOME=/root", "GPUPOOLX=1", "XGPUPOOL_LOG=debug"});
  EXPECT_TRUE(p.diags.empty());
  for (const OptionInfo& o : options()) EXPECT_EQ(p.value(o.name), value_text(c, o.name));
}

TEST(Values, TableDefaultsReadBackAsWritten) {
  const Config c = parse(nullptr, nullptr);
  for (const OptionInfo& o : options()) {
    EXPECT_EQ(value_text(c, o.name), o.default_value) << o.name;
    // Setting a variable to its documented default is accepted and changes nothing.
    EXPECT_EQ(good(o.name, o.default_value), o.default_value) << o.name;
  }
}

TEST(Values, Booleans) {
  for (const char* name : kBools) {
    for (const char* t : {"1", "true", "TRUE", "True", "yes", "YES", "on", "On", " 1 ", "\ttrue\n"})
      EXPECT_EQ(good(name, t), "1") << name << "=" << t;
    for (const char* f : {"0", "false", "FALSE", "no", "No", "off", "OFF", " off "})
      EXPECT_EQ(good(name, f), "0") << name << "=" << f;
    for (const char* b :
         {"", " ", "2", "-1", "10", "tru", "yess", "y", "n", "enable", "1 1", "0x1"})
      bad(name, b);
  }
  EXPECT_NE(bad("GPUPOOL_HOLD", "maybe").find("is not a boolean"), std::string::npos);
  EXPECT_NE(bad("GPUPOOL_HOLD", "").find("is empty"), std::string::npos);
  EXPECT_TRUE(parse_env({"GPUPOOL_DISABLE=yes"}).config.disable);
  EXPECT_FALSE(parse_env({"GPUPOOL_HOLD=off"}).config.hold);
}

TEST(Values, LeadingBits) {
  for (unsigned b = 1; b <= 8; ++b) {
    EXPECT_EQ(parse_env({"GPUPOOL_LEADING_BITS=" + std::to_string(b)}).config.leading_bits, b);
  }
  EXPECT_EQ(good("GPUPOOL_LEADING_BITS", " 6 "), "6");
  EXPECT_EQ(good("GPUPOOL_LEADING_BITS", "08"), "8");
  for (const char* b : {"0", "9", "64", "-1", "", "4x", "four", "4.0", "+4", "0x4",
                        "99999999999999999999999", "4 4"})
    bad("GPUPOOL_LEADING_BITS", b);
  EXPECT_NE(bad("GPUPOOL_LEADING_BITS", "9").find("is out of range"), std::string::npos);
  EXPECT_NE(bad("GPUPOOL_LEADING_BITS", "-3").find("is negative"), std::string::npos);
  EXPECT_NE(bad("GPUPOOL_LEADING_BITS", "50%").find("is not an integer"), std::string::npos);
}

const SizeSpec& size_field(const Config& c, const std::string& name) {
  return name == "GPUPOOL_MAX_HELD"     ? c.max_held
         : name == "GPUPOOL_MAX_POOLED" ? c.max_pooled
                                        : c.pending_growth;
}

std::uint64_t bytes_of(const std::string& name, const std::string& value) {
  const Parsed p = parse_env({name + "=" + value});
  EXPECT_TRUE(p.diags.empty()) << name << "=" << value;
  const SizeSpec& s = size_field(p.config, name);
  EXPECT_FALSE(s.unlimited || s.percent) << value;
  return s.bytes;
}

TEST(Values, Sizes) {
  constexpr std::uint64_t K = 1024, M = K * K, G = M * K, T = G * K;
  for (const char* name : {"GPUPOOL_MAX_HELD", "GPUPOOL_MAX_POOLED", "GPUPOOL_PENDING_GROWTH"}) {
    const std::pair<const char*, std::uint64_t> cases[] = {{"0", 0},
                                                           {"1", 1},
                                                           {"4096", 4096},
                                                           {"4096B", 4096},
                                                           {"4096b", 4096},
                                                           {"64K", 64 * K},
                                                           {"64k", 64 * K},
                                                           {"64KiB", 64 * K},
                                                           {"64KB", 64 * K},
                                                           {"64kb", 64 * K},
                                                           {"64Ki", 64 * K},
                                                           {"64kib", 64 * K},
                                                           {"512M", 512 * M},
                                                           {"512MiB", 512 * M},
                                                           {"2G", 2 * G},
                                                           {"2GiB", 2 * G},
                                                           {"2GB", 2 * G},
                                                           {"1T", T},
                                                           {"3TiB", 3 * T},
                                                           {" 2 G ", 2 * G},
                                                           {"2 GiB", 2 * G},
                                                           {"007M", 7 * M},
                                                           {"18446744073709551615", UINT64_MAX},
                                                           {"16777215T", 16777215 * T},
                                                           {"17179869183G", 17179869183 * G}};
    for (const auto& [text, want] : cases) EXPECT_EQ(bytes_of(name, text), want) << text;
    // The shown form is the largest exact unit.
    EXPECT_EQ(good(name, "65536"), "64K");
    EXPECT_EQ(good(name, "1536M"), "1536M");
    EXPECT_EQ(good(name, "2048M"), "2G");
    EXPECT_EQ(good(name, "4097"), "4097");
    EXPECT_EQ(good(name, "unlimited"), "unlimited");
    EXPECT_EQ(good(name, " Unlimited "), "unlimited");
    EXPECT_EQ(good(name, "UNLIMITED"), "unlimited");
    for (const char* b : {"",
                          "  ",
                          "12Q",
                          "Q",
                          "K",
                          "1.5G",
                          "1,5G",
                          "-1",
                          "-1K",
                          "- 1",
                          "+1",
                          "0x10",
                          "1GG",
                          "1iB",
                          "1 K B i",
                          "1KiBB",
                          "1Gi B x",
                          "1e6",
                          "none",
                          "inf",
                          "18446744073709551616",
                          "16777216T",
                          "17179869184G",
                          "99999999999999999999999999T",
                          "1 2"})
      bad(name, b);
    EXPECT_NE(bad(name, "12Q").find("is not a size"), std::string::npos);
    EXPECT_NE(bad(name, "16777216T").find("overflows 64 bits"), std::string::npos);
    EXPECT_NE(bad(name, "18446744073709551616").find("overflows 64 bits"), std::string::npos);
    EXPECT_NE(bad(name, "-2G").find("is negative"), std::string::npos);
  }
}

TEST(Values, Percentages) {
  for (const char* name : {"GPUPOOL_MAX_HELD", "GPUPOOL_MAX_POOLED", "GPUPOOL_PENDING_GROWTH"}) {
    const std::pair<const char*, double> cases[] = {
        {"25%", 0.25}, {" 25 % ", 0.25}, {"12.5%", 0.125}, {"100%", 1.0},
        {"0%", 0.0},   {"0.5%", 0.005},  {"007%", 0.07}};
    for (const auto& [text, want] : cases) {
      const Parsed p = parse_env({std::string(name) + "=" + text});
      EXPECT_TRUE(p.diags.empty()) << text;
      const SizeSpec& s = size_field(p.config, name);
      EXPECT_TRUE(s.percent && !s.unlimited) << text;
      EXPECT_DOUBLE_EQ(s.fraction, want) << text;
    }
    EXPECT_EQ(good(name, "25%"), "25%");
    EXPECT_EQ(good(name, "12.5%"), "12.5%");
    for (const char* b : {"101%", "100.1%", "-5%", "%", " % ", "abc%", "1.%", ".5%", "25%%",
                          "25 %%", "1e2%", "5G%", "99999999999999999999999%"})
      bad(name, b);
    EXPECT_NE(bad(name, "150%").find("is more than 100%"), std::string::npos);
  }
  // Percent where the variable does not take it.
  EXPECT_NE(bad("GPUPOOL_LEADING_BITS", "50%").find("not an integer"), std::string::npos);
  bad("GPUPOOL_RELEASE_AFTER", "10%");
  bad("GPUPOOL_STATS_INTERVAL", "10%");
  bad("GPUPOOL_SIGNAL_STATS", "10%");
  SizeSpec s;
  std::string why;
  EXPECT_FALSE(parse_size("25%", false, &s, &why));
  EXPECT_EQ(why, "is a percentage, which this variable does not take");
  EXPECT_TRUE(parse_size("25%", true, &s, &why));
  EXPECT_TRUE(parse_size("2G", false, &s, &why));
  EXPECT_EQ(s.bytes, std::uint64_t{2} << 30);
}

TEST(Values, Resolve) {
  SizeSpec unlimited;
  EXPECT_EQ(unlimited.resolve(0), SIZE_MAX);
  EXPECT_EQ(unlimited.resolve(1 << 20), SIZE_MAX);
  SizeSpec s;
  ASSERT_TRUE(parse_size("25%", true, &s, nullptr));
  EXPECT_EQ(s.resolve(1000), 250u);
  EXPECT_EQ(s.resolve(0), 0u);
  EXPECT_EQ(s.resolve(std::size_t{80} << 30), std::size_t{20} << 30);
  ASSERT_TRUE(parse_size("100%", true, &s, nullptr));
  EXPECT_EQ(s.resolve(SIZE_MAX), SIZE_MAX);
  EXPECT_EQ(s.resolve(12345), 12345u);
  ASSERT_TRUE(parse_size("0%", true, &s, nullptr));
  EXPECT_EQ(s.resolve(SIZE_MAX), 0u);
  ASSERT_TRUE(parse_size("12.5%", true, &s, nullptr));
  EXPECT_EQ(s.resolve(1001), 125u);  // rounded down
  ASSERT_TRUE(parse_size("3G", true, &s, nullptr));
  EXPECT_EQ(s.resolve(1), std::size_t{3} << 30);  // bytes are not capped by the capacity
  ASSERT_TRUE(parse_size("0", true, &s, nullptr));
  EXPECT_EQ(s.resolve(SIZE_MAX), 0u);
}

TEST(Values, Durations) {
  constexpr std::uint64_t us = 1000, ms = 1000 * us, s = 1000 * ms;
  const std::pair<const char*, std::uint64_t> cases[] = {
      {"500ms", 500 * ms},
      {"10s", 10 * s},
      {"5m", 300 * s},
      {"1h", 3600 * s},
      {"250us", 250 * us},
      {"7ns", 7},
      {"30", 30 * s},
      {" 2 s ", 2 * s},
      {"2MS", 2 * ms},
      {"3min", 180 * s},
      {"0", 0},
      {"0s", 0},
      {"off", 0},
      {"OFF", 0},
      {"none", 0},
      {"18446744073709551615ns", UINT64_MAX},
      {"5124095h", std::uint64_t{5124095} * 3600 * s}};
  for (const char* name : {"GPUPOOL_RELEASE_AFTER", "GPUPOOL_STATS_INTERVAL"}) {
    for (const auto& [text, want] : cases) {
      const Parsed p = parse_env({std::string(name) + "=" + text});
      EXPECT_TRUE(p.diags.empty()) << text;
      const std::uint64_t got = std::string(name) == "GPUPOOL_RELEASE_AFTER"
                                    ? p.config.release_after_ns
                                    : p.config.stats_interval_ns;
      EXPECT_EQ(got, want) << name << "=" << text;
    }
    EXPECT_EQ(good(name, "90s"), "90s");
    EXPECT_EQ(good(name, "120s"), "2m");
    EXPECT_EQ(good(name, "1500ms"), "1500ms");
    EXPECT_EQ(good(name, "0"), "off");
    for (const char* b :
         {"", " ", "-1", "-1s", "10x", "1.5s", "s", "ms", "10 s s", "1d", "18446744073709551616",
          "5124096h", "99999999999999999999h", "on", "10sec", "1e3"})
      bad(name, b);
    EXPECT_NE(bad(name, "10x").find("is not a duration"), std::string::npos);
    EXPECT_NE(bad(name, "5124096h").find("overflows"), std::string::npos);
    EXPECT_NE(bad(name, "-10ms").find("is negative"), std::string::npos);
  }
  std::uint64_t ns = 1;
  EXPECT_TRUE(parse_duration("10s", &ns, nullptr));
  EXPECT_EQ(ns, 10 * s);
  EXPECT_FALSE(parse_duration("10q", &ns, nullptr));
}

TEST(Values, Split) {
  constexpr std::uint64_t MiB = 1 << 20;
  const std::pair<const char*, std::uint64_t> cases[] = {
      {"off", 0},   {"0", 0},          {"no", 0},           {"on", MiB},    {"1", MiB},
      {"YES", MiB}, {"4MiB", 4 * MiB}, {"512K", 512 << 10}, {"4KiB", 4096}, {" 2M ", 2 * MiB}};
  for (const auto& [text, want] : cases) {
    const Parsed p = parse_env({std::string("GPUPOOL_SPLIT=") + text});
    EXPECT_TRUE(p.diags.empty()) << text;
    EXPECT_EQ(p.config.split, want) << text;
  }
  EXPECT_EQ(parse_env({}).config.split, 0u);
  EXPECT_EQ(good("GPUPOOL_SPLIT", "on"), "1M");
  EXPECT_EQ(good("GPUPOOL_SPLIT", "off"), "off");
  for (const char* b : {"", "2", "4096", "1K", "-1M", "50%", "unlimited", "maybe", "1MiBs"})
    bad("GPUPOOL_SPLIT", b);
  EXPECT_NE(bad("GPUPOOL_SPLIT", "2").find("without a unit"), std::string::npos);
  EXPECT_NE(bad("GPUPOOL_SPLIT", "1K").find("under 4KiB"), std::string::npos);
}

TEST(Values, Reuse) {
  EXPECT_EQ(parse_env({"GPUPOOL_REUSE=immediate"}).config.reuse, Reuse::immediate);
  EXPECT_EQ(parse_env({"GPUPOOL_REUSE= Immediate "}).config.reuse, Reuse::immediate);
  EXPECT_EQ(parse_env({"GPUPOOL_REUSE=SAFE"}).config.reuse, Reuse::safe);
  EXPECT_EQ(parse_env({"GPUPOOL_REUSE=fenced"}).config.reuse, Reuse::fenced);
  EXPECT_EQ(parse_env({"GPUPOOL_REUSE=Ordered"}).config.reuse, Reuse::ordered);
  for (const char* b : {"", "fast", "unsafe", "1", "safe immediate"}) bad("GPUPOOL_REUSE", b);
}

TEST(Values, NeighbourScope) {
  EXPECT_EQ(Config{}.neighbours, Neighbours::user);
  const std::pair<const char*, Neighbours> cases[] = {
      {"user", Neighbours::user}, {"1", Neighbours::user},   {"yes", Neighbours::user},
      {" ALL ", Neighbours::all}, {"all", Neighbours::all},  {"off", Neighbours::off},
      {"0", Neighbours::off},     {"false", Neighbours::off}};
  for (const auto& [text, want] : cases)
    EXPECT_EQ(parse_env({std::string("GPUPOOL_NEIGHBOURS=") + text}).config.neighbours, want)
        << text;
  for (const char* b : {"", "users", "everyone", "2", "user all"}) bad("GPUPOOL_NEIGHBOURS", b);
  EXPECT_NE(bad("GPUPOOL_NEIGHBOURS", "node").find("is not a neighbour scope"), std::string::npos);
}

TEST(Values, LogLevel) {
  const std::pair<const char*, LogLevel> cases[] = {
      {"off", LogLevel::off},     {"error", LogLevel::error},  {"warn", LogLevel::warn},
      {"info", LogLevel::info},   {"debug", LogLevel::debug},  {"trace", LogLevel::trace},
      {"DEBUG", LogLevel::debug}, {"warning", LogLevel::warn}, {"err", LogLevel::error},
      {" info ", LogLevel::info}, {"none", LogLevel::off},     {"0", LogLevel::off}};
  for (const auto& [text, want] : cases)
    EXPECT_EQ(parse_env({std::string("GPUPOOL_LOG=") + text}).config.log_level, want) << text;
  for (const char* b : {"", "verbose", "5", "critical!", "all"}) bad("GPUPOOL_LOG", b);
}

TEST(Values, StatsFormat) {
  EXPECT_EQ(parse_env({"GPUPOOL_STATS_FORMAT=json"}).config.stats_format, StatsFormat::json);
  EXPECT_EQ(parse_env({"GPUPOOL_STATS_FORMAT=JSON"}).config.stats_format, StatsFormat::json);
  EXPECT_EQ(parse_env({"GPUPOOL_STATS_FORMAT=text"}).config.stats_format, StatsFormat::text);
  for (const char* b : {"", "xml", "csv", "table"}) bad("GPUPOOL_STATS_FORMAT", b);
}

TEST(Values, Paths) {
  for (const char* name : {"GPUPOOL_LOG_FILE", "GPUPOOL_STATS_FILE", "GPUPOOL_PROMETHEUS_FILE",
                           "GPUPOOL_TRACE_FILE"}) {
    // Taken verbatim: file names may start or end with spaces.
    EXPECT_EQ(good(name, "/tmp/a b/stats-%p.txt "), "/tmp/a b/stats-%p.txt ");
    EXPECT_EQ(good(name, ""), "");
    EXPECT_EQ(good(name, "x=y"), "x=y");  // only the first '=' separates the name
  }
  const Parsed p = parse_env({"GPUPOOL_STATS_FILE=/tmp/s.%p", "GPUPOOL_TRACE_FILE=t",
                              "GPUPOOL_PROMETHEUS_FILE=p", "GPUPOOL_LOG_FILE=l"});
  EXPECT_EQ(p.config.stats_file, "/tmp/s.%p");
  EXPECT_EQ(p.config.trace_file, "t");
  EXPECT_EQ(p.config.prometheus_file, "p");
  EXPECT_EQ(p.config.log_file, "l");
}

TEST(Values, RunPid) {
  EXPECT_EQ(parse(nullptr, nullptr).run_pid, 0);
  EXPECT_EQ(parse_env({"GPUPOOL_RUN_PID=4242"}).config.run_pid, 4242);
  EXPECT_EQ(parse_env({"GPUPOOL_RUN_PID= 7 "}).config.run_pid, 7);
  EXPECT_EQ(parse_env({"GPUPOOL_RUN_PID=none"}).config.run_pid, 0);
  for (const char* b : {"", "0", "-1", "12x", "99999999999"}) bad("GPUPOOL_RUN_PID", b);
}

TEST(Values, FirstDefinitionWins) {
  // As getenv() does; a later duplicate is not re-checked.
  const Parsed p = parse_env(
      {"GPUPOOL_LEADING_BITS=6", "GPUPOOL_LEADING_BITS=garbage", "GPUPOOL_LEADING_BITS=7"});
  EXPECT_EQ(p.config.leading_bits, 6u);
  EXPECT_TRUE(p.diags.empty());
}

TEST(Values, BadValueKeepsDefaultOthersApply) {
  const Parsed p = parse_env({"GPUPOOL_MAX_HELD=12Q", "GPUPOOL_LEADING_BITS=5",
                              "GPUPOOL_HOLD=perhaps", "GPUPOOL_REUSE=immediate"});
  EXPECT_EQ(p.diags.size(), 2u);
  EXPECT_TRUE(p.config.max_held.unlimited);
  EXPECT_TRUE(p.config.hold);
  EXPECT_EQ(p.config.leading_bits, 5u);
  EXPECT_EQ(p.config.reuse, Reuse::immediate);
}

TEST(Values, EntriesWithoutEqualsAreIgnored) {
  const Parsed p = parse_env({"GPUPOOL_LOG", "GPUPOOL_", "GPUPOOL_HOLD=0"});
  EXPECT_TRUE(p.diags.empty());
  EXPECT_FALSE(p.config.hold);
}

}  // namespace
}  // namespace gpupool::config::test
