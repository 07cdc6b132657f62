// config::get() and log() in a fresh process (config_dump), as the shim uses
// them: diagnostics logged once however many threads race, the log file, and
// a real secure-execution (setuid) process.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "sys/process_config.hpp"
#include "tests/config/test_util.hpp"
#include "tests/test_util.hpp"

namespace gpupool::config::test {
namespace {

std::size_t count(const std::string& hay, const std::string& needle) {
  std::size_t n = 0;
  for (std::size_t at = hay.find(needle); at != std::string::npos; at = hay.find(needle, at + 1))
    ++n;
  return n;
}

// A directory of the test's own (/tmp/gpupool-config-test-XXXXXX).
struct Dir : gpupool::test::TempDir {
  Dir() : TempDir("config-test") {}
};

struct Result {
  int status = -1;
  std::string out, err;
  std::string value(const std::string& name) const {
    const std::string key = "\n" + name + "=";
    const std::size_t at = ("\n" + out).find(key);
    if (at == std::string::npos) return "<missing>";
    const std::size_t b = at + key.size() - 1, e = out.find('\n', b);
    return out.substr(b, e - b);
  }
};

// Runs `program args` with exactly `env`, stdout/stderr into files of `dir`.
Result run(const Dir& dir, const std::string& program, std::vector<std::string> args,
           std::vector<std::string> env) {
  args.insert(args.begin(), program);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const std::string out = dir.path + "/out", err = dir.path + "/err";
  const pid_t pid = fork();
  if (pid == 0) {
    const int o = open(out.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    const int e = open(err.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(o, 1);
    dup2(e, 2);
    execve(program.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  Result r;
  // A hang is a failure, not a stuck test run.
  for (int waited_ms = 0;; waited_ms += 10) {
    if (waitpid(pid, &r.status, WNOHANG) == pid) break;
    if (waited_ms >= 60'000) {
      kill(pid, SIGKILL);
      waitpid(pid, &r.status, 0);
      r.status = -2;
      ADD_FAILURE() << program << " hung (killed after 60 s)";
      break;
    }
    usleep(10'000);
  }
  r.out = slurp(out);
  r.err = slurp(err);
  return r;
}

TEST(Process, DiagnosticsLoggedOnceWhileThreadsRace) {
  for (const char* first : {"", "--log-first"}) {
    Dir d;
    const std::string log = d.path + "/log";
    { std::ofstream(log) << "earlier line\n"; }
    std::vector<std::string> args = {"--threads", "16"};
    if (*first) args.push_back(first);
    const Result r = run(d, CONFIG_DUMP, args,
                         {"GPUPOOL_MAX_HELD=12Q", "GPUPOOL_MAX_HLED=1", "GPUPOOL_LEADING_BITS=6",
                          "GPUPOOL_LOG_FILE=" + log});
    ASSERT_EQ(r.status, 0) << r.err;
    EXPECT_EQ(r.err, "");
    EXPECT_EQ(r.value("GPUPOOL_LEADING_BITS"), "6");
    EXPECT_EQ(r.value("GPUPOOL_MAX_HELD"), "unlimited");
    const std::string text = slurp(log);
    EXPECT_EQ(text.rfind("earlier line\n", 0), 0u);
    EXPECT_EQ(count(text, "GPUPOOL_MAX_HELD=\"12Q\" is not a size"), 1u) << text;
    EXPECT_EQ(count(text, "GPUPOOL_MAX_HLED is not a gpupool variable"), 1u) << text;
    EXPECT_EQ(count(text, "]: warning: thread "), 16u) << text;
    EXPECT_EQ(count(text, "debug "), 0u) << text;
    // Whole lines only, each with the prefix.
    std::istringstream lines(text.substr(std::string("earlier line\n").size()));
    for (std::string line; std::getline(lines, line);)
      EXPECT_EQ(line.rfind("gpupool[", 0), 0u) << line;
    EXPECT_EQ(text.back(), '\n');
  }
}

TEST(Process, StderrByDefault) {
  Dir d;
  const Result r =
      run(d, CONFIG_DUMP, {"--threads", "2"}, {"GPUPOOL_LOG=debug", "GPUPOOL_REUSE=sometimes"});
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(count(r.err, "GPUPOOL_REUSE=\"sometimes\" is not a reuse mode"), 1u) << r.err;
  EXPECT_EQ(count(r.err, "]: debug: debug "), 2u) << r.err;
  EXPECT_EQ(r.value("GPUPOOL_LOG"), "debug");
}

TEST(Process, BadLevelReportedAtDefaultLevel) {
  Dir d;
  const Result r = run(d, CONFIG_DUMP, {}, {"GPUPOOL_LOG=loud"});
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(count(r.err, "]: warning: GPUPOOL_LOG=\"loud\" is not a log level"), 1u) << r.err;
}

TEST(Process, LogOffIsSilent) {
  Dir d;
  const Result r = run(d, CONFIG_DUMP, {"--threads", "4"},
                       {"GPUPOOL_LOG=off", "GPUPOOL_MAX_HELD=12Q", "GPUPOOL_NOPE=1"});
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(r.err, "");
}

TEST(Process, UnopenableLogFileSaidOnceOnStderr) {
  Dir d;
  const Result r = run(d, CONFIG_DUMP, {"--threads", "8"},
                       {"GPUPOOL_LOG_FILE=" + d.path + "/no/such/dir/log", "GPUPOOL_HOLD=2"});
  ASSERT_EQ(r.status, 0);
  EXPECT_EQ(count(r.err, "GPUPOOL_LOG_FILE=\"" + d.path + "/no/such/dir/log\": cannot open"), 1u)
      << r.err;
  EXPECT_EQ(count(r.err, "GPUPOOL_HOLD=\"2\" is not a boolean"), 1u) << r.err;
  EXPECT_EQ(count(r.err, "]: warning: thread "), 8u) << r.err;
}

// GPUPOOL_LOG_FILE gets what the stats and trace files get: never a FIFO
// (whose open would wait for a reader forever), never through a symbolic
// link, never another user's file; %p is the pid.
TEST(Process, LogFileNeverBlocksOnAFifo) {
  Dir d;
  const std::string fifo = d.path + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const char* level : {"off", "warn"}) {
    const Result r = run(d, CONFIG_DUMP, {"--threads", "2"},
                         {"GPUPOOL_LOG_FILE=" + fifo, std::string("GPUPOOL_LOG=") + level});
    EXPECT_EQ(r.status, 0) << level;
    if (std::string(level) == "warn") {
      EXPECT_EQ(count(r.err, "GPUPOOL_LOG_FILE=\"" + fifo + "\": refusing " + fifo +
                                 ": not a regular file; logging to stderr"),
                1u)
          << r.err;
      EXPECT_EQ(count(r.err, "]: warning: thread "), 2u) << r.err;
    } else {
      EXPECT_EQ(r.err, "");
    }
  }
}

TEST(Process, LogFileRefusesSymlinksAndOtherUsersFiles) {
  Dir d;
  const std::string target = d.path + "/target", link = d.path + "/link";
  { std::ofstream(target) << "keep\n"; }
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  Result r = run(d, CONFIG_DUMP, {"--threads", "1"}, {"GPUPOOL_LOG_FILE=" + link});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(slurp(target), "keep\n");
  EXPECT_EQ(count(r.err, "symbolic link"), 1u) << r.err;
  EXPECT_EQ(count(r.err, "]: warning: thread 0"), 1u) << r.err;
  if (geteuid() == 0) {
    const std::string theirs = d.path + "/theirs";
    { std::ofstream(theirs) << "theirs\n"; }
    ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
    r = run(d, CONFIG_DUMP, {"--threads", "1"}, {"GPUPOOL_LOG_FILE=" + theirs});
    EXPECT_EQ(r.status, 0);
    EXPECT_EQ(slurp(theirs), "theirs\n");
    EXPECT_EQ(count(r.err, "owned by uid 65534"), 1u) << r.err;
  }
}

TEST(Process, LogFileNamesThePid) {
  Dir d;
  const Result r =
      run(d, CONFIG_DUMP, {"--threads", "3"}, {"GPUPOOL_LOG_FILE=" + d.path + "/log.%p"});
  EXPECT_EQ(r.status, 0);
  EXPECT_EQ(r.err, "");
  FILE* p = popen(("ls '" + d.path + "' | grep '^log\\.[0-9][0-9]*$'").c_str(), "r");
  char name[256] = {};
  ASSERT_NE(fgets(name, sizeof name, p), nullptr);
  pclose(p);
  std::string file = name;
  file.pop_back();
  EXPECT_EQ(count(slurp(d.path + "/" + file), "]: warning: thread "), 3u);
  EXPECT_EQ(count(slurp(d.path + "/" + file), "gpupool[" + file.substr(4) + "]"), 3u);
}

// A setuid program gets AT_SECURE from the kernel: gpupool must then not read
// the environment (it could be an attacker's, e.g. GPUPOOL_LOG_FILE pointing
// at a file the program's owner may write).
TEST(Process, SecureExecutionReadsNoEnvironment) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to make a setuid copy of config_dump";
  Dir d;
  chmod(d.path.c_str(), 0755);
  const std::string copy = d.path + "/dump";
  {
    std::ifstream in(CONFIG_DUMP, std::ios::binary);
    std::ofstream out(copy, std::ios::binary);
    out << in.rdbuf();
  }
  ASSERT_EQ(chown(copy.c_str(), 65534, 65534), 0);
  ASSERT_EQ(chmod(copy.c_str(), 04755), 0);
  const std::string log = d.path + "/log";
  const std::vector<std::string> env = {"GPUPOOL_LEADING_BITS=7", "GPUPOOL_DISABLE=1",
                                        "GPUPOOL_LOG_FILE=" + log, "GPUPOOL_MAX_HELD=12Q"};
  const Result secure = run(d, copy, {"--quick-exit"}, env);
  ASSERT_EQ(secure.status, 0) << secure.err;
  if (secure.value("AT_SECURE") != "1") GTEST_SKIP() << "setuid not honoured here (nosuid mount?)";
  EXPECT_EQ(secure.value("GPUPOOL_LEADING_BITS"), "4");
  EXPECT_EQ(secure.value("GPUPOOL_DISABLE"), "0");
  EXPECT_EQ(secure.value("GPUPOOL_LOG_FILE"), "");
  EXPECT_EQ(secure.err, "");  // not even a complaint about the bad size
  EXPECT_NE(access(log.c_str(), F_OK), 0);
  // The same binary without setuid reads them.
  ASSERT_EQ(chmod(copy.c_str(), 0755), 0);
  const Result plain = run(d, copy, {"--quick-exit"}, env);
  EXPECT_EQ(plain.value("AT_SECURE"), "0");
  EXPECT_EQ(plain.value("GPUPOOL_LEADING_BITS"), "7");
  EXPECT_EQ(plain.value("GPUPOOL_DISABLE"), "1");
  EXPECT_EQ(count(slurp(log), "GPUPOOL_MAX_HELD=\"12Q\""), 1u);
}

}  // namespace
}  // namespace gpupool::config::test
