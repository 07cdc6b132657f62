#include "launcher/trace_tools.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "launcher/launcher.hpp"
#include "sys/outputs.hpp"

namespace gpupool::launcher {

bool read_trace_for(const char* cmd, const std::string& path, trace::TraceFile* tr) {
  std::string error;
  if (!trace::read_trace(path, tr, &error, /*lenient=*/true)) {
    say(cmd, error);
    return false;
  }
  if (tr->truncated_tail)
    say(cmd, path +
                 ": the last line is incomplete (the program was killed while writing it); read "
                 "without it");
  if (tr->unpaired)
    say(cmd, path + ": " + std::to_string(tr->unpaired) +
                 " records do not pair with the others (records lost when the program was "
                 "killed?); read without them");
  return true;
}

namespace {

std::string dir_of(const std::string& path) {
  const std::size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The names in dir, sorted; false and *error when it cannot be read.
bool names_in(const std::string& dir, std::vector<std::string>* names, std::string* error) {
  DIR* d = ::opendir(dir.c_str());
  if (!d) {
    *error = "cannot read the directory " + dir + ": " + std::strerror(errno);
    return false;
  }
  errno = 0;
  while (const dirent* e = ::readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names->push_back(name);
  }
  const int err = errno;
  ::closedir(d);
  if (err) {
    *error = "cannot read the directory " + dir + ": " + std::strerror(err);
    return false;
  }
  std::sort(names->begin(), names->end());
  return true;
}

}  // namespace

bool trace_files(const std::vector<std::string>& inputs, std::vector<std::string>* files,
                 std::vector<std::string>* notes, std::string* error) {
  std::vector<std::pair<dev_t, ino_t>> seen;
  auto add = [&](const std::string& path) {
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0) {
      const std::pair<dev_t, ino_t> id{st.st_dev, st.st_ino};
      if (std::find(seen.begin(), seen.end(), id) != seen.end()) return;
      seen.push_back(id);
    }
    files->push_back(path);
  };
  // Another run's traces beside an input: said at the end, but for those
  // read anyway (named themselves, or in a directory named).
  struct LeftOut {
    std::string beside;
    std::vector<std::string> files;
    std::uint64_t run = 0;
  };
  std::vector<LeftOut> left_out;
  for (const std::string& input : inputs) {
    struct stat st {};
    const bool exists = ::stat(input.c_str(), &st) == 0;
    if (exists && S_ISDIR(st.st_mode)) {
      // A directory: the traces in it (the other files are left out).
      std::vector<std::string> names;
      if (!names_in(input, &names, error)) return false;
      const std::string prefix = input.back() == '/' ? input : input + "/";
      std::size_t found = 0, other = 0;
      for (const std::string& name : names) {
        if (trace::is_trace_file(prefix + name)) {
          add(prefix + name);
          ++found;
        } else {
          ++other;
        }
      }
      if (!found) {
        *error = input + ": no gpupool trace in this directory (none of its " +
                 std::to_string(other) + " files starts with '" + trace::kTraceHeader + "')";
        return false;
      }
      if (other)
        notes->push_back(input + ": " + std::to_string(other) +
                         (other == 1 ? " file that is not a trace left out"
                                     : " files that are not traces left out"));
      continue;
    }
    // A file, and the siblings the processes the program started wrote
    // (docs/trace.md): NAME.PID.EXT beside NAME.EXT.
    const std::size_t slash = input.rfind('/');
    const std::string dir = dir_of(input);
    const std::string prefix = slash == std::string::npos ? "" : input.substr(0, slash + 1);
    const std::string base = slash == std::string::npos ? input : input.substr(slash + 1);
    std::vector<std::string> names;
    std::string ignored;
    if (!base.empty()) names_in(dir, &names, &ignored);
    // The traces of `of`'s siblings, by pid.
    auto siblings_of = [&](const std::string& of, bool say) {
      std::vector<std::pair<long, std::string>> out;
      for (const std::string& name : names) {
        const long pid = io::sibling_pid(of, name);
        if (pid < 0) continue;
        if (trace::is_trace_file(prefix + name)) out.emplace_back(pid, prefix + name);
        else if (say) notes->push_back(prefix + name + ": not a gpupool trace, left out");
      }
      std::sort(out.begin(), out.end());
      return out;
    };
    std::vector<std::pair<long, std::string>> siblings = siblings_of(base, true);
    // A trace of a `gpupool run` (its '# run' line): that run's traces only.
    // Another run's beside it (two runs given one name at once) are left out,
    // and said; and a file that is itself a sibling (that other run's
    // program found the name taken) is read with its own run's traces
    // beside the name it was given.
    std::uint64_t pid = 0, run = 0;
    if (exists) trace::trace_head(input, &pid, &run);
    if (run != 0) {
      const std::string named = io::unsibling(base);
      if (!named.empty()) {
        if (const std::string path = prefix + named; trace::is_trace_file(path))
          siblings.emplace_back(-1, path);
        for (auto& s : siblings_of(named, false))
          if (s.second != input) siblings.push_back(std::move(s));
      }
      std::vector<std::pair<long, std::string>> ours;
      std::vector<std::string> others;
      std::uint64_t other_run = 0;
      for (auto& s : siblings) {
        std::uint64_t p = 0, r = 0;
        trace::trace_head(s.second, &p, &r);
        if (r == run) {
          ours.push_back(std::move(s));
        } else if (s.first >= 0 && io::sibling_pid(base, s.second.substr(prefix.size())) >= 0) {
          others.push_back(s.second);
          other_run = r;
        }
      }
      siblings = std::move(ours);
      if (!others.empty()) left_out.push_back({input, std::move(others), other_run});
    }
    // The file itself, unless only its siblings exist (the first process
    // made no GPU call): a missing one is read, to say so.
    if (exists || siblings.empty()) add(input);
    for (const auto& [sibling_pid, path] : siblings) add(path);
  }
  for (const LeftOut& l : left_out) {
    std::string list;
    std::size_t n = 0;
    for (const std::string& f : l.files) {
      struct stat st {};
      if (::stat(f.c_str(), &st) == 0 &&
          std::find(seen.begin(), seen.end(), std::pair{st.st_dev, st.st_ino}) != seen.end())
        continue;
      list += (list.empty() ? "" : ", ") + f;
      ++n;
    }
    if (n)
      notes->push_back(std::to_string(n) + (n == 1 ? " trace" : " traces") + " beside " + l.beside +
                       " of another run left out: " + list +
                       (l.run ? " (`gpupool run` " + std::to_string(l.run) + ")" : "") +
                       "; name one of them to read its run");
  }
  return true;
}

bool read_traces_for(const char* cmd, const std::vector<std::string>& inputs,
                     std::vector<trace::TraceFile>* out) {
  std::vector<std::string> files, notes;
  std::string error;
  if (!trace_files(inputs, &files, &notes, &error)) {
    say(cmd, error);
    return false;
  }
  out->clear();
  out->reserve(files.size());
  try {
    for (const std::string& f : files) {
      out->emplace_back();
      if (!read_trace_for(cmd, f, &out->back())) return false;
    }
  } catch (const std::bad_alloc&) {
    say(cmd, out->back().path + ": out of memory reading it");
    return false;
  }
  // Which files, when not just the one named (after reading: an error is
  // the one message).
  for (const std::string& note : notes) say(cmd, note);
  if (files.size() != 1 || inputs.size() != 1 || files[0] != inputs[0]) {
    std::string list;
    for (const std::string& f : files) list += (list.empty() ? "" : ", ") + f;
    say(cmd, std::to_string(files.size()) + (files.size() == 1 ? " trace: " : " traces: ") + list);
  }
  return true;
}

Output::~Output() {
  if (fd_ >= 0) ::close(fd_);
  if (!tmp_.empty()) ::unlink(tmp_.c_str());
}

namespace {

// What a name that is not a regular file is, for the message refusing it.
const char* kind_of(mode_t mode) {
  if (S_ISLNK(mode)) return "a symbolic link: not followed (name the file it points to)";
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISBLK(mode)) return "a block device, not a regular file";
  if (S_ISFIFO(mode)) return "a FIFO, not a regular file";
  if (S_ISSOCK(mode)) return "a socket, not a regular file";
  return "not a regular file";
}

}  // namespace

