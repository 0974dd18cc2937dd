// A graceful close for a connection's TCP socket (qp.cc close_conn).
#pragma once

namespace sv::engine {

// Sends FIN after whatever the kernel still holds for the peer (shutdown(SHUT_WR)), then
// reads and drops what the peer sends until its FIN (or kLingerMax), and only then closes.
// Closing a socket with unread bytes, or one that bytes reach after close, makes Linux send
// a RST that discards our unsent data (RFC 1122 4.2.2.13, tcp_close): an rsocket server
// that closed right after its last send lost the end of its stream to a peer's credit
// update still in flight. Progress thread only; fd must no longer be registered. At exit the
// process waits (briefly, bounded) for lingering sockets to finish.
void linger_close(int fd);

}  // namespace sv::engine
