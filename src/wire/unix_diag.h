// The kernel's answer to a sock_diag dump of unix sockets (NETLINK_SOCK_DIAG,
// SOCK_DIAG_BY_FAMILY with UDIAG_SHOW_NAME | UDIAG_SHOW_UID): each socket's name and the uid
// of its owner. The RDS registry (rds/bind.cc) lists the listening sockets under a name
// prefix this way: unlike /proc/net/unix it says whose each one is, so another user's names
// are never candidates, and listeners only, so a backlog's connections (listed under their
// listener's name) add nothing. Pure functions over bytes, fuzzed by fuzz/fuzz_rds.cc.
#pragma once
#include <linux/netlink.h>
#include <linux/rtnetlink.h>
#include <linux/sock_diag.h>
#include <linux/unix_diag.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace sv::wire {

struct UnixSocketName {
  std::string name;  // abstract names keep their leading NUL
  uint32_t uid = 0;
  bool has_uid = false;
};

enum class DiagStatus { more, done, error };

// Appends the named sockets of one received buffer to out (at most max_out in all); done at
// NLMSG_DONE, error at NLMSG_ERROR or a message that does not fit its buffer.
inline DiagStatus parse_unix_diag(const std::byte* buf, size_t len,
                                  std::vector<UnixSocketName>& out, size_t max_out) {
  size_t off = 0;
  while (len - off >= sizeof(nlmsghdr)) {
    nlmsghdr h;
    std::memcpy(&h, buf + off, sizeof h);
    if (h.nlmsg_len < sizeof h || h.nlmsg_len > len - off) return DiagStatus::error;
    if (h.nlmsg_type == NLMSG_DONE) return DiagStatus::done;
    if (h.nlmsg_type == NLMSG_ERROR) return DiagStatus::error;
    if (h.nlmsg_type == SOCK_DIAG_BY_FAMILY && h.nlmsg_len >= NLMSG_LENGTH(sizeof(unix_diag_msg))) {
      UnixSocketName s;
      bool named = false;
      size_t a = off + NLMSG_LENGTH(sizeof(unix_diag_msg));
      const size_t end = off + h.nlmsg_len;
      while (end - a >= sizeof(rtattr)) {
        rtattr ra;
        std::memcpy(&ra, buf + a, sizeof ra);
        if (ra.rta_len < sizeof ra || ra.rta_len > end - a) break;
        const std::byte* payload = buf + a + RTA_LENGTH(0);
        const size_t plen = ra.rta_len - RTA_LENGTH(0);
        if (ra.rta_type == UNIX_DIAG_NAME && plen > 0 && plen <= 108) {
          s.name.assign(reinterpret_cast<const char*>(payload), plen);
          named = true;
        } else if (ra.rta_type == UNIX_DIAG_UID && plen >= sizeof(uint32_t)) {
          std::memcpy(&s.uid, payload, sizeof s.uid);
          s.has_uid = true;
        }
        a += RTA_ALIGN(ra.rta_len);
        if (a > end) break;
      }
      if (named && out.size() < max_out) out.push_back(std::move(s));
    }
    off += NLMSG_ALIGN(h.nlmsg_len);
    if (off > len) break;
  }
  return DiagStatus::more;
}

}  // namespace sv::wire
