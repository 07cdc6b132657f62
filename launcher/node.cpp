// gpupool ps: every gpupool process of this user on the node, from the node
// registry (wire/registry.hpp), and what each holds per GPU.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "launcher/launcher.hpp"
#include "observe/bytes.hpp"
#include "observe/stats_format.hpp"
#include "wire/registry.hpp"

namespace gpupool::launcher {
namespace {

const char kPsHelp[] =
    "Usage: gpupool ps [--json]\n"
    "\n"
    "List this user's processes running gpupool on this node, with, per device,\n"
    "the bytes in the program's hands (active), freed and kept by gpupool\n"
    "(held) and allocated from the driver (managed); --json adds pool hits and\n"
    "misses (docs/sharing.md has its schema). A device is a GPU by its UUID\n"
    "(GPU-...), pinned host memory (host), or an OpenCL device without a UUID\n"
    "by a key made from its platform, vendor, name and the node (opencl-...,\n"
    "as `gpupool stats` names it). Figures are at most 100 ms old. The\n"
    "registry is GPUPOOL_REGISTRY, else /dev/shm/gpupool-<uid>/registry\n"
    "(/run/gpupool.registry for root).\n"
    "\n"
    "`gpupool free-held --all [--device DEVICE]` asks every one of them to\n"
    "release its held memory (on that device only, with --device).\n";

}  // namespace

std::string registry_path() {
  const char* p = std::getenv("GPUPOOL_REGISTRY");
  return p && *p ? p : wire::default_registry_path();
}

// The registry's live processes; false (after saying why) when it cannot be
// read. A registry that does not exist yet lists nobody.
bool registry_processes(std::vector<wire::ProcessEntry>* out) {
  std::string why;
  auto reg = wire::Registry::open(registry_path(), &why, /*create=*/false);
  if (!reg) {
    if (why.empty()) return true;
    std::fprintf(stderr, "%s: %s\n", kProg, why.c_str());
    return false;
  }
  // A person waits: a lock held a second is a stopped process, said so,
  // never taken for "nobody there".
  bool busy = false;
  *out = reg->processes(/*skip_self=*/false, &why, &busy, 1'000'000'000);
  if (!why.empty()) {
    std::fprintf(stderr, "%s: %s%s\n", kProg, why.c_str(),
                 busy ? " (for over a second: a stopped gpupool process? `fuser` names it)" : "");
    return false;
  }
  return true;
}

const char* ps_help() { return kPsHelp; }

int cmd_ps(int argc, char** argv) {
  bool json = false;
  for (int i = 0; i < argc; ++i) {
    const std::string a = argv[i];
    if (is_help(a)) {
      std::fputs(kPsHelp, stdout);
      return kOk;
    }
    if (a == "--json") json = true;
    else return usage_error("ps: unexpected argument '" + a + "'", "ps");
  }
  std::vector<wire::ProcessEntry> procs;
  if (!registry_processes(&procs)) return kFailed;
  if (json) {
    std::string o = "{\"registry\": " + json_string(registry_path()) + ", \"processes\": [";
    for (std::size_t i = 0; i < procs.size(); ++i) {
      const auto& p = procs[i];
      o += (i ? ", " : "") + std::string("{\"pid\": ") + std::to_string(p.pid) +
           ", \"command\": " + json_string(p.command) + ", \"devices\": [";
      for (std::size_t k = 0; k < p.devices.size(); ++k) {
        const auto& d = p.devices[k];
        o += (k ? ", " : "") + std::string("{\"device\": ") + json_string(wire::key_text(d.key)) +
             ", \"active_bytes\": " + std::to_string(d.active) +
             ", \"held_bytes\": " + std::to_string(d.held) +
             ", \"managed_bytes\": " + std::to_string(d.managed) +
             ", \"hits\": " + std::to_string(d.hits) + ", \"misses\": " + std::to_string(d.misses) +
             "}";
      }
      o += "]}";
    }
    std::printf("%s]}\n", o.c_str());
    return kOk;
  }
  if (procs.empty()) {
    std::printf("no gpupool process of this user on this node has used a device\n");
    return kOk;
  }
  // 97 columns: a pid has at most 7 digits, a command (/proc/PID/comm) 15
  // characters, a device's key 40.
  std::printf("%-7s %-15s %-40s %10s %10s %10s\n", "PID", "COMMAND", "DEVICE", "ACTIVE", "HELD",
              "MANAGED");
  for (const auto& p : procs) {
    const std::string command = terminal_text(p.command);
    if (p.devices.empty()) std::printf("%-7ld %-15.15s %s\n", p.pid, command.c_str(), "-");
    for (const auto& d : p.devices)
      std::printf("%-7ld %-15.15s %-40s %10s %10s %10s\n", p.pid, command.c_str(),
                  wire::key_text(d.key).c_str(), observe::bytes_text(d.active).c_str(),
                  observe::bytes_text(d.held).c_str(), observe::bytes_text(d.managed).c_str());
  }
  return kOk;
}

}  // namespace gpupool::launcher
