// Report rendering and the output files, without a pool or a process.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "interpose/stats_format.hpp"
#include "interpose/stats_output.hpp"

using namespace gpupool;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/gpupool-control-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir = tmpl;
  }
  void TearDown() override {
    std::string cmd = "rm -rf '" + dir + "'";
    ASSERT_EQ(std::system(cmd.c_str()), 0);
  }
  std::string dir;
};

stats::Report sample() {
  stats::Report r;
  r.version = "9.9";
  r.pid = 42;
  r.time = 1700000000.25;
  r.reason = "signal";
  r.holding = false;
  ArenaSnapshot a;
  a.name = "opencl ctx \"odd\"\nname";
  a.group = "opencl:1";
  a.kind = "opencl";
  a.stats.hits = 3;
  a.stats.misses = 1;
  a.stats.held_blocks = 2;
  a.stats.held_bytes = 3 << 20;
  a.bins = {{1 << 20, 2, 2 << 20}, {1 << 19, 2, 1 << 20}};
  r.backends.push_back(a);
  r.totals = a.stats;
  r.signals = {{"stats", SIGUSR1, true}, {"free_held", SIGUSR2, false}, {"stop_holding", 0, false}};
  r.warnings = {"the program replaced gpupool's SIGUSR2 handler"};
  return r;
}

}  // namespace

TEST(StatsFormat, FieldsCoverEveryStatsMember) {
  // A Stats field added without a row here would be missing from every dump.
  EXPECT_EQ(stats::fields().size() * sizeof(std::uint64_t), sizeof(Stats));
  Stats s;
  std::uint64_t v = 1;
  for (const auto& f : stats::fields()) s.*f.member = v++;
  std::uint64_t sum = 0;
  for (const auto& f : stats::fields()) sum += s.*f.member;
  EXPECT_EQ(sum, (v - 1) * v / 2);  // every member distinct: no field listed twice
}

TEST(StatsFormat, HumanBytes) {
  EXPECT_EQ(stats::human_bytes(0), "0 B");
  EXPECT_EQ(stats::human_bytes(1023), "1023 B");
  EXPECT_EQ(stats::human_bytes(1024), "1.00 KiB");
  EXPECT_EQ(stats::human_bytes(1536), "1.50 KiB");
  EXPECT_EQ(stats::human_bytes(100ull << 20), "100 MiB");
  EXPECT_EQ(stats::human_bytes(3ull << 30), "3.00 GiB");
  EXPECT_EQ(stats::human_bytes(UINT64_MAX), "16.0 EiB");
}

TEST(StatsFormat, SignalNames) {
  EXPECT_EQ(stats::signal_name(0), "none");
  EXPECT_EQ(stats::signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(stats::signal_name(SIGRTMIN), "SIGRTMIN");
  EXPECT_EQ(stats::signal_name(SIGRTMIN + 3), "SIGRTMIN+3");
}

TEST(StatsFormat, JsonEscapesAndCarriesEverything) {
  const std::string j = stats::to_json(sample());
  EXPECT_EQ(j.find('\n'), std::string::npos);  // one line per dump
  EXPECT_EQ(j.rfind("{\"version\":1,", 0), 0u);
  EXPECT_NE(j.find("\"name\":\"opencl ctx \\\"odd\\\"\\nname\""), std::string::npos);
  EXPECT_NE(j.find("\"holding\":false"), std::string::npos);
  EXPECT_NE(j.find("\"time\":1700000000.250"), std::string::npos);
  for (const auto& f : stats::fields())
    EXPECT_NE(j.find(std::string("\"") + f.name + "\":"), std::string::npos) << f.name;
  EXPECT_NE(j.find("{\"alloc_size\":1048576,\"held_blocks\":2,\"held_bytes\":2097152}"),
            std::string::npos);
  EXPECT_NE(j.find("{\"action\":\"free_held\",\"signal\":\"SIGUSR2\",\"installed\":false}"),
            std::string::npos);
  EXPECT_NE(j.find("\"warnings\":[\"the program replaced"), std::string::npos);
  EXPECT_EQ(stats::json_escape(std::string("a\x01") + "b"), "a\\u0001b");
}

TEST(StatsFormat, TextTable) {
  const std::string t = stats::to_text(sample());
  EXPECT_NE(t.find("pid 42"), std::string::npos);
  EXPECT_NE(t.find("2023-11-14T22:13:20.250Z"), std::string::npos);
  EXPECT_NE(t.find("holding off"), std::string::npos);
  EXPECT_NE(t.find("2 / 3.00 MiB"), std::string::npos);   // held blocks / bytes
  EXPECT_NE(t.find("75.0%"), std::string::npos);          // hit rate
  EXPECT_NE(t.find("total (1 backend)"), std::string::npos);
  EXPECT_NE(t.find("1.00 MiB x 2 = 2.00 MiB"), std::string::npos);  // top bin
  EXPECT_NE(t.find("warning: the program replaced"), std::string::npos);
}

TEST(StatsFormat, Prometheus) {
  const std::string p = stats::to_prometheus(sample());
  EXPECT_NE(p.find("# TYPE gpupool_hits_total counter"), std::string::npos);
  EXPECT_NE(p.find("# TYPE gpupool_held_bytes gauge"), std::string::npos);
  EXPECT_NE(p.find("gpupool_hits_total{kind=\"opencl\",group=\"opencl:1\",name=\"opencl ctx "
                   "\\\"odd\\\"\\nname\"} 3\n"),
            std::string::npos);
  EXPECT_NE(p.find("gpupool_holding 0\n"), std::string::npos);
  // Every sample line: name{labels} value, nothing else.
  std::istringstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    EXPECT_EQ(line.rfind("gpupool_", 0), 0u) << line;
    EXPECT_NE(line.find(' '), std::string::npos) << line;
  }
}

