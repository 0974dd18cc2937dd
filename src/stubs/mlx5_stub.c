/* Stub libmlx5.so.1 for perftest.
 *
 * Debian's perftest binaries have DT_NEEDED on libmlx5.so.1 and import nine mlx5dv_* functions,
 * all under BIND_NOW. The real libmlx5 is a provider for the system libibverbs: it imports about
 * 60 IBVERBS_PRIVATE_34 internals (ibv_cmd_*, verbs_set_ops, ...) and registers itself from an
 * ELF constructor. This stub sits next to softverbs' libibverbs.so.1 on LD_LIBRARY_PATH so the
 * real one is never loaded. It exports exactly the entry points perftest imports, with the same
 * symbol versions (src/stubs/libmlx5.map). softverbs never reports a Mellanox device, so perftest
 * does not take these paths; if something calls them anyway, they fail the way rdma-core's
 * mlx5dv_* calls fail on a non-mlx5 device: NULL with errno = EOPNOTSUPP, or EOPNOTSUPP
 * returned as a positive errno.
 */

#include <errno.h>
#include <stddef.h>

#include <infiniband/mlx5dv.h>

#define SV_EXPORT __attribute__((visibility("default")))

/* MLX5_1.3 */
SV_EXPORT struct ibv_qp* mlx5dv_create_qp(struct ibv_context* context,
                                          struct ibv_qp_init_attr_ex* qp_attr,
                                          struct mlx5dv_qp_init_attr* mlx5_qp_attr) {
  (void)context;
  (void)qp_attr;
  (void)mlx5_qp_attr;
  errno = EOPNOTSUPP;
  return NULL;
}

/* MLX5_1.7 */
SV_EXPORT struct ibv_context* mlx5dv_open_device(struct ibv_device* device,
                                                 struct mlx5dv_context_attr* attr) {
  (void)device;
  (void)attr;
  errno = EOPNOTSUPP;
  return NULL;
}

SV_EXPORT int mlx5dv_devx_general_cmd(struct ibv_context* context, const void* in, size_t inlen,
                                      void* out, size_t outlen) {
  (void)context;
  (void)in;
  (void)inlen;
  (void)out;
  (void)outlen;
  return EOPNOTSUPP;
}

/* MLX5_1.10 */
SV_EXPORT struct mlx5dv_mkey* mlx5dv_create_mkey(struct mlx5dv_mkey_init_attr* mkey_init_attr) {
  (void)mkey_init_attr;
  errno = EOPNOTSUPP;
  return NULL;
}

SV_EXPORT int mlx5dv_destroy_mkey(struct mlx5dv_mkey* mkey) {
  (void)mkey;
  return EOPNOTSUPP;
}

SV_EXPORT struct mlx5dv_qp_ex* mlx5dv_qp_ex_from_ibv_qp_ex(struct ibv_qp_ex* qp) {
  (void)qp;
  errno = EOPNOTSUPP;
  return NULL;
}

/* MLX5_1.21 */
SV_EXPORT int mlx5dv_crypto_login(struct ibv_context* context,
                                  struct mlx5dv_crypto_login_attr* login_attr) {
  (void)context;
  (void)login_attr;
  return EOPNOTSUPP;
}

SV_EXPORT struct mlx5dv_dek* mlx5dv_dek_create(struct ibv_context* context,
                                               struct mlx5dv_dek_init_attr* init_attr) {
  (void)context;
  (void)init_attr;
  errno = EOPNOTSUPP;
  return NULL;
}

SV_EXPORT int mlx5dv_dek_destroy(struct mlx5dv_dek* dek) {
  (void)dek;
  return EOPNOTSUPP;
}
