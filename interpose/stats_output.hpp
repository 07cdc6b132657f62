// Where dumps go: files opened so that a planted symlink, another user's
// file or a non-regular file is never followed, appended to or truncated.
#pragma once

#include <string>

namespace gpupool::stats {

// "%p" -> pid, "%%" -> "%".
std::string expand_path(const std::string& pattern, long pid);

// Open `path` for writing, never following a symlink in its last component,
// refusing anything but a regular file owned by this user. append: O_APPEND;
// otherwise truncated after the checks. Returns the fd (O_CLOEXEC) or -1 with
// *why set to a message for the log.
int open_output(const std::string& path, bool append, std::string* why);

// Write all of `data` (retrying short writes and EINTR). False on error.
// On a socket, a peer that went away must not SIGPIPE the program: pass
// socket = true (send with MSG_NOSIGNAL).
bool write_all(int fd, const std::string& data, bool socket = false);

// Append one dump to the stats file (or stderr when `path` is empty).
bool append_dump(const std::string& path, const std::string& data, std::string* why);

// Replace `path` atomically (temp file in the same directory + rename), so a
// scraper never reads a half-written file.
bool replace_file(const std::string& path, const std::string& data, std::string* why);

}  // namespace gpupool::stats
