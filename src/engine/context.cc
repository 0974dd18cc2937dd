#include "engine/context.h"

namespace sv::engine {

void Context::post_async(const ibv_async_event& ev) {
  async.push(ev);
}

}  // namespace sv::engine
