// The node's registry of gpupool processes: what each holds on each GPU.
//
// One file per user (default_registry_path(), or GPUPOOL_REGISTRY), shared
// by every gpupool process of that user and by `gpupool ps`. It holds a
// fixed table of slots; a process claims one by writing its owner word (pid
// and start time, so a reused pid is another owner) and then its figures.
// Never mapped: every look opens the file, checks it, takes an
// open-file-description lock (given up after 20 ms: a stopped holder stops
// nobody), and reads or writes with pread/pwrite. So a file cut or a tmpfs
// full while in use makes a read short or a write fail, which costs a
// warning, never a fault (SIGBUS) in the program; and the file's blocks are
// allocated when it is made. A process that dies leaves a slot whose owner
// is gone, which every reader skips and the next claimer takes over. A file
// that is not this layout, not a regular file of the user, or writable by
// others, or in a directory another user owns or one reached through a
// symbolic link, is not used.
//
// Devices are named by their UUID: ordinals differ between processes
// (CUDA_VISIBLE_DEVICES).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "wire/device_key.hpp"

namespace gpupool::wire {

// One process's figures for one device.
struct DeviceUse {
  DeviceKey key{};
  std::uint64_t held = 0;     // bytes freed by the program, kept by gpupool
  std::uint64_t active = 0;   // bytes in the program's hands
  std::uint64_t managed = 0;  // allocated from the driver: held + active blocks
  std::uint64_t hits = 0, misses = 0;
  // When it last gave memory back to the driver there (CLOCK_MONOTONIC ns,
  // stamped when published; 0: never, or a gpupool that does not say).
  std::uint64_t returned_at = 0;
};

struct ProcessEntry {
  long pid = 0;
  std::string command;  // /proc/<pid>/comm as published
  std::vector<DeviceUse> devices;
};

inline constexpr unsigned kRegistrySlots = 256;
// How long a look waits for the registry's lock. A running process holds it
// for microseconds; one held longer belongs to a stopped process, and
// waiting for it must not stop us.
inline constexpr std::uint64_t kRegistryPatienceNs = 20'000'000;
inline constexpr unsigned kRegistryDevices = 16;  // per process

class Registry {
 public:
  // Maps the registry at `path`, creating it (0600) if missing and
  // `create`. nullptr and *why (a phrase naming the path) when it cannot be
  // used; *why is empty when it is missing and not to be created.
  static std::unique_ptr<Registry> open(const std::string& path, std::string* why,
                                        bool create = true);
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  const std::string& path() const { return path_; }

  enum class Outcome {
    ok,
    full,      // every slot is taken by a live process
    busy,      // locked by a process that does not let go (stopped): next time
    unusable,  // the file is no longer a registry (cut, replaced, disk full): *why
  };
  // This process's figures (at most kRegistryDevices devices), claiming a
  // slot on first use.
  Outcome publish(const std::vector<DeviceUse>& devices, std::string* why);
  // Gives this process's slot back (exit).
  void leave();
  // In a forked child: the slot is the parent's; the child claims its own.
  void forget_slot() { slot_ = -1; }

  // Every live process's entry, this one's included unless skip_self. None,
  // with *why set, when the file is no longer a registry, or (*busy set)
  // when its lock was held past `patience_ns`; after that the registry is
  // left alone for a second, so a stopped lock holder costs one wait.
  std::vector<ProcessEntry> processes(bool skip_self, std::string* why = nullptr,
                                      bool* busy = nullptr,
                                      std::uint64_t patience_ns = kRegistryPatienceNs) const;

 private:
  Registry() = default;
  // The calls above, on the files thread.
  static std::unique_ptr<Registry> open_here(const std::string& path, std::string* why,
                                             bool create);
  Outcome publish_here(const std::vector<DeviceUse>& devices, std::string* why);
  void leave_here();
  std::vector<ProcessEntry> processes_here(bool skip_self, std::string* why, bool* busy,
                                           std::uint64_t patience_ns) const;
  // Whether the registry is left alone now (a lock was held too long), *why
  // then set; pause() starts that second.
  bool paused(std::string* why) const;
  void pause() const;
  std::string path_;
  mutable std::atomic<std::uint64_t> busy_until_{0};  // CLOCK_MONOTONIC ns
  int slot_ = -1;
  std::uint64_t token_ = 0;
  long token_pid_ = 0;
  std::string comm_;  // the command, read when the slot was claimed
};

// The same in every session of the user: /run/gpupool.registry for root
// (where /run is root's alone), else /dev/shm/gpupool-<euid>/registry (the
// directory made private by the user's first gpupool process; if another
// user made it first, the registry is not used, and Registry::open says who
// took it).
std::string default_registry_path();
// This process's command as the kernel names it (/proc/self/comm, at most
// 15 characters): what `gpupool ps` lists, and the Prometheus `program`.
std::string comm_of_self();

// Whether the process `pid` is alive and started at `start` (clock ticks
// after boot, /proc/<pid>/stat's 22nd field).
bool process_alive(long pid, std::uint64_t start);
// The start time of `pid` (0 if unknown).
std::uint64_t process_start(long pid);

}  // namespace gpupool::wire
