// Idle connections give their stream buffers back (issue 28 item 3: an idle connected RC QP
// costs at most 64 KiB).
#pragma once

namespace sv::engine {

// Starts the process' trim sweep if it is not running: called when a connection is up.
// Every SOFTVERBS_IDLE_TRIM_MS the progress thread returns to the kernel the pages of each
// receive buffer and TX header arena that held nothing and saw no traffic for a whole period.
void qp_trim_start();

}  // namespace sv::engine
