// The per-process control socket, shared by the library (server, in the
// control thread) and the launcher (client).
//
// Address: the Linux abstract namespace, "\0gpupool.<euid>.<pid>". No file,
// so nothing to plant, clean up or leave stale after a crash; it vanishes
// with the process. Both ends check the other with SO_PEERCRED: the server
// answers only its own user; the client only trusts an answer from the pid it
// asked for, running as its own user (someone squatting the name can at
// worst make a request fail, never answer it).
//
// Protocol: the client sends one line ("stats", "stats json", "free-held",
// "stop-holding", "ping"); the server answers "ok\n" followed by the body, or
// "error <code> <message>\n" (codes: denied, bad-request, exiting), and
// closes the connection.
#pragma once

#include <stddef.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstdio>
#include <cstring>

namespace gpupool::control {

inline socklen_t socket_address(sockaddr_un* addr, unsigned uid, long pid) {
  std::memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  int n = std::snprintf(addr->sun_path + 1, sizeof addr->sun_path - 1, "gpupool.%u.%ld", uid, pid);
  return static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + n);
}

}  // namespace gpupool::control
