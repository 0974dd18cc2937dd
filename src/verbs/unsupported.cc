// libibverbs.so.1 entry points that softverbs does not support.
//
// softverbs replaces libibverbs.so.1, and the rdma-core tools are linked BIND_NOW, so every symbol
// in src/verbs/libibverbs.map has to be defined even if it is never called. This file defines all
// the exports that the engine-backed verbs layer does not implement. Each one fails the way
// rdma-core fails an operation the device does not support:
//   - functions that return a pointer return NULL and set errno = EOPNOTSUPP;
//   - functions whose rdma-core convention is "0 or a positive errno" return that errno;
//   - functions whose rdma-core convention is "-1 and errno" return -1 and set errno;
//   - void functions do nothing.
// The four ibv_copy_*_from_kern/_to_kern helpers are the exception. They are pure struct
// conversions, and since they return void they could not report a failure, so they are
// implemented.
//
// The IBVERBS_PRIVATE_34 prototypes come from rdma-core's libibverbs/driver.h, which Debian does
// not install. Parameters whose types exist only in that header (verbs_mr, ibv_command_buffer,
// the ib_uverbs_* command and response structs, ...) are declared here as void*. These
// functions are never called through a matching header, so only the symbol names must be right.

#include <infiniband/sa.h>
#include <infiniband/verbs.h>
#include <rdma/ib_user_sa.h>
#include <rdma/ib_user_verbs.h>

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>

#ifndef SV_EXPORT
#define SV_EXPORT __attribute__((visibility("default")))
#endif

namespace {

// The kernel command channel (/dev/infiniband/uverbsN) does not exist under softverbs.
constexpr int kNoKernel = ENOSYS;
// The device does not offer the operation (rdma-core's verbs_dummy_ops use the same value).
constexpr int kUnsupported = EOPNOTSUPP;

int fail_minus1(int err) {
  errno = err;
  return -1;
}

template <typename T>
T* fail_null(int err) {
  errno = err;
  return nullptr;
}

// Old-style provider entry point, from the pre-rdma-core libibverbs 1.1 driver.h.
using LegacyDriverInitFn = ibv_device* (*)(const char* uverbs_sys_path, int abi_version);

void copy_ah_attr_from_kern(ibv_ah_attr* dst, const ib_uverbs_ah_attr* src) {
  std::memcpy(dst->grh.dgid.raw, src->grh.dgid, sizeof(dst->grh.dgid.raw));
  dst->grh.flow_label = src->grh.flow_label;
  dst->grh.sgid_index = src->grh.sgid_index;
  dst->grh.hop_limit = src->grh.hop_limit;
  dst->grh.traffic_class = src->grh.traffic_class;
  dst->dlid = src->dlid;
  dst->sl = src->sl;
  dst->src_path_bits = src->src_path_bits;
  dst->static_rate = src->static_rate;
  dst->is_global = src->is_global;
  dst->port_num = src->port_num;
}

}  // namespace

