# Sourced by the two-host RDS scripts: two network namespaces joined by a veth pair, as two
# hosts on one link. netns_pair NS_A NS_B DEV_A DEV_B PREFIX: NS_A gets PREFIX.1/24 on DEV_A,
# NS_B PREFIX.2/24 on DEV_B, loopback up in both. On failure it says why and the calling
# script ends as a failed run ("0 passed, 1 failed"). netns_pair_del NS_A NS_B removes them
# (and the veth pair with them); call it from the script's EXIT trap.
netns_pair() {
  local a=$1 b=$2 da=$3 db=$4 prefix=$5
  if ! { ip netns add "$a" && ip netns add "$b" &&
    ip link add "$da" type veth peer name "$db" &&
    ip link set "$da" netns "$a" && ip link set "$db" netns "$b" &&
    ip -n "$a" addr add "$prefix.1/24" dev "$da" && ip -n "$b" addr add "$prefix.2/24" dev "$db" &&
    ip -n "$a" link set lo up && ip -n "$b" link set lo up &&
    ip -n "$a" link set "$da" up && ip -n "$b" link set "$db" up; }; then
    echo "cannot create namespaces $a and $b joined by $da/$db"
    echo "0 passed, 1 failed"
    exit 1
  fi
}

netns_pair_del() {
  ip netns del "$1" 2>/dev/null
  ip netns del "$2" 2>/dev/null
}
