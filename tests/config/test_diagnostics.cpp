// The wording of problems, unknown names, hostile values, secure execution.
#include "tests/config/test_util.hpp"

namespace gpupool::config::test {
namespace {

TEST(Diagnostics, BadValueWording) {
  EXPECT_EQ(bad("GPUPOOL_MAX_HELD", "12Q"),
            "GPUPOOL_MAX_HELD=\"12Q\" is not a size (accepted: bytes with optional K/M/G/T[i][B] "
            "suffix, binary (1K = 1024), or N% of the device's memory, or unlimited); using the "
            "default (unlimited)");
  EXPECT_EQ(bad("GPUPOOL_LEADING_BITS", "9"),
            "GPUPOOL_LEADING_BITS=\"9\" is out of range (accepted: an integer from 1 to 8); using "
            "the default (4)");
  EXPECT_EQ(bad("GPUPOOL_RELEASE_AFTER", "soon"),
            "GPUPOOL_RELEASE_AFTER=\"soon\" is not a duration (accepted: a number with unit ns, "
            "us, ms, s, m or h (no unit: seconds), or off); using the default (1m)");
  EXPECT_EQ(bad("GPUPOOL_SIGNAL_STATS", "SIGKILL"),
            "GPUPOOL_SIGNAL_STATS=\"SIGKILL\" cannot be caught (accepted: USR1, USR2, a real-time "
            "signal (RTMIN+n, RTMAX-n, or its number), or none); using the default (USR1)");
  EXPECT_EQ(bad("GPUPOOL_SIGNAL_FREE_HELD", "TERM"),
            "GPUPOOL_SIGNAL_FREE_HELD=\"TERM\" has a default action programs rely on (accepted: "
            "USR1, USR2, a real-time signal (RTMIN+n, RTMAX-n, or its number), or none); using "
            "the default (USR2)");
  EXPECT_EQ(bad("GPUPOOL_HOLD", ""),
            "GPUPOOL_HOLD=\"\" is empty (accepted: 1/0, true/false, yes/no, on/off); using the "
            "default (1)");
}

TEST(Diagnostics, EveryTypedVariableRefusesGarbageAndEmpty) {
  for (const OptionInfo& o : options()) {
    if (std::string(o.type) == "path") continue;  // any text is a file name
    bad(o.name, "garbage!");
    bad(o.name, "");
    bad(o.name, "-1x");
  }
}

TEST(Diagnostics, HostileValuesAreEscapedAndCut) {
  const std::string m = bad("GPUPOOL_LOG", "x\"\n\x1b[31mgpupool: error: forged\\");
  EXPECT_EQ(m.find('\n'), std::string::npos);
  EXPECT_EQ(m.find('\x1b'), std::string::npos);
  EXPECT_EQ(
      m.rfind("GPUPOOL_LOG=\"x\\\"\\x0a\\x1b[31mgpupool: error: forged\\\\\" is not a log level",
              0),
      0u)
      << m;
  const std::string long_value(10000, '7');
  const std::string m2 = bad("GPUPOOL_LEADING_BITS", long_value);
  EXPECT_LT(m2.size(), 400u);
  EXPECT_NE(m2.find("\"..."), std::string::npos);
}

std::string unknown(const std::string& entry) {
  const Parsed p = parse_env({entry, "GPUPOOL_HOLD=0"});
  EXPECT_FALSE(p.config.hold);  // the rest still applies
  EXPECT_EQ(p.diags.size(), 1u) << entry;
  if (p.diags.size() != 1) return "";
  EXPECT_EQ(p.diags[0].level, LogLevel::warn);
  EXPECT_EQ(p.diags[0].variable, entry.substr(0, entry.find('=')));
  return p.diags[0].message;
}

std::string suggestion(const std::string& entry) {
  const std::string m = unknown(entry);
  const std::string key = "; did you mean ";
  const std::size_t at = m.find(key);
  if (at == std::string::npos) return "";
  return m.substr(at + key.size(), m.size() - at - key.size() - 1);
}

TEST(Diagnostics, UnknownNames) {
  EXPECT_EQ(unknown("GPUPOOL_MAX_HLED=2G"),
            "GPUPOOL_MAX_HLED is not a gpupool variable and is ignored; did you mean "
            "GPUPOOL_MAX_HELD?");
  EXPECT_EQ(suggestion("GPUPOOL_MAXHELD=1"), "GPUPOOL_MAX_HELD");
  EXPECT_EQ(suggestion("GPUPOOL_MAX_POOL=1"), "GPUPOOL_MAX_POOLED");
  EXPECT_EQ(suggestion("GPUPOOL_LOGFILE=x"), "GPUPOOL_LOG_FILE");
  EXPECT_EQ(suggestion("GPUPOOL_LOG_LEVEL=debug"), "GPUPOOL_LOG");
  EXPECT_EQ(suggestion("GPUPOOL_STATS_FILE_PATH=x"), "GPUPOOL_STATS_FILE");
  EXPECT_EQ(suggestion("GPUPOOL_max_held=1"), "GPUPOOL_MAX_HELD");
  EXPECT_EQ(suggestion("GPUPOOL_DISABLED=1"), "GPUPOOL_DISABLE");
  EXPECT_EQ(suggestion("GPUPOOL_OPEN_CL=0"), "GPUPOOL_OPENCL");
  EXPECT_EQ(suggestion("GPUPOOL_SIGNAL_FREEHELD=USR2"), "GPUPOOL_SIGNAL_FREE_HELD");
  EXPECT_EQ(suggestion("GPUPOOL_STATS_INTERVALL=1s"), "GPUPOOL_STATS_INTERVAL");
  EXPECT_EQ(suggestion("GPUPOOL_STATS=1"), "GPUPOOL_STATS_FILE");
  EXPECT_EQ(suggestion("GPUPOOL_RELAESE_AFTER=1s"), "GPUPOOL_RELEASE_AFTER");
  // Nothing close: no guess, a pointer to the list instead.
  EXPECT_EQ(unknown("GPUPOOL_XYZZY_FROBNICATE=1"),
            "GPUPOOL_XYZZY_FROBNICATE is not a gpupool variable and is ignored (`gpupool env` "
            "lists them)");
  EXPECT_EQ(suggestion("GPUPOOL_=1"), "");
  EXPECT_EQ(suggestion("GPUPOOL_" + std::string(5000, 'A') + "=1"), "");
  // Other prefixes are not ours.
  EXPECT_TRUE(
      parse_env({"gpupool_max_hled=1", "GPUPOOLMAX_HELD=1", "MY_GPUPOOL_X=1"}).diags.empty());
}

TEST(Diagnostics, Secure) {
  const char* env[] = {"GPUPOOL_LEADING_BITS=7", "GPUPOOL_DISABLE=1",    "GPUPOOL_LOG_FILE=/tmp/x",
                       "GPUPOOL_BOGUS=1",        "GPUPOOL_MAX_HELD=12Q", nullptr};
  std::vector<Diagnostic> d;
  const Config c = load(env, true, &d);
  const Config defaults = parse(nullptr, nullptr);
  for (const OptionInfo& o : options())
    EXPECT_EQ(value_text(c, o.name), value_text(defaults, o.name)) << o.name;
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].level, LogLevel::debug);
  EXPECT_NE(d[0].message.find("secure-execution"), std::string::npos);
  d.clear();
  const Config plain = load(env, false, &d);
  EXPECT_EQ(plain.leading_bits, 7u);
  EXPECT_TRUE(plain.disable);
  EXPECT_EQ(d.size(), 2u);  // GPUPOOL_BOGUS and the bad size
}

}  // namespace
}  // namespace gpupool::config::test