bool Output::open(const std::string& path, std::string* why) {
  path_ = path;
  if (path == "-") {
    std::fflush(stdout);
    fd_ = ::dup(STDOUT_FILENO);
    if (fd_ < 0) {
      *why = std::string("standard output: ") + std::strerror(errno);
      return false;
    }
    return true;
  }
  // A regular file is written: a new one, or one of this user's that is
  // not read-only, replaced whole (written beside it, then renamed) with
  // its mode. A character device (/dev/null, a terminal) is written as a
  // stream, as cp writes it: a CI gate may throw the page away and keep
  // the exit status. Anything else is refused: a block device is no place
  // for a page (its backing file), and a pipe is what '-o -' is for.
  struct stat st {};
  mode_t mode = 0666;  // a new file: the umask's
  if (::lstat(path.c_str(), &st) == 0) {
    if (S_ISCHR(st.st_mode)) {
      fd_ = ::open(path.c_str(), O_WRONLY | O_NOCTTY | O_CLOEXEC);
      if (fd_ < 0) *why = "cannot open " + path + ": " + std::strerror(errno);
      return fd_ >= 0;
    }
    if (!S_ISREG(st.st_mode)) {
      *why = path + " is " + kind_of(st.st_mode) +
             (S_ISLNK(st.st_mode) || S_ISDIR(st.st_mode) ? ""
                                                         : ": nothing written ('-o -' writes "
                                                           "to standard output)");
      return false;
    }
    if (st.st_uid != ::geteuid()) {
      *why = path + " belongs to another user: not replaced";
      return false;
    }
    if (!(st.st_mode & S_IWUSR)) {
      char octal[8];
      std::snprintf(octal, sizeof octal, "%04o", static_cast<unsigned>(st.st_mode & 07777));
      *why = path + " is read-only (mode " + octal + "): not replaced";
      return false;
    }
    mode = st.st_mode & 0777;
  } else if (errno != ENOENT) {
    *why = "cannot look at " + path + ": " + std::strerror(errno);
    return false;
  }
  std::string tmp = path + ".tmp." + std::to_string(getpid());
  fd_ = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0666);
  if (fd_ < 0) {
    *why = "cannot create " + path + ": " + std::strerror(errno);
    return false;
  }
  if (mode != 0666 && ::fchmod(fd_, mode) != 0) {
    *why = "cannot set the mode of " + path + ": " + std::strerror(errno);
    ::close(fd_);
    fd_ = -1;
    ::unlink(tmp.c_str());
    return false;
  }
  tmp_ = std::move(tmp);
  return true;
}

