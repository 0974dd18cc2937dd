// rdma_cm: filled in below.
