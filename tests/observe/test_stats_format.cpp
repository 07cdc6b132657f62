// Report rendering, without a pool or a process.
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include <gtest/gtest.h>

#include "observe/bytes.hpp"
#include "observe/stats_format.hpp"

using namespace gpupool;

namespace {

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
  a.device = "GPU-f0a785bc-d381-6155-02db-427e7e86a778";
  a.stats.hits = 3;
  a.stats.misses = 1;
  a.stats.held_blocks = 2;
  a.stats.held_bytes = 3 << 20;
  a.bins = {{1 << 20, 2, 2 << 20}, {1 << 19, 2, 1 << 20}};
  r.arenas.push_back(a);
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

// The report's, the leak report's and `gpupool ps`'s style (docs/trace.md
// shows it); above TiB it goes on in PiB and EiB like the dump's.
TEST(Bytes, OneDecimal) {
  EXPECT_EQ(observe::bytes_text(0), "0 B");
  EXPECT_EQ(observe::bytes_text(1023), "1023 B");
  EXPECT_EQ(observe::bytes_text(1024), "1.0 KiB");
  EXPECT_EQ(observe::bytes_text(1536), "1.5 KiB");
  EXPECT_EQ(observe::bytes_text(100ull << 20), "100.0 MiB");
  EXPECT_EQ(observe::bytes_text(3ull << 30), "3.0 GiB");
  EXPECT_EQ(observe::bytes_text(1ull << 50), "1.0 PiB");
  EXPECT_EQ(observe::bytes_text(UINT64_MAX), "16.0 EiB");
}

TEST(StatsFormat, SignalNames) {
  EXPECT_EQ(stats::signal_name(0), "none");
  EXPECT_EQ(stats::signal_name(SIGUSR1), "SIGUSR1");
  EXPECT_EQ(stats::signal_name(SIGRTMIN), "SIGRTMIN");
  EXPECT_EQ(stats::signal_name(SIGRTMIN + 3), "SIGRTMIN+3");
  EXPECT_EQ(stats::signal_name(SIGRTMAX - 1), "SIGRTMAX-1");
}

TEST(StatsFormat, JsonEscapesAndCarriesEverything) {
  const std::string j = stats::to_json(sample());
  EXPECT_EQ(j.find('\n'), std::string::npos);  // one line per dump
  EXPECT_EQ(j.rfind("{\"version\":2,", 0), 0u);
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
  EXPECT_NE(t.find("2 / 3.00 MiB"), std::string::npos);  // held blocks / bytes
  EXPECT_NE(t.find("75.0%"), std::string::npos);         // hit rate
  EXPECT_NE(t.find("total (1 arena)"), std::string::npos);
  EXPECT_NE(t.find("1.00 MiB x 2 = 2.00 MiB"), std::string::npos);  // top bin
  EXPECT_NE(t.find("warning: the program replaced"), std::string::npos);
}

TEST(StatsFormat, Prometheus) {
  const stats::PromSource source{.slot = 2, .uid = 1000, .program = "python3"};
  const std::string p = stats::to_prometheus(sample(), source);
  EXPECT_NE(p.find("# TYPE gpupool_hits_total counter"), std::string::npos);
  EXPECT_NE(p.find("# TYPE gpupool_held_bytes gauge"), std::string::npos);
  // Every series names its file's slot (node_exporter refuses two files'
  // series that share their labels), the user, the program and the GPU;
  // the pid is gpupool_info's alone, so a new process does not make new
  // series.
  const std::string who = "slot=\"2\",uid=\"1000\",program=\"python3\"";
  EXPECT_NE(p.find("gpupool_hits_total{" + who +
                   ",gpu=\"GPU-f0a785bc-d381-6155-02db-427e7e86a778\","
                   "kind=\"opencl\",arena=\"opencl ctx \\\"odd\\\"\\nname\"} 3\n"),
            std::string::npos)
      << p;
  EXPECT_NE(p.find("gpupool_holding{" + who + "} 0\n"), std::string::npos);
  EXPECT_NE(p.find("gpupool_info{" + who + ",pid=\"42\",version=\"9.9\"} 1\n"), std::string::npos);
  EXPECT_EQ(p.rfind(stats::kPrometheusStart, 0), 0u);
  // Every sample line: name{labels with the slot} value, nothing else; a
  // pid on gpupool_info only.
  std::istringstream in(p);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    EXPECT_EQ(line.rfind("gpupool_", 0), 0u) << line;
    EXPECT_NE(line.find("{" + who), std::string::npos) << line;
    EXPECT_NE(line.find("} "), std::string::npos) << line;
    EXPECT_EQ(line.find("pid=") != std::string::npos, line.rfind("gpupool_info{", 0) == 0) << line;
  }
  // Odd characters in the program's name are escaped.
  EXPECT_NE(stats::to_prometheus(sample(), {.slot = 0, .uid = 0, .program = "a\"b"})
                .find("program=\"a\\\"b\""),
            std::string::npos);
}

TEST(StatsFormat, PrometheusSeriesAreUnique) {
  // The destroyed arenas' row keeps one name whatever their count, and two
  // rows that would share labels are told apart, not refused by the
  // collector.
  stats::Report r = sample();
  ArenaSnapshot destroyed;
  destroyed.name = "opencl: 3 destroyed arenas";
  destroyed.group = "retired";
  destroyed.kind = "opencl";
  destroyed.retired = true;
  destroyed.device = "GPU-f0a785bc-d381-6155-02db-427e7e86a778";  // one row per kind and device
  r.arenas.push_back(destroyed);
  r.arenas.push_back(r.arenas[0]);
  const std::string p = stats::to_prometheus(r, {.slot = 0, .uid = 1000, .program = "p"});
  EXPECT_NE(p.find("gpupool_hits_total{slot=\"0\",uid=\"1000\",program=\"p\","
                   "gpu=\"GPU-f0a785bc-d381-6155-02db-427e7e86a778\",kind=\"opencl\","
                   "arena=\"destroyed\"} 0\n"),
            std::string::npos)
      << p;
  std::istringstream in(p);
  std::set<std::string> seen;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    EXPECT_TRUE(seen.insert(line.substr(0, line.rfind(' '))).second) << "twice: " << line;
  }
}