bool Output::put(std::string_view data) {
  if (failed_) return false;
  buf_.append(data);
  return buf_.size() < kFlushAt || flush();
}

bool Output::flush() {
  if (failed_) return false;
  // Standard output whose reader left (`| head`) raises SIGPIPE, which ends
  // the command quietly, as it ends cat.
  std::size_t done = 0;
  while (done < buf_.size()) {
    const ssize_t n = ::write(fd_, buf_.data() + done, buf_.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      error_ = "writing " + (path_ == "-" ? std::string("standard output") : path_) + ": " +
               std::strerror(n < 0 ? errno : EIO);
      failed_ = true;
      return false;
    }
    done += static_cast<std::size_t>(n);
  }
  buf_.clear();
  return true;
}

bool Output::commit(std::string* why) {
  const bool flushed = flush();
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0 && errno != EINTR && flushed) {
    error_ = "writing " + (path_ == "-" ? std::string("standard output") : path_) + ": " +
             std::strerror(errno);
    failed_ = true;
  }
  if (failed_) {
    *why = error_;
    return false;
  }
  if (!tmp_.empty()) {
    if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
      *why = "cannot rename to " + path_ + ": " + std::strerror(errno);
      return false;  // the destructor removes the temporary
    }
    tmp_.clear();
  }
  return true;
}

bool write_whole(const std::string& path, const std::string& data, std::string* why) {
  Output out;
  if (!out.open(path, why)) return false;
  out.put(data);
  return out.commit(why);
}

}  // namespace gpupool::launcher