extern "C" {

// ---------------------------------------------------------------------------------------------
// Kernel uverbs command interface (ibv_cmd_*, execute_ioctl): these are wrappers providers use
// around write()/ioctl() on /dev/infiniband/uverbsN. softverbs has no kernel device, so there is
// no command channel. rdma-core returns a positive errno from these (ibv_cmd_poll_cq: -1/errno).
// ---------------------------------------------------------------------------------------------

SV_EXPORT int execute_ioctl(ibv_context* /*context*/, void* /*cmd*/) {
  return kNoKernel;
}

// Counts the attributes of a chain of command buffers, to size the ioctl. With no ioctl to issue,
// the caller's own count is returned unchanged.
SV_EXPORT unsigned int __ioctl_final_num_attrs(unsigned int num_attrs, void* /*link*/) {
  return num_attrs;
}

SV_EXPORT int ibv_cmd_get_context(verbs_context* /*context*/, void* /*cmd*/, size_t /*cmd_size*/,
                                  void* /*resp*/, size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_query_context(ibv_context* /*ctx*/, void* /*driver*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_query_device_any(ibv_context* /*context*/,
                                       const ibv_query_device_ex_input* /*input*/,
                                       ibv_device_attr_ex* /*attr*/, size_t /*attr_size*/,
                                       void* /*resp*/, size_t* /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_query_port(ibv_context* /*context*/, uint8_t /*port_num*/,
                                 ibv_port_attr* /*port_attr*/, void* /*cmd*/, size_t /*cmd_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_alloc_pd(ibv_context* /*context*/, ibv_pd* /*pd*/, void* /*cmd*/,
                               size_t /*cmd_size*/, void* /*resp*/, size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_dealloc_pd(ibv_pd* /*pd*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_open_xrcd(ibv_context* /*context*/, void* /*xrcd*/, int /*vxrcd_size*/,
                                ibv_xrcd_init_attr* /*attr*/, void* /*cmd*/, size_t /*cmd_size*/,
                                void* /*resp*/, size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_close_xrcd(void* /*xrcd*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_reg_mr(ibv_pd* /*pd*/, void* /*addr*/, size_t /*length*/, uint64_t /*hca_va*/,
                             int /*access*/, void* /*vmr*/, void* /*cmd*/, size_t /*cmd_size*/,
                             void* /*resp*/, size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_rereg_mr(void* /*vmr*/, uint32_t /*flags*/, void* /*addr*/, size_t /*length*/,
                               uint64_t /*hca_va*/, int /*access*/, ibv_pd* /*pd*/, void* /*cmd*/,
                               size_t /*cmd_sz*/, void* /*resp*/, size_t /*resp_sz*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_dereg_mr(void* /*vmr*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_query_mr(ibv_pd* /*pd*/, void* /*vmr*/, uint32_t /*mr_handle*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_advise_mr(ibv_pd* /*pd*/, enum ibv_advise_mr_advice /*advice*/,
                                uint32_t /*flags*/, ibv_sge* /*sg_list*/, uint32_t /*num_sge*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_reg_dmabuf_mr(ibv_pd* /*pd*/, uint64_t /*offset*/, size_t /*length*/,
                                    uint64_t /*iova*/, int /*fd*/, int /*access*/, void* /*vmr*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_alloc_mw(ibv_pd* /*pd*/, enum ibv_mw_type /*type*/, ibv_mw* /*mw*/,
                               void* /*cmd*/, size_t /*cmd_size*/, void* /*resp*/,
                               size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_dealloc_mw(ibv_mw* /*mw*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_cq(ibv_context* /*context*/, int /*cqe*/,
                                ibv_comp_channel* /*channel*/, int /*comp_vector*/, ibv_cq* /*cq*/,
                                void* /*cmd*/, size_t /*cmd_size*/, void* /*resp*/,
                                size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_cq_ex(ibv_context* /*context*/, const ibv_cq_init_attr_ex* /*cq_attr*/,
                                   void* /*cq*/, void* /*cmd*/, size_t /*cmd_size*/, void* /*resp*/,
                                   size_t /*resp_size*/, uint32_t /*cmd_flags*/) {
  return kNoKernel;
}

// ibv_poll_cq's convention: a negative value on error.
SV_EXPORT int ibv_cmd_poll_cq(ibv_cq* /*cq*/, int /*ne*/, ibv_wc* /*wc*/) {
  return fail_minus1(kNoKernel);
}

SV_EXPORT int ibv_cmd_req_notify_cq(ibv_cq* /*cq*/, int /*solicited_only*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_resize_cq(ibv_cq* /*cq*/, int /*cqe*/, void* /*cmd*/, size_t /*cmd_size*/,
                                void* /*resp*/, size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_destroy_cq(ibv_cq* /*cq*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_modify_cq(ibv_cq* /*cq*/, ibv_modify_cq_attr* /*attr*/, void* /*cmd*/,
                                size_t /*cmd_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_srq(ibv_pd* /*pd*/, ibv_srq* /*srq*/, ibv_srq_init_attr* /*attr*/,
                                 void* /*cmd*/, size_t /*cmd_size*/, void* /*resp*/,
                                 size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_srq_ex(ibv_context* /*context*/, void* /*srq*/,
                                    ibv_srq_init_attr_ex* /*attr_ex*/, void* /*cmd*/,
                                    size_t /*cmd_size*/, void* /*resp*/, size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_modify_srq(ibv_srq* /*srq*/, ibv_srq_attr* /*srq_attr*/,
                                 int /*srq_attr_mask*/, void* /*cmd*/, size_t /*cmd_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_query_srq(ibv_srq* /*srq*/, ibv_srq_attr* /*srq_attr*/, void* /*cmd*/,
                                size_t /*cmd_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_destroy_srq(ibv_srq* /*srq*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_qp(ibv_pd* /*pd*/, ibv_qp* /*qp*/, ibv_qp_init_attr* /*attr*/,
                                void* /*cmd*/, size_t /*cmd_size*/, void* /*resp*/,
                                size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_qp_ex(ibv_context* /*context*/, void* /*qp*/,
                                   ibv_qp_init_attr_ex* /*attr_ex*/, void* /*cmd*/,
                                   size_t /*cmd_size*/, void* /*resp*/, size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_qp_ex2(ibv_context* /*context*/, void* /*qp*/,
                                    ibv_qp_init_attr_ex* /*qp_attr*/, void* /*cmd*/,
                                    size_t /*cmd_size*/, void* /*resp*/, size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_open_qp(ibv_context* /*context*/, void* /*qp*/, int /*vqp_sz*/,
                              ibv_qp_open_attr* /*attr*/, void* /*cmd*/, size_t /*cmd_size*/,
                              void* /*resp*/, size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_query_qp(ibv_qp* /*qp*/, ibv_qp_attr* /*qp_attr*/, int /*attr_mask*/,
                               ibv_qp_init_attr* /*qp_init_attr*/, void* /*cmd*/,
                               size_t /*cmd_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_modify_qp(ibv_qp* /*qp*/, ibv_qp_attr* /*attr*/, int /*attr_mask*/,
                                void* /*cmd*/, size_t /*cmd_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_modify_qp_ex(ibv_qp* /*qp*/, ibv_qp_attr* /*attr*/, int /*attr_mask*/,
                                   void* /*cmd*/, size_t /*cmd_size*/, void* /*resp*/,
                                   size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_destroy_qp(ibv_qp* /*qp*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_post_send(ibv_qp* /*ibqp*/, ibv_send_wr* wr, ibv_send_wr** bad_wr) {
  if (bad_wr != nullptr) *bad_wr = wr;
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_post_recv(ibv_qp* /*ibqp*/, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (bad_wr != nullptr) *bad_wr = wr;
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_post_srq_recv(ibv_srq* /*srq*/, ibv_recv_wr* wr, ibv_recv_wr** bad_wr) {
  if (bad_wr != nullptr) *bad_wr = wr;
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_ah(ibv_pd* /*pd*/, ibv_ah* /*ah*/, ibv_ah_attr* /*attr*/,
                                void* /*resp*/, size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_destroy_ah(ibv_ah* /*ah*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_attach_mcast(ibv_qp* /*qp*/, const ibv_gid* /*gid*/, uint16_t /*lid*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_detach_mcast(ibv_qp* /*qp*/, const ibv_gid* /*gid*/, uint16_t /*lid*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_flow(ibv_qp* /*qp*/, ibv_flow* /*flow_id*/,
                                  ibv_flow_attr* /*flow_attr*/, void* /*ucmd*/,
                                  size_t /*ucmd_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_destroy_flow(ibv_flow* /*flow_id*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_flow_action_esp(ibv_context* /*ctx*/,
                                             ibv_flow_action_esp_attr* /*attr*/,
                                             void* /*flow_action*/, void* /*driver*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_modify_flow_action_esp(void* /*flow_action*/,
                                             ibv_flow_action_esp_attr* /*attr*/, void* /*driver*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_destroy_flow_action(void* /*action*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_wq(ibv_context* /*context*/, ibv_wq_init_attr* /*wq_init_attr*/,
                                ibv_wq* /*wq*/, void* /*cmd*/, size_t /*cmd_size*/, void* /*resp*/,
                                size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_modify_wq(ibv_wq* /*wq*/, ibv_wq_attr* /*attr*/, void* /*cmd*/,
                                size_t /*cmd_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_destroy_wq(ibv_wq* /*wq*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_rwq_ind_table(ibv_context* /*context*/,
                                           ibv_rwq_ind_table_init_attr* /*init_attr*/,
                                           ibv_rwq_ind_table* /*rwq_ind_table*/, void* /*resp*/,
                                           size_t /*resp_size*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_destroy_rwq_ind_table(ibv_rwq_ind_table* /*rwq_ind_table*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_create_counters(ibv_context* /*context*/,
                                      ibv_counters_init_attr* /*init_attr*/, void* /*vcounters*/,
                                      void* /*link*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_destroy_counters(void* /*vcounters*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_read_counters(void* /*vcounters*/, uint64_t* /*counters_value*/,
                                    uint32_t /*ncounters*/, uint32_t /*flags*/, void* /*link*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_alloc_dm(ibv_context* /*ctx*/, const ibv_alloc_dm_attr* /*dm_attr*/,
                               void* /*dm*/, void* /*link*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_free_dm(void* /*dm*/) {
  return kNoKernel;
}

SV_EXPORT int ibv_cmd_reg_dm_mr(ibv_pd* /*pd*/, void* /*dm*/, uint64_t /*offset*/,
                                size_t /*length*/, unsigned int /*access*/, void* /*vmr*/,
                                void* /*link*/) {
  return kNoKernel;
}

// ---------------------------------------------------------------------------------------------
// Provider plug-in framework (IBVERBS_PRIVATE_34): softverbs has one built-in device and never
// instantiates external providers. libmlx5/libefa run verbs_register_driver_34 from their ELF
// constructors before main(), so registration must be accepted and ignored.
// ---------------------------------------------------------------------------------------------

// Lets providers destroy objects after a device disassociation. Nothing reads it here.
SV_EXPORT bool verbs_allow_disassociate_destroy = false;

SV_EXPORT void verbs_register_driver_34(const void* /*ops*/) {}

// Pre-rdma-core registration call, exported upstream only as the non-default (hidden) version
// ibv_register_driver@IBVERBS_1.1. It is bound the same way here, under an internal name that
// the version script's "local: *" hides. GCC (LTO-safe) has the symver attribute; clang 14 only
// has the assembler directive.
#if __has_attribute(symver)
SV_EXPORT __attribute__((symver("ibv_register_driver@IBVERBS_1.1"))) void
sv_compat_ibv_register_driver(const char* /*name*/, LegacyDriverInitFn /*init_func*/) {}
#else
SV_EXPORT void sv_compat_ibv_register_driver(const char* /*name*/,
                                             LegacyDriverInitFn /*init_func*/) {}
__asm__(".symver sv_compat_ibv_register_driver, ibv_register_driver@IBVERBS_1.1");
#endif

SV_EXPORT void* _verbs_init_and_alloc_context(ibv_device* /*device*/, int /*cmd_fd*/,
                                              size_t /*alloc_size*/,
                                              verbs_context* /*context_offset*/,
                                              uint32_t /*driver_id*/) {
  return fail_null<void>(kUnsupported);
}

SV_EXPORT void verbs_uninit_context(verbs_context* /*context*/) {}

SV_EXPORT void verbs_set_ops(verbs_context* /*vctx*/, const void* /*ops*/) {}

SV_EXPORT void verbs_init_cq(ibv_cq* /*cq*/, ibv_context* /*context*/,
                             ibv_comp_channel* /*channel*/, void* /*cq_context*/) {}

SV_EXPORT ibv_context* verbs_open_device(ibv_device* /*device*/, void* /*private_data*/) {
  return fail_null<ibv_context>(kUnsupported);
}

// Provider debug log (VERBS_LOG_LEVEL). No provider runs here, so there is nothing to log.
SV_EXPORT void __verbs_log(verbs_context* /*ctx*/, uint32_t /*level*/, const char* /*fmt*/, ...) {}

// ---------------------------------------------------------------------------------------------
// Per-device sysfs attributes (/sys/class/infiniband/<dev>/...): they belong to kernel devices,
// and the verbs_sysfs_dev handle this takes is never handed out. rdma-core: -1 with errno.
// ---------------------------------------------------------------------------------------------

SV_EXPORT int ibv_read_ibdev_sysfs_file(char* /*buf*/, size_t /*size*/, void* /*sysfs_dev*/,
                                        const char* /*fnfmt*/, ...) {
  return fail_minus1(kNoKernel);
}

// ---------------------------------------------------------------------------------------------
// Import of kernel objects (IBVERBS_1.10, 1.13): sharing a context, PD, MR or DM between
// processes relies on a uverbs command fd and kernel object handles, which softverbs does not
// have. Unimport of an object that can never have been imported is a no-op.
// ---------------------------------------------------------------------------------------------

SV_EXPORT ibv_context* ibv_import_device(int /*cmd_fd*/) {
  return fail_null<ibv_context>(kUnsupported);
}

SV_EXPORT ibv_pd* ibv_import_pd(ibv_context* /*context*/, uint32_t /*pd_handle*/) {
  return fail_null<ibv_pd>(kUnsupported);
}

SV_EXPORT void ibv_unimport_pd(ibv_pd* /*pd*/) {}

SV_EXPORT ibv_mr* ibv_import_mr(ibv_pd* /*pd*/, uint32_t /*mr_handle*/) {
  return fail_null<ibv_mr>(kUnsupported);
}

SV_EXPORT void ibv_unimport_mr(ibv_mr* /*mr*/) {}

SV_EXPORT ibv_dm* ibv_import_dm(ibv_context* /*context*/, uint32_t /*dm_handle*/) {
  return fail_null<ibv_dm>(kUnsupported);
}

SV_EXPORT void ibv_unimport_dm(ibv_dm* /*dm*/) {}

// ---------------------------------------------------------------------------------------------
// dma-buf memory registration (IBVERBS_1.12): a dma-buf fd names memory exported by another
// kernel driver (usually a GPU). User space cannot map it for the engine to read or write.
// ---------------------------------------------------------------------------------------------

SV_EXPORT ibv_mr* ibv_reg_dmabuf_mr(ibv_pd* /*pd*/, uint64_t /*offset*/, size_t /*length*/,
                                    uint64_t /*iova*/, int /*fd*/, int /*access*/) {
  return fail_null<ibv_mr>(kUnsupported);
}

// ---------------------------------------------------------------------------------------------
// Kernel-ABI marshalling helpers (IBVERBS_1.0, 1.1): the kernel-backed librdmacm converts
// ucma/uverbs structs with these (declared in rdma-core's marshall.h, which Debian does not
// install). They are pure field copies that return void, so they are implemented, not stubbed.
// ---------------------------------------------------------------------------------------------

SV_EXPORT void ibv_copy_ah_attr_from_kern(ibv_ah_attr* dst, ib_uverbs_ah_attr* src) {
  copy_ah_attr_from_kern(dst, src);
}

SV_EXPORT void ibv_copy_qp_attr_from_kern(ibv_qp_attr* dst, ib_uverbs_qp_attr* src) {
  dst->cur_qp_state = static_cast<ibv_qp_state>(src->cur_qp_state);
  dst->dest_qp_num = src->dest_qp_num;
  dst->qp_access_flags = static_cast<int>(src->qp_access_flags);

  dst->cap.max_send_wr = src->max_send_wr;
  dst->cap.max_recv_wr = src->max_recv_wr;
  dst->cap.max_send_sge = src->max_send_sge;
  dst->cap.max_recv_sge = src->max_recv_sge;
  dst->cap.max_inline_data = src->max_inline_data;

  copy_ah_attr_from_kern(&dst->ah_attr, &src->ah_attr);
  copy_ah_attr_from_kern(&dst->alt_ah_attr, &src->alt_ah_attr);

  dst->pkey_index = src->pkey_index;
  dst->alt_pkey_index = src->alt_pkey_index;
  dst->en_sqd_async_notify = src->en_sqd_async_notify;
  dst->sq_draining = src->sq_draining;
  dst->max_rd_atomic = src->max_rd_atomic;
  dst->max_dest_rd_atomic = src->max_dest_rd_atomic;
  dst->min_rnr_timer = src->min_rnr_timer;
  dst->port_num = src->port_num;
  dst->timeout = src->timeout;
  dst->retry_cnt = src->retry_cnt;
  dst->rnr_retry = src->rnr_retry;
  dst->alt_port_num = src->alt_port_num;
  dst->alt_timeout = src->alt_timeout;

  dst->qp_state = static_cast<ibv_qp_state>(src->qp_state);
  dst->path_mtu = static_cast<ibv_mtu>(src->path_mtu);
  dst->path_mig_state = static_cast<ibv_mig_state>(src->path_mig_state);
  dst->qkey = src->qkey;
  dst->rq_psn = src->rq_psn;
  dst->sq_psn = src->sq_psn;
}

// Both structs keep lids, pkey and flow_label in network byte order, so no swapping is needed.
SV_EXPORT void ibv_copy_path_rec_from_kern(ibv_sa_path_rec* dst, ib_user_path_rec* src) {
  std::memcpy(dst->dgid.raw, src->dgid, sizeof(dst->dgid.raw));
  std::memcpy(dst->sgid.raw, src->sgid, sizeof(dst->sgid.raw));
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = static_cast<int>(src->raw_traffic);
  dst->flow_label = src->flow_label;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->reversible = static_cast<int>(src->reversible);
  dst->numb_path = src->numb_path;
  dst->pkey = src->pkey;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->mtu = static_cast<uint8_t>(src->mtu);
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time_selector = src->packet_life_time_selector;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
}

SV_EXPORT void ibv_copy_path_rec_to_kern(ib_user_path_rec* dst, ibv_sa_path_rec* src) {
  std::memcpy(dst->dgid, src->dgid.raw, sizeof(dst->dgid));
  std::memcpy(dst->sgid, src->sgid.raw, sizeof(dst->sgid));
  dst->dlid = src->dlid;
  dst->slid = src->slid;
  dst->raw_traffic = static_cast<uint32_t>(src->raw_traffic);
  dst->flow_label = src->flow_label;
  dst->reversible = static_cast<uint32_t>(src->reversible);
  dst->mtu = src->mtu;
  dst->pkey = src->pkey;
  dst->hop_limit = src->hop_limit;
  dst->traffic_class = src->traffic_class;
  dst->numb_path = src->numb_path;
  dst->sl = src->sl;
  dst->mtu_selector = src->mtu_selector;
  dst->rate_selector = src->rate_selector;
  dst->rate = src->rate;
  dst->packet_life_time_selector = src->packet_life_time_selector;
  dst->packet_life_time = src->packet_life_time;
  dst->preference = src->preference;
}

}  // extern "C"
