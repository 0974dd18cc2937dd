#include "engine/context.h"

#include <unistd.h>

namespace sv::engine {

void Context::post_async(const ibv_async_event& ev) {
  if (async_wr < 0) return;
  // One fixed-size record per event; ibv_get_async_event reads exactly one.
  ssize_t r = write(async_wr, &ev, sizeof ev);
  (void)r;
}

}  // namespace sv::engine
