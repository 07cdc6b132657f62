// The per-process control socket, shared by the library (server, in the
// control thread) and the launcher (client).
//
// Address: a file, <socket_dir>/control.<pid>, in a directory of the user's
// that nobody else may search (0700): another user cannot connect at all,
// so cannot keep its listen queue full and shut out the user's own
// neighbours and `gpupool stats`. socket_dir is /dev/shm/gpupool-<uid> (the
// registry's default directory; /run/gpupool for root), the same in every
// session of the user. A file left by a killed process is stale (nothing
// listens): replaced by the next process of that pid, removed by the next
// process that starts.
//
// Where that directory cannot be used (another user made it first, no
// /dev/shm), and beside it where GPUPOOL_NEIGHBOURS=all lets other users ask
// for releases, the process binds the Linux abstract name
// "\0gpupool.<euid>.<pid>", which any user can reach. Abstract names belong
// to nobody, so anyone can bind a future process's name first: then the
// process binds "\0gpupool.<euid>.<pid>.<random>" instead, and clients find
// it in /proc/net/unix. Both ends check the other with SO_PEERCRED: the
// server refuses other users (unless GPUPOOL_NEIGHBOURS=all, and then
// answers them only a release) as it accepts, before reading anything; the
// client only trusts a socket held by the pid it asked for, running as its
// own user (a squatter can at worst make a request fail, never answer it).
//
// Protocol: the client sends one line within 2 s: "stats", "stats json",
// "free-held", "stop-holding" (either with " json": the answer's body is one
// JSON object), "ping", or "release <device> <bytes>" (device_key.hpp's
// text) from another gpupool process that ran out of memory on that
// device, or `gpupool free-held --all --device`, optionally
// after "by <ns> ", a deadline in CLOCK_MONOTONIC nanoseconds (one clock for
// every process of the node): a request the process has not begun by then
// is answered "error expired" and not carried out, so a client that gave
// up changed nothing (a stopped process continued later, say). The server
// answers "ok\n" followed by the body, or "error <code> <message>\n"
// (codes: denied, bad-request, exiting, expired), and closes the
// connection.
#pragma once

#include <errno.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "sys/io.hpp"

namespace gpupool::wire {

// The abstract name without its leading NUL ("gpupool.1000.4242"), with
// ".<suffix>" when suffix is not empty.
std::string socket_name(unsigned uid, long pid, const std::string& suffix = {});

// The directory of the user's control socket files. Root's in /run, where
// only root makes entries; another user's in /dev/shm, whose sticky bit
// keeps others from replacing it once made.
std::string socket_dir(unsigned uid);

std::string socket_file(const std::string& dir, long pid);

// `name`: a file's path (it starts with '/') or an abstract name.
socklen_t socket_address(sockaddr_un* addr, const std::string& name);

// A connection to a process's control socket (reach), or why there is none.
struct Reached {
  io::OwnedFd fd;
  int error = ECONNREFUSED;  // connect()'s, when no name was reached
  int socket_error = 0;      // socket()'s, when none could be made
  std::string squatter;      // "pid P, uid U": a name held by another process
};

// Connects to the process `pid` of `uid` under the first of `names` held by
// that very process as that user (SO_PEERCRED): a name squatter is skipped,
// never trusted. Non-blocking; a name whose listen queue is full (EAGAIN:
// the process is busy or stopped, or others keep the queue full) is tried
// again, in turn with the other full ones, until `deadline` (io::mono_ns();
// 0: each tried once): counting it as "nobody there" would make a
// neighbour see out-of-memory with memory held for it. A squatter that
// keeps its own queue full holds up no other name.
Reached reach(const std::vector<std::string>& names, long pid, unsigned uid,
              std::uint64_t deadline);

// A request line with its deadline (CLOCK_MONOTONIC ns; 0: none).
std::string request_line(const std::string& request, std::uint64_t deadline);

// Waits for `events` on fd until the deadline (io::mono_ns()); false on
// timeout or error.
bool wait_for(int fd, short events, std::uint64_t deadline);
// All of `data` sent on the non-blocking socket fd by the deadline.
bool send_all(int fd, std::string_view data, std::uint64_t deadline);

// A line's request, and its deadline in *deadline (0 when it has none).
std::string_view split_request(std::string_view line, std::uint64_t* deadline);

struct SocketName {
  unsigned uid = 0;
  long pid = 0;
  std::string name;
};
// The abstract names of the gpupool control sockets on the node (from
// /proc/net/unix, without the leading '@'), with the uid and pid they name.
// Read with read(2), not iostreams: the library uses this too, and iostreams
// would pull the locale machinery into every process it is preloaded into.
std::vector<SocketName> listed_sockets();

// Every address the process's socket may have: its file, then the usual
// abstract name, then the fallback names listed in /proc/net/unix.
std::vector<std::string> socket_candidates(unsigned uid, long pid);

}  // namespace gpupool::wire
