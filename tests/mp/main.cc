// mp_verbs: the verbs API end to end, as applications use it. The binary is its own remote
// peer: with --peer=<scenario> it serves as the other process of a test (harness.cc).
#include <gtest/gtest.h>
#include <signal.h>

#include <cstdlib>
#include <cstring>

#include "harness.h"

int main(int argc, char** argv) {
  // Bind the device to loopback so GID 0 is ::ffff:127.0.0.1 here and in the peer: test
  // traffic never leaves the host. Must happen before the first verbs call.
  setenv("SOFTVERBS_NETDEV", "lo", 1);
  signal(SIGPIPE, SIG_IGN);
  for (int i = 1; i < argc; ++i)
    if (std::strncmp(argv[i], "--peer=", 7) == 0) return mp::peer_main(argv[i] + 7, argc, argv);
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
