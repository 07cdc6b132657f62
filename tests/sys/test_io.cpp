// How gpupool opens, writes and replaces files inside a program
// (sys/io.hpp): never another user's file, never through a symbolic
// link, never anything but a regular file, never a block on a reader.
#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "sys/io.hpp"
#include "tests/test_util.hpp"

namespace gpupool::io {
namespace {

using test::slurp;

double seconds() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return double(ts.tv_sec) + double(ts.tv_nsec) / 1e9;
}

class Io : public ::testing::Test {
 protected:
  int entries() {
    FILE* p = popen(("ls -A '" + dir + "' | wc -l").c_str(), "r");
    int count = -1;
    EXPECT_EQ(fscanf(p, "%d", &count), 1);
    pclose(p);
    return count;
  }
  const test::TempDir tmp{"io"};
  const std::string dir = tmp.path;
};

TEST(IoPaths, ExpandPath) {
  EXPECT_EQ(expand_path("/tmp/s.%p.log", 77), "/tmp/s.77.log");
  EXPECT_EQ(expand_path("100%%-%p%", 5), "100%-5%");
}

TEST_F(Io, AppendsToOwnRegularFile) {
  const std::string f = dir + "/stats";
  std::string why;
  for (const char* line : {"one\n", "two\n"}) {
    OwnedFd fd = open_output(f, true, &why);
    ASSERT_TRUE(fd.valid()) << why;
    EXPECT_GT(fd.get(), 2);
    ASSERT_TRUE(write_bounded(fd.get(), line, std::strlen(line)));
  }
  EXPECT_EQ(slurp(f), "one\ntwo\n");
}

TEST_F(Io, RefusesSymlink) {
  const std::string target = dir + "/target", link = dir + "/link";
  { std::ofstream(target) << "keep\n"; }
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  std::string why;
  EXPECT_FALSE(open_output(link, true, &why).valid());
  EXPECT_NE(why.find("symbolic link"), std::string::npos) << why;
  EXPECT_EQ(slurp(target), "keep\n");
  // A dangling symlink must not create its target either.
  const std::string dangling = dir + "/dangling", nowhere = dir + "/created";
  ASSERT_EQ(symlink(nowhere.c_str(), dangling.c_str()), 0);
  EXPECT_FALSE(open_output(dangling, true, &why).valid());
  EXPECT_NE(access(nowhere.c_str(), F_OK), 0);
}

// A symbolic link anywhere in the path is refused, not only in the last
// component: another user's link `shared/run -> /root/victimdir` must not
// make root's trace truncate /root/victimdir/notes.txt (issue 28).
TEST_F(Io, RefusesSymlinkInADirectoryComponent) {
  const std::string victim = dir + "/victimdir", link = dir + "/run";
  ASSERT_EQ(mkdir(victim.c_str(), 0700), 0);
  { std::ofstream(victim + "/notes.txt") << "keep\n"; }
  ASSERT_EQ(symlink(victim.c_str(), link.c_str()), 0);
  std::string why;
  EXPECT_FALSE(open_output(link + "/notes.txt", false, &why).valid())
      << "truncated through the link";
  EXPECT_NE(why.find("symbolic link"), std::string::npos) << why;
  // It says what to do: name the file without the link.
  char real[PATH_MAX];
  ASSERT_NE(realpath(victim.c_str(), real), nullptr);
  EXPECT_NE(why.find(std::string("without the link: ") + real + "/notes.txt"), std::string::npos)
      << why;
  EXPECT_FALSE(open_output(link + "/notes.txt", true, &why).valid()) << "appended through the link";
  EXPECT_FALSE(open_output(link + "/new.txt", true, &why).valid()) << "created through the link";
  EXPECT_FALSE(replace_file(link + "/notes.txt", "x\n", &why)) << "replaced through the link";
  EXPECT_NE(why.find("symbolic link"), std::string::npos) << why;
  EXPECT_EQ(slurp(victim + "/notes.txt"), "keep\n");
  EXPECT_NE(access((victim + "/new.txt").c_str(), F_OK), 0);
  // The same directory named without the link is used as before.
  EXPECT_TRUE(open_output(victim + "/notes.txt", true, &why).valid()) << why;
  EXPECT_TRUE(replace_file(victim + "/metrics.prom", "a 1\n", &why)) << why;
}

TEST_F(Io, RefusesFifoWithoutBlockingAndDirectories) {
  const std::string fifo = dir + "/fifo";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  std::string why;
  // With no reader, a blocking open would hang here forever.
  EXPECT_FALSE(open_output(fifo, true, &why).valid());
  EXPECT_NE(why.find("not a regular file"), std::string::npos) << why;
  // With a reader, it opens, and is still refused.
  const int rd = ::open(fifo.c_str(), O_RDONLY | O_NONBLOCK);
  ASSERT_GE(rd, 0);
  EXPECT_FALSE(open_output(fifo, true, &why).valid());
  EXPECT_NE(why.find("not a regular file"), std::string::npos) << why;
  ::close(rd);
  EXPECT_FALSE(open_output(dir, true, &why).valid());
}

TEST_F(Io, RefusesAnotherUsersFile) {
  if (geteuid() != 0) GTEST_SKIP() << "needs root to create another user's file";
  const std::string f = dir + "/theirs";
  { std::ofstream(f) << "theirs\n"; }
  ASSERT_EQ(chown(f.c_str(), 65534, 65534), 0);
  std::string why;
  EXPECT_FALSE(open_output(f, true, &why).valid());
  EXPECT_NE(why.find("owned by uid 65534"), std::string::npos) << why;
  // Truncation (trace files) is refused too, before it happens.
  EXPECT_FALSE(open_output(f, false, &why).valid());
  EXPECT_EQ(slurp(f), "theirs\n");
}

TEST_F(Io, NeverTakesStandardDescriptors) {
  // A program that closed stdin gets it back from its own next open().
  const int saved = dup(0);
  ASSERT_GE(saved, 0);
  ::close(0);
  std::string why;
  OwnedFd fd = open_output(dir + "/f", true, &why);
  const int mine = ::open("/dev/null", O_RDONLY);
  dup2(saved, 0);
  ::close(saved);
  ASSERT_TRUE(fd.valid()) << why;
  EXPECT_GT(fd.get(), 2);
  EXPECT_EQ(mine, 0);
}

TEST_F(Io, ClosedOrReplacedDescriptorIsNotOurs) {
  std::string why;
  OwnedFd fd = open_output(dir + "/ours", true, &why);
  ASSERT_TRUE(fd.valid()) << why;
  EXPECT_TRUE(fd.ours());
  const int n = fd.get();
  // The program closes the number and opens its own file there.
  ::close(n);
  EXPECT_FALSE(fd.ours());
  const int opened = ::open((dir + "/theirs").c_str(), O_CREAT | O_WRONLY, 0600);
  const int theirs = opened == n ? n : dup2(opened, n);
  if (opened != n) ::close(opened);
  ASSERT_EQ(theirs, n);
  EXPECT_FALSE(fd.ours());
  fd.close();  // must leave the program's file open
  EXPECT_EQ(fcntl(theirs, F_GETFD), 0);
  ::close(theirs);
}

TEST_F(Io, ReplaceFileIsAtomic) {
  const std::string f = dir + "/metrics.prom";
  std::string why;
  ASSERT_TRUE(replace_file(f, "a 1\n", &why)) << why;
  ASSERT_TRUE(replace_file(f, "a 2\n", &why)) << why;
  EXPECT_EQ(slurp(f), "a 2\n");
  EXPECT_EQ(entries(), 1);  // no temporary file left behind
}

TEST_F(Io, ReplaceFileOnlyReplacesOwnRegularFiles) {
  std::string why;
  const std::string target = dir + "/target", link = dir + "/link.prom";
  { std::ofstream(target) << "keep\n"; }
  ASSERT_EQ(symlink(target.c_str(), link.c_str()), 0);
  EXPECT_FALSE(replace_file(link, "a 3\n", &why));
  EXPECT_NE(why.find("not a regular file"), std::string::npos) << why;
  struct stat st;
  ASSERT_EQ(lstat(link.c_str(), &st), 0);
  EXPECT_TRUE(S_ISLNK(st.st_mode));
  EXPECT_EQ(slurp(target), "keep\n");

  const std::string fifo = dir + "/fifo.prom";
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  EXPECT_FALSE(replace_file(fifo, "x\n", &why));
  ASSERT_EQ(lstat(fifo.c_str(), &st), 0);
  EXPECT_TRUE(S_ISFIFO(st.st_mode));
  EXPECT_FALSE(replace_file(dir, "x\n", &why));
  EXPECT_EQ(entries(), 3);  // target, link, fifo: no temporary file left behind

  if (geteuid() == 0) {
    // As root: a device node (the way /dev/full became a regular file) and
    // another user's file stay what they are.
    const std::string dev = dir + "/full.prom";
    ASSERT_EQ(mknod(dev.c_str(), S_IFCHR | 0666, makedev(1, 7)), 0);
    EXPECT_FALSE(replace_file(dev, "x\n", &why));
    ASSERT_EQ(lstat(dev.c_str(), &st), 0);
    EXPECT_TRUE(S_ISCHR(st.st_mode));
    const std::string theirs = dir + "/theirs.prom";
    { std::ofstream(theirs) << "theirs\n"; }
    ASSERT_EQ(chown(theirs.c_str(), 65534, 65534), 0);
    EXPECT_FALSE(replace_file(theirs, "x\n", &why));
    EXPECT_NE(why.find("owned by uid 65534"), std::string::npos) << why;
    EXPECT_EQ(slurp(theirs), "theirs\n");
  }
}

TEST(IoWrite, PipeNobodyReadsCostsAtMostTheTimeout) {
  int p[2];
  ASSERT_EQ(pipe(p), 0);
  const std::string big(1 << 20, 'x');  // far more than a pipe holds
  const double t0 = seconds();
  EXPECT_FALSE(write_bounded(p[1], big, 200'000'000));
  const double took = seconds() - t0;
  EXPECT_LT(took, 30.0);  // a hang check: without the bound this never returns
  // The program's descriptor keeps its own (blocking) flags.
  EXPECT_EQ(fcntl(p[1], F_GETFL) & O_NONBLOCK, 0);
  // Once stuck, the next write to the same pipe does not wait again.
  const double t1 = seconds();
  EXPECT_FALSE(write_bounded(p[1], big, 60'000'000'000ull));
  EXPECT_LT(seconds() - t1, 30.0);
  // Drained, it works again.
  char buf[65536];
  fcntl(p[0], F_SETFL, O_NONBLOCK);
  while (read(p[0], buf, sizeof buf) > 0) {
  }
  EXPECT_TRUE(write_bounded(p[1], "ok\n", 3));
  ::close(p[0]);
  ::close(p[1]);
}

TEST(IoWrite, PipeWithoutReaderRaisesNoSigpipe) {
  // SIGPIPE's default action kills the program: run it where that shows.
  int status_pipe[2];
  ASSERT_EQ(pipe(status_pipe), 0);
  const pid_t pid = fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    ::close(status_pipe[0]);
    signal(SIGPIPE, SIG_DFL);
    int p[2];
    if (pipe(p) != 0) _exit(2);
    ::close(p[0]);
    if (write_bounded(p[1], "x\n", 2)) _exit(3);
    int s[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, s) != 0) _exit(4);
    ::close(s[0]);
    if (write_bounded(s[1], "x\n", 2)) _exit(5);
    if (write(status_pipe[1], "A", 1) != 1) _exit(6);
    // A SIGPIPE of the program's own is still delivered to it.
    if (write(p[1], "x", 1) != -1) _exit(7);
    _exit(8);
  }
  ::close(status_pipe[1]);
  char c = 0;
  EXPECT_EQ(read(status_pipe[0], &c, 1), 1) << "the child died inside write_bounded";
  EXPECT_EQ(c, 'A');
  ::close(status_pipe[0]);
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFSIGNALED(status)) << "exit status " << WEXITSTATUS(status);
  EXPECT_EQ(WTERMSIG(status), SIGPIPE);
}

}  // namespace
}  // namespace gpupool::io
