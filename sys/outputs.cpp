#include "sys/outputs.hpp"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <string_view>

namespace gpupool::io {
namespace {

// %p appears in `s` as expand_path reads it (%% is a literal %).
bool has_pid(const std::string& s) {
  for (std::size_t i = 0; i + 1 < s.size(); ++i)
    if (s[i] == '%') {
      if (s[i + 1] == 'p') return true;
      ++i;  // "%%" or an unknown escape, kept as is
    }
  return false;
}

// Where ".<pid>" goes in a file name: before its last extension, and at
// the end for a name without one (a leading dot starts no extension).
std::size_t pid_slot(const std::string& name) {
  const std::size_t dot = name.rfind('.');
  return dot == std::string::npos || dot == 0 ? name.size() : dot;
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// `name` is `pattern` with one or more digits for each %p in it (%% a %).
bool match_pid_pattern(const std::string& pattern, std::size_t pi, const std::string& name,
                       std::size_t ni) {
  while (pi < pattern.size()) {
    if (pattern[pi] == '%' && pi + 1 < pattern.size() && pattern[pi + 1] == 'p') {
      std::size_t end = ni;
      while (end < name.size() && is_digit(name[end])) ++end;
      for (std::size_t stop = end; stop > ni; --stop)
        if (match_pid_pattern(pattern, pi + 2, name, stop)) return true;
      return false;
    }
    char want = pattern[pi];
    pi += pattern[pi] == '%' && pi + 1 < pattern.size() && pattern[pi + 1] == '%' ? 2 : 1;
    if (ni >= name.size() || name[ni] != want) return false;
    ++ni;
  }
  return ni == name.size();
}

bool lock_unsupported(int e) { return e == ENOLCK || e == EOPNOTSUPP || e == EINVAL; }

// Takes fd's lock: 0, or EWOULDBLOCK when another holds it. Where the file
// system has no locks the file is taken unheld (0).
int take_lock(int fd) {
  if (flock(fd, LOCK_EX | LOCK_NB) == 0) return 0;
  const int e = errno;
  return lock_unsupported(e) ? 0 : (e == EINTR ? EWOULDBLOCK : e);
}

FileId id_at(int dir, const std::string& name, struct stat* st) {
  if (fstatat(dir, name.c_str(), st, AT_SYMLINK_NOFOLLOW) != 0) return {};
  return {st->st_dev, st->st_ino};
}

// Why `path`, found as st, is not a file this user's gpupool may replace;
// empty when it is.
std::string not_replaceable(const std::string& path, const struct stat& st) {
  if (!S_ISREG(st.st_mode)) return "refusing to replace " + path + ": not a regular file";
  if (st.st_uid != geteuid())
    return "refusing to replace " + path + ": owned by uid " + std::to_string(st.st_uid) +
           ", not by this user (uid " + std::to_string(geteuid()) + ")";
  return {};
}

// A temporary file's name beside `name`: hidden (never read as a .prom
// file), with its writer's pid, which says when it is stale
// (temporary_pid).
constexpr std::string_view kTemporary = ".tmp";

// The pid in `entry` when it is the name of a temporary file written for
// NAME (".NAME.tmpPID-XXXXXX"), else -1; *name: NAME.
long temporary_pid(const std::string& entry, std::string* name) {
  const std::size_t at = entry.rfind(kTemporary);
  if (entry.size() < 2 || entry[0] != '.' || at == std::string::npos || at < 2) return -1;
  std::size_t i = at + kTemporary.size();
  long pid = 0;
  const std::size_t digits = i;
  for (; i < entry.size() && is_digit(entry[i]) && i - digits < 10; ++i)
    pid = pid * 10 + (entry[i] - '0');
  if (i == digits || i >= entry.size() || entry[i] != '-') return -1;
  *name = entry.substr(1, at - 1);
  return pid;
}

// A temporary file left by a write that never ended: its writer is gone
// (or it is this process, whose writes never overlap the sweep: an exec
// ended the write of the program it was before), and nobody holds it.
bool stale_temporary(long pid) {
  return pid == static_cast<long>(getpid()) ||
         (kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH);
}

// A new file beside `name` in dir, locked, its name in *tmp. Hidden, and
// not an output name: never read as a .prom file; removed as stale only
// once its writer is gone (remove_unheld_outputs).
OwnedFd create_beside(int dir, const std::string& name, std::string* tmp) {
  OwnedFd fresh;
  for (int tries = 0; tries < 16 && !fresh.valid(); ++tries) {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    char suffix[48];
    snprintf(suffix, sizeof suffix, "%.*s%ld-%06lx", static_cast<int>(kTemporary.size()),
             kTemporary.data(), static_cast<long>(getpid()),
             static_cast<unsigned long>((ts.tv_nsec ^ tries * 7919) & 0xffffff));
    *tmp = "." + name + suffix;
    fresh = OwnedFd::adopt(
        ::openat(dir, tmp->c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644));
    if (!fresh.valid() && errno != EEXIST) break;
  }
  if (fresh.valid()) {
    (void)take_lock(fresh.get());  // a new file: nobody else has it
    fchmod(fresh.get(), 0644);
  }
  return fresh;
}

// Gives `tmp` the name `name` in dir: 0 or an errno. `replacing`: over the
// file there; else only while nothing is there.
int rename_into_place(int dir, const std::string& tmp, const std::string& name, bool replacing) {
  int r;
  if (replacing) {
    // renameat() replaces the name itself, never what a symbolic link
    // put there since would point to.
    r = ::renameat(dir, tmp.c_str(), dir, name.c_str());
  } else {
    // Nothing was there: never replace what appeared meanwhile.
    r = renameat2(dir, tmp.c_str(), dir, name.c_str(), RENAME_NOREPLACE);
    if (r != 0 && (errno == EINVAL || errno == ENOSYS)) {
      r = ::linkat(dir, tmp.c_str(), dir, name.c_str(), 0);
      if (r == 0) ::unlinkat(dir, tmp.c_str(), 0);
    }
  }
  return r == 0 ? 0 : errno;
}

}  // namespace

std::string sibling_path(const std::string& path, long pid) {
  const std::size_t slash = path.rfind('/');
  const std::size_t start = slash == std::string::npos ? 0 : slash + 1;
  const std::size_t at = start + pid_slot(path.substr(start));
  return path.substr(0, at) + "." + std::to_string(pid) + path.substr(at);
}

std::vector<std::string> output_names(const std::string& value, long pid, long run_pid,
                                      bool forked_child) {
  const std::string path = expand_path(value, pid);
  if (has_pid(value)) return {path};
  const std::string sibling = sibling_path(path, pid);
  const bool may_take_value = run_pid > 0 ? pid == run_pid : !forked_child;
  if (may_take_value) return {path, sibling};
  return {sibling};
}

NumberedNames numbered_names(const std::string& value, long pid, long run_pid, bool forked_child) {
  NumberedNames n;
  n.path = expand_path(value, pid);
  if (has_pid(value)) n.fixed = pid;
  n.first = (run_pid > 0 ? pid == run_pid : !forked_child) ? 0 : 1;
  return n;
}

std::string NumberedNames::name(std::size_t i, long* number) const {
  // As many as pids could be: every live process finds a free one.
  constexpr std::size_t kMost = 1u << 22;
  if (fixed >= 0) {
    if (i) return {};
    *number = fixed;
    return path;
  }
  if (i >= kMost) return {};
  *number = first + static_cast<long>(i);
  return *number == 0 ? path : sibling_path(path, *number);
}

long sibling_pid(const std::string& of, const std::string& name) {
  const std::size_t at = pid_slot(of);
  const std::string_view stem(of.data(), at), ext(of.data() + at, of.size() - at);
  // A pid has at most 10 digits (pid_max is at most 2^22).
  if (name.size() < stem.size() + ext.size() + 2 || name.size() > of.size() + 11) return -1;
  const std::string_view n(name);
  if (n.substr(0, stem.size()) != stem || n.substr(n.size() - ext.size()) != ext ||
      n[stem.size()] != '.')
    return -1;
  long pid = 0;
  for (std::size_t i = stem.size() + 1; i < n.size() - ext.size(); ++i) {
    if (!is_digit(n[i])) return -1;
    pid = pid * 10 + (n[i] - '0');
  }
  return pid;
}

std::string unsibling(const std::string& name) {
  // ".<digits>" before the last extension, or as it.
  const std::size_t last = pid_slot(name);
  for (const std::size_t end : {last, name.size()}) {
    const std::size_t dot = name.rfind('.', end == 0 ? 0 : end - 1);
    if (dot == std::string::npos || dot == 0 || dot + 1 >= end) continue;
    const std::string of = name.substr(0, dot) + name.substr(end);
    if (sibling_pid(of, name) >= 0) return of;
  }
  return {};
}

bool is_output_name(const std::string& value_name, const std::string& name) {
  if (has_pid(value_name)) return match_pid_pattern(value_name, 0, name, 0);
  const std::string plain = expand_path(value_name, 0);  // %% -> %
  return name == plain || sibling_pid(plain, name) >= 0;
}

OwnedFd hold_output(const std::string& path, bool append, Hold* result, std::string* why) {
  *result = Hold::failed;
  // Opened without truncating: the file may be another live process's.
  OwnedFd fd = open_output(path, /*append=*/true, why);
  if (!fd.valid()) return {};
  if (const int e = take_lock(fd.get()); e == EWOULDBLOCK) {
    *result = Hold::taken;
    *why = path + " is written by another live process";
    return {};
  } else if (e != 0) {
    *why = "cannot lock " + path + ": " + strerror(e);
    return {};
  }
  if (!append && ftruncate(fd.get(), 0) != 0) {
    *why = "cannot truncate " + path + ": " + strerror(errno);
    return {};
  }
  *result = Hold::held;
  return fd;
}

Hold HeldFile::replace(const std::string& path, const std::string& data, std::string* why) {
  // Every name below is looked up in the directory opened without links.
  std::string name;
  const OwnedFd dir = open_parent(path, &name, why);
  if (!dir.valid()) return Hold::failed;
  const int d = dir.get();
  for (int attempt = 0; attempt < 4; ++attempt) {
    struct stat st {};
    const FileId there = id_at(d, name, &st);
    if (!there.valid() && errno != ENOENT) {
      *why = "cannot check " + path + ": " + strerror(errno);
      return Hold::failed;
    }
    if (std::string no; there.valid() && !(no = not_replaceable(path, st)).empty()) {
      *why = std::move(no);
      return Hold::failed;
    }
    // Someone else's version, or a dead process's: replaced only while
    // this process holds it, so no two processes both take it.
    OwnedFd old;
    if (there.valid() && !(held_.valid() && there == held_.id())) {
      old = OwnedFd::adopt(
          ::openat(d, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
      if (!old.valid() || old.id() != there) continue;  // changed meanwhile: look again
      if (const int e = take_lock(old.get()); e == EWOULDBLOCK) {
        *why = path + " is written by another live process";
        return Hold::taken;
      } else if (e != 0) {
        *why = "cannot lock " + path + ": " + strerror(e);
        return Hold::failed;
      }
      if (id_at(d, name, &st) != there) continue;
    }
    // The new version, held before it takes the name.
    std::string tmp;
    OwnedFd fresh = create_beside(d, name, &tmp);
    if (!fresh.valid()) {
      *why = "cannot create a temporary file next to " + path + ": " + strerror(errno);
      return Hold::failed;
    }
    if (!write_plain(fresh.get(), data.data(), data.size())) {
      *why = "cannot write " + tmp + ": " + strerror(errno);
      ::unlinkat(d, tmp.c_str(), 0);
      return Hold::failed;
    }
    if (const int e = rename_into_place(d, tmp, name, there.valid()); e != 0) {
      ::unlinkat(d, tmp.c_str(), 0);
      if (e == EEXIST) continue;
      *why = "cannot rename " + tmp + " to " + path + ": " + strerror(e);
      return Hold::failed;
    }
    held_ = std::move(fresh);  // the version it replaced is let go
    return Hold::held;
  }
  *why = "refusing to replace " + path + ": it keeps changing";
  return Hold::failed;
}

void HeldFile::remove(const std::string& path) {
  if (!held_.valid()) return;
  std::string name, why;
  const OwnedFd dir = open_parent(path, &name, &why);
  struct stat st {};
  if (dir.valid() && held_.ours() && id_at(dir.get(), name, &st) == held_.id())
    ::unlinkat(dir.get(), name.c_str(), 0);
  held_.close();
}

namespace {

// Calls fn(dir, entry, file, temporary) for each file in the directory of
// `value` that is_output_name gives for it and gpupool wrote (a regular
// file of this user starting with `starts_with`), and, with temporaries,
// for HeldFile's temporary files beside them whose writer is gone or is
// this process; `file` is opened read-only. Not when the directory part
// holds %p. any_name: whatever the names (remove_unheld_outputs).
template <class Fn>
void each_output(const std::string& value, const std::string& keep, const std::string& starts_with,
                 bool temporaries, bool any_name, Fn&& fn) {
  const std::size_t slash = value.rfind('/');
  if (slash != std::string::npos && has_pid(value.substr(0, slash))) return;
  const std::string value_name = slash == std::string::npos ? value : value.substr(slash + 1);
  std::string name, why;
  const OwnedFd dir = open_parent(expand_path(value, 0), &name, &why);
  if (!dir.valid()) return;
  const int d = dir.get();
  const int list = above_stdio(::openat(d, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (list < 0) return;
  DIR* dp = fdopendir(list);
  if (!dp) {
    ::close(list);
    return;
  }
  std::string head(starts_with.size(), '\0');
  while (const dirent* e = readdir(dp)) {
    const std::string entry = e->d_name;
    if (entry == keep || entry == "." || entry == "..") continue;
    // The name is value's (or, for a temporary, the name it was written
    // for), else gpupool's only by the content, and only a `.prom` name
    // (what node_exporter reads: a user's copy under another name is kept).
    std::string written;
    const long writer = temporaries ? temporary_pid(entry, &written) : -1;
    if (writer < 0) written = entry;
    const bool named = is_output_name(value_name, written);
    if (!named && (!any_name || !written.ends_with(".prom"))) continue;
    if (writer >= 0 && !stale_temporary(writer)) continue;
    OwnedFd f = OwnedFd::adopt(
        ::openat(d, entry.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY));
    struct stat st {};
    if (!f.valid() || fstat(f.get(), &st) != 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid())
      continue;
    // Only what gpupool wrote: a name alone may be the user's own file. (A
    // temporary of value's name is gpupool's, and what it holds may be cut
    // short.)
    if ((writer < 0 || !named) &&
        (pread(f.get(), head.data(), head.size(), 0) != static_cast<ssize_t>(head.size()) ||
         head != starts_with))
      continue;
    fn(d, entry, f, writer >= 0);
  }
  closedir(dp);
}

}  // namespace

std::vector<std::string> remove_unheld_outputs(const std::string& value, const std::string& keep,
                                               const std::string& starts_with, Names names) {
  std::vector<std::string> removed;
  each_output(value, keep, starts_with, /*temporaries=*/true, names == Names::any,
              [&](int d, const std::string& entry, OwnedFd& f, bool) {
                // Held: a live process's. Where locks are not supported
                // nothing is known.
                if (flock(f.get(), LOCK_EX | LOCK_NB) != 0) return;
                struct stat st {};
                if (id_at(d, entry, &st) == f.id() && ::unlinkat(d, entry.c_str(), 0) == 0)
                  removed.push_back(entry);
              });
  return removed;
}

std::vector<std::string> held_outputs(const std::string& value, const std::string& starts_with) {
  std::vector<std::string> held;
  each_output(value, "", starts_with, /*temporaries=*/false, /*any_name=*/false,
              [&](int, const std::string& entry, OwnedFd& f, bool) {
                if (flock(f.get(), LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK)
                  held.push_back(entry);
              });
  return held;
}

}  // namespace gpupool::io
