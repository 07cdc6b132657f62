// Signal values and two actions on one signal.
#include <csignal>

#include "tests/config/test_util.hpp"

namespace gpupool::config::test {
namespace {

int sig(const std::string& text) {
  std::string why;
  const int s = parse_signal(text, &why);
  EXPECT_GE(s, 0) << text << ": " << why;
  return s;
}

std::string refused(const std::string& text) {
  std::string why;
  EXPECT_EQ(parse_signal(text, &why), -1) << text;
  EXPECT_FALSE(why.empty()) << text;
  return why;
}

TEST(Signals, Names) {
  EXPECT_EQ(sig("USR1"), SIGUSR1);
  EXPECT_EQ(sig("SIGUSR1"), SIGUSR1);
  EXPECT_EQ(sig("usr2"), SIGUSR2);
  EXPECT_EQ(sig("SigUsr2"), SIGUSR2);
  EXPECT_EQ(sig(" SIGUSR2 "), SIGUSR2);
  EXPECT_EQ(sig("10"), SIGUSR1);
  EXPECT_EQ(sig(std::to_string(SIGRTMIN)), SIGRTMIN);
  EXPECT_EQ(sig(std::to_string(SIGRTMAX)), SIGRTMAX);
  EXPECT_EQ(sig("RTMIN"), SIGRTMIN);
  EXPECT_EQ(sig("SIGRTMIN"), SIGRTMIN);
  EXPECT_EQ(sig("SIGRTMIN+3"), SIGRTMIN + 3);
  EXPECT_EQ(sig("rtmin+0"), SIGRTMIN);
  EXPECT_EQ(sig("RTMIN + 3"), SIGRTMIN + 3);
  EXPECT_EQ(sig("RTMAX"), SIGRTMAX);
  EXPECT_EQ(sig("RTMAX-1"), SIGRTMAX - 1);
  EXPECT_EQ(sig("SIGRTMAX-" + std::to_string(SIGRTMAX - SIGRTMIN)), SIGRTMIN);
  EXPECT_EQ(sig("RTMIN+" + std::to_string(SIGRTMAX - SIGRTMIN)), SIGRTMAX);
  for (const char* none : {"none", "NONE", "off", "Off", "0", " none "}) EXPECT_EQ(sig(none), 0);
}

TEST(Signals, Refused) {
  EXPECT_EQ(refused("KILL"), "cannot be caught");
  EXPECT_EQ(refused("SIGSTOP"), "cannot be caught");
  EXPECT_EQ(refused("9"), "cannot be caught");
  EXPECT_EQ(refused(std::to_string(SIGSTOP)), "cannot be caught");
  for (const char* fault :
       {"SEGV", "SIGBUS", "ILL", "FPE", "ABRT", "IOT", "TRAP", "SYS", "11", "6"})
    EXPECT_NE(refused(fault).find("fault"), std::string::npos) << fault;
  // glibc's internal signals, between SIGSYS and SIGRTMIN.
  for (int s = SIGSYS + 1; s < SIGRTMIN; ++s)
    EXPECT_EQ(refused(std::to_string(s)), "is reserved by the C library") << s;
  for (const char* b : {"",
                        " ",
                        "FOO",
                        "SIGFOO",
                        "USR3",
                        "SIG",
                        "SIGUSR1X",
                        "USR 1",
                        "0x10",
                        "1.5",
                        "-10",
                        "-USR1",
                        "RTMIN-1",
                        "RTMAX+1",
                        "RTMIN+",
                        "RTMIN+x",
                        "RTMIN+99",
                        "RTMAX-99",
                        "RTMIN+99999999999999999999999",
                        "RTMINX",
                        "99999999999999999999999",
                        "10%"})
    refused(b);
  refused(std::to_string(SIGRTMAX + 1));
  // Signals whose default action programs and people rely on: a handler of
  // gpupool's would stop `kill -TERM` from ending the program, Ctrl-C from
  // interrupting it, and so on.
  for (const char* kept :
       {"TERM", "SIGINT", "HUP",  "QUIT",  "PIPE", "CHLD", "CLD",  "ALRM", "CONT",
        "TSTP", "TTIN",   "TTOU", "WINCH", "URG",  "IO",   "POLL", "PWR",  "XCPU",
        "XFSZ", "VTALRM", "PROF", "1",     "2",    "15",   "17"})
    EXPECT_EQ(refused(kept), "has a default action programs rely on") << kept;
  EXPECT_EQ(refused("65536"), "is not a signal number");
}

TEST(Signals, NameRoundTrip) {
  for (int s = 1; s <= SIGRTMAX; ++s) {
    std::string why;
    if (parse_signal(std::to_string(s), &why) < 0) continue;
    const std::string name = signal_name(s);
    EXPECT_EQ(parse_signal(name, &why), s) << name;
    EXPECT_EQ(parse_signal("SIG" + name, &why), s) << name;
  }
  EXPECT_EQ(signal_name(0), "none");
  EXPECT_EQ(signal_name(SIGUSR1), "USR1");
  EXPECT_EQ(signal_name(SIGRTMIN + 3), "RTMIN+3");
  EXPECT_EQ(signal_name(SIGRTMAX - 1), "RTMAX-1");
}

TEST(Signals, Variables) {
  const Parsed p = parse_env({"GPUPOOL_SIGNAL_STATS=SIGRTMIN+3", "GPUPOOL_SIGNAL_FREE_HELD=none",
                              "GPUPOOL_SIGNAL_STOP_HOLDING=USR2"});
  EXPECT_TRUE(p.diags.empty());
  EXPECT_EQ(p.config.signal_stats, SIGRTMIN + 3);
  EXPECT_EQ(p.config.signal_free_held, 0);
  EXPECT_EQ(p.config.signal_stop_holding, SIGUSR2);
  for (const char* name :
       {"GPUPOOL_SIGNAL_STATS", "GPUPOOL_SIGNAL_FREE_HELD", "GPUPOOL_SIGNAL_STOP_HOLDING"}) {
    EXPECT_EQ(good(name, "RTMIN+2"), "RTMIN+2");
    EXPECT_NE(bad(name, "TERM").find("default action"), std::string::npos);
    EXPECT_EQ(good(name, "off"), "none");
    EXPECT_NE(bad(name, "KILL").find("cannot be caught"), std::string::npos);
    EXPECT_NE(bad(name, "SEGV").find("fault"), std::string::npos);
    for (const char* b : {"", "FOO", "-1", "999"}) bad(name, b);
  }
}

// A clash: exactly one diagnostic, naming the variable that loses.
void one_clash(const Parsed& p, const std::string& loser) {
  ASSERT_EQ(p.diags.size(), 1u);
  EXPECT_EQ(p.diags[0].variable, loser);
  EXPECT_EQ(p.diags[0].level, LogLevel::warn);
  EXPECT_NE(p.diags[0].message.find("is the signal of"), std::string::npos) << p.diags[0].message;
}

TEST(Signals, ExplicitValueBeatsAnotherDefault) {
  // STATS takes FREE_HELD's default: FREE_HELD is left with none.
  Parsed p = parse_env({"GPUPOOL_SIGNAL_STATS=USR2"});
  one_clash(p, "GPUPOOL_SIGNAL_FREE_HELD");
  EXPECT_EQ(p.config.signal_stats, SIGUSR2);
  EXPECT_EQ(p.config.signal_free_held, 0);
  EXPECT_EQ(p.diags[0].message,
            "GPUPOOL_SIGNAL_FREE_HELD's default \"USR2\" is the signal of GPUPOOL_SIGNAL_STATS "
            "already; using none for GPUPOOL_SIGNAL_FREE_HELD");
  // STOP_HOLDING (later in the table) takes STATS's default.
  p = parse_env({"GPUPOOL_SIGNAL_STOP_HOLDING=SIGUSR1"});
  one_clash(p, "GPUPOOL_SIGNAL_STATS");
  EXPECT_EQ(p.config.signal_stop_holding, SIGUSR1);
  EXPECT_EQ(p.config.signal_stats, 0);
  EXPECT_EQ(p.config.signal_free_held, SIGUSR2);
}

TEST(Signals, TwoExplicitValues) {
  // The later one in the table goes back to its default when that is free...
  Parsed p = parse_env({"GPUPOOL_SIGNAL_FREE_HELD=RTMIN", "GPUPOOL_SIGNAL_STATS=RTMIN"});
  one_clash(p, "GPUPOOL_SIGNAL_FREE_HELD");
  EXPECT_EQ(p.config.signal_stats, SIGRTMIN);
  EXPECT_EQ(p.config.signal_free_held, SIGUSR2);
  EXPECT_EQ(p.diags[0].message,
            "GPUPOOL_SIGNAL_FREE_HELD=\"RTMIN\" is the signal of GPUPOOL_SIGNAL_STATS already; "
            "using the default (USR2) for GPUPOOL_SIGNAL_FREE_HELD");
  // ...and to none when it is not (STOP_HOLDING's default is none anyway).
  p = parse_env({"GPUPOOL_SIGNAL_STATS=USR2", "GPUPOOL_SIGNAL_FREE_HELD=USR2"});
  // FREE_HELD's default (USR2) is taken by STATS: none.
  one_clash(p, "GPUPOOL_SIGNAL_FREE_HELD");
  EXPECT_EQ(p.config.signal_free_held, 0);
  p = parse_env({"GPUPOOL_SIGNAL_STATS=RTMAX", "GPUPOOL_SIGNAL_STOP_HOLDING=RTMAX"});
  one_clash(p, "GPUPOOL_SIGNAL_STOP_HOLDING");
  EXPECT_EQ(p.config.signal_stats, SIGRTMAX);
  EXPECT_EQ(p.config.signal_stop_holding, 0);
  EXPECT_EQ(p.config.signal_free_held, SIGUSR2);
  // Spellings of one signal clash too.
  p = parse_env({"GPUPOOL_SIGNAL_STATS=10", "GPUPOOL_SIGNAL_STOP_HOLDING=SIGUSR1"});
  one_clash(p, "GPUPOOL_SIGNAL_STOP_HOLDING");
}

TEST(Signals, NoClash) {
  // Swapping the defaults is fine, and so is freeing one up for another.
  Parsed p = parse_env({"GPUPOOL_SIGNAL_STATS=USR2", "GPUPOOL_SIGNAL_FREE_HELD=USR1"});
  EXPECT_TRUE(p.diags.empty());
  EXPECT_EQ(p.config.signal_stats, SIGUSR2);
  EXPECT_EQ(p.config.signal_free_held, SIGUSR1);
  p = parse_env({"GPUPOOL_SIGNAL_STATS=none", "GPUPOOL_SIGNAL_STOP_HOLDING=USR1"});
  EXPECT_TRUE(p.diags.empty());
  EXPECT_EQ(p.config.signal_stop_holding, SIGUSR1);
  p = parse_env({"GPUPOOL_SIGNAL_STATS=none", "GPUPOOL_SIGNAL_FREE_HELD=off"});
  EXPECT_TRUE(p.diags.empty());
  // A refused value keeps its default, which then counts for clashes.
  p = parse_env({"GPUPOOL_SIGNAL_STATS=KILL", "GPUPOOL_SIGNAL_STOP_HOLDING=USR1"});
  ASSERT_EQ(p.diags.size(), 2u);
  EXPECT_EQ(p.config.signal_stop_holding, SIGUSR1);
  EXPECT_EQ(p.config.signal_stats, 0);
}

}  // namespace
}  // namespace gpupool::config::test
