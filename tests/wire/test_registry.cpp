// The node registry's file (wire/registry.*), in-process: what one process
// publishes another reads, a dead owner's slot is skipped and taken over,
// and a file that is not this layout (another version, cut, corrupt, open
// to others) is refused with a reason and left as it was.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "tests/test_util.hpp"
#include "wire/registry.hpp"

namespace gpupool::wire {
namespace {

class RegistryFile : public ::testing::Test {
 protected:
  std::unique_ptr<Registry> open_new() {
    std::string why;
    auto r = Registry::open(path_, &why);
    EXPECT_NE(r, nullptr) << why;
    return r;
  }
  // The file's size and bytes, to see that a refusal changed nothing.
  std::string contents() const {
    std::string out;
    const int fd = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return out;
    char buf[65536];
    ssize_t n;
    while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<std::size_t>(n));
    ::close(fd);
    return out;
  }
  void write_at(off_t at, const void* p, std::size_t n) {
    const int fd = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::pwrite(fd, p, n, at), static_cast<ssize_t>(n));
    ::close(fd);
  }
  std::string refusal() {
    std::string why;
    EXPECT_EQ(Registry::open(path_, &why, /*create=*/false), nullptr);
    return why;
  }

  const test::TempDir dir_{"registry-test"};
  const std::string path_ = dir_.path + "/registry";
};

DeviceUse use(std::uint8_t id, std::uint64_t held, std::uint64_t active) {
  DeviceUse d;
  d.key = DeviceKey{id, 0xab};
  d.held = held;
  d.active = active;
  d.managed = held + active;
  d.hits = 7;
  d.misses = 3;
  d.returned_at = 123456789;
  return d;
}

const ProcessEntry* entry_of(const std::vector<ProcessEntry>& all, long pid) {
  for (const ProcessEntry& e : all)
    if (e.pid == pid) return &e;
  return nullptr;
}

TEST_F(RegistryFile, MissingIsNotMadeWithoutCreate) {
  std::string why = "unchanged";
  EXPECT_EQ(Registry::open(path_, &why, /*create=*/false), nullptr);
  EXPECT_EQ(why, "");
  struct stat s {};
  EXPECT_NE(stat(path_.c_str(), &s), 0);
}

TEST_F(RegistryFile, MadePrivateAndPublishedFiguresReadBack) {
  auto r = open_new();
  ASSERT_NE(r, nullptr);
  struct stat s {};
  ASSERT_EQ(stat(path_.c_str(), &s), 0);
  EXPECT_EQ(s.st_mode & 0777, 0600u);

  std::string why;
  ASSERT_EQ(r->publish({use(1, 4096, 8192), use(2, 0, 1)}, &why), Registry::Outcome::ok) << why;
  // A second opening (as another process, gpupool ps, would) reads it.
  auto reader = Registry::open(path_, &why, /*create=*/false);
  ASSERT_NE(reader, nullptr) << why;
  const auto all = reader->processes(/*skip_self=*/false, &why);
  const ProcessEntry* me = entry_of(all, getpid());
  ASSERT_NE(me, nullptr) << why;
  ASSERT_EQ(me->devices.size(), 2u);
  EXPECT_EQ(me->devices[0].key, use(1, 0, 0).key);
  EXPECT_EQ(me->devices[0].held, 4096u);
  EXPECT_EQ(me->devices[0].active, 8192u);
  EXPECT_EQ(me->devices[0].managed, 4096u + 8192u);
  EXPECT_EQ(me->devices[0].hits, 7u);
  EXPECT_EQ(me->devices[0].misses, 3u);
  EXPECT_EQ(me->devices[0].returned_at, 123456789u);
  EXPECT_EQ(me->devices[1].key, use(2, 0, 0).key);
  EXPECT_FALSE(me->command.empty());
  EXPECT_EQ(entry_of(reader->processes(/*skip_self=*/true), getpid()), nullptr);

  // A second publish rewrites the same slot; leaving frees it.
  ASSERT_EQ(r->publish({use(1, 1, 2)}, &why), Registry::Outcome::ok) << why;
  const auto again = reader->processes(false);
  ASSERT_NE(entry_of(again, getpid()), nullptr);
  EXPECT_EQ(entry_of(again, getpid())->devices.size(), 1u);
  r->leave();
  EXPECT_EQ(entry_of(reader->processes(false), getpid()), nullptr);
}

TEST_F(RegistryFile, AtMostRegistryDevicesPerProcess) {
  auto r = open_new();
  ASSERT_NE(r, nullptr);
  std::vector<DeviceUse> many;
  for (unsigned i = 0; i < kRegistryDevices + 3; ++i) many.push_back(use(std::uint8_t(i), i, i));
  std::string why;
  ASSERT_EQ(r->publish(many, &why), Registry::Outcome::ok) << why;
  const auto all = r->processes(false);  // kept: entry_of points into it
  const ProcessEntry* me = entry_of(all, getpid());
  ASSERT_NE(me, nullptr);
  EXPECT_EQ(me->devices.size(), kRegistryDevices);
}

