// The logger: format, levels, append, fallback to stderr, no global state.
#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "sys/log.hpp"
#include "tests/config/test_util.hpp"

namespace gpupool::config::test {
namespace {

struct TempFile {
  std::string path;
  TempFile() {
    char tmpl[] = "/tmp/gpupool-config-test-XXXXXX";
    const int fd = mkstemp(tmpl);
    EXPECT_GE(fd, 0);
    close(fd);
    path = tmpl;
  }
  ~TempFile() { unlink(path.c_str()); }
};

std::string prefix(const char* level) {
  return "gpupool[" + std::to_string(getpid()) + "]: " + level + ": ";
}

TEST(Log, AppendsToFileWithPrefix) {
  TempFile f;
  { std::ofstream(f.path) << "earlier line\n"; }
  Config c = parse(nullptr, nullptr);
  c.log_file = f.path;
  std::string problem;
  auto logger = make_logger(c, &problem);
  EXPECT_EQ(problem, "");
  logger->warn("hello {}", 42);
  logger->info("not shown at warn");
  logger->debug("not shown at warn");
  logger->error("bad {}", "thing");
  EXPECT_EQ(slurp(f.path),
            "earlier line\n" + prefix("warning") + "hello 42\n" + prefix("error") + "bad thing\n");
  // Each line is written at once: a second logger on the same file appends.
  auto other = make_logger(c, &problem);
  other->error("from another");
  logger->warn("again");
  EXPECT_EQ(slurp(f.path), "earlier line\n" + prefix("warning") + "hello 42\n" + prefix("error") +
                               "bad thing\n" + prefix("error") + "from another\n" +
                               prefix("warning") + "again\n");
}

TEST(Log, Levels) {
  const std::pair<const char*, std::vector<const char*>> cases[] = {
      {"trace", {"trace", "debug", "info", "warning", "error"}},
      {"debug", {"debug", "info", "warning", "error"}},
      {"info", {"info", "warning", "error"}},
      {"warn", {"warning", "error"}},
      {"error", {"error"}},
      {"off", {}}};
  for (const auto& [level, shown] : cases) {
    TempFile f;
    Parsed p = parse_env({std::string("GPUPOOL_LOG=") + level, "GPUPOOL_LOG_FILE=" + f.path});
    ASSERT_TRUE(p.diags.empty());
    auto logger = make_logger(p.config, nullptr);
    logger->trace("m");
    logger->debug("m");
    logger->info("m");
    logger->warn("m");
    logger->error("m");
    std::string want;
    for (const char* s : shown) want += prefix(s) + "m\n";
    EXPECT_EQ(slurp(f.path), want) << level;
  }
}

// Runs `body` with fd 2 sent to a temporary file; returns what was written.
template <class F>
std::string capture_stderr(F body) {
  TempFile f;
  std::fflush(stderr);
  const int saved = dup(2);
  const int fd = open(f.path.c_str(), O_WRONLY | O_TRUNC);
  dup2(fd, 2);
  close(fd);
  body();
  std::fflush(stderr);
  dup2(saved, 2);
  close(saved);
  return slurp(f.path);
}

TEST(Log, UnopenableFileFallsBackToStderr) {
  Config c = parse(nullptr, nullptr);
  c.log_file = "/nonexistent-gpupool-dir/sub/x.log";
  std::string problem;
  std::unique_ptr<Logger> logger;
  const std::string err = capture_stderr([&] {
    logger = make_logger(c, &problem);
    logger->warn("to stderr");
  });
  EXPECT_EQ(problem,
            "GPUPOOL_LOG_FILE=\"/nonexistent-gpupool-dir/sub/x.log\": cannot open "
            "/nonexistent-gpupool-dir/sub/x.log: No such file or directory; logging to stderr");
  EXPECT_EQ(err, prefix("warning") + "to stderr\n");
  // No directory was created on the way.
  EXPECT_NE(access("/nonexistent-gpupool-dir", F_OK), 0);
}

TEST(Log, DefaultIsStderr) {
  const std::string err = capture_stderr([] {
    auto logger = make_logger(parse(nullptr, nullptr), nullptr);
    logger->warn("a {}", "b");
    logger->info("hidden");
  });
  EXPECT_EQ(err, prefix("warning") + "a b\n");
}

TEST(Log, OneProcessLogger) {
  auto logger = make_logger(parse(nullptr, nullptr), nullptr);
  Logger& process = gpupool::log();
  EXPECT_EQ(&process, &gpupool::log());
  EXPECT_NE(&process, logger.get());
}

}  // namespace
}  // namespace gpupool::config::test
