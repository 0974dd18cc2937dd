// The engine-level fuzz targets' device: a context (async events non-blocking, so a target
// never waits on one), a PD and a CQ, opened through the public verbs API.
#pragma once
#include <fcntl.h>
#include <infiniband/verbs.h>

#include "fuzz_check.h"

struct FuzzDevice {
  ibv_context* ctx = nullptr;
  ibv_pd* pd = nullptr;
  ibv_cq* cq = nullptr;
};

inline FuzzDevice open_fuzz_device() {
  FuzzDevice d;
  int n = 0;
  ibv_device** l = ibv_get_device_list(&n);
  FUZZ_CHECK(l && n > 0);
  d.ctx = ibv_open_device(l[0]);
  ibv_free_device_list(l);
  FUZZ_CHECK(d.ctx);
  fcntl(d.ctx->async_fd, F_SETFL, fcntl(d.ctx->async_fd, F_GETFL) | O_NONBLOCK);
  d.pd = ibv_alloc_pd(d.ctx);
  d.cq = ibv_create_cq(d.ctx, 64, nullptr, nullptr, 0);
  FUZZ_CHECK(d.pd && d.cq);
  return d;
}