// Another process's entry is seen while it lives; once it is gone its
// slot is skipped, and the next claimer takes it over.
TEST_F(RegistryFile, DeadOwnersSlotSkippedAndTakenOver) {
  auto r = open_new();
  ASSERT_NE(r, nullptr);
  int ready[2], done[2];
  ASSERT_EQ(pipe(ready), 0);
  ASSERT_EQ(pipe(done), 0);
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    std::string why;
    auto mine = Registry::open(path_, &why, false);
    const bool ok = mine && mine->publish({use(9, 1, 1)}, &why) == Registry::Outcome::ok;
    char c = ok ? 'y' : 'n';
    (void)!write(ready[1], &c, 1);
    (void)!read(done[0], &c, 1);
    _exit(0);  // without leave(): its slot stays, its owner gone
  }
  char c = 0;
  ASSERT_EQ(read(ready[0], &c, 1), 1);
  ASSERT_EQ(c, 'y');
  EXPECT_NE(entry_of(r->processes(false), child), nullptr);
  ASSERT_EQ(write(done[1], &c, 1), 1);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  EXPECT_EQ(entry_of(r->processes(false), child), nullptr);
  for (int fd : {ready[0], ready[1], done[0], done[1]}) close(fd);

  // Every slot but the dead child's taken by this process (a Registry per
  // slot): the last claim reuses the dead owner's.
  std::vector<std::unique_ptr<Registry>> claims;
  std::string why;
  for (unsigned i = 0; i + 1 < kRegistrySlots; ++i) {
    claims.push_back(Registry::open(path_, &why, false));
    ASSERT_EQ(claims.back()->publish({use(1, 1, 1)}, &why), Registry::Outcome::ok) << i << why;
  }
  auto last = Registry::open(path_, &why, false);
  EXPECT_EQ(last->publish({use(1, 1, 1)}, &why), Registry::Outcome::ok) << why;
  auto one_more = Registry::open(path_, &why, false);
  EXPECT_EQ(one_more->publish({use(1, 1, 1)}, &why), Registry::Outcome::full);
}

// Version 1 was mapped and lock-free: a file of another version is not
// read or written, whatever its size.
TEST_F(RegistryFile, OtherVersionRefused) {
  ASSERT_NE(open_new(), nullptr);
  const std::uint32_t v1 = 1;
  write_at(8, &v1, sizeof v1);  // the header: magic[8], then the version
  const std::string before = contents();
  EXPECT_NE(refusal().find("is not a gpupool registry"), std::string::npos);
  std::string why;
  EXPECT_EQ(Registry::open(path_, &why, /*create=*/true), nullptr);
  EXPECT_EQ(contents(), before);
}

TEST_F(RegistryFile, CorruptMagicRefused) {
  ASSERT_NE(open_new(), nullptr);
  write_at(0, "garbage!", 8);
  const std::string before = contents();
  EXPECT_NE(refusal().find("is not a gpupool registry"), std::string::npos);
  EXPECT_EQ(contents(), before);
}

// Cut while a process uses it: its next publish fails with a reason, no
// fault, and the file is not grown back.
TEST_F(RegistryFile, CutFileRefusedAndPublishFails) {
  auto r = open_new();
  ASSERT_NE(r, nullptr);
  ASSERT_EQ(truncate(path_.c_str(), 100), 0);
  EXPECT_NE(refusal().find("wrong size"), std::string::npos);
  std::string why;
  EXPECT_EQ(r->publish({use(1, 1, 1)}, &why), Registry::Outcome::unusable);
  EXPECT_NE(why.find("wrong size"), std::string::npos) << why;
  EXPECT_EQ(contents().size(), 100u);
  EXPECT_TRUE(r->processes(false, &why).empty());
}

TEST_F(RegistryFile, ReadableByOthersRefused) {
  ASSERT_NE(open_new(), nullptr);
  ASSERT_EQ(chmod(path_.c_str(), 0644), 0);
  EXPECT_NE(refusal().find("readable by other users"), std::string::npos);
}

TEST_F(RegistryFile, NotARegularFileRefused) {
  ASSERT_EQ(mkfifo(path_.c_str(), 0600), 0);
  EXPECT_NE(refusal().find("is not a regular file"), std::string::npos);
}

TEST_F(RegistryFile, SymlinkRefused) {
  const std::string target = dir_.path + "/elsewhere";
  {
    std::string why;
    ASSERT_NE(Registry::open(target, &why), nullptr) << why;
  }
  ASSERT_EQ(symlink(target.c_str(), path_.c_str()), 0);
  std::string why;
  EXPECT_EQ(Registry::open(path_, &why, /*create=*/true), nullptr);
  EXPECT_FALSE(why.empty());
  unlink(target.c_str());
}

}  // namespace
}  // namespace gpupool::wire
