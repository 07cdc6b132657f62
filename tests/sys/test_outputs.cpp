// The files one setting makes several processes write (sys/outputs.hpp):
// each process's name, and no two live processes ever writing one file.
#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "sys/outputs.hpp"
#include "tests/test_util.hpp"

namespace gpupool::io {
namespace {

using Names = std::vector<std::string>;

using test::slurp;

void write_file(const std::string& path, const std::string& text) { std::ofstream(path) << text; }

class Outputs : public ::testing::Test {
 protected:
  Names listing() {
    Names out;
    DIR* d = opendir(dir.c_str());
    while (const dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    closedir(d);
    std::sort(out.begin(), out.end());
    return out;
  }
  const test::TempDir tmp{"outputs"};
  const std::string dir = tmp.path;
};

TEST(OutputNames, SiblingGoesBeforeTheLastExtension) {
  EXPECT_EQ(sibling_path("/d/out.gpupool-trace", 4242), "/d/out.4242.gpupool-trace");
  EXPECT_EQ(sibling_path("gpupool.prom", 7), "gpupool.7.prom");
  EXPECT_EQ(sibling_path("/d/trace", 7), "/d/trace.7");
  EXPECT_EQ(sibling_path("/d.x/trace", 7), "/d.x/trace.7");  // a dot in the directory is not one
  EXPECT_EQ(sibling_path("/d/a.tar.gz", 7), "/d/a.tar.7.gz");
  EXPECT_EQ(sibling_path("/d/.hidden", 7), "/d/.hidden.7");
}

TEST(OutputNames, WhoWritesWhat) {
  // gpupool run's process: the name itself, its sibling if that is taken.
  EXPECT_EQ(output_names("/d/t.trace", 10, 10, false), (Names{"/d/t.trace", "/d/t.10.trace"}));
  // Any other process under gpupool run: its sibling, fork or exec.
  EXPECT_EQ(output_names("/d/t.trace", 11, 10, false), (Names{"/d/t.11.trace"}));
  EXPECT_EQ(output_names("/d/t.trace", 11, 10, true), (Names{"/d/t.11.trace"}));
  // Set by hand: the first process that holds the name; a forked child its sibling.
  EXPECT_EQ(output_names("/d/t.trace", 12, 0, false), (Names{"/d/t.trace", "/d/t.12.trace"}));
  EXPECT_EQ(output_names("/d/t.trace", 12, 0, true), (Names{"/d/t.12.trace"}));
  // %p: the user chose.
  EXPECT_EQ(output_names("/d/t.%p", 13, 10, false), (Names{"/d/t.13"}));
  EXPECT_EQ(output_names("/d/100%%.trace", 13, 13, false),
            (Names{"/d/100%.trace", "/d/100%.13.trace"}));
}

TEST(OutputNames, NumberedNamesAreReusedNotPerPid) {
  // The Prometheus file's names (each number a label value): gpupool run's
  // process tries the name itself first, then 1, 2, ...; any other process
  // 1, 2, ...; never its pid, so a name is reused when its process is gone.
  auto names = [](const NumberedNames& n) {
    std::vector<std::pair<std::string, long>> out;
    long number = -1;
    for (std::size_t i = 0; i < 3; ++i)
      if (std::string name = n.name(i, &number); !name.empty()) out.emplace_back(name, number);
    return out;
  };
  using Got = std::vector<std::pair<std::string, long>>;
  EXPECT_EQ(names(numbered_names("/d/g.prom", 10, 10, false)),
            (Got{{"/d/g.prom", 0}, {"/d/g.1.prom", 1}, {"/d/g.2.prom", 2}}));
  EXPECT_EQ(names(numbered_names("/d/g.prom", 11, 10, false)),
            (Got{{"/d/g.1.prom", 1}, {"/d/g.2.prom", 2}, {"/d/g.3.prom", 3}}));
  // Set by hand: as output_names says, a forked child never the name itself.
  EXPECT_EQ(names(numbered_names("/d/g.prom", 12, 0, false))[0].first, "/d/g.prom");
  EXPECT_EQ(names(numbered_names("/d/g.prom", 12, 0, true))[0].first, "/d/g.1.prom");
  // %p: the user chose one name per process, numbered with its pid.
  EXPECT_EQ(names(numbered_names("/d/g.%p.prom", 13, 10, false)), (Got{{"/d/g.13.prom", 13}}));
  // Every one is a name of the family (swept when its process is gone).
  EXPECT_TRUE(is_output_name("g.prom", "g.2.prom"));
}

TEST(OutputNames, KnowsItsFamily) {
  EXPECT_TRUE(is_output_name("gpupool.prom", "gpupool.prom"));
  EXPECT_TRUE(is_output_name("gpupool.prom", "gpupool.4242.prom"));
  EXPECT_FALSE(is_output_name("gpupool.prom", "gpupool..prom"));
  EXPECT_FALSE(is_output_name("gpupool.prom", "gpupool.42a.prom"));
  EXPECT_FALSE(is_output_name("gpupool.prom", "other.4242.prom"));
  EXPECT_FALSE(is_output_name("gpupool.prom", "gpupool.prom.1a2b3c"));
  EXPECT_FALSE(is_output_name("gpupool.prom", ".gpupool.prom.tmp123456"));
  EXPECT_TRUE(is_output_name("trace", "trace.17"));
  EXPECT_FALSE(is_output_name("trace", "trace.17.x"));
  EXPECT_TRUE(is_output_name("m-%p.prom", "m-17.prom"));
  EXPECT_FALSE(is_output_name("m-%p.prom", "m-.prom"));
  EXPECT_FALSE(is_output_name("m-%p.prom", "m-%p.prom"));
  EXPECT_TRUE(is_output_name("100%%-%p", "100%-5"));
}

// The launcher finds a trace's siblings by the same rule the library names
// them with.
TEST(OutputNames, SiblingPidReadsSiblingPathsName) {
  for (const char* name : {"out.trace", "trace", ".hidden", "a.b.c"})
    EXPECT_EQ(sibling_pid(name, sibling_path(name, 4242)), 4242) << name;
  EXPECT_EQ(sibling_pid("out.trace", "out.trace"), -1);
  EXPECT_EQ(sibling_pid("out.trace", "out..trace"), -1);
  EXPECT_EQ(sibling_pid("out.trace", "out.12345678901.trace"), -1);
  EXPECT_EQ(sibling_pid("out.trace", "out.42.trace.gz"), -1);
}

TEST_F(Outputs, HeldTraceIsNotTakenByAnother) {
  const std::string t = dir + "/t.trace";
  std::string why;
  Hold h;
  OwnedFd first = hold_output(t, false, &h, &why);
  ASSERT_EQ(h, Hold::held) << why;
  ASSERT_TRUE(write(first.get(), "first\n", 6) == 6);
  // Another open file (as another process has): refused, nothing truncated.
  OwnedFd second = hold_output(t, false, &h, &why);
  EXPECT_EQ(h, Hold::taken);
  EXPECT_FALSE(second.valid());
  EXPECT_EQ(slurp(t), "first\n");
  // Once the first is gone (its process ended), the name is free.
  first.close();
  OwnedFd third = hold_output(t, false, &h, &why);
  EXPECT_EQ(h, Hold::held) << why;
  EXPECT_EQ(slurp(t), "");
}

TEST_F(Outputs, HeldAcrossProcesses) {
  const std::string t = dir + "/t.trace";
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    close(done[1]);  // its end of the pipe closes when the parent's does
    std::string why;
    Hold h;
    OwnedFd f = hold_output(t, false, &h, &why);
    char c = h == Hold::held ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) < 0) _exit(2);
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  std::string why;
  Hold h;
  EXPECT_FALSE(hold_output(t, false, &h, &why).valid());
  EXPECT_EQ(h, Hold::taken);
  close(done[1]);
  int status = 0;
  waitpid(child, &status, 0);
  EXPECT_TRUE(hold_output(t, false, &h, &why).valid());
  EXPECT_EQ(h, Hold::held) << why;
  for (int fd : {ready[0], ready[1], done[0]}) close(fd);
}

TEST_F(Outputs, ReplacedFileStaysHeldBetweenUpdates) {
  const std::string p = dir + "/gpupool.prom";
  HeldFile a, b;
  std::string why;
  ASSERT_EQ(a.replace(p, "a 1\n", &why), Hold::held) << why;
  EXPECT_EQ(b.replace(p, "b 1\n", &why), Hold::taken);
  ASSERT_EQ(a.replace(p, "a 2\n", &why), Hold::held) << why;
  EXPECT_EQ(b.replace(p, "b 2\n", &why), Hold::taken);
  EXPECT_EQ(slurp(p), "a 2\n");
  EXPECT_EQ(listing(), Names{"gpupool.prom"});  // no temporary file left
  // The holder removes it; then another takes the name.
  a.remove(p);
  EXPECT_EQ(listing(), Names{});
  EXPECT_EQ(b.replace(p, "b 3\n", &why), Hold::held) << why;
  EXPECT_EQ(slurp(p), "b 3\n");
}

TEST_F(Outputs, DeadProcessesFileIsReplacedNotRefused) {
  const std::string p = dir + "/gpupool.prom";
  {
    HeldFile dead;
    std::string why;
    ASSERT_EQ(dead.replace(p, "dead 1\n", &why), Hold::held) << why;
    dead.forget_in_child();  // as if its process were gone: its lock with it
  }
  HeldFile b;
  std::string why;
  EXPECT_EQ(b.replace(p, "b 1\n", &why), Hold::held) << why;
  EXPECT_EQ(slurp(p), "b 1\n");
}

TEST_F(Outputs, RemovesOnlyUnheldFilesGpupoolWrote) {
  const std::string value = dir + "/gpupool.prom";
  HeldFile live, mine;
  std::string why;
  ASSERT_EQ(live.replace(dir + "/gpupool.11.prom", "# HELP gpupool_info live\n", &why), Hold::held);
  ASSERT_EQ(mine.replace(dir + "/gpupool.12.prom", "# HELP gpupool_info mine\n", &why), Hold::held);
  write_file(dir + "/gpupool.13.prom", "# HELP gpupool_info dead\n");   // nobody holds it
  write_file(dir + "/gpupool.prom", "# HELP gpupool_info dead too\n");  // nor this one
  write_file(dir + "/gpupool.2024.prom", "# the user's own file of that name\n");
  write_file(dir + "/other.14.prom", "# HELP gpupool_info another setting's\n");
  Names removed = remove_unheld_outputs(value, "gpupool.12.prom", "# HELP gpupool_info ");
  std::sort(removed.begin(), removed.end());
  EXPECT_EQ(removed, (Names{"gpupool.13.prom", "gpupool.prom"}));
  EXPECT_EQ(listing(),
            (Names{"gpupool.11.prom", "gpupool.12.prom", "gpupool.2024.prom", "other.14.prom"}));
  // %p in the directory: nothing to look at.
  EXPECT_EQ(remove_unheld_outputs(dir + "/%p/gpupool.prom", "", "# HELP gpupool_info "), Names{});
}

// A write cut short by an exec or a kill leaves its temporary file
// (".NAME.tmpPID-XXXXXX"): removed once its writer is gone, or when the
// writer is this process (an exec ended the program it was before); a live
// writer's is left alone, held or not.
TEST_F(Outputs, TemporariesOfWritesCutShortAreSwept) {
  const std::string value = dir + "/gpupool.prom";
  auto temporary = [&](long pid) { return ".gpupool.prom.tmp" + std::to_string(pid) + "-0a1b2c"; };
  const pid_t dead = fork();
  ASSERT_GE(dead, 0);
  if (dead == 0) _exit(0);
  int status = 0;
  ASSERT_EQ(waitpid(dead, &status, 0), dead);
  // A live writer: one holding its temporary (a write under way), and one
  // that holds nothing (it exec'd a program without gpupool).
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t live = fork();
  ASSERT_GE(live, 0);
  if (live == 0) {
    close(done[1]);
    const std::string held = dir + "/" + temporary(getpid());
    OwnedFd f = OwnedFd::adopt(open(held.c_str(), O_WRONLY | O_CREAT | O_EXCL, 0644));
    char c = f.valid() && flock(f.get(), LOCK_EX) == 0 ? 'y' : 'n';
    if (write(ready[1], &c, 1) != 1 || read(done[0], &c, 1) < 0) _exit(2);
    _exit(0);
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  const pid_t idle = fork();
  ASSERT_GE(idle, 0);
  if (idle == 0) {
    close(done[1]);
    if (read(done[0], &c, 1) < 0) _exit(2);
    _exit(0);
  }
  write_file(dir + "/" + temporary(dead), "# HELP gpupool_info cut sh");
  write_file(dir + "/" + temporary(getpid()), "");
  write_file(dir + "/" + temporary(idle), "# HELP gpupool_info");
  // Another setting's: not this sweep's.
  write_file(dir + "/.other.prom.tmp" + std::to_string(dead) + "-0a1b2c", "");
  Names removed = remove_unheld_outputs(value, "", "# HELP gpupool_info ");
  std::sort(removed.begin(), removed.end());
  Names want{temporary(dead), temporary(getpid())};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(removed, want);
  close(done[1]);
  waitpid(live, &status, 0);
  waitpid(idle, &status, 0);
  // Their writers gone, the live ones' go too.
  removed = remove_unheld_outputs(value, "", "# HELP gpupool_info ");
  std::sort(removed.begin(), removed.end());
  want = {temporary(live), temporary(idle)};
  std::sort(want.begin(), want.end());
  EXPECT_EQ(removed, want);
  for (int fd : {ready[0], ready[1], done[0]}) close(fd);
}

TEST_F(Outputs, ReplaceRefusesWhatItAlwaysRefused) {
  const std::string target = dir + "/target";
  write_file(target, "keep\n");
  const std::string link = dir + "/link.prom";
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  const std::string fifo = dir + "/fifo.prom";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  for (const std::string& p : {link, fifo, dir}) {
    HeldFile f;
    std::string why;
    EXPECT_EQ(f.replace(p, "x\n", &why), Hold::failed) << p;
    EXPECT_FALSE(why.empty()) << p;
  }
  EXPECT_EQ(slurp(target), "keep\n");
  struct stat st {};
  ASSERT_EQ(lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
}

}  // namespace
}  // namespace gpupool::io
