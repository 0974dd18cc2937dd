// Checks the SOFTVERBS_* environment once per process, when the device is first opened.
#pragma once

namespace sv::engine {

// Names each setting whose value is not valid (util/settings.h), each SOFTVERBS_* variable
// that is no setting, and each SOFTVERBS_NETDEV interface that does not exist: one warning
// on stderr each, whatever SOFTVERBS_LOG says, with what is used instead. Readers take the
// default for such a value; this is the only place that says so. Runs once per process.
void check_settings();

}  // namespace sv::engine
