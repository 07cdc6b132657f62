// The files that one GPUPOOL_* setting makes several processes write
// (GPUPOOL_TRACE_FILE, GPUPOOL_PROMETHEUS_FILE): which name each process
// takes, and how it keeps another live process from writing the same one.
//
// A process holds the file it writes: an exclusive flock(2) on it, taken
// before anything is written and kept until the process ends (the kernel
// lets go of it however the process ends, SIGKILL included). A file nobody
// holds belongs to no live process. Opening follows sys/io.hpp's rules
// (no symbolic link, only a regular file of this user).
#pragma once

#include <string>
#include <vector>

#include "sys/io.hpp"

namespace gpupool::io {

// `path` with ".<pid>" inserted before the last extension of its file name:
// out.trace -> out.4242.trace, gpupool.prom -> gpupool.4242.prom,
// trace -> trace.4242, .hidden -> .hidden.4242.
std::string sibling_path(const std::string& path, long pid);

// The pid whose sibling `name` is (sibling_path's rule, both plain file
// names): "out.4242.trace" of "out.trace" is 4242; -1 for any other name.
long sibling_pid(const std::string& of, const std::string& name);

// The names a process tries, in order, for a setting's value (docs/trace.md,
// "Several processes"); the first one it can hold is its file.
//   value with %p:                 the value, %p expanded (the user chose)
//   pid == run_pid:                the value, then its sibling
//   run_pid set, another process:  the sibling
//   no run_pid (set by hand):      the value, then its sibling; a forked
//                                  child only the sibling (its parent may
//                                  hold the value)
std::vector<std::string> output_names(const std::string& value, long pid, long run_pid,
                                      bool forked_child);

// The numbered names of a file each live process writes one of
// (GPUPOOL_PROMETHEUS_FILE, docs/stats.md "Prometheus"): name 0 is the value
// itself, name n its sibling value.n.ext. A process takes the first it can
// hold, so a name, and the number the file's series are labelled with, is
// reused once its process is gone: as many as run at once, not one per pid.
// The process output_names lets take the value tries from 0, any other from
// 1; with %p the value expanded is the only name, numbered with the pid.
struct NumberedNames {
  std::string path;  // the value, %p expanded
  long first = 0;    // the number tried first
  long fixed = -1;   // with %p: the pid; else -1

  // The name tried at attempt `i` (0, 1, ...) and its number; empty when
  // there is none left.
  std::string name(std::size_t i, long* number) const;
};
NumberedNames numbered_names(const std::string& value, long pid, long run_pid, bool forked_child);

// The file name `name` is a sibling of (sibling_path's rule undone:
// out.4242.trace -> out.trace, trace.4242 -> trace); empty when it is none.
std::string unsibling(const std::string& name);

// `name` (a file name) is one that output_names gives for some pid, for the
// value whose file name is `value_name`: value_name itself, a sibling
// (.<digits> before the same extension), or with %p the pattern with any
// pid.
bool is_output_name(const std::string& value_name, const std::string& name);

enum class Hold { held, taken, failed };

// Opens `path` as open_output does and holds it. Truncated (unless append)
// only once held. taken: another live process holds it, nothing changed.
// A file system without locks (ENOLCK, EOPNOTSUPP) is written unheld.
OwnedFd hold_output(const std::string& path, bool append, Hold* result, std::string* why);

// A file replaced whole at each update (the Prometheus file), held by this
// process from its first update until remove() or the process's end: each
// new version is held before it takes the name (a temporary file beside
// it, renamed), so the name is never free between two updates. The
// descriptor kept is the files thread's (sys/io.hpp): use it there.
class HeldFile {
 public:
  // Writes `data` as `path`. taken: another live process holds `path`
  // (nothing written). A file of this user that nobody holds (a dead
  // process's) is replaced.
  Hold replace(const std::string& path, const std::string& data, std::string* why);
  // Removes `path` if it is still the file this process last wrote there.
  void remove(const std::string& path);
  // A forked child: the parent's file stays the parent's.
  void forget_in_child() { held_.close(); }
  bool holding() const { return held_.valid(); }

 private:
  OwnedFd held_;
};

// Removes, in the directory of `value` (a setting's value, %p unexpanded),
// the files is_output_name gives for it that no live process holds and
// that gpupool wrote: regular files of this user whose content begins
// with `starts_with`; and the temporary files HeldFile left beside them
// (".NAME.tmpPID-XXXXXX": a write an exec or a kill cut short) whose
// writer is gone or is this process (whose own write is never under way
// meanwhile), unheld. `keep` (a file name) is left alone. Returns the
// names removed, in the directory's order. Nothing is done when the
// directory part holds %p.
// Names::any: every such file of the directory, whatever its name (and
// temporaries of any name whose content begins so too): for files that are
// live state, not records (Prometheus'), any gpupool process writing there
// sweeps what another name's killed process left.
enum class Names { of_value, any };
std::vector<std::string> remove_unheld_outputs(const std::string& value, const std::string& keep,
                                               const std::string& starts_with,
                                               Names names = Names::of_value);

// The files of `value` (as remove_unheld_outputs finds them, temporaries
// aside) that a live process holds: it is writing them. A shared lock is
// tried, so a holder's exclusive one refuses it and nobody is refused
// meanwhile but another process taking the file at that instant.
std::vector<std::string> held_outputs(const std::string& value, const std::string& starts_with);

}  // namespace gpupool::io
