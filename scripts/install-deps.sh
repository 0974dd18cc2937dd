#!/usr/bin/env bash
# Installs what building, testing and the demo need on Debian 12. Idempotent: packages
# already present are not reinstalled. Needs root (or sudo).
set -euo pipefail
PKGS=(
  cmake ninja-build g++ clang libclang-rt-14-dev pkg-config   # toolchain; clang for libFuzzer
  libgtest-dev libgmock-dev libbenchmark-dev                   # tests and benchmarks
  libibverbs-dev librdmacm-dev                                 # the verbs/rdma_cm headers = the ABI
  ibverbs-utils rdmacm-utils perftest                          # unmodified binaries we must run
  ibverbs-providers python3-pyverbs libucx0                    # provider libraries and their users
  libfabric-bin openmpi-bin libopenmpi-dev mpich libmpich-dev  # the verbs ecosystem's clients
  ucx-utils                                                    # ucx_perftest, ucx_info (UCX over verbs)
  iperf3                                                       # a TCP program under librspreload
  iproute2 tshark                                              # netns hosts, frame captures
  nftables                                                     # packet loss where netem is absent
  qemu-system-x86 busybox-static cpio kmod                     # a guest kernel with sch_netem
  gdb                                                          # stacks of a test program that hangs
)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
SUDO=""
[ "$(id -u)" -ne 0 ] && SUDO=sudo
echo "installing: ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