TEST(StatsOutput, ExpandPath) {
  EXPECT_EQ(stats::expand_path("/tmp/s.%p.log", 77), "/tmp/s.77.log");
  EXPECT_EQ(stats::expand_path("100%%-%p%", 5), "100%-5%");
}

TEST_F(TempDir, AppendsToOwnRegularFile) {
  const std::string f = dir + "/stats";
  std::string why;
  ASSERT_TRUE(stats::append_dump(f, "one\n", &why)) << why;
  ASSERT_TRUE(stats::append_dump(f, "two\n", &why)) << why;
  EXPECT_EQ(read_file(f), "one\ntwo\n");
}

TEST_F(TempDir, RefusesSymlink) {
  const std::string target = dir + "/target", link = dir + "/link";
  { std::ofstream(target) << "keep\n"; }
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  std::string why;
  EXPECT_FALSE(stats::append_dump(link, "evil\n", &why));
  EXPECT_NE(why.find("symbolic link"), std::string::npos) << why;
  EXPECT_EQ(read_file(target), "keep\n");
  // A dangling symlink must not create its target either.
  const std::string dangling = dir + "/dangling", nowhere = dir + "/created";
  ASSERT_EQ(symlink(nowhere.c_str(), dangling.c_str()), 0);
  EXPECT_FALSE(stats::append_dump(dangling, "evil\n", &why));
  EXPECT_NE(access(nowhere.c_str(), F_OK), 0);
}

TEST_F(TempDir, RefusesFifoWithoutBlockingAndDirectories) {
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string why;
  // With no reader, a blocking open would hang here forever.
  EXPECT_FALSE(stats::append_dump(fifo, "x\n", &why));
  EXPECT_FALSE(stats::append_dump(dir, "x\n", &why));
}

TEST_F(TempDir, RefusesAnotherUsersFile) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create another user's file";
  const std::string f = dir + "/theirs";
  { std::ofstream(f) << "theirs\n"; }
  ASSERT_EQ(chown(f.c_str(), 65534, 65534), 0);
  std::string why;
  EXPECT_FALSE(stats::append_dump(f, "x\n", &why));
  EXPECT_NE(why.find("owned by uid 65534"), std::string::npos) << why;
  EXPECT_EQ(read_file(f), "theirs\n");
  // Truncation (trace files) is refused too, before it happens.
  EXPECT_EQ(stats::open_output(f, false, &why), -1);
  EXPECT_EQ(read_file(f), "theirs\n");
}

TEST_F(TempDir, ReplaceFileIsAtomicAndDoesNotFollowSymlinks) {
  const std::string f = dir + "/metrics.prom";
  std::string why;
  ASSERT_TRUE(stats::replace_file(f, "a 1\n", &why)) << why;
  ASSERT_TRUE(stats::replace_file(f, "a 2\n", &why)) << why;
  EXPECT_EQ(read_file(f), "a 2\n");
  const std::string target = dir + "/target", link = dir + "/link.prom";
  { std::ofstream(target) << "keep\n"; }
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  ASSERT_TRUE(stats::replace_file(link, "a 3\n", &why)) << why;
  EXPECT_EQ(read_file(target), "keep\n");
  EXPECT_EQ(read_file(link), "a 3\n");
  // No temporary files left behind.
  FILE* p = popen(("ls '" + dir + "' | wc -l").c_str(), "r");
  int count = 0;
  ASSERT_EQ(fscanf(p, "%d", &count), 1);
  pclose(p);
  EXPECT_EQ(count, 3);
}
