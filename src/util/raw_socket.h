// socket(2) straight to the kernel, for softverbs' own sockets. Under librspreload (Debian's
// rsocket preload library) every socket() call in the process is offered to rsocket() first;
// our iWARP TCP connections and address probes must never become rsockets themselves (that
// would recurse into the connection being set up), so they bypass the interposed symbol.
#pragma once
#include <sys/syscall.h>
#include <unistd.h>

namespace sv {

inline int raw_socket(int domain, int type, int protocol) {
  return static_cast<int>(syscall(SYS_socket, domain, type, protocol));
}

}  // namespace sv
